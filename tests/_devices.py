"""Run a test file as a script in a fresh process with virtual CPU devices (XLA_FLAGS must be set before JAX
starts there; the caller's own XLA_FLAGS are kept) and read the JSON report it prints as its last line."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_report(script: str, devices: int, *args: str, timeout: int = 300, **env: str) -> dict:
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, **env)
    proc = subprocess.run([sys.executable, os.path.abspath(script), *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
