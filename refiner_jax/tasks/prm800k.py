"""PRM800K-style step-label files (openai/prm800k) as process reward-model training records.

Data: JSON lines, one labelled solution per line: `question.problem` and `label.steps`, where each step offers
`completions` (each with `text` and a `rating`: -1 wrong, 0 neutral (not wrong but no progress), +1 good, or null
when unrated), an optional `human_completion` and the index `chosen_completion` the solution continues with.
`label.finish_reason` says why labelling ended ("solution", "found_error", "give_up", ...).

Reading one solution, step by step:
- `chosen_completion` set: the step is that completion (it must have a rating);
- else `human_completion` set (an object with `text`, or the text itself): the step is the human's text, rated +1
  when its rating is null;
- else labelling stopped here: the step is the first lowest-rated completion (the one that ended the solution,
  usually -1 under "found_error"), if any completion is rated, and reading stops.
Reading also stops after the first step whose label is wrong: labellers stop at the first error.

A 0 rating maps by `neutral`: "positive" counts the step correct, "negative" counts it wrong, "skip" drops the
step from the solution entirely (its text is neither kept nor scored). Quality-control and screening lines are
skipped by default, as are solutions left with no steps (e.g. a first step flagged as a bad question).
"""
from __future__ import annotations

import dataclasses
import gzip
import pathlib

from refiner_jax.tasks.base import DataError, json_objects, raise_problems

NEUTRAL_MODES = ("positive", "negative", "skip")
RATINGS = (-1, 0, 1)


@dataclasses.dataclass(frozen=True)
class LabelledSolution:
    """One labelled solution: its steps, their raw ratings (a null human rating reads as 1), the prefix labels a
    PRM trains on (step i is True iff every step up to and including i is correct) and the outcome: True iff every
    step is correct and the solution was finished ("solution"), None when the file gives no finish_reason."""

    uid: str
    question: str
    steps: tuple[str, ...]
    ratings: tuple[int, ...]
    labels: tuple[bool, ...]
    outcome: bool | None

    @property
    def text(self) -> str:
        """The solution text: its steps, one per line (each step is one span)."""
        return "\n".join(self.steps)


def _rating(value, where: str) -> int | None:
    if value is not None and (type(value) is not int or value not in RATINGS):
        raise DataError(f"{where} has rating {value!r}; ratings are -1, 0, 1 or null (PRM800K)")
    return value


def _text(completion, where: str) -> str:
    text = completion.get("text")
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{where} has no text; expected a non-empty string 'text'")
    return text


def _solution_steps(steps, where: str) -> list[tuple[str, int]]:
    """(text, rating) of the steps the solution went through, up to where labelling stopped; raises DataError."""
    out = []
    for k, step in enumerate(steps, start=1):
        at = f"{where}: step {k}"
        if not isinstance(step, dict):
            raise DataError(f"{at} is not an object; expected 'completions', 'human_completion', 'chosen_completion'")
        completions = [] if step.get("completions") is None else step["completions"]
        if not isinstance(completions, list) or not all(isinstance(c, dict) for c in completions):
            raise DataError(f"{at}: 'completions' is not a list of objects")
        rated = [(_rating(c.get("rating"), f"{at} completion {i}"), i) for i, c in enumerate(completions)]
        chosen, human = step.get("chosen_completion"), step.get("human_completion")
        if chosen is not None:
            if type(chosen) is not int or not 0 <= chosen < len(completions):
                raise DataError(f"{at} has chosen_completion {chosen!r}; expected null or an index below "
                                f"{len(completions)} (its number of completions)")
            if rated[chosen][0] is None:
                raise DataError(f"{at}: the chosen completion {chosen} has no rating; expected -1, 0 or 1")
            out.append((_text(completions[chosen], f"{at} completion {chosen}"), rated[chosen][0]))
        elif human is not None:
            human = {"text": human} if isinstance(human, str) else human
            if not isinstance(human, dict):
                raise DataError(f"{at}: 'human_completion' is not an object; expected null or {{'text', 'rating'}}")
            rating = _rating(human.get("rating"), f"{at} human completion")
            out.append((_text(human, f"{at} human completion"), 1 if rating is None else rating))
        else:
            rated = [(r, i) for r, i in rated if r is not None]
            if rated:
                rating, i = min(rated)
                out.append((_text(completions[i], f"{at} completion {i}"), rating))
            break
        if out[-1][1] < 0:
            break
    return out


def read_prm800k(path, neutral: str = "positive", skip_quality_control: bool = True,
                 max_records: int | None = None, row_reader=None) -> list[LabelledSolution]:
    """The labelled solutions of a PRM800K-style `.jsonl` (or `.jsonl.gz`) file, in file order, at most
    `max_records`; `DataError` names the file and each bad line. `row_reader(row, where, uid, neutral)` reads other
    layouts' lines (`dataset_rows.step_label_row`)."""
    if neutral not in NEUTRAL_MODES:
        raise ValueError(f"unknown neutral mode {neutral!r}; choose one of {NEUTRAL_MODES}")
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found; expected PRM800K step labels: JSON lines (.jsonl or .jsonl.gz), "
                        "one labelled solution per line with 'question' and 'label'")
    stem = path.name.removesuffix(".gz").removesuffix(".jsonl")
    records: list[LabelledSolution] = []
    problems: list[str] = []
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for lineno, row in json_objects(f, str(path), "an object with 'question' and 'label' (PRM800K)",
                                            problems=problems):
                if max_records is not None and len(records) >= max_records:
                    break
                where, uid = f"{path}:{lineno}", f"{stem}:{lineno}"
                try:
                    record = (solution_from_row(row, where, uid, neutral, skip_quality_control) if row_reader is None
                              else row_reader(row, where, uid, neutral))
                except DataError as e:
                    problems.append(str(e))
                    continue
                if record is not None:
                    records.append(record)
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: not a readable JSON lines file ({e}); expected .jsonl or gzipped .jsonl.gz") from e
    raise_problems(problems, str(path))
    return records


def solution_from_row(row: dict, where: str, uid: str, neutral: str,
                      skip_quality_control: bool) -> LabelledSolution | None:
    """One PRM800K line's solution; None for a skipped line (quality control, screening) or a solution with no
    steps."""
    if skip_quality_control and (row.get("is_quality_control_question") or row.get("is_initial_screening_question")):
        return None
    question, label = row.get("question"), row.get("label")
    if not isinstance(question, dict) or not isinstance(question.get("problem"), str):
        raise DataError(f"{where}: no 'question' with a string 'problem'; expected PRM800K's question object")
    if not isinstance(label, dict) or not isinstance(label.get("steps"), list):
        raise DataError(f"{where}: no 'label' with a list 'steps'; expected PRM800K's label object")
    return labelled_solution(uid, question["problem"], _solution_steps(label["steps"], where),
                             label.get("finish_reason"), neutral)


def labelled_solution(uid: str, question: str, rated: list[tuple[str, int]], finish: str | None,
                      neutral: str) -> LabelledSolution | None:
    """The solution of (text, rating) steps as a PRM reads it: 0 ratings mapped by `neutral`, cut after the first
    wrong step; None when no step is left. `finish` is PRM800K's finish_reason ("solution": finished)."""
    kept = [(text, r) for text, r in rated if not (r == 0 and neutral == "skip")]
    if not kept:
        return None
    correct = [r > 0 or (r == 0 and neutral == "positive") for _, r in kept]
    if False in correct:  # labelling stops at the first wrong step (a 0 under "negative" counts)
        end = correct.index(False) + 1
        kept, correct = kept[:end], correct[:end]
    labels = tuple(all(correct[:i + 1]) for i in range(len(correct)))
    outcome = False if not all(correct) else None if finish is None else finish == "solution"
    return LabelledSolution(uid, question, tuple(t for t, _ in kept), tuple(r for _, r in kept), labels, outcome)
