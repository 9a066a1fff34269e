"""Math word problems: MAWPS+ASDiv-A for training, SVAMP for testing, linear formulas as hypotheses.

Hypothesis format (z). A formula is a list of binary steps joined by `" | "`:

    #0: multiply ( number0, number1 ) | #1: add ( #0, number2 )

Step k is `#k: op ( first, second )` with op in `add | subtract | multiply | divide`; an argument is a masked
problem number `numberK` (the K-th number of the problem text, see `Example.meta["numbers"]`), a reference `#j`
to an earlier step, or a numeric constant (`100.0`). The last step is the answer. Gold formulas are compiled from
SVAMP's prefix equations (post-order, left subtree first, steps numbered in completion order), which reproduces
REFINER's released `Linear_Formula`s except for two deliberate changes: one spelling, `subtract` (REFINER's train
data writes `substract`, its test data `subtract`), and no trailing `" |  EOS"` (the tokenizer appends its own end
token). An equation without an operator (one SVAMP problem answers with a number of the text) is the bare
argument, e.g. `number0`. The parser still accepts `substract` and a trailing `EOS` piece, so REFINER outputs can
be scored.

Data. `x` is the csv `Question` column, which already is `Body + " " + Ques` (8 MAWPS rows have Body "Empty" and
hold the question alone); `meta` keeps `numbers` (floats, in numberK order), the prefix `equation` and the gold
`answer`. Validation is a seeded held-out slice of train.csv, never SVAMP.

Feedback uses the paper's wording ("The operator in #1 is incorrect.", "The first number in #0 is incorrect.",
"An operator is missing.", "An operator is extra."): a missing operator first, then each hypothesis step's
sentences in step order (an extra step says "An operator is extra."), each sentence once, joined by one space;
`#k` numbers the hypothesis' own steps; "No hint" when nothing is wrong.

Everything model-facing is total: `parse_formula` returns a structured failure instead of raising, `execute`
returns None for anything it cannot evaluate (division by zero, unknown numbers, references to later steps), and
the oracle critic compares formulas structurally (`oracle_errors`), never by token position.
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import itertools
import math
import os
import random
import re
from typing import Mapping, Sequence

from refiner_jax.tasks import synthetic_mwp
from refiner_jax.tasks.base import NO_HINT, DataError, Example, Feedback, StepError

OPS = ("add", "subtract", "multiply", "divide")
COMMUTATIVE = frozenset({"add", "multiply"})
_PREFIX_OPS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}
_OP_ALIASES = {"substract": "subtract"}  # REFINER's train/val spelling
_END_MARKERS = frozenset({"EOS", "<END>"})  # REFINER's trailing end markers, ignored by the parser

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
PERTURBATIONS = ("operator", "operand", "swap", "missing_step", "extra_step")
DEFAULT_PERTURBATION_WEIGHTS = {"operator": 1.0, "operand": 1.0, "swap": 0.5, "missing_step": 0.5, "extra_step": 0.5}
# Constants a wrong-operand perturbation may introduce (the ones the MAWPS equations use most).
_PERTURB_CONSTANTS = ("1.0", "2.0", "10.0", "100.0", "0.01")
# Beyond this many candidate alignments the oracle pairs leftover steps by position (only garbage is that long).
_MAX_ALIGNMENTS = 512

_ARG_RE = re.compile(r"number(\d+)|#(\d+)|(-?\d+(?:\.\d+)?)")
_STEP_RE = re.compile(r"#\s*(\d+)\s*:\s*([A-Za-z]+)\s*\(\s*([^\s,()]+)\s*,\s*([^\s,()]+)\s*\)")


# ----------------------------------------------------------------------------------------------- formulas


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

    def walk() -> Arg:  # the argument naming the subtree that starts at tokens[pos]
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"equation {equation!r} ends early (an operator lacks operands)")
        token = tokens[pos]
        pos += 1
        if token in _PREFIX_OPS:
            first = walk()
            second = walk()
            steps.append(Step(_PREFIX_OPS[token], first, second))
            return Arg("ref", len(steps) - 1, f"#{len(steps) - 1}")
        arg = _parse_arg(token)
        if arg is None or arg.kind == "ref":
            raise ValueError(f"equation {equation!r} has a bad token {token!r}")
        return arg

    root = walk()
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


# ----------------------------------------------------------------------------------------------- structure


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


# ----------------------------------------------------------------------------------------------- data


_REQUIRED_COLUMNS = ("Question", "Numbers", "Equation", "Answer")


def _read_csv(path: str) -> list[dict[str, str]]:
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found; expected SVAMP's mawps-asdiv-a_svamp csv "
                        f"(columns {', '.join(_REQUIRED_COLUMNS)}); pass its folder as data_dir")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            columns = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: not a readable UTF-8 csv file ({e})") from e
    missing = [c for c in _REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; expected a header with "
                        f"{', '.join(_REQUIRED_COLUMNS)} (found {columns})")
    if not rows:
        raise DataError(f"{path}: no data rows; expected SVAMP problems with columns {', '.join(_REQUIRED_COLUMNS)}")
    return rows


def _example_from_fields(uid: str, question: str, numbers: Sequence[float], equation: str, answer: float,
                         extra: Mapping[str, object] | None = None) -> Example:
    formula = compile_prefix(equation)
    meta = {"numbers": [float(v) for v in numbers], "equation": equation, "answer": float(answer), **(extra or {})}
    return Example(uid=uid, x=normalize_whitespace(question), z=format_formula(formula), y=repr(float(answer)),
                   meta=meta)


def _examples_from_csv(path: str, prefix: str, lowercase: bool = False) -> list[Example]:
    examples = []
    for i, row in enumerate(_read_csv(path)):
        where = f"{path}: data row {i + 1}"
        equation = row["Equation"] or ""
        try:
            numbers = [float(v) for v in (row["Numbers"] or "").split()]
            answer = float(row["Answer"] or "")
            extra = {"type": row["Type"]} if row.get("Type") else {}
            question = row["Question"] or ""
            ex = _example_from_fields(f"{prefix}-{i}", question.lower() if lowercase else question, numbers,
                                      equation, answer, extra)
        except ValueError as e:
            raise DataError(f"{where}: {e}; expected Numbers = space-separated numbers, Equation = a prefix "
                            f"equation over numberK and constants, Answer = a number") from e
        max_k = max((int(m) for m in re.findall(r"number(\d+)", equation)), default=-1)
        if max_k >= len(numbers):
            raise DataError(f"{where}: Equation uses number{max_k} but Numbers has {len(numbers)} value(s)")
        if not ex.x:
            raise DataError(f"{where}: empty Question")
        examples.append(ex)
    return examples


def heldout_split(examples: Sequence[Example], val_size: int, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, val): a seeded random slice of `val_size` examples, drawn by problem text so that repeated problems
    (MAWPS has 420 duplicated texts) never sit on both sides."""
    groups: dict[str, list[Example]] = {}
    for ex in examples:
        groups.setdefault(ex.x.lower(), []).append(ex)
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    val_keys: set[str] = set()
    count = 0
    for key in keys:
        if count + len(groups[key]) <= val_size:
            val_keys.add(key)
            count += len(groups[key])
    train = [ex for ex in examples if ex.x.lower() not in val_keys]
    val = [ex for ex in examples if ex.x.lower() in val_keys]
    return train, val


# ----------------------------------------------------------------------------------------------- task


class MWPTask:
    """The math-word-problem task (see the module docstring for the formula format).

    Options: `seed` (val split and synthetic data), `val_size` (problems held out of train.csv for validation),
    `no_change_rate` (share of unchanged hypotheses among perturbations), `perturbation_weights` (relative weights
    of PERTURBATIONS), `answer_rel_tol`/`answer_abs_tol` (answer accuracy), `synthetic_sizes` (train/val/test
    sizes of the embedded generator used when `data_dir` is None), `lowercase` (lower-case the csv questions:
    SVAMP's test questions are all lower case while 61% of MAWPS+ASDiv-A's training questions have capitals, which
    a tokenizer trained from scratch splits differently).
    """

    name = "mwp"
    error_kinds = ERROR_KINDS
    primary_metric = "equation_em_canonical"

    def __init__(self, seed: int = 0, val_size: int = 300, no_change_rate: float = 0.2,
                 perturbation_weights: Mapping[str, float] | None = None, answer_rel_tol: float = 1e-4,
                 answer_abs_tol: float = 5e-3, synthetic_sizes: Mapping[str, int] | None = None,
                 lowercase: bool = False):
        weights = dict(DEFAULT_PERTURBATION_WEIGHTS if perturbation_weights is None else perturbation_weights)
        unknown = set(weights) - set(PERTURBATIONS)
        if unknown or not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"perturbation_weights must map some of {PERTURBATIONS} to non-negative weights "
                             f"with a positive sum, got {perturbation_weights}")
        if not 0.0 <= no_change_rate <= 1.0:
            raise ValueError(f"no_change_rate must be in [0, 1], got {no_change_rate}")
        self.seed = seed
        self.val_size = val_size
        self.no_change_rate = no_change_rate
        self.perturbation_weights = weights
        self.answer_rel_tol = answer_rel_tol
        self.answer_abs_tol = answer_abs_tol
        self.synthetic_sizes = {**synthetic_mwp.DEFAULT_SIZES, **(synthetic_sizes or {})}
        self.lowercase = lowercase
        self._synthetic_cache: dict[str, tuple[Example, ...]] | None = None

    # -- data

    def load(self, split: str, data_dir: str | None = None, **kwargs) -> list[Example]:
        """Examples of "train", "val" or "test". `data_dir=None`: the embedded synthetic generator. Otherwise the
        folder of SVAMP's `mawps-asdiv-a_svamp` csvs: train/val come from `train.csv` (val = a seeded held-out
        slice), test is `dev.csv` (SVAMP)."""
        if split not in ("train", "val", "test"):
            raise ValueError(f"unknown split {split!r}; choose train, val or test")
        if kwargs:
            raise TypeError(f"unexpected options for MWPTask.load: {sorted(kwargs)}")
        if data_dir is None:
            return list(self._synthetic()[split])
        if split == "test":
            return _examples_from_csv(os.path.join(data_dir, "dev.csv"), "svamp", self.lowercase)
        train, val = heldout_split(_examples_from_csv(os.path.join(data_dir, "train.csv"), "mawps", self.lowercase),
                                   self.val_size, self.seed)
        return train if split == "train" else val

    def fresh_problems(self, n: int, data_dir: str | None = None) -> list[Example]:
        """`n` problems of the embedded generator that no split holds (for a critic trained on more problems than
        the generator sees); [] when the task reads a dataset (`data_dir`), which has no generator."""
        if data_dir is not None or n <= 0:
            return []
        problems = synthetic_mwp.generate_splits({**self.synthetic_sizes, "extra": n}, seed=self.seed)["extra"]
        return [_synthetic_example(p) for p in problems]

    def _synthetic(self) -> dict[str, tuple[Example, ...]]:
        if self._synthetic_cache is None:
            problems = synthetic_mwp.generate_splits(self.synthetic_sizes, seed=self.seed)
            self._synthetic_cache = {split: tuple(_synthetic_example(p) for p in items)
                                     for split, items in problems.items()}
        return self._synthetic_cache

    # -- critic

    @staticmethod
    def target(example: Example) -> str:
        return example.z

    def critic_input(self, example: Example, hypothesis: str) -> str:
        return f"{example.x} {hypothesis}"

    def oracle_feedback(self, example: Example, hypothesis: str) -> Feedback:
        gold = parse_formula(example.z)
        hyp = parse_formula(hypothesis)
        if not hyp.ok:
            errors: tuple[StepError, ...] = (StepError("unparsable", None, hyp.error),)
        elif not gold.ok:
            errors = (StepError("unparsable", None, f"gold formula is malformed: {gold.error}"),)
        else:
            errors = oracle_errors(gold.formula, hyp.formula)
        return Feedback(errors, feedback_text(errors))

    def perturb(self, example: Example, rng: random.Random) -> tuple[str, Feedback]:
        """A perturbed gold formula and its oracle feedback. With probability `no_change_rate` the gold (or, half
        of the time, an equivalent rewrite with swapped add/multiply operands) and "No hint"; otherwise one of
        PERTURBATIONS drawn by weight and re-drawn until the oracle reports the intended error."""
        gold = parse_formula(example.z).formula
        if gold is None:
            return example.z, self.oracle_feedback(example, example.z)
        if rng.random() < self.no_change_rate:
            hyp = _equivalent_rewrite(gold, rng) if rng.random() < 0.5 else gold
            return format_formula(hyp), self.oracle_feedback(example, format_formula(hyp))
        n_numbers = len(example.meta.get("numbers", ())) or 1 + max(
            (int(a.value) for s in gold.steps for a in (s.first, s.second) if a.kind == "number"), default=0)
        kinds = [k for k in PERTURBATIONS if self.perturbation_weights.get(k, 0) > 0]
        for _ in range(20):
            kind = rng.choices(kinds, weights=[self.perturbation_weights[k] for k in kinds])[0]
            made = _PERTURBERS[kind](gold, rng, n_numbers)
            if made is None:
                continue
            hyp, intended = made
            text = format_formula(hyp)
            feedback = self.oracle_feedback(example, text)
            if intended & {e.kind for e in feedback.errors}:
                return text, feedback
        hyp, _ = _extra_step(gold, rng, n_numbers)  # always applicable and always flagged
        text = format_formula(hyp)
        return text, self.oracle_feedback(example, text)

    # -- reward-model views

    def split_steps(self, hypothesis: str) -> list[str]:
        """The `#k:` items of a hypothesis (`|`-separated, stripped, end marker dropped)."""
        return _pieces(hypothesis) if isinstance(hypothesis, str) else []

    def step_labels(self, example: Example, hypothesis: str) -> list[bool]:
        """Prefix-correctness of each step: step k is correct when it and every step before it parse and each of
        them computes a distinct subexpression of the gold formula (structural comparison: operands of
        add/multiply unordered, #j resolved). A duplicated or superfluous step is wrong and so is everything after
        a wrong step. A lone bare number is correct when the whole formula is equivalent to the gold."""
        pieces = self.split_steps(hypothesis)
        gold = parse_formula(example.z).formula
        if gold is None:
            return [False] * len(pieces)
        if len(pieces) == 1 and not pieces[0].startswith("#"):
            hyp = parse_formula(pieces[0]).formula
            return [hyp is not None and equivalent(gold, hyp)]
        interner = _Interner()
        remaining = collections.Counter(interner.step_ids(gold))
        labels: list[bool] = []
        steps: list[Step] = []
        ok = True
        for k, piece in enumerate(pieces):
            step = _parse_step(piece, k) if ok else None
            if isinstance(step, Step):
                steps.append(step)
                sid = interner.step_ids(Formula(tuple(steps)))[-1]
                ok = sid is not None and remaining[sid] > 0
                if ok:
                    remaining[sid] -= 1
            else:
                ok = False
            labels.append(ok)
        return labels

    # -- metrics

    def outcome_label(self, example: Example, hypothesis: str) -> bool:
        """Answer correctness of one hypothesis (the outcome label)."""
        return answers_match(execute(hypothesis, example.meta.get("numbers", ())), _gold_answer(example),
                             self.answer_rel_tol, self.answer_abs_tol)

    def answer_key(self, example: Example, hypothesis: str) -> float | None:
        """The executed answer to 6 significant digits (formulas that agree up to rounding vote together); None when
        the hypothesis does not execute."""
        value = execute(hypothesis, example.meta.get("numbers", ())) if isinstance(hypothesis, str) else None
        return None if value is None else float(f"{value:.6g}") + 0.0  # + 0.0: -0.0 -> 0.0

    def score(self, predictions: Sequence[str], examples: Sequence[Example]) -> dict[str, float]:
        """Means over examples: `equation_em_strict` (string equality after whitespace normalisation),
        `equation_em_canonical` (`equivalent`), `answer_accuracy` (executed answer within tolerance),
        `parse_rate` and `execution_rate` (an answer could be computed)."""
        if len(predictions) != len(examples):
            raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples")
        totals = collections.Counter()
        for pred, ex in zip(predictions, examples):
            parsed = parse_formula(pred)
            gold = parse_formula(ex.z).formula
            value = execute(parsed.formula, ex.meta.get("numbers", ())) if parsed.ok else None
            totals["equation_em_strict"] += isinstance(pred, str) and normalize_whitespace(pred) == \
                normalize_whitespace(ex.z)
            totals["equation_em_canonical"] += parsed.ok and gold is not None and equivalent(gold, parsed.formula)
            totals["answer_accuracy"] += answers_match(value, _gold_answer(ex), self.answer_rel_tol,
                                                       self.answer_abs_tol)
            totals["parse_rate"] += parsed.ok
            totals["execution_rate"] += value is not None
        n = max(len(examples), 1)
        keys = ("equation_em_strict", "equation_em_canonical", "answer_accuracy", "parse_rate", "execution_rate")
        return {k: totals[k] / n for k in keys}


def _synthetic_example(p: synthetic_mwp.Problem) -> Example:
    return _example_from_fields(p.uid, p.question, p.numbers, p.equation, p.answer,
                                {"family": p.family, "domain": p.domain})


def _gold_answer(example: Example) -> float:
    answer = example.meta.get("answer")
    if answer is None:
        try:
            return float(example.y)
        except ValueError:
            return math.nan
    return float(answer)


# ----------------------------------------------------------------------------------------------- perturbations
# Each perturber returns (hypothesis formula, error kinds the oracle should report) or None when not applicable.


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
