"""The one config tree of a run (REFINER or reward), its defaults, its validation and its later loads.

`configs/*.py` start from `base_config()` and change what their experiment needs; `validate` checks the whole
tree before anything is built or compiled and names the field and the fix when something is wrong. A run saves
its config as `<workdir>/config.json`; `load` reads it back with `base_config()`'s defaults for missing fields.
"""
from __future__ import annotations

import difflib
import json
import os
import string
from typing import Mapping

import ml_collections

from refiner_jax import sharding as shd
from refiner_jax.models.language_model import FAMILIES, PRESETS
from refiner_jax.models.lora import LoraConfig
from refiner_jax.models.t5_config import HUB_NAMES
from refiner_jax.models.reward_model import HEADS
from refiner_jax.refiner.critics import CRITIC_MODES
from refiner_jax.reward.rerank import REDUCTIONS
from refiner_jax.tasks.prm800k import NEUTRAL_MODES
from refiner_jax.tasks.base import DEFAULT_REFINE_TEMPLATE
from refiner_jax.runs.run_info import RunInfo
from refiner_jax.training.optim import NO_DECAY, make_schedule


_DTYPES = ("float32", "bfloat16", "float16")
CONFIG_FILE = "config.json"  # in the workdir: the config the run was trained with


class ConfigError(ValueError):
    """A config value (or a launcher's flag) that cannot work; the message names the field and what to set
    instead."""


def suggestion(name: str, choices) -> str:
    """' (did you mean X?)' for the closest of `choices` to a misspelt `name`, else ''."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _optimizer(learning_rate: float) -> dict:
    """AdamW with linear warm-up and decay (`total_steps` is filled in from the stage's `steps`); see
    `training.optim` for every field."""
    return {"name": "adamw", "learning_rate": learning_rate, "schedule": "warmup_linear", "warmup_steps": 50,
            "weight_decay": 0.0, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "grad_clip_norm": 1.0}


PIPELINES = ("refiner", "reward")
RL_REWARDS = ("final", "orm", "prm", "final_prm")


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # "refiner": warm-up, critic, REFINER loop, evaluation (`runs.refiner_run`); "reward": SFT, outcome and process
    # reward models, expert iteration, K-sample selection (`runs.reward_run`).
    c.pipeline = "refiner"

    # `data_dir`: the task's data source (`tasks.data_sources`): a folder (the task's own files, or data files named by
    # split), `train=PATH,test=PATH`, or a hub name such as `openai/gsm8k:main`; "" for the task's default.
    # `extra_problems`: that many problems of the task's generator (disjoint from every split) join the training
    # problems of every model of the run alike; 0, as in both papers, trains every model on the training split only.
    c.task = ml_collections.ConfigDict({"name": "mwp", "data_dir": "", "options": {}, "extra_problems": 0})
    # subword: trained on the run's own training texts (saved in the workdir), with punctuation split from words
    # and numbers when `split_punctuation`; byte: no files; hf: `path` names a transformers tokenizer directory (or
    # hub name when online).
    c.tokenizer = ml_collections.ConfigDict({"kind": "subword", "vocab_size": 1024, "path": "",
                                             "split_punctuation": False})
    # `preset` names the architecture; `checkpoint` (a transformers T5 directory or hub name) imports weights.
    # `param_dtype` "checkpoint" keeps the imported checkpoint's own dtype (bfloat16 stays bfloat16).
    # `family` "decoder" makes every model of the run a decoder-only LM (`models.decoder`: presets gpt2-tiny,
    # llama-tiny, qwen3-tiny, gemma3-tiny, gpt2, qwen2.5-0.5b, qwen3-0.6b, qwen3-1.7b, gemma3-1b; a checkpoint is a
    # transformers GPT-2 / Llama / Qwen2 / Mistral / Qwen3 / Gemma 3 text directory).
    # `pack`: a decoder-only LM trains on rows packed with several (prompt, target) pairs, each attending only to
    # itself, instead of one padded pair per row (same loss, about half the compute on the MWP tasks; T5 pads).
    # `share_prompt_cache` (decoder only): a prompt's samples read one copy of its keys and values
    # (`DecoderConfig.share_prompt_cache`); faster sampling, the same distribution, other float sums.
    c.model = ml_collections.ConfigDict({"family": "t5", "preset": "t5-tiny", "checkpoint": "", "dropout_rate": 0.1,
                                         "dtype": "float32", "param_dtype": "float32", "remat": False,
                                         "pack": True, "share_prompt_cache": False})
    # `lora`: with `rank` > 0 every model of the run (generator, critic, reward models) trains LoRA adapters on its
    # frozen language model instead of all its parameters (`models.lora`; a reward model's head still trains in
    # full). The update is scaled by `alpha` / `rank`; `target_modules` names the adapted modules as PEFT does:
    # "all-linear", or comma-separated transformers names ("q_proj,v_proj"; T5: "q,v"; GPT-2: "c_attn"). Each stage
    # exports the merged model and, in `<stage>/adapter`, the adapters as PEFT's files.
    c.model.lora = ml_collections.ConfigDict({"rank": 0, "alpha": 16.0, "target_modules": "all-linear"})
    # Token budgets: texts are truncated to them and batches padded to them (fixed shapes compile once). The
    # oracle's feedback on a generator's hypothesis can name several errors: up to 29 tokens on the synthetic MWP.
    c.lengths = ml_collections.ConfigDict({"input": 56, "target": 24, "refine_input": 96, "critic_input": 80,
                                           "feedback": 32})
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
    # Logical axis -> mesh axes, first match wins (see `refiner_jax.sharding`); e.g. replace ("embed", "fsdp") by
    # ("embed", None) to replicate the parameters while still splitting batches over fsdp.
    c.logical_axis_rules = shd.DEFAULT_RULES

    # Training to convergence. Every training section (warmup, critic, refiner, reward, rl) validates every
    # `eval_every` updates on its validation problems and exports its best checkpoint (of tied ones, the later).
    # `patience` 0 trains exactly `steps` updates (fixed compute, as the compute-matched rows need); `patience` P > 0
    # stops the stage after P evaluations in a row without a better validation metric, `steps` being only the cap
    # (pair it with the optimizer schedule "warmup_constant", whose rate does not fall to 0 at the cap;
    # `use_convergence` sets both). Each trained stage's validation curve and where it stopped go to results.json's
    # "convergence" block and `convergence.png`.
    # Stage 1: generator warm-up, x -> z on a fraction of train (the paper: 10%; 1.0 = all of it). With
    # `feedback_fraction` > 0 that share of each batch is a revision instance built from a perturbation and its
    # oracle feedback, (template(x, z', f) -> z), like the reference code's feedback-augmented warm start; the
    # warm-up then pads inputs to `lengths.refine_input`.
    c.warmup = ml_collections.ConfigDict({
        "fraction": 1.0, "steps": 500, "batch_size": 32, "microbatches": 1, "optimizer": _optimizer(2e-3),
        "eval_every": 250, "eval_examples": 300, "feedback_fraction": 0.5, "patience": 0})
    # Stage 2: the critic. mode "feedback" (the paper): (x + hypothesis) -> feedback, on gold and perturbed
    # hypotheses, and with `generator_fraction` > 0 that share of each batch on the warmed-up generator's own samples
    # (nucleus `generator_top_p`) with the oracle's feedback; `balanced` gives each problem of a batch a right and a
    # wrong hypothesis (`refiner.stage_data.critic_pairs`). mode "solve": x -> z* on the run's training problems
    # (the training split and `task.extra_problems`); at inference it solves (its greedy answer, or with
    # `samples` > 0 the answer most of its greedy answer and that many samples reach), then compares
    # (`critics.SolverCritic`). Either way its "No hint" threshold is then calibrated on `calibration_examples`
    # problems that no stage trains or selects checkpoints on, with the latest generator
    # (`<workdir>/critic/calibration.json`, `evaluation.calibrate_for_refinement`).
    c.critic = ml_collections.ConfigDict({
        "mode": "feedback", "steps": 500, "batch_size": 32, "microbatches": 1, "optimizer": _optimizer(2e-3),
        "eval_every": 250, "eval_examples": 300, "patience": 0, "generator_fraction": 0.5, "generator_top_p": 1.0,
        "balanced": False, "samples": 0, "calibration_examples": 2000})
    # Stage 3: the REFINER loop (generator initialised from the warm-up): where the generator learns to act on the
    # feedback instead of repeating its hypothesis (docs/results/refiner.md has the step counts tried). `controls` also
    # trains, from the same warm-up checkpoint and with this section's steps, patience and optimizer, the loop with
    # random feedback (stage `refiner_random`) and the warm-up's supervised recipe continued (`sft_continued`), each
    # then evaluated alone and with both critics (`refiner.baselines`).
    c.refiner = ml_collections.ConfigDict({
        "turns": 3, "samples": 3, "top_p": 0.5, "temperature": 1.0, "selection": "random",
        "template": DEFAULT_REFINE_TEMPLATE, "feedback_noise": 0.0, "steps": 450, "batch_size": 16,
        "microbatches": 1, "optimizer": _optimizer(1e-3), "eval_every": 150, "eval_examples": 300, "patience": 0,
        "controls": False})
    # The matched generator (stage "matched", a baseline): trained from scratch like the warm-up (its batch size,
    # optimizer and feedback_fraction) on all the run's training problems, for warmup + critic + refiner steps: the
    # problems and updates that generator and critic used together, spent on one generator.
    # Stage 4: evaluation of generator alone / + critic / + oracle, the baselines (`refiner.baselines`: the critic's
    # own answer, the matched generator, the generator's best of turns + 1 samples by its log-probability, at the
    # REFINER stage's temperature and nucleus) and the noisy-critic study. `factorial` adds the inference factorial
    # (`refiner.inference_factorial`: who decides to revise x what text the generator reads, on the REFINER and the
    # matched generator; 16 more refinement loops).
    c.eval = ml_collections.ConfigDict({
        "examples": 1000, "turns": 3, "batch_size": 128, "noise_levels": (0.0, 0.25, 0.5, 0.75, 1.0),
        "bootstrap_samples": 1000, "factorial": False})
    # The reward-model pipeline (`pipeline = "reward"`, `runs.reward_run`): the warm-up section trains the SFT policy,
    # then `reward` its outcome and process reward models on `samples` policy samples (temperature `temperature`,
    # nucleus `top_p`) of each of the first `train_problems` training problems (and of the `task.extra_problems`,
    # which the policy trained on too), validated and early-stopped on `val_problems`, labelled by the task, or for the PRM by a PRM800K-style `labels_file` (0 ratings counted as
    # `neutral`); with `mixed_only`, only on the problems whose samples are not all right or all wrong (no label can
    # then be guessed from the problem's difficulty); with `lm_weight` > 0 it also keeps learning x -> z* on each
    # problem's gold solution (that weight per token; Cobbe et al.'s joint objective); with `pairwise_weight` > 0 it
    # also ranks each problem's right samples above its wrong ones (batches of whole problems). `head` "token" reads
    # the LM's logits of the two `label_tokens` (correct, wrong) at each step end, "scalar" a linear head; with
    # `likelihood` the step score adds a learned multiple of the LM's log-likelihood of the solution so far, so that
    # the reward model starts from its policy's log-probability (`models.reward_model`). Evaluation draws
    # `test_samples` per test problem (`eval.examples` of them) and picks one by each rule of `rerank` (the policy's
    # log-probability and, with `critic_workdir` naming a REFINER run of the same task, its trained critic's
    # confidence also rerank); the PRM's solution score is its `prm_reduction` over steps. `labels` "rollouts" also
    # trains a second PRM (stage `prm_rollouts`) on Math-Shepherd labels of the same samples, made by
    # `rollout_completions` policy continuations from each step (`reward.rollout_labels`), and evaluates it beside the
    # checker-labelled one.
    c.reward = ml_collections.ConfigDict({
        "samples": 8, "train_problems": 2000, "val_problems": 200, "temperature": 0.7, "top_p": 1.0,
        "head": "token", "label_tokens": ("+", "-"), "max_steps": 8, "labels_file": "", "neutral": "positive",
        "steps": 600, "batch_size": 64, "microbatches": 1, "optimizer": _optimizer(1e-3), "eval_every": 200,
        "patience": 2, "mixed_only": True, "lm_weight": 0.0, "likelihood": False,
        "pairwise_weight": 0.0, "test_samples": 16,
        "prm_reduction": "min", "abstention": 0.3, "sample_rows": 1024, "critic_workdir": "", "labels": "checker",
        "rollout_completions": 4})
    # Expert iteration (reward pipeline): for each reward of `rewards` ("final": the answer is right, "orm" / "prm":
    # that reward model's score >= `threshold`, "final_prm": both the answer and the PRM's), `rounds` times: sample `samples` solutions of each of the first
    # `problems` training problems (and of the `task.extra_problems`) from the current policy, keep the rewarded ones
    # (once each), fine-tune on them.
    c.rl = ml_collections.ConfigDict({
        "rewards": ("final", "orm", "prm"), "rounds": 1, "samples": 4, "problems": 2000, "threshold": 0.5,
        "steps": 200, "batch_size": 32, "microbatches": 1, "optimizer": _optimizer(5e-4), "eval_every": 100,
        "patience": 0,
        "eval_examples": 300})
    # GRPO (reward pipeline, stage "grpo", `runs.grpo_stage`): one policy per reward of `rewards` (as `rl.rewards`;
    # "prm" credits each step's tokens with its process reward, `reward.grpo`), from the SFT policy, which is also
    # the KL reference. Each of `rl.rounds` rounds spends expert iteration's budget: `rl.samples` samples of each of
    # its problems and `rl.steps` gradient steps, as rl.steps / `updates` sample batches, each followed by `updates`
    # gradient steps on all of its samples. Loss: PPO's clipped ratio (`eps_clip`) plus `kl_beta` times the k3 KL
    # estimate to the reference; advantages (r - mean) / (std + `adv_eps`) within each problem's samples.
    c.grpo = ml_collections.ConfigDict({
        "rewards": (), "updates": 2, "eps_clip": 0.2, "kl_beta": 0.04, "adv_eps": 1e-4, "microbatches": 1,
        "optimizer": _optimizer(2e-4)})
    c.grpo.optimizer.warmup_steps = 10
    c.checkpoint = ml_collections.ConfigDict({"every": 200, "keep": 2})
    c.log_every = 50
    # A batch whose loss or gradient is NaN or inf is skipped (no update); this many skips in a row stop the stage
    # with an error naming its last checkpoint. Read at logging, evaluation and checkpoint steps.
    c.max_nonfinite_skips = 10
    return c


def use_convergence(c: ml_collections.ConfigDict, caps: Mapping[str, int], patience: int = 3,
                    eval_examples: int | None = None) -> None:
    """Trains each section of `caps` ({section: steps cap}) to its validation plateau: `patience` evaluations
    without a better metric stop it, the learning rate warms up then stays constant ("warmup_constant"), and with
    `eval_examples` it validates on that many problems (the whole validation split, to see small gains)."""
    for name, cap in caps.items():
        stage = c[name]
        stage.steps, stage.patience = cap, patience
        stage.optimizer.schedule = "warmup_constant"
        if eval_examples is not None:
            stage.eval_examples = eval_examples


def use_paper_settings(c: ml_collections.ConfigDict, preset: str) -> None:
    """The published setup: a UnifiedQA/T5 checkpoint for generator and critic, Adam 1e-4, linear decay, no warm-up,
    grad clip 1.0, batch 32 as 4 accumulated microbatches of 8, T=3 turns, k=3 nucleus samples p=0.5, 10% warm-up
    data."""
    c.model.preset = preset
    c.model.checkpoint = preset
    c.tokenizer.kind = "hf"
    c.tokenizer.path = HUB_NAMES.get(preset, preset)
    c.lengths.input = 256
    c.lengths.refine_input = 384
    c.lengths.critic_input = 320
    c.lengths.target = 64
    c.lengths.feedback = 64
    for stage in (c.critic, c.warmup, c.refiner):
        stage.optimizer = _optimizer(1e-4)
        stage.optimizer.schedule = "linear"
        stage.optimizer.warmup_steps = 0
        stage.batch_size = 32
        stage.microbatches = 4
    c.critic.steps = c.warmup.steps = c.refiner.steps = 20000
    c.warmup.fraction = 0.1
    c.critic.mode = "feedback"
    c.critic.generator_fraction = 0.0  # the paper's critic learns from perturbations only
    c.model.dtype = "bfloat16"


def validate(c: ml_collections.ConfigDict) -> None:
    """Raises `ConfigError` naming the first bad field; call before building models or compiling anything."""

    def need(ok: bool, field: str, message: str) -> None:
        if not ok:
            raise ConfigError(f"config.{field}: {message}")

    from refiner_jax.tasks import _REGISTRY  # the task names

    need(c.get("pipeline", "refiner") in PIPELINES, "pipeline",
         f"{c.get('pipeline')!r} is not a pipeline{suggestion(c.get('pipeline'), PIPELINES)}; use one of "
         f"{PIPELINES}")
    need(c.task.name in _REGISTRY, "task.name",
         f"unknown task {c.task.name!r}{suggestion(c.task.name, _REGISTRY)}; use one of {sorted(_REGISTRY)}")
    need(c.tokenizer.kind in ("subword", "byte", "hf"), "tokenizer.kind",
         f"{c.tokenizer.kind!r} is not a tokenizer kind{suggestion(c.tokenizer.kind, ('subword', 'byte', 'hf'))}; "
         "use subword, byte or hf")
    need(c.tokenizer.kind != "hf" or bool(c.tokenizer.path), "tokenizer.path",
         "an hf tokenizer needs a directory or hub name in tokenizer.path")
    need(c.tokenizer.kind != "subword" or c.tokenizer.vocab_size >= 300, "tokenizer.vocab_size",
         f"{c.tokenizer.vocab_size} is too small for a subword vocabulary (bytes alone need 259); use >= 300")
    need(c.task.extra_problems >= 0, "task.extra_problems", "must be >= 0 (generated problems added to training)")
    family = c.model.get("family", "t5")
    need(family in FAMILIES, "model.family",
         f"{family!r} is not a model family{suggestion(family, FAMILIES)}; use one of {FAMILIES}")
    presets = PRESETS[family]
    owner = [f for f in FAMILIES if c.model.preset in PRESETS[f]]
    need(c.model.preset in presets, "model.preset",
         f"unknown preset {c.model.preset!r} for family {family!r}"
         + (f" (it is a preset of family {owner[0]!r}: set model.family={owner[0]!r} too)" if owner
            else f"{suggestion(c.model.preset, presets)}; use one of {sorted(presets)}"))
    need(0.0 <= c.model.dropout_rate < 1.0, "model.dropout_rate", "must be in [0, 1)")
    need(family == "decoder" or not c.model.get("share_prompt_cache", False), "model.share_prompt_cache",
         "applies to decoder-only models (model.family='decoder'); set it False for T5")
    need(c.model.dtype in _DTYPES, "model.dtype", f"{c.model.dtype!r} is not a dtype; use one of {_DTYPES}")
    need(int(c.model.lora.rank) >= 0, "model.lora.rank", "must be >= 0 (0: no adapters, every parameter trains)")
    need(c.model.lora.alpha > 0, "model.lora.alpha", "must be positive (the update is scaled by alpha / rank)")
    need(bool(_target_modules(c)), "model.lora.target_modules",
         "names no module; use 'all-linear' or comma-separated module names such as 'q_proj,v_proj'")
    if c.model.param_dtype == "checkpoint":
        need(bool(c.model.checkpoint), "model.param_dtype",
             "'checkpoint' keeps an imported checkpoint's dtype, but model.checkpoint is empty; name one or use "
             f"one of {_DTYPES}")
    else:
        need(c.model.param_dtype in _DTYPES, "model.param_dtype",
             f"{c.model.param_dtype!r} is not a dtype; use one of {_DTYPES}, or 'checkpoint' with model.checkpoint")
    for name in ("input", "target", "refine_input", "critic_input", "feedback"):
        need(int(c.lengths[name]) > 0, f"lengths.{name}", "must be a positive number of tokens")
    for stage_name in ("critic", "warmup", "refiner", "reward", "rl"):
        stage = c[stage_name]
        need(stage.steps >= 0, f"{stage_name}.steps", "must be >= 0")
        need(stage.batch_size > 0, f"{stage_name}.batch_size", "must be positive")
        need(stage.eval_every > 0, f"{stage_name}.eval_every", "must be positive")
        need(stage.get("eval_examples", 1) >= 1, f"{stage_name}.eval_examples", "must be >= 1 (validation problems)")
        opt = stage.optimizer
        need(opt.name in ("adamw", "adafactor"), f"{stage_name}.optimizer.name",
             f"{opt.name!r} is not supported; use adamw or adafactor")
        need(opt.learning_rate > 0, f"{stage_name}.optimizer.learning_rate", "must be positive")
        need(opt.get("grad_clip_norm") is None or opt.grad_clip_norm >= 0, f"{stage_name}.optimizer.grad_clip_norm",
             "must be >= 0 (0 turns clipping off)")
        need(opt.get("weight_decay", 0.0) >= 0, f"{stage_name}.optimizer.weight_decay", "must be >= 0")
        need(opt.get("warmup_steps", 0) >= 0, f"{stage_name}.optimizer.warmup_steps", "must be >= 0")
        schedule = opt.get("schedule", "constant")
        need(stage.get("patience", 0) >= 0, f"{stage_name}.patience",
             "must be >= 0 (evaluations without improvement before the stage stops; 0: train all `steps`)")
        need(schedule in ("linear", *NO_DECAY) or stage.steps > opt.get("warmup_steps", 0),
             f"{stage_name}.steps", f"{stage.steps} must exceed {stage_name}.optimizer.warmup_steps "
             f"({opt.get('warmup_steps', 0)}) with schedule {schedule!r}; train longer or warm up less")
        need(stage.microbatches >= 1 and stage.batch_size % stage.microbatches == 0, f"{stage_name}.microbatches",
             f"batch_size {stage.batch_size} must split into microbatches={stage.microbatches} equal parts")
        try:
            make_schedule(dict(opt, total_steps=max(1, stage.steps)))
        except ValueError as e:
            raise ConfigError(f"config.{stage_name}.optimizer: {e}") from e
    need(0.0 < c.warmup.fraction <= 1.0, "warmup.fraction", "must be in (0, 1]")
    need(0.0 <= c.warmup.feedback_fraction <= 1.0, "warmup.feedback_fraction", "must be a share in [0, 1]")
    need(c.critic.mode in CRITIC_MODES, "critic.mode",
         f"{c.critic.mode!r} is not a critic mode{suggestion(c.critic.mode, CRITIC_MODES)}; use feedback "
         "(x + hypothesis -> feedback, the paper) or solve")
    need("fresh_problems" not in c.critic, "critic.fresh_problems",
         "was replaced by task.extra_problems, generated problems that every model of the run learns from alike")
    need(c.critic.calibration_examples >= 1, "critic.calibration_examples", "must be >= 1 (held-out problems)")
    need(c.critic.samples >= 0, "critic.samples", "must be >= 0 (0: the critic's greedy answer is its reference)")
    need(0.0 <= c.critic.generator_fraction <= 1.0, "critic.generator_fraction", "must be a share in [0, 1]")
    need(0.0 < c.critic.generator_top_p <= 1.0, "critic.generator_top_p", "must be in (0, 1]")
    r = c.refiner
    need(r.turns >= 1, "refiner.turns", "must be >= 1")
    need(r.samples >= 1, "refiner.samples", "must be >= 1")
    need(0.0 < r.top_p <= 1.0, "refiner.top_p", "must be in (0, 1]")
    need(r.temperature >= 0.0, "refiner.temperature", "must be >= 0")
    need(r.selection in ("random", "last", "worst"), "refiner.selection",
         f"{r.selection!r}: use random (the paper), last (the released code) or worst (most errors)")
    need(0.0 <= r.feedback_noise <= 1.0, "refiner.feedback_noise", "must be a probability in [0, 1]")
    for key in ("{x}", "{z}", "{f}"):
        need(key in r.template, "refiner.template", f"must contain {key} (got {r.template!r})")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(r.template) if name is not None}
    except ValueError as e:
        raise ConfigError(f"config.refiner.template: {e} in {r.template!r}; write a literal brace as {{{{ or }}}}")
    need(fields <= {"x", "z", "f"}, "refiner.template",
         f"unknown fields {sorted(fields - {'x', 'z', 'f'})} in {r.template!r}; only {{x}}, {{z}} and {{f}} exist")
    rm = c.reward
    need("fresh_problems" not in rm, "reward.fresh_problems",
         "was replaced by config.task.extra_problems, which adds that many generated problems to the training "
         "problems of every model of the run alike (SFT policy, reward models, expert iteration); remove it")
    for name in ("samples", "train_problems", "val_problems", "max_steps", "test_samples", "sample_rows"):
        need(rm[name] >= 1, f"reward.{name}", "must be >= 1")
    need(rm.temperature > 0.0, "reward.temperature", "must be > 0 (the samples must differ)")
    need(0.0 < rm.top_p <= 1.0, "reward.top_p", "must be in (0, 1]")
    need(rm.head in HEADS, "reward.head", f"{rm.head!r} is not a reward head; use one of {HEADS}")
    need(len(rm.label_tokens) == 2 and len(set(rm.label_tokens)) == 2, "reward.label_tokens",
         f"needs two different strings (correct, wrong), got {tuple(rm.label_tokens)}")
    need(rm.neutral in NEUTRAL_MODES, "reward.neutral", f"{rm.neutral!r}: use one of {NEUTRAL_MODES}")
    need(rm.lm_weight >= 0, "reward.lm_weight", "must be >= 0 (0: no language-modelling loss)")
    need(rm.pairwise_weight >= 0, "reward.pairwise_weight", "must be >= 0 (0: no within-problem ranking loss)")
    need(rm.pairwise_weight == 0 or not rm.labels_file, "reward.pairwise_weight",
         "ranks a problem's sampled solutions against each other; a labels_file has no such groups, set it to 0")
    need(rm.pairwise_weight == 0 or rm.microbatches == 1, "reward.pairwise_weight",
         "pairs a problem's solutions within a batch; set reward.microbatches to 1")
    need(rm.pairwise_weight == 0 or rm.batch_size % rm.samples == 0, "reward.batch_size",
         f"{rm.batch_size} must be a multiple of reward.samples {rm.samples} with pairwise_weight > 0 (whole "
         "problems per batch)")
    need(rm.prm_reduction in REDUCTIONS, "reward.prm_reduction", f"{rm.prm_reduction!r}: use one of {REDUCTIONS}")
    need(0.0 <= rm.abstention < 1.0, "reward.abstention", "must be a share in [0, 1)")
    need(rm.labels in ("checker", "rollouts"), "reward.labels",
         f"{rm.labels!r}: use 'checker' (the task's step checker) or 'rollouts' (also a PRM on rollout labels)")
    need(rm.rollout_completions >= 1, "reward.rollout_completions", "must be >= 1 (continuations per step)")
    need(rm.test_samples <= 96 * 8, "reward.test_samples", "more than 768 samples per problem is not supported")
    rl = c.rl
    need(set(rl.rewards) <= set(RL_REWARDS), "rl.rewards", f"{tuple(rl.rewards)}: choose from {RL_REWARDS}")
    for name in ("rounds", "samples", "problems"):
        need(rl[name] >= 1, f"rl.{name}", "must be >= 1")
    need(0.0 <= rl.threshold <= 1.0, "rl.threshold", "must be a probability in [0, 1]")
    g = c.grpo
    need(set(g.rewards) <= set(RL_REWARDS), "grpo.rewards", f"{tuple(g.rewards)}: choose from {RL_REWARDS}")
    need(g.updates >= 1 and rl.steps % g.updates == 0, "grpo.updates",
         f"{g.updates} must be >= 1 and divide rl.steps {rl.steps} (GRPO takes expert iteration's gradient steps)")
    need(0.0 < g.eps_clip < 1.0, "grpo.eps_clip", "must be in (0, 1) (0.2 is usual)")
    need(g.kl_beta >= 0.0, "grpo.kl_beta", "must be >= 0 (0: no KL penalty)")
    need(g.adv_eps > 0.0, "grpo.adv_eps", "must be > 0 (it keeps an all-equal group's advantages at 0)")
    need(g.microbatches >= 1, "grpo.microbatches", "must be >= 1")
    need(g.optimizer.name in ("adamw", "adafactor"), "grpo.optimizer.name",
         f"{g.optimizer.name!r} is not supported; use adamw or adafactor")
    need(g.optimizer.learning_rate > 0, "grpo.optimizer.learning_rate", "must be positive")
    need(not g.rewards or rl.steps > g.optimizer.get("warmup_steps", 0), "grpo.optimizer.warmup_steps",
         f"must be below rl.steps {rl.steps} (GRPO's gradient steps)")
    if g.rewards:  # the section is read only when GRPO trains
        try:
            make_schedule(dict(g.optimizer, total_steps=max(1, rl.steps)))
        except ValueError as e:
            raise ConfigError(f"config.grpo.optimizer: {e}") from e
    need(c.eval.turns >= 1, "eval.turns", "must be >= 1")
    need(c.eval.examples >= 1, "eval.examples", "must be >= 1 (test problems to evaluate)")
    need(c.eval.batch_size >= 1, "eval.batch_size", "must be >= 1")
    need(c.eval.bootstrap_samples >= 1, "eval.bootstrap_samples", "must be >= 1 (1000 is usual)")
    need(c.checkpoint.every >= 1, "checkpoint.every", "must be >= 1 (training steps between checkpoints)")
    need(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1 (latest checkpoints to keep)")
    need(c.log_every >= 1, "log_every", "must be >= 1 (training steps between logged metrics)")
    need(c.max_nonfinite_skips >= 1, "max_nonfinite_skips",
         "must be >= 1 (skipped non-finite updates in a row before a stage stops)")
    need(all(0.0 <= e <= 1.0 for e in c.eval.noise_levels), "eval.noise_levels", "must be probabilities")
    for axis in ("data", "fsdp", "tensor"):
        need(int(c.mesh[axis]) == -1 or int(c.mesh[axis]) >= 1, f"mesh.{axis}", "must be a positive size or -1")
    need(sum(int(c.mesh[a]) == -1 for a in ("data", "fsdp", "tensor")) <= 1, "mesh",
         "at most one axis may be -1 (fill in)")
    try:
        shd.normalize_rules(c.logical_axis_rules)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config.logical_axis_rules: {e}") from e


def _target_modules(c: ml_collections.ConfigDict) -> tuple[str, ...]:
    return tuple(name.strip() for name in str(c.model.lora.target_modules).split(",") if name.strip())


def lora_config(c: ml_collections.ConfigDict) -> LoraConfig | None:
    """The run's `models.lora.LoraConfig` (every model of the run trains adapters), or None when
    `model.lora.rank` is 0."""
    if not c.model.lora.rank:
        return None
    return LoraConfig(rank=int(c.model.lora.rank), alpha=float(c.model.lora.alpha),
                      target_modules=_target_modules(c))


def validate_for_mesh(c: ml_collections.ConfigDict, batch_shards: int, processes: int = 1,
                      stages: tuple[str, ...] = ("critic", "warmup", "refiner")) -> None:
    """Raises `ConfigError` naming the stage's batch size when its microbatches cannot be split evenly over the
    mesh's `batch_shards` (data x fsdp devices) and the processes; call once the mesh exists, before compiling."""
    for stage_name in stages:
        stage = c[stage_name]
        rows = stage.batch_size * (c.refiner.turns if stage_name == "refiner" else 1)  # REFINER: a pair per turn
        unit = stage.microbatches * batch_shards
        turns = f" x refiner.turns {c.refiner.turns}" if stage_name == "refiner" else ""
        if rows % unit:
            raise ConfigError(
                f"config.{stage_name}.batch_size: {stage.batch_size}{turns} = {rows} rows per update must split "
                f"into {stage_name}.microbatches={stage.microbatches} microbatches over the {batch_shards} batch "
                f"shards of the mesh (data x fsdp); use a multiple of {unit} rows")
        if stage.batch_size % processes:
            raise ConfigError(f"config.{stage_name}.batch_size: {stage.batch_size} does not split over the "
                              f"{processes} processes; use a multiple of {processes}")


# ----------------------------------------------------------------------------------------------- saved configs


def _merged(defaults: dict, saved: Mapping) -> dict:
    out = dict(defaults)
    for key, value in saved.items():
        out[key] = (_merged(defaults[key], value) if isinstance(defaults.get(key), dict) and isinstance(value, Mapping)
                    else value)
    return out


def with_defaults(saved: Mapping | ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A saved run config with every field it lacks (a run made before the field existed) at `base_config()`'s
    default: the one source of defaults, so later loads agree with training."""
    saved = json.loads(saved.to_json()) if isinstance(saved, ml_collections.ConfigDict) else saved
    return ml_collections.ConfigDict(_merged(base_config().to_dict(), saved))


def load(workdir: str) -> ml_collections.ConfigDict:
    """The config a run directory was trained with (`<workdir>/config.json`), defaults filled (`with_defaults`)."""
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: {workdir} is not a refiner_jax run directory "
                                "(train one with launch/train.py --workdir=...)")
    with open(path, encoding="utf-8") as f:
        return with_defaults(json.load(f))


def load_run(workdir: str) -> RunInfo:
    """A run directory's `RunInfo`: its saved config (`load`) and tokenizer."""
    return RunInfo(workdir, load(workdir))
