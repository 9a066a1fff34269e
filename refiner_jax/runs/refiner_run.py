"""A whole REFINER run: tokenizer, generator warm-up, critic, REFINER loop, the matched generator (a baseline),
critic calibration, evaluation — in order, resumable. With `refiner.controls`, two more generators start from the
same warm-up checkpoint and train with the REFINER stage's steps, patience and optimizer, to tell the loop's
feedback from its extra updates: `refiner_random`, the same loop with random feedback (`feedback_noise` 1), and
`sft_continued`, the warm-up's supervised recipe continued on the same problems, as many text pairs per update.

`run(config, workdir)` sets the run up (`run_setup.setup`), then runs each stage that has not finished (a finished
stage leaves `<workdir>/<stage>/DONE`; an interrupted one resumes from its last checkpoint). The workdir keeps
`config.json`, the tokenizer, per-stage checkpoints and exports, `metrics.jsonl`, TensorBoard logs and the results.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import time
from typing import Any, Iterator

import ml_collections

from refiner_jax import atomic_files
from refiner_jax import checkpoint as ckpt_lib
from refiner_jax import sharding as shd
from refiner_jax.refiner import evaluation, stage_data
from refiner_jax.refiner.critics import CALIBRATION_FILE, ModelCritic, SolverCritic, load_critic
from refiner_jax.runs import refiner_eval
from refiner_jax.runs import results as results_lib
from refiner_jax.runs import run_config as config_lib
from refiner_jax.runs.run_setup import Setup, setup
from refiner_jax.tasks.base import Example
from refiner_jax.runs.run_info import RunInfo
from refiner_jax.text_model import TextModel
from refiner_jax.training.loop import StageSpec, stage_done, train_stage

STAGES = ("warmup", "critic", "refiner", "refiner_random", "sft_continued", "matched", "eval")
CONTROLS = ("refiner_random", "sft_continued")  # trained only with config.refiner.controls


def run(config: ml_collections.ConfigDict, workdir: str, stages: tuple[str, ...] = STAGES) -> dict:
    """Runs (or resumes) the requested stages; returns {stage: final metrics}."""
    _check_warmup_first(config, workdir, stages)
    job = _Job(config, workdir, stages, setup(config, workdir, stages, STAGES, ("critic", "warmup", "refiner"),
                                              held_out=config.critic.calibration_examples))
    for name, (spec, init) in job.trained_stages().items():
        job.train(name, spec, init)
    if {"critic", "refiner", "eval"} & set(stages):
        job.calibrate_critic()
    job.evaluate()
    return job.finish()


@dataclasses.dataclass
class StagePlan:
    """Stage `name` of the REFINER run in a workdir as `run` would train it, without training it: for tools that
    drive its updates themselves (the benchmarks time them).

    `spec` is what it trains, `init_params` the parameters it starts from (None: fresh), `train_kwargs`
    `training.loop.train_stage`'s keywords `model_config`, `tokenizer`, `mesh`, `seed`, `rules`, `pack`;
    `config` the run's config and `train_problems` its training problems."""

    name: str
    spec: StageSpec
    init_params: Any
    train_kwargs: dict[str, Any]
    config: ml_collections.ConfigDict
    train_problems: list[Example]


@contextlib.contextmanager
def stage_plan(workdir: str, name: str = "refiner") -> Iterator[StagePlan]:
    """The `StagePlan` of stage `name` (warmup, critic, refiner, matched, and with `refiner.controls` refiner_random
    and sft_continued) of the run in `workdir`; the REFINER loop and its controls start from the warm-up's export,
    so the warm-up must be done. The run's stages, checkpoints and results
    are untouched; the run's setup is closed on exit."""
    config = config_lib.load(workdir)
    _check_warmup_first(config, workdir, (name,))
    job = _Job(config, workdir, (name,), setup(config, workdir, (name,), STAGES, ("critic", "warmup", "refiner"),
                                               held_out=config.critic.calibration_examples))
    try:
        spec, init = job.trained_stages()[name]
        common = {k: job.s.common[k] for k in ("model_config", "tokenizer", "mesh", "seed", "rules", "pack")}
        yield StagePlan(name, spec(), init(), common, config, job.train_set)
    finally:
        job.s.close()


def _check_warmup_first(config: ml_collections.ConfigDict, workdir: str, stages: tuple[str, ...]) -> None:
    """Refuses a stage that builds on the warmed-up generator when that is neither trained nor requested."""
    built_on_warmup = {
        "critic": "config.critic.generator_fraction > 0: the critic samples from the warmed-up generator",
        **{name: f"the {name} stage starts from the warmed-up generator" for name in ("refiner", *CONTROLS)}}
    if config.critic.generator_fraction <= 0 or config.critic.mode == "solve":
        del built_on_warmup["critic"]
    for name, why in built_on_warmup.items():
        if (name in stages and "warmup" not in stages and stage_done(workdir, name) is None
                and stage_done(workdir, "warmup") is None):
            raise config_lib.ConfigError(f"{why}, so run the warmup stage first (--stages=warmup,{name},...)")


class _Job:
    """One REFINER run's stages over a shared `Setup`: what each trains (`*_spec`), the critic's calibration and
    the evaluation; `results` and `timings` collect as they finish."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, stages: tuple[str, ...], s: Setup):
        self.config, self.workdir, self.stages, self.s = config, workdir, stages, s
        self.task, self.lengths = s.task, config.lengths
        self.val = s.splits["val"]
        self.held_out = s.held_out  # calibration problems no stage sees (`calibration_problems`)
        self.train_set = s.splits["train"] + s.extra  # every model's training problems
        self.results: dict[str, Any] = {}
        self.timings: dict[str, float] = {}

    def text_model(self, params, max_input: int, max_output: int) -> TextModel:
        # Prompts padded to the full budget: one compiled sampler per (batch, budget) for the whole run.
        return TextModel(self.s.model_config, params, self.s.tokenizer, max_input, max_output, bucket=max_input,
                         batch_size=self.config.eval.batch_size, mesh=self.s.mesh)

    def trained_stages(self) -> dict[str, tuple]:
        """{stage: (what it trains, the parameters it starts from: a checkpoint's, or None for fresh)} in run
        order; the loop's controls only with `refiner.controls`."""
        stages = {"warmup": (self.warmup_spec, self.pretrained), "critic": (self.critic_spec, self.pretrained),
                  "refiner": (self.refiner_spec, self.warmed_up_params),
                  "refiner_random": (self.random_feedback_spec, self.warmed_up_params),
                  "sft_continued": (self.sft_continued_spec, self.warmed_up_params),
                  "matched": (self.matched_spec, self.pretrained)}
        return {k: v for k, v in stages.items() if k not in CONTROLS or self.config.refiner.controls}

    def train(self, name: str, spec_fn, init_fn) -> None:
        """Trains stage `name` unless it is done or not requested; its spec and initial parameters are made only
        when it trains."""
        done = stage_done(self.workdir, name)
        if done is not None or name not in self.stages:
            self.results[name] = done
            return
        start = time.time()
        self.results[name] = train_stage(spec_fn(), init_params=init_fn(), **self.s.common)
        self.timings[name] = time.time() - start

    def pretrained(self):
        return self.s.pretrained

    def warmed_up_params(self):
        return ckpt_lib.load_params(os.path.join(self.workdir, "warmup", "export"))[0]

    def generator_eval(self, examples):
        def evaluate(p):
            return stage_data.generator_metrics(self.task, self.text_model(p, self.lengths.input, self.lengths.target),
                                                examples)
        return evaluate

    def warmup_spec(self) -> StageSpec:
        config, lengths = self.config, self.lengths
        warm_train = self.train_set[:max(config.warmup.batch_size,
                                         int(round(len(self.train_set) * config.warmup.fraction)))]
        fraction = config.warmup.feedback_fraction
        pairs = stage_data.warmup_pairs(warm_train, self.task, fraction, config.refiner.template, config.seed)
        return StageSpec("warmup", config.warmup, len(warm_train), pairs,
                         self.generator_eval(self.val[:config.warmup.eval_examples]), self.task.primary_metric,
                         lengths.refine_input if fraction > 0 else lengths.input, lengths.target,
                         patience=config.warmup.patience)

    def critic_spec(self) -> StageSpec:
        config, lengths, task, s = self.config, self.lengths, self.task, self.s
        critic_val = self.val[:config.critic.eval_examples]
        if config.critic.mode == "solve":
            return StageSpec(
                "critic", config.critic, len(self.train_set),
                stage_data.warmup_pairs(self.train_set, task, seed=config.seed),
                lambda p: stage_data.critic_validation(
                    task, SolverCritic(self.text_model(p, lengths.input, lengths.target), task), critic_val,
                    config.seed),
                "paired_auroc", lengths.input, lengths.target, patience=config.critic.patience)
        generator = None
        if config.critic.generator_fraction > 0:
            sampled = max(1, int(round(config.critic.batch_size * config.critic.generator_fraction)))
            generator = TextModel(s.model_config, self.warmed_up_params(), s.tokenizer, lengths.input,
                                  lengths.target, bucket=lengths.input, batch_size=sampled, mesh=s.mesh)
        pairs = stage_data.critic_pairs(task, self.train_set, config.seed, generator,
                                        config.critic.generator_fraction, top_p=config.critic.generator_top_p,
                                        balanced=config.critic.balanced)
        return StageSpec(
            "critic", config.critic, len(self.train_set), pairs,
            lambda p: stage_data.critic_validation(
                task, ModelCritic(self.text_model(p, lengths.critic_input, lengths.feedback), task), critic_val,
                config.seed),
            "paired_auroc", lengths.critic_input, lengths.feedback, patience=config.critic.patience)

    def refiner_spec(self, name: str = "refiner", stage: ml_collections.ConfigDict | None = None) -> StageSpec:
        """The REFINER loop (`stage`: its config section, default `config.refiner`)."""
        config, lengths = self.config, self.lengths
        stage = stage or config.refiner
        sampler_model = self.text_model(None, lengths.refine_input, lengths.target)
        return StageSpec(name, stage, len(self.train_set),
                         stage_data.refiner_pairs(self.task, self.train_set, sampler_model, stage, config.seed),
                         self.generator_eval(self.val[:stage.eval_examples]), self.task.primary_metric,
                         lengths.refine_input, lengths.target, patience=stage.patience)

    def random_feedback_spec(self) -> StageSpec:
        """The REFINER loop with random feedback (the oracle's feedback on a random perturbation of the problem,
        `refiner.feedback_noise` 1): its updates and revision format without what the feedback says."""
        stage = ml_collections.ConfigDict(self.config.refiner.to_dict())
        stage.feedback_noise = 1.0
        return self.refiner_spec("refiner_random", stage)

    def sft_continued_spec(self) -> StageSpec:
        """The warm-up's supervised recipe (its `feedback_fraction` of revision instances) continued on the REFINER
        loop's problems, with its steps, patience, optimizer and validation, and as many text pairs per update
        (`refiner.batch_size` x `refiner.turns`): the loop's extra updates without its sampling and feedback."""
        config, lengths, r = self.config, self.lengths, self.config.refiner
        stage = ml_collections.ConfigDict(r.to_dict())
        stage.batch_size = r.batch_size * r.turns
        fraction = config.warmup.feedback_fraction
        pairs = stage_data.warmup_pairs(self.train_set, self.task, fraction, r.template, config.seed)
        return StageSpec("sft_continued", stage, len(self.train_set), pairs,
                         self.generator_eval(self.val[:r.eval_examples]), self.task.primary_metric,
                         lengths.refine_input if fraction > 0 else lengths.input, lengths.target,
                         patience=r.patience)

    def matched_spec(self) -> StageSpec:
        """The matched generator: the warm-up's recipe on all the training problems, for as many updates as
        warm-up, critic and REFINER loop made together (their caps, with the warm-up's patience)."""
        config, lengths = self.config, self.lengths
        stage = ml_collections.ConfigDict(config.warmup.to_dict())
        stage.steps = config.warmup.steps + config.critic.steps + config.refiner.steps
        fraction = config.warmup.feedback_fraction
        pairs = stage_data.warmup_pairs(self.train_set, self.task, fraction, config.refiner.template, config.seed)
        return StageSpec("matched", stage, len(self.train_set), pairs,
                         self.generator_eval(self.val[:config.warmup.eval_examples]), self.task.primary_metric,
                         lengths.refine_input if fraction > 0 else lengths.input, lengths.target,
                         patience=stage.patience)

    def calibration_problems(self) -> list[Example]:
        """Problems no stage trained on or chose a checkpoint by: fresh ones, else the validation problems past
        those the stages validate on (a generator chosen on a problem looks better there than it is), else all of
        validation."""
        if self.held_out:
            return self.held_out
        used = max(self.config[name].eval_examples for name in ("warmup", "critic", "refiner"))
        count = self.config.critic.calibration_examples
        return self.val[used:used + count] or self.val[:count]

    def calibrate_critic(self) -> None:
        """Calibrates the trained critic's "No hint" threshold on `calibration_problems`, with the best generator
        trained so far (`evaluation.calibrate_for_refinement`: the threshold that helps one refinement turn most);
        without a generator, by error-detection accuracy on perturbations. Done again when a better generator
        (the REFINER one) has been trained since."""
        config, workdir, task = self.config, self.workdir, self.task
        path = os.path.join(workdir, "critic", CALIBRATION_FILE)
        generators = [name for name in ("refiner", "warmup") if stage_done(workdir, name) is not None]
        source = generators[0] if generators else "perturbations"
        if stage_done(workdir, "critic") is None:
            return
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                if json.load(f).get("generator") == source:
                    return
        critic = load_critic(RunInfo(workdir, config), task, config.eval.batch_size,
                             self.s.mesh)
        examples = self.calibration_problems()
        if generators:
            params = ckpt_lib.load_params(os.path.join(workdir, source, "export"))[0]
            calibration = evaluation.calibrate_for_refinement(
                task, critic, self.text_model(params, self.lengths.refine_input, self.lengths.target), examples,
                config.refiner.template)
        else:
            hypotheses = [task.perturb(ex, random.Random(config.seed + i))[0] for i, ex in enumerate(examples)]
            calibration = stage_data.calibrate_critic(task, critic, examples, hypotheses)
        calibration["generator"] = source
        if shd.is_main_process():
            atomic_files.write_json(path, calibration, indent=2)
            print("[critic] calibrated: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                      for k, v in calibration.items()))
        shd.sync_processes("critic calibrated")

    def evaluate(self) -> None:
        """The results tables (`refiner_eval.evaluate_run`) once, when requested; `eval/DONE` marks them written."""
        workdir = self.workdir
        self.results["eval"] = stage_done(workdir, "eval")
        if "eval" not in self.stages or self.results["eval"] is not None:
            return
        start = time.time()
        tables = refiner_eval.evaluate_run(workdir, self.config, max_examples=self.config.eval.examples,
                                           out_dir=workdir, mesh=self.s.mesh)
        self.timings["eval"] = time.time() - start
        self.results["eval"] = {"rows": tables["rows"], "seconds": self.timings["eval"]}
        if shd.is_main_process():
            atomic_files.write_json(os.path.join(workdir, "eval", "DONE"), self.results["eval"], indent=2,
                                    default=float)
            results_lib.print_results(os.path.join(workdir, "results.json"))

    def finish(self) -> dict:
        self.s.close()
        if shd.is_main_process():
            with open(os.path.join(self.workdir, "timings.json"), "a", encoding="utf-8") as f:
                f.write(json.dumps(self.timings) + "\n")
            print("[timings] " + ", ".join(f"{k} {v:.0f}s" for k, v in self.timings.items()))
        return self.results
