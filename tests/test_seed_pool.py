"""Pooling several seeds' runs: stratified resampling, the pooled reward and REFINER tables against hand-worked
values, the outcomes file round trip and the command's errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from refiner_jax import stats
from refiner_jax.reward import rerank
from refiner_jax.runs import results, seed_pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_stratified_resamples_keep_every_group_within_itself():
    sets = np.concatenate(list(stats.resamples(7, 300, seed=3, strata=[3, 4])))
    assert sets.shape == (300, 7)
    assert ((sets[:, :3] >= 0) & (sets[:, :3] < 3)).all() and ((sets[:, 3:] >= 3) & (sets[:, 3:] < 7)).all()
    assert len(np.unique(sets[:, :3])) == 3 and len(np.unique(sets[:, 3:])) == 4  # every index is drawn
    # Without strata the draws are what they always were (tables of earlier runs stay reproducible).
    plain = np.concatenate(list(stats.resamples(7, 5, seed=3)))
    np.testing.assert_array_equal(plain, np.random.default_rng(3).integers(0, 7, size=(5, 7)))
    with pytest.raises(ValueError, match="summing to 7"):
        next(stats.resamples(7, 5, seed=3, strata=[3, 3]))


def _outcome(correct, steps, confidence=None):
    correct = np.array(correct, bool)
    confidence = np.linspace(0.1, 0.9, len(correct)) if confidence is None else np.array(confidence, float)
    return rerank.Outcome(correct, confidence, np.array(steps, bool))


def _write_run(path, seed, rules, pairs, baselines=None):
    os.makedirs(path, exist_ok=True)
    record = seed_pool.outcomes_record(rules, seed=seed, k=2, rate=0.25, trace_pairs=pairs, baselines=baselines)
    with open(os.path.join(path, seed_pool.OUTCOMES_FILE), "w") as f:
        json.dump(record, f)


def test_pooled_table_against_hand_worked_values(tmp_path):
    pairs = [("PRM rerank (K=2)", "SFT greedy")]
    # Seed 0: greedy right on every problem, two of them through a wrong step; seed 1: greedy wrong on all four.
    # The PRM's choice: seed 0 right on all four, one wrong step; seed 1 right on two, both clean. Majority vote,
    # the further baseline both runs name: seed 0 wrong on problem 2, seed 1 right on problem 1 only.
    majority = "SFT majority vote (K=2)"
    runs = {
        0: {"SFT greedy": _outcome([1, 1, 1, 1], [1, 0, 0, 1]), majority: _outcome([1, 1, 0, 1], [1, 1, 0, 1]),
            "PRM rerank (K=2)": _outcome([1, 1, 1, 1], [1, 0, 1, 1], [0.5, -np.inf, 0.7, 0.2])},
        1: {"SFT greedy": _outcome([0, 0, 0, 0], [0, 0, 0, 0]), majority: _outcome([0, 1, 0, 0], [0, 1, 0, 0]),
            "PRM rerank (K=2)": _outcome([1, 0, 1, 0], [1, 0, 1, 0])},
    }
    dirs = []
    for seed, rules in runs.items():
        dirs.append(str(tmp_path / f"seed{seed}"))
        _write_run(dirs[-1], seed, rules, pairs, baselines={"majority_paired_deltas": majority})
    back = seed_pool.read_outcomes(dirs[0])["rules"]["PRM rerank (K=2)"]
    assert back.confidence[1] == -np.inf and back.correct.dtype == bool
    pooled = seed_pool.pool_seeds(dirs, samples=400)
    greedy, prm = pooled["table"]["SFT greedy"], pooled["table"]["PRM rerank (K=2)"]
    assert greedy["final_answer_error"]["mean"] == pytest.approx(4 / 8)
    # Each seed's four problems are resampled within the seed: greedy's pooled error is 4 of 8 in every set.
    assert greedy["final_answer_error"]["low"] == greedy["final_answer_error"]["high"] == pytest.approx(0.5)
    assert greedy["trace_error"]["mean"] == pytest.approx(2 / 4)  # 2 wrong steps among 4 right answers
    assert prm["final_answer_error"]["mean"] == pytest.approx(2 / 8)
    assert prm["trace_error"]["mean"] == pytest.approx(1 / 6)
    delta = pooled["trace_error_delta"]["PRM rerank (K=2) - SFT greedy"]
    assert delta["mean"] == pytest.approx(1 / 6 - 2 / 4)
    assert pooled["paired_deltas"]["PRM rerank (K=2)"]["mean"] == pytest.approx(2 / 8 - 4 / 8)
    # Against majority vote (4 of 8 wrong): the PRM's -2/8 points; its problems differ from greedy's in each seed.
    against_majority = pooled["majority_paired_deltas"]
    assert against_majority["baseline"] == majority and majority not in against_majority
    assert against_majority["PRM rerank (K=2)"]["mean"] == pytest.approx(2 / 8 - 4 / 8)
    assert against_majority["SFT greedy"]["mean"] == pytest.approx(0.0)
    assert against_majority["SFT greedy"]["low"] < 0 < against_majority["SFT greedy"]["high"]
    assert f"Δ final-answer error vs {majority}, paired" in pooled["markdown"]
    assert pooled["problems_per_seed"] == [4, 4] and pooled["seeds"] == [0, 1]
    assert "PRM rerank (K=2) - SFT greedy" in pooled["markdown"]


def _write_first_errors(path, uids, gold, predictions):
    os.makedirs(os.path.join(path, "eval"), exist_ok=True)
    with open(os.path.join(path, seed_pool.FIRST_ERROR_FILE), "w") as f:
        json.dump({"thresholds": {}, "uids": uids, "gold": gold, "predictions": predictions}, f)


def test_pooled_first_errors_against_hand_worked_values(tmp_path):
    rules = {"SFT greedy": _outcome([1, 0], [1, 0])}
    # Two problems per seed, each with a sample wrong at step 0 and a clean one. Seed 0: the PRM is exact and the
    # ORM passes everything; seed 1: the PRM blames every sample and the ORM is exact.
    gold = [0, -1, 0, -1]
    runs = {0: (["a0/0", "a0/1", "a1/0", "a1/1"], {"prm": [0, -1, 0, -1], "orm": [-1, -1, -1, -1],
                                                  "critic": [0, 0, 0, 0]}),
            1: (["b0/0", "b0/1", "b1/0", "b1/1"], {"prm": [0, 0, 0, 0], "orm": [0, -1, 0, -1]})}
    dirs = []
    for seed, (uids, predictions) in runs.items():
        dirs.append(str(tmp_path / f"seed{seed}"))
        _write_run(dirs[-1], seed, rules, [])
        _write_first_errors(dirs[-1], uids, gold, predictions)
    pooled = seed_pool.pool_seeds(dirs, samples=300)
    assert set(pooled["first_error"]) == {"prm", "orm"}  # the critic is missing from seed 1
    prm, orm = pooled["first_error"]["prm"], pooled["first_error"]["orm"]
    # PRM: 4 of 4 errors located, 2 of 4 clean samples passed; ORM: 2 of 4 located, 4 of 4 passed.
    assert prm["acc_erroneous"]["mean"] == pytest.approx(1.0) and prm["acc_correct"]["mean"] == pytest.approx(0.5)
    assert orm["acc_erroneous"]["mean"] == pytest.approx(0.5) and orm["acc_correct"]["mean"] == pytest.approx(1.0)
    assert prm["f1"]["mean"] == pytest.approx(2 / 3) and orm["f1"]["mean"] == pytest.approx(2 / 3)
    # Each seed's two problems are resampled within the seed, so every set keeps two of each seed's: the PRM passes
    # exactly half of the clean samples in every one of them.
    assert prm["acc_correct"]["low"] == pytest.approx(0.5) and prm["acc_correct"]["high"] == pytest.approx(0.5)
    delta = pooled["first_error_delta"]["prm - orm"]
    assert delta["mean"] == pytest.approx(0.0) and delta["low"] == pytest.approx(0.0)
    assert "prm - orm" in pooled["markdown"]
    with open(os.path.join(dirs[1], seed_pool.FIRST_ERROR_FILE), "w") as f:
        json.dump({"uids": runs[1][0], "predictions": runs[1][1]}, f)
    with pytest.raises(ValueError, match=r"lacks \['gold'\]"):
        seed_pool.pool_seeds(dirs, samples=50)
    os.remove(os.path.join(dirs[1], seed_pool.FIRST_ERROR_FILE))
    assert "first_error" not in seed_pool.pool_seeds(dirs, samples=50)  # a run without predictions: no pooled scores


def test_pooled_joint_rows_against_hand_worked_values(tmp_path):
    """The joint job's runs pool from `joint/outcomes.json`: rows whose label names what varies between seeds (K of
    the equal-compute rerank) pool under the name both runs record, the deltas are against that rerank, and a run of
    another job is refused."""
    equal = "PRM rerank, equal compute"
    full = "locate + explain + revise + rerank (K=2)"
    # Seed 0: the rerank right on 3 of 4, the full system on all 4; seed 1: the rerank on 1 of 4, the full system on 2.
    runs = {0: ({equal: _outcome([1, 1, 0, 1], [1, 1, 0, 1]), full: _outcome([1, 1, 1, 1], [1, 1, 1, 1])}, "K=3"),
            1: ({equal: _outcome([0, 1, 0, 0], [0, 1, 0, 0]), full: _outcome([0, 1, 1, 0], [0, 1, 1, 0])}, "K=4")}
    dirs = []
    for seed, (rules, k) in runs.items():
        dirs.append(str(tmp_path / f"seed{seed}"))
        os.makedirs(os.path.join(dirs[-1], "joint"))
        record = seed_pool.outcomes_record(rules, seed=seed, k=2, rate=0.25, trace_pairs=(), baseline=equal,
                                           labels={equal: f"{equal} ({k})", full: full})
        with open(os.path.join(dirs[-1], "joint", seed_pool.OUTCOMES_FILE), "w") as f:
            json.dump(record, f)
    pooled = seed_pool.pool_seeds(dirs, samples=400)
    assert list(pooled["table"]) == [equal, full] and pooled["paired_deltas"]["baseline"] == equal
    assert pooled["table"][equal]["final_answer_error"]["mean"] == pytest.approx(4 / 8)
    assert pooled["paired_deltas"][full]["mean"] == pytest.approx(2 / 8 - 4 / 8)
    assert pooled["labels_per_seed"] == {equal: [f"{equal} (K=3)", f"{equal} (K=4)"]}
    assert "Δ trace error" not in pooled["markdown"] and f"{equal} (K=3)" in pooled["markdown"]
    _write_run(str(tmp_path / "reward"), 2, {"SFT greedy": _outcome([1, 0], [1, 0])}, [])
    with pytest.raises(ValueError, match="differ in baseline"):
        seed_pool.pool_seeds([dirs[0], str(tmp_path / "reward")])


def test_pool_refuses_what_it_cannot_pool(tmp_path):
    rules = {"SFT greedy": _outcome([1, 0], [1, 0])}
    _write_run(str(tmp_path / "a"), 0, rules, [])
    _write_run(str(tmp_path / "b"), 0, rules, [])
    with pytest.raises(ValueError, match="share seeds"):
        seed_pool.pool_seeds([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(ValueError, match="at least two"):
        seed_pool.pool_seeds([str(tmp_path / "a")])
    os.makedirs(tmp_path / "unevaluated")  # a run directory whose evaluation has not run
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "pool_seeds.py"), str(tmp_path / "a"),
                           str(tmp_path / "unevaluated")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "outcomes.json" in proc.stderr and "--stages=rl,eval" in proc.stderr
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "pool_seeds.py"), str(tmp_path / "a"),
                           str(tmp_path / "missing")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no such run directory" in proc.stderr


def _write_row_scores(path, seed, rows, metric="equation_em_canonical", labels=None):
    os.makedirs(path, exist_ok=True)
    uids = [f"p{i}" for i in range(len(next(iter(rows.values()))))]
    with open(os.path.join(path, results.ROW_SCORES_FILE), "w") as f:
        json.dump({"seed": seed, "uids": uids, "metric": metric, "rows": rows, "labels": labels or {}}, f)


def test_pooled_refiner_rows_against_hand_worked_values(tmp_path):
    # Right (1) or wrong per problem. Seed 0: the generator right on all four, the critic's loop breaks one;
    # seed 1: the generator wrong on all four, the loop fixes two. Only seed 1 has a solving critic's own answer.
    runs = {0: {"generator": [1, 1, 1, 1], "critic": [1, 1, 1, 0], "generator_matched": [1, 1, 0, 1]},
            1: {"generator": [0, 0, 0, 0], "critic": [1, 0, 1, 0], "generator_matched": [1, 1, 1, 0],
                "critic_alone": [1, 1, 1, 1]}}
    dirs = [str(tmp_path / f"seed{seed}") for seed in runs]
    for path, (seed, rows) in zip(dirs, runs.items()):
        _write_row_scores(path, seed, rows, labels={"critic": "+ trained critic (T=3)"})
    pooled = seed_pool.pool_refiner_seeds(dirs, samples=400)
    assert list(pooled["rows"]) == ["generator", "critic", "generator_matched"]  # critic_alone: seed 1 only
    assert pooled["rows"]["generator"]["mean"] == pytest.approx(4 / 8)
    # Each seed's four problems are resampled within the seed: the generator is right on 4 of 8 in every set.
    assert pooled["rows"]["generator"]["low"] == pooled["rows"]["generator"]["high"] == pytest.approx(0.5)
    assert pooled["rows"]["critic"]["mean"] == pytest.approx(5 / 8)
    assert pooled["rows"]["generator_matched"]["mean"] == pytest.approx(6 / 8)
    # Paired: critic - generator 0 0 0 -1 | +1 0 +1 0; critic - matched 0 0 +1 -1 | 0 -1 0 0.
    gains = {k: {b: g["mean"] for b, g in row.items()} for k, row in pooled["gain_vs"].items()}
    assert gains["critic"] == {"generator": pytest.approx(1 / 8), "generator_matched": pytest.approx(-1 / 8)}
    assert gains["generator"] == {"generator_matched": pytest.approx(-2 / 8)}  # a row is not compared with itself
    assert gains["generator_matched"] == {"generator": pytest.approx(2 / 8)}
    low, high = pooled["gain_vs"]["critic"]["generator"]["low"], pooled["gain_vs"]["critic"]["generator"]["high"]
    assert -4 / 8 <= low < 1 / 8 < high <= 4 / 8  # a resample's sum: seed 0's in [-4, 0], seed 1's in [0, 4]
    assert pooled["problems_per_seed"] == [4, 4] and pooled["seeds"] == [0, 1]
    assert "| + trained critic (T=3) (`critic`) | 62.5 [" in pooled["markdown"]
    assert "| generator | 50.0 [50.0, 50.0] |" in pooled["markdown"]
    assert "Δ vs `generator_matched`" in pooled["markdown"]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "pool_seeds.py"), *dirs],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "| generator_matched | 75.0 [" in proc.stdout


def test_refiner_pool_refuses_what_it_cannot_pool(tmp_path):
    _write_row_scores(str(tmp_path / "a"), 0, {"generator": [1, 0]})
    _write_row_scores(str(tmp_path / "b"), 0, {"generator": [1, 0]})
    with pytest.raises(ValueError, match="share seeds"):
        seed_pool.pool_refiner_seeds([str(tmp_path / "a"), str(tmp_path / "b")])
    _write_row_scores(str(tmp_path / "b"), 1, {"generator": [1, 0]}, metric="ir_em")
    with pytest.raises(ValueError, match="different metrics"):
        seed_pool.pool_refiner_seeds([str(tmp_path / "a"), str(tmp_path / "b")])
    _write_row_scores(str(tmp_path / "b"), 1, {"generator": [1, 0], "critic": [1]})
    with pytest.raises(ValueError, match=r"rows \['critic'\] do not score every one of its 2 problems"):
        seed_pool.pool_refiner_seeds([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(FileNotFoundError, match="launch/evaluate.py"):
        seed_pool.pool_refiner_seeds([str(tmp_path / "a"), str(tmp_path / "c")])
