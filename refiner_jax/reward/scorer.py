"""A trained reward model (`models.reward_model.RewardModel`) as a batched function of (prompt, solution, steps) ->
per-step P(correct so far), all steps of a solution in one forward pass; its export and loading. A public process
reward model (`models.hf_reward`: Qwen2.5-Math-PRM, Math-Shepherd) is the same kind of scorer (`TaggedStepScorer`,
`load_public_prm`), so reranking and the first-error evaluation take either.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np

from refiner_jax import checkpoint as ckpt_lib
from refiner_jax.models import hf_reward
from refiner_jax.models.language_model import LanguageModel, config_from_dict, family_of
from refiner_jax.models.reward_model import RewardModel, step_log_odds
from refiner_jax.reward import rerank
from refiner_jax.reward.batches import reward_batch
from refiner_jax.reward.labels import LabelledSolution
from refiner_jax.tasks.base import Task
from refiner_jax.tokenizers import Tokenizer


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

    def step_scores(self, prompts: Sequence[str], texts: Sequence[str], log_odds: bool = False) -> list[np.ndarray]:
        """P(correct so far) at each step of each solution (its log-odds with `log_odds`; steps past the token
        budgets get none), the steps cut by `split_steps`."""
        out: list[np.ndarray] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = [LabelledSolution(p, t, tuple(self.split_steps(t)), ())
                     for p, t in zip(prompts[start:start + self.batch_size], texts[start:start + self.batch_size])]
            pad = [LabelledSolution("", "", (), ())] * (self.batch_size - len(chunk))
            batch = reward_batch(LanguageModel(self.module.lm.config), self.tokenizer, chunk + pad, self.input_len,
                                 self.target_len, self.max_steps)
            feed = {k: batch[k] for k in ("inputs", "targets", "tokens", "mask", "positions", "solution_mask")
                    if k in batch}
            odds = self._fn(self.params, feed)  # [batch, max_steps]
            probs = np.asarray(odds if log_odds else jax.nn.sigmoid(odds))
            for i in range(len(chunk)):
                out.append(probs[i, batch["label_mask"][i] > 0])
        return out

    def solution_scores(self, prompts: Sequence[str], texts: Sequence[str], reduction: str = "last") -> np.ndarray:
        """One score per solution (`rerank.solution_scores`); 0 for a solution with no scored step."""
        return reduce_steps(self.step_scores(prompts, texts), reduction)


def reduce_steps(steps: Sequence[np.ndarray], reduction: str = "last") -> np.ndarray:
    """One score per solution from its step scores (`rerank.solution_scores`); 0 for a solution with no scored
    step."""
    scored = [i for i, s in enumerate(steps) if len(s)]
    out = np.zeros(len(steps))
    if scored:
        out[scored] = rerank.solution_scores([steps[i] for i in scored], reduction)
    return out


def policy_step_log_probs(policy: Any, lm_config, tokenizer: Tokenizer, task: Task, input_len: int,
                          target_len: int, max_steps: int, prompts: Sequence[str], texts: Sequence[str],
                          batch_size: int = 256) -> list[np.ndarray]:
    """The policy's log-probability of each step given the problem and the steps before it: a reward model whose
    score is the policy's own log-likelihood of the solution so far (no learned head), differenced step to step."""
    module = RewardModel(LanguageModel(lm_config).module(), "scalar", (0, 0), likelihood=True)
    params = {"lm": policy, "score_kernel": np.zeros((lm_config.d_model,), np.float32),
              "score_bias": np.zeros((), np.float32), "likelihood_scale": np.ones((), np.float32)}
    scorer = RewardScorer(module, params, tokenizer, input_len, target_len, max_steps, batch_size, task.split_steps)
    return [np.diff(so_far, prepend=0.0) for so_far in scorer.step_scores(prompts, texts, log_odds=True)]


def export_metadata(module: RewardModel, kind: str, max_steps: int) -> dict:
    """What `load_reward_model` needs beside the parameters."""
    return {"model_config": dataclasses.asdict(module.lm.config), "family": family_of(module.lm.config),
            "head": module.head, "label_ids": list(module.label_ids), "likelihood": module.likelihood, "kind": kind,
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
    lm = LanguageModel(config_from_dict(meta["family"], meta["model_config"])).module()
    module = RewardModel(lm, meta["head"], tuple(meta["label_ids"]), meta.get("likelihood", False))
    return RewardScorer(module, params, tokenizer, input_len, target_len, meta["max_steps"], batch_size,
                        task.split_steps)


@dataclasses.dataclass
class TaggedStepScorer:
    """A public PRM (`hf_reward.load_process_reward_model`'s `score_fn`) as a batched scorer of solutions with
    `RewardScorer`'s `step_scores` / `solution_scores`: each solution is laid out by `render(problem, steps)` (a
    step tag after every step), tokenized by `tokenizer` (a transformers tokenizer) and scored at its tags. Rows
    go in batches of `batch_size`, in order of length so that padding stays small."""

    score_fn: Callable[[np.ndarray, np.ndarray], np.ndarray]
    tokenizer: Any
    render: Callable[[str, Sequence[str]], str]
    step_tag_id: int
    batch_size: int = 8
    split_steps: Callable[[str], list[str]] = _one_step  # a task's `split_steps`

    def score_steps(self, problems: Sequence[str], steps: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """P(right so far) at each step of each (problem, steps) solution; an empty array for no steps."""
        ids = [list(self.tokenizer(self.render(p, s))["input_ids"]) if s else [] for p, s in zip(problems, steps)]
        for i, (row, s) in enumerate(zip(ids, steps)):
            tags = row.count(self.step_tag_id)
            if tags != len(s):
                raise ValueError(f"solution {i} has {len(s)} steps but {tags} step tags (id {self.step_tag_id}) "
                                 "once tokenized; remove the tag's text from the steps or pick another step tag")
        out: list[np.ndarray] = [np.zeros(0, np.float32) for _ in ids]
        order = [i for i in np.argsort([len(r) for r in ids], kind="stable") if ids[i]]
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            width = max(len(ids[i]) for i in chunk)
            tokens, mask = np.zeros((len(chunk), width), np.int32), np.zeros((len(chunk), width), bool)
            for row, i in enumerate(chunk):
                tokens[row, :len(ids[i])], mask[row, :len(ids[i])] = ids[i], True
            probs = self.score_fn(tokens, mask)  # [rows, width], NaN off the tags
            for row, i in enumerate(chunk):
                out[i] = probs[row][tokens[row] == self.step_tag_id][:len(steps[i])].astype(np.float32)
        return out

    def step_scores(self, prompts: Sequence[str], texts: Sequence[str]) -> list[np.ndarray]:
        """P(right so far) at each step of each solution, the steps cut by `split_steps`."""
        return self.score_steps(prompts, [self.split_steps(t) for t in texts])

    def solution_scores(self, prompts: Sequence[str], texts: Sequence[str], reduction: str = "last") -> np.ndarray:
        """One score per solution (`rerank.solution_scores`); 0 for a solution with no scored step."""
        return reduce_steps(self.step_scores(prompts, texts), reduction)


def _token_id(tokenizer: Any, text: str, what: str) -> int:
    """The id a tokenizer gives `text` alone (its last one, as Math-Shepherd reads its tag and label tokens)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"{what} {text!r} tokenizes to nothing; pass a token the tokenizer knows")
    return int(ids[-1])


def load_public_prm(model: str | os.PathLike, tokenizer: Any = None, step_tag: str | None = None,
                    good_token: str | None = None, bad_token: str | None = None, batch_size: int = 8,
                    split_steps: Callable[[str], list[str]] = _one_step, **config_overrides) -> TaggedStepScorer:
    """A public PRM checkpoint as a `TaggedStepScorer`. `tokenizer`: a transformers tokenizer, or a path or hub
    name (default: the checkpoint's own). A `...ForProcessRewardModel` reads Qwen2.5-Math-PRM's chat
    (`hf_reward.qwen_prm_messages`, tag "<extra_0>"); a causal LM reads Math-Shepherd's layout
    (`hf_reward.math_shepherd_text`, tag "ки") and needs `good_token` and `bad_token` (Math-Shepherd: "+", "-")."""
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer  # only public checkpoints need it

        tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer if tokenizer is not None else model))
    layout = hf_reward.layout_of(model)
    tag = step_tag or (hf_reward.QWEN_PRM_TAG if layout == "prm_head" else hf_reward.MATH_SHEPHERD_TAG)
    labels = [None if t is None else _token_id(tokenizer, t, what) for t, what in
              ((good_token, "good_token"), (bad_token, "bad_token"))]
    score_fn, prm = hf_reward.load_process_reward_model(model, _token_id(tokenizer, tag, "step_tag"), *labels,
                                                        **config_overrides)
    if layout == "prm_head":
        def render(problem: str, steps: Sequence[str]) -> str:
            return tokenizer.apply_chat_template(hf_reward.qwen_prm_messages(problem, steps, tag), tokenize=False,
                                                 add_generation_prompt=False)
    else:
        render = functools.partial(hf_reward.math_shepherd_text, tag=tag)
    return TaggedStepScorer(score_fn, tokenizer, render, prm.step_tag_id, batch_size, split_steps)
