"""Where a task's data comes from when it is not the task's own files: data files (parquet, JSON lines, JSON, csv)
or a dataset of the Hugging Face hub, read through `datasets.load_dataset` into rows (plain dicts) that
`dataset_rows` maps onto each task's own records, so both paths end in the same `Example`s.

A source is the string of `config.task.data_dir`:

- a folder: the task's own files when it holds them (the task's readers), else its data files named by split
  (`train.parquet`, `test.jsonl`, or the hub's layout `data/train-00000-of-00001.parquet`);
- `train=PATH,test=PATH`: one data file (or glob) per split, as `datasets`' `data_files`;
- a hub name with an optional config, `openai/gsm8k:main`, read from the hub's cache in offline mode
  (`HF_DATASETS_OFFLINE=1`: nothing is downloaded then).

A folder can also take a config (`PATH:main`) when its README declares several. Anything missing or unreadable
raises `DataError` naming the path or name and how to get it.

Where a run's source came from (`origin`) is printed first by every run: `--config.task.data_dir`, the config file,
`$REFINER_DATA` (the root the configs' dataset folders sit under, `tasks.base.shared_data_dir`), the shared data
folder beside the checkout when `$REFINER_DATA` is unset, or the task's embedded default when `task.data_dir` is
empty (the MWP and SNLR generators).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from typing import Iterable

from refiner_jax.tasks.base import DataError, json_objects, raise_problems, shared_data_dir

DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")
_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# A task's split -> the dataset splits that may hold it, first found wins (SVAMP's test is its "dev" file, which
# `datasets` names "validation").
SPLIT_NAMES = {"train": ("train",), "test": ("test", "validation")}
# The split a data file holds, by the first word of its name (`train.parquet`, `test-00000-of-00001.parquet`).
_FILE_SPLITS = {"train": "train", "training": "train", "test": "test", "testing": "test", "eval": "test",
                "evaluation": "test", "validation": "validation", "valid": "validation", "val": "validation",
                "dev": "validation"}


@dataclasses.dataclass(frozen=True)
class Source:
    """A parsed source: `kind` "folder" (`path`), "files" (`files`: split -> path) or "hub" (`path` is the name);
    `config` is the dataset config after ':' (None: the default)."""

    kind: str
    path: str = ""
    config: str | None = None
    files: tuple[tuple[str, str], ...] = ()


def parse(text: str) -> Source:
    """The source that `text` names (see the module's docstring); an existing local path wins over a hub name."""
    text = text.strip()
    if os.path.exists(os.path.expanduser(text)):
        return Source("folder", os.path.abspath(os.path.expanduser(text)))
    if "=" in text:
        pairs = [part.partition("=") for part in text.split(",") if part.strip()]
        bad = [p for p, eq, path in pairs if not eq or not p.strip() or not path.strip()]
        if bad:
            raise DataError(f"{text}: expected split=PATH pairs separated by commas, e.g. "
                            "train=data/train.parquet,test=data/test.parquet")
        return Source("files", files=tuple((s.strip(), os.path.abspath(os.path.expanduser(p.strip())))
                                           for s, _, p in pairs))
    path, config = text, None
    if text.count(":") == 1:
        path, config = text.split(":")
    local = os.path.expanduser(path)
    if os.path.exists(local) or not _HUB_NAME.fullmatch(path):
        return Source("folder", os.path.abspath(local), config or None)
    return Source("hub", path, config or None)


def recorded(text: str) -> str:
    """`text` with its local paths absolute (a run records its config so that tools find the data from anywhere);
    hub names unchanged."""
    if not text:
        return text
    source = parse(text)
    if source.kind == "files":
        return ",".join(f"{split}={path}" for split, path in source.files)
    return source.path + (f":{source.config}" if source.config else "")


ENV_ROOT = "REFINER_DATA"


def origin(text: str, from_command_line: bool = False) -> str:
    """Where the source `text` of `config.task.data_dir` came from, in words (`from_command_line`: it was given as
    `--config.task.data_dir`)."""
    if not text:
        return "the task's embedded default, as config.task.data_dir is empty"
    if from_command_line:
        return "--config.task.data_dir"
    if not _under_shared_root(text):
        return "the config file"
    if os.environ.get(ENV_ROOT):
        return f"the config file, a dataset folder under ${ENV_ROOT}={shared_data_dir()}"
    return (f"the config file, a dataset folder under {shared_data_dir()}, the shared data beside the checkout, as "
            f"${ENV_ROOT} is unset")


def _under_shared_root(text: str) -> bool:
    root, source = shared_data_dir(), parse(text)
    return source.kind == "folder" and os.path.commonpath([source.path, root]) == root


def describe(text: str, from_command_line: bool = False) -> str:
    """One line: the source and where it came from (`origin`)."""
    return f"[data] source: {text or 'embedded'}; from {origin(text, from_command_line)}"


def require(text: str, from_command_line: bool = False) -> None:
    """Raises `DataError` naming `config.task.data_dir`, where its value came from and the fix when `text` names a
    local folder or file that does not exist; says nothing of hub names and data files (read later)."""
    if not text:
        return
    source = parse(text)
    if source.kind != "folder" or os.path.exists(source.path):
        return
    fix = "give the data with --config.task.data_dir=PATH"
    if not from_command_line and _under_shared_root(text):
        fix += (f", or set ${ENV_ROOT} to the folder that holds the datasets "
                f"({os.path.relpath(source.path, shared_data_dir())} under it)")
    raise DataError(f"config.task.data_dir: {source.path} does not exist (it came from "
                    f"{origin(text, from_command_line)}); {fix}")


def _data_files(folder: str) -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(folder, "*")) if p.endswith(DATA_SUFFIXES) and os.path.isfile(p))


def reads_own_files(text: str, own_files: Iterable[str]) -> bool:
    """Whether a task whose reader takes `own_files` (names in a folder) reads `text` itself: a folder holding any
    of them, or no data file at all (the task's reader then names the file it misses)."""
    source = parse(text)
    if source.kind != "folder" or source.config:
        return False
    if any(os.path.isfile(os.path.join(source.path, name)) for name in own_files):
        return True
    return not (_data_files(source.path) or _data_files(os.path.join(source.path, "data")))


def split_rows(text: str, split: str, exact: bool = False) -> tuple[str, list[dict]]:
    """(where the rows come from, for messages; the rows of `split` ("train", "validation", "test")) of source
    `text`; a test split falls back to a validation split unless `exact`."""
    source = parse(text)
    names = (split,) if exact else SPLIT_NAMES.get(split, (split,))
    if source.kind == "hub" or source.config:
        splits = _load(text, source, source.path, name=source.config)
        name = next((n for n in names if n in splits), None)
        if name is None:
            raise DataError(f"{text}: no {' or '.join(names)} split (it has {', '.join(splits)}); pick a config "
                            "with one after ':' or give split=PATH data files")
        return f"{text} [{name}]", _rows(splits[name])
    files = _split_files(text, source)
    name = next((n for n in names if n in files), None)
    if name is None:
        raise DataError(f"{text}: no data file for the {split} split; name it {split}.parquet (or .jsonl, .json, "
                        f".csv) or give {split}=PATH")
    return _load_files(text, source, name, files[name])


def all_rows(text: str) -> list[tuple[str, list[dict]]]:
    """(where, rows) of every split of source `text`, in the dataset's order (label files: every labelled
    solution, whatever its split is called)."""
    source = parse(text)
    if source.kind == "hub" or source.config:
        splits = _load(text, source, source.path, name=source.config)
        return [(f"{text} [{name}]", _rows(rows)) for name, rows in splits.items()]
    return [_load_files(text, source, name, paths) for name, paths in _split_files(text, source).items()]


def _split_files(text: str, source: Source) -> dict[str, list[str]]:
    """Split -> its data files, of split=PATH pairs or of a folder (named as the hub names them: `train.parquet`,
    `data/test-00000-of-00001.parquet`, ...)."""
    if source.kind == "files":
        out = {}
        for split, path in source.files:
            found = sorted(glob.glob(path))
            if not found:
                raise DataError(f"{path}: file not found; give the {split} split's data file ({text})")
            out[split] = found
        return out
    if not os.path.exists(source.path):
        raise DataError(f"{source.path}: no such folder or file, and not a hub name (owner/name); give the task's "
                        "data folder, split=PATH data files, or a hub name such as openai/gsm8k:main")
    if os.path.isfile(source.path):
        raise DataError(f"{source.path}: a single file holds no split; give split=PATH pairs, e.g. "
                        f"test={source.path}")
    folder = source.path
    files = _data_files(folder) or _data_files(os.path.join(folder, "data"))  # the hub's layout: data/
    out: dict[str, list[str]] = {}
    for path in files:
        split = _FILE_SPLITS.get(re.split(r"[-._ ]", os.path.basename(path))[0].lower())
        if split is not None:
            out.setdefault(split, []).append(path)
    if not out:
        raise DataError(f"{folder}: no data file named by split; expected e.g. train.parquet and test.parquet "
                        f"({', '.join(DATA_SUFFIXES)}) in it or in its data/ folder")
    return out


def _load_files(text: str, source: Source, split: str, paths: list[str]) -> tuple[str, list[dict]]:
    suffixes = {os.path.splitext(p)[1] for p in paths}
    if len(suffixes) != 1 or not suffixes <= set(_BUILDERS):
        raise DataError(f"{', '.join(paths)}: the {split} split needs data files of one kind among "
                        f"{', '.join(DATA_SUFFIXES)}")
    empty = [p for p in paths if _blank(p)]
    if empty:
        raise DataError(f"{empty[0]}: empty file; expected the {split} split's rows")
    for path in paths:
        if path.endswith((".json", ".jsonl")):
            _check_json_rows(path)
    where = paths[0] if len(paths) == 1 else f"{os.path.dirname(paths[0])} [{split}]"
    dataset = _load(where, source, _BUILDERS[suffixes.pop()], data_files={split: paths}, split=split)
    return where, _rows(dataset)


def _check_json_rows(path: str) -> None:
    """Every row of a JSON (a list of objects, or JSON lines) or JSON-lines file is an object, else `DataError`
    naming each bad line: pyarrow's reader behind `datasets` kills the process on some (a line `null`)."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".json") and data.lstrip().startswith(b"["):
        try:
            rows = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise DataError(f"{path}: not a valid JSON list ({e}); expected a list of objects, or one object per "
                            "line") from None
        bad = [i for i, row in enumerate(rows) if not isinstance(row, dict)] if isinstance(rows, list) else [0]
        if bad or not rows:
            raise DataError(f"{path}: item {bad[0] if bad else 0} is not an object; expected a non-empty list of "
                            "objects, or one object per line")
        return
    problems: list[str] = []
    for _ in json_objects(data.split(b"\n"), path, "one JSON object per line", problems=problems):
        pass
    raise_problems(problems, path)


def _blank(path: str) -> bool:
    """Whether a file holds nothing but whitespace (`datasets` fails on one without saying which)."""
    with open(path, "rb") as f:
        return not f.read(1 << 16).strip() and not f.read(1)


def _rows(dataset) -> list[dict]:
    return dataset.to_list()


def _datasets(text: str):
    try:
        import datasets
    except ImportError as e:
        raise DataError(f"{text}: reading data files or hub datasets needs the datasets package; "
                        "pip install datasets") from e
    return datasets


def _load(text: str, source: Source, path: str, **kwargs):
    """`datasets.load_dataset(path, **kwargs)` with its failures as one `DataError` naming the source."""
    datasets = _datasets(text)
    try:
        return datasets.load_dataset(path, **kwargs)
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as e:
        raise DataError(_failure(text, source, e, datasets.config)) from e


def _failure(text: str, source: Source, error: BaseException, config) -> str:
    while error.__cause__ is not None and "error occurred while generating" in str(error):
        error = error.__cause__  # the file's own problem, not datasets' wrapper
    if source.kind != "hub":
        detail = " ".join(str(error).split())
        detail = detail if len(detail) <= 300 else detail[:300] + "..."
        return (f"{text}: not readable as data files ({type(error).__name__}: {detail}); expected "
                f"{', '.join(DATA_SUFFIXES)} files of rows with the same fields")
    call = f"datasets.load_dataset({source.path!r}" + (f", {source.config!r})" if source.config else ")")
    if config.HF_HUB_OFFLINE:
        return (f"{text}: not in the hub's cache ({config.HF_DATASETS_CACHE}) and offline mode is on "
                f"(HF_DATASETS_OFFLINE / HF_HUB_OFFLINE); cache it once online with python -c \"import datasets; "
                f"{call}\", or download its files and set task.data_dir to their folder ({error})")
    return (f"{text}: could not be loaded from the hub ({type(error).__name__}: {error}); check the name and its "
            "config after ':' (e.g. openai/gsm8k:main), or download its files and set task.data_dir to their folder")
