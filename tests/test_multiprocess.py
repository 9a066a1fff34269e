"""A whole REFINER run split over two processes (2 virtual CPU devices each, gloo collectives) against the same
run in one process on the same 4-device mesh: same parameters after every stage and same metrics (to float32
rounding of their size) and results, and the run's files written once. Two meshes: data 2 x fsdp 2, where the
partitioner places every collective, and data 4, whose train steps add the shards' gradients by hand
(`training.steps`)."""
import json
import os
import socket
import subprocess
import sys

import jax
import pytest

from _tolerance import EPS32, NETWORK, assert_f32_close
from refiner_jax import checkpoint as ckpt_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "_pipeline_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start(workdir, mesh, *args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, WORKER, str(workdir), "--devices", "2" if args else "4",
                             "--mesh", mesh, *args], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(proc, what):
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"{what} failed:\n{out[-4000:]}"
    return out


def _metrics(workdir):
    keep = lambda r: {k: v for k, v in r.items() if not k.endswith("_per_s")}  # noqa: E731 (timings differ)
    return [keep(json.loads(line)) for line in open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8")]


# Both meshes run under -m slow: three whole runs (one process, then two) take about five minutes of the two cores,
# a third of the default suite. The default suite keeps the two-process start-up and lock agreement (below), and
# the sharded train steps against one device (tests/test_train_steps.py, data 4's hand-summed gradients included).
@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["2,2,1", "4,1,1"])
def test_two_processes_train_like_one(tmp_path, mesh):
    one, two = tmp_path / "one", tmp_path / "two"
    _finish(_start(one, mesh), "the one-process run")
    address = f"localhost:{_free_port()}"
    procs = [_start(two, mesh, "--coordinator", address, "--num_processes", "2", "--process_id", str(i))
             for i in (0, 1)]
    outs = [_finish(p, f"process {i}") for i, p in enumerate(procs)]
    assert "[timings]" in outs[0] and "[timings]" not in outs[1] and "[data]" not in outs[1]  # process 0 reports

    for stage in ("warmup", "critic", "refiner"):
        a, _ = ckpt_lib.load_params(one / stage / "export")
        b, _ = ckpt_lib.load_params(two / stage / "export")
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            assert_f32_close(y, x, ulps=NETWORK, what=f"{stage} parameters over two processes ({mesh})")
        assert json.loads((one / stage / "DONE").read_text()) == json.loads((two / stage / "DONE").read_text())
    # Throughput aside, the logs agree line for line: every step's loss and every evaluation, logged once. Floats
    # agree to NETWORK ulps of their own size: the cross-process collectives may add a sharded product's partial
    # sums in another order, and training carries those roundings from step to step.
    got, want = _metrics(two), _metrics(one)
    assert [{k: v for k, v in r.items() if isinstance(v, str)} for r in got] == \
        [{k: v for k, v in r.items() if isinstance(v, str)} for r in want]
    assert [{k: v for k, v in r.items() if not isinstance(v, str)} for r in got] == \
        [pytest.approx({k: v for k, v in r.items() if not isinstance(v, str)}, rel=NETWORK * EPS32, abs=0)
         for r in want]
    assert len((two / "timings.json").read_text().splitlines()) == 1
    rows = lambda d: json.loads((d / "results.json").read_text())["rows"]  # noqa: E731
    assert rows(two) == rows(one)


RESUME_WORKER = os.path.join(REPO, "tests", "_resume_worker.py")


def _two_processes(script, workdir, *args):
    address = f"localhost:{_free_port()}"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return [subprocess.Popen([sys.executable, script, str(workdir), "--devices", "2", *args, "--coordinator", address,
                              "--num_processes", "2", "--process_id", str(i)], env=env, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]


def test_a_refused_workdir_lock_stops_every_process(tmp_path):
    """A live run holds the workdir's lock: process 0 is refused, and process 1 stops with it at setup instead of
    waiting at the next collective."""
    from refiner_jax.runs import run_lock

    workdir = tmp_path / "run"
    workdir.mkdir()
    held = run_lock.acquire(str(workdir))  # this test process is the live run
    try:
        procs = _two_processes(WORKER, workdir, "--mesh", "2,2,1")
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        held.release()
    assert [p.returncode != 0 for p in procs] == [True, True], outs
    assert f"process {os.getpid()} on host" in outs[0] and "WorkdirLockedError" in outs[0], outs[0][-2000:]
    assert "process 0 could not lock this workdir" in outs[1], outs[1][-2000:]
    assert not (workdir / "warmup").exists()


@pytest.mark.slow
def test_a_checkpoint_one_process_cannot_read_is_skipped_by_every_process(tmp_path):
    """Process 1 cannot read the latest checkpoint (step 10; process 0 can): both processes warn, restore step 5,
    set step 10 aside and train on to the parameters of the uninterrupted two-process run, bit for bit."""
    import numpy as np

    steps = ("--ckpt_every", "5", "--mesh", "1,4,1")
    for p in _two_processes(RESUME_WORKER, tmp_path / "run", "--steps", "10", *steps):
        _finish(p, "the first 10 steps")
    outs = [_finish(p, f"process {i}, resumed") for i, p in enumerate(
        _two_processes(RESUME_WORKER, tmp_path / "run", "--steps", "14", *steps, "--unreadable", "1:10"))]
    assert "injected: process 1 cannot read step 10" in outs[1]
    assert "another process of this run cannot read it" in outs[0]
    assert all("DamagedCheckpointWarning" in out and "RESUMED 5" in out for out in outs)
    assert (tmp_path / "run" / "ckpt.damaged" / "10").is_dir()
    for p in _two_processes(RESUME_WORKER, tmp_path / "whole", "--steps", "14", *steps):
        _finish(p, "the uninterrupted run")
    resumed, whole = (np.load(tmp_path / d / "final_params.npz") for d in ("run", "whole"))
    assert sorted(resumed.files) == sorted(whole.files)
    for name in whole.files:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)
