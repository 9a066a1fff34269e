"""K-sample selection and its report: every expected value is worked out by hand in the comment beside it."""
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from refiner_jax.reward import rerank
from refiner_jax.runs import plots, results
from refiner_jax.stats import bootstrap_ci

REPO = pathlib.Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_imports_neither_jax_nor_matplotlib():
    # Selection runs wherever scores were saved: importing the module must not pull in JAX, Flax or matplotlib.
    code = "import sys, refiner_jax.reward.rerank; print(*{m.split('.')[0] for m in sys.modules})"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert not {"jax", "flax", "matplotlib"} & set(run.stdout.split())


# ----------------------------------------------------------------------------------------------- step scores


RAGGED = [[0.5, 0.25, 0.75], [0.5], [0.25, 1.0]]
# last: 0.75, 0.5, 1.0; min: 0.25, 0.5, 0.25; prod: 0.5*0.25*0.75 = 0.09375, 0.5, 0.25*1.0 = 0.25
EXPECTED = {"last": [0.75, 0.5, 1.0], "min": [0.25, 0.5, 0.25], "prod": [0.09375, 0.5, 0.25]}


@pytest.mark.parametrize("reduction", rerank.REDUCTIONS)
def test_reductions_ragged_and_padded(reduction):
    ragged = rerank.solution_scores([np.array(r) for r in RAGGED], reduction)
    np.testing.assert_allclose(ragged, EXPECTED[reduction])
    # The same solutions padded to 3 steps; the padding (9.0) must never be read.
    padded = np.array([[0.5, 0.25, 0.75], [0.5, 9.0, 9.0], [0.25, 1.0, 9.0]])
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)
    np.testing.assert_allclose(rerank.solution_scores(padded, reduction, mask), EXPECTED[reduction])


def test_padded_without_mask_uses_every_step():
    # [0.5, 0.25]: last 0.25, min 0.25, prod 0.125
    scores = np.array([[0.5, 0.25]])
    assert [rerank.solution_scores(scores, r)[0] for r in ("last", "min", "prod")] == [0.25, 0.25, 0.125]


def test_reduction_errors():
    with pytest.raises(ValueError, match="unknown reduction 'mean'"):
        rerank.solution_scores([np.array([0.5])], "mean")
    with pytest.raises(ValueError, match="solution 1 has no steps"):
        rerank.solution_scores([np.array([0.5]), np.array([])], "min")
    with pytest.raises(ValueError, match="solution 0 has no steps"):
        rerank.solution_scores(np.array([[0.5, 0.5]]), "last", np.zeros((1, 2), bool))
    with pytest.raises(ValueError, match="step_mask shape"):
        rerank.solution_scores(np.array([[0.5, 0.5]]), "last", np.ones((1, 3), bool))


# ----------------------------------------------------------------------------------------------- selection


def test_majority_vote_ties_go_to_first_occurring():
    answers = [
        ["7", "5", "5", "7", None],  # 7 and 5 have 2 votes each; 7 occurs first (sample 0); share 2/4
        [None, "5", "7", "7", "5"],  # tie again; 5 occurs first (sample 1); share 2/4
        ["3", "4", "4", "4", None],  # 4 wins 3 votes to 1, first at sample 1; share 3/4
        [None, None, None, None, None],  # no answer: nothing selected, confidence -inf
    ]
    sel = rerank.majority_vote(answers)
    assert sel.answer == ["7", "5", "4", None]
    assert sel.index.tolist() == [0, 1, 1, -1]
    np.testing.assert_allclose(sel.confidence, [0.5, 0.5, 0.75, -np.inf])


def test_best_of_k_ignores_samples_without_answers():
    # Sample 1 scores highest but has no answer; samples 2 and 3 tie at 0.7 -> the earlier, sample 2 ("b").
    sel = rerank.best_of_k([["a", None, "b", "c"]], [[0.4, 0.99, 0.7, 0.7]])
    assert sel.index.tolist() == [2] and sel.answer == ["b"]
    assert sel.confidence.tolist() == [0.7]
    # A sample without an answer may have no score at all (NaN): it is never read.
    assert rerank.best_of_k([[None, "a"]], [[np.nan, 0.25]]).index.tolist() == [1]


def test_weighted_vote_differs_from_majority():
    answers = [["x", "y", "x", "z", "x", "y"]]
    scores = [[0.1, 0.8, 0.2, 0.3, 0.1, 0.6]]
    # Majority: x has 3 of 6 votes (share 0.5), first at sample 0.
    major = rerank.majority_vote(answers)
    assert major.answer == ["x"] and major.index.tolist() == [0] and major.confidence[0] == 0.5
    # Weighted: x = 0.1 + 0.2 + 0.1 = 0.4, y = 0.8 + 0.6 = 1.4, z = 0.3 -> y; total 2.1, confidence 1.4 / 2.1 = 2/3.
    # Its chosen sample is y's highest-scoring one, sample 1.
    weighted = rerank.weighted_vote(answers, scores)
    assert weighted.answer == ["y"] and weighted.index.tolist() == [1]
    np.testing.assert_allclose(weighted.confidence, [2 / 3])
    # Best-of-K: the top score 0.8 (sample 1).
    best = rerank.best_of_k(answers, scores)
    assert best.index.tolist() == [1] and best.confidence.tolist() == [0.8]


def test_weighted_vote_ties_and_best_trace():
    answers = [["p", "q", "q", "p"], ["y", "x", "y", None]]
    scores = [[0.25, 0.5, 0.0, 0.25], [0.25, 0.375, 0.5, 0.9]]
    # Problem 0: p = 0.5, q = 0.5 (exact tie) -> p, which occurs first; p's best trace: samples 0 and 3 tie at
    #   0.25 -> sample 0; confidence 0.5 / 1.0.
    # Problem 1: y = 0.75, x = 0.375 (sample 3 has no answer, its 0.9 does not count) -> y, best trace sample 2;
    #   confidence 0.75 / 1.125 = 2/3.
    sel = rerank.weighted_vote(answers, scores)
    assert sel.answer == ["p", "y"] and sel.index.tolist() == [0, 2]
    np.testing.assert_allclose(sel.confidence, [0.5, 2 / 3])


def test_greedy_is_sample_zero():
    answers = [["a", "b"], [None, "b"]]  # problem 1's greedy decode has no answer, so nothing is selected
    sel = rerank.greedy(answers, [[0.25, 0.5], [0.75, 0.5]])
    assert sel.index.tolist() == [0, -1] and sel.answer == ["a", None]
    np.testing.assert_allclose(sel.confidence, [0.25, -np.inf])
    np.testing.assert_allclose(rerank.greedy(answers).confidence, [1.0, -np.inf])


def test_outcome_gathers_the_chosen_samples():
    sel = rerank.majority_vote([["1", "2", "2"], [None, None, None]])  # chooses sample 1, then nothing
    correct = [[True, False, True], [True, True, True]]
    steps = [[True, True, False], [True, True, True]]
    out = sel.outcome(correct, steps)
    # Problem 0: sample 1 -> (False, True); problem 1: nothing selected -> (False, False).
    assert out.correct.tolist() == [False, False] and out.steps_correct.tolist() == [True, False]


def test_selection_errors():
    with pytest.raises(ValueError, match=r"same number K >= 1 of samples; got lengths \[1, 2\]"):
        rerank.majority_vote([["a", "b"], ["a"]])
    with pytest.raises(ValueError, match=r"scores shape \(1, 3\) != answers shape \(1, 2\)"):
        rerank.best_of_k([["a", "b"]], [[0.1, 0.2, 0.3]])
    with pytest.raises(ValueError, match="needs scores"):
        rerank.best_of_k([["a", "b"]], None)
    with pytest.raises(ValueError, match="non-negative"):
        rerank.weighted_vote([["a", "b"]], [[0.5, -0.1]])
    with pytest.raises(ValueError, match="finite"):
        rerank.best_of_k([["a", "b"]], [[0.5, np.nan]])
    with pytest.raises(ValueError, match=r"got lengths \[\]"):
        rerank.majority_vote([])
    with pytest.raises(ValueError, match="unknown selection rule"):
        rerank.select("beam", [["a"]])
    with pytest.raises(ValueError, match="reads the 'prm' scores; none were given"):
        rerank.select("prm_rerank", [["a"]], {"orm": [[0.5]]})
    with pytest.raises(ValueError, match="without NaN"):
        rerank.best_scored([["a", "b"]], [[0.5, np.nan]])
    with pytest.raises(ValueError, match="sample_correct has shape"):
        rerank.majority_vote([["a", "b"]]).outcome([[True, False], [True, True]])


def test_selection_is_fast_at_k96():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 9, size=(1000, 96))
    answers = [[None if c == 8 else int(c) for c in row] for row in codes]
    scores = rng.random((1000, 96))
    for rule in rerank.RULES:
        start = time.perf_counter()
        sel = rerank.select(rule.name, answers, {rule.reads: scores})
        assert time.perf_counter() - start < 1.0, rule.name
        assert sel.index.shape == (1000,)


def test_best_scored_keeps_samples_without_an_answer_by_hand():
    answers = [["a", None, "b"], [None, None, "c"], ["d", "e", None]]
    scores = [[0.2, 0.9, 0.5],  # the answerless sample 1 scores highest: chosen (best_of_k would take "b")
              [-np.inf, -np.inf, -np.inf],  # nothing scored: the first sample, confidence -inf
              [0.4, 0.4, 0.1]]  # a tie goes to the earlier sample
    sel = rerank.best_scored(answers, scores)
    assert sel.index.tolist() == [1, 0, 0] and sel.answer == [None, None, "d"]
    np.testing.assert_array_equal(sel.confidence, [0.9, -np.inf, 0.4])
    assert rerank.best_of_k(answers, np.where(np.isinf(scores), 0.0, scores)).index.tolist() == [2, 2, 0]


def test_weighted_vote_gives_unscored_samples_no_weight():
    # "a": 0.3 and an unscored sample (-inf -> 0); "b": 0.2. "a" wins 0.3 of 0.5 = 0.6, with its scored sample.
    sel = rerank.weighted_vote([["a", "a", "b"]], [[-np.inf, 0.3, 0.2]])
    assert sel.index.tolist() == [1] and sel.answer == ["a"]
    np.testing.assert_allclose(sel.confidence, [0.6])


def test_rule_rows_come_from_the_registry_in_its_order(monkeypatch):
    answers = [["a", "b", "a"], ["c", None, "d"]]
    orm, prm = np.array([[0.1, 0.8, 0.3], [0.6, 0.9, 0.2]]), np.array([[0.7, 0.2, 0.1], [0.1, 0.9, 0.5]])
    rows = rerank.rule_rows(answers, {"orm": orm, "prm": prm}, k=3)
    # Majority vote reads the answers alone; the ORM / PRM rules are the rows whose source was given.
    assert list(rows) == ["SFT majority vote (K=3)", "ORM rerank (K=3)", "PRM rerank (K=3)",
                          "ORM-weighted vote (K=3)", "PRM-weighted vote (K=3)"]
    assert rows["ORM rerank (K=3)"].index.tolist() == [1, 0]  # problem 2: sample 1 has no answer
    assert rows["PRM rerank (K=3)"].index.tolist() == [0, 2]
    assert rows["SFT majority vote (K=3)"].answer == ["a", "c"]
    # ORM-weighted: "a" 0.1 + 0.3 = 0.4 vs "b" 0.8 -> "b"; problem 2: "c" 0.6 vs "d" 0.2 -> "c".
    assert rows["ORM-weighted vote (K=3)"].answer == ["b", "c"]
    # A rule added to the registry is a row of every table whose run supplies its source.
    extra = rerank.Rule("orm_first", "ORM first (K={k})", lambda a, s: rerank.greedy(a, s), "orm")
    monkeypatch.setattr(rerank, "RULES", rerank.RULES + (extra,))
    assert list(rerank.rule_rows(answers, {"orm": orm}, k=3)) == ["SFT majority vote (K=3)", "ORM rerank (K=3)",
                                                                  "ORM-weighted vote (K=3)", "ORM first (K=3)"]
    assert len({r.name for r in rerank.RULES}) == len(rerank.RULES)


# ----------------------------------------------------------------------------------------------- metrics


CONF = [0.9, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.5, 0.3, 0.1]
RIGHT = [1, 1, 0, 1, 1, 0, 0, 1, 0, 0]


def test_abstention_curve_hand_worked_with_ties():
    curve = rerank.abstention_curve(CONF, RIGHT, [1.0, 0.7, 0.5, 0.25, 0.2, 0.1])
    # 1.0: keep all 10, 5 wrong -> 0.5.
    # 0.7: keep 7. Above the cut 0.6: 4 problems, 1 wrong (conf 0.8); the three tied at 0.6 (2 wrong) fill the
    #      remaining 3 places -> (1 + 2) / 7.
    # 0.5: keep 5. 4 above 0.6 (1 wrong) + 1 of the three tied at 0.6, expected 2/3 wrong -> (5/3) / 5 = 1/3.
    # 0.25: keep ceil(2.5) = 3: 0.9 (right) + both tied at 0.8 (one wrong) -> 1/3.
    # 0.2: keep 2: 0.9 (right) + 1 of the two tied at 0.8, expected 1/2 wrong -> 0.25.
    # 0.1: keep 1: 0.9, right -> 0.
    np.testing.assert_allclose(curve.error, [0.5, 3 / 7, 1 / 3, 1 / 3, 0.25, 0.0])
    assert rerank.error_at_abstention(CONF, RIGHT, rate=0.3) == pytest.approx(3 / 7)


def test_abstention_ties_do_not_depend_on_order():
    # All confidences tie: whatever is kept, the expected error is the overall 4/10.
    right = [1, 0, 1, 1, 0, 1, 0, 1, 0, 1]
    np.testing.assert_allclose(rerank.abstention_curve([1.0] * 10, right, [0.3, 0.7, 1.0]).error, [0.4] * 3)
    # Nothing selected (-inf) is dropped first: abstaining on 20% removes exactly the two wrong -inf problems.
    conf = [-np.inf, 0.5, 0.5, -np.inf, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert rerank.error_at_abstention(conf, [0, 1, 1, 0, 1, 1, 1, 1, 1, 1], rate=0.2) == 0.0


def test_abstention_errors():
    with pytest.raises(ValueError, match="3 confidences for 2 correctness values"):
        rerank.abstention_curve([0.1, 0.2, 0.3], [True, False])
    with pytest.raises(ValueError, match="coverages"):
        rerank.abstention_curve([0.1], [True], [0.0])
    with pytest.raises(ValueError, match="NaN"):
        rerank.error_at_abstention([np.nan, 0.2], [True, False])


def test_trace_and_final_answer_error():
    correct = [True, True, True, False, True, False]
    steps = [True, False, True, False, False, True]
    # Final answer right for 0, 1, 2, 4; of those, 1 and 4 have a wrong step -> trace error 2/4.
    assert rerank.trace_error(correct, steps) == 0.5
    assert rerank.final_answer_error(correct) == pytest.approx(2 / 6)
    assert np.isnan(rerank.trace_error([False], [True]))
    # The floor over K samples: problem 0 has a clean right sample, problem 1 only a right one through a wrong step,
    # problem 2 no right sample (left out), problem 3 a clean one beside a trace error -> 1 of 3 answerable problems.
    sample_correct = [[True, False], [True, False], [False, False], [True, True]]
    sample_steps = [[True, False], [False, False], [True, True], [False, True]]
    assert rerank.trace_error_floor(sample_correct, sample_steps) == pytest.approx(1 / 3)
    assert np.isnan(rerank.trace_error_floor([[False]], [[True]]))
    with pytest.raises(ValueError, match="final-answer labels"):
        rerank.trace_error([True, False], [True])


# ----------------------------------------------------------------------------------------------- reporting


def _rule_a():
    # 20 problems: 0-14 right, 15-19 wrong -> final-answer error 5/20 = 0.25.
    correct = np.arange(20) < 15
    # Wrong steps in right-answer problems 0, 1, 2 (and in wrong 15, which does not count) -> trace error 3/15.
    steps = ~np.isin(np.arange(20), [0, 1, 2, 15])
    # Distinct confidences, least confident: 16, 17, 18, 19, 13, 14 (30% abstention drops these 6). Kept 14:
    # problems 0-12 (right) and 15 (wrong) -> 1/14.
    conf = np.linspace(1.0, 0.5, 20)
    conf[[16, 17, 18, 19, 13, 14]] = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]
    return rerank.Outcome(correct, conf, steps)


def test_results_table_hand_worked_and_paired():
    a = _rule_a()
    worse = rerank.Outcome(a.correct & (np.arange(20) != 0), a.confidence, a.steps_correct)  # problem 0 now wrong
    perfect = rerank.Outcome(np.ones(20, bool), np.ones(20), np.ones(20, bool))
    table = rerank.results_table({"a": a, "worse": worse, "perfect": perfect}, samples=500, seed=1)
    assert list(table.rows) == ["a", "worse", "perfect"] and table.n_problems == 20 and table.rate == 0.3
    assert all(list(row) == list(rerank.COLUMNS) for row in table.rows.values())
    got = {c: table.rows["a"][c]["mean"] for c in rerank.COLUMNS}
    assert got == pytest.approx({"final_answer_error": 0.25, "trace_error": 0.2, "abstention_error": 1 / 14})
    for row in table.rows.values():
        for cell in row.values():
            assert cell["low"] <= cell["mean"] <= cell["high"]
    assert table.rows["perfect"]["final_answer_error"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    # "worse" is "a" with one more wrong problem. On the same resampled problem sets its error is never lower, so
    # its bounds are not either; separately drawn resamples would not guarantee this.
    for bound in ("low", "high"):
        assert table.rows["worse"]["final_answer_error"][bound] >= table.rows["a"]["final_answer_error"][bound]
    # Paired differences against the first rule: one more wrong problem of 20 is +5 points, never below 0.
    assert table.baseline == "a" and set(table.deltas) == {"worse", "perfect"}
    assert table.deltas["worse"]["mean"] == pytest.approx(0.05) and table.deltas["worse"]["low"] >= 0.0
    assert table.deltas["perfect"]["mean"] == pytest.approx(-0.25) and table.deltas["perfect"]["high"] < 0.0
    assert "Δ final-answer error vs a, paired" in results.markdown_table(table)
    with pytest.raises(ValueError, match="different numbers of problems"):
        rerank.results_table({"a": a, "short": rerank.Outcome(np.ones(3, bool), np.ones(3))})


def test_paired_deltas_against_a_second_baseline_hand_worked():
    # Per problem right (1) / wrong (0): errors a 2/4, b 3/4, c 1/4.
    a, b, c = ([bool(v) for v in row] for row in ([1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]))
    outcomes = {name: rerank.Outcome(np.array(y), np.linspace(1.0, 0.5, 4)) for name, y in zip("abc", (a, b, c))}
    table = rerank.results_table(outcomes, samples=300, seed=3, more_baselines=("b",))
    assert table.baseline == "a" and list(table.more_deltas) == ["b"] and set(table.more_deltas["b"]) == {"a", "c"}
    assert table.more_deltas["b"]["a"]["mean"] == pytest.approx(-0.25)
    assert table.more_deltas["b"]["c"]["mean"] == pytest.approx(-0.5)
    # c is never worse than b on a problem (right on b's right one and on two more), so on every resampled set of
    # problems c's error is at most b's: the paired interval never goes above 0. a is never worse than b either.
    assert table.more_deltas["b"]["c"]["high"] <= 0.0 and table.more_deltas["b"]["a"]["high"] <= 0.0
    # The paired interval is the bootstrap interval of the per-problem differences (c wrong minus b wrong) over the
    # same resampled problem sets.
    _, low, high = bootstrap_ci([0, -1, -1, 0], samples=300, seed=3)
    assert (table.more_deltas["b"]["c"]["low"], table.more_deltas["b"]["c"]["high"]) == pytest.approx((low, high))
    assert table.deltas["b"]["mean"] == pytest.approx(0.25)  # the first block is unchanged: against a
    header = results.markdown_table(table).splitlines()[0]
    assert header.endswith("| Δ final-answer error vs a, paired | Δ final-answer error vs b, paired |")
    with pytest.raises(ValueError, match=r"\['d'\], named as baselines or trace pairs, are not rules"):
        rerank.results_table(outcomes, samples=10, more_baselines=("d",))


def test_paired_trace_error_deltas_hand_worked():
    # Rule a: trace error 3/15 (`_rule_a`). Rule clean: the same answers with every step right -> 0, so a - clean is
    # +0.2 and never below 0 on a resampled set (a's wrong steps only add).
    a = _rule_a()
    clean = rerank.Outcome(a.correct, a.confidence, np.ones(20, bool))
    table = rerank.results_table({"a": a, "clean": clean}, samples=300, seed=2, trace_pairs=[("a", "clean")])
    delta = table.trace_deltas["a - clean"]
    assert delta["mean"] == pytest.approx(0.2) and delta["low"] >= 0.0 and delta["high"] > delta["low"]
    with pytest.raises(ValueError, match=r"\['e'\], named as baselines or trace pairs"):
        rerank.results_table({"a": a, "clean": clean}, samples=10, trace_pairs=[("a", "e")])


def test_markdown_table():
    table = rerank.results_table({"a": _rule_a(), "no_steps": rerank.Outcome(np.ones(20, bool), np.ones(20))},
                                 samples=200)
    lines = results.markdown_table(table).splitlines()
    assert lines[0] == ("| Rule | Final-answer error (%) | Trace error (%) | Error at 30% abstention (%) | "
                        "Δ final-answer error vs a, paired |")
    assert lines[1] == "|---|---|---|---|---|"
    assert lines[2].startswith("| a | 25.0 [") and "| 20.0 [" in lines[2] and "| 7.1 [" in lines[2]
    assert lines[2].endswith("| – |")  # the baseline itself
    assert lines[3].startswith("| no_steps | 0.0 [0.0, 0.0] | – |") and "| -25.0 [" in lines[3]
    assert "20 problems" in lines[-1] and "95% percentile-bootstrap" in lines[-1]


def test_plot_abstention_writes_a_png(tmp_path):
    curves = {"majority_vote": rerank.abstention_curve(CONF, RIGHT),
              "best_of_k": rerank.abstention_curve(CONF[::-1], RIGHT)}
    path = plots.plot_abstention(curves, str(tmp_path / "abstention.png"))
    data = open(path, "rb").read()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
