"""The REFINER loop as a joint-system baseline on stub models: sampled starts through the loop, the majority vote
over their final answers, the compute counted per problem and the number of starts that matches a budget, all
worked out by hand."""
import numpy as np
import pytest

from refiner_jax.joint import loop_baselines
from refiner_jax.tasks import Example, mwp

# numbers [10, 2, 3]: GOLD = 10 - 2 * 3 = 4, WRONG = 10 + 6 = 16, DIV = 10 / 6; every one is 13 words long.
GOLD = "#0: multiply ( number1, number2 ) | #1: subtract ( number0, #0 )"
WRONG = GOLD.replace("subtract", "add")
DIV = GOLD.replace("subtract", "divide")
NONSENSE = "I do not know"  # 4 words, no answer


def _example(uid):
    return Example(uid, f"problem {uid}", GOLD, "4.0", {"numbers": [10.0, 2.0, 3.0], "answer": 4.0})


class _Generator:
    """Revises WRONG to GOLD; keeps DIV and NONSENSE as they are."""

    def greedy(self, texts):
        return [GOLD if WRONG in t else DIV if DIV in t else NONSENSE for t in texts]


class _Critic:
    def __init__(self):
        self.calls = 0

    def feedback(self, examples, solutions):
        self.calls += len(solutions)
        return ["No hint." if s == GOLD else "The operator in #1 is incorrect." for s in solutions]


def _cost(example, hypothesis, feedback, first):
    return (10, 11) if first else (0, 1)  # a solving critic: its own answer once per problem, then one pass a call


def _runs(critic=None):
    return loop_baselines.run_loops(
        [_example("a"), _example("b")], [[WRONG, DIV, DIV], [WRONG, GOLD, NONSENSE]], generator=_Generator(),
        critic=critic or _Critic(), task=mwp.MWPTask(), turns=2, count_tokens=lambda t: len(t.split()),
        critic_cost=_cost)


def test_sampled_starts_through_the_loop_then_a_vote():
    critic = _Critic()
    runs = _runs(critic)
    # a: WRONG -> GOLD (then "No hint"); each DIV stays DIV for both turns. b: WRONG -> GOLD, GOLD stops at once,
    # NONSENSE stays NONSENSE.
    assert [[len(t.hypotheses) for t in ts] for ts in runs.trajectories] == [[2, 3, 3], [2, 1, 3]]
    assert critic.calls == 6 + 5
    chosen, confidence = loop_baselines.vote(runs, [_example("a"), _example("b")], mwp.MWPTask(), 3)
    # a: answers 4, 10/6, 10/6: DIV wins 2 of 3 although one start was fixed. b: GOLD wins both answered votes
    # (NONSENSE has no answer), and its first occurrence (the revised WRONG) is the chosen hypothesis.
    assert chosen == [DIV, GOLD]
    np.testing.assert_allclose(confidence, [2 / 3, 1.0])
    chosen, confidence = loop_baselines.vote(runs, [_example("a"), _example("b")], mwp.MWPTask(), 1)
    assert chosen == [GOLD, GOLD] and confidence.tolist() == [1.0, 1.0]
    # Three starts: a wrote 2 + 3 + 3 hypotheses of 13 tokens (a pass per token and a prefill each) and called the
    # critic 2 + 2 + 2 times; b wrote 2 + 1 of 13 tokens and 3 of 4 and called it 2 + 1 + 2 times. The critic's
    # first call on a problem costs (10, 11), each later one (0, 1).
    compute = runs.compute(3)
    assert compute.tokens.tolist() == [8 * 13 + 10, 3 * 13 + 3 * 4 + 10]
    assert compute.passes.tolist() == [8 * 14 + 11 + 5, 3 * 14 + 3 * 5 + 11 + 4]
    one = runs.compute(1)  # the first start only: 2 hypotheses and 2 critic calls each
    assert one.tokens.tolist() == [2 * 13 + 10] * 2 and one.passes.tolist() == [2 * 14 + 11 + 1] * 2


def test_matched_starts_is_the_fewest_that_spend_the_budget():
    runs = _runs()
    # Mean tokens per problem with 1, 2, 3 starts: 36, (75 + 49) / 2 = 62, (114 + 61) / 2 = 87.5.
    assert [runs.compute(m).tokens.mean() for m in (1, 2, 3)] == [36, 62, 87.5]
    assert loop_baselines.matched_starts(runs, 36) == 1
    assert loop_baselines.matched_starts(runs, 36.5) == 2
    assert loop_baselines.matched_starts(runs, 87.5) == 3
    assert loop_baselines.matched_starts(runs, 1000) == 3  # the budget is out of reach: every start


def test_starts_must_be_as_many_for_every_problem():
    with pytest.raises(ValueError, match="same number M >= 1 of starts"):
        loop_baselines.run_loops([_example("a"), _example("b")], [[GOLD], [GOLD, WRONG]], generator=_Generator(),
                                 critic=_Critic(), task=mwp.MWPTask(), turns=1, count_tokens=len, critic_cost=_cost)
