"""Pooling several seeds' reward runs: stratified resampling, the pooled table against hand-worked values, the
outcomes file round trip and the command's errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from refiner_jax import stats
from refiner_jax.reward import rerank
from refiner_jax.runs import seed_pool

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


def _write_run(path, seed, rules, pairs):
    os.makedirs(path, exist_ok=True)
    record = seed_pool.outcomes_record(rules, seed=seed, k=2, rate=0.25, trace_pairs=pairs)
    with open(os.path.join(path, seed_pool.OUTCOMES_FILE), "w") as f:
        json.dump(record, f)


def test_pooled_table_against_hand_worked_values(tmp_path):
    pairs = [("PRM rerank (K=2)", "SFT greedy")]
    # Seed 0: greedy right on every problem, two of them through a wrong step; seed 1: greedy wrong on all four.
    # The PRM's choice: seed 0 right on all four, one wrong step; seed 1 right on two, both clean.
    runs = {
        0: {"SFT greedy": _outcome([1, 1, 1, 1], [1, 0, 0, 1]),
            "PRM rerank (K=2)": _outcome([1, 1, 1, 1], [1, 0, 1, 1], [0.5, -np.inf, 0.7, 0.2])},
        1: {"SFT greedy": _outcome([0, 0, 0, 0], [0, 0, 0, 0]),
            "PRM rerank (K=2)": _outcome([1, 0, 1, 0], [1, 0, 1, 0])},
    }
    dirs = []
    for seed, rules in runs.items():
        dirs.append(str(tmp_path / f"seed{seed}"))
        _write_run(dirs[-1], seed, rules, pairs)
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


def test_pool_refuses_what_it_cannot_pool(tmp_path):
    rules = {"SFT greedy": _outcome([1, 0], [1, 0])}
    _write_run(str(tmp_path / "a"), 0, rules, [])
    _write_run(str(tmp_path / "b"), 0, rules, [])
    with pytest.raises(ValueError, match="share seeds"):
        seed_pool.pool_seeds([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(ValueError, match="at least two"):
        seed_pool.pool_seeds([str(tmp_path / "a")])
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "pool_seeds.py"), str(tmp_path / "a"),
                           str(tmp_path / "missing")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "outcomes.json" in proc.stderr and "--stages=rl,eval" in proc.stderr
