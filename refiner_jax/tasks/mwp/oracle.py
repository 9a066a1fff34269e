"""The MWP oracle critic: compares a hypothesis formula with the gold one by structure, never by token position
(`oracle_errors`), and words the errors as the paper does (`feedback_text`): a missing operator first ("An
operator is missing."), then each hypothesis step's sentences in step order ("The operator in #1 is incorrect.",
"The first number in #0 is incorrect.", "An operator is extra."), each sentence once, joined by one space; `#k`
numbers the hypothesis' own steps, "No hint" says nothing is wrong. `equivalent` is canonical formula equality.
"""
from __future__ import annotations

import collections
import itertools
import math
from typing import Mapping, Sequence

from refiner_jax.tasks.base import NO_HINT, StepError
from refiner_jax.tasks.mwp.formula import COMMUTATIVE, Arg, Formula

# Structured error kinds and their feedback sentences (the paper's wording).
ERROR_KINDS = ("unparsable", "missing_step", "extra_step", "operator", "first_number", "second_number", "number")
SENTENCES = {
    "unparsable": "The equation is malformed.",
    "missing_step": "An operator is missing.",
    "extra_step": "An operator is extra.",
    "operator": "The operator in #{k} is incorrect.",
    "first_number": "The first number in #{k} is incorrect.",
    "second_number": "The second number in #{k} is incorrect.",
    "number": "The number is incorrect.",  # both formulas are a bare argument (no operator) and they differ
}

# Beyond this many candidate alignments the oracle pairs leftover steps by position (only garbage is that long).
_MAX_ALIGNMENTS = 512


class _Interner:
    """Hash-conses expression trees: equal canonical trees get equal integer ids (commutative operands are
    unordered), so comparing trees is comparing ids and shared subtrees cost nothing."""

    def __init__(self):
        self._ids: dict[tuple, int] = {}

    def leaf(self, arg: Arg) -> int:
        return self._ids.setdefault(arg.key, len(self._ids))

    def node(self, op: str, a: int, b: int) -> int:
        if op in COMMUTATIVE and b < a:
            a, b = b, a
        return self._ids.setdefault((op, a, b), len(self._ids))

    def step_ids(self, formula: Formula) -> list[int | None]:
        """The tree id of every step; None for a step that refers to itself, a later step or an invalid one."""
        ids: list[int | None] = []
        for k, step in enumerate(formula.steps):
            a, b = (self._arg_id(arg, ids, k) for arg in (step.first, step.second))
            ids.append(None if a is None or b is None else self.node(step.op, a, b))
        return ids

    def _arg_id(self, arg: Arg, ids: list[int | None], k: int) -> int | None:
        if arg.kind == "ref":
            return ids[int(arg.value)] if arg.value < k else None
        return self.leaf(arg)

    def result_id(self, formula: Formula, ids: list[int | None]) -> int | None:
        if formula.steps:
            return ids[-1]
        return self.leaf(formula.leaf) if formula.leaf is not None and formula.leaf.kind != "ref" else None


def _equivalent(gold: Formula, hyp: Formula, interner: _Interner, gold_ids, hyp_ids) -> bool:
    root = interner.result_id(hyp, hyp_ids)
    return (root is not None and root == interner.result_id(gold, gold_ids)
            and None not in hyp_ids and collections.Counter(hyp_ids) == collections.Counter(gold_ids))


def equivalent(a: Formula, b: Formula) -> bool:
    """Canonical equality: the same multiset of step expressions (add/multiply operands unordered, #j references
    resolved to the subtrees they name) and the same answer expression. Step order may differ; an unused (dead)
    step or a step referring forward makes formulas differ."""
    interner = _Interner()
    return _equivalent(a, b, interner, interner.step_ids(a), interner.step_ids(b))


class _ArgMatcher:
    """Decides whether a hypothesis argument stands for a gold one under a step pairing (hyp index -> gold index).

    Numbers and constants must be equal. A reference is right when it names the step paired with the gold one's
    (or a structurally equal one). Unpaired steps are looked through: a reference to an extra hypothesis step is
    right when one of that step's operands is, and a gold reference to a missing step accepts either operand of
    the missing step, so an extra or missing operator is not also reported as a wrong number in its user.
    """

    def __init__(self, hyp: Formula, gold: Formula, pairs: Mapping[int, int], hyp_ids: Sequence[int | None],
                 gold_ids: Sequence[int | None]):
        self.hyp, self.gold, self.pairs = hyp, gold, pairs
        self.hyp_ids, self.gold_ids = hyp_ids, gold_ids
        self.paired_gold = set(pairs.values())
        self._memo: dict[tuple, bool] = {}

    def same(self, x: Arg, a: int, y: Arg, b: int) -> bool:
        """Whether argument `x` of hypothesis step `a` stands for argument `y` of gold step `b`."""
        key = (x.key, a, y.key, b)
        if key not in self._memo:
            self._memo[key] = self._same(x, a, y, b)
        return self._memo[key]

    def _same(self, x: Arg, a: int, y: Arg, b: int) -> bool:
        if (x.kind == "ref" and x.value >= a) or (y.kind == "ref" and y.value >= b):
            return False  # a step can only use earlier steps
        if x.kind == "ref" and int(x.value) not in self.pairs:
            i = int(x.value)
            return self.same(self.hyp.steps[i].first, i, y, b) or self.same(self.hyp.steps[i].second, i, y, b)
        if y.kind == "ref" and int(y.value) not in self.paired_gold:
            j = int(y.value)
            return self.same(x, a, self.gold.steps[j].first, j) or self.same(x, a, self.gold.steps[j].second, j)
        if x.kind == "ref" and y.kind == "ref":
            i, j = int(x.value), int(y.value)
            return self.pairs[i] == j or (self.hyp_ids[i] is not None and self.hyp_ids[i] == self.gold_ids[j])
        return x.kind != "ref" and y.kind != "ref" and x.key == y.key


def _slot_errors(hyp: Formula, gold: Formula, a: int, b: int, matcher: _ArgMatcher) -> list[str]:
    """Error kinds of hypothesis step `a` read as gold step `b`; operands of add/multiply may come swapped."""
    h, g = hyp.steps[a], gold.steps[b]
    errors = ["operator"] if h.op != g.op else []
    wrong = [not matcher.same(h.first, a, g.first, b), not matcher.same(h.second, a, g.second, b)]
    if g.op in COMMUTATIVE:
        swapped = [not matcher.same(h.first, a, g.second, b), not matcher.same(h.second, a, g.first, b)]
        if sum(swapped) < sum(wrong):
            wrong = swapped
    return errors + [kind for kind, w in zip(("first_number", "second_number"), wrong) if w]


def _candidate_pairings(free_hyp: list[int], free_gold: list[int]):
    """Order-preserving pairings of the leftover steps: every step of the shorter list meets one of the longer."""
    short_is_hyp = len(free_hyp) <= len(free_gold)
    short, long_ = (free_hyp, free_gold) if short_is_hyp else (free_gold, free_hyp)
    if math.comb(len(long_), len(short)) > _MAX_ALIGNMENTS:
        chosen_sets = [tuple(long_[: len(short)])]
    else:
        chosen_sets = itertools.combinations(long_, len(short))
    for chosen in chosen_sets:
        yield [(s, c) if short_is_hyp else (c, s) for s, c in zip(short, chosen)]


def oracle_errors(gold: Formula, hyp: Formula) -> tuple[StepError, ...]:
    """Structural comparison of a hypothesis with the gold formula; empty when they are equivalent.

    Steps are aligned, not compared by position: a hypothesis step computing exactly a gold subexpression is
    paired with it first (any order; the last step only with the gold's last); the leftover steps are paired in
    order, choosing the pairing with the fewest wrong operators/operands (ties: earliest steps paired). Unpaired
    gold steps are missing operators, unpaired hypothesis steps extra ones. References are compared through the
    pairing (`_ArgMatcher`), so one wrong, missing or extra step does not make every later step that uses it wrong.
    Operands of add/multiply may be swapped.
    """
    interner = _Interner()
    gold_ids, hyp_ids = interner.step_ids(gold), interner.step_ids(hyp)
    if _equivalent(gold, hyp, interner, gold_ids, hyp_ids):
        return ()
    if not gold.steps and not hyp.steps:
        return (StepError("number"),)
    pairs: dict[int, int] = {}
    last_hyp, last_gold = len(hyp.steps) - 1, len(gold.steps) - 1
    for a, h in enumerate(hyp_ids):
        if h is None:
            continue
        # The answer step pairs only with the answer step, so a leftover pairing always matches the two.
        candidates = ([last_gold] if gold.steps else []) if a == last_hyp else range(last_gold)
        b = next((b for b in candidates if gold_ids[b] == h and b not in pairs.values()), None)
        if b is not None:
            pairs[a] = b
    free_hyp = [a for a in range(len(hyp.steps)) if a not in pairs]
    paired_gold = set(pairs.values())
    free_gold = [b for b in range(len(gold.steps)) if b not in paired_gold]
    best: tuple[int, dict[int, list[str]]] | None = None
    for pairing in _candidate_pairings(free_hyp, free_gold):
        full = {**pairs, **dict(pairing)}
        matcher = _ArgMatcher(hyp, gold, full, hyp_ids, gold_ids)
        slots = {a: _slot_errors(hyp, gold, a, b, matcher) for a, b in pairing}
        cost = sum(len(v) for v in slots.values())
        if best is None or cost < best[0]:
            best = (cost, slots)
    slots = best[1] if best is not None else {}
    errors = [StepError("missing_step") for _ in range(len(free_gold) - len(slots))]
    for a in range(len(hyp.steps)):
        if a in slots:
            errors.extend(StepError(kind, a) for kind in slots[a])
        elif a in free_hyp:
            errors.append(StepError("extra_step", a))
    return tuple(errors)


def feedback_text(errors: Sequence[StepError]) -> str:
    """The critic's sentence for `errors`: one sentence per error in order, repeated whole-formula sentences
    ("An operator is missing.") said once, NO_HINT when there is none."""
    sentences: list[str] = []
    for e in errors:
        s = SENTENCES[e.kind].format(k=e.step)
        if s not in sentences:
            sentences.append(s)
    return " ".join(sentences) if sentences else NO_HINT
