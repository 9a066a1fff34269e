"""A whole outcome- vs process-feedback run (Uesato et al.), in order and resumable:

    sft    the policy, x -> z on the training problems (the `warmup` config section)
    orm    an outcome reward model trained on the SFT policy's labelled samples, initialised from the policy
    prm    a process reward model on the same samples (or on a PRM800K-style label file); with
           `reward.labels="rollouts"` also `prm_rollouts`, one on Math-Shepherd rollout labels of those samples
    rl     expert iteration, one policy per reward of `config.rl.rewards`: sample, keep the rewarded, fine-tune
    grpo   GRPO, one policy per reward of `config.grpo.rewards`, on expert iteration's budget (`runs.grpo_stage`)
    eval   K samples per test problem, chosen by greedy / majority vote / ORM or PRM reranking / RM-weighted
           voting, and each RL policy's greedy answer: final-answer error, trace error and error at
           `reward.abstention` abstention with bootstrap intervals, paired trace-error differences, and
           ProcessBench's first-error scores of every step verifier (`runs.step_studies`) (`results.md`,
           `results.json`, `abstention.png`)

Every model learns from the same problems: the training split (the reward models and expert iteration its first
`reward.train_problems` / `rl.problems`) plus `task.extra_problems` generated ones. The SFT policy has then trained on
every problem the reward models learned from, so it is their data-matched baseline: the table's "data-matched" rows
are its own, and `results.json`'s `matched_paired_deltas` every rule's paired difference from its greedy answer
(`majority_paired_deltas`: from its majority vote, the strongest selection rule that needs no reward model).

Policy samples are drawn once per (policy, split) and kept in `<workdir>/samples/`, so a resumed run and the ORM
and PRM stages see the same ones.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from refiner_jax import atomic_files
from refiner_jax import checkpoint as ckpt_lib
from refiner_jax.reward import batches as reward_batches, labels as reward_labels, rerank, scorer as reward_scorer
from refiner_jax import sharding as shd
from refiner_jax.models.reward_model import RewardModel, reference_lm, step_log_odds
from refiner_jax.models.language_model import LanguageModel
from refiner_jax.text_model import TextModel
from refiner_jax.tasks.base import Example, Task
from refiner_jax.tasks.dataset_rows import read_step_labels
from refiner_jax.refiner import stage_data
from refiner_jax.runs import grpo_stage, run_setup, seed_pool, step_studies
from refiner_jax.runs import results as results_lib
from refiner_jax.runs import run_config as config_lib
from refiner_jax.stats import error_auroc, paired_auroc
from refiner_jax.training.loop import StageSpec, stage_done, train_stage
from refiner_jax.training.steps import reward_loss

STAGES = ("sft", "orm", "prm", "rl", "grpo", "eval")
MATCHED = "data-matched (the SFT policy)"  # the label of the data-matched baseline's rows
_SECTIONS = ("warmup", "reward", "rl")  # config sections that train
# The policy rows of expert iteration, by the reward of `config.rl.rewards` that chose its training samples.
RL_LABELS = {"final": "Final-Answer RL", "orm": "ORM-RL", "prm": "PRM-RL", "final_prm": "Final-Answer + PRM RL"}


def _write_json(path: str, value: Any) -> None:
    if shd.is_main_process():
        atomic_files.write_json(path, value, indent=2, default=float)


class Run:
    """One reward-pipeline run: its setup, and the policies, samples and reward models it makes as it goes."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, stages: Sequence[str]):
        self.config, self.workdir, self.stages = config, workdir, tuple(stages)
        self.s = run_setup.setup(config, workdir, self.stages, STAGES, _SECTIONS)
        self.task: Task = self.s.task
        self.lengths = config.lengths
        train, val, test = (self.s.splits[k] for k in ("train", "val", "test"))
        self.extra = self.s.extra
        self.policy_train = list(train) + self.extra  # the SFT policy's problems
        self.train = list(train[:config.reward.train_problems]) + self.extra  # the reward models'
        self.val = val[:config.reward.val_problems]
        self.test = test[:config.eval.examples]
        self.label_ids = reward_labels.label_ids(self.s.tokenizer, tuple(config.reward.label_tokens))
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------------ policies

    def policy(self, stage: str) -> Any:
        return ckpt_lib.load_params(os.path.join(self.workdir, stage, "export"))[0]

    def text_model(self, params: Any, rows: int | None = None) -> TextModel:
        return TextModel(self.s.model_config, params, self.s.tokenizer, self.lengths.input, self.lengths.target,
                         bucket=self.lengths.input, batch_size=rows or self.config.eval.batch_size, mesh=self.s.mesh)

    def samples(self, policy_stage: str, name: str, examples: Sequence[Example], k: int, seed: int,
                with_log_probs: bool = False):
        """`k` samples per problem from the policy of `policy_stage` (and with `with_log_probs` their log-probs
        under it, [n, k]), cached as `<workdir>/samples/<name>.json`. All k samples of a problem come from one
        jitted sampler call (`reward.sample_rows` rows per call)."""
        path = os.path.join(self.workdir, "samples", f"{name}.json")
        cached = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                cached = json.load(f)
            if cached["uids"] != [ex.uid for ex in examples] or cached["k"] != k:
                cached = None
        if cached is None:
            r = self.config.reward
            model = self.text_model(self.policy(policy_stage), rows=max(1, r.sample_rows // k))
            start = time.time()
            out, log_probs = model.generate_with_log_probs(
                [ex.x for ex in examples], num_samples=k, temperature=r.temperature, top_p=r.top_p,
                rng=jax.random.key(seed))
            if shd.is_main_process():
                print(f"[samples] {name}: {k} x {len(examples)} problems in {time.time() - start:.0f}s")
            cached = {"uids": [ex.uid for ex in examples], "k": k, "samples": out, "log_probs": log_probs.tolist()}
            _write_json(path, cached)
        if with_log_probs:
            return cached["samples"], np.asarray(cached["log_probs"], np.float64)
        return cached["samples"]

    def greedy(self, policy_stage: str, name: str, examples: Sequence[Example]) -> list[str]:
        path = os.path.join(self.workdir, "samples", f"{name}.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                cached = json.load(f)
            if cached["uids"] == [ex.uid for ex in examples]:
                return cached["greedy"]
        out = self.text_model(self.policy(policy_stage)).greedy([ex.x for ex in examples])
        _write_json(path, {"uids": [ex.uid for ex in examples], "greedy": out})
        return out

    # ------------------------------------------------------------------------------------------------ reward models

    def module(self) -> RewardModel:
        r = self.config.reward
        return RewardModel(LanguageModel(self.s.model_config).module(), r.head, self.label_ids, r.likelihood)

    def scorer(self, params: Any, kind: str | None = None) -> reward_scorer.RewardScorer:
        if kind is not None:
            return reward_scorer.load_reward_model(os.path.join(self.workdir, kind), self.s.tokenizer, self.task,
                                                   self.lengths.input, self.lengths.target)
        return reward_scorer.RewardScorer(self.module(), params, self.s.tokenizer, self.lengths.input,
                                          self.lengths.target, self.config.reward.max_steps,
                                          split_steps=self.task.split_steps)

    def reward_data(self, kind: str, examples: Sequence[Example], samples: list[list[str]]
                    ) -> list[reward_labels.LabelledSolution]:
        return [reward_labels.labelled(kind, self.task, ex, h) for ex, hs in zip(examples, samples) for h in hs]

    def reward_spec(self, kind: str) -> StageSpec:
        r = self.config.reward
        train_samples = self.samples("sft", "sft_train", self.train, r.samples, self.config.seed)
        if kind == "prm_rollouts":
            data, _ = step_studies.rollout_data(self)
            if r.mixed_only:
                data = mixed_problems(data, r.samples)
        elif kind == "prm" and r.labels_file:
            data = [reward_labels.LabelledSolution(s.question, s.text, s.steps, s.labels)
                    for s in read_step_labels(r.labels_file, neutral=r.neutral)]
            if not data:
                raise config_lib.ConfigError(f"config.reward.labels_file {r.labels_file} holds no labelled solution")
        else:
            data = self.reward_data(kind, self.train, train_samples)
            if r.mixed_only:
                data = mixed_problems(data, r.samples)
                if len(data) < r.batch_size:
                    raise config_lib.ConfigError(
                        f"config.reward.mixed_only: only {len(data)} samples come from problems with both right and "
                        f"wrong samples, fewer than config.reward.batch_size {r.batch_size}; draw more "
                        "(config.reward.samples, train_problems), train the policy longer, or set mixed_only=False")
        val_samples = self.samples("sft", "sft_val", self.val, r.samples, self.config.seed + 1)
        module = self.module()
        d_model = self.s.model_config.d_model
        stage, per_item = r, 1
        if r.pairwise_weight > 0:  # batches of whole problems: each item is one problem's `samples` solutions
            rows_per_shard = r.batch_size // shd.batch_divisor(self.s.mesh, self.s.common["rules"])
            if rows_per_shard % r.samples:
                raise config_lib.ConfigError(
                    f"config.reward.pairwise_weight: a data shard's {rows_per_shard} rows of "
                    f"config.reward.batch_size {r.batch_size} must hold whole problems of config.reward.samples "
                    f"{r.samples} solutions; make the batch size a multiple of samples x data shards")
            stage, per_item = ml_collections.ConfigDict(r.to_dict()), r.samples
            stage.batch_size = r.batch_size // r.samples

        def make(params, indices, step):
            return [data[int(i) * per_item + j] for i in indices for j in range(per_item)]

        def validate(params):  # the rollout PRM is chosen by final answers: no step checker in its loop
            return reward_validation(self.task, self.scorer(params), "orm" if kind == "prm_rollouts" else kind,
                                     self.val, val_samples, r.prm_reduction)

        lm = LanguageModel(self.s.model_config)

        def collate(sols):
            batch = reward_batches.reward_batch(lm, self.s.tokenizer, sols, self.lengths.input, self.lengths.target,
                                                r.max_steps)
            if r.pairwise_weight > 0:
                batch["group"] = np.arange(len(sols), dtype=np.int32) // per_item
            return batch

        reduction = "last" if kind == "orm" else r.prm_reduction
        spec = StageSpec(
            kind, stage, len(data) // per_item, make, validate, "paired_auroc", self.lengths.input,
            self.lengths.target, model=module,
            loss=lambda m: reward_loss(lambda p, b, key: step_log_odds(m, p, b, key),
                                       lambda p, b, key: reference_lm(m, p, b, key), r.lm_weight,
                                       r.pairwise_weight, reduction),
            collate=collate,
            init_args=(jnp.zeros((1, r.max_steps), jnp.int32), jnp.ones((1, 8), jnp.int32),
                       jnp.ones((1, 8), jnp.int32)),
            export_metadata=reward_scorer.export_metadata(module, kind, r.max_steps), patience=r.patience)
        init = {"lm": self.policy("sft")}
        if r.head == "scalar":
            init.update(score_kernel=np.zeros((d_model,), np.float32), score_bias=np.zeros((), np.float32))
        if r.likelihood:
            init["likelihood_scale"] = np.ones((), np.float32)
        return spec, init

    # ------------------------------------------------------------------------------------------------ stages

    def stage(self, name: str, make_spec) -> dict | None:
        done = stage_done(self.workdir, name)
        if done is not None or name.split("_")[0] not in self.stages:
            return done
        spec, init = make_spec()
        start = time.time()
        out = train_stage(spec, init_params=init, **self.s.common)
        self.timings[name] = time.time() - start
        return out

    def sft_spec(self):
        c = self.config
        pairs = stage_data.warmup_pairs(self.policy_train, self.task, 0.0, seed=c.seed)
        return StageSpec("sft", c.warmup, len(self.policy_train), pairs, self.generator_eval(c.warmup.eval_examples),
                         self.task.primary_metric, self.lengths.input, self.lengths.target,
                         patience=c.warmup.patience), self.s.pretrained

    def generator_eval(self, count: int):
        examples = self.s.splits["val"][:count]
        return lambda p: stage_data.generator_metrics(self.task, self.text_model(p), examples)

    def rl_round_spec(self, reward: str, round_index: int, previous: str):
        """A round of expert iteration: sample from the `previous` policy, keep what `reward` accepts, fine-tune."""
        c = self.config
        problems = list(self.s.splits["train"][:c.rl.problems]) + self.extra
        name = f"rl_{reward}_{round_index}"
        samples = self.samples(previous, name, problems, c.rl.samples, c.seed + 100 * round_index)
        kept = self.keep(reward, problems, samples)
        if len(kept) < c.rl.batch_size:
            raise config_lib.ConfigError(
                f"expert iteration with reward {reward!r} kept {len(kept)} of {c.rl.samples * len(problems)} samples, "
                f"fewer than config.rl.batch_size {c.rl.batch_size}; lower config.rl.threshold or draw more "
                "(config.rl.samples, config.rl.problems)")
        # What the filter let through, by the task's checker: kept samples with a wrong answer or a wrong step.
        _write_json(os.path.join(self.workdir, name, "kept.json"),
                    {"kept": len(kept), "sampled": c.rl.samples * len(problems), "gradient_steps": c.rl.steps,
                     "kept_wrong_answer": sum(not self.task.outcome_label(ex, h) for ex, h in kept),
                     "kept_wrong_step": sum(not _all_steps_right(self.task, ex, h) for ex, h in kept)})
        pairs = [(ex.x, h) for ex, h in kept]

        def make(params, indices, step):
            return [pairs[int(i)] for i in indices]

        return (StageSpec(name, c.rl, len(kept), make, self.generator_eval(c.rl.eval_examples),
                          self.task.primary_metric, self.lengths.input, self.lengths.target, patience=c.rl.patience),
                self.policy(previous))

    def keep(self, reward: str, problems: Sequence[Example], samples: list[list[str]]) -> list[tuple[Example, str]]:
        """(problem, solution) pairs of the distinct samples that `reward` accepts."""
        flat = [(ex, h) for ex, hs in zip(problems, samples) for h in dict.fromkeys(hs) if h.strip()]
        right = np.array([self.task.outcome_label(ex, h) for ex, h in flat], bool)
        if reward == "final":
            accepted = right
        else:
            model = "prm" if reward == "final_prm" else reward
            reduction = "last" if model == "orm" else self.config.reward.prm_reduction
            scores = self.scorer(None, model).solution_scores([ex.x for ex, _ in flat], [h for _, h in flat],
                                                              reduction)
            accepted = rl_accepts(reward, right, scores, self.config.rl.threshold)
        return [(ex, h) for (ex, h), ok in zip(flat, accepted) if ok]

    def rl(self) -> dict:
        out = {}
        for reward in self.config.rl.rewards:
            previous = "sft"
            for r in range(1, self.config.rl.rounds + 1):
                name = f"rl_{reward}_{r}"
                out[name] = self.stage(name, lambda: self.rl_round_spec(reward, r, previous))
                previous = name
        return out

    # ------------------------------------------------------------------------------------------------ evaluation

    def evaluate(self) -> dict:
        c, task, test = self.config, self.task, self.test
        k = c.reward.test_samples
        samples, log_probs = self.samples("sft", "sft_test", test, k, c.seed + 2, with_log_probs=True)  # [n][k]
        greedy = self.greedy("sft", "sft_test_greedy", test)
        flat_x = [ex.x for ex in test for _ in range(k)]
        flat_h = [h for hs in samples for h in hs]
        orm, prm = self.scorer(None, "orm"), self.scorer(None, "prm")
        step_scorers = {"orm": orm.step_scores, "prm": prm.step_scores, "policy_log_prob": self.policy_step_log_probs}
        if stage_done(self.workdir, "prm_rollouts") is not None:
            step_scorers["prm_rollouts"] = self.scorer(None, "prm_rollouts").step_scores
        step_scores = {name: score(flat_x, flat_h) for name, score in step_scorers.items()}  # [n * k][steps]
        orm_scores = reward_scorer.reduce_steps(step_scores["orm"], "last").reshape(len(test), k)
        prm_scores = reward_scorer.reduce_steps(step_scores["prm"], c.reward.prm_reduction).reshape(len(test), k)
        answers = [[task.answer_key(ex, h) for h in hs] for ex, hs in zip(test, samples)]
        correct = np.array([[task.outcome_label(ex, h) for h in hs] for ex, hs in zip(test, samples)])
        steps_ok = np.array([[_all_steps_right(task, ex, h) for h in hs] for ex, hs in zip(test, samples)])

        def greedy_outcome(solutions: list[str]) -> rerank.Outcome:
            """A policy's greedy answers, its confidence the ORM's score of them."""
            conf = orm.solution_scores([ex.x for ex in test], solutions, "last")[:, None]
            sel = rerank.greedy([[task.answer_key(ex, h)] for ex, h in zip(test, solutions)], conf)
            return sel.outcome([[task.outcome_label(ex, h)] for ex, h in zip(test, solutions)],
                               [[_all_steps_right(task, ex, h)] for ex, h in zip(test, solutions)])

        sources = {"orm": orm_scores, "prm": prm_scores, "log_prob": log_probs}  # [n, k] each: `rerank.RULES`
        if "prm_rollouts" in step_scores:
            rollout_scores = reward_scorer.reduce_steps(step_scores["prm_rollouts"], c.reward.prm_reduction)
            sources["prm_rollouts"] = rollout_scores.reshape(len(test), k)
        critic = None
        if c.reward.critic_workdir:  # a REFINER run's trained critic: its confidence that a sample is right
            from refiner_jax.refiner.critics import load_critic

            critic = load_critic(config_lib.load_run(c.reward.critic_workdir), task, c.eval.batch_size, self.s.mesh)
            sources["critic"] = critic.confidence([ex for ex in test for _ in range(k)], flat_h).reshape(len(test), k)
        rows = {name: sel.outcome(correct, steps_ok) for name, sel in rerank.rule_rows(answers, sources, k).items()}
        majority = rerank.rule("majority_vote").label.format(k=k)
        outcomes = {"SFT greedy": greedy_outcome(greedy), majority: rows.pop(majority)}
        # The data-matched policy is the SFT policy itself (see the module's docstring): its rows, not a second one.
        matched_baseline = f"SFT greedy, {MATCHED}"
        outcomes.update({matched_baseline: outcomes["SFT greedy"], f"{majority}, {MATCHED}": outcomes[majority]})
        outcomes.update(rows)
        rl_kept = {}
        for reward in c.rl.rewards:
            stage = f"rl_{reward}_{c.rl.rounds}"
            for r in range(1, c.rl.rounds + 1):
                kept_file = os.path.join(self.workdir, f"rl_{reward}_{r}", "kept.json")
                if os.path.isfile(kept_file):
                    with open(kept_file) as f:
                        rl_kept[f"rl_{reward}_{r}"] = json.load(f)
            if stage_done(self.workdir, stage) is not None:
                label = RL_LABELS[reward]
                outcomes[f"{label} greedy"] = greedy_outcome(self.greedy(stage, f"{stage}_test_greedy", test))
        grpo_rows, grpo_record = grpo_stage.evaluation_rows(self, test, greedy_outcome)
        outcomes.update(grpo_rows)
        trace_pairs = _trace_pairs(outcomes, k)
        baselines = {"matched_paired_deltas": matched_baseline, "majority_paired_deltas": majority}
        table = rerank.results_table(outcomes, rate=c.reward.abstention, samples=c.eval.bootstrap_samples,
                                     seed=c.seed, more_baselines=tuple(baselines.values()), trace_pairs=trace_pairs)
        _write_json(os.path.join(self.workdir, seed_pool.OUTCOMES_FILE),
                    seed_pool.outcomes_record(outcomes, seed=c.seed, k=k, rate=c.reward.abstention,
                                              trace_pairs=trace_pairs, baselines=baselines))
        first_errors, first_error_deltas = step_studies.first_error_study(self, test, samples, step_scores,
                                                                          step_scorers, critic)
        groups = np.repeat(np.arange(len(test)), k)
        quality = {
            "orm": {"paired_auroc_final_answer": paired_auroc(orm_scores.ravel(), ~correct.ravel(), groups),
                    "auroc_final_answer": error_auroc(orm_scores.ravel(), ~correct.ravel())},
            "prm": {"paired_auroc_all_steps": paired_auroc(prm_scores.ravel(), ~steps_ok.ravel(), groups),
                    "paired_auroc_final_answer": paired_auroc(prm_scores.ravel(), ~correct.ravel(), groups),
                    "auroc_all_steps": error_auroc(prm_scores.ravel(), ~steps_ok.ravel())},
            "baselines": {"policy_log_prob_paired_auroc": paired_auroc(log_probs.ravel(), ~correct.ravel(), groups),
                          "vote_share_paired_auroc": paired_auroc(_vote_shares(answers).ravel(), ~correct.ravel(),
                                                                  groups)},
            "samples": {"k": k, "any_right": float(correct.any(axis=1).mean()),
                        "right": float(correct.mean()), "all_steps_right": float(steps_ok.mean()),
                        "trace_error_floor": rerank.trace_error_floor(correct, steps_ok)},
        }
        curves = {name: rerank.abstention_curve(o.confidence, o.correct) for name, o in outcomes.items()}
        results = {"table": table.rows, "paired_deltas": {"baseline": table.baseline, **table.deltas},
                   **table.delta_blocks(baselines),
                   "trace_error_delta": table.trace_deltas, "first_error": first_errors,
                   "first_error_delta": first_error_deltas,
                   **({"rollout_labels": step_studies.rollout_data(self)[1]} if "prm_rollouts" in step_scores else {}),
                   "rate": table.rate, "problems": table.n_problems, "quality": quality, "rl_kept": rl_kept,
                   "grpo": grpo_record,
                   "curves": {n: {"coverage": cv.coverage.tolist(), "error": cv.error.tolist()}
                              for n, cv in curves.items()},
                   "convergence": results_lib.convergence({"": self.workdir})}
        if shd.is_main_process():
            results_lib.write_reward_results(self.workdir, task.name, table, quality, curves, first_errors,
                                             first_error_deltas, results["convergence"])
        _write_json(os.path.join(self.workdir, "results.json"), results)
        return results

    def policy_step_log_probs(self, prompts: Sequence[str], texts: Sequence[str]) -> list[np.ndarray]:
        return reward_scorer.policy_step_log_probs(
            self.policy("sft"), self.s.model_config, self.s.tokenizer, self.task, self.lengths.input,
            self.lengths.target, self.config.reward.max_steps, prompts, texts)


def _trace_pairs(outcomes: dict, k: int) -> list[tuple[str, str]]:
    """The trace-error comparisons of Uesato et al. among the rules present: PRM vs ORM reranking and greedy, and
    PRM-RL vs Final-Answer RL and ORM-RL, and the answer-and-PRM filter vs the answer alone."""
    wanted = [(f"PRM rerank (K={k})", f"ORM rerank (K={k})"), (f"PRM rerank (K={k})", "SFT greedy"),
              (f"ORM rerank (K={k})", "SFT greedy"), (f"PRM-weighted vote (K={k})", f"ORM-weighted vote (K={k})"),
              ("PRM-RL greedy", "Final-Answer RL greedy"), ("PRM-RL greedy", "ORM-RL greedy"),
              ("Final-Answer + PRM RL greedy", "Final-Answer RL greedy"),
              ("PRM-GRPO greedy", "Final-Answer GRPO greedy"), ("PRM-GRPO greedy", "ORM-GRPO greedy"),
              ("Final-Answer + PRM GRPO greedy", "Final-Answer GRPO greedy"),
              ("Final-Answer GRPO greedy", "Final-Answer RL greedy"), ("PRM-GRPO greedy", "PRM-RL greedy")]
    return [(a, b) for a, b in wanted if a in outcomes and b in outcomes]


def rl_accepts(reward: str, right: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """Which samples expert iteration with a reward model keeps: "orm" / "prm" those whose score reaches
    `threshold`, "final_prm" those with the `right` answer whose PRM score reaches it (the PRM removes right answers
    reached through a wrong step from what the answer check keeps)."""
    passed = np.asarray(scores) >= threshold
    return passed & right if reward == "final_prm" else passed


def mixed_problems(data: Sequence[reward_labels.LabelledSolution], k: int) -> list[reward_labels.LabelledSolution]:
    """The solutions of the problems (runs of `k` consecutive solutions) whose solution labels (the last step's)
    are not all equal: on them the label cannot be told from the problem alone, only from the solution."""
    out: list[reward_labels.LabelledSolution] = []
    for start in range(0, len(data), k):
        group = data[start:start + k]
        if len({bool(s.labels) and s.labels[-1] for s in group}) > 1:
            out += group
    return out


def _vote_shares(answers: list[list]) -> np.ndarray:
    """[n, K] the share of its problem's samples that reach each sample's answer (0 without an answer)."""
    out = np.zeros((len(answers), len(answers[0]) if answers else 0))
    for i, row in enumerate(answers):
        for j, a in enumerate(row):
            out[i, j] = 0.0 if a is None else sum(b == a for b in row) / len(row)
    return out


def _all_steps_right(task: Task, example: Example, hypothesis: str) -> bool:
    labels = task.step_labels(example, hypothesis)
    return bool(labels) and all(labels)


def reward_validation(task: Task, scorer: reward_scorer.RewardScorer, kind: str, examples: Sequence[Example],
                      samples: list[list[str]], prm_reduction: str = "min") -> dict[str, float]:
    """A reward model on policy samples of validation problems: step accuracy against its own labels, paired
    (within-problem) AUROC of its solution score against its solution label (the ORM's: the final answer; the PRM's:
    every step right), and the final-answer accuracy of reranking the samples by it."""
    flat = [(ex, h) for ex, hs in zip(examples, samples) for h in hs]
    steps = scorer.step_scores([ex.x for ex, _ in flat], [h for _, h in flat])
    hits, count, scores, labels = 0, 0, [], []
    for (ex, h), s in zip(flat, steps):
        want = reward_labels.step_labels(kind, task, ex, h)[:len(s)]
        hits += int(np.sum((np.asarray(s) > 0.5) == np.asarray(want, bool)))
        count += len(want)
        reduction = "last" if kind == "orm" else prm_reduction
        scores.append(float(rerank.solution_scores([s], reduction)[0]) if len(s) else 0.0)
        labels.append(bool(want) and all(want) if kind == "prm" else task.outcome_label(ex, h))
    k = len(samples[0]) if samples else 1
    groups = np.repeat(np.arange(len(examples)), k)
    answers = [[task.answer_key(ex, h) for h in hs] for ex, hs in zip(examples, samples)]
    correct = np.array([[task.outcome_label(ex, h) for h in hs] for ex, hs in zip(examples, samples)])
    chosen = rerank.best_of_k(answers, np.asarray(scores).reshape(len(examples), k)).outcome(correct)
    auroc = paired_auroc(scores, ~np.asarray(labels), groups)
    return {"step_accuracy": hits / max(count, 1), "paired_auroc": 0.5 if np.isnan(auroc) else auroc,
            "rerank_accuracy": float(chosen.correct.mean())}


def run(config: ml_collections.ConfigDict, workdir: str, stages: Sequence[str] = STAGES) -> dict:
    """Runs (or resumes) the requested stages of the reward pipeline; returns {stage: final metrics}."""
    r = Run(config, workdir, stages)
    results: dict[str, Any] = {"sft": r.stage("sft", r.sft_spec)}
    kinds = ("orm", "prm", "prm_rollouts") if config.reward.labels == "rollouts" else ("orm", "prm")
    for kind in kinds:
        results[kind] = r.stage(kind, lambda: r.reward_spec(kind))
    results.update(r.rl())
    results.update(grpo_stage.train(r))
    results["eval"] = stage_done(workdir, "eval")
    if "eval" in r.stages and results["eval"] is None:
        start = time.time()
        evaluation = r.evaluate()
        r.timings["eval"] = time.time() - start
        results["eval"] = {"table": evaluation["table"], "seconds": r.timings["eval"]}
        _write_json(os.path.join(workdir, "eval", "DONE"), results["eval"])
    r.s.close()
    if shd.is_main_process():
        with open(os.path.join(workdir, "timings.json"), "a", encoding="utf-8") as f:
            f.write(json.dumps(r.timings) + "\n")
        print("[timings] " + ", ".join(f"{k} {v:.0f}s" for k, v in r.timings.items()))
    return results
