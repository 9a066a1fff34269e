"""Final answers of GSM8K solutions (`extract_answer`): the text after the first `####` (or, when there is none,
after a line starting with `A:`, the format of the released model samples). Normalisation drops `$`/`€`/`£`,
thousands commas and a `%` sign (the number is kept as written, not divided by 100), ignores words after the
number ("18 dollars"), reads `a/b` fractions, and writes integers without decimals ("18.0" -> "18"). `strict=True`
reproduces the upstream grader: the first `#### (-?[0-9.,]+)` match with commas removed, compared as a string."""
from __future__ import annotations

import re
from fractions import Fraction

from refiner_jax.tasks.gsm8k.calculator import format_number

_STRICT_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
_ANSWER_NUMBER = re.compile(r"-?\s*(?:\d{1,300}(?:\.\d{1,300})?|\.\d{1,300})(?:\s*/\s*\d{1,300})?")
_ALT_MARKER = re.compile(r"^\s*A:", re.MULTILINE)


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


def has_answer_marker(step: str) -> bool:
    return "####" in step or bool(_ALT_MARKER.match(step))
