"""The baselines of the REFINER table, and every row's paired difference from each of them.

A gain of generator + critic means little unless it beats what the same models, data and decoding budget give
without the feedback loop:
  * `critic_alone`: a solving critic's own answer to each problem (`critics.SolverCritic.references`);
  * `generator_matched`: a generator trained on the problems and for the updates that generator and critic used
    together (the run's "matched" stage), alone;
  * `generator_rerank`: the generator's best of turns + 1 samples by its own log-probability, as many generations
    as the loop's first answer and its T revisions.
Generators trained beside the REFINER one (`COMPARED`: the matched generator, and with `refiner.controls` the loop
with random feedback and the warm-up continued without feedback, both from the REFINER loop's starting checkpoint
with its updates) are also evaluated with the trained and the oracle critic (`<key>_critic`, `<key>_oracle`): the
REFINER generator's rows against theirs tell what the loop's feedback adds beyond its extra updates.
Each row's `gain_vs` is its paired difference from every baseline row, resampling problems (`stats.bootstrap_ci`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from refiner_jax.refiner import feedback_loop
from refiner_jax.refiner.evaluation import summarize_metrics
from refiner_jax.stats import bootstrap_ci
from refiner_jax.tasks.base import Example, Task

BASELINE_LABELS = {
    "critic_alone": "Critic alone (its own greedy answer)",
    "generator_matched": "Matched generator alone (generator + critic's problems and updates)",
    "generator_rerank": "Generator, best of {n} samples by its log-probability",
}
# The run stages whose generators are compared with the REFINER one: stage -> (row key, name in the row labels).
COMPARED = {
    "matched": ("generator_matched", "Matched generator"),
    "refiner_random": ("refiner_random", "REFINER loop with random feedback"),
    "sft_continued": ("sft_continued", "Warm-up continued without feedback (the loop's updates)"),
}
CRITIC_LABELS = {"critic": "+ trained critic (T={turns})", "oracle": "+ oracle critic (T={turns})"}
RERANK_SEED = 7919  # offset of the rerank samples' key from the run's seed
# Which refinement trajectories hold each existing row's hypotheses (None: turn 0, shared by all of them).
_ROW_SETTINGS = {"generator": None, "critic_t1": "critic", "critic": "critic", "oracle": "oracle"}


def best_by_log_prob(samples: Sequence[Sequence[str]], log_probs: np.ndarray) -> list[str]:
    """Each problem's sample with the highest log-probability (`log_probs` [problems, samples]; ties: first)."""
    return [list(s)[int(np.argmax(lp))] for s, lp in zip(samples, np.asarray(log_probs))]


def rerank_answers(generator, examples: Sequence[Example], num_samples: int, temperature: float, top_p: float,
                   seed: int) -> list[str]:
    """The generator's best of `num_samples` samples per problem by its own log-probability (`best_by_log_prob`)."""
    texts, log_probs = generator.generate_with_log_probs(
        [ex.x for ex in examples], num_samples=num_samples, temperature=temperature, top_p=top_p,
        rng=jax.random.key(RERANK_SEED + seed))
    return best_by_log_prob(texts, log_probs)


def refined_answers(task: Task, generator, key: str, name: str, critics: Mapping[str, Any],
                    examples: Sequence[Example], turns: int, template: str
                    ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """({row key: one answer per problem}, {row key: label}) of a compared generator: its greedy answer (`key`) and
    its final answer after `turns` rounds with each critic of `critics` ({"critic": ..., "oracle": ...}; row
    `<key>_<critic name>`), every loop starting from that greedy answer."""
    z0 = generator.greedy([ex.x for ex in examples])
    answers, labels = {key: z0}, {key: f"{name} alone"}
    for critic_name, critic in critics.items():
        trajectories = feedback_loop.refine(generator, critic, task, examples, turns, template, initial=z0)
        answers[f"{key}_{critic_name}"] = feedback_loop.final_hypotheses(trajectories)
        labels[f"{key}_{critic_name}"] = f"{name} {CRITIC_LABELS[critic_name].format(turns=turns)}"
    return answers, labels


def paired_delta(scores: Sequence[float], baseline: Sequence[float], samples: int, seed: int) -> dict[str, float]:
    """{mean, low, high}: the mean per-problem difference `scores - baseline` with its percentile-bootstrap
    interval over problems."""
    mean, low, high = bootstrap_ci(np.asarray(scores, np.float64) - np.asarray(baseline, np.float64), samples, seed)
    return {"mean": mean, "low": low, "high": high}


def row_scores(results: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Per-problem primary metric of each refinement row of `evaluation.evaluate_refinement`'s results, read from
    its trajectories (a trajectory that stopped early keeps its last hypothesis)."""
    primary = results["primary_metric"]
    by_setting: dict[str, list] = {}
    for record in results["trajectories"]:
        by_setting.setdefault(record["setting"], []).append(record["scores"])
    out = {}
    for row in results["rows"]:
        if row["key"] not in _ROW_SETTINGS:
            continue
        setting = _ROW_SETTINGS[row["key"]] or next(iter(by_setting))
        turn = row["turns"]
        out[row["key"]] = np.array([float(s[min(turn, len(s) - 1)][primary]) for s in by_setting[setting]])
    return out


def add_baselines(task: Task, examples: Sequence[Example], results: dict[str, Any],
                  answers: Mapping[str, Sequence[str]], labels: Mapping[str, str], samples: int = 1000,
                  seed: int = 0) -> None:
    """Appends one row per baseline (`answers`: key -> one answer per problem of `examples`; `labels`: key ->
    row label) to `results["rows"]`, with `gain` (paired, from the generator alone), and gives every row `gain_vs`:
    {baseline key: paired difference of the primary metric}, for each baseline other than the row itself. Every
    row's per-problem primary metric goes to `results["row_scores"]` ({uids, metric, labels, rows: {key: scores}}),
    which `runs.seed_pool.pool_refiner_seeds` pools over seeds."""
    primary = results["primary_metric"]
    scores = row_scores(results)
    examples = list(examples)
    for key, hypotheses in answers.items():
        per_example = [task.score([h], [ex]) for h, ex in zip(hypotheses, examples)]
        scores[key] = np.array([float(s[primary]) for s in per_example])
        results["rows"].append({
            "key": key, "label": labels[key], "turns": 0,
            "metrics": summarize_metrics(per_example, task.score(list(hypotheses), examples), samples, seed),
            "gain": paired_delta(scores[key], scores["generator"], samples, seed)})
    for row in results["rows"]:
        row["gain_vs"] = {key: paired_delta(scores[row["key"]], scores[key], samples, seed)
                          for key in answers if key != row["key"]}
    results["row_scores"] = {"uids": [ex.uid for ex in examples], "metric": primary,
                             "labels": {row["key"]: row["label"] for row in results["rows"]},
                             "rows": {row["key"]: scores[row["key"]].tolist() for row in results["rows"]}}
