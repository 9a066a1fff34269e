"""The sNLR task (HELM `synthetic_reasoning_natural`, hard): five rules, a fact, and what follows by one rule.

x = the rules, `Fact:`, the fact and the question line (HELM's input); z = a `#k:`-numbered reasoning chain in
REFINER's style; y = the consequents ("The poppy is strong" or "Nothing").

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

import json
import os
import random
import re
from typing import Any, Mapping, NamedTuple, Sequence

from refiner_jax.tasks.base import NO_HINT, DataError, Example, Feedback, StepError
from refiner_jax.tasks.snlr_generator import (
    CATEGORY_NAMES,
    DIFFICULTIES,
    ENTITY_TO_CATEGORY,
    GENERIC_INDEX,
    GENERIC_NAMES,
    SURFACE_TO_GENERIC,
    capitalise,
    generate_records,
    noun_phrase,
)

NOTHING_STEP = "The argument is invalid!!"
CHAIN_STYLES = ("refiner", "explicit")
ERROR_KINDS = ("invalid_and", "invalid_or", "missing_link", "missing_implicit")
MISSING_LINK = "Missing link between the fact and the rules."
MISSING_IMPLICIT = "The implicit knowledge is missing."
SPLITS = ("train", "val", "test")
REQUIRED_KEYS = ("rules", "fact", "consequents")

_NOTHING_TEXTS = frozenset({"the argument is invalid", "nothing", "no rule applies"})
_STEP_MARK = re.compile(r"#\d+:")
_RULE_RE = re.compile(r"If (?:(?:a|an) )?(\S+) is (.+), then (?:the )?(\S+) is (\S+)\.")
_FACT_RE = re.compile(r"(?:The )?(\S+) is (\S+) and (\S+)\.")
_ANSWER_RE = re.compile(r"(?:The )?(\S+) is (.+)")


class Step(NamedTuple):
    """One chain step: its text, role ("lexical", "category", "condition", "conclusion", "nothing") and the index
    of the rule it serves (None for the conclusion)."""

    text: str
    role: str
    rule: int | None


class Statement(NamedTuple):
    """A hypothesis step read against a problem: its shape, whether it is true, and its atomic claims."""

    shape: str  # "lexical", "category", "condition", "nothing" or "unknown"
    true: bool
    atoms: frozenset


# --------------------------------------------------------------------------------------------------- records


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


# --------------------------------------------------------------------------------------------------- chains


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


# --------------------------------------------------------------------------------------------------- metrics


def helm_attribute_set(text: str) -> frozenset:
    """HELM's reading of an answer, applied to a chain's last step: no-conclusion sentences give the empty set;
    otherwise drop periods, keep the text after the last " is " and split on " and " (first line only)."""
    steps = split_steps(text)
    if not steps:
        return frozenset()
    line = steps[-1].split("\n")[0].strip().lower()
    if line.rstrip(".!").strip() in _NOTHING_TEXTS:
        return frozenset()
    tail = line.replace(".", "").split(" is ")[-1]
    return frozenset(a.strip() for a in tail.split(" and ") if a.strip())


def set_f1(gold: frozenset, predicted: frozenset) -> float:
    """HELM's F1 = 2|G∩P| / (|G|+|P|); 1 when both are empty."""
    if not gold and not predicted:
        return 1.0
    return 2 * len(gold & predicted) / (len(gold) + len(predicted))


def set_iou(gold: frozenset, predicted: frozenset) -> float:
    """HELM's IoU = |G∩P| / |G∪P|; 1 when both are empty."""
    if not gold and not predicted:
        return 1.0
    return len(gold & predicted) / len(gold | predicted)


def _normalise_ws(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------------- task


class SNLRTask:
    """sNLR with REFINER's chains, a structural oracle, perturbations for critic training and HELM metrics.

    Options: `seed`, `train_size`, `val_size`, `test_size` (generated data: one stream, cut in this order; the
    defaults reproduce REFINER's released splits), `difficulty` (generated data), `no_change_rate` (share of
    `perturb` calls returning the gold chain), `chain_style` ("refiner" or "explicit", see the module docstring),
    `use_released_chains` (files: take z from the `explanations` field rather than rebuilding it, wherever the
    oracle accepts that chain; about 1% of the released chains leave out a link, and those items get the rebuilt
    chain, so that no training target is one the critic is taught to call wrong).
    """

    name = "snlr"
    error_kinds = ERROR_KINDS
    primary_metric = "ir_em"

    def __init__(self, seed: int = 42, train_size: int = 1000, val_size: int = 5000, test_size: int = 5000,
                 difficulty: str = "hard", no_change_rate: float = 0.2, chain_style: str = "refiner",
                 use_released_chains: bool = True):
        sizes = {"train_size": train_size, "val_size": val_size, "test_size": test_size}
        for key, value in sizes.items():
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} must be a non-negative int, got {value!r}")
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
        if not 0.0 <= no_change_rate <= 1.0:
            raise ValueError(f"no_change_rate must be in [0, 1], got {no_change_rate}")
        if chain_style not in CHAIN_STYLES:
            raise ValueError(f"chain_style must be one of {CHAIN_STYLES}, got {chain_style!r}")
        self.seed, self.difficulty = seed, difficulty
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.no_change_rate = no_change_rate
        self.chain_style = chain_style
        self.use_released_chains = use_released_chains
        self._generated: list[dict] | None = None

    # ---- data

    def example_from_record(self, record: Mapping[str, Any], uid: str, where: str | None = None) -> Example:
        meta = parse_record(record, where or uid)
        z = record.get("explanations") if self.use_released_chains else None
        if not isinstance(z, str) or oracle_errors(meta, z, self.chain_style):
            z = build_chain(meta, self.chain_style)
        return Example(uid=uid, x=render_x(record["rules"], record["fact"], meta), z=z, y=render_y(meta), meta=meta)

    def load(self, split: str, data_dir: str | None = None, **kwargs) -> list[Example]:
        """Generated examples (`data_dir=None`) or those of `<data_dir>/srn_<split>.json` (REFINER's layout)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if kwargs:
            raise TypeError(f"unexpected options {sorted(kwargs)}; pass task options to SNLRTask(...)")
        if data_dir is None:
            if self._generated is None:
                self._generated = generate_records(self.seed, sum(self.sizes.values()), self.difficulty)
            start = sum(self.sizes[s] for s in SPLITS[:SPLITS.index(split)])
            records = self._generated[start:start + self.sizes[split]]
            return [self.example_from_record(r, f"snlr-seed{self.seed}-{split}-{i}") for i, r in enumerate(records)]
        path = os.path.join(data_dir, f"srn_{split}.json")
        expected = f"a JSON list of records with keys {list(REQUIRED_KEYS)} (REFINER's data/srn/srn_{split}.json)"
        try:
            with open(path, encoding="utf-8") as f:
                records = json.load(f)
        except FileNotFoundError:
            raise DataError(f"{path}: file not found; expected {expected}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DataError(f"{path}: not valid JSON ({err}); expected {expected}") from None
        if not isinstance(records, list) or not records:
            raise DataError(f"{path}: expected {expected}, got "
                            f"{'an empty list' if records == [] else type(records).__name__}")
        return [self.example_from_record(r, f"snlr-{split}-{i}", f"{path}: record {i}") for i, r in enumerate(records)]

    # ---- critic

    @staticmethod
    def target(example: Example) -> str:
        return example.z

    def critic_input(self, example: Example, hypothesis: str) -> str:
        return f"{example.x} {hypothesis}"

    def oracle_feedback(self, example: Example, hypothesis: str) -> Feedback:
        return feedback_from_errors(oracle_errors(example.meta, hypothesis, self.chain_style))

    def perturbation_kinds(self, example: Example) -> tuple[str, ...]:
        """The error kinds `perturb` can make for this problem."""
        return tuple(k for k, options in self._perturbation_options(example.meta).items() if options)

    def perturb(self, example: Example, rng: random.Random, kind: str | None = None) -> tuple[str, Feedback]:
        """A wrong chain with one error kind (drawn uniformly among those possible, or `kind`) or, at rate
        `no_change_rate` when `kind` is None, the gold chain; with its oracle feedback."""
        meta = example.meta
        if kind is None:
            if rng.random() < self.no_change_rate:
                gold = build_chain(meta, self.chain_style)
                return gold, self.oracle_feedback(example, gold)
            options = self._perturbation_options(meta)
            kind = rng.choice([k for k in ERROR_KINDS if options[k]])
        else:
            options = self._perturbation_options(meta)
            if kind not in options or not options[kind]:
                raise ValueError(f"cannot make a {kind!r} error for {example.uid}; "
                                 f"possible: {self.perturbation_kinds(example)}")
        steps = rng.choice(options[kind])(rng)
        hypothesis = serialize(steps)
        return hypothesis, self.oracle_feedback(example, hypothesis)

    def _perturbation_options(self, meta: Mapping[str, Any]) -> dict[str, list]:
        """For each error kind, the ways (functions rng -> steps) of making it on this problem."""
        style, rules, attributes = self.chain_style, meta["rules"], meta["fact_attributes"]
        applied = fired_applications(meta)
        fired = {r for r, _ in applied}
        gold = build_steps(meta, style)
        idle = [i for i in range(len(rules)) if i not in fired]
        new = [i for i in idle if rules[i]["consequent"] not in attributes]
        two = [i for i in new if len(rules[i]["conditions"]) == 2]
        half_and = [i for i in two if rules[i]["connective"] == "and"]
        dead_or = [i for i in two if rules[i]["connective"] == "or"]
        unsupported = [i for i in idle if i not in two]  # one condition not held, or consequent already in the fact

        def held(i: int) -> list[str]:
            return [c for c in rules[i]["conditions"] if c in attributes]

        def add_rule(pool: list[int], conditions) -> Any:
            def make(rng: random.Random) -> list[Step]:
                i = rng.choice(pool)
                return build_steps(meta, style, [*applied, (i, conditions(i, rng))])
            return make

        def drop_rule(rng: random.Random) -> list[Step]:
            i = rng.choice(sorted(fired))
            return build_steps(meta, style, [a for a in applied if a[0] != i])

        def without(roles: tuple[str, ...]) -> Any:
            def make(rng: random.Random) -> list[Step]:
                k = rng.choice([j for j, s in enumerate(gold) if s.role in roles])
                return gold[:k] + gold[k + 1:]
            return make

        def corrupt(role: str) -> Any:
            def make(rng: random.Random) -> list[Step]:
                k = rng.choice([j for j, s in enumerate(gold) if s.role == role])
                subject, _, right = gold[k].text.partition(" is ")
                pool = CATEGORY_NAMES if role == "category" else GENERIC_NAMES
                wrong = rng.choice([w for w in pool if w != right])
                return gold[:k] + [gold[k]._replace(text=f"{subject} is {wrong}")] + gold[k + 1:]
            return make

        roles = {s.role for s in gold}
        return {
            "invalid_and": [add_rule(half_and, lambda i, rng: held(i))] if half_and else [],
            "invalid_or": [add_rule(dead_or, lambda i, rng: [rng.choice(rules[i]["conditions"])])] if dead_or else [],
            "missing_link": ([without(("condition",))] if "condition" in roles else [])
                            + ([drop_rule] if fired else [])
                            + ([add_rule(unsupported, lambda i, rng: held(i))] if unsupported else []),
            "missing_implicit": ([without(("lexical", "category"))] if roles & {"lexical", "category"} else [])
                                + [corrupt(r) for r in ("lexical", "category") if r in roles],
        }

    # ---- reward models

    def split_steps(self, hypothesis: str) -> list[str]:
        return split_steps(hypothesis)

    def step_labels(self, example: Example, hypothesis: str) -> list[bool]:
        """Prefix correctness (Uesato et al.): step i is correct when steps 0..i all are. A non-final step is correct
        when it is a true statement about the problem (a valid synonym, the entity's category, or attributes the
        entity has); the final step when the whole hypothesis passes the oracle."""
        steps = split_steps(hypothesis)
        if not steps:
            return []
        truths = [read_statement(s, example.meta).true for s in steps[:-1]]
        truths.append(not oracle_errors(example.meta, hypothesis, self.chain_style))
        labels, ok = [], True
        for t in truths:
            ok = ok and t
            labels.append(ok)
        return labels

    def outcome_label(self, example: Example, hypothesis: str) -> bool:
        """The chain concludes the gold consequents (HELM's exact set match of the last step's attributes)."""
        return helm_attribute_set(hypothesis if isinstance(hypothesis, str) else "") == \
            frozenset(example.meta["consequents"])

    def answer_key(self, example: Example, hypothesis: str) -> frozenset | None:
        """The concluded attributes (HELM's reading of the last step); None when the chain concludes nothing."""
        return helm_attribute_set(hypothesis if isinstance(hypothesis, str) else "") or None

    # ---- metrics

    def score(self, predictions: Sequence[str], examples: Sequence[Example]) -> dict[str, float]:
        """ir_em: chain exact match (whitespace-normalised), the paper's IR metric; ir_valid: chains the oracle
        accepts (every step valid and the conclusion reached, in any order: what "No hint" stops refinement on);
        consequent_acc: HELM exact set match of the last step's attributes; consequent_f1 / consequent_iou: HELM's
        set F1 / IoU. Means over examples."""
        if len(predictions) != len(examples):
            raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples")
        totals = dict.fromkeys(("ir_em", "ir_valid", "consequent_acc", "consequent_f1", "consequent_iou"), 0.0)
        for prediction, example in zip(predictions, examples):
            text = prediction if isinstance(prediction, str) else ""
            gold = frozenset(example.meta["consequents"])
            predicted = helm_attribute_set(text)
            totals["ir_em"] += float(_normalise_ws(text) == _normalise_ws(example.z))
            totals["ir_valid"] += float(not oracle_errors(example.meta, text, self.chain_style))
            totals["consequent_acc"] += float(predicted == gold)
            totals["consequent_f1"] += set_f1(gold, predicted)
            totals["consequent_iou"] += set_iou(gold, predicted)
        n = max(len(examples), 1)
        return {k: v / n for k, v in totals.items()}
