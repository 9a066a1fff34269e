"""One run per workdir: a lock file that refuses a second run on the same workdir.

`acquire` creates `<workdir>/LOCK` atomically (``O_CREAT | O_EXCL``) holding the owner's host, pid, process start
time and a random token, then reads it back to verify that it holds it. A lock whose owner ran on this host and is
gone (its pid no longer exists, or now belongs to a process started later), as after a SIGKILL, is stale: it is
taken over under an exclusive ``flock`` of `<workdir>/LOCK.takeover`, so two runs cannot both take it over. A lock
of a live process, or of another host (whose processes cannot be checked from here), refuses the run with a message
naming the owner. `WorkdirLock.release` and the interpreter's exit release it; the process that holds it may
acquire it again (runs one after another in one notebook or test).
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import sys
import time
import uuid

LOCK_FILE = "LOCK"
_HELD: dict[str, "WorkdirLock"] = {}  # lock path -> this process's lock


class WorkdirLockedError(RuntimeError):
    """The workdir is locked by another run that is (or may be) still running."""


class WorkdirLock:
    """A held workdir lock; `release` removes the lock file if it is still this lock's."""

    def __init__(self, path: str, token: str):
        self.path, self.token = path, token

    def holds(self) -> bool:
        owner = _read(self.path)
        return owner is not None and owner.get("token") == self.token

    def release(self) -> None:
        if self.holds():
            os.remove(self.path)
        if _HELD.get(self.path) is self:
            del _HELD[self.path]


def acquire(workdir: str) -> WorkdirLock:
    """The lock of `workdir` (an existing directory); raises `WorkdirLockedError` if another run holds it."""
    workdir = os.path.abspath(workdir)
    path = os.path.join(workdir, LOCK_FILE)
    held = _HELD.get(path)
    if held is not None and held.holds():
        return held
    me = {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid()),
          "token": uuid.uuid4().hex, "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
          "command": " ".join(sys.argv)[:300]}
    if not _create(path, me):
        owner = _read_settled(path)
        if owner is not None and _running(owner) is not False:
            raise WorkdirLockedError(_refusal(workdir, path, owner))
        with open(path + ".takeover", "a", encoding="utf-8") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)  # one taker at a time; released when the file closes
            current = _read(path)
            if current == owner:  # still the stale lock seen above, not a new owner's
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
            if not _create(path, me):
                raise WorkdirLockedError(_refusal(workdir, path, _read(path) or {}))
    if _read(path) != me:  # an O_EXCL create that a broken file system did not make exclusive
        raise WorkdirLockedError(_refusal(workdir, path, _read(path) or {}))
    lock = WorkdirLock(path, me["token"])
    _HELD[path] = lock
    atexit.register(lock.release)
    return lock


def _create(path: str, content: dict) -> bool:
    """Creates `path` with `content` (JSON) if it does not exist; False if it does."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(content, f)
        f.flush()
        os.fsync(f.fileno())
    return True


def _read(path: str) -> dict | None:
    """The lock's content; None if it is missing, empty or not JSON (e.g. still being written)."""
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def _read_settled(path: str) -> dict | None:
    """`_read`, waiting up to a second for a lock that its creator is still writing; None: unreadable."""
    for _ in range(10):
        owner = _read(path)
        if owner is not None or not os.path.exists(path):
            return owner
        time.sleep(0.1)
    return None


def _start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux); None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _running(owner: dict) -> bool | None:
    """Whether the lock's owner still runs: None when it ran on another host."""
    if owner.get("host") != socket.gethostname():
        return None
    pid = int(owner.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    start = _start_time(pid)
    return owner.get("start") is None or start is None or start == owner["start"]


def _refusal(workdir: str, path: str, owner: dict) -> str:
    where = f"process {owner.get('pid', '?')} on host {owner.get('host', '?')}"
    if _running(owner) is None:
        where += " (another machine: whether it still runs cannot be checked from here)"
    return (f"{workdir} is in use by another run: {where}, since {owner.get('since', '?')} "
            f"({owner.get('command') or 'unknown command'}). Wait for that run to finish or stop it, or use another "
            f"--workdir; if it is no longer running, delete {path} and rerun.")
