"""The three REFINER training stages as text-pair makers for `training.loop.train_stage`.

critic   (x + hypothesis) -> feedback, on gold hypotheses ("No hint") and the task's perturbations, freshly drawn
         every step; optionally also on the warmed-up generator's own samples with the oracle's feedback;
warm-up  x -> z* on a fraction of train, optionally mixed with revision instances built from perturbations;
REFINER  for each batch, T turns: turn 1 is (x -> z*); between turns the current generator draws k nucleus samples
         per problem, one is selected, the oracle critic gives its feedback (replaced by random feedback with
         probability epsilon), and turn t+1 is (template(x, z', f) -> z*). All T*B pairs form one batch whose
         token-mean loss is the sum of the T per-turn losses up to the constant factor T (every turn has the same
         targets), so one update minimises the summed loss.
z* is the task's generator target (`Task.target`): the gold hypothesis, with the moral action after it on Moral
Stories. Everything random is seeded by (seed, step), which makes every stage resumable bit for bit.
"""
from __future__ import annotations

import random
from typing import Any, Sequence

import jax
import numpy as np

from refiner_jax import stats
from refiner_jax.refiner import evaluation, feedback_loop
from refiner_jax.tasks.base import DEFAULT_REFINE_TEMPLATE, Example, Task, refine_input
from refiner_jax.text_model import TextModel


def _rng(seed: int, step: int, *salt: int) -> random.Random:
    return random.Random(hash((seed, step) + salt) & 0xFFFFFFFF)


def _never(feedback: str) -> bool:
    return False


def critic_pairs(task: Task, examples: Sequence[Example], seed: int, generator: TextModel | None = None,
                 generator_fraction: float = 0.0, top_p: float = 1.0, temperature: float = 1.0,
                 balanced: bool = False):
    """`make_pairs` for the critic: one fresh perturbation (or the unchanged gold) per example and step.

    With a `generator` (the warmed-up one) and `generator_fraction` > 0, that share of each batch instead gets a
    hypothesis sampled from the generator (nucleus `top_p`, `temperature`) with the oracle's feedback on it: the
    errors a real generator makes, and its correct answers, which perturbations of the gold do not look like. The
    critic trained on perturbations alone learns surface cues of the perturbations and cannot tell a right
    generated hypothesis from a wrong one.

    `balanced` gives every problem of the batch a right and a wrong hypothesis side by side (half as many problems
    per batch): "No hint" is then equally likely for every problem, so it cannot be predicted from how hard the
    problem looks, only from the hypothesis. A generator sample is paired with a perturbation of the opposite kind.
    """
    if generator_fraction > 0 and generator is None:
        raise ValueError("critic_pairs: generator_fraction > 0 needs the generator to sample from")

    def make(params: Any, indices: np.ndarray, step: int):
        rng = _rng(seed, step)
        batch = [examples[int(i)] for i in indices]
        problems = batch[:(len(batch) + 1) // 2] if balanced else batch
        sampled = int(round(len(problems) * generator_fraction))
        hypotheses: list[str] = []
        if sampled:
            key = jax.random.fold_in(jax.random.key(seed + 1), step)
            hypotheses = [h[0] for h in generator.generate([ex.x for ex in problems[:sampled]], top_p=top_p,
                                                           temperature=temperature, rng=key)]
        pairs = []
        for k, ex in enumerate(problems):
            if k < sampled:
                hypothesis, feedback = hypotheses[k], task.oracle_feedback(ex, hypotheses[k])
            else:
                hypothesis, feedback = task.perturb(ex, rng)
            pairs.append((task.critic_input(ex, hypothesis), feedback.text))
            if balanced and len(pairs) < len(batch):
                partner, partner_feedback = _perturbation(task, ex, rng, right=not feedback.ok)
                pairs.append((task.critic_input(ex, partner), partner_feedback.text))
        return pairs

    return make


def _perturbation(task: Task, example: Example, rng: random.Random, right: bool, tries: int = 50):
    """A perturbation of the gold that is right (no error) or wrong, as asked; the gold itself when a right one
    is asked for and none was drawn."""
    for _ in range(tries):
        hypothesis, feedback = task.perturb(example, rng)
        if feedback.ok == right:
            return hypothesis, feedback
    if right:
        return example.z, task.oracle_feedback(example, example.z)
    raise ValueError(f"task {task.name!r} made no wrong perturbation of {example.uid} in {tries} tries")


def critic_validation(task: Task, critic, examples: Sequence[Example], seed: int) -> dict[str, float]:
    """The critic stage's validation figures: within-problem AUROC of its confidence (each problem's gold vs its
    perturbations, `stats.paired_auroc`), and feedback exact match on a fixed perturbation set, overall, on right
    ("no_error") and wrong hypotheses and per error kind."""
    quality = evaluation.critic_quality(task, critic, examples, seed, bootstrap_samples=1)
    out = {"paired_auroc": quality["paired_auroc"], "feedback_em": quality["feedback_em"]["all"]["mean"]}
    out.update({f"feedback_em/{k}": v["mean"] for k, v in quality["feedback_em"].items() if k != "all"})
    return out


def calibrate_critic(task: Task, critic, examples: Sequence[Example], hypotheses: Sequence[str]) -> dict[str, float]:
    """The critic's "No hint" threshold that best separates right from wrong `hypotheses` (one per example, e.g. the
    warmed-up generator's answers to validation problems), and the figures behind it."""
    has_error = [not task.oracle_feedback(ex, h).ok for ex, h in zip(examples, hypotheses)]
    confidence = critic.confidence(list(examples), list(hypotheses))
    threshold, accuracy = evaluation.calibrate_threshold(confidence, has_error)
    return {"threshold": threshold, "accuracy": accuracy, "n": len(has_error), "wrong": int(sum(has_error)),
            "auroc": stats.error_auroc(confidence, has_error)}


def warmup_pairs(examples: Sequence[Example], task: Task, feedback_fraction: float = 0.0,
                 template: str = DEFAULT_REFINE_TEMPLATE, seed: int = 0):
    """`make_pairs` for the generator warm-up: (x -> z*), z* being `task.target` (the gold hypothesis, and the moral
    action after it on Moral Stories).

    With `feedback_fraction` > 0 that share of each batch is instead a revision instance (template(x, z', f) -> z*)
    with z' a fresh perturbation of the gold (or the gold itself) and f the oracle's feedback on it, as the
    reference code's feedback-augmented warm start builds them: the generator learns to act on feedback before
    the REFINER loop, where its own samples are mostly too close to its greedy answer to teach that.
    """
    def make(params: Any, indices: np.ndarray, step: int):
        batch = [examples[int(i)] for i in indices]
        with_feedback = int(round(len(batch) * feedback_fraction))
        rng = _rng(seed, step, 2)
        pairs = []
        for k, ex in enumerate(batch):
            if k < with_feedback:
                hypothesis, feedback = task.perturb(ex, rng)
                pairs.append((refine_input(ex.x, hypothesis, feedback.text, template), task.target(ex)))
            else:
                pairs.append((ex.x, task.target(ex)))
        return pairs

    return make


def generator_metrics(task: Task, generator: TextModel, examples: Sequence[Example]) -> dict[str, float]:
    """Task metrics of the generator's greedy hypotheses (no critic)."""
    return task.score(generator.greedy([ex.x for ex in examples]), examples)


def select(candidates: Sequence[str], task: Task, example: Example, rule: str, rng: random.Random) -> str:
    """The hypothesis carried to the next turn: random (the paper), last (the released code) or worst (most errors)."""
    if rule == "random":
        return candidates[rng.randrange(len(candidates))]
    if rule == "last":
        return candidates[-1]
    return max(candidates, key=lambda h: len(task.oracle_feedback(example, h).errors))


def refiner_pairs(task: Task, examples: Sequence[Example], generator: TextModel, refiner_cfg, seed: int):
    """`make_pairs` for the REFINER loop; `generator` supplies tokenizer and lengths (its params are replaced by the
    current training parameters at every step)."""

    def make(params: Any, indices: np.ndarray, step: int):
        batch = [examples[int(i)] for i in indices]
        model = TextModel(generator.config, params, generator.tokenizer, generator.max_input, generator.max_output,
                          generator.bucket, batch_size=len(batch), mesh=generator.mesh)
        rng = _rng(seed, step, 1)
        key = jax.random.fold_in(jax.random.key(seed), step)
        inputs = [ex.x for ex in batch]
        pairs = [(x, task.target(ex)) for x, ex in zip(inputs, batch)]
        for turn in range(1, refiner_cfg.turns):
            samples = model.generate(inputs, num_samples=refiner_cfg.samples, top_p=refiner_cfg.top_p,
                                     temperature=refiner_cfg.temperature, rng=jax.random.fold_in(key, turn))
            chosen, feedback = [], []
            for ex, candidates in zip(batch, samples):  # one draw stream: selection and noise alternate
                chosen.append(select(candidates, task, ex, refiner_cfg.selection, rng))
                noisy = rng.random() < refiner_cfg.feedback_noise
                feedback.append(task.perturb(ex, rng)[1].text if noisy else task.oracle_feedback(ex, chosen[-1]).text)
            # Every problem goes on whatever its feedback: "No hint" teaches the generator to keep its answer.
            inputs = feedback_loop.revision_turn(batch, chosen, feedback, template=refiner_cfg.template,
                                                 stops=_never).prompts
            pairs += [(x, task.target(ex)) for x, ex in zip(inputs, batch)]
        return pairs

    return make
