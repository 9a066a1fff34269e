"""The reward pipeline's GRPO stage (`reward.grpo`): one policy per reward of `config.grpo.rewards`, trained online
on the training engine's jitted, sharded step, sampling through the jitted sampler in the same process.

A stage `grpo_<reward>_<round>` (`config.rl.rounds` of them per reward, each from the previous round's policy; the
SFT policy is the first round's start and every round's KL reference) spends exactly one expert-iteration round's
budget (`accounting`): `rl.samples` samples (a group) of each of the round's problems (the first `rl.problems`
training problems and the `task.extra_problems`) and `rl.steps` gradient steps. The problems, shuffled per round,
are cut into rl.steps / grpo.updates sample batches; each is sampled from the current policy, rewarded, and its
old and reference log-probabilities recorded (a teacher-forced pass of both policies over the samples, so the first
update's ratio is exactly 1), then trained on for `grpo.updates` steps, every step on all of its samples. A stage
resumed between two updates of a sample batch samples that batch again from the restored policy.

Rewards: "final" 1 for a right final answer, else 0; "orm" the ORM's score of the solution; "prm" the PRM's score
of each step (its P(every step so far right)), credited to the step's tokens; "final_prm" the final-answer advantage
plus the PRM's step advantage, token by token.

Each sample batch appends to `<workdir>/<stage>/rounds.jsonl` its mean reward, the sampling policy's k3 KL to the
reference on its own tokens, its samples' final-answer accuracy and trace error and the seconds it took to sample
and score; validation (every `rl.eval_every` steps, to `metrics.jsonl`) adds the greedy policy's final-answer error
and trace error on `rl.eval_examples` validation problems. `<workdir>/<stage>/accounting.json` records the budget.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np

from refiner_jax import atomic_files
from refiner_jax import sharding as shd
from refiner_jax.models.language_model import LanguageModel
from refiner_jax.reward import grpo, rerank
from refiner_jax.reward.scorer import reduce_steps
from refiner_jax.runs import plots, results as results_lib
from refiner_jax.runs.run_config import ConfigError
from refiner_jax.tasks.base import Example, Task
from refiner_jax.training.loop import StageSpec, stage_done

# The policy rows of GRPO, by the reward of `config.grpo.rewards` it learned from.
GRPO_LABELS = {"final": "Final-Answer GRPO", "orm": "ORM-GRPO", "prm": "PRM-GRPO",
               "final_prm": "Final-Answer + PRM GRPO"}
ROUNDS_FILE = "rounds.jsonl"
ACCOUNTING_FILE = "accounting.json"


def accounting(config: ml_collections.ConfigDict, problems: int) -> dict[str, dict[str, int]]:
    """Samples drawn and gradient steps per round of expert iteration and of GRPO on `problems` problems (equal by
    construction), with how GRPO spends them; a `ConfigError` when the problems do not split into its sample
    batches."""
    rl, updates = config.rl, config.grpo.updates
    batches = rl.steps // updates
    if problems % batches:
        raise ConfigError(
            f"config.grpo.updates: rl.steps {rl.steps} / grpo.updates {updates} = {batches} sample batches do not "
            f"split the {problems} problems of a round evenly; choose updates (or rl.problems, "
            "task.extra_problems) so that they do")
    prompts = problems // batches
    return {"expert_iteration": {"samples": rl.samples * problems, "gradient_steps": rl.steps,
                                 "rows_per_step": rl.batch_size},
            "grpo": {"samples": batches * prompts * rl.samples, "gradient_steps": batches * updates,
                     "rows_per_step": prompts * rl.samples, "sample_batches": batches, "problems_per_batch": prompts,
                     "group_size": rl.samples, "updates_per_batch": updates}}


def _write_json(path: str, value: Any) -> None:
    if shd.is_main_process():
        atomic_files.write_json(path, value, indent=2, default=float)


def _all_steps_right(task: Task, example: Example, hypothesis: str) -> bool:
    from refiner_jax.runs.reward_run import _all_steps_right as steps_right  # reward_run imports this module

    return steps_right(task, example, hypothesis)


class _Sampler:
    """Draws, rewards and batches one sample batch of a GRPO stage (`draw`)."""

    def __init__(self, run, reward: str, round_index: int, problems: Sequence[Example], plan: dict, name: str):
        c = run.config
        self.run, self.reward, self.round_index, self.problems, self.name = run, reward, round_index, problems, name
        self.prompts, self.group = plan["problems_per_batch"], plan["group_size"]
        self.lm = LanguageModel(run.s.model_config)
        unit = c.grpo.microbatches * shd.batch_divisor(run.s.mesh, run.s.common["rules"]) * jax.process_count()
        self.rows = -(-self.prompts * self.group // unit) * unit
        self.order = np.random.default_rng([c.seed, round_index]).permutation(len(problems))
        self.reference = run.policy("sft")
        self.log_probs = grpo.jitted_token_log_probs(self.lm)
        model = "prm" if reward == "final_prm" else reward
        self.scorer = None if reward == "final" else run.scorer(None, model)

    def _log_probs(self, params: Any, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        with shd.use_mesh(self.run.s.mesh, self.run.s.common["rules"]):
            log_p, weights = self.log_probs(params, batch)
        return np.asarray(log_p, np.float32), np.asarray(weights, np.float32)

    def draw(self, params: Any, index: int, step: int) -> list[dict[str, np.ndarray]]:
        """Sample batch `index` from `params`: its rows, each a dict of `grpo.grpo_batch` arrays."""
        run, c, task = self.run, self.run.config, self.run.task
        start = time.time()
        examples = [self.problems[int(i)] for i in self.order[index * self.prompts:(index + 1) * self.prompts]]
        model = run.text_model(params, rows=self.prompts)
        key = jax.random.fold_in(jax.random.key(c.seed + 100 * self.round_index + 50), index)
        samples = model.generate([ex.x for ex in examples], num_samples=self.group, temperature=c.reward.temperature,
                                 top_p=c.reward.top_p, rng=key)  # [prompts][group]
        flat = [(ex, h) for ex, hs in zip(examples, samples) for h in hs]
        prompts, texts = [ex.x for ex, _ in flat], [h for _, h in flat]
        right = np.array([task.outcome_label(ex, h) for ex, h in flat], np.float64)
        advantages, scalar = self.advantages(prompts, texts, right)
        batch = grpo.grpo_batch(self.lm, run.s.tokenizer, prompts, texts, [task.split_steps(h) for h in texts],
                                advantages, run.lengths.input, run.lengths.target, self.rows)
        batch["old_log_probs"], weights = self._log_probs(params, batch)
        batch["ref_log_probs"], _ = self._log_probs(self.reference, batch)
        steps_ok = np.array([_all_steps_right(task, ex, h) for ex, h in flat])
        groups = scalar.reshape(len(examples), self.group)
        record = {"batch": index, "step": step, "reward": float(scalar.mean()),
                  "kl": grpo.k3_mean(batch["old_log_probs"], batch["ref_log_probs"], weights),
                  "sample_accuracy": float(right.mean()),
                  "sample_trace_error": rerank.trace_error(right > 0, steps_ok),
                  "equal_reward_groups": float(np.mean(np.ptp(groups, axis=1) == 0)),
                  "samples": len(flat), "seconds": time.time() - start}
        if shd.is_main_process():
            with open(os.path.join(run.workdir, self.name, ROUNDS_FILE), "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        return [{k: v[i] for k, v in batch.items()} for i in range(self.rows)]

    def advantages(self, prompts: list[str], texts: list[str], right: np.ndarray
                   ) -> tuple[list[Any], np.ndarray]:
        """(each sample's advantage: a float, or an array over its steps; each sample's scalar reward)."""
        eps, n, g = self.run.config.grpo.adv_eps, len(texts), self.group
        if self.reward in ("final", "orm"):
            scalar = right if self.reward == "final" else self.scorer.solution_scores(prompts, texts, "last")
            return list(grpo.group_advantages(scalar.reshape(-1, g), eps).ravel()), scalar
        steps = self.scorer.step_scores(prompts, texts)
        per_step = [a for start in range(0, n, g) for a in grpo.step_advantages(steps[start:start + g], eps)]
        scalar = reduce_steps(steps, self.run.config.reward.prm_reduction)
        if self.reward == "final_prm":
            outcome = grpo.group_advantages(right.reshape(-1, g), eps).ravel()
            per_step = [a + o for a, o in zip(per_step, outcome)]
            scalar = scalar + right
        return per_step, scalar


def round_spec(run, reward: str, round_index: int, previous: str) -> tuple[StageSpec, Any]:
    """The stage `grpo_<reward>_<round_index>`, from the policy of stage `previous`, and its initial parameters."""
    c = run.config
    problems = list(run.s.splits["train"][:c.rl.problems]) + run.extra
    budget = accounting(c, len(problems))
    plan = budget["grpo"]
    name = f"grpo_{reward}_{round_index}"
    os.makedirs(os.path.join(run.workdir, name), exist_ok=True)
    _write_json(os.path.join(run.workdir, name, ACCOUNTING_FILE), budget)
    sampler = _Sampler(run, reward, round_index, problems, plan, name)
    cache: dict[int, list] = {}

    def make(params, indices, step):
        index = step // c.grpo.updates
        if index not in cache:
            cache.clear()
            cache[index] = sampler.draw(params, index, step)
        return cache[index]

    def collate(rows):
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

    stage = ml_collections.ConfigDict({"steps": c.rl.steps, "batch_size": plan["problems_per_batch"],
                                       "microbatches": c.grpo.microbatches, "optimizer": c.grpo.optimizer.to_dict(),
                                       "eval_every": c.rl.eval_every})
    examples = run.s.splits["val"][:c.rl.eval_examples]
    spec = StageSpec(name, stage, len(problems), make, lambda p: validation(run, p, examples),
                     run.task.primary_metric, run.lengths.input, run.lengths.target,
                     loss=lambda m: grpo.grpo_loss(sampler.lm, m, c.grpo.eps_clip, c.grpo.kl_beta), collate=collate)
    return spec, run.policy(previous)


def validation(run, params: Any, examples: Sequence[Example]) -> dict[str, float]:
    """The task's metrics of the greedy policy on `examples`, with its final-answer error and trace error."""
    task = run.task
    out = run.text_model(params).greedy([ex.x for ex in examples])
    right = np.array([task.outcome_label(ex, h) for ex, h in zip(examples, out)])
    steps_ok = np.array([_all_steps_right(task, ex, h) for ex, h in zip(examples, out)])
    return {**task.score(out, examples), "final_answer_error": float(1.0 - right.mean()),
            "trace_error": rerank.trace_error(right, steps_ok)}


def train(run) -> dict:
    """Every GRPO stage of `config.grpo.rewards`, round by round (finished ones skipped): {stage: final metrics}."""
    out = {}
    for reward in run.config.grpo.rewards:
        previous = "sft"
        for r in range(1, run.config.rl.rounds + 1):
            name = f"grpo_{reward}_{r}"
            out[name] = run.stage(name, lambda: round_spec(run, reward, r, previous))
            previous = name
    return out


def read_rounds(workdir: str, stage: str) -> list[dict]:
    """A stage's sample-batch records (`rounds.jsonl`), the last one of each batch (a resumed batch is drawn again)."""
    path = os.path.join(workdir, stage, ROUNDS_FILE)
    if not os.path.isfile(path):
        return []
    by_batch = {int(record["batch"]): record for record in results_lib.read_records(path) if "batch" in record}
    return [by_batch[k] for k in sorted(by_batch)]


def evaluation_rows(run, test: Sequence[Example], greedy_outcome: Callable[[list[str]], Any]
                    ) -> tuple[dict[str, Any], dict[str, dict]]:
    """({"<label> greedy": outcome} of each finished GRPO policy's greedy test answers, {stage: its accounting and
    the mean reward, KL and seconds of its sample batches}); plots the stages' curves as `grpo_curves.png`."""
    c, workdir = run.config, run.workdir
    rows, record, curves = {}, {}, {}
    for reward in c.grpo.rewards:
        for r in range(1, c.rl.rounds + 1):
            name = f"grpo_{reward}_{r}"
            path = os.path.join(workdir, name, ACCOUNTING_FILE)
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as f:
                budget = json.load(f)
            rounds = read_rounds(workdir, name)
            record[name] = {**budget, "sample_batches_drawn": len(rounds),
                            **{f"mean_{k}": float(np.mean([x[k] for x in rounds])) if rounds else None
                               for k in ("reward", "kl", "seconds")}}
            curves[name] = rounds
        stage = f"grpo_{reward}_{c.rl.rounds}"
        if stage_done(workdir, stage) is not None:
            rows[f"{GRPO_LABELS[reward]} greedy"] = greedy_outcome(run.greedy(stage, f"{stage}_test_greedy", test))
    if curves and shd.is_main_process():
        metrics = os.path.join(workdir, "metrics.jsonl")
        validation_records = results_lib.read_metrics(metrics) if os.path.isfile(metrics) else {}
        plots.plot_grpo_curves(curves, {n: validation_records.get(n, []) for n in curves},
                                     c.grpo.updates, os.path.join(workdir, "grpo_curves.png"))
    return rows, record
