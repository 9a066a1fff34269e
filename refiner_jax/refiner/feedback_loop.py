"""The generator <-> critic refinement loop.

    z_0 = G(x)                                   greedy
    for t = 1..T:  f_t = critic(x, z_{t-1});  stop where f_t is "No hint";  z_t = G(template(x, z_{t-1}, f_t))

The generator is a `text_model.TextModel` (anything with `.greedy(texts)`), the critic any `critics.Critic`.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from refiner_jax.refiner.critics import Critic
from refiner_jax.tasks.base import DEFAULT_REFINE_TEMPLATE, Example, Task, is_no_hint, refine_input
from refiner_jax.text_model import TextModel


@dataclasses.dataclass
class Trajectory:
    """One problem's refinement: hypotheses z_0..z_n, the feedback after each, and per-turn task scores."""

    uid: str
    hypotheses: list[str]
    feedback: list[str]
    scores: list[dict[str, float]]


def refine(generator: TextModel, critic: Critic, task: Task, examples: Sequence[Example], turns: int,
           template: str = DEFAULT_REFINE_TEMPLATE, initial: Sequence[str] | None = None) -> list[Trajectory]:
    """Runs up to `turns` critic/revision rounds on every example (batched; finished examples drop out)."""
    current = list(initial) if initial is not None else generator.greedy([ex.x for ex in examples])
    trajectories = [Trajectory(ex.uid, [z], [], []) for ex, z in zip(examples, current)]
    active = list(range(len(examples)))
    for _ in range(turns):
        if not active:
            break
        feedback = critic.feedback([examples[i] for i in active], [current[i] for i in active])
        if len(feedback) != len(active):
            raise ValueError(f"the critic returned {len(feedback)} feedback texts for {len(active)} hypotheses; a "
                             "critic must answer every hypothesis it is given, in order")
        revise = []
        for i, f in zip(active, feedback):
            trajectories[i].feedback.append(f)
            if not is_no_hint(f):
                revise.append(i)
        revised = generator.greedy([refine_input(examples[i].x, current[i], trajectories[i].feedback[-1], template)
                                    for i in revise]) if revise else []
        for i, z in zip(revise, revised):
            current[i] = z
            trajectories[i].hypotheses.append(z)
        active = revise
    for traj, ex in zip(trajectories, examples):
        traj.scores = [task.score([h], [ex]) for h in traj.hypotheses]
    return trajectories


def final_hypotheses(trajectories: Sequence[Trajectory], turn: int | None = None) -> list[str]:
    """Each trajectory's hypothesis after `turn` revisions (its last one when it stopped earlier; None: last)."""
    return [t.hypotheses[-1] if turn is None else t.hypotheses[min(turn, len(t.hypotheses) - 1)]
            for t in trajectories]
