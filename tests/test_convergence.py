"""Training to the validation plateau: the warm-up-then-constant schedule on hand-worked steps, a stage that stops
after `patience` evaluations without a better score and exports its best step's parameters (compared with the
parameters that step was validated on), a stopped stage that resumes without training further, and the
"convergence" block of a REFINER run's results.json with the loop's control stages and their rows."""
import json
import os
import shutil
import sys

import jax
import ml_collections
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _helpers import TINY_INPUT_LEN, TINY_TARGET_LEN, t5_batch, train_tiny_stage  # noqa: E402

from refiner_jax import checkpoint as ckpt_lib  # noqa: E402
from refiner_jax.runs import plots, results as results_lib, run_config as config_lib  # noqa: E402
from refiner_jax.training.loop import StageSpec, stage_done  # noqa: E402
from refiner_jax.training.optim import make_schedule  # noqa: E402


def test_warmup_constant_schedule_on_hand_worked_steps():
    """lr 1e-3, 4 warm-up steps: step s < 4 gets 1e-3 * s / 4, every later step 1e-3 (no end forced at a cap).
    float32 holds the rates to a few ulps of 1e-3: 1e-9 absolute is a margin of about 10x."""
    schedule = make_schedule({"learning_rate": 1e-3, "schedule": "warmup_constant", "warmup_steps": 4})
    want = {0: 0.0, 1: 2.5e-4, 2: 5e-4, 3: 7.5e-4, 4: 1e-3, 5: 1e-3, 100_000: 1e-3}
    for step, lr in want.items():
        assert float(schedule(step)) == pytest.approx(lr, abs=1e-9), step
    no_warmup = make_schedule({"learning_rate": 1e-3, "schedule": "warmup_constant", "warmup_steps": 0})
    assert [float(no_warmup(s)) for s in (0, 7)] == pytest.approx([1e-3, 1e-3], abs=1e-9)
    # Any step count suits it, fewer than the warm-up included (a decaying schedule needs steps > warm-up).
    c = config_lib.base_config()
    c.warmup.optimizer.schedule, c.warmup.steps, c.warmup.optimizer.warmup_steps = "warmup_constant", 10, 50
    config_lib.validate(c)
    c.warmup.patience = -1
    with pytest.raises(config_lib.ConfigError, match="config.warmup.patience: must be >= 0"):
        config_lib.validate(c)


def _config(name: str, variant: str):
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"config_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant)


def test_converge_variants_train_every_stage_to_its_plateau():
    from refiner_jax.runs import joint_run

    c = _config("refiner_mwp", "converge")
    config_lib.validate(c)
    for name in ("warmup", "critic", "refiner"):
        assert c[name].patience == 3 and c[name].optimizer.schedule == "warmup_constant", name
        assert c[name].eval_examples == 500  # the whole validation split of the synthetic task
    assert c.refiner.controls and c.eval.factorial and c.warmup.steps == 6 * _config("refiner_mwp", None).warmup.steps
    joint = _config("joint_mwp", "converge")
    joint_run.validate(joint)
    assert joint.refiner_run.warmup.patience == 3 and not joint.refiner_run.refiner.controls
    assert joint.reward_run.warmup.patience == joint.reward_run.reward.patience == 3


# Validation scores after updates 1, 2, ...: best at update 2, then three evaluations without a better one.
SCRIPTED = [0.5, 0.7, 0.6, 0.65, 0.69, 0.9, 0.9, 0.9]


def _scripted_stage(patience: int, steps: int = 8):
    """A one-row-per-update stage of the tiny T5 whose validation score after update k is SCRIPTED[k - 1]; returns
    (spec, the steps it made batches for, {update: the parameters it was validated with})."""
    trained, validated = [], {}

    def make_pairs(params, indices, step):
        trained.append(step)
        return [step]

    def evaluate(params):
        step = trained[-1] + 1  # validated after update `step`
        validated[step] = jax.device_get(params)
        return {"score": SCRIPTED[step - 1]}

    stage = ml_collections.ConfigDict(dict(steps=steps, batch_size=1, microbatches=1, eval_every=1, optimizer=dict(
        name="adamw", learning_rate=1e-2, schedule="warmup_constant", warmup_steps=1)))
    spec = StageSpec("plateau", stage, 8, make_pairs, evaluate, "score", TINY_INPUT_LEN, TINY_TARGET_LEN,
                     collate=lambda steps_: t5_batch(steps_[0], rows=1), patience=patience)
    return spec, trained, validated


def test_stage_stops_on_its_plateau_exports_its_best_step_and_resumes_without_training(tmp_path):
    spec, trained, validated = _scripted_stage(patience=3)
    workdir = str(tmp_path)
    final = train_tiny_stage(workdir, spec, checkpoint_every=100, keep=2)
    assert trained == [0, 1, 2, 3, 4]  # stopped after update 5: updates 3, 4, 5 did not beat update 2's 0.7
    want = {"best_step": 2, "last_step": 5, "stopped_early": True, "metric": "score",
            "curve": [[1, 0.5], [2, 0.7], [3, 0.6], [4, 0.65], [5, 0.69]]}
    assert final["convergence"] == want and final["best_step"] == 2 and final["score"] == 0.7
    assert stage_done(workdir, "plateau") == final
    # The export is the parameters update 2 was validated with, not the last ones (saved and restored bit for bit).
    exported, meta = ckpt_lib.load_params(os.path.join(workdir, "plateau", "export"))
    assert meta["step"] == 2
    jax.tree.map(np.testing.assert_array_equal, exported, validated[2])
    moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), exported, validated[5])
    assert any(jax.tree.leaves(moved))
    # Killed after its stop was checkpointed but before the export: resumed, it trains no further.
    shutil.rmtree(os.path.join(workdir, "plateau", "export"))
    os.remove(os.path.join(workdir, "plateau", "DONE"))
    trained.clear()
    assert train_tiny_stage(workdir, spec, checkpoint_every=100, keep=2) == final
    assert trained == []
    jax.tree.map(np.testing.assert_array_equal, ckpt_lib.load_params(os.path.join(workdir, "plateau", "export"))[0],
                 validated[2])


def test_patience_zero_trains_every_step(tmp_path):
    """Fixed steps (the compute-matched rows): the same scores, all 8 updates, the best still exported."""
    spec, trained, _ = _scripted_stage(patience=0)
    final = train_tiny_stage(str(tmp_path), spec, checkpoint_every=100, keep=2)
    assert trained == list(range(8))
    assert {k: final["convergence"][k] for k in ("best_step", "last_step", "stopped_early")} == {
        "best_step": 8, "last_step": 8, "stopped_early": False}  # 0.9 at updates 6-8: a tie exports the later step
    assert [s for s, _ in final["convergence"]["curve"]] == list(range(1, 9))


def test_convergence_block_reads_each_runs_done_files_and_plots(tmp_path):
    record = {"best_step": 4, "last_step": 10, "stopped_early": True, "metric": "em",
              "curve": [[2, 0.1], [4, 0.3], [6, 0.2], [8, 0.25], [10, 0.3]]}
    for run, stage, done in (("a", "warmup", {"best_step": 4, "em": 0.3, "convergence": record}),
                             ("a", "critic", {"best_step": 3, "em": 0.2}),  # finished before curves were recorded
                             ("b", "sft", {"best_step": 4, "em": 0.3, "convergence": record})):
        os.makedirs(tmp_path / run / stage)
        (tmp_path / run / stage / "DONE").write_text(json.dumps(done))
    block = results_lib.convergence({"": str(tmp_path / "a"), "b": str(tmp_path / "b")})
    assert block == {"warmup": record, "b/sft": record}
    assert results_lib.training_summary(str(tmp_path / "a")) == {"warmup": {"best_step": 4, "em": 0.3},
                                                                 "critic": {"best_step": 3, "em": 0.2}}
    assert "| warmup | 4 | 10 | yes | em | 0.3 |" in results_lib.convergence_markdown(block)
    path = plots.plot_convergence(block, str(tmp_path / "convergence.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_refiner_run_records_convergence_and_the_loops_controls(tmp_path):
    """The smallest REFINER run (tests/test_pipeline.py's) with every stage on patience 1 and the loop's controls:
    every trained stage's record is consistent with its curve, and the control rows and their paired differences
    reach results.json."""
    from test_pipeline import tiny_config

    from refiner_jax.runs import refiner_run

    c = tiny_config()
    config_lib.use_convergence(c, {"warmup": 8, "critic": 8, "refiner": 6}, patience=1)
    c.refiner.controls = True
    c.eval.examples, c.eval.turns, c.eval.noise_levels, c.eval.bootstrap_samples = 8, 1, (0.0,), 50
    workdir = str(tmp_path / "run")
    refiner_run.run(c, workdir)
    results = json.load(open(os.path.join(workdir, "results.json")))
    block = results["convergence"]
    caps = {"warmup": 8, "critic": 8, "refiner": 6, "refiner_random": 6, "sft_continued": 6, "matched": 22}
    assert set(block) == set(caps)
    for stage, record in block.items():
        steps = [s for s, _ in record["curve"]]
        stage_config = c[{"refiner_random": "refiner", "sft_continued": "refiner", "matched": "warmup"}.get(stage,
                                                                                                            stage)]
        assert steps == [s for s in range(1, record["last_step"] + 1)
                         if s % stage_config.eval_every == 0 or s == caps[stage]], stage
        assert record["stopped_early"] == (record["last_step"] < caps[stage])
        values = [v for _, v in record["curve"]]
        assert record["best_step"] == max(s for s, v in record["curve"] if v == max(values)), stage  # ties: later
        if record["stopped_early"]:  # the last evaluation did not beat the best before it (patience 1)
            assert values[-1] <= max(values[:-1])
    assert os.path.isfile(os.path.join(workdir, "convergence.png"))
    rows = {r["key"]: r for r in results["rows"]}
    for key in ("sft_continued", "refiner_random", "generator_matched"):
        assert {key, f"{key}_critic", f"{key}_oracle"} <= set(rows)
    for key in ("sft_continued", "sft_continued_critic", "refiner_random_oracle"):
        assert key in rows["critic"]["gain_vs"] and key in rows["oracle"]["gain_vs"]
    assert "## Convergence" in open(os.path.join(workdir, "results.md")).read()
