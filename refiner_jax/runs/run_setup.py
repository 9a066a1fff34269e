"""What both pipelines share before their first stage: the checked config and workdir, the data splits, the
tokenizer, the model config (a preset or an imported checkpoint), the mesh and the keyword arguments of
`training.loop.train_stage`.

The workdir keeps `config.json`: a rerun refuses a changed `task`, `tokenizer` or `model` section, which would make
the trained stages meaningless; other changes, such as more steps, apply to the stages still to run. A run holds the
workdir's lock (`run_lock`) from its setup until `Setup.close`, so a second run on the same workdir is refused.
`check` does all that writes nothing (config, stages, data, mesh) first, so that a user error stops a run before its
workdir exists; `launch/train.py --dry_run` runs it alone and prints `stage_plan`.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import random
import shutil
from typing import Any

import jax
import ml_collections

from refiner_jax import atomic_files
from refiner_jax import sharding as shd
from refiner_jax.models import lora as lora_lib
from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.language_model import load_checkpoint, preset_config
from refiner_jax.models.t5_config import T5Config
from refiner_jax.runs import run_config as config_lib
from refiner_jax.runs import run_lock
from refiner_jax.tasks import data_sources, get_task
from refiner_jax.tasks.base import NO_HINT, Example, Task, refine_input
from refiner_jax.tokenizers import (ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer, padded_vocab_size,
                                    train_subword_tokenizer)
from refiner_jax.training.loop import MetricsLog

# Config sections whose change would make already-trained stages meaningless.
_FROZEN_SECTIONS = ("task", "tokenizer", "model")


def _check_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> bool:
    """Refuses a changed frozen section; returns whether the workdir has a recorded config (an earlier run)."""
    if not os.path.exists(os.path.join(workdir, config_lib.CONFIG_FILE)):
        return False
    new = json.loads(config.to_json())
    old = json.loads(config_lib.load(workdir).to_json())  # a field added since the run was made had its default
    if old["critic"].get("fresh_problems"):
        raise config_lib.ConfigError(
            f"{workdir} was trained with config.critic.fresh_problems={old['critic']['fresh_problems']}: generated "
            "problems for the critic alone, which task.extra_problems (every model alike) replaced; it can still be "
            "evaluated (launch/evaluate.py), but train in a fresh --workdir")
    # recorded relative by older runs: compare the folders themselves
    old["task"]["data_dir"] = data_sources.recorded(old["task"]["data_dir"])
    for section in _FROZEN_SECTIONS:
        if old.get(section) != new.get(section):
            raise config_lib.ConfigError(
                f"{workdir} was trained with a different config.{section} ({old.get(section)} vs "
                f"{new.get(section)}); use a fresh --workdir, or delete the stages to retrain")
    return True


def _save_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> None:
    """Records the config once the run's setup succeeded (a setup error leaves the workdir free to fix it)."""
    shd.sync_processes("config checked")  # every process has read the old file before process 0 replaces it
    if shd.is_main_process():
        atomic_files.write_json(os.path.join(workdir, config_lib.CONFIG_FILE), json.loads(config.to_json()),
                                indent=2)


def load_splits(task: Task, config) -> dict[str, list[Example]]:
    data_dir = config.task.data_dir or None
    return {split: task.load(split, data_dir) for split in ("train", "val", "test")}


def generated_problems(task: Task, count: int, extra: int, data_dir: str | None) -> tuple[list[Example], list[Example]]:
    """(`count` held-out, `extra` training) problems of the task's generator, which no split holds, in that order
    (the same problems for the same arguments); ([], []) for a task that reads a dataset when `extra` is 0. Extra
    problems asked of a task with no generator (`task.extra_problems`) are a config error."""
    problems = task.fresh_problems(count + extra, data_dir) if count + extra else []
    if extra and len(problems) < count + extra:
        raise config_lib.ConfigError(
            f"config.task.extra_problems: {extra} generated problems asked for, but task {task.name!r} "
            f"{'with task.data_dir ' if data_dir else ''}has no problem generator; set it to 0")
    return problems[:count], problems[count:]


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
                                   extra_special_tokens=tuple(task.special_tokens),
                                   split_punctuation=config.tokenizer.split_punctuation)


def model_setup(config, tokenizer: Tokenizer) -> tuple[T5Config | DecoderConfig, Any]:
    """(model config, pretrained params or None): a preset of `config.model.family` sized to the tokenizer, or an
    imported transformers checkpoint."""
    overrides = dict(dropout_rate=config.model.dropout_rate, dtype=config.model.dtype,
                     param_dtype=config.model.param_dtype, remat=config.model.remat)
    if config.model.get("share_prompt_cache", False):
        overrides["share_prompt_cache"] = True
    if config.model.checkpoint:
        model_config, params = load_checkpoint(config.model.family, config.model.checkpoint, **overrides)
        if model_config.vocab_size < tokenizer.vocab_size:
            raise config_lib.ConfigError(
                f"config.model.checkpoint has {model_config.vocab_size} embeddings but the tokenizer has "
                f"{tokenizer.vocab_size} tokens; use the checkpoint's own tokenizer (tokenizer.kind='hf')")
        return model_config, params
    vocab_size = padded_vocab_size(tokenizer.vocab_size)
    return preset_config(config.model.family, config.model.preset, vocab_size, tokenizer.pad_id, tokenizer.eos_id,
                         **overrides), None


@dataclasses.dataclass
class Setup:
    """What every stage of a run shares, made once the whole config has been checked."""

    task: Task
    splits: dict[str, list[Example]]
    held_out: list[Example]  # generated problems no stage trains or selects on (`generated_problems`)
    extra: list[Example]  # generated problems every model of the run trains on besides splits["train"]
    tokenizer: Tokenizer
    model_config: T5Config | DecoderConfig
    pretrained: Any  # imported checkpoint parameters, or None
    mesh: Any
    rules: Any
    log: MetricsLog
    common: dict  # the keyword arguments of `train_stage` that every stage passes
    lock: run_lock.WorkdirLock | None  # held by process 0

    def close(self) -> None:
        """Closes the metrics log and releases the workdir."""
        self.log.close()
        if self.lock is not None:
            self.lock.release()


@dataclasses.dataclass
class Checked:
    """What a run is checked against before anything is written: the task, its data, the mesh."""

    task: Task
    splits: dict[str, list[Example]]
    held_out: list[Example]
    extra: list[Example]
    mesh: Any
    rules: Any
    recorded: bool  # the workdir holds the config of an earlier run (same frozen sections)


def check(config: ml_collections.ConfigDict, workdir: str, stages: tuple[str, ...], known: tuple[str, ...],
          sections: tuple[str, ...], held_out: int = 0) -> Checked:
    """Checks the config, the requested `stages` (of `known`), an earlier run's config in the workdir, the data
    (loaded, with `held_out` and `task.extra_problems` generated problems), the batch sizes against the data and the
    mesh; writes nothing (a user error raises `ConfigError` or `DataError` before the workdir exists). `sections`
    are the config's training stages (batch checks)."""
    config_lib.validate(config)
    if "://" in workdir:
        raise config_lib.ConfigError(f"--workdir {workdir} is a URL; use a filesystem path (mount a bucket with "
                                     "gcsfuse to keep runs in Cloud Storage)")
    unknown = sorted(set(stages) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        raise config_lib.ConfigError(f"--stages: unknown stage {unknown[0]!r}"
                                     f"{f' (did you mean {close[0]!r}?)' if close else ''}; choose from {known}")
    # local paths recorded absolute, so evaluation and the tools find the data from any directory
    config.task.data_dir = data_sources.recorded(config.task.data_dir)
    recorded = _check_workdir_config(workdir, config)
    task = get_task(config.task.name, **dict(config.task.options))
    splits = load_splits(task, config)
    held, extra = generated_problems(task, held_out, config.task.extra_problems, config.task.data_dir or None)
    if shd.is_main_process():
        print(f"[data] {task.name}: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items()))
    for name in sections:
        if config[name].batch_size > len(splits["train"]):
            raise config_lib.ConfigError(
                f"config.{name}.batch_size: {config[name].batch_size} is more than the {len(splits['train'])} "
                "training examples; use a smaller batch or more data")
    mesh = shd.make_mesh(dict(config.mesh))
    rules = shd.normalize_rules(config.logical_axis_rules)
    config_lib.validate_for_mesh(config, shd.batch_divisor(mesh, rules), jax.process_count(), sections)
    return Checked(task, splits, held, extra, mesh, rules, recorded)


def setup(config: ml_collections.ConfigDict, workdir: str, stages: tuple[str, ...], known: tuple[str, ...],
          sections: tuple[str, ...], held_out: int = 0) -> Setup:
    """`check`, then creates and locks the workdir, makes the tokenizer and the model config and records the config.
    The folders this call created are removed again when the setup fails."""
    checked = check(config, workdir, stages, known, sections, held_out)
    created = _outermost_missing(workdir)
    os.makedirs(workdir, exist_ok=True)
    lock, refusal = None, None
    if shd.is_main_process():
        try:
            lock = run_lock.acquire(workdir)
        except run_lock.WorkdirLockedError as e:
            refusal = e
    if not shd.all_processes_ok(refusal is None):  # every process stops when process 0 is refused
        raise refusal or run_lock.WorkdirLockedError(
            f"{workdir}: process 0 could not lock this workdir; its message names the run that holds it")
    try:
        return _prepare(config, workdir, checked, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        if created is not None and shd.is_main_process():
            shutil.rmtree(created, ignore_errors=True)
        raise


def _outermost_missing(path: str) -> str | None:
    """The outermost folder of `path` that does not exist yet (what `os.makedirs(path)` creates), None if none."""
    path, missing = os.path.abspath(path), None
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing


def _prepare(config: ml_collections.ConfigDict, workdir: str, checked: Checked,
             lock: run_lock.WorkdirLock | None) -> Setup:
    task, splits = checked.task, checked.splits
    # A tokenizer left by a setup that failed before its config was recorded may be stale: made again.
    tokenizer = build_tokenizer(config, task, splits["train"], workdir, reuse=checked.recorded)
    model_config, pretrained = model_setup(config, tokenizer)
    lora = config_lib.lora_config(config)
    if lora is not None:
        try:
            lora_lib.bind(model_config, lora)
        except ValueError as e:
            raise config_lib.ConfigError(f"config.model.lora.target_modules: {e}") from e
    _save_workdir_config(workdir, config)
    log = MetricsLog(workdir)
    common = dict(workdir=workdir, model_config=model_config, tokenizer=tokenizer, mesh=checked.mesh,
                  rules=checked.rules, seed=config.seed, checkpoint_every=config.checkpoint.every,
                  keep=config.checkpoint.keep, log=log, log_every=config.log_every, pack=config.model.pack,
                  max_nonfinite_skips=config.max_nonfinite_skips, lora=lora)
    return Setup(task, splits, checked.held_out, checked.extra, tokenizer, model_config, pretrained, checked.mesh,
                 checked.rules, log, common, lock)


# ----------------------------------------------------------------------------------------------- the plan (--dry_run)

# Stage -> (the config sections whose `steps` it trains, the policies it trains: one per reward and round). A stage
# named after a config section with `steps` trains that section once; any other stage trains nothing (evaluation).
_STAGE_STEPS = {"sft": (("warmup",), None), "orm": (("reward",), None), "prm": (("reward",), None),
                "matched": (("warmup", "critic", "refiner"), None),
                "refiner_random": (("refiner",), None), "sft_continued": (("refiner",), None),
                "rl": (("rl",), "rl.rewards"), "grpo": (("rl",), "grpo.rewards")}
_CONTROLS = ("refiner_random", "sft_continued")  # trained only with config.refiner.controls


def _field(config: ml_collections.ConfigDict, dotted: str) -> Any:
    node = config
    for key in dotted.split("."):
        node = node[key]
    return node


def stage_plan(config: ml_collections.ConfigDict, workdir: str, stages: tuple[str, ...],
               prefix: str = "config.") -> list[str]:
    """One line per stage: the updates it would train (from which config fields, named under `prefix`), or
    evaluation, or that the workdir already holds it finished (a rerun skips it)."""
    from refiner_jax.training.loop import stage_done

    lines = []
    for stage in stages:
        sections, per = _STAGE_STEPS.get(
            stage, ((stage,), None) if stage in config and "steps" in config[stage] else ((), None))
        if sections:
            steps = sum(int(config[s].steps) for s in sections)
            what = f"{steps} updates ({' + '.join(f'{prefix}{s}.steps' for s in sections)})"
            if per is not None:
                policies = len(_field(config, per)) * int(config.rl.rounds)
                what = f"{policies} x {what} (a policy per reward of {prefix}{per}, per round of {prefix}rl.rounds)"
            if any(config[s].get("patience", 0) for s in sections):
                what = f"at most {what}, stopping once validation stops improving (patience)"
        else:
            what = "evaluation (no training)"
        if stage in _CONTROLS and not config.refiner.get("controls", False):
            what = f"not trained ({prefix}refiner.controls is off)"
        if stage_done(workdir, stage) is not None:
            what += f"; already finished in {workdir}: skipped"
        lines.append(f"  {stage:<15} {what}")
    return lines


def training_sections(config: ml_collections.ConfigDict, stages: tuple[str, ...]) -> tuple[str, ...]:
    """The config sections that `stages` train (the batch checks of `check`)."""
    out = []
    for stage in stages:
        sections = _STAGE_STEPS.get(stage, ((stage,), None))[0]
        out += [s for s in sections if s in config and "steps" in config[s] and s not in out]
    return tuple(out)
