"""An embedded, seeded generator of MAWPS-style math word problems (no download needed).

A problem comes from a family (`synthetic_families`) told in a domain (`synthetic_domains`), with irrelevant
sentences mixed in. Numbers are masked as `number0`, `number1`, ... in order of appearance, like SVAMP's csvs, and
every equation uses 1 to 3 operators. The operation is always recoverable from the words (verbs, "more/fewer
than", "each", "left", "at first", who is asked about), so a small seq2seq model can learn the task, while the
number of numbers says little about the equation: `majority_baseline` (the most frequent equation for that count)
and `retrieval_baseline` (copy the equation of the most similar training problem) stay far from solving it.
"""
from __future__ import annotations

import dataclasses
import random
import re
from typing import Sequence

from refiner_jax.tasks.base import Example
from refiner_jax.tasks.mwp.synthetic_domains import DOMAINS
from refiner_jax.tasks.mwp.synthetic_families import FAMILIES, _Pick, _distractors

DEFAULT_SIZES = {"train": 4000, "val": 500, "test": 1000}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One generated problem in SVAMP's layout: masked `question`, `numbers` in order, prefix `equation`."""

    uid: str
    question: str
    numbers: tuple[float, ...]
    equation: str
    answer: float
    family: str
    domain: str
    coincidence: str = ""  # the `coincidences` kind that rewrote its values, if any


# ----------------------------------------------------------------------------------------------- assembly


def _prefix(tree, index: dict[str, int]) -> str:
    """Prefix equation over numberK; add/multiply list a subtree before a leaf and leaves in text order."""
    if isinstance(tree, str):
        return f"number{index[tree]}"
    op, left, right = tree
    if op in "+*" and (isinstance(left, str), index.get(left, -1)) > (isinstance(right, str), index.get(right, -1)):
        left, right = right, left
    return f"{op} {_prefix(left, index)} {_prefix(right, index)}"


def _evaluate(tree, values: dict[str, float]) -> float:
    if isinstance(tree, str):
        return values[tree]
    op, left, right = tree
    a, b = _evaluate(left, values), _evaluate(right, values)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]


def generate_problem(rng: random.Random, uid: str = "synth") -> Problem:
    """One random problem."""
    while True:
        name = rng.choice(sorted(FAMILIES))
        family, any_domain = FAMILIES[name]
        domain = rng.choice([d for d in DOMAINS if d.countable or any_domain])
        p = _Pick(rng, domain)
        draft = family(p)
        body = list(draft.body)
        values = dict(draft.values)
        for i, sentence in enumerate(_distractors(p, draft, rng.choices((0, 1, 2), weights=(0.45, 0.4, 0.15))[0])):
            body.insert(rng.randint(0, len(body)), sentence)
            values[f"x{i}"] = rng.randint(2, 60)
        text = " ".join(body + [draft.question])
        order = re.findall(r"@(\w+)", text)
        answer = _evaluate(draft.tree, values)
        # Reject (rare) draws with repeated values, which would make the masked numbers ambiguous, and
        # non-positive or fractional answers.
        if len({values[k] for k in order}) == len(order) and answer > 0 and float(answer).is_integer():
            break
    index = {k: i for i, k in enumerate(order)}
    question = re.sub(r"@(\w+)", lambda m: f"number{index[m.group(1)]}", text)
    return Problem(uid=uid, question=question, numbers=tuple(float(values[k]) for k in order),
                   equation=_prefix(draft.tree, index), answer=float(answer), family=name, domain=domain.name)


def generate_splits(sizes: dict[str, int], seed: int = 0) -> dict[str, list[Problem]]:
    """Disjoint train/val/test problems (no masked question text appears in two splits), deterministic in seed.

    Other keys of `sizes` (e.g. "extra": problems for a critic that the generator never sees) are drawn after
    test from the same stream, so adding them leaves train/val/test unchanged."""
    rng = random.Random(f"synthetic-mwp-{seed}")
    seen: set[str] = set()
    splits: dict[str, list[Problem]] = {}
    for split in ("train", "val", "test", *sorted(set(sizes) - {"train", "val", "test"})):
        problems = []
        while len(problems) < sizes.get(split, 0):
            problem = generate_problem(rng, f"synth-{split}-{len(problems)}")
            if problem.question not in seen:
                seen.add(problem.question)
                problems.append(problem)
        splits[split] = problems
    return splits


# ----------------------------------------------------------------------------------------------- baselines


def majority_baseline(train: Sequence[Example], test: Sequence[Example]) -> list[str]:
    """Predicts, for each test problem, the most frequent training formula among problems with the same number
    of numbers (falling back to the most frequent overall)."""
    by_count: dict[int, dict[str, int]] = {}
    overall: dict[str, int] = {}
    for ex in train:
        counts = by_count.setdefault(len(ex.meta["numbers"]), {})
        counts[ex.z] = counts.get(ex.z, 0) + 1
        overall[ex.z] = overall.get(ex.z, 0) + 1

    def top(counts: dict[str, int]) -> str:
        return min(counts, key=lambda z: (-counts[z], z))

    return [top(by_count.get(len(ex.meta["numbers"]), overall)) for ex in test]


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z]+\d*", text.lower()))


def retrieval_baseline(train: Sequence[Example], test: Sequence[Example]) -> list[str]:
    """Copies the formula of the training problem whose words overlap most with the test problem (Jaccard over
    word sets, masked numbers included; ties: earliest)."""
    train_words = [_words(ex.x) for ex in train]
    predictions = []
    for ex in test:
        words = _words(ex.x)
        best = max(range(len(train)), key=lambda i: (len(words & train_words[i]) / len(words | train_words[i]), -i))
        predictions.append(train[best].z)
    return predictions
