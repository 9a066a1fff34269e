"""REFINER evaluation: generator alone vs. + trained critic vs. + oracle critic, flips, critic quality, noise study.

One greedy generation per problem (turn 0) is shared by every row; the trained-critic trajectory of T turns also
gives the T=1 row (its hypotheses after the first revision), so nothing is decoded twice. Every task metric is
scored per example and summarised as mean + 95% percentile-bootstrap CI over examples. A metric that is not a mean
of per-example values (corpus BLEU, an agreement over a subset) keeps the task's own whole-set value and gets no CI.

The generator only needs `.greedy(texts) -> list[str]` and critics `.feedback(examples, hypotheses)`, so any
model, a Python function or a person can be evaluated.
"""
from __future__ import annotations

import math
import random
from typing import Any, Mapping, Sequence

import numpy as np

from refiner_jax.refiner import critics, feedback_loop
from refiner_jax.stats import bootstrap_ci, bootstrap_columns, error_auroc, paired_auroc
from refiner_jax.tasks.base import DEFAULT_REFINE_TEMPLATE, Example, Task, feedback_matches, is_no_hint, refine_input

ROW_LABELS = {
    "generator": "Generator alone",
    "critic_t1": "+ trained critic (T=1)",
    "critic": "+ trained critic (T={turns})",
    "oracle": "+ oracle critic (T={turns})",
}
# Seed offset of the held-out perturbation set used to measure the critic (fixed, independent of training's).
CRITIC_EVAL_SEED = 104729


# ----------------------------------------------------------------------------------------------- statistics


def summarize_metrics(per_example: Sequence[Mapping[str, float]], whole: Mapping[str, float] | None = None,
                      samples: int = 1000, seed: int = 0, alpha: float = 0.05) -> dict[str, dict]:
    """`{metric: {"mean", "low", "high"}}` from per-example task scores. With `whole` (the task's score of the
    whole set), a metric whose whole-set value is not the mean of its per-example values (a corpus-level metric)
    reports the whole-set value with `low`/`high` None."""
    keys = list(whole) if whole else list(per_example[0]) if per_example else []
    columns = [k for k in keys if per_example and all(k in s for s in per_example)]
    table = np.array([[float(s[k]) for k in columns] for s in per_example], dtype=np.float64).reshape(
        len(per_example), len(columns))
    mean, low, high = bootstrap_columns(table, samples, seed, alpha)
    out: dict[str, dict] = {}
    for j, k in enumerate(columns):
        decomposable = whole is None or math.isclose(float(whole[k]), float(mean[j]), rel_tol=1e-9, abs_tol=1e-9)
        out[k] = ({"mean": float(mean[j]), "low": float(low[j]), "high": float(high[j])} if decomposable
                  else {"mean": float(whole[k]), "low": None, "high": None})
    for k in keys:
        if k not in out:
            out[k] = {"mean": float(whole[k]), "low": None, "high": None}
    return {k: out[k] for k in keys}


def primary_metric(task: Task, metric_names: Sequence[str]) -> str:
    """The task's headline metric (`task.primary_metric`; the first score key for a task that names none)."""
    name = task.primary_metric or (metric_names[0] if metric_names else None)
    if name is None or name not in metric_names:
        raise ValueError(f"task {task.name!r}: primary_metric {name!r} is not one of its score keys "
                         f"{list(metric_names)}; set the task's primary_metric to one of them")
    return name


# ----------------------------------------------------------------------------------------------- refinement


def _turn_scores(traj: feedback_loop.Trajectory, turn: int) -> dict[str, float]:
    return traj.scores[min(turn, len(traj.scores) - 1)]


def _row(task: Task, examples: Sequence[Example], trajectories: Sequence[feedback_loop.Trajectory], turn: int | None,
         samples: int, seed: int) -> dict[str, dict]:
    """Metrics of the trajectories' hypotheses after `turn` revisions (None: their final ones)."""
    last = max((len(t.scores) for t in trajectories), default=1) - 1
    t = last if turn is None else turn
    per_example = [_turn_scores(traj, t) for traj in trajectories]
    whole = task.score(feedback_loop.final_hypotheses(trajectories, turn), list(examples)) if examples else {}
    return summarize_metrics(per_example, whole, samples, seed)


def paired_gain(trajectories: Sequence[feedback_loop.Trajectory], metric: str, turn: int | None, samples: int,
                seed: int) -> dict[str, float]:
    """`metric` after `turn` revisions (None: final) minus at turn 0, paired per example: {mean, low, high} with a
    percentile-bootstrap interval that resamples examples (both turns together). Tighter than comparing the two
    rows' own intervals, which ignore that both score the same problems."""
    last = max((len(t.scores) for t in trajectories), default=1) - 1
    t = last if turn is None else turn
    diffs = [float(_turn_scores(traj, t)[metric]) - float(_turn_scores(traj, 0)[metric]) for traj in trajectories]
    mean, low, high = bootstrap_ci(diffs, samples, seed)
    return {"mean": mean, "low": low, "high": high}


def count_flips(trajectories: Sequence[feedback_loop.Trajectory], metric: str, turns: int,
                threshold: float = 0.5) -> list[dict]:
    """Wrong->right and right->wrong changes of `metric` between consecutive turns 0->1, ..., (T-1)->T and between
    turn 0 and turn T. An example counts as right when its score is >= `threshold` (binary metrics: == 1); one that
    stopped early keeps its last hypothesis. `revised`: examples revised at least once between the two turns."""
    pairs = [(t, t + 1) for t in range(turns)] + ([(0, turns)] if turns > 1 else [])
    out = []
    for a, b in pairs:
        up = down = revised = 0
        for traj in trajectories:
            ra = _turn_scores(traj, a)[metric] >= threshold
            rb = _turn_scores(traj, b)[metric] >= threshold
            up += (not ra) and rb
            down += ra and not rb
            revised += len(traj.hypotheses) - 1 > a
        out.append({"from": a, "to": b, "wrong_to_right": up, "right_to_wrong": down, "net": up - down,
                    "revised": revised})
    return out


def _trajectory_records(trajectories: Sequence[feedback_loop.Trajectory], setting: str) -> list[dict]:
    return [{"setting": setting, "uid": t.uid, "hypotheses": t.hypotheses, "feedback": t.feedback,
             "scores": t.scores} for t in trajectories]


def evaluate_refinement(task: Task, generator, critic: critics.Critic | None, oracle: critics.Critic | None,
                        examples: Sequence[Example], turns: int = 3, template: str = DEFAULT_REFINE_TEMPLATE,
                        bootstrap_samples: int = 1000, seed: int = 0,
                        initial: Sequence[str] | None = None) -> dict[str, Any]:
    """The results table of one task.

    Rows (`results["rows"]`, in order): the generator alone (turn 0), + trained critic at T=1 and at T=`turns`
    (one trajectory, truncated for T=1), + oracle critic at T=`turns` (default oracle: `critics.OracleCritic`).
    Each row maps every task metric to {mean, low, high}; a critic row also has `gain`, the paired difference of
    the primary metric from the generator alone (`paired_gain`). Also: flips of the primary metric per critic, critic
    quality on a fixed held-out perturbation set and on the generator's own hypotheses, and every trajectory
    (`results["trajectories"]`). `critic=None` leaves the trained-critic rows out. `initial` reuses turn-0
    hypotheses already generated.
    """
    if turns < 1:
        raise ValueError(f"turns must be >= 1, got {turns}")
    examples = list(examples)
    if not examples:
        raise ValueError("evaluate_refinement needs at least one example")
    oracle = oracle if oracle is not None else critics.OracleCritic(task)
    z0 = list(initial) if initial is not None else generator.greedy([ex.x for ex in examples])
    runs: dict[str, list[feedback_loop.Trajectory]] = {}
    if critic is not None:
        runs["critic"] = feedback_loop.refine(generator, critic, task, examples, turns, template, initial=z0)
    runs["oracle"] = feedback_loop.refine(generator, oracle, task, examples, turns, template, initial=z0)
    any_run = next(iter(runs.values()))
    metric_names = list(any_run[0].scores[0])
    primary = primary_metric(task, metric_names)

    rows = [{"key": "generator", "label": ROW_LABELS["generator"], "turns": 0,
             "metrics": _row(task, examples, any_run, 0, bootstrap_samples, seed)}]
    if critic is not None:
        if turns > 1:
            rows.append({"key": "critic_t1", "label": ROW_LABELS["critic_t1"], "turns": 1,
                         "metrics": _row(task, examples, runs["critic"], 1, bootstrap_samples, seed),
                         "gain": paired_gain(runs["critic"], primary, 1, bootstrap_samples, seed)})
        rows.append({"key": "critic", "label": ROW_LABELS["critic"].format(turns=turns), "turns": turns,
                     "metrics": _row(task, examples, runs["critic"], None, bootstrap_samples, seed),
                     "gain": paired_gain(runs["critic"], primary, None, bootstrap_samples, seed)})
    rows.append({"key": "oracle", "label": ROW_LABELS["oracle"].format(turns=turns), "turns": turns,
                 "metrics": _row(task, examples, runs["oracle"], None, bootstrap_samples, seed),
                 "gain": paired_gain(runs["oracle"], primary, None, bootstrap_samples, seed)})

    results: dict[str, Any] = {
        "task": task.name,
        "primary_metric": primary,
        "num_examples": len(examples),
        "turns": turns,
        "bootstrap_samples": bootstrap_samples,
        "rows": rows,
        "flips": {name: count_flips(traj, primary, turns) for name, traj in runs.items()},
        "trajectories": [r for name, traj in runs.items() for r in _trajectory_records(traj, name)],
    }
    if critic is not None:
        quality = critic_quality(task, critic, examples, seed=seed, bootstrap_samples=bootstrap_samples)
        quality["on_generator"] = _feedback_agreement(
            task, critic, examples, [t.hypotheses[0] for t in runs["critic"]], [t.feedback[0] for t in runs["critic"]])
        quality["on_generator_samples"] = generator_samples_auroc(task, critic, generator, examples, seed=seed)
        results["critic_quality"] = quality
    return results


# ----------------------------------------------------------------------------------------------- critic quality


def critic_eval_set(task: Task, examples: Sequence[Example], seed: int = 0) -> list[tuple[Example, str, Any]]:
    """A fixed held-out set of (example, perturbed hypothesis, oracle Feedback): one `task.perturb` per example,
    drawn from a seeded generator so every evaluation sees the same hypotheses."""
    rng = random.Random(CRITIC_EVAL_SEED + seed)
    return [(ex, *task.perturb(ex, rng)) for ex in examples]


def _has_error(feedback: str) -> bool:
    return not is_no_hint(feedback)


def _detection(predicted: Sequence[str], gold_has_error: Sequence[bool]) -> dict[str, float]:
    """Precision/recall/F1 of "the hypothesis has an error" (the critic says anything but No hint)."""
    pred = np.array([_has_error(p) for p in predicted], dtype=bool)
    gold = np.array(gold_has_error, dtype=bool)
    tp = int(np.sum(pred & gold))
    precision = tp / int(pred.sum()) if pred.any() else float("nan")
    recall = tp / int(gold.sum()) if gold.any() else float("nan")
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else float("nan")
    return {"precision": precision, "recall": recall, "f1": f1, "true_positives": tp,
            "predicted_errors": int(pred.sum()), "gold_errors": int(gold.sum())}


def calibrate_threshold(confidence: Sequence[float], has_error: Sequence[bool]) -> tuple[float, float]:
    """(threshold, accuracy): the "No hint" threshold (say "No hint" when confidence >= threshold) that classifies
    the most hypotheses right, a midpoint between observed confidences; ties go to the higher threshold."""
    conf = np.asarray(confidence, dtype=np.float64)
    wrong = np.asarray(has_error, dtype=bool)
    if not len(conf):
        raise ValueError("calibrate_threshold needs at least one hypothesis")
    values = np.unique(conf)
    candidates = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2.0, [values[-1] + 1.0]])
    accuracy = np.array([np.mean((conf >= t) != wrong) for t in candidates])
    best = len(candidates) - 1 - int(np.argmax(accuracy[::-1]))
    return float(candidates[best]), float(accuracy[best])


def calibrate_for_refinement(task: Task, critic: critics.Critic, generator, examples: Sequence[Example],
                             template: str = DEFAULT_REFINE_TEMPLATE) -> dict[str, Any]:
    """The "No hint" threshold of a trained critic for refining with `generator`, chosen on `examples` (held-out
    problems) by the task's primary metric after one refinement turn, and the figures behind it.

    The critic's feedback without a threshold (`critic.threshold` = +inf: every error it can name) and its
    confidence are computed once on the generator's greedy hypotheses; the generator revises every hypothesis that
    got feedback, once. A threshold t then keeps the revision exactly where confidence < t, so every candidate t
    (midpoints between the confidences, and both ends) is scored without decoding again. The chosen threshold is
    the lowest whose metric is within one standard error of the best one's gain (the one-standard-error rule): the
    curve is flat near its top, and its maximum on a finite set overfits towards intervening more, where a wrong
    intervention breaks a right answer."""
    import dataclasses

    examples = list(examples)
    if not examples:
        raise ValueError("calibrate_for_refinement needs at least one validation problem")
    z0 = generator.greedy([ex.x for ex in examples])
    feedback = dataclasses.replace(critic, threshold=math.inf).feedback(examples, z0)
    confidence = np.asarray(critic.confidence(examples, z0), np.float64)
    revise = np.array([not is_no_hint(f) for f in feedback])
    z1 = list(z0)
    rows = np.flatnonzero(revise)
    for i, z in zip(rows, generator.greedy([refine_input(examples[i].x, z0[i], feedback[i], template)
                                            for i in rows]) if len(rows) else []):
        z1[i] = z
    primary = primary_metric(task, list(task.score(z0[:1], examples[:1])))
    before = np.array([task.score([z], [ex])[primary] for z, ex in zip(z0, examples)])
    after = np.array([task.score([z], [ex])[primary] for z, ex in zip(z1, examples)])
    values = np.unique(confidence[revise]) if revise.any() else np.zeros(1)
    candidates = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2.0, [values[-1] + 1.0]])
    metric = np.array([np.mean(np.where(revise & (confidence < t), after, before)) for t in candidates])
    best = int(np.argmax(metric))
    gain = np.where(revise & (confidence < candidates[best]), after, before) - before  # [n] per problem
    standard_error = float(gain.std(ddof=1) / np.sqrt(len(gain))) if len(gain) > 1 else 0.0
    chosen = int(np.flatnonzero(metric >= metric[best] - standard_error)[0])
    threshold = float(candidates[chosen])
    wrong = np.array([not task.oracle_feedback(ex, z).ok for ex, z in zip(examples, z0)])
    return {"threshold": threshold, "metric": primary, "before": float(before.mean()), "after": float(metric[chosen]),
            "best_threshold": float(candidates[best]), "best_after": float(metric[best]),
            "standard_error": standard_error, "n": len(examples),
            "revised": int(np.sum(revise & (confidence < threshold))),
            "flag_accuracy": float(np.mean((confidence >= threshold) != wrong)),
            "auroc": error_auroc(confidence, wrong)}


def _confidences(critic: critics.Critic, examples: Sequence[Example], hypotheses: Sequence[str]) -> np.ndarray | None:
    """The critic's confidence that each hypothesis is right, for critics that give one (None otherwise)."""
    if not isinstance(critic, critics.ConfidentCritic):
        return None
    return np.asarray(critic.confidence(list(examples), list(hypotheses)))


def _confidence_auroc(critic: critics.Critic, examples: Sequence[Example], hypotheses: Sequence[str],
                      has_error: Sequence[bool]) -> float | None:
    """`error_auroc` of the critic's confidence, for critics that give one (None otherwise)."""
    confidence = _confidences(critic, examples, hypotheses)
    return error_auroc(confidence, has_error) if confidence is not None else None


def paired_eval_set(task: Task, examples: Sequence[Example], seed: int = 0, wrong_per_problem: int = 2
                    ) -> list[tuple[Example, str, Any]]:
    """(example, hypothesis, oracle Feedback) with, for each problem, its gold hypothesis and `wrong_per_problem`
    distinct perturbations that have errors (fewer when the task cannot make them): the set of `paired_auroc`."""
    rng = random.Random(CRITIC_EVAL_SEED + 1 + seed)
    out = []
    for ex in examples:
        out.append((ex, ex.z, task.oracle_feedback(ex, ex.z)))
        seen = {ex.z}
        for _ in range(10 * wrong_per_problem):
            if len(seen) > wrong_per_problem:
                break
            hypothesis, feedback = task.perturb(ex, rng)
            if not feedback.ok and hypothesis not in seen:
                seen.add(hypothesis)
                out.append((ex, hypothesis, feedback))
    return out


def critic_paired_auroc(task: Task, critic: critics.Critic, examples: Sequence[Example], seed: int = 0
                        ) -> float | None:
    """`paired_auroc` of the critic's confidence on `paired_eval_set` (None for critics without a confidence)."""
    items = paired_eval_set(task, examples, seed)
    confidence = _confidences(critic, [ex for ex, _, _ in items], [h for _, h, _ in items])
    if confidence is None:
        return None
    return paired_auroc(confidence, [not f.ok for _, _, f in items], [ex.uid for ex, _, _ in items])


def generator_samples_auroc(task: Task, critic: critics.Critic, generator, examples: Sequence[Example],
                            num_samples: int = 4, seed: int = 0) -> dict[str, Any] | None:
    """The critic's `paired_auroc` over the generator's own answers: its greedy hypothesis and `num_samples`
    samples (temperature 1) per problem, distinct ones only. None for critics without a confidence or generators
    that cannot sample."""
    if not isinstance(critic, critics.ConfidentCritic) or not isinstance(generator, feedback_loop.SamplingGenerator):
        return None
    import jax

    sampled = generator.generate([ex.x for ex in examples], num_samples=num_samples, temperature=1.0,
                                 rng=jax.random.key(CRITIC_EVAL_SEED + seed))
    greedy = generator.greedy([ex.x for ex in examples])
    items = [(ex, h) for ex, g, s in zip(examples, greedy, sampled) for h in dict.fromkeys([g, *s])]
    has_error = [not task.oracle_feedback(ex, h).ok for ex, h in items]
    confidence = _confidences(critic, [ex for ex, _ in items], [h for _, h in items])
    groups = [ex.uid for ex, _ in items]
    problems_with_pairs = len({g for g, e in zip(groups, has_error) if e} & {g for g, e in zip(groups, has_error)
                                                                              if not e})
    return {"paired_auroc": paired_auroc(confidence, has_error, groups), "hypotheses": len(items),
            "wrong": int(np.sum(has_error)), "problems_with_pairs": problems_with_pairs}


def _feedback_agreement(task: Task, critic: critics.Critic, examples: Sequence[Example], hypotheses: Sequence[str],
                        predicted: Sequence[str]) -> dict[str, Any]:
    """Feedback EM and error detection of critic feedback against the oracle's, on given hypotheses."""
    gold = [task.oracle_feedback(ex, h) for ex, h in zip(examples, hypotheses)]
    em = [feedback_matches(p, g.text) for p, g in zip(predicted, gold)]
    has_error = [not g.ok for g in gold]
    return {"n": len(em), "feedback_em": float(np.mean(em)) if em else float("nan"),
            "has_error": _detection(predicted, has_error),
            "auroc": _confidence_auroc(critic, examples, hypotheses, has_error)}


def critic_quality(task: Task, critic: critics.Critic, examples: Sequence[Example], seed: int = 0,
                   bootstrap_samples: int = 1000) -> dict[str, Any]:
    """Feedback exact match (sentence-order-insensitive, `feedback_matches`) against the oracle on the held-out
    perturbation set, overall and per gold error kind ("no_error" for unchanged hypotheses; a hypothesis with
    several kinds counts under each; "any_error" for all hypotheses with an error), with bootstrap CIs; plus
    precision/recall of "has an error", and, for critics with a `confidence`, its AUROC as an error detector
    (`error_auroc`) and its within-problem AUROC on each problem's gold vs its perturbations (`paired_auroc`)."""
    eval_set = critic_eval_set(task, examples, seed)
    hypotheses = [h for _, h, _ in eval_set]
    predicted = critic.feedback([ex for ex, _, _ in eval_set], hypotheses)
    groups: dict[str, list[float]] = {"all": []}
    for pred, (_, _, gold) in zip(predicted, eval_set):
        hit = float(feedback_matches(pred, gold.text))
        groups["all"].append(hit)
        for kind in sorted({e.kind for e in gold.errors} or {"no_error"}):
            groups.setdefault(kind, []).append(hit)
        if not gold.ok:
            groups.setdefault("any_error", []).append(hit)
    order = ["all", "no_error", "any_error"] + [k for k in task.error_kinds if k != "no_error"]
    order += sorted(k for k in groups if k not in order)
    per_type = {}
    for kind in order:
        if kind in groups:
            mean, low, high = bootstrap_ci(groups[kind], bootstrap_samples, seed)
            per_type[kind] = {"n": len(groups[kind]), "mean": mean, "low": low, "high": high}
    has_error = [not g.ok for _, _, g in eval_set]
    return {"n": len(eval_set), "seed": seed, "feedback_em": per_type, "has_error": _detection(predicted, has_error),
            "auroc": _confidence_auroc(critic, [ex for ex, _, _ in eval_set], hypotheses, has_error),
            "paired_auroc": critic_paired_auroc(task, critic, examples, seed)}


# ----------------------------------------------------------------------------------------------- noise study


def noise_study(task: Task, generator, oracle: critics.Critic | None, examples: Sequence[Example],
                epsilons: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0), turns: int = 3,
                template: str = DEFAULT_REFINE_TEMPLATE, bootstrap_samples: int = 1000, seed: int = 0,
                initial: Sequence[str] | None = None) -> dict[str, Any]:
    """Refinement with the oracle critic whose feedback is replaced, with probability epsilon, by random feedback
    (`critics.NoisyCritic`): the final hypotheses' metrics (mean + CI) per epsilon."""
    examples = list(examples)
    if not examples:
        raise ValueError("noise_study needs at least one example")
    oracle = oracle if oracle is not None else critics.OracleCritic(task)
    z0 = list(initial) if initial is not None else generator.greedy([ex.x for ex in examples])
    rows, primary = [], None
    for eps in epsilons:
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"noise level epsilon must be in [0, 1], got {eps}")
        noisy = critics.NoisyCritic(oracle, task, float(eps), seed=seed)
        trajectories = feedback_loop.refine(generator, noisy, task, examples, turns, template, initial=z0)
        metrics = _row(task, examples, trajectories, None, bootstrap_samples, seed)
        primary = primary or primary_metric(task, list(trajectories[0].scores[0]))
        rows.append({"epsilon": float(eps), "metrics": metrics, **metrics[primary]})
    return {"primary_metric": primary, "turns": turns, "rows": rows}
