"""One resumable training stage: training items in, a trained (and exported) model out.

Every stage of a REFINER run (generator warm-up, critic, REFINER loop) is this loop with a different
`make_pairs(params, indices, step)` that turns a batch of example indices into (input text, target text) pairs — the
REFINER loop samples from the current parameters there. A stage may instead bring its own `model`, `loss` and
`collate` (reward models: labelled solutions in, a `RewardModel` out). Everything random is a function of (seed,
step), the data order and the early-stopping state are checkpointed with the state, so a run killed at any point and
restarted ends with the same parameters as one that never stopped.

A stage trains `steps` updates, or with `patience` > 0 until `patience` evaluations in a row have not bettered its
validation metric (`steps` then only caps it); either way it exports its best validation checkpoint.

Layout under `<workdir>/<stage>/`: `ckpt/` (full state, keep-last-N plus best-by-validation), `export/` (params
only, the best checkpoint's, for inference; a LoRA stage's merged model), `adapter/` (a LoRA stage's adapters as
PEFT's files), `DONE` (the final metrics, JSON, with `"convergence"`: best and last step, whether it stopped early,
and the validation curve `[[step, value], ...]` of `best_metric`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
import tqdm

from refiner_jax import atomic_files
from refiner_jax import checkpoint as ckpt_lib
from refiner_jax import sharding as shd
from refiner_jax.models.language_model import LanguageModel
from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.t5_config import T5Config
from refiner_jax.tokenizers import Tokenizer
from refiner_jax.training.data_order import EpochOrder
from refiner_jax.training.nonfinite import SkipCounter
from refiner_jax.training.optim import make_optimizer
from refiner_jax.models import lora as lora_lib
from refiner_jax.models.lora import LoraConfig
from refiner_jax.training.state import (FrozenBase, abstract_train_state, create_lora_train_state, create_train_state,
                                        train_state_from_params, trainable_init)
from refiner_jax.training.steps import LossFn, make_train_step, pair_loss

Pairs = Sequence[tuple[str, str]]
MakePairs = Callable[[Any, np.ndarray, int], Pairs]  # (params, example indices, step) -> text pairs


@dataclasses.dataclass
class StageSpec:
    """What a stage trains and how; `stage` is the ConfigDict of that stage (steps, batch_size, optimizer, ...)."""

    name: str
    stage: Any
    num_examples: int
    make_pairs: MakePairs
    evaluate: Callable[[Any], dict[str, float]]  # params -> validation metrics
    best_metric: str  # a key of `evaluate`'s result; higher is better
    input_len: int
    target_len: int
    model: nn.Module | None = None  # default: the model config's LM (`models.language_model.LanguageModel`)
    loss: Callable[[nn.Module], LossFn] | None = None  # model -> loss function; default: its `pair_loss`
    collate: Callable[[Any], dict] | None = None  # items -> arrays; default: `LanguageModel.text_pair_batch`
    init_args: tuple = ()  # dummy inputs of `model.init` (default: the LM's)
    export_metadata: dict = dataclasses.field(default_factory=dict)  # saved with the exported parameters
    patience: int = 0  # stop after this many evaluations without a better `best_metric` (0: never)


class MetricsLog:
    """Appends metrics to `<workdir>/metrics.jsonl` and TensorBoard (`<workdir>/tb`)."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._writer = None
        if shd.is_main_process():
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, stage: str, step: int, metrics: dict[str, float]) -> None:
        if not shd.is_main_process():
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"stage": stage, "step": step, **metrics}) + "\n")
        for k, v in metrics.items():
            self._writer.add_scalar(f"{stage}/{k}", v, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def truncation_warning(name: str, tokenizer: Tokenizer, pairs: Pairs, input_len: int, target_len: int) -> str | None:
    """A message when texts of `pairs` exceed the stage's token budgets (they are cut to fit), else None."""
    cut = []
    for side, texts, budget in (("inputs", [p[0] for p in pairs], input_len),
                                ("targets", [p[1] for p in pairs], target_len)):
        lengths = [len(tokenizer.encode(t)) for t in texts]  # EOS included
        over = sum(n > budget for n in lengths)
        if over:
            cut.append(f"{over} of {len(texts)} {side} are longer than {budget} tokens (up to {max(lengths)})")
    if not cut:
        return None
    return f"[{name}] {'; '.join(cut)} and are cut to fit; raise the budgets in config.lengths"


def stage_done(workdir: str, name: str) -> dict | None:
    """The final metrics of a finished stage, or None if it has not finished."""
    path = os.path.join(workdir, name, "DONE")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class StageProgram:
    """A stage's model, optimizer, initial train state (`state`), data order (`order`), batch making (`collate`,
    `feed`) and jitted train step (`train_step`), as `train_stage` builds them: public for tools that drive a stage's
    updates themselves (the benchmarks time them). With `lora`, the state holds only the trainable tree (adapters, a
    reward head) and `frozen` the language model they adapt; `model_params` gives the model's whole params."""

    def __init__(self, spec: StageSpec, model_config: T5Config | DecoderConfig, tokenizer: Tokenizer, mesh,
                 seed: int, init_params: Any, rules: shd.Rules, pack: bool, lora: LoraConfig | None = None):
        stage = spec.stage
        self.spec, self.tokenizer, self.mesh, self.rules = spec, tokenizer, mesh, rules
        self.lm = LanguageModel(model_config)
        model = spec.model or self.lm.module()
        opt_config = dict(stage.optimizer)
        opt_config["total_steps"] = max(1, stage.steps)
        self.tx, schedule = make_optimizer(opt_config)
        init_args = spec.init_args or self.lm.init_args()

        def init_fn(key):
            return model.init(key, *init_args)["params"]

        self.init_fn = init_fn
        self.frozen: FrozenBase | None = None
        if lora is not None:
            bound = lora_lib.bind(model_config, lora)
            self.init_fn = trainable_init(init_fn, bound)
            self.state, shardings, self.frozen = create_lora_train_state(init_fn, bound, self.tx, mesh, rules,
                                                                         seed=seed, params=init_params)
        elif init_params is None:
            self.state, shardings = create_train_state(init_fn, self.tx, mesh, rules, seed=seed)
        else:
            self.state, shardings = train_state_from_params(init_params, init_fn, self.tx, mesh, rules, seed=seed)
        loss = spec.loss(model) if spec.loss else pair_loss(self.lm, model)
        self.train_step = make_train_step(loss, self.tx, mesh, shardings, rules=rules,
                                          num_microbatches=stage.microbatches, schedule=schedule, frozen=self.frozen)
        self.order = EpochOrder(spec.num_examples, stage.batch_size, seed=seed)
        # Packed row counts must split into the microbatches, over the batch shards and the processes.
        self.row_multiple = (int(np.lcm(stage.microbatches * shd.batch_divisor(mesh, rules), jax.process_count()))
                             if pack else 0)

    def model_params(self, params: Any) -> Any:
        """The model's whole params for the state's `params` (with LoRA: the adapters merged into the frozen base)."""
        return params if self.frozen is None else self.frozen.model_params(params)

    def collate(self, pairs: Pairs) -> dict[str, np.ndarray]:
        """The global batch of `pairs`, on every process."""
        spec = self.spec
        if spec.collate is not None:
            return spec.collate(pairs)
        return self.lm.text_pair_batch(self.tokenizer, pairs, spec.input_len, spec.target_len,
                                       pack=self.row_multiple)

    def feed(self, batch: dict[str, np.ndarray]):
        """This process's rows of the global batch, placed on the mesh."""
        rows = shd.host_batch_slice(len(next(iter(batch.values()))))
        return shd.make_global_batch({k: v[rows] for k, v in batch.items()}, self.mesh, self.rules)


def real_tokens(batch: dict[str, np.ndarray]) -> int:
    """The batch's tokens other than padding (pad id 0), inputs and targets together."""
    return int(sum((batch[k] > 0).sum() for k in ("inputs", "targets", "tokens") if k in batch))


def train_stage(spec: StageSpec, *, workdir: str, model_config: T5Config | DecoderConfig, tokenizer: Tokenizer, mesh,
                seed: int, checkpoint_every: int, keep: int, log: MetricsLog, init_params: Any = None,
                log_every: int = 50, rules: shd.Rules = shd.DEFAULT_RULES, pack: bool = False,
                max_nonfinite_skips: int = 10, lora: LoraConfig | None = None) -> dict[str, float]:
    """Trains (or resumes) the stage to `spec.stage.steps` updates or its validation plateau (`spec.patience`),
    exports the best parameters, marks it done.
    `rules` map the model's logical axes to `mesh` (config.logical_axis_rules); `pack` packs a decoder-only LM's
    text pairs several to a row (`LanguageModel.pair_batch`). After `max_nonfinite_skips` updates in a row skipped
    for a non-finite loss or gradient, the stage stops with `nonfinite.NonFiniteError`; the count is read at the
    points that already wait for the device (logging, evaluation, checkpoints), so the stop comes at the first of
    those at or after the limit. With `lora`, only LoRA adapters (and the parameters outside the language model)
    train and are checkpointed; the export holds the merged model, and `<stage>/adapter` the adapters as PEFT's
    files."""
    stage = spec.stage
    program = StageProgram(spec, model_config, tokenizer, mesh, seed, init_params, rules, pack, lora)
    state, order, train_step = program.state, program.order, program.train_step
    stage_dir = os.path.join(workdir, spec.name)
    checkpointer = ckpt_lib.Checkpointer(os.path.join(stage_dir, "ckpt"), save_interval_steps=checkpoint_every,
                                         keep_last=keep, best_metric=spec.best_metric, best_mode="max")
    # early stopping: the best `best_metric` so far, evaluations since it, and every evaluation's [step, value]
    best_value, stale, curve = -float("inf"), 0, []
    if checkpointer.latest_step() is not None:
        target, _ = abstract_train_state(program.init_fn, program.tx, mesh, rules)
        state, extra = checkpointer.restore(target)
        order.load_state_dict(extra["data"])
        if "early_stopping" in extra:  # older checkpoints lack it: counted from this restart
            best, stale = extra["early_stopping"]["best"], extra["early_stopping"]["stale"]
            best_value = -float("inf") if best is None else best
            curve = [list(point) for point in extra["early_stopping"].get("curve", [])]
        if shd.is_main_process():
            print(f"[{spec.name}] resumed from step {int(state.step)}")
    step = int(state.step)
    progress = tqdm.tqdm(total=stage.steps, initial=step, desc=spec.name, dynamic_ncols=True,
                         disable=not shd.is_main_process())
    window_start, window_examples, window_tokens = time.time(), 0, 0
    last_eval: dict[str, float] = {}
    first_batch = True
    skips = SkipCounter(spec.name, max_nonfinite_skips)
    # A stage resumed after its early stop trains no further.
    while step < stage.steps and not (spec.patience and stale >= spec.patience):
        # Every process makes the same pairs (their sampling needs the same inputs everywhere), then feeds its rows.
        pairs = spec.make_pairs(program.model_params(state.params), order.next_indices(), step)
        if first_batch and spec.collate is None and shd.is_main_process():
            warning = truncation_warning(spec.name, tokenizer, pairs, spec.input_len, spec.target_len)
            if warning:
                progress.write(warning)
        first_batch = False
        batch = program.collate(pairs)
        window_examples += len(pairs)
        window_tokens += real_tokens(batch)
        state, metrics = train_step(state, program.feed(batch))
        skips.add(metrics)
        step += 1
        progress.update(1)
        log_now = step % log_every == 0 or step == stage.steps
        eval_now = step % stage.eval_every == 0 or step == stage.steps
        if log_now or eval_now or checkpointer.should_save(step):
            skipped = skips.check(step, checkpointer)  # waits for the queued steps; raises after too many skips
        if log_now:
            host = {k: float(v) for k, v in jax.device_get(metrics).items()}
            host["nonfinite_skips"] = float(skipped)  # since the stage (re)started
            elapsed = max(time.time() - window_start, 1e-9)
            host.update(examples_per_s=window_examples / elapsed, tokens_per_s=window_tokens / elapsed)
            progress.set_postfix(loss=f"{host['loss']:.3f}", ex_s=f"{host['examples_per_s']:.0f}")
            log.write(spec.name, step, host)
            window_start, window_examples, window_tokens = time.time(), 0, 0
        if eval_now:
            eval_start = time.time()
            last_eval = {k: float(v) for k, v in spec.evaluate(program.model_params(state.params)).items()}
            window_start += time.time() - eval_start  # throughput counts training time only
            log.write(spec.name, step, last_eval)
            progress.write(f"[{spec.name}] step {step}: " + ", ".join(f"{k}={v:.4f}" for k, v in last_eval.items()))
            value = last_eval.get(spec.best_metric, -float("inf"))
            best_value, stale = (value, 0) if value > best_value else (best_value, stale + 1)
            curve.append([step, value])
        if eval_now or checkpointer.should_save(step):
            early_stopping = {"best": None if best_value == -float("inf") else best_value, "stale": stale,
                              "curve": curve}
            checkpointer.save(step, state, extra={"data": order.state_dict(), "early_stopping": early_stopping},
                              metrics=last_eval if eval_now else None, force=eval_now)
    stopped_early = step < stage.steps
    if stopped_early:
        progress.write(f"[{spec.name}] stopped early at step {step}: {spec.best_metric} has not improved in "
                       f"{stale} evaluations")
    progress.close()
    checkpointer.wait_until_finished()
    best = checkpointer.best_step() or step
    params = state.params
    if best != step:
        target, _ = abstract_train_state(program.init_fn, program.tx, mesh, rules)
        params = checkpointer.restore_params(target.params, best)
    if program.frozen is not None:
        ckpt_lib.export_adapters(os.path.join(stage_dir, "adapter"), program.frozen.lora, params["adapters"])
    params = program.model_params(params)
    final = {"best_step": best, **(checkpointer.metrics(best) or last_eval),
             "convergence": {"best_step": best, "last_step": step, "stopped_early": stopped_early,
                             "metric": spec.best_metric, "curve": curve}}
    checkpointer.close()
    ckpt_lib.export_params(os.path.join(stage_dir, "export"), params,
                           {"model_config": dataclasses.asdict(model_config), "family": program.lm.family, "step": best,
                            **spec.export_metadata})
    if shd.is_main_process():
        atomic_files.write_json(os.path.join(stage_dir, "DONE"), final, indent=2)
    shd.sync_processes(f"{spec.name} done")
    return final
