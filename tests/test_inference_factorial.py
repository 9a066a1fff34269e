"""The inference factorial (who decides to revise x what text the generator reads) on a toy task whose every cell
is worked out by hand.

Problem i: x = "q{i}", gold "g{i}". The generator answers INITIAL at turn 0 (q0 and q3 right, q1 and q2 wrong: 50%)
and revises by what it reads: a sentence about "#1" (the oracle's, or the location "Step #1 is incorrect.") fixes q1
and q2 alike, except that the location alone fixes only q1; a sentence about "#0" adds "?"; the plain sentence adds
"!" (wrong either way). The oracle flags q1 and q2. The critic flags q0 (a false alarm) and q1 and misses q2; without
its threshold it says "#0" about q0, "#1" about q1 and still nothing about q2.
"""
import re

import pytest

from refiner_jax.refiner import critics, inference_factorial as fx
from refiner_jax.runs import refiner_eval, run_config
from refiner_jax.runs.run_info import RunInfo
from refiner_jax.tasks.base import NO_HINT, Example, Feedback, StepError
from test_evaluate import ToyTask as EvaluationToyTask

EXAMPLES = [Example(uid=str(i), x=f"q{i}", z=f"g{i}", y="") for i in range(4)]
INITIAL = {"q0": "g0", "q1": "bad1", "q2": "bad2", "q3": "g3"}
_REFINE = re.compile(r"^q(\d+) Previous Answer: (.*) Feedback: (.*)$")


class ToyTask(EvaluationToyTask):
    """test_evaluate's toy task, whose oracle names step #1 of every wrong hypothesis."""

    def oracle_feedback(self, example, hypothesis):
        if hypothesis == example.z:
            return Feedback((), NO_HINT)
        return Feedback((StepError("wrong", 1),), "The value in #1 is incorrect.")


def _revise(i: str, previous: str, said: str) -> str:
    if said == "The value in #1 is incorrect." or (said == "Step #1 is incorrect." and i == "1"):
        return f"g{i}"
    return previous + ("?" if "#0" in said else "!")


class Generator:
    def greedy(self, texts):
        return [INITIAL[t] if _REFINE.match(t) is None else _revise(*_REFINE.match(t).groups()) for t in texts]


class Critic:
    def __init__(self, threshold=True):
        self.threshold = threshold

    def feedback(self, examples, hypotheses):
        said = {"q0": "The value in #0 is incorrect.", "q1": "The value in #1 is incorrect."}
        return [said.get(ex.x, NO_HINT) if h == INITIAL[ex.x] else NO_HINT for ex, h in zip(examples, hypotheses)]

    def unthresholded(self):
        return Critic(threshold=False)


# (EM after one turn, revisions, plain fallbacks) of each cell, by hand from the module docstring's story.
EXPECTED = {
    "oracle/oracle": (1.00, 2, 0),  # q1, q2 read "#1": both fixed
    "oracle/critic": (0.75, 2, 1),  # q1 fixed; the critic has nothing on q2: plain, "bad2!"
    "oracle/location": (0.75, 2, 0),  # "Step #1" fixes q1 only
    "oracle/plain": (0.50, 2, 0),  # "!" on both: nothing fixed
    "critic/oracle": (0.50, 2, 1),  # the oracle has nothing on the right q0: plain breaks it ("g0!"); q1 fixed
    "critic/critic": (0.50, 2, 0),  # "#0" breaks q0 ("g0?"); q1 fixed
    "critic/location": (0.50, 2, 1),  # the oracle names no step of q0: plain breaks it; "Step #1" fixes q1
    "critic/plain": (0.25, 2, 0),  # q0 broken, q1 still wrong
}


def test_every_cell_matches_the_hand_worked_outcome():
    block = fx.run_factorial(ToyTask(), {"toy": Generator()}, Critic(), EXAMPLES, turns=1, bootstrap_samples=200)
    assert block["primary_metric"] == "em" and block["turns"] == 1 and block["num_examples"] == 4
    result = block["generators"]["toy"]
    assert result["alone"]["mean"] == 0.5
    got = {name: (cell["mean"], cell["revisions"], cell["fallbacks"]) for name, cell in result["cells"].items()}
    assert got == EXPECTED
    for name, cell in result["cells"].items():
        assert cell["gain"]["mean"] == pytest.approx(EXPECTED[name][0] - 0.5)
        assert cell["gain"]["low"] <= cell["gain"]["mean"] <= cell["gain"]["high"]
    table = "\n".join(fx.factorial_markdown(block))
    assert "| oracle | +50.0 [" in table and "| critic | +0.0 [" in table and "-25.0 [" in table


def test_the_crossed_critic_lets_one_decide_and_the_other_speak():
    """The oracle decides (q1 and q2 are wrong); the speaker, asked about those two only, has nothing on the first
    (the plain sentence, counted) and "Look again." on the second."""
    crossed = fx.CrossedCritic(critics.OracleCritic(ToyTask()), lambda exs, hs: [NO_HINT, "Look again."])
    assert crossed.feedback(EXAMPLES, ["g0", "bad1", "bad2", "g3"]) == [NO_HINT, fx.PLAIN, "Look again.", NO_HINT]
    assert (crossed.revisions, crossed.fallbacks) == (2, 1)


def test_the_factorial_needs_a_calibrated_critic():
    run = RunInfo("/nonexistent", run_config.base_config())
    with pytest.raises(run_config.ConfigError, match="eval.factorial: /nonexistent has no trained critic"):
        refiner_eval.factorial(run, ToyTask(), EXAMPLES, Generator(), critics.OracleCritic(ToyTask()), 1, 4)
