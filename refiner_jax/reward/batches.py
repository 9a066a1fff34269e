"""Reward-model batches: `encode_solution` tokenises a solution piece by piece, each piece ending where a step ends,
so every step end is a token boundary; training batches and scoring both go through it (`reward_batch`), so the
steps are cut and tokenised the same way in both. The array layout of each model family is `models.language_model`'s.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from refiner_jax.models.language_model import LanguageModel, decoder_step_batch, t5_step_batch
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


def reward_batch(lm: LanguageModel, tokenizer: Tokenizer, solutions: Sequence[LabelledSolution], input_len: int,
                 target_len: int, max_steps: int) -> dict[str, np.ndarray]:
    """`lm`'s reward-model batch of `solutions` (`LanguageModel.step_batch`), each tokenised by `encode_solution`."""
    rows = [encode_solution(tokenizer, s.text, s.steps) for s in solutions]
    return lm.step_batch(tokenizer, rows, solutions, input_len, target_len, max_steps)


def t5_batch(tokenizer: Tokenizer, solutions: Sequence[LabelledSolution], input_len: int, target_len: int,
             max_steps: int) -> dict[str, np.ndarray]:
    """A T5 reward-model batch (`models.language_model.t5_step_batch`)."""
    rows = [encode_solution(tokenizer, s.text, s.steps) for s in solutions]
    return t5_step_batch(tokenizer, rows, solutions, input_len, target_len, max_steps)


def decoder_batch(tokenizer: Tokenizer, solutions: Sequence[LabelledSolution], length: int,
                  max_steps: int) -> dict[str, np.ndarray]:
    """A decoder-LM reward-model batch of `length` tokens (`models.language_model.decoder_step_batch`)."""
    rows = [encode_solution(tokenizer, s.text, s.steps) for s in solutions]
    return decoder_step_batch(tokenizer, rows, solutions, length, max_steps)
