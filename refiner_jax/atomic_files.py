"""Files written whole or not at all: the text goes to a temporary file beside the target, is flushed to disk, then
renamed over it (`os.replace`, atomic on POSIX). A run killed mid-write leaves the old file or none, never half a
`results.json` or a `DONE` marker that a resumed run would trust."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from typing import Any, Iterator, TextIO


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[TextIO]:
    """A text file to write that replaces `path` only when the `with` block ends without an error."""
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temp, "x", encoding="utf-8") as f:  # "x": a new file, with the umask's permissions
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.remove(temp)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def write_json(path: str | os.PathLike, value: Any, **dump_options) -> None:
    """`json.dump(value, **dump_options)` into `path`, atomically."""
    write_text(path, json.dumps(value, **dump_options))
