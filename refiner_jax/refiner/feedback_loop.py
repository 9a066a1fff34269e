"""The generator <-> critic turn, and the refinement loop made of such turns.

    z_0 = G(x)                                   greedy
    for t = 1..T:  f_t = critic(x, z_{t-1});  stop where f_t is "No hint";  z_t = G(template(x, z_{t-1}, f_t))

`take_turn` is one line of that loop over a batch (ask the critic, decide who stops, build the revision prompts,
revise); `refine` runs it T times (REFINER's inference), the REFINER stage builds its training inputs with
`revision_turn` and the joint system (`joint.locate_explain_revise`) runs its own rounds with `take_turn`. The
generator is a `text_model.TextModel` (anything with `.greedy(texts)`: a `Generator`), the critic any
`critics.Critic`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from refiner_jax.refiner.critics import Critic
from refiner_jax.tasks.base import DEFAULT_REFINE_TEMPLATE, Example, Task, is_no_hint, refine_input

@runtime_checkable
class Generator(Protocol):
    """What the loop needs of a generator: one greedy answer per input text."""

    def greedy(self, texts: Sequence[str]) -> list[str]: ...


@runtime_checkable
class SamplingGenerator(Generator, Protocol):
    """A generator that also samples: `[len(texts)][num_samples]` answers (what evaluating a critic on the
    generator's own samples needs; `text_model.TextModel` is one)."""

    def generate(self, texts: Sequence[str], *, num_samples: int = 1, top_p: float = 1.0, temperature: float = 0.0,
                 rng: Any = None) -> list[list[str]]: ...


# (problems, hypotheses) -> one feedback text per hypothesis, in order (`Critic.feedback` is one)
Critique = Callable[[list[Example], list[str]], list[str]]
# (revision prompts, their positions in the turn's batch) -> one revision per prompt
Revise = Callable[[list[str], list[int]], list[str]]


@dataclasses.dataclass(frozen=True)
class Turn:
    """One turn over a batch of n hypotheses: the feedback on each, the positions of those that go on (their
    feedback is not a stop), their revision prompts (template(x, z, f)) and their revisions ([] without a reviser)."""

    feedback: list[str]  # [n]
    going: list[int]  # [m] positions in the batch
    prompts: list[str]  # [m]
    revised: list[str]  # [m] or []


def ask_critic(critique: Critique, examples: Sequence[Example], hypotheses: Sequence[str]) -> list[str]:
    """The critic's feedback on each hypothesis; a critic that does not answer every one, in order, is an error."""
    feedback = list(critique(list(examples), list(hypotheses)))
    if len(feedback) != len(hypotheses):
        raise ValueError(f"the critic returned {len(feedback)} feedback texts for {len(hypotheses)} hypotheses; a "
                         "critic must answer every hypothesis it is given, in order")
    return feedback


def revision_turn(examples: Sequence[Example], hypotheses: Sequence[str], feedback: Sequence[str],
                  revise: Revise | None = None, *, template: str = DEFAULT_REFINE_TEMPLATE,
                  stops: Callable[[str], bool] = is_no_hint) -> Turn:
    """The turn once the feedback is known: the hypotheses whose feedback `stops` ends stay as they are, the
    others get their revision prompt, and `revise` (when given) rewrites them in one call."""
    going = [j for j, f in enumerate(feedback) if not stops(f)]
    prompts = [refine_input(examples[j].x, hypotheses[j], feedback[j], template) for j in going]
    revised = list(revise(prompts, going)) if revise is not None and going else []
    return Turn(list(feedback), going, prompts, revised)


def take_turn(examples: Sequence[Example], hypotheses: Sequence[str], critique: Critique,
              revise: Revise | None = None, *, template: str = DEFAULT_REFINE_TEMPLATE,
              stops: Callable[[str], bool] = is_no_hint) -> Turn:
    """One generator <-> critic turn: `critique` the hypotheses, then `revision_turn` (an empty batch asks
    nothing of either model)."""
    if not hypotheses:
        return Turn([], [], [], [])
    return revision_turn(examples, hypotheses, ask_critic(critique, examples, hypotheses), revise,
                         template=template, stops=stops)


@dataclasses.dataclass
class Trajectory:
    """One problem's refinement: hypotheses z_0..z_n, the feedback after each, and per-turn task scores."""

    uid: str
    hypotheses: list[str]
    feedback: list[str]
    scores: list[dict[str, float]]


def refine(generator: Generator, critic: Critic, task: Task | None, examples: Sequence[Example], turns: int,
           template: str = DEFAULT_REFINE_TEMPLATE, initial: Sequence[str] | None = None) -> list[Trajectory]:
    """Runs up to `turns` critic/revision rounds on every example (batched; finished examples drop out). Each
    hypothesis is scored by `task.score` (empty scores with `task` None: a problem without a gold answer)."""
    current = list(initial) if initial is not None else generator.greedy([ex.x for ex in examples])
    trajectories = [Trajectory(ex.uid, [z], [], []) for ex, z in zip(examples, current)]
    active = list(range(len(examples)))
    for _ in range(turns):
        if not active:
            break
        turn = take_turn([examples[i] for i in active], [current[i] for i in active], critic.feedback,
                         lambda prompts, going: generator.greedy(prompts), template=template)
        for i, f in zip(active, turn.feedback):
            trajectories[i].feedback.append(f)
        active = [active[j] for j in turn.going]
        for i, z in zip(active, turn.revised):
            current[i] = z
            trajectories[i].hypotheses.append(z)
    for traj, ex in zip(trajectories, examples):
        traj.scores = [task.score([h], [ex]) if task is not None else {} for h in traj.hypotheses]
    return trajectories


def final_hypotheses(trajectories: Sequence[Trajectory], turn: int | None = None) -> list[str]:
    """Each trajectory's hypothesis after `turn` revisions (its last one when it stopped earlier; None: last)."""
    return [t.hypotheses[-1] if turn is None else t.hypotheses[min(turn, len(t.hypotheses) - 1)]
            for t in trajectories]
