"""Process labels from rollouts (Math-Shepherd): a step is good when the policy, continuing from the solution up to
and including it, can still reach the right answer.

For every step prefix of a solution but the last, `completions` continuations are drawn (the prefix is forced, the
sampler writes the rest; all prefixes of a batch in one jitted call); the step's hard label is "some continuation
reaches the gold answer", its soft label the share that does. The last step's label is the solution's own outcome.
No step checker and no human is involved, so the labels inherit what outcome labels miss: a wrong step from which a
right answer can still be reached counts as good (`agreement` measures this against the task's exact checker).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from refiner_jax.reward.batches import step_ends
from refiner_jax.tasks.base import Example, Task

# (prompts, forced target prefixes, continuations per prompt) -> [len(prompts)][n] whole targets, prefix included
Generate = Callable[[list[str], list[str], int], list[list[str]]]


@dataclasses.dataclass(frozen=True)
class RolloutLabels:
    """One solution's labels: `hard[k]` some rollout from step k reaches the answer, `soft[k]` the share that does;
    `prefix[k]` is `hard` accumulated (every step so far good), the form a PRM trains on."""

    hard: tuple[bool, ...]
    soft: tuple[float, ...]

    @property
    def prefix(self) -> tuple[bool, ...]:
        return tuple(bool(v) for v in np.logical_and.accumulate(np.asarray(self.hard, bool)))


def step_prefixes(task: Task, solution: str) -> list[str]:
    """The solution's text up to the end of each of its steps but the last."""
    steps = task.split_steps(solution)
    return [solution[:end] for end in step_ends(solution, steps)[:-1]]


def rollout_labels(generate: Generate, task: Task, examples: Sequence[Example], solutions: Sequence[str],
                   completions: int) -> tuple[list[RolloutLabels], dict]:
    """Labels of each (example, solution), and {rollouts, seconds, rollouts_per_second}. Every distinct
    (problem, prefix) is rolled out once, all of them in one `generate` call."""
    if completions < 1:
        raise ValueError(f"completions must be >= 1, got {completions}")
    wanted: dict[tuple[str, str], int] = {}
    owners: dict[str, Example] = {}
    for ex, h in zip(examples, solutions):
        owners[ex.uid] = ex
        for prefix in step_prefixes(task, h):
            wanted.setdefault((ex.uid, prefix), len(wanted))
    keys = list(wanted)
    start = time.time()
    drawn = generate([owners[uid].x for uid, _ in keys], [p for _, p in keys], completions) if keys else []
    seconds = time.time() - start
    share = [float(np.mean([task.outcome_label(owners[uid], c) for c in cs])) for (uid, _), cs in zip(keys, drawn)]
    out = []
    for ex, h in zip(examples, solutions):
        soft = [share[wanted[(ex.uid, p)]] for p in step_prefixes(task, h)]
        if task.split_steps(h):
            soft.append(float(task.outcome_label(ex, h)))
        out.append(RolloutLabels(tuple(s > 0 for s in soft), tuple(soft)))
    made = len(keys) * completions
    return out, {"rollouts": made, "seconds": seconds, "rollouts_per_second": made / seconds if seconds else 0.0}


def agreement(task: Task, examples: Sequence[Example], solutions: Sequence[str],
              labels: Sequence[RolloutLabels]) -> dict:
    """How well "this step is wrong" by rollouts (prefix labels) matches the task's exact step checker: precision,
    recall and counts per step position and over all steps."""
    by_position: dict[int, np.ndarray] = {}  # [true positives, predicted wrong, checker wrong, steps]
    for ex, h, lab in zip(examples, solutions, labels):
        checker = np.logical_and.accumulate(np.asarray(task.step_labels(ex, h), bool))
        for k, (said_ok, ok) in enumerate(zip(lab.prefix, checker)):
            row = by_position.setdefault(k, np.zeros(4))
            row += [not said_ok and not ok, not said_ok, not ok, 1]

    def summary(c: np.ndarray) -> dict:
        return {"precision_wrong": c[0] / c[1] if c[1] else float("nan"),
                "recall_wrong": c[0] / c[2] if c[2] else float("nan"), "steps": int(c[3]),
                "checker_wrong": int(c[2]), "rollouts_wrong": int(c[1])}

    total = sum(by_position.values(), np.zeros(4))
    return {"all": summary(total), "by_step": {str(k): summary(c) for k, c in sorted(by_position.items())}}
