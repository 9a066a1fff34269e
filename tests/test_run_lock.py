"""The workdir lock: a second run on a workdir is refused while the first lives, a SIGKILLed run's lock is taken
over, the lock goes away when its process exits, and a run's setup refuses a locked workdir before writing to it."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from refiner_jax.runs import run_lock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HOLDER = ("import sys, time; from refiner_jax.runs import run_lock; run_lock.acquire(sys.argv[1]); "
           "print('HELD', flush=True); time.sleep(float(sys.argv[2]))")


def _holder(workdir, seconds: float) -> subprocess.Popen:
    """Another process that takes the lock, says HELD, then sleeps `seconds` and exits normally."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(workdir), str(seconds)], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "HELD"
    return proc


def test_a_live_run_refuses_a_second_and_a_killed_one_is_taken_over(tmp_path):
    proc = _holder(tmp_path, 120)
    try:
        with pytest.raises(run_lock.WorkdirLockedError) as err:
            run_lock.acquire(str(tmp_path))
        message = str(err.value)
        assert f"process {proc.pid} on host {socket.gethostname()}" in message
        assert f"delete {tmp_path / 'LOCK'}" in message and "Wait for that run to finish" in message
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # leaves its lock file behind
        proc.wait()
    assert (tmp_path / "LOCK").exists()
    lock = run_lock.acquire(str(tmp_path))  # the owner's pid is gone on this host: stale, taken over
    assert json.loads((tmp_path / "LOCK").read_text())["pid"] == os.getpid()
    assert run_lock.acquire(str(tmp_path)) is lock  # the same process may take it again
    lock.release()
    assert not (tmp_path / "LOCK").exists()


def test_the_lock_is_released_when_its_process_exits(tmp_path):
    proc = _holder(tmp_path, 0)
    assert proc.wait(timeout=60) == 0
    assert not (tmp_path / "LOCK").exists()
    run_lock.acquire(str(tmp_path)).release()


def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
    proc = _holder(tmp_path, 0.5)
    content = json.loads((tmp_path / "LOCK").read_text())
    proc.wait(timeout=60)
    (tmp_path / "LOCK").write_text(json.dumps(dict(content, host="elsewhere")))  # its pid is gone here, too
    with pytest.raises(run_lock.WorkdirLockedError, match="on host elsewhere .another machine"):
        run_lock.acquire(str(tmp_path))


def test_a_run_on_a_locked_workdir_is_refused_before_it_writes(tmp_path):
    from refiner_jax.runs import run_setup
    from test_pipeline import tiny_config

    proc = _holder(tmp_path, 120)
    try:
        with pytest.raises(run_lock.WorkdirLockedError, match=f"{tmp_path} is in use by another run"):
            run_setup.setup(tiny_config(), str(tmp_path), ("warmup",), ("warmup",), ("warmup",))
    finally:
        proc.kill()
        proc.wait()
    assert sorted(os.listdir(tmp_path)) == ["LOCK"]  # no config, tokenizer or log was written
