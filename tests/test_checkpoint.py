"""Checkpointing: retention (keep-last-N + best-by-metric), params-only export, restore onto another mesh, the
resumable data order, a damaged latest checkpoint that falls back to the one before, and a SIGKILLed training run
that resumes to the same parameters as an uninterrupted one.

Multi-device checks run in subprocesses with virtual CPU devices (XLA_FLAGS must be set before JAX starts).
"""
import glob
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path.insert(0, REPO)

import jax  # noqa: E402
from _devices import run_report  # noqa: E402
from _helpers import TINY_INPUT_LEN, TINY_TARGET_LEN, t5_batch, train_tiny_stage  # noqa: E402
from _tolerance import REORDER, assert_f32_close  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from refiner_jax.checkpoint import (Checkpointer, DamagedCheckpointWarning, NoReadableCheckpointError,  # noqa: E402
                                    export_params, load_params)
from refiner_jax.training import EpochOrder, TrainState  # noqa: E402

WORKER = os.path.join(REPO, "tests", "_resume_worker.py")


def _tree(step: int) -> dict:
    return {"w": jnp.arange(6.0) * step, "b": {"scale": jnp.full((2,), float(step), jnp.bfloat16)}}


def test_keep_last_n_plus_best_by_metric(tmp_path):
    val_loss = {2: 5.0, 4: 1.0, 6: 3.0, 8: 4.0, 10: 6.0, 12: 7.0}
    with Checkpointer(tmp_path, save_interval_steps=2, keep_last=2, best_metric="val_loss", best_mode="min") as ck:
        for step in range(1, 13):
            saved = ck.save(step, _tree(step), extra={"pos": step}, metrics={"val_loss": val_loss.get(step, 0.0)})
            assert saved == (step % 2 == 0)
        assert not ck.should_save(13) and ck.should_save(14)
    # Reopened from disk: the two latest (10, 12) plus the best (4, lowest val_loss) survive.
    with Checkpointer(tmp_path, save_interval_steps=2, keep_last=2, best_metric="val_loss") as ck:
        assert ck.all_steps() == [4, 10, 12]
        assert ck.best_step() == 4 and ck.latest_step() == 12
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _tree(0))
        state, extra = ck.restore(target, step=4)
        np.testing.assert_array_equal(state["w"], np.arange(6.0) * 4)
        assert state["b"]["scale"].dtype == jnp.bfloat16 and extra == {"pos": 4}
        with pytest.raises(FileNotFoundError, match="step 6"):
            ck.restore(target, step=6)


def test_best_mode_max_and_checkpoints_without_metrics(tmp_path):
    accuracy = {3: 0.5, 6: 0.9, 9: 0.7}  # steps 12, 15, 18 are saved without evaluation metrics
    with Checkpointer(tmp_path, save_interval_steps=3, keep_last=1, best_metric="accuracy", best_mode="max") as ck:
        for step in range(3, 19, 3):
            ck.save(step, _tree(step), metrics={"accuracy": accuracy[step]} if step in accuracy else None)
        ck.wait_until_finished()
        assert ck.all_steps() == [6, 18]
        assert ck.best_step() == 6
        with pytest.raises(ValueError, match="lacks the best_metric 'accuracy'"):
            ck.save(21, _tree(21), metrics={"loss": 1.0})


def test_save_is_idempotent_and_forced_saves(tmp_path):
    with Checkpointer(tmp_path, save_interval_steps=10, keep_last=5) as ck:
        assert not ck.save(7, _tree(7))
        assert ck.save(7, _tree(7), force=True)  # e.g. the final step of a run
        assert not ck.save(7, _tree(7), force=True)
        ck.wait_until_finished()
        assert ck.all_steps() == [7]
    with Checkpointer(tmp_path / "empty") as ck, pytest.raises(FileNotFoundError, match="no checkpoint"):
        ck.restore(_tree(0))


def test_params_only_export_and_partial_restore(tmp_path):
    params = {"encoder": {"kernel": jnp.arange(12.0).reshape(3, 4)}, "scale": jnp.ones(4, jnp.bfloat16)}
    export_params(tmp_path / "export", params, metadata={"model": "t5-tiny", "step": 3})
    loaded, meta = load_params(tmp_path / "export")
    assert meta == {"model": "t5-tiny", "step": 3}
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with pytest.raises(FileNotFoundError, match="not a params export"):
        load_params(tmp_path)
    # Params alone out of a full TrainState checkpoint (the optimizer state is not read).
    state = TrainState(step=jnp.int32(3), params=params, opt_state=({"mu": jnp.zeros(5)},), rng=jax.random.key(1))
    with Checkpointer(tmp_path / "run", save_interval_steps=1) as ck:
        ck.save(3, state)
        ck.wait_until_finished()
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        got = ck.restore_params(target)
    np.testing.assert_array_equal(got["encoder"]["kernel"], params["encoder"]["kernel"])


def test_fresh_train_state_from_exported_params(tmp_path):
    import flax.linen as nn

    from refiner_jax import sharding as shd
    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset
    from refiner_jax.training import make_optimizer, train_state_from_params

    model = T5(preset("t5-tiny", num_layers=1))
    init = lambda k: model.init(k, jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]  # noqa
    abstract = nn.meta.unbox(jax.eval_shape(init, jax.random.key(0)))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: rng.normal(size=a.shape).astype(np.float32), abstract)
    export_params(tmp_path, params, {"model": "t5-tiny"})
    loaded, _ = load_params(tmp_path)
    tx, _ = make_optimizer({"name": "adamw"})
    state, _ = train_state_from_params(loaded, init, tx, shd.make_mesh((1, 1, 1)))
    assert int(state.step) == 0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    assert all(float(jnp.abs(m).max()) == 0.0 for m in jax.tree.leaves(state.opt_state[1][0].mu))
    bad = dict(loaded, token_embedder=np.zeros((10, 128), np.float32))
    with pytest.raises(ValueError, match=r"params\['token_embedder'\] has shape \(10, 128\)"):
        train_state_from_params(bad, init, tx, shd.make_mesh((1, 1, 1)))
    with pytest.raises(ValueError, match="params lack"):
        train_state_from_params({k: v for k, v in loaded.items() if k != "decoder"}, init, tx,
                                shd.make_mesh((1, 1, 1)))


def test_epoch_order_is_a_resumable_permutation():
    order = EpochOrder(10, 3, seed=5)
    assert order.batches_per_epoch == 3
    epoch0 = np.concatenate([order.next_indices() for _ in range(3)])
    epoch1 = np.concatenate([order.next_indices() for _ in range(3)])
    for epoch in (epoch0, epoch1):  # 9 distinct examples per epoch; the last partial batch is dropped
        assert len(set(epoch.tolist())) == 9 and set(epoch.tolist()) <= set(range(10))
    assert not np.array_equal(epoch0, epoch1)
    # Same seed, same stream; a restored position continues it exactly.
    fresh = EpochOrder(10, 3, seed=5)
    first = [fresh.next_indices() for _ in range(4)]
    saved = json.loads(json.dumps(fresh.state_dict()))  # it is stored as JSON in checkpoints
    rest = [fresh.next_indices() for _ in range(5)]
    resumed = EpochOrder(10, 3, seed=5)
    resumed.load_state_dict(saved)
    assert all(np.array_equal(a, b) for a, b in zip(rest, [resumed.next_indices() for _ in range(5)]))
    assert np.array_equal(np.concatenate(first[:3]), epoch0)
    with pytest.raises(ValueError, match="batch_size=4"):
        EpochOrder(10, 4, seed=5).load_state_dict(saved)
    assert np.array_equal(EpochOrder(4, 2, shuffle=False).next_indices(), [0, 1])


# ------------------------------------------------------------------------------------------------------------------
# A damaged latest checkpoint
# ------------------------------------------------------------------------------------------------------------------


class _ToyRun:
    """The copy-reverse T5 run of tests/_resume_worker.py in this process, one device: one compiled step shared by
    every run of the module."""

    def __init__(self):
        from _resume_worker import BATCH, NUM_EXAMPLES, VOCAB, toy_dataset

        from refiner_jax import sharding as shd
        from refiner_jax.models.t5 import T5
        from refiner_jax.models.t5_config import preset
        from refiner_jax.training import (abstract_train_state, create_train_state, make_optimizer, make_train_step,
                                          seq2seq_loss)

        self.data, self.batch, self.examples = toy_dataset(), BATCH, NUM_EXAMPLES
        model = T5(preset("t5-tiny", num_layers=1, vocab_size=VOCAB, dropout_rate=0.1))
        self.init = lambda k: model.init(k, jnp.ones((2, 10), jnp.int32), jnp.ones((2, 11), jnp.int32))["params"]
        self.tx, schedule = make_optimizer(dict(name="adamw", learning_rate=3e-3, schedule="warmup_linear",
                                                warmup_steps=2, total_steps=6))
        self.mesh = shd.make_mesh((1, 1, 1))
        self.fresh = lambda: create_train_state(self.init, self.tx, self.mesh, seed=0)[0]  # noqa: E731
        self.target, shardings = abstract_train_state(self.init, self.tx, self.mesh)
        self.step = make_train_step(seq2seq_loss(model.apply), self.tx, self.mesh, shardings)

    def train(self, state, order, until: int, ckpt: Checkpointer):
        while int(state.step) < until:
            rows = order.next_indices()
            state, _ = self.step(state, {k: v[rows] for k, v in self.data.items()})
            ckpt.save(int(state.step), state, extra={"data": order.state_dict()})
        return state


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """The run, its checkpoints of steps 2, 4 and 6 and its final parameters."""
    run = _ToyRun()
    directory = tmp_path_factory.mktemp("toy") / "ckpt"
    with Checkpointer(directory, save_interval_steps=2, keep_last=3) as ck:
        state = run.train(run.fresh(), EpochOrder(run.examples, run.batch, seed=7), 6, ck)
    return run, directory, jax.device_get(state.params)


def _largest_data_file(step_dir) -> str:
    return max(glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")), key=os.path.getsize)


def _truncate(path, keep: float = 0.5) -> None:
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * keep))


_DAMAGE = {
    "truncated array file": lambda step_dir: _truncate(_largest_data_file(step_dir)),
    "truncated tree metadata": lambda step_dir: _truncate(os.path.join(step_dir, "state", "_METADATA")),
    "empty data-position file": lambda step_dir: _truncate(os.path.join(step_dir, "extra", "metadata"), 0.0),
    "state directory gone": lambda step_dir: shutil.rmtree(os.path.join(step_dir, "state")),
}


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(toy_run, tmp_path, damage):
    run, source, final = toy_run
    directory = tmp_path / "ckpt"
    shutil.copytree(source, directory)
    _DAMAGE[damage](directory / "6")
    with Checkpointer(directory, save_interval_steps=2, keep_last=3) as ck:
        assert ck.latest_step() == 6
        with pytest.warns(DamagedCheckpointWarning, match=f"checkpoint step 6 at {directory / '6'} cannot be read"):
            state, extra = ck.restore(run.target)
        assert int(state.step) == 4 and ck.all_steps() == [2, 4]
        assert os.path.isdir(str(directory) + ".damaged/6")  # set aside, not deleted
        order = EpochOrder(run.examples, run.batch, seed=7)
        order.load_state_dict(extra["data"])
        state = run.train(state, order, 6, ck)  # step 6 is saved afresh
        ck.wait_until_finished()
        assert ck.all_steps() == [2, 4, 6]
    # Updates 5 and 6 again, on the restored data position and dropout keys: the uninterrupted run's parameters, bit
    # for bit (the same compiled step on the same inputs).
    for (path, want), got in zip(jax.tree_util.tree_leaves_with_path(final), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=jax.tree_util.keystr(path))


def test_no_readable_checkpoint_is_a_clear_error(toy_run, tmp_path):
    run, source, _ = toy_run
    directory = tmp_path / "ckpt"
    shutil.copytree(source, directory)
    for step in (2, 4, 6):
        _truncate(_largest_data_file(directory / str(step)))
    with Checkpointer(directory, save_interval_steps=2) as ck:
        with pytest.warns(DamagedCheckpointWarning), pytest.raises(
                NoReadableCheckpointError, match=rf"no checkpoint in {directory} can be read: step 6: .*step 4: .*"
                                                 rf"step 2: .*move {directory} away"):
            ck.restore(run.target)
        assert ck.all_steps() == [2, 4, 6]  # nothing moved
    assert not os.path.exists(str(directory) + ".damaged")


# ------------------------------------------------------------------------------------------------------------------
# Restore onto a different mesh (8 virtual devices, in a subprocess)
# ------------------------------------------------------------------------------------------------------------------


def _multi_device_report(workdir: str) -> dict:
    from refiner_jax import sharding as shd
    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset
    from refiner_jax.training import abstract_train_state, make_optimizer

    model = T5(preset("t5-tiny", num_layers=1))
    init = lambda k: model.init(k, jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]  # noqa
    tx, _ = make_optimizer({"name": "adamw"})
    rng = np.random.default_rng(0)

    def concrete(abstract):  # random values (no model compile needed), placed with the abstract's shardings
        def one(x):
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                return jax.device_put(jax.random.key(42), x.sharding)
            return jax.device_put(rng.normal(size=x.shape).astype(x.dtype), x.sharding)
        return jax.tree.map(one, abstract)

    src_target, _ = abstract_train_state(init, tx, shd.make_mesh({"fsdp": 8}))
    state = concrete(src_target)
    with Checkpointer(workdir, save_interval_steps=1) as ck:
        ck.save(1, state, extra={"note": "fsdp8"})
    host = jax.device_get(jax.tree.map(lambda x: jax.random.key_data(x) if x.dtype == state.rng.dtype else x, state))

    report = {}
    for name, mesh in [("dp2_fsdp2_tp2", shd.make_mesh((2, 2, 2))),
                       ("single_device", shd.make_mesh((1, 1, 1), devices=jax.devices()[:1]))]:
        target, shardings = abstract_train_state(init, tx, mesh)
        with Checkpointer(workdir, save_interval_steps=1) as ck:
            restored, extra = ck.restore(target)
        got = jax.device_get(jax.tree.map(lambda x: jax.random.key_data(x) if x.dtype == state.rng.dtype else x,
                                          restored))
        report[name] = dict(
            identical=all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(got))),
            shardings_as_target=all(a.sharding == s for a, s in
                                    zip(jax.tree.leaves(restored), jax.tree.leaves(shardings))),
            embedder_spec=str(restored.params["token_embedder"].sharding.spec), extra=extra)
    return report


def test_restore_onto_a_different_mesh(tmp_path):
    report = run_report(__file__, 8, str(tmp_path / "ckpt"))
    # Saved on fsdp=8; restored bit-identically onto (data=2, fsdp=2, tensor=2) and onto one device.
    assert report["dp2_fsdp2_tp2"]["identical"] and report["dp2_fsdp2_tp2"]["shardings_as_target"]
    assert report["dp2_fsdp2_tp2"]["embedder_spec"] == str(jax.P("tensor", "fsdp"))
    assert report["single_device"]["identical"] and report["single_device"]["shardings_as_target"]
    assert report["single_device"]["extra"] == {"note": "fsdp8"}


# ------------------------------------------------------------------------------------------------------------------
# Kill and resume
# ------------------------------------------------------------------------------------------------------------------


def _worker(workdir, cache_dir, *extra_args):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               JAX_DISABLE_MOST_OPTIMIZATIONS="1", JAX_COMPILATION_CACHE_DIR=str(cache_dir),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
               PYTHONPATH=REPO)
    os.makedirs(workdir, exist_ok=True)
    stderr = open(os.path.join(workdir, "stderr.txt"), "w")
    args = [sys.executable, "-u", WORKER, str(workdir), "--steps", "24", "--ckpt_every", "5", "--mesh", "1,2,1"]
    return subprocess.Popen(args + list(extra_args), env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr,
                            text=True)


def _lines(proc) -> "queue.Queue[str | None]":
    q = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line.strip())
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _final_params(workdir) -> dict:
    with np.load(os.path.join(workdir, "final_params.npz")) as f:
        return {k: f[k] for k in f.files}


def _wait_for(lines, prefix: str, log) -> list[str]:
    seen = []
    while True:
        line = lines.get(timeout=240)
        assert line is not None, f"worker exited before {prefix!r}: {seen} {log.read_text()[-3000:]}"
        seen.append(line)
        if line.startswith(prefix):
            return seen


def test_early_stopping_resumes_where_it_left_off(tmp_path):
    """Validation scores 0.9, 0.8, 0.7, ... after updates 1, 2, 3, ...: with patience 2 the stage stops after update
    3. Killed after update 2 (its later checkpoint gone), the resumed stage must still stop after update 3, not
    count the evaluations without improvement from zero again."""
    import ml_collections

    from refiner_jax.training.loop import StageSpec

    trained = []  # the step index of every batch made

    def make_pairs(params, indices, step):
        trained.append(step)
        return [step]

    stage = ml_collections.ConfigDict(dict(steps=8, batch_size=1, microbatches=1, eval_every=1,
                                           optimizer=dict(name="adamw", learning_rate=1e-3)))
    spec = StageSpec("early", stage, 8, make_pairs, lambda params: {"score": 0.9 - 0.1 * trained[-1]}, "score",
                     TINY_INPUT_LEN, TINY_TARGET_LEN, collate=lambda steps: t5_batch(steps[0], rows=1), patience=2)
    workdir = str(tmp_path)
    first = train_tiny_stage(workdir, spec, checkpoint_every=1, keep=8)
    assert trained == [0, 1, 2] and first["best_step"] == 1
    stage_dir = tmp_path / "early"
    shutil.rmtree(stage_dir / "ckpt" / "3")
    shutil.rmtree(stage_dir / "export")
    os.remove(stage_dir / "DONE")
    trained.clear()
    assert train_tiny_stage(workdir, spec, checkpoint_every=1, keep=8) == first
    assert trained == [2]  # resumed after update 2, stopped after update 3 again


def test_sigkill_mid_run_then_resume_matches_uninterrupted_run(tmp_path):
    cache = tmp_path / "compile_cache"  # the three runs compile identical programs: compile them once
    reference = _worker(tmp_path / "reference", cache)
    ref_lines = _lines(reference)
    _wait_for(ref_lines, "STEP 1 ", tmp_path / "reference/stderr.txt")  # compiled (and cached) by now
    victim = _worker(tmp_path / "victim", cache, "--pause_at", "13")
    _wait_for(_lines(victim), "STEP 13 ", tmp_path / "victim/stderr.txt")
    os.kill(victim.pid, signal.SIGKILL)  # mid-run: updates 11-13 are lost, an async save may be in flight
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL
    _wait_for(ref_lines, "STEP 24 ", tmp_path / "reference/stderr.txt")
    assert reference.wait(timeout=120) == 0, (tmp_path / "reference/stderr.txt").read_text()[-3000:]

    resumed = _worker(tmp_path / "victim", cache)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, (tmp_path / "victim/stderr.txt").read_text()[-3000:]
    first = out.splitlines()[0]
    assert first in ("RESUMED 10", "RESUMED 5"), out  # the last complete checkpoint before the kill
    steps = [int(line.split()[1]) for line in out.splitlines() if line.startswith("STEP")]
    assert steps == list(range(int(first.split()[1]) + 1, 25))

    want, got = _final_params(tmp_path / "reference"), _final_params(tmp_path / "victim")
    assert sorted(want) == sorted(got)
    # The same programs on the same data order and dropout keys: bitwise in practice; at most a reduction's
    # reordering of each parameter's magnitude. A skipped or repeated step moves parameters by a learning rate.
    for k in want:
        assert_f32_close(got[k], want[k], ulps=REORDER, what=f"resumed parameter {k}")


if __name__ == "__main__":
    print(json.dumps(_multi_device_report(sys.argv[1])))
