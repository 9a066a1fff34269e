"""The sNLR oracle critic: reads hypothesis steps as statements about the problem (`read_statement`,
`read_conclusion`), compares them with the gold reasoning (`oracle_errors`) and words the errors
(`feedback_from_errors`).

**Oracle.** A hypothesis is compared with the gold reasoning structurally (statements, not strings), so reordered
but complete chains pass. Error kinds, each with its feedback sentence:
  - invalid_and / invalid_or: the conclusion names the consequent of a two-condition rule whose connective is not
    satisfied (`and`: not every condition holds; `or`: none does) -> "The and operator makes inference rule #k
    invalid.", k = the step stating the conclusion;
  - missing_link: a fired rule's consequent is missing, a conclusion has no rule behind it (one-condition rule that
    does not hold, consequent already in the fact, unknown attribute), a link (condition) step is missing, a step
    is false or unreadable, or there is no conclusion -> "Missing link between the fact and the rules.";
  - missing_implicit: a needed lexical or category step is missing, or one is wrong ("huge is small",
    "poppy is animal") -> "The implicit knowledge is missing."
A hypothesis without errors gets "No hint".
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

from refiner_jax.tasks.base import NO_HINT, Feedback, StepError
from refiner_jax.tasks.snlr.chains import _NOTHING_TEXTS, build_steps, fired_applications, split_steps
from refiner_jax.tasks.snlr.generator import CATEGORY_NAMES, SURFACE_TO_GENERIC

ERROR_KINDS = ("invalid_and", "invalid_or", "missing_link", "missing_implicit")
MISSING_LINK = "Missing link between the fact and the rules."
MISSING_IMPLICIT = "The implicit knowledge is missing."


class Statement(NamedTuple):
    """A hypothesis step read against a problem: its shape, whether it is true, and its atomic claims."""

    shape: str  # "lexical", "category", "condition", "nothing" or "unknown"
    true: bool
    atoms: frozenset


# --------------------------------------------------------------------------------------------------- reading


def _read(text: str) -> tuple[str, tuple[str, ...]] | None:
    """(subject, attributes) of `<subject> is <a> [and <b> ...]`, lower-cased; ("", ()) for a no-conclusion
    sentence; None when the step does not read that way."""
    t = " ".join(text.split()).lower().rstrip(".!").strip()
    if t in _NOTHING_TEXTS:
        return "", ()
    for article in ("the ", "a ", "an "):
        if t.startswith(article):
            t = t[len(article):]
            break
    subject, sep, rest = t.partition(" is ")
    if not sep or not subject or " " in subject or " is " in rest:
        return None
    attributes = tuple(rest.split(" and "))
    if any(not a or " " in a for a in attributes):
        return None
    return subject, attributes


def read_statement(text: str, meta: Mapping[str, Any]) -> Statement:
    """Shape, truth and atomic claims of one non-final step."""
    parsed = _read(text)
    if parsed is None:
        return Statement("unknown", False, frozenset())
    subject, attributes = parsed
    if not subject:
        return Statement("nothing", not meta["consequents"], frozenset())
    entity, category = meta["entity"].lower(), (meta["category"] or "").lower()
    if len(attributes) == 1 and attributes[0] in CATEGORY_NAMES:
        return Statement("category", (subject, attributes[0]) == (entity, category),
                         frozenset({("category", subject, attributes[0])}))
    if subject == entity:
        known = {*meta["fact_forms"], *meta["fact_attributes"], *meta["consequents"]}
        return Statement("condition", all(a in known for a in attributes),
                         frozenset(("condition", subject, a) for a in attributes))
    if subject in SURFACE_TO_GENERIC and len(attributes) == 1:
        return Statement("lexical", SURFACE_TO_GENERIC[subject] == attributes[0],
                         frozenset({("lexical", subject, attributes[0])}))
    return Statement("unknown", False, frozenset())


def read_conclusion(text: str, meta: Mapping[str, Any]) -> frozenset | None:
    """The attributes a final step concludes about the entity (empty for "The argument is invalid!!"); None when
    it is not a conclusion about the problem's entity."""
    parsed = _read(text)
    if parsed is None:
        return None
    subject, attributes = parsed
    if subject and subject != meta["entity"].lower():
        return None
    return frozenset(attributes)


def _atom_text(atom: tuple[str, str, str]) -> str:
    return f"{atom[1]} is {atom[2]}"


# --------------------------------------------------------------------------------------------------- oracle


def _feedback_sentence(error: StepError) -> str:
    if error.kind in ("invalid_and", "invalid_or"):
        return f"The {error.kind[len('invalid_'):]} operator makes inference rule #{error.step} invalid."
    return MISSING_LINK if error.kind == "missing_link" else MISSING_IMPLICIT


def feedback_from_errors(errors: Sequence[StepError]) -> Feedback:
    """Errors sorted by kind then step (duplicates dropped) and their sentences, each said once."""
    unique = dict.fromkeys(sorted(errors, key=lambda e: (ERROR_KINDS.index(e.kind), e.step is None, e.step or 0,
                                                         e.detail or "")))
    ordered = tuple(unique)
    sentences = dict.fromkeys(_feedback_sentence(e) for e in ordered)
    return Feedback(ordered, " ".join(sentences) if sentences else NO_HINT)


def _required_atoms(meta: Mapping[str, Any], style: str, rule: int, conditions: Sequence[str]) -> list[tuple]:
    atoms: list[tuple] = []
    for step in build_steps(meta, style, [(rule, conditions)])[:-1]:
        atoms.extend(sorted(read_statement(step.text, meta).atoms))
    return atoms


def _extra_conclusion_kind(meta: Mapping[str, Any], attribute: str) -> tuple[str, int | None]:
    """Why concluding `attribute` (not a gold consequent) is wrong, and the rule concluding it."""
    for i, rule in enumerate(meta["rules"]):
        if rule["consequent"] == attribute:
            if attribute in meta["fact_attributes"] or len(rule["conditions"]) < 2:
                return "missing_link", i
            return f"invalid_{rule['connective']}", i
    return "missing_link", None


def oracle_errors(meta: Mapping[str, Any], hypothesis: str, style: str = "refiner") -> list[StepError]:
    """Structured errors of `hypothesis` against the problem's gold reasoning (see the module docstring)."""
    steps = split_steps(hypothesis)
    if not steps:
        return [StepError("missing_link", None, "no conclusion")]
    last = len(steps) - 1
    body = [read_statement(s, meta) for s in steps[:-1]]
    stated = set().union(*(s.atoms for s in body)) if body else set()
    conclusion = read_conclusion(steps[-1], meta)
    errors: list[StepError] = []
    absorbed: set[str] = set()  # conditions of rules already flagged as invalid applications
    if conclusion is None:
        errors.append(StepError("missing_link", last, "no conclusion"))
    else:
        gold = meta["consequents"]
        for attribute in sorted(conclusion - set(gold)):
            kind, rule = _extra_conclusion_kind(meta, attribute)
            errors.append(StepError(kind, last, attribute))
            if kind != "missing_link":
                absorbed.update(meta["rules"][rule]["conditions"])
        errors.extend(StepError("missing_link", None, c) for c in gold if c not in conclusion)
        for rule, conditions in fired_applications(meta):
            if meta["rules"][rule]["consequent"] in conclusion:
                for atom in _required_atoms(meta, style, rule, conditions):
                    if atom not in stated:
                        kind = "missing_link" if atom[0] == "condition" else "missing_implicit"
                        errors.append(StepError(kind, None, _atom_text(atom)))
    for k, statement in enumerate(body):
        if statement.true:
            continue
        if statement.shape in ("lexical", "category"):
            errors.append(StepError("missing_implicit", k, steps[k]))
        elif not (statement.shape == "condition" and {a[2] for a in statement.atoms} <= absorbed):
            errors.append(StepError("missing_link", k, steps[k]))
    return errors
