"""The step-level parts of a reward run (`runs.reward_run`): Math-Shepherd process labels from rollouts for the
`prm_rollouts` reward model, and ProcessBench's first-error evaluation of every step verifier on the same test
samples. Each takes the run (`reward_run.Run`) for its policy, samples, scorers and workdir."""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

import jax
import numpy as np

from refiner_jax import atomic_files
from refiner_jax import sharding as shd
from refiner_jax.reward import first_error, labels as reward_labels, rollout_labels
from refiner_jax.runs import seed_pool
from refiner_jax.tasks import step_label_files
from refiner_jax.tasks.base import Example, Task


class StepCases:
    """The cases of a first-error study: every sample with at least one step (an empty one has no step to point
    at), with its index among the flattened samples, its problem's index, its uid and its gold first wrong step by
    the task's step checker (-1: none)."""

    def __init__(self, task: Task, examples: Sequence[Example], samples: list[list[str]]):
        flat = [(i, ex, j, h) for i, (ex, hs) in enumerate(zip(examples, samples)) for j, h in enumerate(hs)]
        rows = [(n, i, ex, h, f"{ex.uid}/{j}") for n, (i, ex, j, h) in enumerate(flat) if task.split_steps(h)]
        self.flat, self.problems, self.examples, self.solutions, self.uids = ([r[k] for r in rows] for k in range(5))
        self.prompts = [ex.x for ex in self.examples]
        self.gold = [first_error.gold_first_error(task.step_labels(ex, h), task.outcome_label(ex, h))
                     for ex, h in zip(self.examples, self.solutions)]


def rollout_data(run: Any) -> tuple[list[reward_labels.LabelledSolution], dict]:
    """The `prm_rollouts` model's training solutions (the PRM's samples, labelled by rollouts: every step so far
    good) and the labels' agreement with the task's step checker and speed; cached in `samples/rollouts.json`."""
    r, task = run.config.reward, run.task
    samples = run.samples("sft", "sft_train", run.train, r.samples, run.config.seed)
    examples = [ex for ex, hs in zip(run.train, samples) for _ in hs]
    solutions = [h for hs in samples for h in hs]
    path = os.path.join(run.workdir, "samples", "rollouts.json")
    cached = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
        if cached["uids"] != [ex.uid for ex in run.train] or cached["completions"] != r.rollout_completions:
            cached = None
    if cached is None:
        model = run.text_model(run.policy("sft"), rows=max(1, r.sample_rows // r.rollout_completions))
        rng = jax.random.key(run.config.seed + 7)

        def generate(prompts, prefixes, n):
            return model.generate(prompts, num_samples=n, temperature=r.temperature, top_p=r.top_p, rng=rng,
                                  prefixes=prefixes)

        made, speed = rollout_labels.rollout_labels(generate, task, examples, solutions, r.rollout_completions)
        if shd.is_main_process():
            print(f"[rollouts] {speed['rollouts']} in {speed['seconds']:.0f}s")
        cached = {"uids": [ex.uid for ex in run.train], "completions": r.rollout_completions,
                  "soft": [list(lab.soft) for lab in made], "speed": speed,
                  "agreement": rollout_labels.agreement(task, examples, solutions, made)}
        if shd.is_main_process():
            atomic_files.write_json(path, cached, default=float)
    made = [rollout_labels.RolloutLabels(tuple(v > 0 for v in soft), tuple(soft)) for soft in cached["soft"]]
    data = [reward_labels.LabelledSolution(ex.x, h, tuple(task.split_steps(h)), lab.prefix, task.target(ex))
            for ex, h, lab in zip(examples, solutions, made)]
    return data, {"agreement": cached["agreement"], **cached["speed"]}


def first_error_study(run: Any, test: Sequence[Example], samples: list[list[str]],
                      test_steps: dict[str, list[np.ndarray]], val_scorers: dict, critic=None) -> tuple[dict, dict]:
    """ProcessBench's first-error scores of every verifier on the SFT policy's test samples with at least one step:
    step scorers (`val_scorers`: name -> (prompts, solutions) -> step scores; `test_steps` their scores of the
    flattened test samples) thresholded on its validation samples, the critic by the step its feedback names. The
    cases (ProcessBench's layout) and each verifier's prediction go to `eval/first_error_cases.jsonl` and
    `eval/first_error_predictions.json`."""
    c, task = run.config, run.task
    val_samples = run.samples("sft", "sft_val", run.val, c.reward.samples, c.seed + 1)
    val = StepCases(task, run.val, val_samples)
    cases = StepCases(task, test, samples)
    thresholds = {name: first_error.choose_threshold(score(val.prompts, val.solutions), val.gold)
                  for name, score in val_scorers.items()}
    predictions = {name: first_error.first_below([test_steps[name][i] for i in cases.flat], thresholds[name])
                   for name in val_scorers}
    if critic is not None:
        feedback = critic.feedback(cases.examples, cases.solutions)
        predictions["critic"] = np.array([first_error.critic_first_error(f, len(task.split_steps(h)))
                                          for f, h in zip(feedback, cases.solutions)])
    pairs = [(a, b) for a, b in first_error.PAIRS if a in predictions and b in predictions]
    table, deltas = first_error.scores(cases.gold, predictions, cases.problems, c.eval.bootstrap_samples, c.seed,
                                       pairs=pairs)
    if shd.is_main_process():
        step_label_files.write_processbench(
            os.path.join(run.workdir, "eval", "first_error_cases.jsonl"),
            [step_label_files.StepRecord(ex.x, tuple(task.split_steps(h)), g, task.outcome_label(ex, h), uid)
             for ex, h, g, uid in zip(cases.examples, cases.solutions, cases.gold, cases.uids)])
        atomic_files.write_json(os.path.join(run.workdir, seed_pool.FIRST_ERROR_FILE),
                                {"thresholds": thresholds, "uids": cases.uids, "gold": cases.gold,
                                 "predictions": {n: [int(p) for p in v] for n, v in predictions.items()}},
                                default=float)
    return table, deltas
