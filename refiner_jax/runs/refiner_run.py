"""A whole REFINER run: tokenizer, generator warm-up, critic, REFINER loop, critic calibration, evaluation — in
order, resumable.

`run(config, workdir)` validates the config, then runs each stage that has not finished (a finished stage leaves
`<workdir>/<stage>/DONE`; an interrupted one resumes from its last checkpoint). The workdir keeps `config.json`
(the run refuses a changed `task`, `tokenizer` or `model` section, which would make the trained stages
meaningless; other changes, such as more steps, apply to the stages still to run), the tokenizer, per-stage
checkpoints and exports, `metrics.jsonl`, TensorBoard logs and the results.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import time
from typing import Any

import jax
import ml_collections

from refiner_jax import checkpoint as ckpt_lib
from refiner_jax import sharding as shd
from refiner_jax.models import decoder as decoder_lib
from refiner_jax.models import hf, hf_decoder
from refiner_jax.models.decoder import DecoderConfig
from refiner_jax.models.t5_config import T5Config, preset
from refiner_jax.refiner.critics import CALIBRATION_FILE, ModelCritic, SolverCritic, load_critic
from refiner_jax.text_model import RunInfo, TextModel
from refiner_jax.tasks import get_task
from refiner_jax.tasks.base import NO_HINT, Example, Task, refine_input
from refiner_jax.tokenizers import (ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer, padded_vocab_size,
                                    train_subword_tokenizer)
from refiner_jax.refiner import evaluation, stage_data
from refiner_jax.runs import refiner_eval
from refiner_jax.runs import results as results_lib
from refiner_jax.runs import run_config as config_lib
from refiner_jax.training.loop import MetricsLog, StageSpec, stage_done, train_stage

STAGES = ("warmup", "critic", "refiner", "eval")
# Config sections whose change would make already-trained stages meaningless.
_FROZEN_SECTIONS = ("task", "tokenizer", "model")


def _check_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> bool:
    """Refuses a changed frozen section; returns whether the workdir has a recorded config (an earlier run)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return False
    new = json.loads(config.to_json())
    with open(path, encoding="utf-8") as f:
        old = json.load(f)
    if old.get("task", {}).get("data_dir"):  # recorded relative by older runs: compare the folders themselves
        old["task"]["data_dir"] = os.path.abspath(old["task"]["data_dir"])
    defaults = json.loads(config_lib.base_config().to_json())
    for section in _FROZEN_SECTIONS:
        # A field added since the run was made had its default then.
        if {**defaults.get(section, {}), **old.get(section, {})} != new.get(section):
            raise config_lib.ConfigError(
                f"{workdir} was trained with a different config.{section} ({old.get(section)} vs "
                f"{new.get(section)}); use a fresh --workdir, or delete the stages to retrain")
    return True


def _save_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> None:
    """Records the config once the run's setup succeeded (a setup error leaves the workdir free to fix it)."""
    shd.sync_processes("config checked")  # every process has read the old file before process 0 replaces it
    if shd.is_main_process():
        with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(json.loads(config.to_json()), f, indent=2)


def load_splits(task: Task, config) -> dict[str, list[Example]]:
    data_dir = config.task.data_dir or None
    return {split: task.load(split, data_dir) for split in ("train", "val", "test")}


def build_tokenizer(config, task: Task, train: list[Example], workdir: str, reuse: bool = True) -> Tokenizer:
    """The run's tokenizer: reloaded from the workdir if saved there (and `reuse`), else made by process 0 and
    saved there."""
    directory = os.path.join(workdir, "tokenizer")
    if not (reuse and os.path.isdir(directory)) and shd.is_main_process():
        if os.path.isdir(directory):
            shutil.rmtree(directory)
        _make_tokenizer(config, task, train).save(directory)
    shd.sync_processes("tokenizer saved")
    return load_tokenizer(directory)


def _make_tokenizer(config, task: Task, train: list[Example]) -> Tokenizer:
    kind = config.tokenizer.kind
    if kind == "byte":
        return ByteTokenizer()
    if kind == "hf":
        return HFTokenizer.from_pretrained(config.tokenizer.path)
    texts = []
    rng = random.Random(config.seed)
    for ex in train:
        hypothesis, feedback = task.perturb(ex, rng)
        texts += [ex.x, task.target(ex), feedback.text,
                  refine_input("", hypothesis, feedback.text, config.refiner.template)]
    texts.append(NO_HINT)
    return train_subword_tokenizer(texts, config.tokenizer.vocab_size,
                                   extra_special_tokens=tuple(getattr(task, "special_tokens", ())),
                                   split_punctuation=config.tokenizer.split_punctuation)


def model_setup(config, tokenizer: Tokenizer) -> tuple[T5Config | DecoderConfig, Any]:
    """(model config, pretrained params or None): a preset of `config.model.family` sized to the tokenizer, or an
    imported transformers checkpoint."""
    overrides = dict(dropout_rate=config.model.dropout_rate, dtype=config.model.dtype,
                     param_dtype=config.model.param_dtype, remat=config.model.remat)
    decoder = config.model.family == "decoder"
    if config.model.checkpoint:
        load = hf_decoder.load_decoder if decoder else hf.load_t5
        model_config, params = load(config.model.checkpoint, **overrides)
        if model_config.vocab_size < tokenizer.vocab_size:
            raise config_lib.ConfigError(
                f"config.model.checkpoint has {model_config.vocab_size} embeddings but the tokenizer has "
                f"{tokenizer.vocab_size} tokens; use the checkpoint's own tokenizer (tokenizer.kind='hf')")
        return model_config, params
    vocab_size = padded_vocab_size(tokenizer.vocab_size)
    if decoder:  # the tokenizer's pad and end ids; prompt and target share the positions
        return decoder_lib.preset(config.model.preset, vocab_size=vocab_size, pad_id=tokenizer.pad_id,
                                  eos_id=tokenizer.eos_id, bos_id=None, **overrides), None
    return preset(config.model.preset, vocab_size=vocab_size, **overrides), None


@dataclasses.dataclass
class Setup:
    """What every stage of a run shares, made once the whole config has been checked."""

    task: Task
    splits: dict[str, list[Example]]
    tokenizer: Tokenizer
    model_config: T5Config | DecoderConfig
    pretrained: Any  # imported checkpoint parameters, or None
    mesh: Any
    rules: Any
    log: MetricsLog
    common: dict  # the keyword arguments of `train_stage` that every stage passes


def setup(config: ml_collections.ConfigDict, workdir: str, stages: tuple[str, ...], known: tuple[str, ...],
          sections: tuple[str, ...]) -> Setup:
    """Checks the config, the requested `stages` (of `known`) and the workdir, then loads the data, the tokenizer
    and the model config and records the config. `sections` are the config's training stages (batch checks)."""
    config_lib.validate(config)
    if "://" in workdir:
        raise config_lib.ConfigError(f"--workdir {workdir} is a URL; use a filesystem path (mount a bucket with "
                                     "gcsfuse to keep runs in Cloud Storage)")
    unknown = set(stages) - set(known)
    if unknown:
        raise config_lib.ConfigError(f"unknown stages {sorted(unknown)}; choose from {known}")
    if config.task.data_dir:  # recorded absolute, so evaluation and the tools find the data from any directory
        config.task.data_dir = os.path.abspath(os.path.expanduser(config.task.data_dir))
    os.makedirs(workdir, exist_ok=True)
    recorded = _check_workdir_config(workdir, config)
    task = get_task(config.task.name, **dict(config.task.options))
    splits = load_splits(task, config)
    if shd.is_main_process():
        print(f"[data] {task.name}: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items()))
    # A tokenizer left by a setup that failed before its config was recorded may be stale: made again.
    tokenizer = build_tokenizer(config, task, splits["train"], workdir, reuse=recorded)
    model_config, pretrained = model_setup(config, tokenizer)
    mesh = shd.make_mesh(dict(config.mesh))
    rules = shd.normalize_rules(config.logical_axis_rules)
    config_lib.validate_for_mesh(config, shd.batch_divisor(mesh, rules), jax.process_count(), sections)
    for name in sections:
        if config[name].batch_size > len(splits["train"]):
            raise config_lib.ConfigError(
                f"config.{name}.batch_size: {config[name].batch_size} is more than the {len(splits['train'])} "
                "training examples; use a smaller batch or more data")
    _save_workdir_config(workdir, config)
    log = MetricsLog(workdir)
    common = dict(workdir=workdir, model_config=model_config, tokenizer=tokenizer, mesh=mesh, rules=rules,
                  seed=config.seed, checkpoint_every=config.checkpoint.every, keep=config.checkpoint.keep,
                  log=log, log_every=config.log_every, pack=config.model.pack)
    return Setup(task, splits, tokenizer, model_config, pretrained, mesh, rules, log, common)


def run(config: ml_collections.ConfigDict, workdir: str, stages: tuple[str, ...] = STAGES) -> dict:
    """Runs (or resumes) the requested stages; returns {stage: final metrics}."""
    _check_warmup_first(config, workdir, stages)
    job = _Job(config, workdir, stages, setup(config, workdir, stages, STAGES, ("critic", "warmup", "refiner")))
    # stage, what it trains, the parameters it starts from (a checkpoint's, or None: fresh)
    for name, spec, init in (("warmup", job.warmup_spec, job.pretrained),
                             ("critic", job.critic_spec, job.pretrained),
                             ("refiner", job.refiner_spec, job.warmed_up_params)):
        job.train(name, spec, init)
    if {"critic", "refiner", "eval"} & set(stages):
        job.calibrate_critic()
    job.evaluate()
    return job.finish()


def _check_warmup_first(config: ml_collections.ConfigDict, workdir: str, stages: tuple[str, ...]) -> None:
    """Refuses a stage that builds on the warmed-up generator when that is neither trained nor requested."""
    built_on_warmup = {
        "critic": "config.critic.generator_fraction > 0: the critic samples from the warmed-up generator",
        "refiner": "the refiner stage starts from the warmed-up generator"}
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
        self.train_set, self.val = s.splits["train"], s.splits["val"]
        self.results: dict[str, Any] = {}
        self.timings: dict[str, float] = {}

    def text_model(self, params, max_input: int, max_output: int) -> TextModel:
        # Prompts padded to the full budget: one compiled sampler per (batch, budget) for the whole run.
        return TextModel(self.s.model_config, params, self.s.tokenizer, max_input, max_output, bucket=max_input,
                         batch_size=self.config.eval.batch_size, mesh=self.s.mesh)

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
                         lengths.refine_input if fraction > 0 else lengths.input, lengths.target)

    def critic_spec(self) -> StageSpec:
        config, lengths, task, s = self.config, self.lengths, self.task, self.s
        critic_val = self.val[:config.critic.eval_examples]
        if config.critic.mode == "solve":
            problems = self.train_set + self.fresh_problems()[1]
            return StageSpec(
                "critic", config.critic, len(problems), stage_data.warmup_pairs(problems, task, seed=config.seed),
                lambda p: stage_data.critic_validation(
                    task, SolverCritic(self.text_model(p, lengths.input, lengths.target), task), critic_val,
                    config.seed),
                "paired_auroc", lengths.input, lengths.target)
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
            "paired_auroc", lengths.critic_input, lengths.feedback)

    def refiner_spec(self) -> StageSpec:
        config, lengths = self.config, self.lengths
        sampler_model = self.text_model(None, lengths.refine_input, lengths.target)
        return StageSpec("refiner", config.refiner, len(self.train_set),
                         stage_data.refiner_pairs(self.task, self.train_set, sampler_model, config.refiner,
                                                   config.seed),
                         self.generator_eval(self.val[:config.refiner.eval_examples]), self.task.primary_metric,
                         lengths.refine_input, lengths.target)

    def fresh_problems(self) -> tuple[list[Example], list[Example]]:
        """(calibration, critic training) problems from the task's generator, no split's: the first
        `critic.calibration_examples`, then `critic.fresh_problems`; ([], []) for a task that reads a dataset."""
        fresh = getattr(self.task, "fresh_problems", None)
        count = self.config.critic.calibration_examples
        problems = fresh(count + self.config.critic.fresh_problems, self.config.task.data_dir or None) if fresh else []
        return problems[:count], problems[count:]

    def calibration_problems(self) -> list[Example]:
        """Problems no stage trained on or chose a checkpoint by: fresh ones, else the validation problems past
        those the stages validate on (a generator chosen on a problem looks better there than it is), else all of
        validation."""
        held_out = self.fresh_problems()[0]
        if held_out:
            return held_out
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
        critic = load_critic(RunInfo(workdir, json.loads(config.to_json())), task, config.eval.batch_size,
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
            with open(path, "w", encoding="utf-8") as f:
                json.dump(calibration, f, indent=2)
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
        evaluation = refiner_eval.evaluate_run(workdir, json.loads(self.config.to_json()),
                                             max_examples=self.config.eval.examples, out_dir=workdir, mesh=self.s.mesh)
        self.timings["eval"] = time.time() - start
        self.results["eval"] = {"rows": evaluation["rows"], "seconds": self.timings["eval"]}
        if shd.is_main_process():
            os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
            with open(os.path.join(workdir, "eval", "DONE"), "w", encoding="utf-8") as f:
                json.dump(self.results["eval"], f, indent=2, default=float)
            results_lib.print_results(os.path.join(workdir, "results.json"))

    def finish(self) -> dict:
        self.s.log.close()
        if shd.is_main_process():
            with open(os.path.join(self.workdir, "timings.json"), "a", encoding="utf-8") as f:
                f.write(json.dumps(self.timings) + "\n")
            print("[timings] " + ", ".join(f"{k} {v:.0f}s" for k, v in self.timings.items()))
        return self.results
