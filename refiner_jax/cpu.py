"""Process settings that make XLA:CPU faster on Linux hosts.

XLA:CPU allocates each execution's temporary buffers with the C allocator and frees them when the step ends. glibc
maps a block that large afresh and unmaps it on free, so every step faults in every page again, and a virtual
machine's first touch of a page can be slow (on a KVM guest, 4,000 faults took up to 7 s of a 10 s step). Remedies,
read when a process starts (measurements: docs/performance.md):

- jemalloc, where the system has it (Debian and Ubuntu: `apt-get install libjemalloc2`), preloaded with
  `JEMALLOC_CONF`: freed memory stays with the process on transparent huge pages, so each step reuses the pages of
  the last one. The process keeps its peak memory until it exits.
- otherwise glibc's tunable `glibc.malloc.hugetlb=1` (glibc 2.35 and later, where the kernel has transparent huge
  pages), which makes malloc ask for 2 MiB pages: a fault per 2 MiB instead of per 4 KiB.
- `REFINER_JAX_MALLOC=glibc-retain` adds `GLIBC_RETAIN` to that: one arena for every thread (glibc maps a block
  over 64 MiB that another thread asks for on its own, whatever the thresholds, and XLA asks on its worker threads),
  no separately mapped blocks and no trimming, so freed memory is reused as with jemalloc. Large models' training
  steps gain most; the one arena's lock costs the sampler and the compiler some of their speed.

`restart_with_fast_malloc` starts the running script again with them set; the launchers call it first thing.
`REFINER_JAX_MALLOC=glibc` keeps glibc's malloc with huge pages, `REFINER_JAX_MALLOC=system` the malloc and settings
the process started with; an `LD_PRELOAD` of the user's own is left alone, and so are a `MALLOC_CONF` and each glibc
tunable already set.

The samplers compile their decode loops so that XLA:CPU runs the products in Eigen, not YNNPACK (`sampling`):
`REFINER_JAX_DECODE_PRODUCTS=ynnpack` keeps XLA's defaults, faster for some models on some CPUs, rounded otherwise.

XLA:CPU runs most of a program's elementwise work on one thread and only its matrix products on every core.
`expose_host_devices` splits the CPU into several XLA host devices before JAX starts its CPU backend, so that a program
split over them (batches, sampled prompts) runs every device's share of that work at once.

Pure standard library: importing this module does not start JAX.
"""
from __future__ import annotations

import ctypes.util
import os
import platform
import sys
from collections.abc import Mapping, MutableMapping

HUGE_PAGES = "glibc.malloc.hugetlb=1"
# One arena for every thread, never a block mapped on its own, never memory handed back: freed blocks are reused.
GLIBC_RETAIN = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0", f"glibc.malloc.trim_threshold={2 ** 62}")
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"  # e.g. "always [madvise] never"
# Never return freed pages to the system (no decay), and back the heap and jemalloc's metadata with huge pages.
JEMALLOC_CONF = "thp:always,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
MALLOC_CHOICE = "REFINER_JAX_MALLOC"  # "glibc" / "glibc-retain": do not preload jemalloc; "system": change nothing
MALLOC_CHOICES = ("jemalloc", "glibc", "glibc-retain", "system")
DECODE_PRODUCTS = "REFINER_JAX_DECODE_PRODUCTS"  # where a decode loop's products run on CPU: eigen or ynnpack
DECODE_PRODUCTS_CHOICES = ("eigen", "ynnpack")
_RESTARTED = "REFINER_JAX_MALLOC_RESTARTED"  # set in the restarted process: restart at most once


def _glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the glibc this process runs on, or None (another C library, or not found)."""
    name, version = platform.libc_ver()
    if name != "glibc":
        return None
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def _thp_enabled() -> bool:
    """Whether the kernel grants transparent huge pages to regions that ask for them (mode not `[never]`)."""
    try:
        with open(THP_SETTING) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def glibc_tunables(environ: Mapping[str, str], *, retain: bool = False) -> str | None:
    """The `GLIBC_TUNABLES` value that adds `HUGE_PAGES` (glibc 2.35 and later, transparent huge pages not disabled)
    and, with `retain`, `GLIBC_RETAIN` (glibc 2.26 and later, the first with tunables) to `environ`'s, each unless a
    setting of the same tunable is there already (it wins: `GLIBC_TUNABLES=glibc.malloc.hugetlb=0` keeps 4 KiB pages);
    None when there is nothing to add or the host is not Linux with glibc."""
    version = _glibc_version()
    if not sys.platform.startswith("linux") or version is None or version < (2, 26):
        return None
    current = [item for item in environ.get("GLIBC_TUNABLES", "").split(":") if item]
    present = {item.split("=", 1)[0] for item in current}
    wanted = list(GLIBC_RETAIN) if retain else []
    if version >= (2, 35) and _thp_enabled():
        wanted.append(HUGE_PAGES)
    added = [item for item in wanted if item.split("=", 1)[0] not in present]
    return ":".join(current + added) if added else None


def find_jemalloc() -> str | None:
    """The file name of the system's jemalloc library on Linux (`libjemalloc.so.2`, jemalloc 4 and 5), or None.
    `JEMALLOC_CONF` needs jemalloc 5.1 or later (Debian 11 and Ubuntu 20.04 ship 5.2); jemalloc 3
    (`libjemalloc.so.1`) has none of its settings and is not used."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("jemalloc")
    return name if name and name.endswith(".so.2") else None


def malloc_environment(environ: Mapping[str, str], jemalloc: str | None) -> dict[str, str]:
    """The variables to add to `environ` for a faster malloc (empty: nothing to add), by `MALLOC_CHOICE`: "jemalloc"
    (the default) preloads `jemalloc` (a library name from `find_jemalloc`, or None) with `JEMALLOC_CONF` unless
    `LD_PRELOAD` is set, and otherwise falls back to "glibc": `glibc_tunables`; "glibc-retain": `glibc_tunables` with
    `retain`; "system": nothing."""
    choice = environ.get(MALLOC_CHOICE, "jemalloc")
    if choice not in MALLOC_CHOICES:
        raise ValueError(f"{MALLOC_CHOICE}={choice!r}: set it to 'jemalloc' (the default: preload jemalloc where the "
                         f"system has it), 'glibc' (glibc's malloc on huge pages), 'glibc-retain' (glibc's malloc "
                         f"keeping freed memory in one arena) or 'system' (change nothing)")
    if choice == "system":
        return {}
    if jemalloc and choice == "jemalloc" and not environ.get("LD_PRELOAD"):
        added = {"LD_PRELOAD": jemalloc}
        if "MALLOC_CONF" not in environ:
            added["MALLOC_CONF"] = JEMALLOC_CONF
        return added
    tunables = glibc_tunables(environ, retain=choice == "glibc-retain")
    return {"GLIBC_TUNABLES": tunables} if tunables else {}


def restart_with_fast_malloc() -> None:
    """Replace this Python process by the same command with `malloc_environment`'s variables set, when it has any;
    otherwise return.

    Call it first thing in a script's `__main__`, before JAX starts, threads run or files are written (the restart
    runs the whole command again). The restarted process finds the variables set and returns at once; it never
    restarts twice, even where the environment loses them (glibc drops `GLIBC_TUNABLES` and `LD_PRELOAD` for setuid
    programs). An interactive session (`python -i`, a REPL) is never restarted: its state would be lost.
    """
    interactive = sys.flags.interactive or hasattr(sys, "ps1")
    if not sys.executable or os.environ.get(_RESTARTED) or interactive:
        return
    added = malloc_environment(os.environ, find_jemalloc())
    if not added:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **added, _RESTARTED: "1"})


def malloc_in_use() -> str:
    """Which malloc this process runs on: "jemalloc" or "tcmalloc" when one is loaded, else "glibc" on Linux (with
    the `glibc.malloc` tunables set in `GLIBC_TUNABLES`, if any) or "system"."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "system"
    for name in ("jemalloc", "tcmalloc"):
        if f"lib{name}" in maps:
            return name
    tunables = [item.removeprefix("glibc.malloc.") for item in os.environ.get("GLIBC_TUNABLES", "").split(":")
                if item.startswith("glibc.malloc.")]
    return f"glibc ({', '.join(tunables)})" if tunables else "glibc"


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


__all__ = ["GLIBC_RETAIN", "HOST_DEVICES_FLAG", "HUGE_PAGES", "JEMALLOC_CONF", "MALLOC_CHOICE", "MALLOC_CHOICES",
           "expose_host_devices", "find_jemalloc", "glibc_tunables", "malloc_environment", "malloc_in_use",
           "restart_with_fast_malloc"]
