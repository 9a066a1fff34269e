"""sNLR problems from records: `parse_record` reads a record in REFINER's released layout (rules, fact and
consequents as HELM renders them) into the problem structure kept in `Example.meta`, checking the consequents
against the rules; `render_x` and `render_y` write HELM's input and REFINER's consequents string back."""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from refiner_jax.tasks.base import DataError
from refiner_jax.tasks.snlr.generator import (
    ENTITY_TO_CATEGORY,
    GENERIC_INDEX,
    SURFACE_TO_GENERIC,
    capitalise,
    noun_phrase,
)

REQUIRED_KEYS = ("rules", "fact", "consequents")

_RULE_RE = re.compile(r"If (?:(?:a|an) )?(\S+) is (.+), then (?:the )?(\S+) is (\S+)\.")
_FACT_RE = re.compile(r"(?:The )?(\S+) is (\S+) and (\S+)\.")
_ANSWER_RE = re.compile(r"(?:The )?(\S+) is (.+)")


def _fires(rule: Mapping[str, Any], attributes: Sequence[str]) -> bool:
    if rule["consequent"] in attributes:
        return False
    held = [c in attributes for c in rule["conditions"]]
    return all(held) if rule["connective"] == "and" else any(held)


def parse_record(record: Any, where: str) -> dict:
    """The problem structure (plain data for `Example.meta`) of a REFINER-layout record; `where` names the record
    in error messages. Raises DataError when a field is missing or does not read as HELM renders it."""
    if not isinstance(record, Mapping):
        raise DataError(f"{where}: expected a JSON object with keys {list(REQUIRED_KEYS)}, got {type(record).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise DataError(f"{where}: missing key(s) {missing}; each record needs {list(REQUIRED_KEYS)} "
                        "(REFINER's srn_*.json layout)")
    fact_match = _FACT_RE.fullmatch(record["fact"]) if isinstance(record["fact"], str) else None
    if fact_match is None:
        raise DataError(f"{where}: fact {record['fact']!r} is not of the form '<The entity> is <form> and <form>.'")
    entity, *forms = fact_match.groups()
    unknown = [f for f in forms if f not in SURFACE_TO_GENERIC]
    if unknown:
        raise DataError(f"{where}: fact attribute(s) {unknown} are not in the sNLR vocabulary")
    attributes = [SURFACE_TO_GENERIC[f] for f in forms]
    rule_texts = record["rules"]
    if not isinstance(rule_texts, list) or not rule_texts or not all(isinstance(r, str) for r in rule_texts):
        raise DataError(f"{where}: 'rules' must be a non-empty list of rule sentences")
    category = ENTITY_TO_CATEGORY.get(entity)
    rules = []
    for text in rule_texts:
        m = _RULE_RE.fullmatch(text)
        if m is None or m.group(1) != m.group(3):
            raise DataError(f"{where}: rule {text!r} is not of the form "
                            "'If <subject> is <a> [and|or <b>], then <subject> is <c>.'")
        subject, body, _, consequent = m.groups()
        has_and, has_or = " and " in body, " or " in body
        if has_and and has_or:
            raise DataError(f"{where}: rule {text!r} mixes 'and' and 'or'")
        connective = "and" if has_and else "or" if has_or else None
        conditions = body.split(f" {connective} ") if connective else [body]
        strange = [a for a in (*conditions, consequent) if a not in GENERIC_INDEX]
        if strange:
            raise DataError(f"{where}: rule {text!r} uses {strange}, which are not generic sNLR attributes")
        if subject != entity:
            category = category or subject
            if subject != category:
                raise DataError(f"{where}: rule {text!r} is about {subject!r}, neither the fact's entity {entity!r} "
                                f"nor its category {category!r}")
        rules.append({"conditions": conditions, "connective": connective, "consequent": consequent,
                      "category_level": subject != entity})
    consequents = [r["consequent"] for r in rules if _fires(r, attributes)]
    stated = record["consequents"]
    if isinstance(stated, list) and len(stated) == 1:
        stated = stated[0]  # HELM's raw layout: a list holding the one reference answer
    if not isinstance(stated, str):
        raise DataError(f"{where}: 'consequents' must be a string such as 'The poppy is strong' or 'Nothing'")
    stated = stated.strip().rstrip(".")
    if stated == "Nothing":
        read = []
    else:
        m = _ANSWER_RE.fullmatch(stated)
        read = m.group(2).split(" and ") if m and m.group(1) == entity else None
    if read != consequents:
        raise DataError(f"{where}: consequents {record['consequents']!r} disagree with the rules and fact, "
                        f"which imply {consequents or 'Nothing'}")
    return {"entity": entity, "category": category, "fact_forms": forms, "fact_attributes": attributes,
            "rules": rules, "consequents": consequents}


def render_x(rule_texts: Sequence[str], fact: str, meta: Mapping[str, Any]) -> str:
    """HELM's input: the rules, `Fact:`, the fact and the question line, one per line."""
    subject = noun_phrase(meta["entity"], meta["category"] or "", True)
    return "\n".join([*rule_texts, "Fact:", fact, f"The following can be determined about {subject}:"])


def render_y(meta: Mapping[str, Any]) -> str:
    """REFINER's consequents string: HELM's answer without its period."""
    if not meta["consequents"]:
        return "Nothing"
    subject = capitalise(noun_phrase(meta["entity"], meta["category"] or "", True))
    return f"{subject} is {' and '.join(meta['consequents'])}"
