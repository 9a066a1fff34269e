"""Building blocks shared by the models (`models.t5`, `models.decoder`): memory-lean custom VJPs for XLA:CPU,
counter-based dropout, RMS norm, attention masks and the configs' dtype fields.

The products and attention here carry hand-written gradients (`dense`, `attend`, `broadcast_batch`,
`product_over_rows`): autodiff's versions kept more temporaries or made XLA:CPU copy operands transposed; each
docstring gives the measured gain. `Dropout` draws its mask from a hash of each element's index, so a backward pass
recomputes it from one seed instead of storing it.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Self

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

MASK_VALUE = -1e10  # added to masked attention logits (float32)

Array = jax.Array


class ConfigDtypes:
    """The frozen model configs' shared part: their `dtype` and `param_dtype` names as dtypes, and `replace`."""

    dtype: str
    param_dtype: str

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def weight_dtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes) -> Self:
        return dataclasses.replace(self, **changes)


def rms_norm(x: Array, scale: Array, eps: float, dtype, unit_offset: bool = False) -> Array:
    """`x` over the root mean square of its last axis (no mean subtraction; statistics in float32), times `scale`,
    in `dtype`: T5's layer norm and the Llama family's RMSNorm. With `unit_offset` (Gemma 3) the factor is
    1 + `scale`, applied in float32 before the cast, as transformers' Gemma norms round once."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if unit_offset:
        return (y * (1.0 + scale.astype(jnp.float32))).astype(dtype)
    return y.astype(dtype) * scale.astype(dtype)


@jax.custom_vjp
def dense(x: Array, kernel: Array) -> Array:
    """`x` [..., k] @ `kernel` [k, n], whose kernel gradient is `product_over_rows(x, output gradient)`.

    The kernel gradient contracts over every row of the batch. Autodiff writes it as (output gradient)^T x, and
    XLA:CPU then copies the output gradient transposed, with the activation's masks fused into that slow copy.
    Transposing the narrower of the two instead gives the same values, faster (docs/performance.md).
    """
    return x @ kernel


def _dense_fwd(x, kernel):
    return x @ kernel, (x, kernel)


def _dense_bwd(residuals, g):
    x, kernel = residuals
    rows_x, rows_g = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])  # [rows, k], [rows, n]
    return g @ kernel.T, product_over_rows(rows_x, rows_g)


dense.defvjp(_dense_fwd, _dense_bwd)


def fusion_boundary(x: Array) -> Array:
    """`x` unchanged, computed into a buffer of its own on CPU: XLA:CPU fuses no producer of `x` into its consumers.

    XLA:CPU drops `optimization_barrier` before fusing, so the boundary is a conditional whose predicate only the
    running program knows; both branches return `x`, written differently (`y`, `y * 1`) because JAX drops a
    conditional whose branches are the same. Elsewhere `x` passes as is: a GPU would sync with the host to read the
    predicate.
    """
    def cpu(x):
        first = x[(0,) * x.ndim]
        return jax.lax.cond(first == first, lambda y: y, lambda y: y * 1, x)  # False only for a NaN: the same `x`

    return jax.lax.platform_dependent(x, cpu=cpu, default=lambda y: y)


@jax.custom_vjp
def cotangent_barrier(x: Array) -> Array:
    """`x` unchanged, whose gradient is computed once into a buffer of its own (`fusion_boundary`): for the residual
    stream between layers.

    The residual stream's gradient is a long sum (every later layer adds to it). Without a boundary XLA:CPU fuses
    that chain of adds into each consumer of the gradient, so every layer's kernel-gradient transposes and products
    recompute the sums of all the layers above it (docs/performance.md).
    """
    return x


def _cotangent_barrier_fwd(x):
    return x, None


def _cotangent_barrier_bwd(_, g):
    return (fusion_boundary(g),)


cotangent_barrier.defvjp(_cotangent_barrier_fwd, _cotangent_barrier_bwd)


def product_over_rows(a: Array, b: Array) -> Array:
    """`a`^T `b` for `a` [..., rows, m] and `b` [..., rows, n] -> [..., m, n], leading axes batched: a product that
    contracts both operands' row axis, as a kernel gradient and attention's key and value gradients do.

    XLA:CPU gives such a product to Eigen, and one whose left operand is laid out [m, rows] to YNNPACK, which runs
    it faster. So on CPU the narrower operand is transposed into a buffer of its own, the product runs as
    (narrower)^T (wider), and its result is transposed back when `a` was the wider; optimization barriers keep XLA
    from folding the transposes back into the product. Elsewhere the product stays one contraction, which GPU and
    TPU libraries read transposed for free (figures: docs/performance.md).
    """
    def swap(x):
        return jnp.swapaxes(x, -1, -2)

    def cpu(a, b):
        if a.shape[-1] <= b.shape[-1]:
            return jax.lax.optimization_barrier(swap(a)) @ b
        return swap(jax.lax.optimization_barrier(jax.lax.optimization_barrier(swap(b)) @ a))

    return jax.lax.platform_dependent(a, b, cpu=cpu, default=lambda a, b: swap(a) @ b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def attend(q: Array, k: Array, v: Array, bias: Array, seed: Array | None, rate: float,
           softcap: float | None = None) -> Array:
    """softmax(q k^T + bias) (float32), dropped out at `rate` with `seed`'s mask (`dropout`), times v:
    q `[batch, heads, q, d_kv]`, k and v `[batch, heads, k, d_kv]`, bias `[batch or 1, heads or 1, q or 1, k]`
    -> `[batch, heads, q, d_kv]`. With `softcap` (Gemma's soft-capping), q k^T becomes softcap * tanh(q k^T /
    softcap) before the bias is added.

    Its gradient is written out: it keeps the softmax alone and recomputes the dropout mask from the seed, where
    autodiff also kept the mask and the dropped-out weights: less memory and time (docs/performance.md).
    """
    return _attend_fwd(q, k, v, bias, seed, rate, softcap)[0]


def soft_cap(x: Array, cap: float | None) -> Array:
    """cap * tanh(x / cap): `x` squashed smoothly into (-cap, cap); `x` as is when `cap` is None."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def _attend_fwd(q, k, v, bias, seed, rate, softcap=None):
    scores = soft_cap(jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32), softcap)
    probs = jax.nn.softmax(scores + bias, axis=-1)  # float32 [batch, heads, q, k]
    out = jnp.einsum("bhqk,bhkd->bhqd", dropout(probs.astype(q.dtype), seed, rate), v)
    return out, (q, k, v, bias, seed, probs, None if softcap is None else scores)  # capped scores kept if capping


def _attend_bwd(rate, softcap, residuals, g):
    q, k, v, bias, seed, probs, capped = residuals
    dt = q.dtype
    d_weights = dropout(jnp.einsum("bhqd,bhkd->bhqk", g, v), seed, rate).astype(jnp.float32)
    d_v = product_over_rows(dropout(probs.astype(dt), seed, rate), g)
    d_logits = probs * (d_weights - jnp.sum(d_weights * probs, axis=-1, keepdims=True))  # float32
    summed = tuple(i for i, n in enumerate(bias.shape) if n == 1 and d_logits.shape[i] != 1)
    d_bias = jnp.sum(d_logits, axis=summed, keepdims=True).astype(bias.dtype)
    if softcap is not None:  # d/ds cap * tanh(s / cap) = 1 - tanh(s / cap)^2
        d_logits = d_logits * (1.0 - jnp.square(capped / softcap))  # float32
    d_logits = d_logits.astype(dt)
    d_q = jnp.einsum("bhqk,bhkd->bhqd", d_logits, k)
    d_k = product_over_rows(d_logits, q)
    return d_q, d_k, d_v, d_bias, None


attend.defvjp(_attend_fwd, _attend_bwd)


def heads_major(*xs: Array) -> tuple[Array, ...]:
    """`[batch, len, heads, d_kv]` arrays -> `[batch, heads, len, d_kv]`, with their logical axes."""
    names = ("batch", "activation_heads", "activation_length", "activation_kv")
    return tuple(nn.with_logical_constraint(x.transpose(0, 2, 1, 3), names) for x in xs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def broadcast_batch(x: Array, batch: int) -> Array:
    """`x` [1, ...] repeated to [batch, ...], whose gradient sums over the batch as a matrix-vector product.

    Autodiff's plain reduction over the leading axis runs much slower than the product on XLA:CPU (YNNPACK), e.g.
    for the position-bias gradient `[batch, heads, q, k] -> [heads, q, k]`.
    """
    return jnp.broadcast_to(x, (batch, *x.shape[1:]))


def _broadcast_batch_fwd(x, batch):
    return broadcast_batch(x, batch), None


def _broadcast_batch_bwd(batch, _, g):
    return ((jnp.ones((batch,), g.dtype) @ g.reshape(batch, -1)).reshape(1, *g.shape[1:]),)


broadcast_batch.defvjp(_broadcast_batch_fwd, _broadcast_batch_bwd)


def key_mask_bias(mask: Array) -> Array:
    """`[batch, key_len]` bool (True = attend) -> additive bias `[batch, 1, 1, key_len]` (float32)."""
    return jnp.where(mask, 0.0, MASK_VALUE).astype(jnp.float32)[:, None, None, :]


def _hash32(x: Array) -> Array:
    """A bijective integer hash of uint32 values: two multiply-xorshift rounds, so that every input bit flips about
    half of the output bits (neighbouring indices give unrelated outputs)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def dropout(x: Array, seed: Array | None, rate: float) -> Array:
    """Inverted dropout of `x` whose keep mask hashes `seed` with each element's index (see `Dropout`); `x` as is
    when `seed` is None."""
    if seed is None or rate == 0.0:
        return x
    if rate >= 1.0:
        return jnp.zeros_like(x)
    index = jax.lax.iota(jnp.uint32, x.size).reshape(x.shape)
    keep = _hash32(index ^ _hash32(seed)) >= jnp.uint32(round(rate * 2 ** 32))
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros_like(x))


class Dropout(nn.Module):
    """Inverted dropout whose keep mask is a counter-based hash of each element's index, seeded once per call
    from the module's 'dropout' key.

    Same distribution as `nn.Dropout` (keep probability 1 - rate, kept values scaled by 1 / (1 - rate)) and still
    a pure function of the key, but about 14x cheaper on CPU than drawing threefry bits per element, which took a
    third of a t5-tiny train step. The mask depends only on the key and the element's position in the array the
    model is given: the global batch under the partitioner, so the same on every mesh it splits; one shard's rows
    inside a `shard_map` over the batch, whose caller gives each shard its own key.
    """

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        return dropout(x, self.seed(x.size, deterministic), self.rate)

    def seed(self, size: int, deterministic: bool) -> Array | None:
        """The mask seed (uint32) of one call on `size` elements; None when nothing is dropped."""
        if deterministic or self.rate == 0.0:
            return None
        if self.rate >= 1.0:
            return jnp.zeros((), jnp.uint32)  # everything is dropped: no key needed
        if size >= 2 ** 32:
            raise ValueError(f"Dropout: {size} elements overflow the 32-bit element counter; shard the input")
        return jax.random.bits(self.make_rng("dropout"), (), jnp.uint32)


def param_count(params: Any) -> int:
    """Number of parameter values (array elements) in a params tree."""
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
