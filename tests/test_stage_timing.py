"""`bench.py stage` (`benchmarks/stage_timing.py` on `runs.refiner_run.stage_plan`): it times the REFINER loop's own
updates, on the run's data and warmed-up generator, prints them as JSON alone, and leaves the run as it was."""
import json
import os
import sys

from refiner_jax.runs import refiner_run
from refiner_jax.training.loop import stage_done

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the benchmark scripts are not installed
sys.path.insert(0, os.path.dirname(__file__))
from benchmarks import bench  # noqa: E402
from test_pipeline import tiny_config  # noqa: E402


def _logged_loss(workdir, stage, step):
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return next(r["loss"] for r in rows if r["stage"] == stage and r["step"] == step and "loss" in r)


def test_stage_timing_runs_the_stages_own_updates_and_changes_nothing(tmp_path, capsys):
    c = tiny_config()  # REFINER: 4 problems x 3 turns per update, a loss logged every 2 updates
    timed, trained = str(tmp_path / "timed"), str(tmp_path / "trained")
    for workdir in (timed, trained):
        refiner_run.run(c, workdir, stages=("warmup",))
    before = sorted(os.listdir(timed))
    capsys.readouterr()

    bench.main(["stage", "--workdir", timed, "--steps", "1", "--warm", "1", "--ahead", "2"])
    out = json.loads(capsys.readouterr().out)  # the run's own messages went to stderr

    assert stage_done(timed, "refiner") is None and not os.path.exists(os.path.join(timed, "refiner"))
    assert sorted(os.listdir(timed)) == before
    assert out["stage"] == "refiner" and out["pairs"] == 4 * 3 and out["steps"] == 1 and out["devices"] >= 1
    assert all(out[f"{part}_s"] > 0 for part in ("make_pairs", "collate", "train_step"))
    assert out["update_s"] >= out["make_pairs_s"] + out["train_step_s"]
    assert [(d["problems"], d["rows"]) for d in out["sampler"]] == [(4, 12), (8, 24)]
    # The two timed updates (one warm, one timed) are the stage's first two: the same loss as the stage logs.
    refiner_run.run(c, trained, stages=("refiner",))
    assert out["last_loss"] == _logged_loss(trained, "refiner", 2)
