"""Values under which a wrong derivation reaches the right answer: the embedded MWP generator's trace-error option.

On GSM8K a solution can use a wrong operand or operator and still land on the right number; on the embedded
generator that almost never happens (every number differs), so outcome labels and step labels agree and no
reranker can show a trace-error difference. `with_coincidence` rewrites one problem's *values* (never its text or
gold equation) so that a specific wrong step reaches the gold answer:

- "distractor": every irrelevant number takes the value of a needed one (using it in that one's place is wrong
  and gives the same result);
- "intermediate": an irrelevant number equals an intermediate result (using it where `#j` is needed);
- "unit": the second operand of a multiply or divide step is 1 (x 1 and / 1 agree);
- "two_two": both operands of an add step are 2 (2 + 2 and 2 x 2 agree).

The masked numbers keep their order, so the text, the gold formula and the step checker are unchanged; the exact
step checker still flags the wrong step (it compares which number is used, not its value). A rewrite is kept only
when every intermediate result stays a positive integer."""
from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from refiner_jax.tasks.mwp.formula import Formula, compile_prefix, execute

KINDS = ("distractor", "intermediate", "unit", "two_two")


def step_values(formula: Formula, numbers: Sequence[float]) -> list[float] | None:
    """The value of each step of `formula` on `numbers` (None when one cannot be computed)."""
    out = []
    for k in range(len(formula.steps)):
        value = execute(Formula(formula.steps[:k + 1]), numbers)
        if value is None:
            return None
        out.append(value)
    return out


def _needed(formula: Formula) -> list[int]:
    used = {a.value for s in formula.steps for a in (s.first, s.second) if a.kind == "number"}
    if formula.leaf is not None and formula.leaf.kind == "number":
        used.add(formula.leaf.value)
    return sorted(int(i) for i in used)


def _rewrite(kind: str, formula: Formula, numbers: list[float], rng: random.Random) -> list[float] | None:
    """`numbers` rewritten by `kind`, or None when `kind` does not apply to this problem."""
    needed = _needed(formula)
    distractors = [i for i in range(len(numbers)) if i not in needed]
    out = list(numbers)
    if kind in ("distractor", "intermediate"):
        if not distractors or not needed:
            return None
        for i in distractors:
            out[i] = numbers[rng.choice(needed)]
        if kind == "intermediate":
            inner = (step_values(formula, numbers) or [])[:-1]
            if not inner:
                return None
            out[rng.choice(distractors)] = rng.choice(inner)
        return out
    if kind == "unit":
        slots = [int(s.second.value) for s in formula.steps if s.op in ("multiply", "divide") and
                 s.second.kind == "number"]
        if not slots:
            return None
        out[rng.choice(slots)] = 1.0
        return out
    if kind == "two_two":
        pairs = [(int(s.first.value), int(s.second.value)) for s in formula.steps if s.op == "add" and
                 s.first.kind == s.second.kind == "number"]
        if not pairs:
            return None
        a, b = rng.choice(pairs)
        out[a] = out[b] = 2.0
        return out
    raise ValueError(f"unknown coincidence kind {kind!r}; choose from {KINDS}")


def with_coincidence(equation: str, numbers: Sequence[float], rng: random.Random,
                     kinds: Sequence[str] = KINDS) -> tuple[list[float], str] | None:
    """(new numbers, the kind used) for a problem with prefix `equation` over `numbers`, trying `kinds` in a random
    order; None when none applies with positive integer intermediate results."""
    formula = compile_prefix(equation)
    for kind in rng.sample(list(kinds), len(kinds)):
        out = _rewrite(kind, formula, list(numbers), rng)
        values = None if out is None else step_values(formula, out)
        if values and all(v > 0 and float(v).is_integer() for v in values):
            return out, kind
    return None


def apply(problems: Sequence, rate: float, seed: int, kinds: Sequence[str] = KINDS) -> list:
    """`problems` (`synthetic.Problem`s) with a share `rate` of them rewritten by `with_coincidence`; each problem
    draws from its own stream (seed, uid), so the others and every text stay as without the option."""
    out = []
    for p in problems:
        rng = random.Random(f"coincidence-{seed}-{p.uid}")
        made = with_coincidence(p.equation, p.numbers, rng, kinds) if rng.random() < rate else None
        if made is None:
            out.append(p)
            continue
        numbers, kind = made
        answer = step_values(compile_prefix(p.equation), numbers)[-1]
        out.append(dataclasses.replace(p, numbers=tuple(numbers), answer=float(answer), coincidence=kind))
    return out
