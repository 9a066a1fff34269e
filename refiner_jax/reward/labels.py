"""Reward-model labels (Uesato et al.): the ORM gives every step of a solution its final-answer correctness; the PRM
gives step i "every step up to i is right", from the task's step checker (`step_labels`) or from a PRM800K-style
label file (`tasks.prm800k`).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from refiner_jax.tasks.base import Example, Task
from refiner_jax.tokenizers import Tokenizer

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
