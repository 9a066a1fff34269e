"""First-error evaluation (ProcessBench's protocol) against hand-worked cases and a case-by-case reference."""
import numpy as np
import pytest

from refiner_jax.reward import first_error
from refiner_jax.tasks import step_label_files


@pytest.mark.parametrize("labels, outcome, gold", [
    ([True, True, True], True, -1),
    ([True, False, False], False, 1),
    ([False, False], True, 0),  # a right answer through a wrong first step
    ([True, True], False, 1),  # every step right but the answer wrong: unfinished, wrong at its last step
    ([], True, -1),
])
def test_gold_first_error(labels, outcome, gold):
    assert first_error.gold_first_error(labels, outcome) == gold


def test_first_below_and_padding():
    scores = [[0.9, 0.2, 0.1], [0.8, 0.7], [0.3], []]
    assert first_error.first_below(scores, 0.5).tolist() == [1, -1, 0, -1]
    assert first_error.first_below(scores, 0.0).tolist() == [-1, -1, -1, -1]


@pytest.mark.parametrize("feedback, n_steps, step", [
    ("No hint", 3, -1),
    ("The operator in #1 is incorrect. The second number in #0 is incorrect.", 3, 0),
    ("An operator is missing.", 3, 2),
    ("The first number in #7 is incorrect.", 2, 1),
])
def test_critic_first_error(feedback, n_steps, step):
    assert first_error.critic_first_error(feedback, n_steps) == step


def test_threshold_is_chosen_for_f1_on_validation():
    # Right steps score above 0.6, wrong ones below 0.4: any threshold between separates them perfectly.
    scores = [[0.9, 0.8], [0.7, 0.3], [0.2, 0.1], [0.95]]
    gold = [-1, 1, 0, -1]
    t = first_error.choose_threshold(scores, gold)
    assert 0.3 < t <= 0.7
    assert first_error.first_below(scores, t).tolist() == gold


def _reference(gold, pred):
    """Case by case, as ProcessBench's scorer: accuracy on erroneous and on correct cases, their harmonic mean."""
    hits_err = [p == g for g, p in zip(gold, pred) if g != -1]
    hits_cor = [p == -1 for g, p in zip(gold, pred) if g == -1]
    a, b = sum(hits_err) / len(hits_err), sum(hits_cor) / len(hits_cor)
    return (2 * a * b / (a + b) if a + b else 0.0), a, b


def test_scores_hand_worked_and_against_the_reference():
    gold = [-1, -1, 0, 2]
    table, deltas = first_error.scores(gold, {"a": [-1, 0, 0, 1], "b": gold}, samples=200, seed=1,
                                       pairs=[("b", "a")])
    assert table["a"]["acc_erroneous"]["mean"] == 0.5 and table["a"]["acc_correct"]["mean"] == 0.5
    assert table["a"]["f1"]["mean"] == pytest.approx(0.5)
    assert table["b"]["f1"]["mean"] == 1.0 and table["b"]["f1"]["low"] == 1.0
    assert deltas["b - a"]["mean"] == pytest.approx(0.5)
    rng = np.random.default_rng(0)
    gold = rng.integers(-1, 4, size=500)
    pred = np.where(rng.random(500) < 0.7, gold, rng.integers(-1, 4, size=500))
    table, _ = first_error.scores(gold, {"v": pred}, samples=100)
    for metric, value in zip(first_error.METRICS, _reference(gold.tolist(), pred.tolist())):
        cell = table["v"][metric]
        assert cell["mean"] == pytest.approx(value, rel=1e-12)
        assert cell["low"] <= cell["mean"] <= cell["high"]


def test_bootstrap_resamples_whole_problems():
    # One problem holds every case: each resample is that problem, so the interval collapses to the point.
    gold, pred = [-1, 0, 1, -1], [-1, 0, 0, 0]
    table, _ = first_error.scores(gold, {"v": pred}, groups=[7, 7, 7, 7], samples=50)
    cell = table["v"]["f1"]
    assert cell["low"] == cell["high"] == pytest.approx(cell["mean"])
    table, _ = first_error.scores(gold, {"v": pred}, samples=200)  # cases resampled singly: a real spread
    assert table["v"]["f1"]["low"] < table["v"]["f1"]["high"]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="verifier 'v'"):
        first_error.scores([0, -1], {"v": [0]})
    with pytest.raises(ValueError, match="'w'"):
        first_error.scores([0, -1], {"v": [0, -1]}, pairs=[("v", "w")])


def test_any_step_label_file_is_scored(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text(
        '{"id": "a", "problem": "p1", "steps": ["s1", "s2"], "label": 1, "final_answer_correct": false}\n'
        '{"id": "b", "problem": "p1", "steps": ["s1", "s3"], "label": -1, "final_answer_correct": true}\n'
        '{"id": "c", "problem": "p2", "steps": ["t1"], "label": 0, "final_answer_correct": false}\n')
    records = step_label_files.read_step_records(str(path))
    table, deltas = first_error.score_records(
        records, {"never": lambda problem, steps: -1, "second": lambda problem, steps: min(1, len(steps) - 1),
                  "given": [1, -1, 0]}, samples=50, pairs=[("given", "never")])
    assert table["never"]["acc_correct"]["mean"] == 1.0 and table["never"]["f1"]["mean"] == 0.0
    # "second" blames step 1 of a (right), step 1 of b (wrong: b is correct) and step 0 of c (right).
    assert table["second"]["acc_erroneous"]["mean"] == 1.0 and table["second"]["acc_correct"]["mean"] == 0.0
    assert table["given"]["f1"]["mean"] == 1.0 and deltas["given - never"]["mean"] == 1.0
