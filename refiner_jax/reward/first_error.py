"""First-error evaluation of step verifiers (ProcessBench's protocol), for any verifier on the same cases.

A case is one solution; its gold is the index of its first wrong step, or -1 when every step is right. A verifier
predicts an index too: a step scorer (PRM, ORM read per step, the policy's per-step log-probability, any callable
returning per-step scores) the first step whose score falls below a threshold chosen on validation cases; a textual
critic the first step `#k` its feedback names ("No hint": -1). Scores: accuracy on the erroneous cases (the exact
index), accuracy on the correct ones (-1 predicted), and their harmonic mean (F1), with percentile-bootstrap
intervals that resample problems (all cases of a problem together) in pairs across verifiers; a resampled set
without erroneous or without correct cases is left out.
"""
from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

import numpy as np

from refiner_jax.stats import interval, resamples
from refiner_jax.tasks.base import NO_HINT
from refiner_jax.tasks.step_label_files import StepRecord

METRICS = ("f1", "acc_erroneous", "acc_correct")
# The F1 differences a reward run reports, among the verifiers it has (A - B).
PAIRS = (("prm", "orm"), ("prm", "policy_log_prob"), ("orm", "policy_log_prob"), ("prm", "prm_rollouts"),
         ("prm", "critic"))
_STEP_REF = re.compile(r"#\s*(\d+)")
# A batched step scorer: (problems, each one's steps) -> each one's per-step scores.
StepScores = Callable[[Sequence[str], Sequence[Sequence[str]]], Sequence[Sequence[float]]]


def gold_first_error(step_labels: Sequence[bool], outcome: bool = True) -> int:
    """The index of the first wrong step from prefix step labels; a solution whose steps are all right but whose
    final answer is wrong (an unfinished derivation) is wrong at its last step; -1 when it is right throughout."""
    for k, ok in enumerate(step_labels):
        if not ok:
            return k
    return -1 if outcome or not step_labels else len(step_labels) - 1


def _padded(step_scores: Sequence[Sequence[float]]) -> np.ndarray:
    """[cases, max_steps] scores, +inf past each case's steps (never below a threshold)."""
    width = max((len(s) for s in step_scores), default=0)
    out = np.full((len(step_scores), max(width, 1)), np.inf)
    for i, s in enumerate(step_scores):
        out[i, :len(s)] = s
    return out


def first_below(step_scores: Sequence[Sequence[float]] | np.ndarray, threshold: float) -> np.ndarray:
    """[cases] the index of each case's first step scored below `threshold`, -1 when none is."""
    scores = step_scores if isinstance(step_scores, np.ndarray) else _padded(step_scores)
    below = scores < threshold
    return np.where(below.any(axis=1), below.argmax(axis=1), -1)


def _f1(gold: np.ndarray, predicted: np.ndarray) -> float:
    err, cor = gold >= 0, gold < 0
    a = float((predicted[err] == gold[err]).mean()) if err.any() else 0.0
    b = float((predicted[cor] < 0).mean()) if cor.any() else 0.0
    return 2 * a * b / (a + b) if a + b > 0 else 0.0


def step_score_predictions(records: Sequence[StepRecord], score_steps: StepScores,
                           threshold: float) -> tuple[list[np.ndarray], np.ndarray]:
    """(each record's step scores, [cases] its predicted first wrong step) from any batched step scorer
    `score_steps(problems, steps)` -> per-step scores (a public PRM's `TaggedStepScorer.score_steps`, or a
    function over a trained PRM's): the first step scored below `threshold`."""
    step_scores = [np.asarray(s, np.float64) for s in score_steps([r.problem for r in records],
                                                                  [r.steps for r in records])]
    if len(step_scores) != len(records) or any(len(s) != len(r.steps) for s, r in zip(step_scores, records)):
        raise ValueError("the step scorer must return one score per step of every record")
    return step_scores, first_below(step_scores, threshold)


def choose_threshold(step_scores: Sequence[Sequence[float]], gold: Sequence[int], candidates: int = 200) -> float:
    """The threshold (among `candidates` quantiles of the scores, midpoints between neighbours) whose first-below
    predictions reach the highest F1 on these (validation) cases; ties: the lowest."""
    scores = _padded(step_scores)
    finite = np.unique(scores[np.isfinite(scores)])
    if finite.size == 0:
        return 0.0
    qs = np.unique(np.quantile(finite, np.linspace(0, 1, min(candidates, finite.size))))
    cuts = np.concatenate([[qs[0] - 1.0], (qs[:-1] + qs[1:]) / 2, [qs[-1] + 1.0]])
    gold = np.asarray(gold)
    f1 = [_f1(gold, first_below(scores, t)) for t in cuts]
    return float(cuts[int(np.argmax(f1))])


def critic_first_error(feedback: str, n_steps: int) -> int:
    """The step a critic's feedback blames: the lowest `#k` it names (clipped to the solution); -1 for "No hint";
    the last step when it finds fault without naming a step (e.g. "An operator is missing.")."""
    if feedback.strip() == NO_HINT:
        return -1
    named = [int(k) for k in _STEP_REF.findall(feedback)]
    last = max(n_steps - 1, 0)
    return min(min(named), last) if named else last


def scores(gold: Sequence[int], predictions: Mapping[str, Sequence[int]], groups: Sequence[int] | None = None,
           samples: int = 1000, seed: int = 0, alpha: float = 0.05,
           pairs: Sequence[tuple[str, str]] = (), strata: Sequence[int] | None = None) -> tuple[dict, dict]:
    """({verifier: {metric: {mean, low, high}}}, {"A - B": {mean, low, high}} for the F1 of each pair): every
    verifier scored on the same cases and the same resampled sets of `groups` (a problem id per case; default each
    case its own). `strata`: numbers of consecutive groups in sorted id order (e.g. each seed's problems) that are
    each resampled within themselves."""
    gold = np.asarray(gold)
    preds = {name: np.asarray(p) for name, p in predictions.items()}
    for name, p in preds.items():
        if p.shape != gold.shape:
            raise ValueError(f"verifier {name!r}: {p.size} predictions for {gold.size} cases")
    unknown = sorted({n for pair in pairs for n in pair} - set(preds))
    if unknown:
        raise ValueError(f"pairs name {unknown}, which are not verifiers of {sorted(preds)}")
    groups = np.arange(gold.size) if groups is None else np.asarray(groups)
    _, group = np.unique(groups, return_inverse=True)
    n_groups = int(group.max()) + 1 if gold.size else 0
    err = gold >= 0

    def per_group(mask: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=mask.astype(np.float64), minlength=n_groups)

    # [groups, 4] per verifier: erroneous cases, those located exactly, correct cases, those passed
    counts = {name: np.stack([per_group(err), per_group(err & (p == gold)), per_group(~err),
                              per_group(~err & (p < 0))], axis=1) for name, p in preds.items()}

    def metrics(totals: np.ndarray) -> np.ndarray:  # [..., 4] -> [..., 3]; NaN where a set lacks a kind of case
        with np.errstate(invalid="ignore", divide="ignore"):
            a, b = totals[..., 1] / totals[..., 0], totals[..., 3] / totals[..., 2]
            f1 = np.where(a + b > 0, 2 * a * b / (a + b), np.where(np.isnan(a + b), np.nan, 0.0))
        return np.stack([f1, a, b], axis=-1)

    point = {name: metrics(c.sum(axis=0)) for name, c in counts.items()}
    draws = {name: np.concatenate([metrics(c[idx].sum(axis=1)) for idx in resamples(n_groups, samples, seed, strata)])
             for name, c in counts.items()}  # [samples, 3]
    table = {name: {m: interval(point[name][j], draws[name][:, j], alpha) for j, m in enumerate(METRICS)}
             for name in preds}
    deltas = {f"{a} - {b}": interval(point[a][0] - point[b][0], draws[a][:, 0] - draws[b][:, 0], alpha)
              for a, b in pairs}
    return table, deltas


def score_records(records: Sequence[StepRecord],
                  verifiers: Mapping[str, Callable[[str, Sequence[str]], int] | Sequence[int]],
                  samples: int = 1000, seed: int = 0, pairs: Sequence[tuple[str, str]] = ()) -> tuple[dict, dict]:
    """`scores` of labelled solutions from any step-label file (`step_label_files.read_step_records`: ProcessBench,
    TRL stepwise, Math-Shepherd, PRM800K, or this package's saved cases): each verifier is a callable (problem,
    steps) -> predicted first wrong step, or its predictions already made; solutions of one problem resample
    together."""
    predictions = {name: [int(v(r.problem, r.steps)) for r in records] if callable(v) else list(v)
                   for name, v in verifiers.items()}
    problems = {}
    groups = [problems.setdefault(r.problem, len(problems)) for r in records]
    return scores([r.first_error for r in records], predictions, groups, samples, seed, pairs=pairs)
