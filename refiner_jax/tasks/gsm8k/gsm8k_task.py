"""`GSM8KTask`: GSM8K (grade-school math word problems) as a REFINER / reward-model task.

Data: `{"question", "answer"}` JSON lines (`train.jsonl`, `test.jsonl`); a gold answer is newline-separated steps
with calculator annotations `<<expr=result>>` and a last line `#### N`. An example's `x` is the question, `z` the
full gold solution (the generator target), `y` the normalised final answer. `load("train")` is train.jsonl minus a
seeded held-out slice of `val_size` problems that `load("val")` returns (`val_size=0` keeps the whole file as
train); `load("test")` is test.jsonl. Steps are the non-empty lines of a solution, judged by
`step_check.check_steps`; the gold solution itself is correct on every step. `step_labels` gives prefix
correctness (process labels), `step_correctness` the per-step values, `outcome_label` the final-answer check.
"""
from __future__ import annotations

import dataclasses
import pathlib
import random
import re
from fractions import Fraction
from typing import Sequence

from refiner_jax.tasks import data_sources, dataset_rows
from refiner_jax.tasks.base import (NO_HINT, DataError, Example, Feedback, StepError, Task, json_objects,
                                    raise_problems, shared_data_dir)
from refiner_jax.tasks.gsm8k.answers import _answer_value, answers_match, extract_answer, has_answer_marker
from refiner_jax.tasks.gsm8k.calculator import (CalcError, _literal_value, evaluate_expression, format_number,
                                                parse_number)
from refiner_jax.tasks.gsm8k.step_check import (CONSTANTS, _NUMBER, _VISIBLE_RESULT, StepCheck, check_steps,
                                                gold_numbers, parse_annotations, question_numbers, split_solution)

SPLIT_FILES = {"train": "train.jsonl", "val": "train.jsonl", "test": "test.jsonl"}


def default_data_dir() -> pathlib.Path:
    """`$REFINER_DATA/gsm8k`, else the shared datasets beside the checkout (`../shared/data/gsm8k`)."""
    return pathlib.Path(shared_data_dir("gsm8k"))


def read_jsonl(path: pathlib.Path) -> list[dict]:
    """GSM8K records of one file, validated; `DataError` names the file, line and what was expected."""
    if not path.is_file():
        raise DataError(f"{path}: file not found; expected GSM8K JSON lines with 'question' and 'answer' "
                        "(pass data_dir= or set REFINER_DATA)")
    rows, problems = [], []
    with open(path, "rb") as f:
        for lineno, row in json_objects(f, str(path), "one object per line with 'question' and 'answer'",
                                        problems=problems):
            try:
                rows.append(checked_record(row, f"{path}:{lineno}"))
            except DataError as e:
                problems.append(str(e))
    raise_problems(problems, str(path))
    if not rows:
        raise DataError(f"{path}: no records; expected GSM8K JSON lines with 'question' and 'answer'")
    return rows


def checked_record(row: dict, where: str) -> dict:
    """`row` when it is a GSM8K record (string 'question' and 'answer', the answer ending in '#### <number>');
    else `DataError` naming `where` and the field."""
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str):
            got = "missing" if row.get(key) is None else f"a {type(row[key]).__name__}"
            raise DataError(f"{where}: field '{key}' is {got}; expected an object with string fields 'question' and "
                            "'answer'")
    if extract_answer(row["answer"], strict=True) is None:
        raise DataError(f"{where}: the 'answer' has no final '#### <number>' line")
    return row


def _dataset_records(source: str, split: str) -> list[dict]:
    """GSM8K records of `split` from data files or a hub dataset (`data_sources`)."""
    where, rows = data_sources.split_rows(source, split)
    records, problems = [], []
    for i, row in enumerate(rows):
        try:
            records.append(checked_record(dataset_rows.gsm8k_record(row), f"{where}: row {i + 1}"))
        except DataError as e:
            problems.append(str(e))
    raise_problems(problems, where)
    if not records:
        raise DataError(f"{where}: no records; expected GSM8K rows with 'question' and 'answer'")
    return records


class GSM8KTask(Task):
    """GSM8K with the step rule of `step_check.check_steps`, and the oracle feedback and perturbations described
    by their methods."""

    name = "gsm8k"
    error_kinds = ("calculation", "operand", "answer")
    primary_metric = "accuracy"
    perturbation_kinds = ("result", "operand", "drop")

    def __init__(self, no_change_rate: float = 0.2, val_size: int = 500, seed: int = 0, strict: bool = False,
                 data_dir: str | None = None):
        if not 0.0 <= no_change_rate <= 1.0:
            raise ValueError(f"no_change_rate must be in [0, 1], got {no_change_rate}")
        if val_size < 0:
            raise ValueError(f"val_size must be >= 0, got {val_size}")
        self.no_change_rate, self.val_size, self.seed, self.strict = no_change_rate, val_size, seed, strict
        self.data_dir = data_dir

    # -- data

    def load(self, split: str, data_dir: str | None = None, **kwargs) -> list[Example]:
        if split not in SPLIT_FILES:
            raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLIT_FILES)}")
        if kwargs:
            raise TypeError(f"unexpected options {sorted(kwargs)}; set val_size/seed on the task")
        root = str(data_dir or self.data_dir or default_data_dir())
        file_split = "test" if split == "test" else "train"
        if data_sources.reads_own_files(root, set(SPLIT_FILES.values())):
            where = pathlib.Path(root) / SPLIT_FILES[split]
            rows = read_jsonl(where)
        else:
            where, rows = root, _dataset_records(root, file_split)
        indices = list(range(len(rows)))
        if split in ("train", "val"):
            if self.val_size >= len(rows):
                raise DataError(f"{where}: {len(rows)} problems cannot spare val_size="
                                f"{self.val_size} for validation")
            held_out = set(random.Random(self.seed).sample(indices, self.val_size))
            indices = sorted(held_out) if split == "val" else [i for i in indices if i not in held_out]
        return [self._example(f"gsm8k-{file_split}-{i}", rows[i]) for i in indices]

    @staticmethod
    def _example(uid: str, row: dict) -> Example:
        return Example(uid=uid, x=row["question"].strip(), z=row["answer"].strip(),
                       y=extract_answer(row["answer"]) or "",
                       meta={"answer_strict": extract_answer(row["answer"], strict=True)})

    # -- texts

    @staticmethod
    def target(example: Example) -> str:
        return example.z

    def critic_input(self, example: Example, hypothesis: str) -> str:
        """Question and solution separated by a newline (the GSM8K prompt layout), so step lines stay visible."""
        return f"{example.x}\n{hypothesis}"

    def split_steps(self, hypothesis: str) -> list[str]:
        return split_solution(hypothesis)

    # -- checking

    def _gold(self, example: Example) -> str | None:
        return example.meta.get("answer_strict") if self.strict else example.y

    def step_correctness(self, example: Example, hypothesis: str) -> list[bool]:
        """Per-step correctness (not prefix-accumulated), aligned with `split_steps`."""
        return [c.ok for c in self._checks(example, hypothesis)]

    def step_labels(self, example: Example, hypothesis: str) -> list[bool]:
        """Process labels: step i is correct iff steps 0..i all are."""
        labels, all_ok = [], True
        for ok in self.step_correctness(example, hypothesis):
            all_ok = all_ok and ok
            labels.append(all_ok)
        return labels

    def outcome_label(self, example: Example, solution: str) -> bool:
        """Outcome label: the solution's final answer equals the gold one (strict string rule if `strict`)."""
        return answers_match(extract_answer(solution, strict=self.strict), self._gold(example), self.strict)

    def answer_key(self, example: Example, solution: str) -> str | Fraction | None:
        """The final answer as a number (`Fraction`), or as written with `strict`; None when there is none."""
        answer = extract_answer(solution, strict=self.strict) if isinstance(solution, str) else None
        if answer is None or self.strict:
            return answer
        return _answer_value(answer)

    def _checks(self, example: Example, hypothesis: str) -> list[StepCheck]:
        steps = self.split_steps(hypothesis)
        if steps == self.split_steps(example.z):
            return [StepCheck()] * len(steps)  # the gold solution is correct by definition
        return check_steps(example.x, steps, self._gold(example), self.strict, gold_numbers(example.z))

    def oracle_feedback(self, example: Example, hypothesis: str) -> Feedback:
        """Every failing step ("The calculation in step k is incorrect.", "The number v in step k is
        incorrect.", "The final answer is incorrect.") plus "The final answer is missing." when no step gives
        one; step numbers in the text are 1-based, `StepError.step` is the 0-based index."""
        errors, sentences = [], []
        checks = self._checks(example, hypothesis)
        for i, check in enumerate(checks):
            if check.kind == "calculation":
                sentences.append(f"The calculation in step {i + 1} is incorrect.")
            elif check.kind == "operand":
                sentences.append(f"The number {check.detail} in step {i + 1} is incorrect.")
            elif check.kind == "answer":
                sentences.append("The final answer is missing." if check.detail == "missing"
                                 else "The final answer is incorrect.")
            if check.kind:
                errors.append(StepError(check.kind, i, check.detail))
        if not any(has_answer_marker(s) for s in self.split_steps(hypothesis)):
            errors.append(StepError("answer", None, "missing"))
            sentences.append("The final answer is missing.")
        if not errors:
            return Feedback((), NO_HINT)
        return Feedback(tuple(errors), " ".join(sentences))

    # -- metrics

    def score(self, predictions: Sequence[str], examples: Sequence[Example]) -> dict[str, float]:
        """Means over examples: `accuracy` (normalised answers), `strict_accuracy` (upstream string rule),
        `answered` (an answer could be extracted), `step_accuracy` (mean per-step correctness), `trace_valid`
        (every step correct and an answer given) and `trace_error` (among correct answers, the share with a
        failing step, Uesato et al.'s "right answer, wrong reasoning"; 0 when no answer is correct)."""
        if len(predictions) != len(examples):
            raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples")
        if not examples:
            return {}
        n = len(examples)
        correct = [answers_match(extract_answer(p), e.y) for p, e in zip(predictions, examples)]
        checks = [self._checks(e, p) for p, e in zip(predictions, examples)]
        traces = [bool(c) and all(v.ok for v in c) and extract_answer(p) is not None
                  for c, p in zip(checks, predictions)]
        bad_steps = [any(v.kind in ("calculation", "operand") for v in c) for c in checks]
        n_correct = sum(correct)
        return {
            "accuracy": n_correct / n,
            "strict_accuracy": sum(answers_match(extract_answer(p, strict=True), e.meta.get("answer_strict"), True)
                                   for p, e in zip(predictions, examples)) / n,
            "answered": sum(extract_answer(p) is not None for p in predictions) / n,
            "step_accuracy": sum(sum(v.ok for v in c) / len(c) if c else 0.0 for c in checks) / n,
            "trace_valid": sum(traces) / n,
            "trace_error": sum(b for b, ok in zip(bad_steps, correct) if ok) / n_correct if n_correct else 0.0,
        }

    # -- perturbation

    def perturb(self, example: Example, rng: random.Random) -> tuple[str, Feedback]:
        """The gold solution (at rate `no_change_rate`) or one with a wrong calculator result, a wrong operand
        or a dropped step; later steps use the changed value consistently, as a model carrying its mistake
        forward would. The feedback is the oracle's verdict on the result."""
        gold = example.z
        if rng.random() < self.no_change_rate:
            return gold, self.oracle_feedback(example, gold)
        kinds = list(self.perturbation_kinds)
        rng.shuffle(kinds)
        for kind in kinds + ["answer"]:
            candidate = self._perturbed(example, kind, rng)
            if candidate is not None and candidate != gold:
                feedback = self.oracle_feedback(example, candidate)
                if not feedback.ok:
                    return candidate, feedback
        return gold, self.oracle_feedback(example, gold)

    def _perturbed(self, example: Example, kind: str, rng: random.Random) -> str | None:
        lines = example.z.split("\n")
        sites = [(i, j) for i, line in enumerate(lines) for j in range(len(parse_annotations(line)))]
        if kind == "answer":
            answer = _answer_value(example.y)
            if answer is None:
                return None
            changed = {answer: _wrong_value(answer, {answer}, rng)}
            return "\n".join(_rebuild_answer(line, changed) if has_answer_marker(line) else line for line in lines)
        if kind == "drop":
            droppable = sorted({i for i, _ in sites if not has_answer_marker(lines[i])})
            if len(droppable) < 2:
                return None
            drop = rng.choice(droppable[:-1])  # keep the last computation: its loss is only an answer error
            return "\n".join(line for i, line in enumerate(lines) if i != drop)
        if not sites:
            return None
        line_idx, ann_idx = rng.choice(sites)
        ann = parse_annotations(lines[line_idx])[ann_idx]
        if kind == "result":
            old = parse_number(ann.result)
            if old is None:
                return None
            override = _Override(ann_idx, result=_wrong_value(old, {old}, rng))
        else:
            operands = list(_NUMBER.finditer(ann.expr))
            if not operands:
                return None
            op = rng.choice(operands)
            old_operand = _literal_value(op.group())
            known = set(question_numbers(example.x)) | CONSTANTS | gold_numbers(example.z)
            new_operand = _wrong_value(old_operand, known | {old_operand}, rng)
            new_expr = ann.expr[:op.start()] + format_number(new_operand) + ann.expr[op.end():]
            override = _Override(ann_idx, expr=new_expr, operand=(old_operand, new_operand))
        changed: dict[Fraction, Fraction] = {}
        for i in range(line_idx, len(lines)):
            if has_answer_marker(lines[i]):
                lines[i] = _rebuild_answer(lines[i], changed)
            else:
                lines[i] = _rebuild_line(lines[i], changed, override if i == line_idx else None)
        return "\n".join(lines)


def _wrong_value(value: Fraction, avoid: set[Fraction], rng: random.Random) -> Fraction:
    """A plausible wrong number near `value` (off by a little, or by a factor), not in `avoid`."""
    candidates = [value + d for d in (1, -1, 2, -2, 10, -10)] + [value * 2, value / 2, value * 10]
    if value == 0:
        candidates = [Fraction(v) for v in (1, 2, 3, 5, 10)]
    fresh = [c for c in candidates if c not in avoid and c != value and (c >= 0 or value < 0)]
    pool = fresh or [c for c in candidates if c != value]
    return rng.choice(pool)


def _substitute(text: str, changed: dict[Fraction, Fraction]) -> str:
    """`text` with every number literal whose value was changed written with its new value."""
    def sub(m: re.Match) -> str:
        value = _literal_value(m.group())
        return format_number(changed[value]) if value in changed else m.group()
    return _NUMBER.sub(sub, text)


@dataclasses.dataclass(frozen=True)
class _Override:
    """The initial mistake in one annotation: a forced (wrong) `result`, or a new `expr` whose changed
    `operand` (old, new) is also rewritten in the text copy before the annotation."""

    index: int
    result: Fraction | None = None
    expr: str | None = None
    operand: tuple[Fraction, Fraction] | None = None


def _rebuild_line(line: str, changed: dict[Fraction, Fraction], override: _Override | None = None) -> str:
    """`line` with changed values carried through: annotations whose operands changed are recomputed (their new
    results join `changed`), and text copies of expressions and visible results follow."""
    out, pos = [], 0
    for j, ann in enumerate(parse_annotations(line)):
        before = _substitute(line[pos:ann.start], changed)
        old = parse_number(ann.result)
        expr, new = _substitute(ann.expr, changed), None
        if override is not None and j == override.index:
            if override.result is not None:
                new = override.result
            else:
                expr = override.expr
                old_op, new_op = override.operand
                copies = [m for m in _NUMBER.finditer(before) if _literal_value(m.group()) == old_op]
                if copies:
                    m = copies[-1]
                    before = before[:m.start()] + format_number(new_op) + before[m.end():]
        if new is None and expr != ann.expr:
            try:
                new = evaluate_expression(expr)
            except CalcError:
                new = None
        pos = ann.end
        if new is None or old is None:
            out.append(before + line[ann.start:ann.end])
            continue
        if new != old:
            changed[old] = new
        out.append(f"{before}<<{expr}={format_number(new)}>>")
        vis = _VISIBLE_RESULT.match(line, ann.end)
        if vis is not None and parse_number(vis.group(1)) == old:
            out.append(line[ann.end:vis.start(1)] + format_number(new))
            pos = vis.end(1)
    out.append(_substitute(line[pos:], changed))
    return "".join(out)


def _rebuild_answer(line: str, changed: dict[Fraction, Fraction]) -> str:
    """The answer line with its number replaced when that value was changed."""
    answer = extract_answer(line)
    value = _answer_value(answer) if answer else None
    if value not in changed:
        return line
    marker = "####" if "####" in line else "A:"
    return f"{marker} {format_number(changed[value])}"
