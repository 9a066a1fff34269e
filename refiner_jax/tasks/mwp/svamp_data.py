"""SVAMP's `mawps-asdiv-a_svamp` csvs as MWP examples: `x` is the `Question` column, which already is
`Body + " " + Ques`; `z` the formula compiled from the prefix `Equation`; `y` the answer; `meta` keeps `numbers`
(floats, in numberK order), the prefix `equation` and the gold `answer`. Validation is a seeded held-out slice of
train.csv (`heldout_split`), never SVAMP. A malformed file raises `DataError` naming the file, the row and what
was expected."""
from __future__ import annotations

import csv
import os
import random
import re
from typing import Mapping, Sequence

from refiner_jax.tasks import data_sources, dataset_rows
from refiner_jax.tasks.base import DataError, Example, raise_problems
from refiner_jax.tasks.mwp.formula import compile_prefix, format_formula, normalize_whitespace

_REQUIRED_COLUMNS = ("Question", "Numbers", "Equation", "Answer")


def _read_csv(path: str) -> list[dict[str, str]]:
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found; expected SVAMP's mawps-asdiv-a_svamp csv "
                        f"(columns {', '.join(_REQUIRED_COLUMNS)}); pass its folder as data_dir")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            columns = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: not a readable UTF-8 csv file ({e})") from e
    missing = [c for c in _REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; expected a header with "
                        f"{', '.join(_REQUIRED_COLUMNS)} (found {columns})")
    if not rows:
        raise DataError(f"{path}: no data rows; expected SVAMP problems with columns {', '.join(_REQUIRED_COLUMNS)}")
    return rows


def _example_from_fields(uid: str, question: str, numbers: Sequence[float], equation: str, answer: float,
                         extra: Mapping[str, object] | None = None, formula=None) -> Example:
    formula = compile_prefix(equation) if formula is None else formula
    meta = {"numbers": [float(v) for v in numbers], "equation": equation, "answer": float(answer), **(extra or {})}
    return Example(uid=uid, x=normalize_whitespace(question), z=format_formula(formula), y=repr(float(answer)),
                   meta=meta)


def _examples_from_csv(path: str, prefix: str, lowercase: bool = False) -> list[Example]:
    return examples_from_records(_read_csv(path), path, prefix, lowercase, row_word="data row")


def examples_from_dataset(source: str, split: str, prefix: str, lowercase: bool = False) -> list[Example]:
    """The examples of `split` ("train", "test") of data files or a hub dataset (`tasks.data_sources`), rows in
    either SVAMP layout (`dataset_rows.mwp_record`)."""
    where, rows = data_sources.split_rows(source, split)
    if not rows:
        raise DataError(f"{where}: no rows; expected SVAMP problems with columns {', '.join(_REQUIRED_COLUMNS)}")
    records = [dataset_rows.mwp_record(row, f"{where}: row {i + 1}") for i, row in enumerate(rows)]
    return examples_from_records(records, where, prefix, lowercase)


def examples_from_records(records: Sequence[Mapping], source: str, prefix: str, lowercase: bool = False,
                          row_word: str = "row") -> list[Example]:
    """Examples `{prefix}-{i}` of records in the masked csvs' layout; `DataError` names `source`, each malformed
    row (from 1) and its field."""
    examples, problems = [], []
    for i, row in enumerate(records):
        try:
            examples.append(_example_from_record(row, f"{source}: {row_word} {i + 1}", f"{prefix}-{i}", lowercase))
        except DataError as e:
            problems.append(str(e))
    raise_problems(problems, source)
    return examples


def _example_from_record(row: Mapping, where: str, uid: str, lowercase: bool) -> Example:
    wrong = [c for c in _REQUIRED_COLUMNS if not isinstance(row.get(c) or "", str)]
    if wrong:
        raise DataError(f"{where}: field {wrong[0]!r} is a {type(row[wrong[0]]).__name__}; expected text "
                        "(Question, Equation) or a number written as text (Numbers, Answer)")
    equation, question = row["Equation"] or "", row["Question"] or ""
    try:
        numbers = [float(v) for v in (row["Numbers"] or "").split()]
    except ValueError:
        raise DataError(f"{where}: field 'Numbers' is {row['Numbers']!r}; expected space-separated numbers") from None
    try:
        answer = float(row["Answer"] or "")
    except ValueError:
        raise DataError(f"{where}: field 'Answer' is {row['Answer']!r}; expected a number") from None
    try:
        formula = compile_prefix(equation)
    except ValueError as e:
        raise DataError(f"{where}: field 'Equation': {e}; expected a prefix equation over numberK and "
                        "constants") from None
    max_k = max((int(m) for m in re.findall(r"number(\d+)", equation)), default=-1)
    if max_k >= len(numbers):
        raise DataError(f"{where}: field 'Equation' uses number{max_k} but Numbers has {len(numbers)} value(s)")
    if not normalize_whitespace(question):
        raise DataError(f"{where}: empty Question; expected the problem text in field 'Question'")
    extra = {"type": row["Type"]} if row.get("Type") else {}
    return _example_from_fields(uid, question.lower() if lowercase else question, numbers, equation, answer, extra,
                                formula)


def heldout_split(examples: Sequence[Example], val_size: int, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, val): a seeded random slice of `val_size` examples, drawn by problem text so that repeated problems
    (MAWPS has 420 duplicated texts) never sit on both sides."""
    groups: dict[str, list[Example]] = {}
    for ex in examples:
        groups.setdefault(ex.x.lower(), []).append(ex)
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    val_keys: set[str] = set()
    count = 0
    for key in keys:
        if count + len(groups[key]) <= val_size:
            val_keys.add(key)
            count += len(groups[key])
    train = [ex for ex in examples if ex.x.lower() not in val_keys]
    val = [ex for ex in examples if ex.x.lower() in val_keys]
    return train, val
