"""`MWPTask`: math word problems as a REFINER / reward-model task, with MAWPS+ASDiv-A for training and SVAMP for
testing (`svamp_data`) or the embedded generator (`synthetic`), linear formulas as hypotheses (`formula`), the
structural oracle (`oracle`), perturbations (`perturbations`), step labels and metrics."""
from __future__ import annotations

import collections
import math
import os
import random
from typing import Mapping, Sequence

from refiner_jax.tasks import data_sources
from refiner_jax.tasks.base import Example, Feedback, StepError, Task
from refiner_jax.tasks.mwp import coincidences, synthetic
from refiner_jax.tasks.mwp.formula import (Formula, Step, _parse_step, _pieces, answers_match, execute,
                                           format_formula, normalize_whitespace, parse_formula)
from refiner_jax.tasks.mwp.oracle import (ERROR_KINDS, SENTENCES, _Interner, equivalent, feedback_text,
                                          oracle_errors)
from refiner_jax.tasks.mwp.perturbations import (DEFAULT_PERTURBATION_WEIGHTS, PERTURBATIONS, _PERTURBERS,
                                                 _equivalent_rewrite, _extra_step)
from refiner_jax.tasks.mwp.svamp_data import (_example_from_fields, _examples_from_csv, examples_from_dataset,
                                              heldout_split)


class MWPTask(Task):
    """The math-word-problem task (see `mwp.formula` for the formula format).

    Options: `seed` (val split and synthetic data), `val_size` (problems held out of train.csv for validation),
    `no_change_rate` (share of unchanged hypotheses among perturbations), `perturbation_weights` (relative weights
    of PERTURBATIONS), `answer_rel_tol`/`answer_abs_tol` (answer accuracy), `synthetic_sizes` (train/val/test
    sizes of the embedded generator used when `data_dir` is None), `lowercase` (lower-case the csv questions:
    SVAMP's test questions are all lower case while 61% of MAWPS+ASDiv-A's training questions have capitals, which
    a tokenizer trained from scratch splits differently), `trace_rate` and `trace_kinds` (the share of generated
    problems whose values let a wrong step reach the right answer, and how: `coincidences`).
    """

    name = "mwp"
    error_kinds = ERROR_KINDS
    primary_metric = "equation_em_canonical"

    def __init__(self, seed: int = 0, val_size: int = 300, no_change_rate: float = 0.2,
                 perturbation_weights: Mapping[str, float] | None = None, answer_rel_tol: float = 1e-4,
                 answer_abs_tol: float = 5e-3, synthetic_sizes: Mapping[str, int] | None = None,
                 lowercase: bool = False, trace_rate: float = 0.0,
                 trace_kinds: Sequence[str] = coincidences.KINDS):
        weights = dict(DEFAULT_PERTURBATION_WEIGHTS if perturbation_weights is None else perturbation_weights)
        unknown = set(weights) - set(PERTURBATIONS)
        if unknown or not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"perturbation_weights must map some of {PERTURBATIONS} to non-negative weights "
                             f"with a positive sum, got {perturbation_weights}")
        if not 0.0 <= no_change_rate <= 1.0:
            raise ValueError(f"no_change_rate must be in [0, 1], got {no_change_rate}")
        if not 0.0 <= trace_rate <= 1.0:
            raise ValueError(f"trace_rate must be in [0, 1] (the share of problems given a coincidence), got "
                             f"{trace_rate}")
        if not trace_kinds or set(trace_kinds) - set(coincidences.KINDS):
            raise ValueError(f"trace_kinds must be some of {coincidences.KINDS}, got {trace_kinds}")
        self.seed = seed
        self.val_size = val_size
        self.no_change_rate = no_change_rate
        self.perturbation_weights = weights
        self.answer_rel_tol = answer_rel_tol
        self.answer_abs_tol = answer_abs_tol
        self.synthetic_sizes = {**synthetic.DEFAULT_SIZES, **(synthetic_sizes or {})}
        self.lowercase = lowercase
        self.trace_rate, self.trace_kinds = trace_rate, tuple(trace_kinds)
        self._synthetic_cache: dict[str, tuple[Example, ...]] | None = None

    # -- data

    def load(self, split: str, data_dir: str | None = None, **kwargs) -> list[Example]:
        """Examples of "train", "val" or "test". `data_dir=None`: the embedded synthetic generator. Otherwise the
        folder of SVAMP's `mawps-asdiv-a_svamp` csvs: train/val come from `train.csv` (val = a seeded held-out
        slice), test is `dev.csv` (SVAMP); or data files or a hub dataset with train and test splits in either SVAMP
        layout (`tasks.data_sources`, `tasks.dataset_rows`)."""
        if split not in ("train", "val", "test"):
            raise ValueError(f"unknown split {split!r}; choose train, val or test")
        if kwargs:
            raise TypeError(f"unexpected options for MWPTask.load: {sorted(kwargs)}")
        if data_dir is None:
            return list(self._synthetic()[split])
        own = data_sources.reads_own_files(data_dir, ("train.csv", "dev.csv"))
        if split == "test":
            if own:
                return _examples_from_csv(os.path.join(data_dir, "dev.csv"), "svamp", self.lowercase)
            return examples_from_dataset(data_dir, "test", "svamp", self.lowercase)
        train = (_examples_from_csv(os.path.join(data_dir, "train.csv"), "mawps", self.lowercase) if own
                 else examples_from_dataset(data_dir, "train", "mawps", self.lowercase))
        train, val = heldout_split(train, self.val_size, self.seed)
        return train if split == "train" else val

    def fresh_problems(self, n: int, data_dir: str | None = None) -> list[Example]:
        """`n` problems of the embedded generator that no split holds (for a critic trained on more problems than
        the generator sees); [] when the task reads a dataset (`data_dir`), which has no generator."""
        if data_dir is not None or n <= 0:
            return []
        problems = synthetic.generate_splits({**self.synthetic_sizes, "extra": n}, seed=self.seed)["extra"]
        return [_synthetic_example(p) for p in self._coincide(problems)]

    def _synthetic(self) -> dict[str, tuple[Example, ...]]:
        if self._synthetic_cache is None:
            problems = synthetic.generate_splits(self.synthetic_sizes, seed=self.seed)
            self._synthetic_cache = {split: tuple(_synthetic_example(p) for p in self._coincide(items))
                                     for split, items in problems.items()}
        return self._synthetic_cache

    def _coincide(self, problems: Sequence[synthetic.Problem]) -> list[synthetic.Problem]:
        if self.trace_rate <= 0:
            return list(problems)
        return coincidences.apply(problems, self.trace_rate, self.seed, self.trace_kinds)

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

    @staticmethod
    def step_sentences(step: int) -> list[str]:
        """Every error sentence the critic can say about step `#step`: its operator, its first and second number."""
        return [SENTENCES[kind].format(k=step) for kind in ("operator", "first_number", "second_number")]

    @classmethod
    def location_feedback(cls, step: int) -> str:
        """Feedback that says only where the error is: every sentence about step `#step`, in the critic's own
        vocabulary, with no claim about which part is wrong."""
        return " ".join(cls.step_sentences(step))

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


def _synthetic_example(p: synthetic.Problem) -> Example:
    return _example_from_fields(p.uid, p.question, p.numbers, p.equation, p.answer,
                                {"family": p.family, "domain": p.domain, **({"coincidence": p.coincidence} if p.coincidence else {})})


def _gold_answer(example: Example) -> float:
    answer = example.meta.get("answer")
    if answer is None:
        try:
            return float(example.y)
        except ValueError:
            return math.nan
    return float(answer)
