"""The GSM8K step rule (`check_steps`), behind the oracle and the process labels: each calculator annotation
`<<expr=result>>` must compute and use only numbers known at that point (the question's numbers and number words,
common constants, the numbers the gold solution brings in, earlier results), and an answer step must give the gold
answer."""
from __future__ import annotations

import dataclasses
import re
from fractions import Fraction
from typing import Sequence

from refiner_jax.tasks.gsm8k.answers import answers_match, extract_answer, has_answer_marker
from refiner_jax.tasks.gsm8k.calculator import CalcError, _literal_value, evaluate_expression, parse_number

# Numbers a step may use without deriving them: small integers and common unit/percentage conversions.
CONSTANTS = frozenset(
    [Fraction(i) for i in range(13)]
    + [Fraction(v) for v in (16, 24, 30, 52, 60, 100, 365, 1000, 3600)]
    + [Fraction(v) for v in ("0.01", "0.1", "0.25", "0.5", "0.75", "1.5")]
)

# Number words in questions and the values they make available (fractions words give both forms).
NUMBER_WORDS: dict[str, tuple[Fraction, ...]] = {
    **{w: (Fraction(v),) for w, v in (
        ("thirteen", 13), ("fourteen", 14), ("fifteen", 15), ("sixteen", 16), ("seventeen", 17),
        ("eighteen", 18), ("nineteen", 19), ("twenty", 20), ("thirty", 30), ("forty", 40), ("fifty", 50),
        ("sixty", 60), ("seventy", 70), ("eighty", 80), ("ninety", 90), ("hundred", 100), ("thousand", 1000),
        ("million", 1_000_000), ("dozen", 12), ("dozens", 12), ("score", 20), ("twice", 2), ("double", 2),
        ("triple", 3), ("thrice", 3), ("quadruple", 4))},
    "half": (Fraction(2), Fraction(1, 2)),
    "third": (Fraction(3), Fraction(1, 3)),
    "quarter": (Fraction(4), Fraction(1, 4)),
    "fifth": (Fraction(5), Fraction(1, 5)),
    "tenth": (Fraction(10), Fraction(1, 10)),
    "percent": (Fraction(100), Fraction(1, 100)),
}

_ANNOTATION = re.compile(r"<<([^<>]*)>>")
# Unsigned number literals with optional thousands commas. Digit runs are bounded so that no literal exceeds
# Python's integer-string conversion limit (a longer run simply reads as several numbers).
_NUMBER = re.compile(r"\d{1,300}(?:,\d{3}){0,30}(?:\.\d{1,300})?|\.\d{1,300}")
_VISIBLE_RESULT = re.compile(r"\s?[$€£]?\s?(-?(?:\d{1,300}(?:,\d{3}){0,30}(?:\.\d{1,300})?|\.\d{1,300}))")


def strip_annotations(text: str) -> str:
    """The solution without its calculator annotations (every `<<...>>` removed)."""
    return _ANNOTATION.sub("", text)


@dataclasses.dataclass(frozen=True)
class Annotation:
    """One `<<expr=result>>` span of a step: character offsets `[start, end)` in the step, its parts, and the
    number written right after it (the visible result), if any."""

    start: int
    end: int
    expr: str
    result: str
    visible: str | None


def parse_annotations(step: str) -> list[Annotation]:
    """The calculator annotations of one step, in order (`result` is "" when the `=` is missing)."""
    out = []
    for m in _ANNOTATION.finditer(step):
        expr, eq, result = m.group(1).rpartition("=")
        if not eq:
            expr, result = m.group(1), ""
        vis = _VISIBLE_RESULT.match(step, m.end())
        out.append(Annotation(m.start(), m.end(), expr, result.strip(), vis.group(1) if vis else None))
    return out


def question_numbers(question: str) -> frozenset[Fraction]:
    """Numbers a question makes available: its literals (and each /100), and its number words."""
    out: set[Fraction] = set()
    for m in _NUMBER.finditer(question):
        v = _literal_value(m.group())
        out.update((v, v / 100))
    for word in re.findall(r"[a-z]+", question.lower()):
        out.update(NUMBER_WORDS.get(word, ()))
    return frozenset(out)


def _text_numbers(text: str) -> set[Fraction]:
    return {_literal_value(m.group()) for m in _NUMBER.finditer(text)}


def _result_holds(value: Fraction, result: Fraction, result_text: str) -> bool:
    if value == result:
        return True
    decimals = len(result_text.split(".", 1)[1]) if "." in result_text else 0
    return decimals >= 2 and abs(value - result) <= Fraction(1, 2 * 10 ** decimals)


@dataclasses.dataclass(frozen=True)
class StepCheck:
    """The verdict on one step: `kind` is None when correct, else "calculation", "operand" or "answer"."""

    kind: str | None = None
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.kind is None


def split_solution(solution: str) -> list[str]:
    """The non-empty lines of a solution, stripped."""
    return [line.strip() for line in solution.split("\n") if line.strip()]


def gold_numbers(gold_solution: str) -> frozenset[Fraction]:
    """Numbers a gold solution brings in: operands of its annotations that no earlier annotation computed
    (world knowledge such as 31 days, or a number it states, as in `<<55=55>>`)."""
    computed: set[Fraction] = set()
    brought: set[Fraction] = set()
    for step in gold_solution.split("\n"):
        for ann in parse_annotations(step):
            brought.update(v for v in map(_literal_value, _NUMBER.findall(ann.expr)) if v not in computed)
            result = parse_number(ann.result)
            if result is not None:
                computed.add(abs(result))
    return frozenset(brought)


def check_steps(question: str, steps: Sequence[str], gold_answer: str | None, strict: bool = False,
                extra_known: frozenset[Fraction] = frozenset()) -> list[StepCheck]:
    """Per-step verdicts (`gold_answer` None: answers are not judged; `strict`: answers are extracted and
    compared by the upstream string rule; `extra_known`: more numbers a step may use, e.g. `gold_numbers`).

    Walking the steps in order with a set of *known* numbers, initially `question_numbers(question)`, `CONSTANTS`
    and `extra_known`:

    1. every annotation must be well formed (`<<expr=result>>`), `expr` must evaluate, and `result` must equal its
       value exactly, or, when `result` shows at least two decimals, equal it rounded to the decimals shown;
    2. a number written right after an annotation (the visible copy of the result, `>>24`) must equal the result;
    3. every number literal in `expr` (sign ignored) must be known;
    4. after the step, its annotation results and the numbers in its text outside annotations become known;
    5. a step with the answer marker is correct only if it also passes 1-3 and its answer equals the gold answer.

    A step without annotations and without an answer is correct. Earlier results count as known even when they
    are wrong, so one mistake is blamed on the step that makes it, not on every later step that uses it.
    """
    known = set(question_numbers(question)) | CONSTANTS | extra_known
    out = []
    for step in steps:
        verdict = _check_annotations(step, known)
        if verdict.ok and gold_answer is not None and has_answer_marker(step):
            answer = extract_answer(step, strict=strict)
            if answer is None:
                verdict = StepCheck("answer", "missing")
            elif not answers_match(answer, gold_answer, strict=strict):
                verdict = StepCheck("answer", answer)
        out.append(verdict)
        for ann in parse_annotations(step):
            value = parse_number(ann.result)
            if value is not None:
                known.add(abs(value))
        known |= _text_numbers(_ANNOTATION.sub(" ", step))
    return out


def _check_annotations(step: str, known: set[Fraction]) -> StepCheck:
    operand_error = None
    for ann in parse_annotations(step):
        result = parse_number(ann.result)
        if result is None:
            return StepCheck("calculation", ann.expr)
        try:
            value = evaluate_expression(ann.expr)
        except CalcError:
            return StepCheck("calculation", ann.expr)
        if not _result_holds(value, result, ann.result.replace(",", "")):
            return StepCheck("calculation", ann.expr)
        if ann.visible is not None and parse_number(ann.visible) != result:
            return StepCheck("calculation", ann.expr)
        if operand_error is None:
            for m in _NUMBER.finditer(ann.expr):
                if _literal_value(m.group()) not in known:
                    operand_error = StepCheck("operand", m.group())
                    break
    return operand_error or StepCheck()
