"""GSM8K (grade-school math word problems) as a REFINER / reward-model task.

Data: `{"question", "answer"}` JSON lines (`train.jsonl`, 7,473 problems; `test.jsonl`, 1,319). The gold answer
is newline-separated steps with calculator annotations `<<expr=result>>` and a last line `#### N`.

- Example: `x` = question, `z` = the full gold solution (steps and the `#### N` line, i.e. the generator target),
  `y` = the normalised final answer. `load("train")` is train.jsonl minus a seeded held-out slice of `val_size`
  problems that `load("val")` returns (`val_size=0` keeps the whole file as train); `load("test")` is test.jsonl.
- Steps are the non-empty lines of a solution; the line holding the answer marker is the last step.
- Answers (`extract_answer`): the text after the first `####` (or, when there is none, after a line starting
  with `A:`, the format of the released model samples). Normalisation drops `$`/`€`/`£`, thousands commas and a
  `%` sign (the number is kept as written, not divided by 100), ignores words after the number ("18 dollars"),
  reads `a/b` fractions, and writes integers without decimals ("18.0" -> "18"). `strict=True` reproduces the
  upstream grader: the first `#### (-?[0-9.,]+)` match with commas removed, compared as a string.
- Calculator: `evaluate_expression` is a small recursive-descent evaluator over exact fractions (numbers with
  optional decimals and thousands commas, `+ - * /`, parentheses, unary minus/plus); anything else is rejected.
  `calculator_completion` gives what to append when a model has written `<<expr=`, the GSM8K decoding convention.
  The sampler knows no task, so a GSM8K generation loop calls it between its own decode steps; no config here
  trains on GSM8K yet.

Step correctness (`step_correctness`), the rule behind the oracle and the process labels. Walking the steps in
order with a set of *known* numbers, initially the question's numbers, `CONSTANTS` and the numbers the gold
solution brings in (`gold_numbers`: operands of its annotations that none of its annotations computes, e.g. 31
days in a month):

0. the gold solution itself is correct (every step), whatever the rule below says;
1. every annotation must be well formed (`<<expr=result>>`), `expr` must evaluate, and `result` must equal its
   value exactly, or, when `result` shows at least two decimals, equal it rounded to the decimals shown;
2. a number written right after an annotation (the visible copy of the result, `>>24`) must equal the result;
3. every number literal in `expr` (sign ignored) must be known;
4. after the step, its annotation results and the numbers in its text outside annotations become known;
5. a step with the answer marker is correct only if it also passes 1-3 and its answer equals the gold answer.

The question's numbers are its digit literals (with commas/decimals), each also divided by 100 (percentages),
and number words (`NUMBER_WORDS`: "thirteen", "dozen", "half" -> 2 and 0.5, ...). A step without annotations and
without an answer is correct. Earlier results count as known even when they are wrong, so one mistake is blamed
on the step that makes it, not on every later step that uses it. Without the gold's numbers, the rule accepts
98.8% of the gold train calculation lines; with them, all but the two that use floor division (`//`).

`step_labels` returns prefix correctness (process reward-model labels: step i is correct iff steps 0..i are);
`step_correctness` the per-step values; `outcome_label` the final-answer check (outcome reward-model label).
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
import random
import re
from fractions import Fraction
from typing import Sequence

from refiner_jax.tasks.base import (NO_HINT, DataError, Example, Feedback, StepError, json_objects,
                                    shared_data_dir)

SPLIT_FILES = {"train": "train.jsonl", "val": "train.jsonl", "test": "test.jsonl"}

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
_EXPR_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_STRICT_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
_ANSWER_NUMBER = re.compile(r"-?\s*(?:\d{1,300}(?:\.\d{1,300})?|\.\d{1,300})(?:\s*/\s*\d{1,300})?")
_ALT_MARKER = re.compile(r"^\s*A:", re.MULTILINE)

MAX_EXPRESSION_CHARS = 1000
MAX_NESTING = 100
FORMAT_DECIMALS = 6


class CalcError(ValueError):
    """An expression the calculator refuses (unknown symbol, syntax error, division by zero, too long)."""


# ----------------------------------------------------------------------------------------------- calculator


@functools.lru_cache(maxsize=65536)
def _literal_value(literal: str) -> Fraction:
    """The value of an unsigned number literal (thousands commas allowed); cached, literals repeat a lot."""
    return Fraction(literal.replace(",", ""))


def _tokenize_expression(expr: str) -> list[str]:
    expr = re.sub(r"(?<=\d),(?=\d{3})", "", expr)
    tokens, i = [], 0
    while i < len(expr):
        ch = expr[i]
        if ch.isspace():
            i += 1
            continue
        m = _EXPR_NUMBER.match(expr, i)
        if m:
            tokens.append(m.group())
            i = m.end()
        elif ch in "+-*/()":
            tokens.append(ch)
            i += 1
        else:
            raise CalcError(f"unsupported character {ch!r} in {expr!r}")
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ; unary := ('-'|'+') unary | atom ;
    atom := NUMBER | '(' expr ')'."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise CalcError("expression ends too early")
        self.pos += 1
        return tok

    def nest(self):
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise CalcError("expression nested too deeply")

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value = value * self.unary()
            else:
                divisor = self.unary()
                if divisor == 0:
                    raise CalcError("division by zero")
                value = value / divisor
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("-", "+"):
            self.nest()
            sign = self.take()
            value = self.unary()
            self.depth -= 1
            return -value if sign == "-" else value
        return self.atom()

    def atom(self) -> Fraction:
        tok = self.take()
        if tok == "(":
            self.nest()
            value = self.expr()
            if self.take() != ")":
                raise CalcError("missing ')'")
            self.depth -= 1
            return value
        if tok[0].isdigit() or tok[0] == ".":
            return _literal_value(tok)
        raise CalcError(f"unexpected {tok!r}")


def evaluate_expression(expr: str) -> Fraction:
    """Exact value of an arithmetic expression (`+ - * /`, parentheses, unary signs, decimals, thousands
    commas). Raises `CalcError` for anything else."""
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens = _tokenize_expression(expr)
    if not tokens:
        raise CalcError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.peek() is not None:
        raise CalcError(f"unexpected {parser.peek()!r} in {expr!r}")
    return value


def parse_number(text: str) -> Fraction | None:
    """A plain number literal (optional sign, thousands commas, decimals, `$`) as a fraction, else None."""
    if len(text) > 600:
        return None
    m = re.fullmatch(r"\s*[$€£]?\s*(-?)\s*[$€£]?\s*(\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)\s*", text)
    if not m:
        return None
    value = _literal_value(m.group(2).rstrip("."))
    return -value if m.group(1) else value


def format_number(value: Fraction, decimals: int = FORMAT_DECIMALS) -> str:
    """Integers without decimals ("24"), other values rounded to `decimals` places without trailing zeros."""
    if value.denominator == 1:
        return str(value.numerator)
    rounded = round(value, decimals)
    if rounded.denominator == 1:
        return str(rounded.numerator)
    sign = "-" if rounded < 0 else ""
    whole, frac = divmod(abs(rounded), 1)
    digits = str(round(frac * 10 ** decimals)).rjust(decimals, "0").rstrip("0")
    return f"{sign}{whole}.{digits}"


def calculator_completion(text_so_far: str) -> str | None:
    """What to append when `text_so_far` ends with `=` inside an open `<<expr=`: the value of `expr` plus `>>`.

    None when the text does not end inside an open annotation or the expression is not valid arithmetic (then
    the model keeps generating on its own).
    """
    if not text_so_far.endswith("="):
        return None
    start = text_so_far.rfind("<<")
    if start < 0 or ">>" in text_so_far[start:]:
        return None
    expr = text_so_far[start + 2:-1]
    if "=" in expr:
        return None
    try:
        return format_number(evaluate_expression(expr)) + ">>"
    except CalcError:
        return None


def strip_annotations(text: str) -> str:
    """The solution without its calculator annotations (every `<<...>>` removed)."""
    return _ANNOTATION.sub("", text)


# ------------------------------------------------------------------------------------------------- answers


def _canonical(value: Fraction) -> str:
    """Integer, exact terminating decimal, or "a/b"."""
    if value.denominator == 1:
        return str(value.numerator)
    d, twos, fives = value.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d == 1:  # 2^a 5^b denominators terminate after max(a, b) decimals
        return format_number(value, decimals=max(twos, fives))
    return f"{value.numerator}/{value.denominator}"


def _answer_text(text: str) -> str | None:
    pos = text.find("####")
    if pos >= 0:
        return text[pos + 4:].split("\n", 1)[0]
    markers = list(_ALT_MARKER.finditer(text))
    if markers:
        return text[markers[-1].end():].split("\n", 1)[0]
    return None


def extract_answer(text: str, strict: bool = False) -> str | None:
    """The final answer of a solution, or None when it has none (upstream writes "[invalid]").

    `strict=True`: the upstream rule (first `#### (-?[0-9.,]+)`, commas removed, returned as written).
    Otherwise: the normalised number after the answer marker (see the module docstring), e.g. "#### $1,080.00"
    -> "1080", "#### 12.5%" -> "12.5", "A: 6/8" -> "0.75"; non-terminating fractions stay "a/b" ("1/3").
    """
    if strict:
        m = _STRICT_ANSWER.search(text)
        return m.group(1).replace(",", "") if m else None
    tail = _answer_text(text)
    if tail is None:
        return None
    m = _ANSWER_NUMBER.search(re.sub(r"(?<=\d),(?=\d)", "", re.sub(r"[$€£]", "", tail)))
    if not m:
        return None
    literal = re.sub(r"\s+", "", m.group())
    num, _, den = literal.partition("/")
    if den and int(den) == 0:
        return None
    value = Fraction(num) / (int(den) if den else 1)
    return _canonical(value)


def answers_match(predicted: str | None, gold: str | None, strict: bool = False) -> bool:
    """Whether two extracted answers agree: string equality when `strict`, else equal numeric values."""
    if predicted is None or gold is None:
        return False
    if strict:
        return predicted == gold
    p, g = _answer_value(predicted), _answer_value(gold)
    return p is not None and p == g


def _answer_value(answer: str) -> Fraction | None:
    num, _, den = answer.partition("/")
    try:
        value = Fraction(num)
        return value / Fraction(den) if den else value
    except (ValueError, ZeroDivisionError):
        return None


# ------------------------------------------------------------------------------------------ step checking


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


def has_answer_marker(step: str) -> bool:
    return "####" in step or bool(_ALT_MARKER.match(step))


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
    """Per-step verdicts of the rule in the module docstring (`gold_answer` None: answers are not judged;
    `strict`: answers are extracted and compared by the upstream string rule; `extra_known`: more numbers a
    step may use, e.g. `gold_numbers`)."""
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


# ----------------------------------------------------------------------------------------------- the task


def default_data_dir() -> pathlib.Path:
    """`$REFINER_DATA/gsm8k`, else the shared datasets beside the checkout (`../shared/data/gsm8k`)."""
    return pathlib.Path(shared_data_dir("gsm8k"))


def read_jsonl(path: pathlib.Path) -> list[dict]:
    """GSM8K records of one file, validated; `DataError` names the file, line and what was expected."""
    if not path.is_file():
        raise DataError(f"{path}: file not found; expected GSM8K JSON lines with 'question' and 'answer' "
                        "(pass data_dir= or set REFINER_DATA)")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, row in json_objects(f, str(path), "one object per line with 'question' and 'answer'"):
            if not all(isinstance(row.get(k), str) for k in ("question", "answer")):
                raise DataError(f"{path}:{lineno}: expected an object with string fields 'question' and 'answer'")
            if extract_answer(row["answer"], strict=True) is None:
                raise DataError(f"{path}:{lineno}: the 'answer' has no final '#### <number>' line")
            rows.append(row)
    if not rows:
        raise DataError(f"{path}: no records; expected GSM8K JSON lines with 'question' and 'answer'")
    return rows


class GSM8KTask:
    """GSM8K with the step rule, oracle feedback and perturbations described in the module docstring."""

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
        root = pathlib.Path(data_dir or self.data_dir or default_data_dir())
        rows = read_jsonl(root / SPLIT_FILES[split])
        indices = list(range(len(rows)))
        if split in ("train", "val"):
            if self.val_size >= len(rows):
                raise DataError(f"{root / SPLIT_FILES[split]}: {len(rows)} problems cannot spare val_size="
                                f"{self.val_size} for validation")
            held_out = set(random.Random(self.seed).sample(indices, self.val_size))
            indices = sorted(held_out) if split == "val" else [i for i in indices if i not in held_out]
        file_split = "test" if split == "test" else "train"
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

    def orm_step_labels(self, example: Example, solution: str) -> list[bool]:
        """The outcome label repeated on every step (outcome reward-model targets)."""
        return [self.outcome_label(example, solution)] * len(self.split_steps(solution))

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
