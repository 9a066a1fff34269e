"""The joint run end to end on tiny runs: a REFINER run's warm-up generator and critic and a reward run's PRM,
every row of the table with its compute, the equal-compute baseline and config errors."""
import json
import os
import sys

import pytest

from refiner_jax.runs import joint_run, refiner_run, reward_run, run_config, seed_pool

sys.path.insert(0, os.path.dirname(__file__))
from test_pipeline import tiny_config as tiny_refiner  # noqa: E402
from test_reward_pipeline import tiny_config as tiny_reward  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs"))
import joint_mwp  # noqa: E402


@pytest.mark.slow
def test_joint_run_on_tiny_runs(tmp_path):
    refiner_dir, reward_dir = str(tmp_path / "refiner"), str(tmp_path / "reward")
    task = {"name": "mwp", "data_dir": "", "extra_problems": 0,
            "options": {"synthetic_sizes": {"train": 256, "val": 32, "test": 24}, "trace_rate": 1.0}}
    r = tiny_refiner()
    r.task.options = task["options"]
    refiner_run.run(r, refiner_dir, stages=("warmup", "critic"))
    w = tiny_reward()
    w.task.options = task["options"]
    reward_run.run(w, reward_dir, stages=("sft", "prm"))
    c = joint_mwp.get_config()
    c.task = task
    j = c.joint
    j.refiner_workdir, j.reward_workdir = refiner_dir, reward_dir
    j.samples, j.turns, j.examples, j.val_problems, j.batch_size, j.bootstrap_samples = 2, 2, 12, 8, 16, 50
    out = joint_run.run(c, str(tmp_path / "joint"), stages=("joint",))
    labels = list(out["table"])
    assert labels[:2] == ["first sample", "PRM rerank (K=2)"] and "REFINER loop (T=2)" in labels
    assert any(label.startswith("locate + explain + revise + rerank") for label in labels)
    equal = next(label for label in labels if label.startswith("PRM rerank, equal compute"))
    loop_equal = next(label for label in labels if label.startswith("REFINER loop, equal compute"))
    gated = next(label for label in labels if "more samples below the gate" in label)
    vote_equal = next(label for label in labels if label.startswith("PRM-weighted vote, equal compute"))
    assert [b["baseline"] for b in out["paired_deltas"]] == [equal, gated, vote_equal, "REFINER loop (T=2)",
                                                               loop_equal]
    assert "PRM-weighted vote (K=2)" in labels and "locate + explain + revise + PRM-weighted vote (K=2, T=2)" in labels
    rows = out["table"]
    # Tokens: K samples cost twice one sample's; the joint rows spend at least the K samples' tokens.
    assert rows["PRM rerank (K=2)"]["tokens_per_problem"] > rows["first sample"]["tokens_per_problem"]
    for label, row in rows.items():
        assert row["passes_per_problem"] > row["tokens_per_problem"] > 0
        assert 0 <= row["fixed"] <= 12 and 0 <= row["broken"] <= 12
        assert 0.0 <= row["final_answer_error"]["mean"] <= 1.0
    assert rows[equal]["tokens_per_problem"] >= rows["PRM rerank (K=2)"]["tokens_per_problem"]
    # The voted loop takes the fewest of the 2K = 4 samples whose trajectories spend the full system's tokens.
    full = next(label for label in labels if label.startswith("locate + explain + revise + rerank ("))
    starts = json.load(open(tmp_path / "joint" / "joint" / "results.json"))["settings"]["refiner_loop_starts"]
    assert f"({starts} sampled starts" in loop_equal and 1 <= starts <= 4
    assert starts == 4 or rows[loop_equal]["tokens_per_problem"] >= rows[full]["tokens_per_problem"]
    saved = json.load(open(tmp_path / "joint" / "joint" / "results.json"))
    assert saved["settings"]["equal_compute_samples"] >= 2
    # More samples only below the gate: the fewest extra that spend the full system's tokens (at most K more).
    extra = saved["settings"]["samples_added_below_gate"]
    assert gated.startswith(f"PRM rerank, {extra} more samples") and 0 <= extra <= 2
    assert extra == 2 or rows[gated]["tokens_per_problem"] >= rows[full]["tokens_per_problem"]
    assert os.path.getsize(tmp_path / "joint" / "joint" / "tokens.png") > 1000
    # The trained stages of both runs it used, each with its validation curve (4 fixed steps, validated every 2).
    assert set(saved["convergence"]) == {"refiner/warmup", "refiner/critic", "reward/sft", "reward/prm"}
    assert all(not c["stopped_early"] and c["last_step"] == 4 for c in saved["convergence"].values())
    assert os.path.getsize(tmp_path / "joint" / "joint" / "convergence.png") > 1000
    markdown = open(tmp_path / "joint" / "joint" / "results.md").read()
    assert "locate + explain + revise + rerank" in markdown and "What the revisions did" in markdown
    # Every revising variant's counts: nested ones bounded by what they count within, and the fixed / broken of its
    # revisions no more than the row's against the first sample can hold.
    assert set(saved["revisions"]) == {label for label in labels if "revise" in label}
    for label, c in saved["revisions"].items():
        assert 0 <= c["revised"] <= 12 and c["kept_right"] <= c["kept"] <= c["revised"]
        assert c["located_first_error"] <= c["prefix_all_right"] <= c["best_has_wrong_step"] <= c["revised"]
        assert c["critic_names_located_step"] <= c["critic_hint"] <= c["revised"]
        assert c["fixed"] <= c["kept_right"] and c["broken"] <= c["kept"] - c["kept_right"]
        assert c["fixed"] <= c["revision_right_best_wrong"] <= min(c["revision_right"], c["revised"] - c["best_right"])
        assert c["best_right"] - c["broken"] + c["fixed"] <= c["revised"]
    assert saved["revisions"]["locate only (\"#k is wrong\") + revise + rerank (K=2, T=2)"]["critic_hint"] == 0
    # The per-problem outcomes for pooling seeds name the rows without what varies between seeds.
    record = seed_pool.read_outcomes(str(tmp_path / "joint"))
    assert record["baseline"] == "PRM rerank, equal compute" and record["labels"]["PRM rerank, equal compute"] == equal
    assert set(record["rules"]) == set(record["labels"]) and len(record["rules"]) == len(rows)
    assert all(len(o.correct) == 12 for o in record["rules"].values())
    oracle = saved["revisions"]["locate + the oracle's explanation (a bound) + revise + rerank (K=2, T=2)"]
    assert oracle["critic_right_about_located"] == oracle["critic_names_located_step"]  # the oracle is the oracle


def test_joint_config_errors_name_the_field(tmp_path):
    c = joint_mwp.get_config()
    c.joint.samples = 0
    with pytest.raises(run_config.ConfigError, match="config.joint.samples"):
        joint_run.run(c, str(tmp_path))
    c = joint_mwp.get_config()
    c.joint.reward_workdir = str(tmp_path / "nothing")
    with pytest.raises(run_config.ConfigError, match="config.joint.reward_workdir: .* not a finished run"):
        joint_run.run(c, str(tmp_path))
    with pytest.raises(run_config.ConfigError, match="unknown stages"):
        joint_run.run(joint_mwp.get_config(), str(tmp_path), stages=("train",))


def test_joint_job_trains_only_what_its_rows_use(tmp_path, monkeypatch):
    """Left to train both runs, the joint job trains the REFINER run's warm-up, critic and loop and the reward run's
    SFT policy and checker-labelled PRM, in its workdir; their own evaluations, the matched generator, the ORM, the
    rollout PRM and expert iteration are not run."""
    calls = []
    monkeypatch.setattr(refiner_run, "run", lambda config, workdir, stages: calls.append(("refiner", workdir, stages)))
    monkeypatch.setattr(reward_run, "run", lambda config, workdir, stages: calls.append(("reward", workdir, stages)))
    c = joint_mwp.get_config()
    assert c.reward_run.reward.labels == "checker"
    joint_run.run(c, str(tmp_path), stages=("refiner", "reward"))
    assert calls == [("refiner", str(tmp_path / "refiner"), ("warmup", "critic", "refiner")),
                     ("reward", str(tmp_path / "reward"), ("sft", "prm"))]


def test_the_jobs_seed_seeds_the_runs_it_trains():
    """`--config.seed=S` reaches the REFINER and reward runs the job trains; a run's own seed, given, wins."""
    c = joint_mwp.get_config()
    c.seed = 2
    assert (c.refiner_run.seed, c.reward_run.seed) == (2, 2)
    c.refiner_run.seed = 5
    c.seed = 3
    assert (c.seed, c.refiner_run.seed, c.reward_run.seed) == (3, 5, 3)
    assert c.to_dict()["reward_run"]["seed"] == 3
