"""Outcome and process reward models on a task's reasoning steps (reference spec §6.1-6.3).

- Labels: the ORM gives every step of a solution its final-answer correctness; the PRM gives step i "every step up
  to i is right", from the task's step checker (`step_labels`), or from a PRM800K-style label file
  (`tasks.prm800k`).
- Encoding: `encode_solution` tokenises a solution piece by piece, each piece ending where a step ends, so every
  step end is a token boundary; training batches (`t5_batch`, `decoder_batch`) and scoring both go through it, so
  the steps are cut and tokenised the same way in both.
- Scoring: `RewardScorer` is a trained `models.reward.RewardModel` as a batched function of (prompt, solution,
  steps) -> per-step P(correct so far), all steps of a solution in one forward pass.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np

from refiner_jax import checkpoint as ckpt_lib
from refiner_jax import rerank
from refiner_jax.models.decoder import Decoder, DecoderConfig
from refiner_jax.models.reward import RewardModel
from refiner_jax.models.t5 import T5, shift_right
from refiner_jax.models.t5_config import T5Config
from refiner_jax.tasks.base import Example, Task
from refiner_jax.tokenizers import PAD_ID, Tokenizer

KINDS = ("orm", "prm")


@dataclasses.dataclass(frozen=True)
class LabelledSolution:
    """A solution for reward-model training: the `prompt` its policy read, its `text`, its `steps` (substrings of
    `text`, in order), one label per step and the problem's `reference` (gold) solution when known, for the joint
    language-modelling loss."""

    prompt: str
    text: str
    steps: tuple[str, ...]
    labels: tuple[bool, ...]
    reference: str = ""


def step_labels(kind: str, task: Task, example: Example, hypothesis: str) -> list[bool]:
    """Per-step labels of `hypothesis` for an outcome ("orm": the final answer is right, on every step) or a process
    ("prm": every step so far is right) reward model."""
    if kind not in KINDS:
        raise ValueError(f"unknown reward model kind {kind!r}; use one of {KINDS}")
    n = len(task.split_steps(hypothesis))
    if kind == "orm":
        return [bool(task.outcome_label(example, hypothesis))] * n
    return [bool(v) for v in np.logical_and.accumulate(np.asarray(task.step_labels(example, hypothesis), bool))]


def labelled(kind: str, task: Task, example: Example, hypothesis: str) -> LabelledSolution:
    return LabelledSolution(example.x, hypothesis, tuple(task.split_steps(hypothesis)),
                            tuple(step_labels(kind, task, example, hypothesis)), task.target(example))


def step_ends(text: str, steps: Sequence[str]) -> list[int]:
    """Character offset just past each step in `text`, searched in order. The last step ends at the end of the text
    (what follows it, an end marker or a final-answer line, belongs to it: the last score has read everything)."""
    ends, cursor = [], 0
    for i, step in enumerate(steps):
        at = text.find(step, cursor)
        if at < 0:
            raise ValueError(f"step {i} {step!r} is not in the solution after character {cursor} of {text!r}; a "
                             "task's split_steps must return substrings of the solution, in order")
        cursor = at + len(step)
        ends.append(cursor)
    if ends:
        ends[-1] = len(text)
    return ends


def encode_solution(tokenizer: Tokenizer, text: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
    """(token ids of `text` followed by EOS, index of each step's last token). Each piece of text up to a step end
    is tokenised on its own, so a step end never falls inside a token."""
    ids: list[int] = []
    last: list[int] = []
    start = 0
    for end in step_ends(text, steps):
        ids += tokenizer.encode(text[start:end], add_eos=False)
        last.append(len(ids) - 1)
        start = end
    return ids + [tokenizer.eos_id], last


def _steps_batch(rows: Sequence[tuple[list[int], list[int]]], labels: Sequence[Sequence[bool]] | None,
                 length: int, max_steps: int, offsets: Sequence[int], starts: Sequence[int], eos_id: int,
                 pad_id: int) -> dict:
    """Token ids [b, length] (truncated rows keep EOS last), read positions = `offsets` + each step's last-token
    index [b, max_steps], labels and label mask [b, max_steps]; steps cut off by either budget are masked.
    `solution_mask` [b, length] is 1 at the read positions whose token just read is one of the solution's: row i's
    tokens `starts[i]` up to its EOS (excluded), read at `offsets[i]` + their index."""
    b = len(rows)
    tokens = np.full((b, length), pad_id, np.int32)
    positions = np.zeros((b, max_steps), np.int32)
    mask = np.zeros((b, max_steps), np.float32)
    out_labels = np.zeros((b, max_steps), np.float32)
    solution = np.zeros((b, length), np.float32)
    for i, (ids, last) in enumerate(rows):
        if len(ids) > length:
            ids = ids[:length - 1] + [eos_id]
        tokens[i, :len(ids)] = ids
        solution[i, starts[i] + offsets[i]:min(len(ids) - 1 + offsets[i], length)] = 1.0
        kept = [j for j, t in enumerate(last[:max_steps]) if t < len(ids) - 1]  # the step's tokens all fit
        positions[i, :len(kept)] = np.asarray([last[j] for j in kept], np.int32) + offsets[i]
        mask[i, :len(kept)] = 1.0
        if labels is not None and labels[i]:  # a scorer's solutions come without labels
            out_labels[i, :len(kept)] = [float(labels[i][j]) for j in kept]
    return {"tokens": tokens, "positions": positions, "labels": out_labels, "label_mask": mask,
            "solution_mask": solution}


def t5_batch(tokenizer: Tokenizer, solutions: Sequence[LabelledSolution], input_len: int, target_len: int,
             max_steps: int) -> dict[str, np.ndarray]:
    """A T5 reward-model batch: `inputs` [b, input_len] (prompts), `targets` [b, target_len] (solutions; the
    decoder reads them shifted right, so its output at position t has read targets[:t] and a step ending at token j
    is read at j + 1), `positions`, `labels`, `label_mask` [b, max_steps]."""
    rows = [encode_solution(tokenizer, s.text, s.steps) for s in solutions]
    batch = _steps_batch(rows, [s.labels for s in solutions], target_len, max_steps, [1] * len(rows),
                         [0] * len(rows), tokenizer.eos_id, tokenizer.pad_id)
    batch["targets"] = batch.pop("tokens")
    batch["inputs"] = tokenizer.encode_batch([s.prompt for s in solutions], input_len, pad_to=input_len)
    # The reference solutions, for the joint LM loss (all pad where unknown: such rows add nothing to it).
    batch["references"] = np.zeros((len(solutions), target_len), np.int32)
    for i, s in enumerate(solutions):
        if s.reference:
            ids = tokenizer.encode(s.reference)
            ids = ids[:target_len - 1] + [tokenizer.eos_id] if len(ids) > target_len else ids
            batch["references"][i, :len(ids)] = ids
    return batch


def decoder_batch(tokenizer: Tokenizer, solutions: Sequence[LabelledSolution], length: int,
                  max_steps: int) -> dict[str, np.ndarray]:
    """A decoder-LM reward-model batch: `tokens` [b, length] = prompt ids and EOS (as the decoder policy reads its
    prompts, `models.base.LanguageModel.pair_batch`), then solution ids, right-padded, with `mask` [b, length] at
    real tokens; a step ending at solution token j is read at len(prompt) + 1 + j. `references`, `reference_mask`
    and `reference_weights` [b, length] (1 at the reference's tokens): the same layout with the gold solution, for
    the joint LM loss (no weight where unknown)."""
    prompts = [tokenizer.encode(s.prompt) for s in solutions]
    rows = [(p + ids, [len(p) + t for t in last])
            for p, (ids, last) in zip(prompts, (encode_solution(tokenizer, s.text, s.steps) for s in solutions))]
    batch = _steps_batch(rows, [s.labels for s in solutions], length, max_steps, [0] * len(rows),
                         [len(p) for p in prompts], tokenizer.eos_id, tokenizer.pad_id)
    batch["mask"] = np.zeros(batch["tokens"].shape, np.int32)
    for i, (ids, _) in enumerate(rows):
        batch["mask"][i, :min(len(ids), length)] = 1
    batch["references"] = np.full((len(solutions), length), tokenizer.pad_id, np.int32)
    batch["reference_mask"] = np.zeros((len(solutions), length), np.int32)
    batch["reference_weights"] = np.zeros((len(solutions), length), np.float32)
    for i, (p, s) in enumerate(zip(prompts, solutions)):
        if s.reference and len(p) < length:
            ids = (p + tokenizer.encode(s.reference))[:length]
            batch["references"][i, :len(ids)] = ids
            batch["reference_mask"][i, :len(ids)] = 1
            batch["reference_weights"][i, len(p):len(ids)] = 1.0
    return batch


def reference_lm(module: RewardModel, params: Any, batch: dict, rng: jax.Array | None = None
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The trunk's teacher-forced (logits [b, len, vocab], targets [b, len], weights [b, len]) of the reference
    solutions `batch['references']` given the prompts, for the joint language-modelling loss."""
    rngs = None if rng is None else {"dropout": rng}
    train = rng is not None
    references = batch["references"]
    if isinstance(module.lm, T5):
        logits = module.apply({"params": params}, batch["inputs"], shift_right(references), train=train, rngs=rngs,
                              method=RewardModel.lm_logits)
        return logits, references, references != PAD_ID
    weights = batch["reference_weights"]
    logits = module.apply({"params": params}, references, batch["reference_mask"], train=train, rngs=rngs,
                          method=RewardModel.lm_logits)
    return logits[:, :-1], references[:, 1:], weights[:, 1:]


def step_log_odds(module: RewardModel, params: Any, batch: dict, rng: jax.Array | None = None) -> jax.Array:
    """The reward model's log-odds [b, max_steps] on a `t5_batch` or `decoder_batch` (dropout with `rng`)."""
    rngs = None if rng is None else {"dropout": rng}
    extra = {"solution_mask": batch["solution_mask"]} if module.likelihood else {}
    if isinstance(module.lm, T5):
        return module.apply({"params": params}, batch["positions"], batch["inputs"], shift_right(batch["targets"]),
                            train=rng is not None, rngs=rngs, **extra)
    return module.apply({"params": params}, batch["positions"], batch["tokens"], batch["mask"],
                        train=rng is not None, rngs=rngs, **extra)


def label_ids(tokenizer: Tokenizer, label_tokens: Sequence[str]) -> tuple[int, int]:
    """Token ids of the (correct, wrong) label strings; each must be a single token of the vocabulary."""
    ids = []
    for text in label_tokens:
        encoded = tokenizer.encode(text, add_eos=False)
        if len(encoded) != 1:
            raise ValueError(f"reward label {text!r} is {len(encoded)} tokens of this tokenizer, not 1; choose "
                             "strings the vocabulary holds as one token (config.reward.label_tokens)")
        ids.append(encoded[0])
    if len(ids) != 2 or ids[0] == ids[1]:
        raise ValueError(f"config.reward.label_tokens needs two different single-token strings, got {label_tokens}")
    return ids[0], ids[1]


def _one_step(text: str) -> list[str]:
    return [text] if text else []


@dataclasses.dataclass
class RewardScorer:
    """A trained reward model as a batched scorer of solutions. Rows are padded to `batch_size` and tokens to the
    budgets, so scoring compiles once."""

    module: RewardModel
    params: Any
    tokenizer: Tokenizer
    input_len: int
    target_len: int
    max_steps: int
    batch_size: int = 256
    split_steps: Callable[[str], list[str]] = _one_step  # a task's `split_steps`

    def __post_init__(self):
        self._fn = jax.jit(functools.partial(step_log_odds, self.module))

    def step_scores(self, prompts: Sequence[str], texts: Sequence[str]) -> list[np.ndarray]:
        """P(correct so far) at each step of each solution (steps past the token budgets get none), the steps cut by
        `split_steps`."""
        out: list[np.ndarray] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = [LabelledSolution(p, t, tuple(self.split_steps(t)), ())
                     for p, t in zip(prompts[start:start + self.batch_size], texts[start:start + self.batch_size])]
            pad = [LabelledSolution("", "", (), ())] * (self.batch_size - len(chunk))
            if self._is_t5:
                batch = t5_batch(self.tokenizer, chunk + pad, self.input_len, self.target_len, self.max_steps)
            else:
                batch = decoder_batch(self.tokenizer, chunk + pad, self.input_len + self.target_len, self.max_steps)
            feed = {k: batch[k] for k in ("inputs", "targets", "tokens", "mask", "positions", "solution_mask")
                    if k in batch}
            probs = np.asarray(jax.nn.sigmoid(self._fn(self.params, feed)))  # [batch, max_steps]
            for i in range(len(chunk)):
                out.append(probs[i, batch["label_mask"][i] > 0])
        return out

    @property
    def _is_t5(self) -> bool:
        return isinstance(self.module.lm, T5)

    def solution_scores(self, prompts: Sequence[str], texts: Sequence[str], reduction: str = "last") -> np.ndarray:
        """One score per solution (`rerank.solution_scores`); 0 for a solution with no scored step."""
        steps = self.step_scores(prompts, texts)
        scored = [i for i, s in enumerate(steps) if len(s)]
        out = np.zeros(len(steps))
        if scored:
            out[scored] = rerank.solution_scores([steps[i] for i in scored], reduction)
        return out


def export_metadata(module: RewardModel, kind: str, max_steps: int) -> dict:
    """What `load_reward_model` needs beside the parameters."""
    family = "t5" if isinstance(module.lm, T5) else "decoder"
    return {"model_config": dataclasses.asdict(module.lm.config), "family": family, "head": module.head,
            "label_ids": list(module.label_ids), "likelihood": module.likelihood, "kind": kind,
            "max_steps": max_steps}


def load_reward_model(stage_dir: str, tokenizer: Tokenizer, task: Task, input_len: int, target_len: int,
                      batch_size: int = 256) -> RewardScorer:
    """The exported reward model of a finished stage (`<workdir>/orm`, `<workdir>/prm`) as a `RewardScorer` of
    `task`'s solutions."""
    export = os.path.join(stage_dir, "export")
    if not os.path.isdir(export):
        raise FileNotFoundError(f"{export} does not exist: train the reward model first "
                                "(python launch/train.py --config=configs/rm_mwp.py --workdir=...)")
    params, meta = ckpt_lib.load_params(export)
    config = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["model_config"].items()}  # JSON lists
    lm = T5(T5Config(**config)) if meta["family"] == "t5" else Decoder(DecoderConfig(**config))
    module = RewardModel(lm, meta["head"], tuple(meta["label_ids"]), meta.get("likelihood", False))
    return RewardScorer(module, params, tokenizer, input_len, target_len, meta["max_steps"], batch_size,
                        task.split_steps)
