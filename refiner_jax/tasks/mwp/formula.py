"""The MWP hypothesis language. A formula is a list of binary steps joined by `" | "`:

    #0: multiply ( number0, number1 ) | #1: add ( #0, number2 )

Step k is `#k: op ( first, second )` with op in `add | subtract | multiply | divide`; an argument is a masked
problem number `numberK` (the K-th number of the problem text, see `Example.meta["numbers"]`), a reference `#j`
to an earlier step, or a numeric constant (`100.0`). The last step is the answer; an equation without an operator
is the bare argument (`number0`). Gold formulas are compiled from SVAMP's prefix equations (`compile_prefix`),
which reproduces REFINER's released `Linear_Formula`s except that `subtract` is spelled so (REFINER's train data
writes `substract`) and there is no trailing `" |  EOS"` (the tokenizer appends its own end token); the parser
accepts both, so REFINER outputs can be scored. Everything is total: `parse_formula` returns a structured failure
instead of raising, `execute` returns None for anything it cannot evaluate.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Sequence

OPS = ("add", "subtract", "multiply", "divide")
COMMUTATIVE = frozenset({"add", "multiply"})
_PREFIX_OPS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}
_OP_ALIASES = {"substract": "subtract"}  # REFINER's train/val spelling
_END_MARKERS = frozenset({"EOS", "<END>"})  # REFINER's trailing end markers, ignored by the parser

MAX_PREFIX_DEPTH = 200  # operators nested in one prefix equation (a bound on recursion, far above any dataset's)

_ARG_RE = re.compile(r"number(\d+)|#(\d+)|(-?\d+(?:\.\d+)?)")
_STEP_RE = re.compile(r"#\s*(\d+)\s*:\s*([A-Za-z]+)\s*\(\s*([^\s,()]+)\s*,\s*([^\s,()]+)\s*\)")


@dataclasses.dataclass(frozen=True)
class Arg:
    """A step argument: `kind` is "number" (value = index K of numberK), "ref" (value = step index j of #j) or
    "const" (value = the float); `text` is how it is written."""

    kind: str
    value: int | float
    text: str

    @property
    def key(self) -> tuple[str, float]:
        return (self.kind, self.value)


@dataclasses.dataclass(frozen=True)
class Step:
    op: str
    first: Arg
    second: Arg


@dataclasses.dataclass(frozen=True)
class Formula:
    """Steps in order; a formula without steps is the bare argument `leaf` (answer = that number)."""

    steps: tuple[Step, ...]
    leaf: Arg | None = None


@dataclasses.dataclass(frozen=True)
class ParseResult:
    """`formula` when the text parses, else None and `error` says why."""

    formula: Formula | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.formula is not None


def _parse_arg(token: str) -> Arg | None:
    m = _ARG_RE.fullmatch(token)
    if m is None:
        return None
    if m.group(1) is not None:
        return Arg("number", int(m.group(1)), f"number{int(m.group(1))}")
    if m.group(2) is not None:
        return Arg("ref", int(m.group(2)), f"#{int(m.group(2))}")
    return Arg("const", float(m.group(3)), m.group(3))


def _parse_step(piece: str, index: int) -> Step | str:
    """Step `index` from its text, or an error message."""
    m = _STEP_RE.fullmatch(piece)
    if m is None:
        return f"step {index} is not of the form '#{index}: op ( a, b )': {piece[:60]!r}"
    if int(m.group(1)) != index:
        return f"step {index} is labelled #{m.group(1)}"
    op = m.group(2).lower()
    op = _OP_ALIASES.get(op, op)
    if op not in OPS:
        return f"unknown operator {m.group(2)!r} in step {index}"
    first, second = _parse_arg(m.group(3)), _parse_arg(m.group(4))
    if first is None or second is None:
        bad = m.group(3) if first is None else m.group(4)
        return f"bad argument {bad!r} in step {index}"
    return Step(op, first, second)


def _pieces(text: str) -> list[str]:
    """The `|`-separated items of a formula, stripped, without empty items or a trailing end marker (an item of its
    own, "... | EOS", or the end of the last item, as in REFINER's bare-number formulas "number0 <END>")."""
    pieces = [p.strip() for p in text.split("|")]
    pieces = [p for p in pieces if p]
    if pieces:
        *rest, last = pieces[-1].rsplit(None, 1)
        if last in _END_MARKERS:
            pieces[-1] = rest[0] if rest else ""
            pieces = [p for p in pieces if p]
    return pieces


def parse_formula(text: object) -> ParseResult:
    """Parses a formula; never raises (anything malformed gives `ParseResult(None, reason)`)."""
    if not isinstance(text, str):
        return ParseResult(None, f"expected a string, got {type(text).__name__}")
    pieces = _pieces(text)
    if not pieces:
        return ParseResult(None, "empty formula")
    if len(pieces) == 1 and not pieces[0].startswith("#"):
        leaf = _parse_arg(pieces[0])
        if leaf is None or leaf.kind == "ref":
            return ParseResult(None, f"not a step or a number: {pieces[0][:60]!r}")
        return ParseResult(Formula((), leaf))
    steps = []
    for k, piece in enumerate(pieces):
        step = _parse_step(piece, k)
        if isinstance(step, str):
            return ParseResult(None, step)
        steps.append(step)
    return ParseResult(Formula(tuple(steps)))


def format_formula(formula: Formula) -> str:
    """The canonical text of a formula (the inverse of `parse_formula` up to whitespace and spelling)."""
    if not formula.steps:
        return formula.leaf.text if formula.leaf is not None else ""
    return " | ".join(f"#{k}: {s.op} ( {s.first.text}, {s.second.text} )" for k, s in enumerate(formula.steps))


def compile_prefix(equation: str) -> Formula:
    """Compiles a prefix equation (`"- number0 * number1 number2"`) to a formula: post-order, left subtree first,
    one step per operator, numbered in completion order. Raises ValueError on a malformed equation."""
    tokens = equation.split()
    if not tokens:
        raise ValueError("empty equation")
    steps: list[Step] = []
    pos = 0

    def walk(depth: int) -> Arg:  # the argument naming the subtree that starts at tokens[pos]
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"equation {equation!r} ends early (an operator lacks operands)")
        if depth > MAX_PREFIX_DEPTH:
            raise ValueError(f"equation nested more than {MAX_PREFIX_DEPTH} operators deep: {equation[:60]!r}...")
        token = tokens[pos]
        pos += 1
        if token in _PREFIX_OPS:
            first = walk(depth + 1)
            second = walk(depth + 1)
            steps.append(Step(_PREFIX_OPS[token], first, second))
            return Arg("ref", len(steps) - 1, f"#{len(steps) - 1}")
        arg = _parse_arg(token)
        if arg is None or arg.kind == "ref":
            raise ValueError(f"equation {equation!r} has a bad token {token!r}")
        return arg

    root = walk(0)
    if pos != len(tokens):
        raise ValueError(f"equation {equation!r} has trailing tokens {tokens[pos:]}")
    return Formula(tuple(steps)) if steps else Formula((), root)


def normalize_whitespace(text: str) -> str:
    return " ".join(text.split())


# ----------------------------------------------------------------------------------------------- execution


def execute(formula: Formula | str, numbers: Sequence[float]) -> float | None:
    """The answer of `formula` on the problem's `numbers`, or None when it cannot be computed (unparsable, unknown
    numberK, reference to the same or a later step, division by zero, overflow). Plain float arithmetic, no eval."""
    if isinstance(formula, str):
        formula = parse_formula(formula).formula
        if formula is None:
            return None
    values: list[float] = []

    def value(arg: Arg) -> float | None:
        if arg.kind == "number":
            return float(numbers[int(arg.value)]) if arg.value < len(numbers) else None
        if arg.kind == "ref":
            return values[int(arg.value)] if arg.value < len(values) else None
        return arg.value

    if not formula.steps:
        result = value(formula.leaf) if formula.leaf is not None else None
        return result if result is not None and math.isfinite(result) else None
    for step in formula.steps:
        a, b = value(step.first), value(step.second)
        if a is None or b is None:
            return None
        if step.op == "add":
            v = a + b
        elif step.op == "subtract":
            v = a - b
        elif step.op == "multiply":
            v = a * b
        else:
            if b == 0:
                return None
            v = a / b
        if not math.isfinite(v):
            return None
        values.append(v)
    return values[-1]


def answers_match(prediction: float | None, gold: float, rel_tol: float = 1e-4, abs_tol: float = 5e-3) -> bool:
    """Whether a computed answer equals the gold one: relative tolerance, plus an absolute one that accepts gold
    answers rounded to 2 decimals."""
    return prediction is not None and math.isclose(prediction, gold, rel_tol=rel_tol, abs_tol=abs_tol)
