"""Choosing one of K sampled solutions per problem, and reporting how good the choice is.

Model-agnostic: answers are any hashable values (None for a sample without a final answer) and scores are arrays a
reward model computed elsewhere, so this module needs only numpy (and matplotlib for the plot). Every rule returns
a `Selection`: per problem the chosen sample's index (-1 when no sample has an answer, which counts as wrong), its
answer and a confidence for selective prediction. `Selection.outcome` turns per-sample correctness into per-problem
`Outcome`s, from which `results_table` reports final-answer error, trace error and error at an abstention rate,
with percentile-bootstrap intervals over problems. `RULES` is the one registry of the rules the runs' tables print
(`rule_rows`): a rule added there is a row of every run that supplies the scores it reads.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Hashable, Mapping, NamedTuple, Sequence

import numpy as np

from refiner_jax.stats import interval, resamples

REDUCTIONS = ("last", "min", "prod")
COVERAGES = tuple(np.round(np.arange(1, 21) / 20, 2))  # 0.05, 0.10, ..., 1.0
COLUMNS = ("final_answer_error", "trace_error", "abstention_error")


# ----------------------------------------------------------------------------------------------- step scores


def solution_scores(step_scores, reduction: str = "last", step_mask=None) -> np.ndarray:
    """One score per solution from its step scores: `last` (the ORM's, and a PRM's all-steps-correct probability),
    `min` (the weakest step) or `prod` (PRM800K's). `step_scores` is a list of 1-D arrays (ragged) or a padded
    array [n, max_steps] with an optional bool `step_mask` of the same shape (True = a real step). Returns [n]."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    if isinstance(step_scores, np.ndarray) and step_scores.ndim == 2:
        scores = step_scores.astype(np.float64)
        mask = np.ones(scores.shape, bool) if step_mask is None else np.asarray(step_mask, bool)
        if mask.shape != scores.shape:
            raise ValueError(f"step_mask shape {mask.shape} != step_scores shape {scores.shape}")
        _check_nonempty(mask.sum(axis=1))
        if reduction == "min":
            return np.where(mask, scores, np.inf).min(axis=1)
        if reduction == "prod":
            return np.where(mask, scores, 1.0).prod(axis=1)
        last = mask.shape[1] - 1 - mask[:, ::-1].argmax(axis=1)  # [n] position of the last real step
        return scores[np.arange(len(scores)), last]
    if step_mask is not None:
        raise ValueError("step_mask goes with a padded 2-D array, not with a list of per-solution arrays")
    rows = [np.asarray(s, np.float64).reshape(-1) for s in step_scores]
    lengths = np.array([len(r) for r in rows], np.int64)
    _check_nonempty(lengths)
    if not rows:
        return np.zeros(0)
    flat = np.concatenate(rows)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    if reduction == "min":
        return np.minimum.reduceat(flat, starts)
    if reduction == "prod":
        return np.multiply.reduceat(flat, starts)
    return flat[starts + lengths - 1]


def _check_nonempty(lengths: np.ndarray) -> None:
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise ValueError(f"solution {int(empty[0])} has no steps to score ({empty.size} empty in all)")


# ----------------------------------------------------------------------------------------------- selection


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Per-problem results of one selection rule, all [n]: the chosen answer is right (`correct`), every step of
    the chosen solution is right (`steps_correct`, None when unknown) and the rule's `confidence`."""

    correct: np.ndarray
    confidence: np.ndarray
    steps_correct: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Selection:
    """One rule's choice per problem: `index` [n] of the chosen sample (-1: none had an answer), its `answer`
    (None then) and `confidence` [n] (-inf then, so that abstention drops those problems first)."""

    index: np.ndarray
    answer: list
    confidence: np.ndarray

    def outcome(self, sample_correct, sample_steps_correct=None) -> Outcome:
        """Per-problem `Outcome` from per-sample booleans [n, K]: final answer right, all steps right."""
        correct = _take(sample_correct, self.index, "sample_correct")
        steps = (None if sample_steps_correct is None
                 else _take(sample_steps_correct, self.index, "sample_steps_correct"))
        return Outcome(correct, self.confidence, steps)


def _take(values, index: np.ndarray, what: str) -> np.ndarray:
    """values[i, index[i]] per problem, False where nothing was selected."""
    values = np.asarray(values, bool)
    if values.ndim != 2 or values.shape[0] != len(index) or values.shape[1] <= index.max(initial=-1):
        raise ValueError(f"{what} has shape {values.shape}; expected [{len(index)}, K] like the answers")
    return np.where(index >= 0, values[np.arange(len(index)), np.maximum(index, 0)], False)


class _Answers(NamedTuple):
    rows: list  # [n][K] the answers as given
    valid: np.ndarray  # [n, K] the sample has an answer
    group: np.ndarray  # [n, K] id of (problem, answer): equal for equal answers of one problem


def _encode(answers: Sequence[Sequence[Hashable | None]]) -> _Answers:
    """Integer ids for the answers so that voting is array arithmetic (equal answers under `==` share an id)."""
    rows = [list(r) for r in answers]
    lengths = sorted({len(r) for r in rows})
    if len(lengths) != 1 or lengths[0] == 0:
        raise ValueError(f"every problem needs the same number K >= 1 of samples; got lengths {lengths} "
                         "(pad with None: a missing sample has no answer)")
    k = lengths[0]
    ids: dict = {}
    code = np.fromiter((0 if a is None else ids.setdefault(a, len(ids) + 1) for r in rows for a in r),
                       np.int64, count=len(rows) * k).reshape(len(rows), k)
    key = np.arange(len(rows))[:, None] * (len(ids) + 1) + code  # [n, K] unique per (problem, answer)
    group = np.unique(key.ravel(), return_inverse=True)[1].reshape(code.shape)
    return _Answers(rows, code > 0, group)


def _scores(scores, enc: _Answers, rule: str) -> np.ndarray:
    if scores is None:
        raise ValueError(f"{rule} needs scores")
    s = np.asarray(scores, np.float64)
    if s.shape != enc.valid.shape:
        raise ValueError(f"scores shape {s.shape} != answers shape {enc.valid.shape}")
    if np.isnan(s[enc.valid]).any() or np.isposinf(s[enc.valid]).any():
        raise ValueError("scores must be finite (or -inf: unscored) for every sample with an answer")
    return s


def _selection(enc: _Answers, index: np.ndarray, confidence: np.ndarray) -> Selection:
    has = enc.valid.any(axis=1)
    index = np.where(has, index, -1)
    answer = [enc.rows[i][j] if j >= 0 else None for i, j in enumerate(index.tolist())]
    return Selection(index, answer, np.where(has, confidence, -np.inf))


def greedy(answers, scores=None) -> Selection:
    """Sample 0 of each problem (put the greedy decode there; a separately decoded greedy answer is a K=1 array).
    Confidence: its score, or 1.0 for every problem without scores (all tied: abstention then gains nothing)."""
    enc = _encode(answers)
    index = np.where(enc.valid[:, 0], 0, -1)
    confidence = np.ones(len(index)) if scores is None else _scores(scores, enc, "greedy")[:, 0]
    return _selection(enc._replace(valid=enc.valid[:, :1]), index, confidence)


def majority_vote(answers, scores=None) -> Selection:
    """The most frequent answer (self-consistency); ties go to the answer occurring first, and the chosen sample
    is its first occurrence. Confidence: its vote share among the samples with an answer. `scores` are unused."""
    enc = _encode(answers)
    counts = np.bincount(enc.group.ravel(), weights=enc.valid.ravel())
    votes = counts[enc.group]  # [n, K]; samples without an answer have 0
    index = votes.argmax(axis=1)  # the first maximum is the first occurrence of the first winning answer
    return _selection(enc, index, votes[np.arange(len(index)), index] / np.maximum(enc.valid.sum(axis=1), 1))


def best_of_k(answers, scores) -> Selection:
    """The highest-scoring sample among those with an answer (reranking); ties go to the earlier sample.
    Confidence: that top score."""
    enc = _encode(answers)
    s = np.where(enc.valid, _scores(scores, enc, "best_of_k"), -np.inf)
    index = s.argmax(axis=1)
    return _selection(enc, index, s[np.arange(len(index)), index])


def best_scored(answers, scores) -> Selection:
    """The highest-scoring sample whether or not it has an answer (a verifier's pick among whole solutions: one
    without an answer can be chosen, and then counts wrong); ties go to the earlier sample, -inf marks a sample the
    verifier could not score. Confidence: that top score."""
    enc = _encode(answers)
    s = np.asarray(scores, np.float64)
    if s.shape != enc.valid.shape or np.isnan(s).any() or np.isposinf(s).any():
        raise ValueError(f"best_scored needs [n, K] scores like the answers {enc.valid.shape} without NaN or +inf; "
                         f"got shape {s.shape}")
    index = s.argmax(axis=1)
    rows = np.arange(len(index))
    return Selection(index, [enc.rows[i][j] for i, j in enumerate(index.tolist())], s[rows, index])


def weighted_vote(answers, scores) -> Selection:
    """The answer with the largest summed score over its samples (RM-weighted voting); exact ties go to the answer
    occurring first. The chosen sample is that answer's highest-scoring one (its best trace). Confidence: the
    winning answer's summed score over the total of all answered samples' scores (0 when that total is 0). An
    unscored sample (-inf) weighs nothing."""
    enc = _encode(answers)
    s = _scores(scores, enc, "weighted_vote")
    s = np.where(enc.valid & (s > -np.inf), s, 0.0)
    if (s < 0).any():
        raise ValueError("weighted_vote needs non-negative scores (e.g. probabilities of being correct)")
    mass = np.bincount(enc.group.ravel(), weights=s.ravel())[enc.group]  # [n, K] summed score of each answer
    winner = np.where(enc.valid, mass, -np.inf).argmax(axis=1)
    rows = np.arange(len(winner))
    index = np.where(enc.group == enc.group[rows, winner][:, None], s, -np.inf).argmax(axis=1)
    total = s.sum(axis=1)
    return _selection(enc, index, np.where(total > 0, mass[rows, winner] / np.where(total > 0, total, 1), 0.0))


# ----------------------------------------------------------------------------------------------- the rules' rows


@dataclasses.dataclass(frozen=True)
class Rule:
    """A K-sample selection rule as a row of the results tables: its `label` as printed (`{k}`: the samples per
    problem), `choose(answers, scores) -> Selection`, and `reads`, the name of the score source it ranks or weighs
    by (None: the answers alone). A run supplies the sources it has, and every rule reading one of them is a row."""

    name: str
    label: str
    choose: Callable[..., Selection]
    reads: str | None = None


# Score sources: "orm", "prm" (the run's `prm_reduction`), "log_prob" (the policy's), "prm_rollouts" (the PRM on
# rollout labels), "critic" (a REFINER critic's confidence), all over the samples with an answer; "verifier" (the
# joint system's step verifier, its lowest step score) over every sample, as the joint system picks the sample it
# starts from, so its rerank keeps the plain rerank's label with a rule of its own.
RULES: tuple[Rule, ...] = (
    Rule("majority_vote", "SFT majority vote (K={k})", majority_vote),
    Rule("orm_rerank", "ORM rerank (K={k})", best_of_k, "orm"),
    Rule("prm_rerank", "PRM rerank (K={k})", best_of_k, "prm"),
    Rule("orm_weighted_vote", "ORM-weighted vote (K={k})", weighted_vote, "orm"),
    Rule("prm_weighted_vote", "PRM-weighted vote (K={k})", weighted_vote, "prm"),
    Rule("log_prob_rerank", "SFT log-prob rerank (K={k})", best_of_k, "log_prob"),
    Rule("rollout_prm_rerank", "PRM (rollout labels) rerank (K={k})", best_of_k, "prm_rollouts"),
    Rule("critic_rerank", "REFINER critic rerank (K={k})", best_of_k, "critic"),
    Rule("verifier_rerank", "PRM rerank (K={k})", best_scored, "verifier"),
    Rule("verifier_weighted_vote", "PRM-weighted vote (K={k})", weighted_vote, "verifier"),
)


def rule(name: str) -> Rule:
    """The rule of `RULES` called `name`, with a clear error for an unknown one."""
    found = [r for r in RULES if r.name == name]
    if not found:
        raise ValueError(f"unknown selection rule {name!r}; expected one of {tuple(r.name for r in RULES)}")
    return found[0]


def select(name: str, answers, scores: Mapping[str, object] | None = None) -> Selection:
    """Rule `name`'s choice, reading its source of `scores` (a mapping from source name to [n, K] scores)."""
    chosen = rule(name)
    if chosen.reads is not None and chosen.reads not in (scores or {}):
        raise ValueError(f"selection rule {name!r} reads the {chosen.reads!r} scores; none were given")
    return chosen.choose(answers, None if chosen.reads is None else scores[chosen.reads])


def rule_rows(answers, scores: Mapping[str, object], k: int) -> dict[str, Selection]:
    """`{label: Selection}` of every rule in `RULES` that reads the answers alone or a source of `scores`, in the
    registry's order: the K-sample rows of a results table."""
    return {r.label.format(k=k): select(r.name, answers, scores) for r in RULES if r.reads is None or r.reads in scores}


# ----------------------------------------------------------------------------------------------- metrics


class Curve(NamedTuple):
    """Final-answer error [c] on the problems kept at each coverage [c]."""

    coverage: np.ndarray
    error: np.ndarray


def _kept(coverage: float, n: int) -> int:
    """Problems kept at `coverage`: at least that share (abstain on at most 1 - coverage)."""
    return max(1, math.ceil(round(coverage * n, 9)))


def _kept_error(confidence: np.ndarray, wrong: np.ndarray, kept: int) -> np.ndarray:
    """Error [b] over the `kept` most confident of each row of [b, n]. Problems tied at the cut share the places
    left equally (the expected error over every way of breaking the tie), so the result does not depend on the
    order of problems and a confidence that cannot tell problems apart gains nothing from abstaining."""
    cut = -np.partition(-confidence, kept - 1, axis=1)[:, kept - 1:kept]  # [b, 1] kept-th largest confidence
    above, tied = confidence > cut, confidence == cut
    left = kept - above.sum(axis=1)
    errors = (above & wrong).sum(axis=1) + left * (tied & wrong).sum(axis=1) / tied.sum(axis=1)
    return errors / kept


def _pair(confidence, correct) -> tuple[np.ndarray, np.ndarray]:
    c, y = np.asarray(confidence, np.float64).reshape(-1), np.asarray(correct, bool).reshape(-1)
    if c.shape != y.shape:
        raise ValueError(f"{c.size} confidences for {y.size} correctness values")
    if c.size == 0 or np.isnan(c).any():
        raise ValueError("abstention needs at least one problem and no NaN confidence")
    return c, y


def abstention_curve(confidence, correct, coverages: Sequence[float] = COVERAGES) -> Curve:
    """Selective prediction: at each coverage in (0, 1], abstain on the least confident problems, keeping
    ceil(coverage * n), and report the final-answer error on the kept ones (ties at the cut: see `_kept_error`)."""
    c, y = _pair(confidence, correct)
    cov = np.asarray(coverages, np.float64).reshape(-1)
    if ((cov <= 0) | (cov > 1)).any():
        raise ValueError(f"coverages must be in (0, 1], got {cov.tolist()}")
    error = [_kept_error(c[None], ~y[None], _kept(v, c.size))[0] for v in cov]
    return Curve(cov, np.array(error))


def error_at_abstention(confidence, correct, rate: float = 0.3) -> float:
    """Final-answer error after abstaining on the `rate` share of least confident problems (Uesato: 30%)."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"abstention rate must be in [0, 1), got {rate}")
    return float(abstention_curve(confidence, correct, [1.0 - rate]).error[0])


def final_answer_error(correct) -> float:
    """Share of problems whose selected final answer is wrong (no selection counts as wrong)."""
    return float(1.0 - np.mean(np.asarray(correct, bool)))


def trace_error(correct, steps_correct) -> float:
    """Uesato's trace error: among selected solutions with a right final answer, the share with at least one wrong
    step (NaN when no final answer is right)."""
    y, s = np.asarray(correct, bool), np.asarray(steps_correct, bool)
    if y.shape != s.shape:
        raise ValueError(f"{y.size} final-answer labels for {s.size} step labels")
    return float((y & ~s).sum() / y.sum()) if y.any() else math.nan


def trace_error_floor(sample_correct, sample_steps_correct) -> float:
    """[n, K] labels -> the lowest trace error any rule choosing among the K samples can reach while answering every
    problem it can answer right: per problem with a right sample, a right one with every step right where there is
    one (NaN when no problem has a right sample)."""
    y, s = np.asarray(sample_correct, bool), np.asarray(sample_steps_correct, bool)
    if y.shape != s.shape or y.ndim != 2:
        raise ValueError(f"need two [problems, samples] label arrays, got shapes {y.shape} and {s.shape}")
    answerable = y.any(axis=1)
    return trace_error(answerable, (y & s).any(axis=1) | ~answerable)


# ----------------------------------------------------------------------------------------------- reporting


@dataclasses.dataclass(frozen=True)
class RulesTable:
    """`rows[rule][column] = {"mean", "low", "high"}` for `COLUMNS` (point estimate and bootstrap interval);
    `deltas[rule]`: the rule's final-answer error minus the `baseline` rule's, paired over the same resampled
    problem sets; `more_deltas[other][rule]` the same against each further baseline `other`; `trace_deltas["A - B"]`
    rule A's trace error minus rule B's on those sets, for each requested pair."""

    rows: dict
    rate: float
    n_problems: int
    samples: int
    alpha: float
    deltas: dict = dataclasses.field(default_factory=dict)
    baseline: str = ""
    more_deltas: dict = dataclasses.field(default_factory=dict)
    trace_deltas: dict = dataclasses.field(default_factory=dict)

    def delta_blocks(self, keys: Mapping[str, str]) -> dict:
        """`{key: {"baseline": rule, rule's paired deltas...}}` for each `key: rule` of further baselines (the
        `results.json` blocks such as `matched_paired_deltas`)."""
        return {key: {"baseline": rule, **self.more_deltas[rule]} for key, rule in keys.items()}


def _checked(name: str, out: Outcome) -> Outcome:
    c, y = _pair(out.confidence, out.correct)
    s = None if out.steps_correct is None else np.asarray(out.steps_correct, bool).reshape(-1)
    if s is not None and s.shape != y.shape:
        raise ValueError(f"rule {name!r}: {s.size} step labels for {y.size} problems")
    return Outcome(y, c, s)


def _statistics(out: Outcome, idx: np.ndarray, kept: int) -> np.ndarray:
    """[b, 3] values of `COLUMNS` on each resampled set of problems idx [b, n]."""
    y = out.correct[idx]
    if out.steps_correct is None:
        trace = np.full(len(idx), np.nan)
    else:
        right = y.sum(axis=1)
        trace = np.where(right > 0, (y & ~out.steps_correct[idx]).sum(axis=1) / np.maximum(right, 1), np.nan)
    abstain = _kept_error(out.confidence[idx], ~y, kept)
    return np.stack([(~y).mean(axis=1), trace, abstain], axis=1)


def results_table(outcomes: Mapping[str, Outcome], rate: float = 0.3, samples: int = 1000, seed: int = 0,
                  alpha: float = 0.05, more_baselines: Sequence[str] = (),
                  trace_pairs: Sequence[tuple[str, str]] = (), strata: Sequence[int] | None = None) -> RulesTable:
    """Final-answer error, trace error and error at `rate` abstention per rule, each with a (1 - alpha)
    percentile-bootstrap interval. Problems are resampled in pairs across rules: every rule is scored on the same
    `samples` resampled problem sets (`stats.resamples`), so rows are comparable. Each rule's final-answer error is
    also differenced, on those sets, from the first rule's and from each rule named in `more_baselines`, and the
    trace errors of each (A, B) of `trace_pairs` likewise (resampled sets where either has no right answer left out).
    `strata` (group sizes, e.g. several seeds' runs one after another) resamples each group within itself
    (`stats.resamples`)."""
    if not outcomes:
        raise ValueError("no rules to tabulate")
    if samples < 1 or not 0.0 < alpha < 1.0 or not 0.0 <= rate < 1.0:
        raise ValueError(f"need samples >= 1, alpha in (0, 1), rate in [0, 1); got {samples}, {alpha}, {rate}")
    missing = [name for name in (*more_baselines, *(n for pair in trace_pairs for n in pair)) if name not in outcomes]
    if missing:
        raise ValueError(f"{missing}, named as baselines or trace pairs, are not rules of the table")
    outs = {name: _checked(name, o) for name, o in outcomes.items()}
    sizes = sorted({o.correct.size for o in outs.values()})
    if len(sizes) > 1:
        raise ValueError(f"rules were scored on different numbers of problems: {sizes}")
    n = sizes[0]
    kept = _kept(1.0 - rate, n)
    draws: dict[str, list] = {name: [] for name in outs}
    for idx in resamples(n, samples, seed, strata):  # [b, n] shared by every rule
        for name, o in outs.items():
            draws[name].append(_statistics(o, idx, kept))
    points = {name: _statistics(o, np.arange(n)[None], kept)[0] for name, o in outs.items()}
    values = {name: np.concatenate(d) for name, d in draws.items()}  # [samples, 3] each
    rows = {name: {col: interval(points[name][j], values[name][:, j], alpha) for j, col in enumerate(COLUMNS)}
            for name in outs}

    def deltas(baseline: str) -> dict:
        return {name: interval(points[name][0] - points[baseline][0], values[name][:, 0] - values[baseline][:, 0],
                               alpha) for name in outs if name != baseline}

    baseline = next(iter(outs))
    trace = {f"{a} - {b}": interval(points[a][1] - points[b][1], values[a][:, 1] - values[b][:, 1], alpha)
             for a, b in trace_pairs}
    return RulesTable(rows, rate, n, samples, alpha, deltas(baseline), baseline,
                      {other: deltas(other) for other in more_baselines}, trace)
