"""The joint system: a step verifier locates the first doubtful step, a critic explains it, the generator revises
from there, and the verifier reranks originals and revisions.

    K samples per problem, every step scored (one scorer pass per solution)
    gate:     keep the verifier's best sample when its score reaches `gate` (a confident problem is left alone)
    locate:   the first step of the best sample scored below `step_threshold` (its lowest step if none is)
    explain:  the critic asked about the located step `#k` (`critic.explain`); a critic without `explain`: its
              feedback's sentences about `#k`, when it has some
    revise:   the generator rewrites from the problem, the sample and the feedback, the steps before `#k` forced;
              for T rounds, each on the previous revision while the verifier still doubts it
    rerank:   the best of the K samples and the revisions by the verifier (or their verifier-weighted vote)

`Variant` switches each part off for the ablations (location only: the feedback is `location_feedback(k)`;
explanation only: the critic's whole feedback and no forced prefix; unasked: only what the critic's own feedback says
about `#k`). Every model call is counted
(`Compute`: generated tokens and forward passes), so variants can be compared at equal compute. The function
works over any generator (`generate(inputs, prefixes) -> texts`), critic (`feedback(examples, solutions)`) and step
scorer (`(prompts, solutions) -> per-step scores`). Each round is one generator <-> critic turn
(`refiner.feedback_loop.take_turn`), the same as the REFINER loop's, with the located step in the feedback and the
prefix.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from refiner_jax.refiner.critics import ExplainingCritic
from refiner_jax.refiner.feedback_loop import ask_critic, take_turn
from refiner_jax.reward import rerank
from refiner_jax.reward.batches import step_ends
from refiner_jax.tasks.base import DEFAULT_REFINE_TEMPLATE, Example, Task, sentences_about

StepScorer = Callable[[list[str], list[str]], list[np.ndarray]]
# (generator inputs, forced target prefixes) -> one greedy output each, prefix included
Generate = Callable[[list[str], list[str]], list[str]]
CountTokens = Callable[[str], int]
# (example, solution judged, feedback written, first call on this problem) -> (tokens, forward passes)
CriticCost = Callable[[Example, str, str, bool], tuple[int, int]]


@dataclasses.dataclass(frozen=True)
class Variant:
    """Which parts run: `locate` (revise from the located step, forced prefix), `explain` (the critic's feedback;
    without it the location sentence), `ask` (with both: the critic is asked about the located step and answers even
    where it would say "No hint" unprompted; without it only its unprompted feedback's sentences about the step),
    `gate` (only problems whose best score is below the gate), `rerank` (the revision is kept only when the verifier
    scores it above the best sample; without it the revision replaces the sample, so the verifier decides only which
    problems to revise), `vote` (instead, every problem's answer is the verifier-weighted vote over its K samples and
    its revision: `weighted_vote`)."""

    locate: bool = True
    explain: bool = True
    ask: bool = True
    gate: bool = True
    rerank: bool = True
    vote: bool = False


@dataclasses.dataclass
class Compute:
    """Per-problem counts of model work: tokens written by any model (forced prefix tokens are read, not written),
    and forward passes (one per generated token, one prefill per generated text, one per solution scored)."""

    tokens: np.ndarray
    passes: np.ndarray

    @classmethod
    def zeros(cls, n: int) -> Compute:
        return cls(np.zeros(n, np.int64), np.zeros(n, np.int64))

    def generated(self, problem: int, written: int) -> None:
        self.add(problem, written, written + 1)

    def add(self, problem: int, tokens: int, passes: int) -> None:
        self.tokens[problem] += tokens
        self.passes[problem] += passes

    def scored(self, problem: int, solutions: int = 1) -> None:
        self.passes[problem] += solutions


@dataclasses.dataclass
class JointResult:
    """Per problem: the chosen solution, its verifier score (the confidence), the verifier's best sample (what a
    revision competes with), the last revision (None when the gate kept the sample) and whether a revision became the
    answer, the step located, the critic's own words ("" when it was not asked) and the feedback used in the first
    round; and the compute spent."""

    chosen: list[str]
    confidence: np.ndarray
    best: list[str]
    revisions: list[str | None]
    kept: np.ndarray  # [n] bool: a revision became the answer
    located: list[int]
    critic_said: list[str]
    feedback: list[str]
    compute: Compute
    rounds: list[list[str]]  # [n][rounds taken] every revision written


def solution_score(steps: np.ndarray) -> float:
    """A solution's verifier score: its lowest step score (-inf without a scored step)."""
    return float(np.min(steps)) if len(steps) else -np.inf


def locate(steps: np.ndarray, step_threshold: float) -> int:
    """The first step scored below `step_threshold`, else the lowest-scored step (0 without a scored step)."""
    below = np.flatnonzero(np.asarray(steps) < step_threshold)
    if below.size:
        return int(below[0])
    return int(np.argmin(steps)) if len(steps) else 0


def weighted_vote(task: Task, examples: Sequence[Example], candidates: Sequence[Sequence[str]],
                  steps: Sequence[Sequence[np.ndarray]]) -> tuple[list[str | None], np.ndarray, np.ndarray]:
    """Verifier-weighted voting (`reward.rerank.weighted_vote`) over each problem's candidates (any number each),
    weighted by their `solution_score` (a probability; none for a solution without a scored step): the chosen
    candidate (None when no candidate has an answer), its confidence (the winning answer's share of the weight) and
    its index among the problem's candidates (-1 for none)."""
    width = max(len(c) for c in candidates)
    answers = [[task.answer_key(ex, c) for c in cs] + [None] * (width - len(cs))
               for ex, cs in zip(examples, candidates)]
    weights = np.zeros((len(candidates), width))
    for i, ss in enumerate(steps):
        weights[i, :len(ss)] = [max(solution_score(s), 0.0) for s in ss]
    picked = rerank.weighted_vote(answers, weights)
    chosen = [cs[j] if j >= 0 else None for cs, j in zip(candidates, picked.index.tolist())]
    return chosen, picked.confidence, picked.index


def prefix_before(task: Task, solution: str, step: int) -> str:
    """The solution's text up to the end of the step before `step` ("" for the first step)."""
    steps = task.split_steps(solution)
    if step <= 0 or not steps:
        return ""
    return solution[:step_ends(solution, steps)[min(step, len(steps)) - 1]]


def joint_refine(examples: Sequence[Example], samples: Sequence[Sequence[str]],
                 sample_steps: Sequence[Sequence[np.ndarray]], *, task: Task, generate: Generate, critic,
                 score_steps: StepScorer, count_tokens: CountTokens,
                 gate: float, step_threshold: float, location_feedback: Callable[[int], str] | None = None,
                 variant: Variant = Variant(), template: str = DEFAULT_REFINE_TEMPLATE, turns: int = 1,
                 critic_cost: CriticCost | None = None, explain_cost: CriticCost | None = None) -> JointResult:
    """`turns` locate / explain / revise rounds on every problem, then the rerank (each round batched: one critic
    call, one generator call and one scorer call for all the problems it revises). Round t revises round t-1's
    revision (the first, the verifier's best sample) while its score stays below the gate (every round without the
    gate) and the feedback is not "No hint". `samples[i]` are problem i's K samples and `sample_steps[i][j]` the
    verifier's step scores of sample j (already computed and counted by the caller). `critic_cost(example, solution,
    feedback, first)` -> (tokens, passes) the critic spent, `first` on its first call on the problem (default: it
    wrote the feedback); `explain_cost` the same for `critic.explain` (default: `critic_cost`). `location_feedback(k)`
    is the feedback that only locates step k (default: the task's, `Task.location_feedback`)."""
    location_feedback = location_feedback or task.location_feedback
    if critic_cost is None:
        def critic_cost(example, solution, text, first):
            return count_tokens(text), count_tokens(text) + 1
    explain_cost = explain_cost or critic_cost
    n = len(examples)
    compute = Compute.zeros(n)
    best = [int(np.argmax([solution_score(s) for s in steps])) for steps in sample_steps]
    top = np.array([solution_score(steps[b]) for steps, b in zip(sample_steps, best)])
    best_samples = [samples[i][b] for i, b in enumerate(best)]
    current = list(best_samples)  # what each problem's next round revises, and its step scores
    current_steps = [sample_steps[i][b] for i, b in enumerate(best)]
    located = [locate(steps, step_threshold) for steps in current_steps]
    feedback, critic_said = [""] * n, [""] * n
    tried: list[list[tuple[str, np.ndarray]]] = [[] for _ in range(n)]  # every revision and its step scores
    asked: set[int] = set()
    active = [i for i in range(n) if not variant.gate or top[i] < gate]
    ask = variant.locate and variant.ask and isinstance(critic, ExplainingCritic)
    for turn in range(turns):
        where = [locate(current_steps[i], step_threshold) for i in active]
        prefixes = [prefix_before(task, current[i], k) if variant.locate else "" for i, k in zip(active, where)]

        def critique(problems: list[Example], solutions: list[str]) -> list[str]:
            """What the round's revisions read: the critic's words about the located step (or its whole feedback
            without `locate`), else the location sentence."""
            if not variant.explain:
                return [location_feedback(k) for k in where]
            answers = ask_critic(lambda exs, hs: critic.explain(exs, hs, where) if ask else critic.feedback(exs, hs),
                                 problems, solutions)
            said = []
            for i, k, f in zip(active, where, answers):
                compute.add(i, *(explain_cost if ask else critic_cost)(examples[i], current[i], f, i not in asked))
                asked.add(i)
                about = sentences_about(f, k) if variant.locate else f
                said.append(about or (location_feedback(k) if variant.locate else f))
                if turn == 0:
                    critic_said[i] = f
            return said

        this_round = take_turn([examples[i] for i in active], [current[i] for i in active], critique,
                               lambda prompts, going: generate(prompts, [prefixes[j] for j in going]),
                               template=template)
        if turn == 0:
            for i, f in zip(active, this_round.feedback):
                feedback[i] = f
        revising = [active[j] for j in this_round.going]
        scores = score_steps([examples[i].x for i in revising], this_round.revised) if revising else []
        for i, p, z, steps in zip(revising, [prefixes[j] for j in this_round.going], this_round.revised, scores):
            compute.generated(i, max(count_tokens(z) - count_tokens(p), 0))
            compute.scored(i)
            tried[i].append((z, steps))
            current[i], current_steps[i] = z, steps
        active = [i for i in revising if not variant.gate or solution_score(current_steps[i]) < gate]
    revisions = [t[-1][0] if t else None for t in tried]
    chosen, confidence, kept = list(best_samples), top.copy(), np.zeros(n, bool)
    if variant.vote:
        candidates = [list(samples[i]) + [z for z, _ in tried[i]] for i in range(n)]
        steps = [list(sample_steps[i]) + [st for _, st in tried[i]] for i in range(n)]
        voted, confidence, index = weighted_vote(task, examples, candidates, steps)
        kept = np.array([index[i] >= len(samples[i]) for i in range(n)])
        chosen = [c if c is not None else best_samples[i] for i, c in enumerate(voted)]
    else:
        for i, t in enumerate(tried):
            for z, steps in (t[-1:] if not variant.rerank else t):
                if not variant.rerank or solution_score(steps) > confidence[i]:
                    chosen[i], confidence[i], kept[i] = z, solution_score(steps), True
    return JointResult(chosen, confidence, best_samples, revisions, kept, located, critic_said, feedback, compute,
                       [[z for z, _ in t] for t in tried])
