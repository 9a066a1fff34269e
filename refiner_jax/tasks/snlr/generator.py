"""Synthetic natural-language reasoning (sNLR) instances, drawn like HELM's `synthetic_reasoning_natural` scenario.

Each instance has five if-then rules about one entity (or its category), a fact giving two attributes of the entity,
and the attributes that follow from the fact by one rule application. The draws follow `specs/snlr.md` §2-§7 in
the same order, so `generate_records(seed=42, n=11000, difficulty="hard")` reproduces HELM's hard instances (and
REFINER's `srn_{train,val,test}.json`: records 0-999, 1000-5999, 6000-10999); other seeds give fresh data.
Records use REFINER's released layout (`rules`, `fact`, `question`, `consequents`) so generated and released data
share one parser.
"""
from __future__ import annotations

import random
from typing import NamedTuple, Sequence

# Categories and their entities, in the order the draws index them.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("person", ("Alice", "Bob", "Carol", "Dan", "Erin", "Frank")),
    ("animal", ("dog", "cat", "rabbit", "mouse", "tiger", "lion", "bear", "squirrel", "cow", "panda", "hedgehog",
                "elephant", "giraffe", "hippo")),
    ("plant", ("poppy", "dandelion", "tree", "rose", "sunflower")),
)

# Attribute groups: the generic name first, then its synonyms (a synonym implies the generic, not the reverse).
ATTRIBUTE_GROUPS: tuple[tuple[str, ...], ...] = (
    ("young",), ("soft",), ("sad",), ("scary",),
    ("cold", "chill", "cool"),
    ("hot", "warm"),
    ("smart", "clever", "wise", "intelligent"),
    ("clean", "tidy"),
    ("small", "little", "tiny"),
    ("big", "enormous", "giant", "huge"),
    ("good", "kind", "nice"),
    ("beautiful", "pretty"),
    ("red", "crimson"),
    ("blue", "cobalt"),
    ("green", "viridian"),
    ("purple", "violet"),
    ("boring", "dull"),
    ("old", "ancient", "antique"),
    ("strong", "powerful", "muscular"),
    ("weak", "frail", "fragile"),
    ("fast", "quick"),
    ("slow", "sluggish"),
    ("bad", "evil", "wicked", "mean"),
    ("happy", "elated", "glad", "cheerful"),
    ("round", "circular", "spherical"),
)

GENERIC_NAMES: tuple[str, ...] = tuple(group[0] for group in ATTRIBUTE_GROUPS)
GENERIC_INDEX: dict[str, int] = {name: i for i, name in enumerate(GENERIC_NAMES)}
SURFACE_TO_GENERIC: dict[str, str] = {form: group[0] for group in ATTRIBUTE_GROUPS for form in group}
CATEGORY_NAMES: tuple[str, ...] = tuple(name for name, _ in CATEGORIES)
ENTITY_TO_CATEGORY: dict[str, str] = {entity: name for name, entities in CATEGORIES for entity in entities}
DIFFICULTIES = ("easy", "medium", "hard")
NUM_RULES = 5
KEEP_EMPTY_PROB = 0.1  # a fact that fires no rule is kept only when a uniform draw is <= this, else re-drawn


class Rule(NamedTuple):
    """`If <subject> is <conditions joined by connective>, then <subject> is <consequent>.`"""

    subject: str
    conditions: tuple[str, ...]
    connective: str  # "and" / "or"; drawn even for one condition, where it is invisible
    consequent: str


def noun_phrase(word: str, category: str, definite: bool) -> str:
    """The subject as rules and facts render it: persons never take an article; others take a/an or the."""
    if category == "person":
        return word
    if definite:
        return f"the {word}"
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def render_rule(rule: Rule, category: str) -> str:
    conditions = f" {rule.connective} ".join(rule.conditions)
    return (f"If {noun_phrase(rule.subject, category, False)} is {conditions}, "
            f"then {noun_phrase(rule.subject, category, True)} is {rule.consequent}.")


def fires(rule: Rule, fact_attributes: Sequence[str]) -> bool:
    """Whether one application of `rule` to the fact adds something: its consequent is new and its connective is
    satisfied (`and`: every condition holds; `or`: one does)."""
    if rule.consequent in fact_attributes:
        return False
    held = [c in fact_attributes for c in rule.conditions]
    return all(held) if rule.connective == "and" else any(held)


def draw_instance(rng: random.Random, difficulty: str = "hard") -> dict:
    """One instance as a REFINER-layout record; consumes `rng` exactly like HELM's generator."""
    category = rng.choice(CATEGORY_NAMES)
    entity = rng.choice(dict(CATEGORIES)[category])
    names = list(GENERIC_NAMES)
    rng.shuffle(names)
    rules: list[Rule] = []
    while len(names) > 2 and len(rules) < NUM_RULES:
        subject = entity if difficulty == "easy" else rng.choice((category, entity))
        size = rng.randint(2, 3)
        taken, names = names[:size], names[size:]
        connective = rng.choice(("and", "or"))
        rules.append(Rule(subject, tuple(taken[:-1]), connective, taken[-1]))
    while True:
        attributes = rng.sample(GENERIC_NAMES, 2)
        forms = [rng.choice(ATTRIBUTE_GROUPS[GENERIC_INDEX[a]]) for a in attributes]
        consequents = [r.consequent for r in rules if fires(r, attributes)]
        if consequents or rng.random() <= KEEP_EMPTY_PROB:
            break
    shown = forms if difficulty == "hard" else attributes
    subject = capitalise(noun_phrase(entity, category, True))
    answer = f"{subject} is {' and '.join(consequents)}" if consequents else "Nothing"
    return {
        "rules": [render_rule(r, category) for r in rules],
        "fact": f"{subject} is {shown[0]} and {shown[1]}.",
        "question": f"The following can be determined about {noun_phrase(entity, category, True)}:",
        "consequents": answer,  # REFINER's form: HELM's answer without its final period
    }


def generate_records(seed: int = 42, n: int = 11000, difficulty: str = "hard") -> list[dict]:
    """`n` consecutive instances from one stream seeded with `seed` (HELM: seed 42, 11,000 per difficulty)."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    rng = random.Random(seed)
    return [draw_instance(rng, difficulty) for _ in range(n)]
