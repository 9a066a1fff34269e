"""Reward-model batches: `encode_solution` tokenises a solution piece by piece, each piece ending where a step ends,
so every step end is a token boundary; training batches (`t5_batch`, `decoder_batch`) and scoring both go through
it, so the steps are cut and tokenised the same way in both.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from refiner_jax.reward.labels import LabelledSolution
from refiner_jax.tokenizers import Tokenizer


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
