"""The REFINER loop as a baseline of the joint system, with its compute counted like the joint rows':

    greedy start   one greedy hypothesis per problem through the loop (the paper's inference)
    sampled starts the first M of a problem's sampled hypotheses, each through the loop, then a majority vote over
                   their final answers (`rerank.majority_vote`), M chosen so the loop spends what the joint system
                   spends

Compute per problem: every hypothesis the generator wrote (starts included) and every critic call. A critic that
solves the problem itself pays for its own answer once per problem, as it decodes it once per question:
`critic_cost(..., first=True)` is its first call on a problem, `first=False` every later one.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from refiner_jax.joint.locate_explain_revise import Compute, CountTokens, CriticCost
from refiner_jax.refiner import feedback_loop
from refiner_jax.refiner.feedback_loop import Trajectory
from refiner_jax.reward import rerank
from refiner_jax.tasks.base import DEFAULT_REFINE_TEMPLATE, Example, Task


@dataclasses.dataclass
class LoopRuns:
    """Problem i's trajectories from each of its M starts, and what each cost on its own (critic calls at their
    later-call cost); `first_call` [n, 2] is what the critic's first call on a problem adds (tokens, passes)."""

    trajectories: list[list[Trajectory]]  # [n][M]
    tokens: np.ndarray  # [n, M]
    passes: np.ndarray  # [n, M]
    first_call: np.ndarray  # [n, 2]

    def compute(self, m: int) -> Compute:
        """The compute of the first `m` starts of every problem."""
        return Compute(self.tokens[:, :m].sum(axis=1) + self.first_call[:, 0],
                       self.passes[:, :m].sum(axis=1) + self.first_call[:, 1])

    def final(self, m: int) -> list[list[str]]:
        """[n][m] the final hypotheses of the first `m` starts."""
        return [feedback_loop.final_hypotheses(ts[:m]) for ts in self.trajectories]


def run_loops(examples: Sequence[Example], starts: Sequence[Sequence[str]], *, generator, critic, task: Task,
              turns: int, count_tokens: CountTokens, critic_cost: CriticCost,
              template: str = DEFAULT_REFINE_TEMPLATE) -> LoopRuns:
    """Each of problem i's M `starts[i]` through `turns` rounds of the REFINER loop, as one batched loop over all
    n * M, and each trajectory's compute."""
    m = {len(s) for s in starts}
    if len(m) != 1 or 0 in m or len(starts) != len(examples):
        raise ValueError(f"need the same number M >= 1 of starts for each of the {len(examples)} problems; got "
                         f"{len(starts)} lists of lengths {sorted(m)}")
    m = m.pop()
    flat = feedback_loop.refine(generator, critic, task, [ex for ex in examples for _ in range(m)], turns, template,
                                initial=[h for hs in starts for h in hs])
    tokens, passes = np.zeros((len(examples), m), np.int64), np.zeros((len(examples), m), np.int64)
    first_call = np.zeros((len(examples), 2), np.int64)
    for t, traj in enumerate(flat):
        i, j = divmod(t, m)
        for h in traj.hypotheses:  # one pass per token written and a prefill
            written = count_tokens(h)
            tokens[i, j] += written
            passes[i, j] += written + 1
        for turn, (h, f) in enumerate(zip(traj.hypotheses, traj.feedback)):
            later = critic_cost(examples[i], h, f, False)
            tokens[i, j] += later[0]
            passes[i, j] += later[1]
            if j == turn == 0:
                first_call[i] = np.subtract(critic_cost(examples[i], h, f, True), later)
    return LoopRuns([flat[i * m:(i + 1) * m] for i in range(len(examples))], tokens, passes, first_call)


def vote(runs: LoopRuns, examples: Sequence[Example], task: Task, m: int) -> tuple[list[str], np.ndarray]:
    """The majority answer of the first `m` starts' final hypotheses (ties to the first): per problem the chosen
    hypothesis (the first start's when none has an answer) and the vote share (the confidence; -inf without an
    answer)."""
    final = runs.final(m)
    selection = rerank.majority_vote([[task.answer_key(ex, h) for h in hs] for ex, hs in zip(examples, final)])
    return [hs[max(int(j), 0)] for hs, j in zip(final, selection.index)], selection.confidence


def matched_starts(runs: LoopRuns, tokens: float) -> int:
    """The fewest starts whose mean tokens per problem reach `tokens` (all of them when none does)."""
    m = runs.tokens.shape[1]
    return next((k for k in range(1, m + 1) if runs.compute(k).tokens.mean() >= tokens), m)
