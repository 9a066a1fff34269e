"""A reward-pipeline run SIGKILLed in the middle of its outcome reward model's training and again in the middle of
an expert-iteration round, resumed each time, ends with the results of a run that never stopped: the same
results.json and, bit for bit, the same exported parameters of every stage.

Three processes (tests/_reward_resume_worker.py) share one compilation cache; about four minutes on two cores.
"""
import json
import os
import queue
import signal
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "_reward_resume_worker.py")
STAGES = ("sft", "orm", "prm", "rl_orm_1")


def _start(workdir, cache, *args) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1",
               JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", PYTHONPATH=REPO)
    os.makedirs(workdir, exist_ok=True)
    stderr = open(os.path.join(workdir, "stderr.txt"), "a")
    return subprocess.Popen([sys.executable, "-u", WORKER, str(workdir), *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=stderr, text=True)


def _lines(proc) -> "queue.Queue[str | None]":
    q = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line.rstrip("\n"))
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _until(lines, wanted: str, workdir) -> list[str]:
    seen = []
    while True:
        line = lines.get(timeout=600)
        assert line is not None, f"worker exited before {wanted!r}: {seen[-20:]} " + \
            open(os.path.join(workdir, "stderr.txt")).read()[-3000:]
        seen.append(line)
        if line == wanted:
            return seen


def _killed_at(workdir, cache, pause: str) -> list[str]:
    """Runs the worker until it pauses after update `pause` (STAGE:STEP), then SIGKILLs it; its output."""
    proc = _start(workdir, cache, "--pause", pause)
    seen = _until(_lines(proc), "PAUSED", workdir)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return seen


def _exports(workdir) -> dict:
    from refiner_jax import checkpoint as ckpt_lib

    return {stage: ckpt_lib.load_params(os.path.join(workdir, stage, "export"))[0] for stage in STAGES}


@pytest.mark.slow
def test_sigkill_mid_reward_model_and_mid_expert_iteration_then_resume(tmp_path):
    cache = tmp_path / "compile_cache"
    reference = _start(tmp_path / "reference", cache)
    out, _ = reference.communicate(timeout=900)
    assert reference.returncode == 0, open(tmp_path / "reference" / "stderr.txt").read()[-3000:]

    victim = tmp_path / "victim"
    first = _killed_at(victim, cache, "orm:3")
    assert "LOGGED sft 4" in first and "LOGGED orm 3" in first and "LOGGED orm 4" not in first
    second = _killed_at(victim, cache, "rl_orm_1:3")
    assert "[orm] resumed from step 2" in second  # the kill came after update 3; the last checkpoint was 2
    assert not any(line.startswith("LOGGED sft") for line in second)  # a finished stage is not trained again
    last = _start(victim, cache)
    out, _ = last.communicate(timeout=900)
    assert last.returncode == 0, open(victim / "stderr.txt").read()[-3000:]
    assert "[rl_orm_1] resumed from step 2" in out
    logged = [line for line in out.splitlines() if line.startswith("LOGGED")]
    assert logged == ["LOGGED rl_orm_1 3", "LOGGED rl_orm_1 4"]  # only the lost updates are trained again

    want = json.load(open(tmp_path / "reference" / "results.json"))
    assert json.load(open(victim / "results.json")) == want
    for stage in STAGES:
        assert json.load(open(victim / stage / "DONE")) == json.load(open(tmp_path / "reference" / stage / "DONE"))
    # The same programs (one compilation cache) on the same data order and dropout keys: the same parameters.
    got, expected = _exports(victim), _exports(tmp_path / "reference")
    for stage in STAGES:
        assert jax.tree.structure(got[stage]) == jax.tree.structure(expected[stage])
        for a, b in zip(jax.tree.leaves(got[stage]), jax.tree.leaves(expected[stage])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=stage)
