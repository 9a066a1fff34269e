"""Process settings that make XLA:CPU faster on Linux hosts.

XLA:CPU allocates each execution's temporary buffer with the C allocator and frees it when the step ends (a t5-tiny
train step at batch 32: 212 MB). glibc maps a block that large afresh and unmaps it on free, so every step faults in
every 4 KiB page again: 55,000 page faults per t5-tiny train step. glibc's tunable `glibc.malloc.hugetlb=1` makes
malloc ask for transparent huge pages (2 MiB) instead: about 180 faults per step, and the step took 190-202 ms instead
of 253-319 ms on a 2-core CPU.

glibc reads tunables only when a process starts, so `restart_with_huge_pages` starts the running script again with
the tunable set; the launchers call it first thing.

XLA:CPU runs most of a program's elementwise work on one thread and only its matrix products on every core.
`expose_host_devices` splits the CPU into several XLA host devices before JAX starts its CPU backend, so that a program
split over them (batches, sampled prompts) runs every device's share of that work at once.

Pure standard library: importing this module does not start JAX.
"""
from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping, MutableMapping

HUGE_PAGES = "glibc.malloc.hugetlb=1"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"  # e.g. "always [madvise] never"
_RESTARTED = "REFINER_JAX_HUGE_PAGES_RESTARTED"  # set in the restarted process: restart at most once


def _glibc_has_hugetlb() -> bool:
    """Whether this process runs on glibc 2.35 or later, the first with the `glibc.malloc.hugetlb` tunable."""
    name, version = platform.libc_ver()
    if name != "glibc":
        return False
    try:
        return tuple(int(part) for part in version.split(".")[:2]) >= (2, 35)
    except ValueError:
        return False


def _thp_enabled() -> bool:
    """Whether the kernel grants transparent huge pages to regions that ask for them (mode not `[never]`)."""
    try:
        with open(THP_SETTING) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def huge_page_tunables(environ: Mapping[str, str]) -> str | None:
    """The `GLIBC_TUNABLES` value that adds `HUGE_PAGES` to `environ`'s, or None when there is nothing to add: not
    Linux with glibc >= 2.35, transparent huge pages disabled, or `glibc.malloc.hugetlb` already set (any value: set
    `GLIBC_TUNABLES=glibc.malloc.hugetlb=0` to opt out)."""
    current = environ.get("GLIBC_TUNABLES", "")
    if any(item.split("=", 1)[0] == "glibc.malloc.hugetlb" for item in current.split(":")):
        return None
    if not sys.platform.startswith("linux") or not _glibc_has_hugetlb() or not _thp_enabled():
        return None
    return f"{current}:{HUGE_PAGES}" if current else HUGE_PAGES


def restart_with_huge_pages() -> None:
    """Replace this Python process by the same command with `HUGE_PAGES` in `GLIBC_TUNABLES`, when
    `huge_page_tunables` has something to add; otherwise return.

    Call it first thing in a script's `__main__`, before JAX starts, threads run or files are written (the restart
    runs the whole command again). The restarted process finds the tunable set and returns at once; it never
    restarts twice, even where the environment loses `GLIBC_TUNABLES` (glibc drops it for setuid programs). An
    interactive session (`python -i`, a REPL) is never restarted: its state would be lost.
    """
    tunables = huge_page_tunables(os.environ)
    interactive = sys.flags.interactive or hasattr(sys, "ps1")
    if tunables is None or not sys.executable or os.environ.get(_RESTARTED) or interactive:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              {**os.environ, "GLIBC_TUNABLES": tunables, _RESTARTED: "1"})


HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def expose_host_devices(count: int, environ: MutableMapping[str, str] = os.environ) -> int:
    """Make XLA:CPU expose `count` host devices (adds `HOST_DEVICES_FLAG` to `XLA_FLAGS`), unless `XLA_FLAGS` sets
    a count already, which wins; returns the count that applies. It takes effect only where JAX has not started its
    CPU backend yet (before the first `jax.devices()` or computation); other backends ignore it."""
    flags = environ.get("XLA_FLAGS", "")
    for flag in flags.split():
        if flag.startswith(HOST_DEVICES_FLAG + "="):
            return int(flag.split("=", 1)[1])
    if count > 1:
        environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICES_FLAG}={count}".strip()
    return max(count, 1)


__all__ = ["HOST_DEVICES_FLAG", "HUGE_PAGES", "expose_host_devices", "huge_page_tunables", "restart_with_huge_pages"]
