"""`refiner_jax.cpu`: when the launchers restart with a faster malloc (jemalloc, glibc's huge pages, or glibc tuned to
reuse freed memory), and what the restart changes.

The behaviour checks run a script in a subprocess, as the launchers run: it restarts itself, then counts the page
faults of a jitted function whose temporary buffer glibc maps afresh on every call.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from refiner_jax import cpu

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def linux_glibc_thp(monkeypatch, tmp_path):
    """A Linux host with glibc 2.36 and transparent huge pages in `madvise` mode; returns the THP setting file."""
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setattr(cpu, "THP_SETTING", str(setting))
    monkeypatch.setattr(cpu.sys, "platform", "linux")
    monkeypatch.setattr(cpu.platform, "libc_ver", lambda: ("glibc", "2.36"))
    return setting


RETAIN = ":".join(cpu.GLIBC_RETAIN)
HUGE = "glibc.malloc.hugetlb=1"


def test_tunables_added_to_an_empty_or_existing_setting(linux_glibc_thp):
    assert cpu.glibc_tunables({}) == HUGE
    assert cpu.glibc_tunables({}, retain=True) == f"{RETAIN}:{HUGE}"
    assert cpu.GLIBC_RETAIN == ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0",
                                "glibc.malloc.trim_threshold=4611686018427387904")
    assert cpu.glibc_tunables({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == f"glibc.malloc.arena_max=2:{HUGE}"


def test_each_tunable_already_set_wins(linux_glibc_thp):
    assert cpu.glibc_tunables({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert cpu.glibc_tunables({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}) is None
    assert cpu.glibc_tunables({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, retain=True) == \
        f"glibc.malloc.hugetlb=0:{RETAIN}"
    assert cpu.glibc_tunables({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, retain=True) == (
        "glibc.malloc.arena_max=2:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4611686018427387904:"
        f"{HUGE}")
    assert cpu.glibc_tunables({"GLIBC_TUNABLES": f"{HUGE}:{RETAIN}"}, retain=True) is None


def test_huge_pages_need_thp_and_glibc_2_35_and_every_tunable_a_linux_glibc(linux_glibc_thp, monkeypatch):
    linux_glibc_thp.write_text("always madvise [never]\n")
    assert cpu.glibc_tunables({}) is None
    assert cpu.glibc_tunables({}, retain=True) == RETAIN
    linux_glibc_thp.write_text("[always] madvise never\n")
    assert cpu.glibc_tunables({}) == HUGE
    monkeypatch.setattr(cpu.platform, "libc_ver", lambda: ("glibc", "2.34"))
    assert cpu.glibc_tunables({}) is None
    assert cpu.glibc_tunables({}, retain=True) == RETAIN
    monkeypatch.setattr(cpu.platform, "libc_ver", lambda: ("glibc", "2.25"))  # before GLIBC_TUNABLES existed
    assert cpu.glibc_tunables({}, retain=True) is None
    monkeypatch.setattr(cpu.platform, "libc_ver", lambda: ("", ""))  # musl, or not found
    assert cpu.glibc_tunables({}, retain=True) is None
    monkeypatch.setattr(cpu.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(cpu, "THP_SETTING", str(linux_glibc_thp.parent / "missing"))
    assert cpu.glibc_tunables({}) is None
    monkeypatch.setattr(cpu, "THP_SETTING", str(linux_glibc_thp))
    monkeypatch.setattr(cpu.sys, "platform", "darwin")
    assert cpu.glibc_tunables({}, retain=True) is None


def test_jemalloc_is_preloaded_unless_opted_out_or_another_preload_is_set(linux_glibc_thp):
    jemalloc = "libjemalloc.so.2"
    assert cpu.malloc_environment({}, jemalloc) == {"LD_PRELOAD": jemalloc, "MALLOC_CONF": cpu.JEMALLOC_CONF}
    assert cpu.malloc_environment({"MALLOC_CONF": "narenas:2"}, jemalloc) == {"LD_PRELOAD": jemalloc}
    glibc = {"GLIBC_TUNABLES": HUGE}
    assert cpu.malloc_environment({cpu.MALLOC_CHOICE: "glibc"}, jemalloc) == glibc
    assert cpu.malloc_environment({"LD_PRELOAD": "libtcmalloc.so.4"}, jemalloc) == glibc
    assert cpu.malloc_environment({}, None) == glibc  # not installed
    assert cpu.malloc_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, None) == {}
    assert cpu.malloc_environment({cpu.MALLOC_CHOICE: "glibc-retain"}, jemalloc) == {
        "GLIBC_TUNABLES": f"{RETAIN}:{HUGE}"}
    assert cpu.malloc_environment({cpu.MALLOC_CHOICE: "system"}, jemalloc) == {}
    assert cpu.malloc_environment({cpu.MALLOC_CHOICE: "system"}, None) == {}
    with pytest.raises(ValueError,
                       match="REFINER_JAX_MALLOC='tcmalloc'.*'jemalloc'.*'glibc'.*'glibc-retain'.*'system'"):
        cpu.malloc_environment({cpu.MALLOC_CHOICE: "tcmalloc"}, jemalloc)


def test_jemalloc_is_looked_for_on_linux_only_and_in_releases_that_know_its_settings(monkeypatch):
    monkeypatch.setattr(cpu.sys, "platform", "linux")
    for found, used in (("libjemalloc.so.2", "libjemalloc.so.2"), ("libjemalloc.so.1", None), (None, None)):
        monkeypatch.setattr(cpu.ctypes.util, "find_library", lambda name, found=found: found)
        assert cpu.find_jemalloc() == used
    monkeypatch.setattr(cpu.sys, "platform", "darwin")
    monkeypatch.setattr(cpu.ctypes.util, "find_library", lambda name: "libjemalloc.so.2")
    assert cpu.find_jemalloc() is None


_SCRIPT = """
import json, os, resource, sys
from refiner_jax import cpu
print("started", flush=True)  # printed once per process: twice when the script restarts
cpu.restart_with_fast_malloc()
import jax, jax.numpy as jnp
n = 24 * 2 ** 20  # 96 MiB of float32: above glibc's largest mmap threshold (32 MiB) and a thread arena's
# largest heap (64 MiB), so mapped afresh on every call unless malloc keeps freed memory
f = jax.jit(lambda x: jnp.sum(jax.lax.optimization_barrier(jnp.sin(x))))  # the barrier materialises sin(x)
x = jnp.ones((n,), jnp.float32)
faults = []
for _ in range(32):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
# The median of the last 16 calls: a heap that keeps freed memory may still grow over the first few (on jax
# 0.12, up to 8), while the blocks of calls in flight settle into it.
print(json.dumps({"tunables": os.environ.get("GLIBC_TUNABLES"), "faults": sorted(faults[16:])[8],
                  "pages": n * 4 // 4096, "argv": sys.argv[1:], "malloc": cpu.malloc_in_use(),
                  "malloc_conf": os.environ.get("MALLOC_CONF")}))
"""


def _run(tmp_path, env_tunables, *python_options, malloc="glibc", **extra_env):
    """Runs `_SCRIPT` with `GLIBC_TUNABLES=env_tunables` (None: unset) and `MALLOC_CHOICE=malloc` (None: unset);
    returns how often it started and its report."""
    script = tmp_path / "restarting.py"
    script.write_text(_SCRIPT)
    unset = ("GLIBC_TUNABLES", "LD_PRELOAD", "MALLOC_CONF", cpu.MALLOC_CHOICE, cpu._RESTARTED)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["PYTHONPATH"] = str(REPO)
    if malloc is not None:
        env[cpu.MALLOC_CHOICE] = malloc
    if env_tunables is not None:
        env["GLIBC_TUNABLES"] = env_tunables
    env.update(extra_env)
    proc = subprocess.run([sys.executable, *python_options, str(script), "--flag=1", "x"], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    return lines.count("started"), json.loads(lines[-1])


@pytest.mark.skipif(cpu.glibc_tunables({}) is None,
                    reason="needs Linux, glibc >= 2.35 and transparent huge pages not disabled")
def test_restart_sets_the_tunable_and_removes_the_per_call_page_faults(tmp_path):
    starts, report = _run(tmp_path, None)
    assert starts == 2 and report["tunables"] == "glibc.malloc.hugetlb=1"
    assert report["argv"] == ["--flag=1", "x"]
    assert 2 < report["faults"] < report["pages"] / 4, report  # mapped afresh, 2 MiB pages: a few dozen faults

    starts, report = _run(tmp_path, "glibc.malloc.hugetlb=0")  # opted out: no restart, a fault per 4 KiB page
    assert starts == 1 and report["tunables"] == "glibc.malloc.hugetlb=0"
    assert report["faults"] > report["pages"] / 2, report

    starts, report = _run(tmp_path, None, malloc="system")  # nothing changed: no restart, a fault per 4 KiB page
    assert starts == 1 and report["tunables"] is None and report["malloc"] == "glibc"
    assert report["faults"] > report["pages"] / 2, report


@pytest.mark.skipif(cpu.glibc_tunables({}, retain=True) is None, reason="needs Linux with glibc >= 2.26")
def test_glibc_retain_reuses_the_freed_buffer(tmp_path):
    starts, report = _run(tmp_path, None, malloc="glibc-retain")
    assert starts == 2 and report["tunables"] == cpu.glibc_tunables({}, retain=True)
    assert report["malloc"].startswith("glibc (arena_max=1, mmap_max=0, trim_threshold=4611686018427387904")
    assert report["faults"] <= 2, report  # the freed buffer's pages are reused: no fault per page


_THREAD_SCRIPT = """
import ctypes, json, resource, threading
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 96 * 2 ** 20  # above a thread arena's largest heap (64 MiB)
faults = []
def work():
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)  # touch every page
        libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
thread = threading.Thread(target=work)  # a thread other than the main one, as XLA's workers are
thread.start()
thread.join()
print(json.dumps({"faults": sorted(faults[2:])[3], "pages": size // 4096}))
"""


@pytest.mark.skipif(cpu.glibc_tunables({}, retain=True) is None, reason="needs Linux with glibc >= 2.26")
def test_glibc_maps_a_worker_threads_large_block_afresh_unless_every_thread_shares_one_arena(tmp_path):
    """Why `GLIBC_RETAIN` has `arena_max=1`: with the other two tunables alone, a large block that a thread other than
    the main one frees is unmapped and the next one faulted in again."""
    script = tmp_path / "thread_block.py"
    script.write_text(_THREAD_SCRIPT)

    def faults(tunables):
        env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
        env["GLIBC_TUNABLES"] = tunables
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout)

    retain = ":".join(cpu.GLIBC_RETAIN) + ":glibc.malloc.hugetlb=0"
    report = faults(retain)
    assert report["faults"] <= 2, report
    report = faults(retain.replace("glibc.malloc.arena_max=1", "glibc.malloc.arena_max=16"))
    assert report["faults"] > report["pages"] / 2, report


@pytest.mark.skipif(cpu.glibc_tunables({}) is None,
                    reason="needs Linux, glibc >= 2.35 and transparent huge pages not disabled")
def test_a_restarted_process_does_not_restart_again(tmp_path):
    """Where the restarted process's environment lost the tunable, it runs on instead of restarting again."""
    starts, report = _run(tmp_path, None, **{cpu._RESTARTED: "1"})
    assert starts == 1 and report["tunables"] is None


@pytest.mark.skipif(cpu.glibc_tunables({}) is None,
                    reason="needs Linux, glibc >= 2.35 and transparent huge pages not disabled")
def test_an_interactive_session_is_not_restarted(tmp_path):
    starts, report = _run(tmp_path, None, "-i")  # `python -i script`: the REPL follows the script (stdin: EOF)
    assert starts == 1 and report["tunables"] is None


@pytest.mark.skipif(cpu.find_jemalloc() is None, reason="needs jemalloc (Debian/Ubuntu: apt-get install libjemalloc2)")
def test_restart_preloads_jemalloc_which_reuses_the_temporary_buffer(tmp_path):
    starts, report = _run(tmp_path, None, malloc=None)
    assert starts == 2 and report["malloc"] == "jemalloc" and report["malloc_conf"] == cpu.JEMALLOC_CONF
    assert report["tunables"] is None and report["argv"] == ["--flag=1", "x"]
    assert report["faults"] <= 2, report  # the freed buffer's pages are reused: no fault per 2 MiB or 4 KiB page

    starts, report = _run(tmp_path, None, malloc="glibc")  # opted out: glibc with huge pages, where it has them
    assert report["malloc"].startswith("glibc")


def test_host_devices_are_added_to_xla_flags_unless_a_count_is_set():
    env = {}
    assert cpu.expose_host_devices(4, env) == 4 and env == {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    env = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
    assert cpu.expose_host_devices(2, env) == 2
    assert env["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=2"
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}  # the user's own count wins
    assert cpu.expose_host_devices(2, env) == 8 and env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    env = {}
    assert cpu.expose_host_devices(1, env) == 1 and env == {}


def test_exposed_host_devices_are_the_cpu_backend_devices():
    script = ("from refiner_jax import cpu; cpu.expose_host_devices(3); import jax; "
              "print(jax.default_backend(), jax.device_count())")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["cpu", "3"]
