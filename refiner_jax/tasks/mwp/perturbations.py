"""Perturbations of a gold MWP formula, the critic's training hypotheses: a wrong operator, a wrong operand,
swapped operands, a missing or an extra step (`_PERTURBERS`), and the equivalent rewrite (add/multiply operands
swapped) that stands for an unchanged hypothesis. `MWPTask.perturb` draws among them by weight. Each perturber
returns (hypothesis formula, error kinds the oracle should report) or None when not applicable."""
from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from refiner_jax.tasks.mwp.formula import COMMUTATIVE, OPS, Arg, Formula, Step

PERTURBATIONS = ("operator", "operand", "swap", "missing_step", "extra_step")
DEFAULT_PERTURBATION_WEIGHTS = {"operator": 1.0, "operand": 1.0, "swap": 0.5, "missing_step": 0.5, "extra_step": 0.5}
# Constants a wrong-operand perturbation may introduce (the ones the MAWPS equations use most).
_PERTURB_CONSTANTS = ("1.0", "2.0", "10.0", "100.0", "0.01")


def _ref(j: int) -> Arg:
    return Arg("ref", j, f"#{j}")


def _number(k: int) -> Arg:
    return Arg("number", k, f"number{k}")


def _replace_step(steps: Sequence[Step], k: int, **changes) -> tuple[Step, ...]:
    return tuple(dataclasses.replace(s, **changes) if i == k else s for i, s in enumerate(steps))


def _equivalent_rewrite(gold: Formula, rng: random.Random) -> Formula:
    candidates = [k for k, s in enumerate(gold.steps) if s.op in COMMUTATIVE and s.first.key != s.second.key]
    if not candidates:
        return gold
    k = rng.choice(candidates)
    s = gold.steps[k]
    return Formula(_replace_step(gold.steps, k, first=s.second, second=s.first))


def _wrong_operator(gold: Formula, rng: random.Random, n_numbers: int):
    if not gold.steps:
        return None
    k = rng.randrange(len(gold.steps))
    op = rng.choice([o for o in OPS if o != gold.steps[k].op])
    return Formula(_replace_step(gold.steps, k, op=op)), {"operator"}


def _wrong_operand(gold: Formula, rng: random.Random, n_numbers: int):
    if not gold.steps:
        return None
    k = rng.randrange(len(gold.steps))
    slot = rng.choice(("first", "second"))
    old = getattr(gold.steps[k], slot)
    pool = [_number(i) for i in range(n_numbers)] + [_ref(j) for j in range(k)]
    if rng.random() < 0.2:
        pool = [Arg("const", float(c), c) for c in _PERTURB_CONSTANTS]
    pool = [a for a in pool if a.key != old.key]
    if not pool:
        return None
    new = rng.choice(pool)
    return Formula(_replace_step(gold.steps, k, **{slot: new})), {f"{slot}_number"}


def _swap_operands(gold: Formula, rng: random.Random, n_numbers: int):
    candidates = [k for k, s in enumerate(gold.steps) if s.op not in COMMUTATIVE and s.first.key != s.second.key]
    if not candidates:
        return None
    k = rng.choice(candidates)
    s = gold.steps[k]
    return Formula(_replace_step(gold.steps, k, first=s.second, second=s.first)), {"first_number", "second_number"}


def _shift_refs(arg: Arg, start: int, delta: int) -> Arg:
    return _ref(int(arg.value) + delta) if arg.kind == "ref" and arg.value >= start else arg


def _missing_step(gold: Formula, rng: random.Random, n_numbers: int):
    """Drops a step; its users take one of its operands instead (the operation was skipped)."""
    if len(gold.steps) < 2:
        return None
    k = rng.randrange(len(gold.steps))
    dropped = gold.steps[k]
    stand_in = rng.choice((dropped.first, dropped.second))
    steps = []
    for i, s in enumerate(gold.steps):
        if i == k:
            continue
        args = [stand_in if a.kind == "ref" and a.value == k else _shift_refs(a, k + 1, -1)
                for a in (s.first, s.second)]
        steps.append(Step(s.op, *args))
    return Formula(tuple(steps)), {"missing_step"}


def _extra_step(gold: Formula, rng: random.Random, n_numbers: int):
    """Inserts a step that transforms one operand of a step (placed after what that operand needs, before its
    user), or appends one that transforms the answer."""
    n = len(gold.steps)
    op = rng.choice(OPS)
    other = _number(rng.randrange(n_numbers))
    target = rng.choice([None] + [(u, slot) for u in range(n) for slot in ("first", "second")])
    if target is None:
        base = _ref(n - 1) if n else gold.leaf
        args = (base, other) if rng.random() < 0.5 else (other, base)
        return Formula(gold.steps + (Step(op, *args),)), {"extra_step"}
    user, slot = target
    base = getattr(gold.steps[user], slot)
    p = rng.randint(int(base.value) + 1 if base.kind == "ref" else 0, user)  # base only names steps before p
    shifted = [Step(s.op, _shift_refs(s.first, p, 1), _shift_refs(s.second, p, 1)) for s in gold.steps]
    shifted[user] = dataclasses.replace(shifted[user], **{slot: _ref(p)})
    new = Step(op, base, other) if rng.random() < 0.5 else Step(op, other, base)
    return Formula(tuple(shifted[:p]) + (new,) + tuple(shifted[p:])), {"extra_step"}


_PERTURBERS = {"operator": _wrong_operator, "operand": _wrong_operand, "swap": _swap_operands,
               "missing_step": _missing_step, "extra_step": _extra_step}
