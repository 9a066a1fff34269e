"""Losses and the jit-sharded train / eval steps.

A *loss function* has the signature ``loss_fn(params, batch, rng) -> (loss_sum, sums)``: ``loss_sum`` is the
differentiable loss SUMMED over tokens (not averaged), and ``sums`` is a dict of summed metrics that must contain
``'tokens'`` (the normaliser) and may contain any ``'<name>_sum'`` entries. ``rng`` is a dropout key, or None for
deterministic evaluation. Returning sums (not means) makes gradient accumulation and multi-batch evaluation exact:
the step divides by the token count of the WHOLE batch once. ``mean_metrics`` turns sums into means.

Steps are ``jax.jit`` functions with explicit in/out shardings and a donated state; they are compiled once per
input shape (pad batches to fixed shapes; an all-pad row has zero weight and changes nothing). Call them like
plain functions: they enter the mesh and logical-axis-rule context themselves.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, PartitionSpec as P

from refiner_jax import sharding as shd
from refiner_jax.models import lora as lora_lib
from refiner_jax.models.language_model import LanguageModel
from refiner_jax.models.t5 import shift_right
from refiner_jax.tokenizers import PAD_ID
from refiner_jax.training.state import FrozenBase, TrainState

Batch = dict[str, jax.Array]
LossFn = Callable[[Any, Batch, jax.Array | None], tuple[jax.Array, dict[str, jax.Array]]]


# ----------------------------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------------------------


def masked_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array | None = None, *,
                         z_loss: float = 0.0) -> tuple[jax.Array, jax.Array]:
    """Summed token cross-entropy and the token count (both float32 scalars).

    logits ``[batch, len, vocab]``, targets ``[batch, len]`` int, weights ``[batch, len]`` (default: 1 where
    ``targets != PAD_ID``, else 0). Positions with zero weight never contribute, even if their logits are
    non-finite. ``z_loss`` adds ``z_loss * logsumexp(logits)**2`` per token (the T5X/PaLM stabiliser).
    Differentiable in reverse mode only (see `_token_nll`).
    """
    logits = logits.astype(jnp.float32)
    if weights is None:
        weights = targets != PAD_ID
    weights = weights.astype(jnp.float32)
    nll = _token_nll(logits, targets.astype(jnp.int32), weights > 0, float(z_loss))
    return jnp.sum(nll * weights), jnp.sum(weights)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _token_nll(logits: jax.Array, targets: jax.Array, valid: jax.Array, z_loss: float) -> jax.Array:
    """Per-token ``log_z - logit[target] + z_loss * log_z**2`` ``[batch, len]``; 0 where ``valid`` is False.

    Its gradient is written out, ``((1 + 2 z_loss log_z) softmax - onehot) * cotangent``, zero at invalid
    positions: one elementwise pass over ``[batch, len, vocab]``, where autodiff of the same formula makes separate
    passes for the padding select, the softmax and the scatter of the target logit's gradient (docs/performance.md).
    Invalid positions are selected away, never multiplied, so non-finite logits there give neither a NaN loss nor a
    NaN gradient.
    """
    return _token_nll_fwd(logits, targets, valid, z_loss)[0]


def _token_nll_fwd(logits, targets, valid, z_loss):
    log_z = jnp.where(valid, jax.nn.logsumexp(logits, axis=-1), 0.0)  # [batch, len]
    target_logit = jnp.where(valid, jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0], 0.0)
    return log_z - target_logit + z_loss * jnp.square(log_z), (logits, targets, valid, log_z)


def _token_nll_bwd(z_loss, residuals, cotangent):
    logits, targets, valid, log_z = residuals
    softmax = jnp.exp(logits - log_z[..., None]) * (1.0 + 2.0 * z_loss * log_z)[..., None]
    onehot = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == targets[..., None]
    grad = jnp.where(valid[..., None], (softmax - onehot) * cotangent[..., None], 0.0)  # [batch, len, vocab]
    return grad, None, None


_token_nll.defvjp(_token_nll_fwd, _token_nll_bwd)


def seq2seq_loss(apply_fn: Callable[..., jax.Array], *, z_loss: float = 0.0) -> LossFn:
    """Teacher-forced loss for an encoder-decoder with the T5 signature
    ``apply_fn({'params': p}, inputs, decoder_inputs, enable_dropout=..., rngs=...) -> logits [b, lt, V]``.

    ``batch``: ``'inputs'`` [b, li] int32 and ``'targets'`` [b, lt] int32 (ending with eos, padded with 0); an
    optional ``'weights'`` [b, lt] replaces the non-pad mask (e.g. to train only on some target tokens). The
    decoder inputs are the targets shifted right. Sums: ``loss_sum``, ``accuracy_sum`` (the target has the largest
    logit), ``tokens``.
    """
    def loss_fn(params: Any, batch: Batch, rng: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
        targets = batch["targets"]
        dropout = rng is not None
        logits = apply_fn({"params": params}, batch["inputs"], shift_right(targets), enable_dropout=dropout,
                          rngs={"dropout": rng} if dropout else None)
        weights = batch.get("weights")
        if weights is None:
            weights = (targets != PAD_ID).astype(jnp.float32)
        return _token_sums(logits, targets, weights, z_loss)

    return loss_fn


def pair_loss(lm: LanguageModel, module: nn.Module, *, z_loss: float = 0.0) -> LossFn:
    """Teacher-forced loss on the target tokens of ``lm.pair_batch`` batches, for either model family (the
    decoder-only LM reads prompt and target as one sequence; only the target's tokens are scored). Sums as in
    `seq2seq_loss`."""
    def loss_fn(params: Any, batch: Batch, rng: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
        return _token_sums(*lm.target_logits(module, params, batch, rng), z_loss)

    return loss_fn


def _token_sums(logits, targets, weights, z_loss: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    loss_sum, tokens = masked_cross_entropy(logits, targets, weights, z_loss=z_loss)
    # The target's logit against the row maximum: a max reduction is far cheaper on XLA:CPU than `argmax` (a
    # variadic reduce). A target tied with another maximum counts as correct.
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    correct = jnp.sum((target_logit >= jnp.max(logits, axis=-1)) * weights)
    return loss_sum, {"loss_sum": loss_sum, "accuracy_sum": correct, "tokens": tokens}


def solution_log_odds(log_odds: jax.Array, mask: jax.Array, reduction: str) -> jax.Array:
    """[b, steps] step log-odds -> [b] one score per solution, monotone in `rerank.solution_scores`' reduction of the
    step probabilities: the last labelled step's, the weakest step's, or (`prod`) the sum of log-probabilities."""
    real = mask > 0
    if reduction == "min":
        return jnp.min(jnp.where(real, log_odds, jnp.inf), axis=1)
    if reduction == "prod":
        return jnp.sum(jnp.where(real, jax.nn.log_sigmoid(log_odds), 0.0), axis=1)
    last = jnp.maximum(jnp.sum(real, axis=1) - 1, 0).astype(jnp.int32)  # labelled steps come first in a row
    return jnp.take_along_axis(log_odds, last[:, None], axis=1)[:, 0]


def reward_loss(score_fn: Callable[[Any, Batch, jax.Array | None], jax.Array],
                lm_fn: Callable[[Any, Batch, jax.Array | None], tuple[jax.Array, jax.Array, jax.Array]] | None = None,
                lm_weight: float = 0.0, pairwise_weight: float = 0.0, reduction: str = "last") -> LossFn:
    """Binary cross-entropy of a reward model's step log-odds ``score_fn(params, batch, rng) -> [b, steps]``
    against ``batch['labels']`` [b, steps] (1 = correct so far), over the steps where ``batch['label_mask']`` is 1.

    With ``lm_weight`` > 0, plus ``lm_weight`` times the summed token cross-entropy of the reference solutions:
    ``lm_fn(params, batch, rng) -> (logits [b, len, vocab], targets [b, len], weights [b, len])`` (the verifier
    keeps learning to solve while it learns to judge, as Cobbe et al. train theirs).

    With ``pairwise_weight`` > 0, plus that weight times a within-problem ranking loss: for every pair of solutions
    of one problem (rows with the same ``batch['group']`` [b]) whose solution labels (the last labelled step's)
    differ, ``softplus(s_wrong - s_right)`` on their `solution_log_odds` under ``reduction``. It scores the right
    solution above the wrong one of the same problem, which the pointwise loss can miss by learning which problems
    are hard; pairs are formed within what one loss call sees (a data shard's microbatch).

    Sums: ``loss_sum`` (the classification part), ``accuracy_sum`` (the sign of the log-odds agrees with the
    label), ``lm_loss_sum``, ``pair_loss_sum``, ``tokens`` (labelled steps: every sum is per labelled step)."""
    def loss_fn(params: Any, batch: Batch, rng: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
        log_odds = score_fn(params, batch, rng).astype(jnp.float32)
        labels, mask = batch["labels"], batch["label_mask"]
        loss_sum = jnp.sum(jnp.where(mask > 0, optax.sigmoid_binary_cross_entropy(log_odds, labels), 0.0))
        correct = jnp.sum(jnp.where(mask > 0, (log_odds > 0) == (labels > 0.5), False))
        sums = {"loss_sum": loss_sum, "accuracy_sum": correct.astype(jnp.float32), "tokens": jnp.sum(mask)}
        total = loss_sum
        if lm_weight > 0:
            logits, targets, weights = lm_fn(params, batch, rng)
            lm_sum, _ = masked_cross_entropy(logits, targets, weights)
            sums["lm_loss_sum"] = lm_sum
            total = total + lm_weight * lm_sum
        if pairwise_weight > 0:
            scored = jnp.sum(mask, axis=1) > 0
            scores = jnp.where(scored, solution_log_odds(log_odds, mask, reduction), 0.0)  # [b]
            label = solution_log_odds(labels, mask, "last") > 0.5
            group = batch["group"]
            pairs = ((group[:, None] == group[None, :]) & label[:, None] & ~label[None, :]
                     & scored[:, None] & scored[None, :])  # [b, b] (right i, wrong j) of one problem
            margin = jnp.where(pairs, scores[None, :] - scores[:, None], 0.0)
            pair_sum = jnp.sum(jnp.where(pairs, jax.nn.softplus(margin), 0.0))
            sums["pair_loss_sum"] = pair_sum
            total = total + pairwise_weight * pair_sum
        return total, sums

    return loss_fn


def mean_metrics(sums: dict[str, Any]) -> dict[str, Any]:
    """``{'x_sum': s, 'tokens': n, ...}`` -> ``{'x': s / n, 'tokens': n, ...}`` (other entries unchanged)."""
    n = jnp.maximum(sums["tokens"], 1.0)
    return {(k[:-4] if k.endswith("_sum") else k): (v / n if k.endswith("_sum") else v) for k, v in sums.items()}


# ----------------------------------------------------------------------------------------------------------------
# Steps
# ----------------------------------------------------------------------------------------------------------------


class ShardedStep:
    """A jitted step bound to a mesh and logical-axis rules: ``step(*args)`` runs it, ``step.lower(*args)`` lowers
    it ahead of time (``.compile().memory_analysis()`` reports memory before the first step)."""

    def __init__(self, jitted: Any, mesh: Mesh, rules: shd.Rules, bound: tuple = ()):
        self.jitted, self.mesh, self.rules = jitted, mesh, rules
        self.bound = bound  # trailing arguments of every call (a LoRA step's frozen base)

    def __call__(self, *args):
        with shd.use_mesh(self.mesh, self.rules):
            return self.jitted(*args, *self.bound)

    def lower(self, *args):
        with shd.use_mesh(self.mesh, self.rules):
            return self.jitted.lower(*args, *self.bound)

    def num_compiled(self) -> int:
        """How many input-shape variants have been compiled (1 for a run with fixed batch shapes)."""
        return self.jitted._cache_size()


def _split_microbatches(x: jax.Array, m: int, batch_axes: Any) -> jax.Array:
    """``[b, ...] -> [m, b // m, ...]`` with microbatch ``i`` = rows ``i, i + m, ...``: every microbatch keeps rows
    on every batch shard, so the split needs no communication."""
    b = x.shape[0]
    x = x.reshape((b // m, m) + x.shape[1:]).swapaxes(0, 1)
    return jax.lax.with_sharding_constraint(x, P(None, batch_axes))


def _check_microbatching(batch: Batch, m: int, divisor: int) -> None:
    for name, x in batch.items():
        b = x.shape[0]
        if b % m or (b // m) % divisor:
            raise ValueError(
                f"batch['{name}'] has {b} rows: with num_microbatches={m} each microbatch must hold a multiple of "
                f"the {divisor} batch shards; use a batch size that is a multiple of {m * divisor}")


def _tree_add(a: Any, b: Any) -> Any:
    return jax.tree.map(jnp.add, a, b)


def _sum_over(tree: Any, axis: str, flat: bool) -> Any:
    """``psum`` of ``tree`` over the manual mesh axis ``axis``; with ``flat``, of one float32 buffer holding every
    leaf: XLA:CPU's devices meet once per operand of an all-reduce, so one buffer meets once."""
    if not flat:
        return jax.lax.psum(tree, axis)
    leaves, treedef = jax.tree.flatten(tree)
    summed = jax.lax.psum(jnp.concatenate([x.astype(jnp.float32).ravel() for x in leaves]), axis)
    offsets = np.cumsum([0] + [x.size for x in leaves])
    return jax.tree.unflatten(treedef, [summed[a:b].reshape(x.shape).astype(x.dtype)
                                        for x, a, b in zip(leaves, offsets[:-1], offsets[1:])])


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, mesh: Mesh, state_shardings: TrainState,
                    *, rules: shd.Rules = shd.DEFAULT_RULES, num_microbatches: int = 1,
                    schedule: optax.Schedule | None = None, donate: bool = True,
                    frozen: FrozenBase | None = None) -> ShardedStep:
    """``train_step(state, batch) -> (new_state, metrics)`` as one jitted, sharded program.

    The gradient is that of ``loss_sum / tokens`` over the whole batch. With ``num_microbatches = m > 1`` the batch
    is split into m interleaved microbatches and a ``lax.scan`` accumulates summed gradients and metrics (float32,
    kept in the parameters' sharding), so peak activation memory is that of one microbatch and the result equals the
    full-batch step (dropout aside: each microbatch draws its own mask). Dropout keys are
    ``fold_in(fold_in(state.rng, state.step), microbatch)`` (by hand, below, the shard's index is folded in between),
    deterministic and resumable. ``metrics`` holds the means from ``mean_metrics``, ``grad_norm`` (before clipping),
    ``nonfinite_skips`` and, when ``schedule`` is given, ``learning_rate``. The input state is donated (its buffers
    are reused); do not touch it after the call.

    A batch whose loss, gradient norm or update is not finite (NaN or inf) changes nothing: parameters and optimizer
    state keep their values bit for bit (a select inside the program, no host sync) and ``nonfinite_skips`` is 1
    instead of 0. ``state.step`` still advances, so it counts batches consumed: the data order and dropout keys move
    on past the bad batch, while the optimizer's own count (its schedule position, Adam's bias correction) counts
    only the updates applied. `training.loop` stops a stage after too many skips in a row.

    With ``frozen`` (LoRA, `state.create_lora_train_state`), ``state.params`` is the trainable tree and the loss
    sees ``frozen.model_params(state.params)``: the gradient is taken with respect to the adapters (and a reward
    head) only, the frozen base is a further argument of the program (bound to the step, never donated or updated).

    Pure data parallelism (``data > 1``, every parameter whole on every device) runs by hand: each data shard
    computes its gradient and metric sums inside a ``shard_map``, with its dropout key folded with the shard's
    index, and the shards add them once per step, after the last microbatch; on CPU as one flat buffer
    (``_sum_over``), which is faster than the all-reduce the partitioner places. Meshes that split parameters
    (fsdp, tensor) leave every collective to the partitioner, which aborted on a ``shard_map`` manual over
    ``data`` on a data x fsdp x tensor mesh.
    """
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    batch_sh = shd.batch_sharding(mesh, rules)
    divisor = shd.batch_divisor(mesh, rules)
    m = num_microbatches
    base_shardings = frozen.shardings if frozen is not None else None
    by_hand = (mesh.shape["data"] > 1 and not shd.splitting_axes(state_shardings.params)
               and not (frozen is not None and shd.splitting_axes(base_shardings)))

    def bound_loss(base: Any) -> LossFn:
        """The loss as a function of the trained parameters (with LoRA: of the trainable tree over ``base``)."""
        if frozen is None:
            return loss_fn
        return lambda params, batch, rng: loss_fn(lora_lib.apply(base, params, frozen.lora), batch, rng)
    inner_rules = shd.without_mesh_axis(rules, "data") if by_hand else rules
    batch_axes = shd.batch_sharding(mesh, inner_rules).spec[0]

    def local_grads_and_sums(params: Any, base: Any, batch: Batch, step_rng: jax.Array
                             ) -> tuple[Any, dict[str, jax.Array]]:
        loss = bound_loss(base)
        grad_fn = jax.value_and_grad(loss, has_aux=True)
        if m == 1:
            (_, sums), grads = grad_fn(params, batch, jax.random.fold_in(step_rng, 0))
            return grads, sums
        micro = jax.tree.map(lambda x: _split_microbatches(x, m, batch_axes), batch)
        first = jax.tree.map(lambda x: x[0], micro)
        sums_shape = jax.eval_shape(loss, params, first, step_rng)[1]
        zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        zero_grads = jax.lax.with_sharding_constraint(zero_grads, state_shardings.params)
        zero_sums = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape)

        def body(carry, xs):
            acc_grads, acc_sums = carry
            index, mb = xs
            (_, sums), grads = grad_fn(params, mb, jax.random.fold_in(step_rng, index))
            grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
            acc_grads = jax.lax.with_sharding_constraint(_tree_add(acc_grads, grads), state_shardings.params)
            return (acc_grads, _tree_add(acc_sums, sums)), None

        (grads, sums), _ = jax.lax.scan(body, (zero_grads, zero_sums), (jnp.arange(m), micro))
        return grads, sums

    def data_shard(params: Any, base: Any, batch: Batch, step_rng: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        with nn.logical_axis_rules(inner_rules):
            out = local_grads_and_sums(params, base, batch,
                                       jax.random.fold_in(step_rng, jax.lax.axis_index("data")))
        return _sum_over(out, "data", flat=mesh.devices.flat[0].platform == "cpu")

    def grads_and_sums(params: Any, base: Any, batch: Batch, step_rng: jax.Array
                       ) -> tuple[Any, dict[str, jax.Array]]:
        if m > 1:
            _check_microbatching(batch, m, divisor)
        if not by_hand:
            return local_grads_and_sums(params, base, batch, step_rng)
        # check_vma=False keeps each shard's gradient of the replicated parameters its own partial sum, for
        # `_sum_over`; with the check JAX would add them itself, one all-reduce operand per parameter.
        return jax.shard_map(data_shard, mesh=mesh, in_specs=(P(), P(), P("data"), P()), out_specs=P(),
                             axis_names={"data"}, check_vma=False)(params, base, batch, step_rng)

    def step_fn(state: TrainState, batch: Batch, base: Any = None) -> tuple[TrainState, dict[str, jax.Array]]:
        step_rng = jax.random.fold_in(state.rng, state.step)
        grads, sums = grads_and_sums(state.params, base, batch, step_rng)
        denom = jnp.maximum(sums["tokens"], 1.0)
        grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        metrics = mean_metrics(sums)
        metrics["grad_norm"] = optax.tree.norm(grads)
        # The whole batch's reduced loss and gradient (every shard and microbatch added), and the update itself.
        finite = (jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
                  & jnp.isfinite(optax.tree.norm(updates)))
        params = optax.apply_updates(state.params, updates)
        keep_old = functools.partial(jax.tree.map, lambda new, old: jnp.where(finite, new, old))
        metrics["nonfinite_skips"] = jnp.where(finite, 0.0, 1.0)
        if schedule is not None:
            metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
        new_state = state.replace(step=state.step + 1, params=keep_old(params, state.params),
                                  opt_state=keep_old(opt_state, state.opt_state))
        return new_state, metrics

    in_shardings = (state_shardings, batch_sh) + ((base_shardings,) if frozen is not None else ())
    jitted = jax.jit(step_fn, in_shardings=in_shardings, out_shardings=(state_shardings, shd.replicated(mesh)),
                     donate_argnums=(0,) if donate else ())
    return ShardedStep(jitted, mesh, rules, bound=(frozen.params,) if frozen is not None else ())


def make_eval_step(loss_fn: LossFn, mesh: Mesh, params_shardings: Any, *,
                   rules: shd.Rules = shd.DEFAULT_RULES) -> ShardedStep:
    """``eval_step(params, batch) -> sums`` (no dropout). Add the sums of several batches, then ``mean_metrics``."""
    def eval_fn(params: Any, batch: Batch) -> dict[str, jax.Array]:
        return loss_fn(params, batch, None)[1]

    jitted = jax.jit(eval_fn, in_shardings=(params_shardings, shd.batch_sharding(mesh, rules)),
                     out_shardings=shd.replicated(mesh))
    return ShardedStep(jitted, mesh, rules)


__all__ = ["Batch", "LossFn", "ShardedStep", "make_eval_step", "make_train_step", "masked_cross_entropy",
           "mean_metrics", "seq2seq_loss"]
