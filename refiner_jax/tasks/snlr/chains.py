"""sNLR reasoning chains (z): `build_steps` / `build_chain` justify the rules that fire, `serialize` and
`split_steps` convert between steps and REFINER's `#k:`-numbered text.

**Chains.** A fired rule is justified per satisfied condition g (shown in the fact as surface form f):
  - lexical step `f is g` when f is a synonym, e.g. "intelligent is smart" (implicit knowledge);
  - category step `<entity> is <category>` once per chain, when a category-level rule fires (implicit knowledge);
  - condition step `<entity> is g` linking the fact to the rule.
The final step names all consequents in rule order (`poppy is boring and big`); with none, the only step is
`The argument is invalid!!`. Style "refiner" (default) is the convention of REFINER's released chains: steps are
grouped per satisfied condition, conditions in attribute-vocabulary order, and for a rule stated about the entity
itself the lexical step stands in for the condition step ("#0: ancient is old #1: tree is round"). It rebuilds
10,867 of the 11,000 released chains exactly; the other 133 all fire an `and` rule, where the released chains carry
state leaked from earlier items ("tiny is smallmean is bad", "rose is person"), so we state both conjuncts cleanly
instead. Style "explicit" follows `specs/snlr.md` §8: rules in order, each with its lexical steps, the category
step and one condition step naming all its satisfied conditions.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, NamedTuple, Sequence

from refiner_jax.tasks.snlr.generator import GENERIC_INDEX
from refiner_jax.tasks.snlr.records import _fires

NOTHING_STEP = "The argument is invalid!!"
CHAIN_STYLES = ("refiner", "explicit")

_NOTHING_TEXTS = frozenset({"the argument is invalid", "nothing", "no rule applies"})
_STEP_MARK = re.compile(r"#\d+:")


class Step(NamedTuple):
    """One chain step: its text, role ("lexical", "category", "condition", "conclusion", "nothing") and the index
    of the rule it serves (None for the conclusion)."""

    text: str
    role: str
    rule: int | None


def fired_applications(meta: Mapping[str, Any]) -> list[tuple[int, list[str]]]:
    """(rule index, its conditions that the fact satisfies) for every rule that fires, in rule order."""
    attributes = meta["fact_attributes"]
    return [(i, [c for c in r["conditions"] if c in attributes])
            for i, r in enumerate(meta["rules"]) if _fires(r, attributes)]


def _form(meta: Mapping[str, Any], attribute: str) -> str:
    """How the fact shows `attribute` (itself when the fact does not hold it)."""
    for form, attr in zip(meta["fact_forms"], meta["fact_attributes"]):
        if attr == attribute:
            return form
    return attribute


def build_steps(meta: Mapping[str, Any], style: str = "refiner",
                applications: Sequence[tuple[int, Sequence[str]]] | None = None) -> list[Step]:
    """The chain justifying `applications` ((rule, satisfied conditions); default: the rules that fire)."""
    if style not in CHAIN_STYLES:
        raise ValueError(f"chain style must be one of {CHAIN_STYLES}, got {style!r}")
    if applications is None:
        applications = fired_applications(meta)
    entity, category, rules = meta["entity"], meta["category"], meta["rules"]
    steps: list[Step] = []
    category_done = False

    def justify(rule: int, conditions: Sequence[str]) -> None:
        nonlocal category_done
        for g in conditions:
            form = _form(meta, g)
            if form != g:
                steps.append(Step(f"{form} is {g}", "lexical", rule))
        if rules[rule]["category_level"] and not category_done:
            steps.append(Step(f"{entity} is {category}", "category", rule))
            category_done = True
        if style == "refiner":
            linked = [g for g in conditions if rules[rule]["category_level"] or _form(meta, g) == g]
        else:
            linked = list(conditions)
        if linked:
            steps.append(Step(f"{entity} is {' and '.join(linked)}", "condition", rule))

    if style == "refiner":
        items = sorted(((r, g) for r, conds in applications for g in conds), key=lambda t: GENERIC_INDEX.get(t[1], -1))
        for rule, g in items:
            justify(rule, [g])
    else:
        for rule, conds in sorted(applications, key=lambda t: t[0]):
            justify(rule, conds)
    consequents = [rules[r]["consequent"] for r, _ in sorted(applications, key=lambda t: t[0])]
    if consequents:
        steps.append(Step(f"{entity} is {' and '.join(consequents)}", "conclusion", None))
    else:
        steps.append(Step(NOTHING_STEP, "nothing", None))
    return steps


def serialize(steps: Sequence[Step | str]) -> str:
    """REFINER's serialisation: `#0: <step> #1: <step> ` (each step followed by one space)."""
    return "".join(f"#{k}: {s.text if isinstance(s, Step) else s} " for k, s in enumerate(steps))


def build_chain(meta: Mapping[str, Any], style: str = "refiner") -> str:
    """The gold chain z of a problem."""
    return serialize(build_steps(meta, style))


def split_steps(hypothesis: str) -> list[str]:
    """Steps of a `#k:`-numbered chain (text before the first marker counts as a step); empty ones dropped."""
    if not isinstance(hypothesis, str):
        return []
    return [part.strip() for part in _STEP_MARK.split(hypothesis) if part.strip()]
