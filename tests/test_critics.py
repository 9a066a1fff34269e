"""The trained critics' decision rules and quality figures, on hand-worked cases: the solve-then-compare critic,
the calibrated "No hint" threshold and the within-problem AUROC."""
import numpy as np
import pytest

from refiner_jax import stats
from refiner_jax.refiner import critics, evaluation
from refiner_jax.tasks import get_task
from refiner_jax.tasks.base import NO_HINT, Example

GOLD = "#0: multiply ( number0, number1 ) | #1: subtract ( #0, number2 )"


class FakeSolver:
    """A critic model whose greedy solution and log-probabilities are given by tables; counts its decodes."""

    def __init__(self, solutions, log_probs):
        self.solutions, self.log_probs, self.decoded = solutions, log_probs, []

    def generate_with_log_probs(self, texts):
        self.decoded += list(texts)
        return [[self.solutions[t]] for t in texts], np.array([[self.log_probs[(t, self.solutions[t])]] for t in texts])

    def score(self, texts, targets):
        return np.array([self.log_probs[(t, y)] for t, y in zip(texts, targets)])


def test_solver_critic_compares_against_its_own_solution():
    task = get_task("mwp")
    a = Example("a", "question a", GOLD, "1", {"numbers": [2.0, 3.0, 1.0]})
    b = Example("b", "question b", GOLD, "1", {"numbers": [2.0, 3.0, 1.0]})
    wrong_op = "#0: add ( number0, number1 ) | #1: subtract ( #0, number2 )"
    rewrite = "#0: multiply ( number1, number0 ) | #1: subtract ( #0, number2 )"  # the same formula
    # The critic solves a correctly; on b its own answer is malformed (nothing to compare against).
    model = FakeSolver({"question a": GOLD, "question b": "#0: multiply ( number0"},
                       {("question a", GOLD): -1.0, ("question a", wrong_op): -4.0, ("question a", "number0"): -0.5,
                        ("question b", "#0: multiply ( number0"): -2.0})
    critic = critics.SolverCritic(model, task)
    hypotheses = [GOLD, rewrite, wrong_op, "number0", wrong_op]
    examples = [a, a, a, a, b]
    assert critic.feedback(examples, hypotheses) == [
        NO_HINT, NO_HINT, "The operator in #0 is incorrect.",
        NO_HINT,  # wrong by the check, but more likely than the critic's own answer (-0.5 >= -1.0 + 0)
        NO_HINT]
    # Confidence: 0 where the check agrees (or cannot judge), log p(h) - log p(z_c) elsewhere.
    np.testing.assert_allclose(critic.confidence(examples, hypotheses), [0.0, 0.0, -3.0, 0.5, 0.0])
    assert model.decoded == ["question a", "question b"]  # each question solved once, then reused
    # A calibrated threshold above the confidence of "number0" makes the critic object to it too.
    strict = critics.SolverCritic(model, task, threshold=1.0)
    assert strict.feedback([a], ["number0"]) == ["An operator is missing."]
    # Unthresholded, it names whatever its check finds, however likely the hypothesis; still nothing where the check
    # agrees or cannot judge. Its own answers are not decoded again.
    decoded = list(model.decoded)
    assert critic.unthresholded().feedback(examples, hypotheses) == [
        NO_HINT, NO_HINT, "The operator in #0 is incorrect.", "An operator is missing.", NO_HINT]
    assert model.decoded == decoded
    with pytest.raises(ValueError, match="2 problems but 1 hypotheses"):
        critic.feedback([a, b], [GOLD])


def test_critics_explain_the_step_they_are_asked_about():
    """Asked about one step, the solving critic says what its check against its own answer finds there, even where
    its confidence keeps it silent unprompted; the paper's critic picks the likeliest of the task's sentences about
    that step."""
    task = get_task("mwp")
    a = Example("a", "question a", GOLD, "1", {"numbers": [2.0, 3.0, 1.0]})
    b = Example("b", "question b", GOLD, "1", {"numbers": [2.0, 3.0, 1.0]})
    wrong_op = "#0: add ( number0, number1 ) | #1: subtract ( #0, number2 )"
    model = FakeSolver({"question a": GOLD, "question b": "#0: multiply ( number0"},
                       {("question a", GOLD): -1.0, ("question a", wrong_op): -0.5,
                        ("question b", "#0: multiply ( number0"): -2.0})
    solver = critics.SolverCritic(model, task)
    assert solver.feedback([a], [wrong_op]) == [NO_HINT]  # -0.5 >= -1.0: unprompted it keeps quiet
    # Step 0 is where its own answer differs; step 1 uses #0 as its own does; on b its own answer is malformed.
    assert solver.explain([a, a, b], [wrong_op] * 3, [0, 1, 0]) == [
        "The operator in #0 is incorrect.", NO_HINT, NO_HINT]

    class Scorer:
        def __init__(self):
            self.asked = []

        def score(self, texts, targets):
            self.asked += list(zip(texts, targets))
            likely = {("a", "The second number in #1 is incorrect."): -0.3,
                      ("b", "The operator in #0 is incorrect."): -0.9}
            return np.array([likely.get((t.split()[1], y), -2.0) for t, y in zip(texts, targets)])

    scorer = Scorer()
    paper = critics.ModelCritic(scorer, task)
    assert paper.explain([a, b], [wrong_op, wrong_op], [1, 0]) == [
        "The second number in #1 is incorrect.", "The operator in #0 is incorrect."]
    input_a, input_b = task.critic_input(a, wrong_op), task.critic_input(b, wrong_op)
    assert scorer.asked == ([(input_a, s) for s in task.step_sentences(1)]
                            + [(input_b, s) for s in task.step_sentences(0)])


def test_model_critic_threshold_decides_no_hint():
    class Fixed:
        def generate_with_log_probs(self, texts):
            return [["The operator in #0 is incorrect."] for _ in texts], np.zeros((len(texts), 1))

        def score(self, texts, targets):
            return np.array([{"a z": -0.2, "b z": -3.0}[t] for t in texts])

    class Task:
        def critic_input(self, ex, h):
            return f"{ex.x} {h}"

    critic = critics.ModelCritic(Fixed(), Task(), threshold=-1.0)
    examples = [Example("0", "a", "", ""), Example("1", "b", "", "")]
    assert critic.feedback(examples, ["z", "z"]) == [NO_HINT, "The operator in #0 is incorrect."]
    np.testing.assert_allclose(critic.confidence(examples, ["z", "z"]), [-0.2, -3.0])


def test_paired_auroc_ignores_how_hard_a_problem_looks():
    # Problem e (easy): right 0.9, wrong 0.95; problem h (hard): right 0.1, wrong 0.2. Within each problem the
    # wrong hypothesis scores higher, so the paired AUROC is 0; pooled, the right 0.9 beats the wrong 0.2 (1 of 4).
    confidence, wrong, groups = [0.9, 0.95, 0.1, 0.2], [False, True, False, True], ["e", "e", "h", "h"]
    assert stats.paired_auroc(confidence, wrong, groups) == 0.0
    assert stats.error_auroc(confidence, wrong) == 0.25
    # Pairs: p (right 0.9; wrong 0.1, 0.95) -> 1 win of 2; q (right 0.5, 0.5; wrong 0.5) -> 2 ties = 1 of 2;
    # r has no wrong hypothesis and adds no pair: 2 / 4.
    assert stats.paired_auroc([0.9, 0.1, 0.95, 0.5, 0.5, 0.5, 0.3], [0, 1, 1, 0, 0, 1, 0],
                              ["p", "p", "p", "q", "q", "q", "r"]) == 0.5
    assert np.isnan(stats.paired_auroc([1.0, 2.0], [True, False], ["x", "y"]))


def test_calibrated_threshold_separates_right_from_wrong():
    # Wrong at -3 and -2, right at -1 and 0: "No hint" from the midpoint -1.5 up classifies all four right.
    assert evaluation.calibrate_threshold([-3.0, -2.0, -1.0, 0.0], [True, True, False, False]) == (-1.5, 1.0)
    # Right -2, wrong -1, right 0: thresholds below -2 (2/3 right) and at -0.5 (2/3) tie; the higher one is kept.
    assert evaluation.calibrate_threshold([-2.0, -1.0, 0.0], [False, True, False]) == (pytest.approx(-0.5), 2 / 3)
    # All right: a threshold below the lowest confidence (1 under it); all wrong: above the highest.
    assert evaluation.calibrate_threshold([0.5, 0.7], [False, False]) == (-0.5, 1.0)
    assert evaluation.calibrate_threshold([0.5, 0.7], [True, True]) == (1.7, 1.0)


def test_paired_eval_set_gives_each_problem_its_gold_and_wrong_perturbations():
    task = get_task("mwp", synthetic_sizes={"train": 0, "val": 20, "test": 0})
    examples = task.load("val")
    items = evaluation.paired_eval_set(task, examples, seed=3)
    assert items == evaluation.paired_eval_set(task, examples, seed=3)  # fixed
    for ex in examples:
        mine = [(h, f) for e, h, f in items if e.uid == ex.uid]
        assert mine[0] == (ex.z, task.oracle_feedback(ex, ex.z)) and mine[0][1].ok
        assert len(mine) == 3 and all(not f.ok for _, f in mine[1:])
        assert len({h for h, _ in mine}) == 3


def test_calibration_keeps_the_revisions_that_help():
    import dataclasses

    task = get_task("mwp")
    right, wrong = "#0: add ( number0, number1 )", "#0: subtract ( number0, number1 )"
    examples = [Example(f"p{i}", f"q{i}", right, "7", {"numbers": [3.0, 4.0]}) for i in range(4)]
    # Turn 0: p0 and p1 wrong, p2 and p3 right. The critic flags p0 (confidence -3), p1 (-0.5) and, falsely,
    # p2 (-1); it accepts p3 (0). Revising fixes p0, leaves p1 wrong and breaks p2.
    first = {"q0": wrong, "q1": wrong, "q2": right, "q3": right}
    revised = {"q0": right, "q1": wrong, "q2": wrong}
    confidence = {"q0": -3.0, "q1": -0.5, "q2": -1.0, "q3": 0.0}

    class Generator:
        def greedy(self, texts):
            return [first[t] if t in first else revised[t.split()[0]] for t in texts]

    @dataclasses.dataclass
    class Critic:
        threshold: float = 0.0

        def feedback(self, exs, hyps):
            return [NO_HINT if ex.x == "q3" or confidence[ex.x] >= self.threshold else "The operator in #0 is "
                    "incorrect." for ex in exs]

        def confidence(self, exs, hyps):
            return np.array([confidence[ex.x] for ex in exs])

    # Candidate thresholds -4, -2, -0.75, 0.5 keep the revisions of {}, {p0}, {p0, p2}, {p0, p1, p2}: EM 0.5, 0.75,
    # 0.5, 0.5. The best, -2, gains 1 on a quarter of the problems.
    # 25 copies of each problem: the gain's standard error is sd([1] * 25 + [0] * 75) / 10 = 0.0435, and only -2
    # comes within it of 0.75. "No hint" there for p1, p2, p3: right on p2 and p3, wrong on p1 -> accuracy 3/4.
    out = evaluation.calibrate_for_refinement(task, Critic(), Generator(), examples * 25)
    assert out["threshold"] == -2.0 and out["before"] == 0.5 and out["after"] == 0.75 and out["revised"] == 25
    assert out["flag_accuracy"] == 0.75 and out["metric"] == "equation_em_canonical" and out["n"] == 100
    assert out["standard_error"] == pytest.approx(np.std([1] * 25 + [0] * 75, ddof=1) / 10)
    # The 4 problems alone: the best gain's standard error is sd([1, 0, 0, 0]) / 2 = 0.25, so -4 (no revision, EM
    # 0.5) is within it and, being the lowest threshold, is chosen.
    alone = evaluation.calibrate_for_refinement(task, Critic(), Generator(), examples)
    assert alone["threshold"] == -4.0 and alone["after"] == 0.5 and alone["revised"] == 0
    assert alone["best_threshold"] == -2.0 and alone["best_after"] == 0.75


def test_solver_critic_votes_its_reference_among_samples():
    task = get_task("mwp")
    ex = Example("a", "question a", "#0: multiply ( number0, number1 )", "6", {"numbers": [2.0, 3.0]})
    add, mul = "#0: add ( number0, number1 )", "#0: multiply ( number0, number1 )"

    class Sampler(FakeSolver):
        def generate(self, texts, *, num_samples, temperature, rng):
            assert num_samples == 4 and temperature == 1.0
            self.decoded += list(texts)
            return [[mul, "#0: multiply ( number1, number0 )", mul, "not a formula"] for _ in texts]

    # Greedy answer 5 (add), samples 6, 6, 6 and none: 6 wins 3 votes to 1 of 5, and its first formula is z_c.
    critic = critics.SolverCritic(Sampler({"question a": add}, {("question a", add): -0.1}), task, threshold=-0.5,
                                  samples=4)
    hypotheses = [add, "#0: multiply ( number1, number0 )", "#0: subtract ( number1, number0 )"]
    # add: (1 - 3) / 5 = -0.4; the commuted product agrees with z_c: 0; subtract (answer 1, no votes): -3 / 5.
    np.testing.assert_allclose(critic.confidence([ex] * 3, hypotheses), [-0.4, 0.0, -0.6])
    assert critic.feedback([ex] * 3, hypotheses) == [NO_HINT, NO_HINT, "The operator in #0 is incorrect."]
    assert critic.references([ex])[0][0] == mul
    assert critic.model.decoded == ["question a", "question a"]  # one greedy and one sampled decode, then reused


def test_capability_protocols_say_what_each_critic_offers():
    """Callers ask `isinstance(critic, ConfidentCritic / ExplainingCritic / BudgetedCritic)`: the trained critics
    have all three, the oracle only `explain`, a wrapped function and a user's object with `feedback` alone none."""
    task = get_task("mwp")

    class Mine:
        def feedback(self, examples, hypotheses):
            return [NO_HINT] * len(hypotheses)

    offered = {}
    for critic in (critics.ModelCritic(None, task), critics.SolverCritic(None, task), critics.OracleCritic(task),
                   critics.CallableCritic(lambda e, h: []), Mine()):
        offered[type(critic).__name__] = [isinstance(critic, p) for p in (critics.Critic, critics.ConfidentCritic,
                                                                          critics.ExplainingCritic,
                                                                          critics.BudgetedCritic)]
    assert offered == {"ModelCritic": [True, True, True, True], "SolverCritic": [True, True, True, False],
                       "OracleCritic": [True, False, True, False], "CallableCritic": [True, False, False, False],
                       "Mine": [True, False, False, False]}
