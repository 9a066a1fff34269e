"""Step-labelled solutions written in the interchange formats of process reward models (PRMs), so that labels read
here (`dataset_rows.read_step_labels`) or made by a task's step checker can train or evaluate PRMs elsewhere:

- ProcessBench's JSON lines: `id`, `problem`, `steps`, `label` (the index of the first wrong step, -1 when none
  is) and `final_answer_correct`;
- TRL's stepwise supervision (the `PRMTrainer` format): `prompt`, `completions` (one string per step) and `labels`
  (one boolean per step), as JSON lines or as a `datasets.Dataset`.

`read_step_records` reads either back, as well as every other layout `read_step_labels` reads. Files are written
whole or not at all (`atomic_files`), so an interrupted export never leaves a truncated file behind.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable, Sequence

from refiner_jax import atomic_files
from refiner_jax.tasks import dataset_rows, prm800k


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One solution's steps and where they first go wrong: `first_error` is the index of the first wrong step, -1
    when none is (ProcessBench's `label`); `final_answer_correct` is None when unknown. Steps after the first error
    may be kept, as ProcessBench keeps them; this package's readers stop at the first error."""

    problem: str
    steps: tuple[str, ...]
    first_error: int
    final_answer_correct: bool | None = None
    uid: str = ""

    def __post_init__(self):
        if not isinstance(self.problem, str):
            raise ValueError(f"problem is {type(self.problem).__name__}; expected a string")
        if (not isinstance(self.steps, tuple) or not self.steps
                or not all(isinstance(s, str) and s.strip() for s in self.steps)):
            raise ValueError(f"steps is {self.steps!r:.80}; expected a non-empty tuple of non-empty strings")
        if type(self.first_error) is not int or not -1 <= self.first_error < len(self.steps):
            raise ValueError(f"first_error is {self.first_error!r}; expected the index of the first wrong step, "
                             f"below {len(self.steps)}, or -1 when none is")
        if self.final_answer_correct is not None and type(self.final_answer_correct) is not bool:
            raise ValueError(f"final_answer_correct is {self.final_answer_correct!r}; expected True, False or None")

    @property
    def labels(self) -> tuple[bool, ...]:
        """TRL's per-step labels: True before the first error, False at it and at every step after it (a step that
        builds on a wrong one is not a right step of the solution, the prefix labels a PRM trains on)."""
        wrong_from = len(self.steps) if self.first_error < 0 else self.first_error
        return tuple(i < wrong_from for i in range(len(self.steps)))

    @classmethod
    def from_labels(cls, problem: str, steps: Sequence[str], labels: Sequence[bool],
                    final_answer_correct: bool | None = None, uid: str = "") -> StepRecord:
        """The record of per-step labels, prefix labels or each step's own correctness alike: the first False is
        the first error."""
        labels = [bool(v) for v in labels]
        if len(labels) != len(steps):
            raise ValueError(f"{len(labels)} labels for {len(steps)} steps; expected one label per step")
        first_error = labels.index(False) if False in labels else -1
        return cls(problem, tuple(steps), first_error, final_answer_correct, uid)

    @classmethod
    def from_solution(cls, solution: prm800k.LabelledSolution) -> StepRecord:
        """The record of a solution as read (steps kept as they are; its outcome as `final_answer_correct`)."""
        return cls.from_labels(solution.question, solution.steps, solution.labels, solution.outcome, solution.uid)


def processbench_row(record: StepRecord, index: int) -> dict:
    """ProcessBench's row of a record; `id` is the record's uid, else its index in the file."""
    return {"id": record.uid or str(index), "problem": record.problem, "steps": list(record.steps),
            "label": record.first_error, "final_answer_correct": record.final_answer_correct}


def trl_row(record: StepRecord) -> dict:
    """TRL's stepwise-supervision row of a record."""
    return {"prompt": record.problem, "completions": list(record.steps), "labels": list(record.labels)}


def write_processbench(path: str | os.PathLike, records: Iterable[StepRecord]) -> None:
    """`records` as ProcessBench JSON lines at `path`, written atomically."""
    _write_lines(path, (processbench_row(r, i) for i, r in enumerate(records)))


def write_trl_stepwise(path: str | os.PathLike, records: Iterable[StepRecord]) -> None:
    """`records` as TRL stepwise-supervision JSON lines at `path`, written atomically (`datasets` reads it with
    `load_dataset("json", data_files=...)`)."""
    _write_lines(path, (trl_row(r) for r in records))


def trl_stepwise_dataset(records: Iterable[StepRecord]):
    """`records` as a `datasets.Dataset` with TRL's stepwise-supervision columns (`prompt`: string, `completions`:
    strings, `labels`: booleans), typed even when empty, ready for TRL's `PRMTrainer`."""
    import datasets  # only this writer needs it

    features = datasets.Features({"prompt": datasets.Value("string"),
                                  "completions": datasets.Sequence(datasets.Value("string")),
                                  "labels": datasets.Sequence(datasets.Value("bool"))})
    rows = [trl_row(r) for r in records]
    return datasets.Dataset.from_dict({name: [row[name] for row in rows] for name in features}, features=features)


def read_step_records(source: str | os.PathLike, neutral: str = "positive") -> list[StepRecord]:
    """The records of any step-label source `dataset_rows.read_step_labels` reads (ProcessBench, TRL stepwise,
    Math-Shepherd, PRM800K; a file, a folder of data files or a hub dataset). Steps end at the first error, and
    `final_answer_correct` is the outcome as read: False once a step is wrong, None when the source does not say."""
    return [StepRecord.from_solution(s) for s in dataset_rows.read_step_labels(os.fspath(source), neutral)]


def _write_lines(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    with atomic_files.atomic_open(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
