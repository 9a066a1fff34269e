"""The GSM8K calculator: `evaluate_expression` is a small recursive-descent evaluator over exact fractions
(numbers with optional decimals and thousands commas, `+ - * /`, parentheses, unary minus/plus) that rejects
anything else; `calculator_completion` gives what to append when a model has written `<<expr=`, the GSM8K
decoding convention. `configs/rm_gsm8k.py` trains on GSM8K, but the sampler knows no task and no run calls the
calculator yet: a GSM8K generation loop would call it between its own decode steps."""
from __future__ import annotations

import functools
import re
from fractions import Fraction

_EXPR_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")

MAX_EXPRESSION_CHARS = 1000
MAX_NESTING = 100
FORMAT_DECIMALS = 6


class CalcError(ValueError):
    """An expression the calculator refuses (unknown symbol, syntax error, division by zero, too long)."""


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
