"""`atomic_files`: a write that fails half-way leaves the previous file byte for byte and no temporary file; a
finished one replaces it whole, with the permissions an ordinary `open` would give."""
import json
import os
import stat

import pytest

from refiner_jax import atomic_files


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "results.json"
    atomic_files.write_json(path, {"em": 0.5}, indent=2)
    before = path.read_bytes()
    assert json.loads(before) == {"em": 0.5}
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_files.atomic_open(path) as f:
            f.write('{"em": 0.')
            raise RuntimeError("killed mid-write")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["results.json"]


def test_a_finished_write_replaces_the_file_with_ordinary_permissions(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    path = tmp_path / "sub" / "results.md"  # the folder is made
    atomic_files.write_text(path, "old")
    with atomic_files.atomic_open(path) as f:
        f.write("new ")
        f.write("text")
    assert path.read_text() == "new text"
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    assert sorted(os.listdir(path.parent)) == ["results.md"]
