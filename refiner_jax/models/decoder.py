"""Decoder-only causal language models in Flax Linen: GPT-2 and the Llama family (Llama, Qwen2, Mistral, Qwen3,
Gemma 3).

One `Decoder` covers both families through `DecoderConfig`:
  * GPT-2: learned positions, LayerNorm with bias, tanh-gelu MLP, a bias on every projection, tied output layer;
  * Llama family: rotary positions in transformers' rotate-half layout (pair i is dims i and i + head_dim/2),
    RMSNorm, SwiGLU MLP, grouped-query attention (`num_kv_heads` < `num_heads`), no biases except Qwen2's on
    query/key/value, tied or untied output layer; rotary frequencies optionally rescaled ('linear', 'llama3').
    Qwen3 adds a norm of each head's queries and keys before the rotation (`qk_norm`). Gemma 3 has (1 + w) norms,
    normalises each block's output too (`post_norms`), scales embeddings by sqrt(d_model), gates with tanh-gelu,
    scales attention by `query_pre_attn_scalar`**-0.5, alternates windowed local layers (their own rotary base,
    `local_rope_theta`) with global ones, and may soft-cap output (and, with `attn_softcap`, attention) logits.
All are pre-norm with a final norm and scale attention logits by head_dim**-0.5 unless the config says otherwise
(`DecoderConfig.attention_scale`). Norm statistics, softmax and logits are float32. Layers with a sliding window
(Mistral, Qwen2, Qwen3, Gemma 3's local layers; `DecoderConfig.layer_window`) attend to the last
`window` real tokens only, in every entry point; the KV cache stays full-length and masks the older slots.

Entry points (pure `model.apply` methods):
  `__call__`       teacher-forced next-token logits `[batch, len, vocab]`;
  `hidden_states`  the final-norm hidden states `[batch, len, d_model]` (for reward or value heads);
  `prefill`        one pass over a batch of prompts into an explicit KV cache pytree (`init_cache`);
  `decode_step`    one token per row against the cache; `models.decoder_sampling.sample_decoder` loops it in
                   the library's sampler (all decoding modes). A `share_prompt` cache keeps each prompt's keys
                   and values once for all its samples' rows (`DecoderConfig.share_prompt_cache`).

Padding: a mask marks the real tokens; positions count real tokens only (each row's first real token is at 0), as
transformers' `generate` numbers left-padded prompts. `prefill` takes left- or right-padded prompts: left padding
(transformers' convention) keeps each row's new tokens right after its prompt; right-padded rows keep their
padding slots in the cache, masked.

Every parameter carries logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`, `length` for the learned
position table); the kv heads of grouped-query attention use `heads` too (`sharding.fit_spec` replicates them when
the tensor axis does not divide their number). Activations carry `batch` and `activation_*` names.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.layers import MASK_VALUE, Dropout, attend, cotangent_barrier, dense, rms_norm, soft_cap

Array = jax.Array


@functools.lru_cache(maxsize=64)
def rope_frequencies(config: DecoderConfig, local: bool = False) -> np.ndarray:
    """Rotation frequency of each dimension pair, `[head_dim // 2]` float32, rescaled as transformers does for rope
    types 'linear' (all divided by the factor) and 'llama3' (long wavelengths divided, short kept, blended between).
    `local`: a local layer's frequencies (`config.local_rope_theta`, never rescaled)."""
    dim = config.head_dim
    theta = config.local_rope_theta if local else config.rope_theta
    freq = np.float32(1.0) / np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    if local:
        return freq
    if config.rope_type == "linear":
        freq = freq / np.float32(config.rope_factor)
    elif config.rope_type == "llama3":
        factor, low, high = config.rope_factor, config.rope_low_freq_factor, config.rope_high_freq_factor
        context = config.rope_original_max_positions
        wavelength = 2 * np.pi / freq
        scaled = np.where(wavelength > context / low, freq / factor, freq)
        smooth = (context / wavelength - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelength >= context / high) & (wavelength <= context / low)
        freq = np.where(medium, blended, scaled)
    return freq.astype(np.float32)


def _rope(x: Array, positions: Array, frequencies: np.ndarray) -> Array:
    """`x` [batch, len, heads, head_dim] rotated by angle position * frequency (`positions` [batch, len])."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(frequencies)  # [batch, len, head_dim/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [batch, len, 1, head_dim]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _param(module: nn.Module, name: str, init, axes: tuple[str, ...], shape: tuple[int, ...]) -> Array:
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, module.config.weight_dtype)


_normal = nn.initializers.normal  # (stddev)
_ZEROS = nn.initializers.zeros_init()
_EMBED = ("batch", "activation_length", "activation_embed")


def _positions(mask: Array) -> Array:
    """Position ids `[batch, len]` int32 counting real tokens (`mask` True) from 0; 0 before a row's first."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)


def _bias(visible: Array) -> Array:
    """`[batch, q, k]` bool (True = attend) -> additive attention bias `[batch, 1, q, k]` (float32)."""
    return jnp.where(visible, 0.0, MASK_VALUE).astype(jnp.float32)[:, None]


def _causal_visible(mask: Array) -> Array:
    """`[batch, len, len]` bool: each token sees itself and the earlier real tokens (`mask` [batch, len])."""
    length = mask.shape[1]
    return jnp.tril(jnp.ones((length, length), bool))[None] & mask[:, None, :]


def _segment_positions(segments: Array) -> Array:
    """Position ids `[batch, len]` counting from 0 at the first token of each run of equal `segments` ids."""
    index = jnp.broadcast_to(jnp.arange(segments.shape[1]), segments.shape)
    starts = jnp.concatenate([jnp.ones_like(segments[:, :1], bool), segments[:, 1:] != segments[:, :-1]], axis=1)
    return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)


def _segment_visible(segments: Array) -> Array:
    """`[batch, len, len]` bool: each token sees itself and the earlier tokens of its own segment (id > 0)."""
    length = segments.shape[1]
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
    return jnp.tril(jnp.ones((length, length), bool))[None] & same


def _layer_biases(config: DecoderConfig, visible: Array, query_counts: Array, key_counts: Array) -> list[Array]:
    """Each layer's attention bias from `visible` [batch, q, k]; a windowed layer (`config.layer_window`) also
    drops the keys `window` or more real tokens before the query. `query_counts` [batch, q] and `key_counts`
    [batch, k] number the real tokens of a row (or the tokens of a segment) in order, so a distance counts real
    tokens only, as transformers counts left-padded rows and packed sequences."""
    biases: dict[int | None, Array] = {}
    for i in range(config.num_layers):
        window = config.layer_window(i)
        if window not in biases:
            near = True if window is None else query_counts[:, :, None] - key_counts[:, None, :] < window
            biases[window] = _bias(visible & near)
    return [biases[config.layer_window(i)] for i in range(config.num_layers)]


class Norm(nn.Module):
    """LayerNorm with bias (GPT-2), RMSNorm or RMSNorm scaled by 1 + w (Gemma 3), over the last axis, whose
    parameters carry the logical axis `axis` (`embed`; `kv` for the per-head query and key norms). Statistics in
    float32."""

    config: DecoderConfig
    axis: str = "embed"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        plus_one = cfg.norm == "rmsnorm_plus_one"
        scale = _param(self, "scale", _ZEROS if plus_one else nn.initializers.ones, (self.axis,), (x.shape[-1],))
        if cfg.norm != "layernorm":
            return rms_norm(x, scale, cfg.norm_eps, cfg.compute_dtype, unit_offset=plus_one)
        x32 = x.astype(jnp.float32)
        bias = _param(self, "bias", _ZEROS, (self.axis,), (x.shape[-1],))
        centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
        y = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + cfg.norm_eps)
        return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(cfg.compute_dtype)


class Attention(nn.Module):
    """Causal multi-head attention with grouped-query key/value heads; `layer` is its layer's index (a local layer
    may rotate by its own base)."""

    config: DecoderConfig
    layer: int = 0

    def setup(self):
        cfg = self.config
        d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        init = _normal(cfg.initializer_range)
        self.query = _param(self, "query", init, ("embed", "heads", "kv"), (d, h, hd))
        self.key = _param(self, "key", init, ("embed", "heads", "kv"), (d, kv, hd))
        self.value = _param(self, "value", init, ("embed", "heads", "kv"), (d, kv, hd))
        # GPT-2's residual-projection scaling: std / sqrt(2 * layers).
        self.out = _param(self, "out", _normal(cfg.initializer_range / np.sqrt(2 * cfg.num_layers)),
                          ("heads", "kv", "embed"), (h, hd, d))
        if cfg.qkv_bias:
            self.query_bias = _param(self, "query_bias", _ZEROS, ("heads", "kv"), (h, hd))
            self.key_bias = _param(self, "key_bias", _ZEROS, ("heads", "kv"), (kv, hd))
            self.value_bias = _param(self, "value_bias", _ZEROS, ("heads", "kv"), (kv, hd))
        if cfg.out_bias:
            self.out_bias = _param(self, "out_bias", _ZEROS, ("embed",), (d,))
        if cfg.qk_norm:
            self.query_norm = Norm(cfg, axis="kv")
            self.key_norm = Norm(cfg, axis="kv")
        self.dropout = Dropout(cfg.dropout_rate)

    def project(self, x: Array, positions: Array) -> tuple[Array, Array, Array]:
        """`x` [batch, len, d_model] -> queries `[batch, len, heads, head_dim]` and keys, values
        `[batch, kv_heads, len, head_dim]` (heads-major, the cache layout), each head's queries and keys normalised
        (`qk_norm`) and then rotated. The three projections run as one row-major 2-D product (`layers.dense`), as in
        `models.t5`."""
        cfg = self.config
        dt = cfg.compute_dtype
        b, length, d = x.shape
        h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        kernel = jnp.concatenate([w.astype(dt).reshape(d, -1) for w in (self.query, self.key, self.value)], axis=1)
        y = dense(x.astype(dt).reshape(b * length, d), kernel)  # [batch * len, (heads + 2 kv_heads) * head_dim]
        q, k, v = jnp.split(y, [h * hd, (h + kv) * hd], axis=1)
        q, k, v = q.reshape(b, length, h, hd), k.reshape(b, length, kv, hd), v.reshape(b, length, kv, hd)
        if cfg.qkv_bias:
            q, k, v = q + self.query_bias.astype(dt), k + self.key_bias.astype(dt), v + self.value_bias.astype(dt)
        if cfg.qk_norm:
            q, k = self.query_norm(q), self.key_norm(k)
        if cfg.position == "rope":
            frequencies = rope_frequencies(cfg, cfg.local_rope(self.layer))
            q, k = _rope(q, positions, frequencies), _rope(k, positions, frequencies)
        q = nn.with_logical_constraint(q, ("batch", "activation_length", "activation_heads", "activation_kv"))
        names = ("batch", "activation_heads", "activation_length", "activation_kv")
        k, v = (nn.with_logical_constraint(t.transpose(0, 2, 1, 3), names) for t in (k, v))
        return q, k, v

    def attend(self, q: Array, k: Array, v: Array, bias: Array, deterministic: bool) -> Array:
        """Queries `q` [batch, q, heads, head_dim] over keys and values `[batch, kv_heads, k, head_dim]`, with
        `bias` (float32, `[batch, 1, q or 1, k]`) -> `[batch, q, d_model]`, through `layers.attend` (its gradient
        written out, the dropout mask recomputed from its seed)."""
        cfg = self.config
        dt = cfg.compute_dtype
        b, q_len, h, hd = q.shape
        kv, k_len = k.shape[1], k.shape[2]
        groups = h // kv
        # Query head i reads kv head i // groups, the order of transformers' repeat_kv. The products run heads-major
        # with a kv head's query groups stacked as rows, [batch, kv, groups * q, head_dim]: XLA:CPU runs them about
        # twice as fast as with the group and query axes apart (gpt2-tiny prefill of 32 x 128 tokens).
        q = q.reshape(b, q_len, kv, groups, hd).transpose(0, 2, 3, 1, 4).reshape(b, kv, groups * q_len, hd)
        q = q * jnp.asarray(cfg.attention_scale, dt)
        if groups > 1 and bias.shape[2] > 1:  # [batch, 1, q, k] -> one row of bias per stacked query row
            bias = jnp.tile(bias, (1, 1, groups, 1))
        seed = self.dropout.seed(b * h * q_len * k_len, deterministic)
        ctx = attend(q, k.astype(dt), v.astype(dt), bias, seed, cfg.dropout_rate,
                     cfg.attn_softcap)  # [batch, kv, groups * q, hd]
        return self._output(ctx.reshape(b, kv, groups, q_len, hd).transpose(0, 3, 1, 2, 4).reshape(b, q_len, h * hd))

    def attend_shared(self, q: Array, k: Array, v: Array, bias: Array, prompt: dict) -> Array:
        """One new query per row, `q` [n, 1, heads, head_dim], over its own generated keys and values `k`, `v`
        `[n, kv_heads, new, head_dim]` (`bias` `[n, 1, 1, new]`) and over its prompt's, shared by the prompt's
        n / batch consecutive rows: `prompt` `{'k', 'v'}` `[batch, kv_heads, P, head_dim]`, `'bias'`
        `[batch, 1, 1, P]` -> `[n, 1, d_model]`. One softmax over both parts: the attention of the rows' whole
        caches, summed in another order. A prompt's part is one product of all its rows' queries with one copy of
        its keys, heads-major with the rows stacked, `[batch, kv_heads, rows * groups, .]`."""
        cfg = self.config
        dt = cfg.compute_dtype
        n, _, h, hd = q.shape
        batch, kv, prompt_len, _ = prompt["k"].shape
        groups, rows = h // kv, n // batch
        stacked = (batch, kv, rows * groups, -1)

        def to_prompts(x):  # [n, kv, groups, m] -> [batch, kv, rows * groups, m]
            return x.reshape(batch, rows, kv, groups, -1).transpose(0, 2, 1, 3, 4).reshape(stacked)

        def to_rows(x):  # the inverse
            return x.reshape(batch, kv, rows, groups, -1).transpose(0, 2, 1, 3, 4).reshape(n, kv, groups, -1)

        q = q.reshape(n, kv, groups, hd) * jnp.asarray(cfg.attention_scale, dt)

        def scores(einsum, q, k):  # float32, soft-capped
            return soft_cap(jnp.einsum(einsum, q, k.astype(dt)).astype(jnp.float32), cfg.attn_softcap)

        own = scores("nhgd,nhsd->nhgs", q, k) + bias  # [n, kv, groups, new]
        logits = jnp.concatenate([scores("bhmd,bhsd->bhms", to_prompts(q), prompt["k"]) + prompt["bias"],
                                  to_prompts(own)], axis=-1)  # [batch, kv, rows * groups, P + new]
        probs = jax.nn.softmax(logits, axis=-1).astype(dt)
        ctx = (to_rows(jnp.einsum("bhms,bhsd->bhmd", probs[..., :prompt_len], prompt["v"].astype(dt)))
               + jnp.einsum("nhgs,nhsd->nhgd", to_rows(probs[..., prompt_len:]), v.astype(dt)))
        return self._output(ctx.reshape(n, 1, h * hd))

    def _output(self, ctx: Array) -> Array:
        """The heads' concatenated outputs `[batch, q, heads * head_dim]` -> `[batch, q, d_model]`."""
        cfg = self.config
        dt = cfg.compute_dtype
        out = dense(ctx, self.out.astype(dt).reshape(-1, cfg.d_model))
        if cfg.out_bias:
            out = out + self.out_bias.astype(dt)
        return nn.with_logical_constraint(out, _EMBED)


class MLP(nn.Module):
    """Feed-forward block: tanh-gelu (GPT-2), SwiGLU, silu(x W_gate) * (x W_up) (Llama family), or GeGLU,
    tanh-gelu(x W_gate) * (x W_up) (Gemma 3)."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        dt = cfg.compute_dtype

        def project(name: str, y: Array, axes: tuple[str, str], std: float) -> Array:
            shape = (y.shape[-1], cfg.d_ff if axes[1] == "mlp" else cfg.d_model)
            y = dense(y, _param(self, name, _normal(std), axes, shape).astype(dt))
            if cfg.mlp_bias:
                y = y + _param(self, f"{name}_bias", _ZEROS, axes[1:], shape[1:]).astype(dt)
            return y

        x = x.astype(dt)
        std = cfg.initializer_range
        if cfg.mlp in ("swiglu", "geglu"):
            gate = project("wi_0", x, ("embed", "mlp"), std)
            gate = jax.nn.silu(gate) if cfg.mlp == "swiglu" else jax.nn.gelu(gate, approximate=True)
            h = gate * project("wi_1", x, ("embed", "mlp"), std)
        else:
            h = jax.nn.gelu(project("wi", x, ("embed", "mlp"), std), approximate=True)
        h = nn.with_logical_constraint(h, ("batch", "activation_length", "activation_mlp"))
        return project("wo", h, ("mlp", "embed"), std / np.sqrt(2 * cfg.num_layers))


class Layer(nn.Module):
    """Pre-norm block number `index`: x + attention(norm(x)), then x + mlp(norm(x)); with `post_norms`, each
    branch's output is normalised too before it is added (x + norm(attention(norm(x))), Gemma 3)."""

    config: DecoderConfig
    index: int = 0

    def setup(self):
        self.attention_norm = Norm(self.config)
        self.attention = Attention(self.config, self.index)
        self.mlp_norm = Norm(self.config)
        self.mlp = MLP(self.config)
        if self.config.post_norms:
            self.attention_out_norm = Norm(self.config)
            self.mlp_out_norm = Norm(self.config)
        self.dropout = Dropout(self.config.dropout_rate)

    def __call__(self, x: Array, positions: Array, bias: Array, deterministic: bool, cache: dict | None = None,
                 index: Array | None = None, prompt: dict | None = None) -> tuple[Array, dict]:
        """`x` [batch, len, d_model] at `positions` [batch, len] -> (output, the keys and values attended over).

        Without `cache`, the tokens attend among themselves. With `cache` (this layer's `'k'`, `'v'`
        `[batch, kv_heads, max_len, head_dim]`), their keys and values are first written at slot `index` and the
        tokens attend over the whole cache; `bias` masks the slots not to read. With `prompt` as well (one token a
        row), the rows also attend over their prompt's shared keys and values (`Attention.attend_shared`).
        """
        q, k, v = self.attention.project(self.attention_norm(x), positions)
        if cache is not None:
            k, v = (jax.lax.dynamic_update_slice(cache[n], t.astype(cache[n].dtype), (0, 0, index, 0))
                    for n, t in (("k", k), ("v", v)))
        if prompt is None:
            attended = self.attention.attend(q, k, v, bias, deterministic)
        else:
            attended = self.attention.attend_shared(q, k, v, bias, prompt)
        if self.config.post_norms:
            attended = self.attention_out_norm(attended)
        x = x + self.dropout(attended, deterministic=deterministic)
        fed = self.mlp(self.mlp_norm(x))
        if self.config.post_norms:
            fed = self.mlp_out_norm(fed)
        x = x + self.dropout(fed, deterministic=deterministic)
        return nn.with_logical_constraint(x, _EMBED), {"k": k, "v": v}


class Decoder(nn.Module):
    """The decoder-only LM. Parameters: `token_embedder`, `position_embedder` (learned positions only),
    `layers_{i}/*`, `final_norm`, `lm_head` (untied only); `models.hf_decoder` maps them to transformers names."""

    config: DecoderConfig

    def setup(self):
        cfg = self.config
        init = _normal(cfg.initializer_range)
        self.token_embedder = _param(self, "token_embedder", init, ("vocab", "embed"), (cfg.vocab_size, cfg.d_model))
        if cfg.position == "learned":
            self.position_embedder = _param(self, "position_embedder", init, ("length", "embed"),
                                            (cfg.max_positions, cfg.d_model))
        # `deterministic` (positional argument 4, counting self) is static under remat.
        layer = nn.remat(Layer, static_argnums=(4,)) if cfg.remat else Layer
        self.layers = [layer(cfg, i, name=f"layers_{i}") for i in range(cfg.num_layers)]
        self.final_norm = Norm(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = _param(self, "lm_head", init, ("embed", "vocab"), (cfg.d_model, cfg.vocab_size))
        self.dropout = Dropout(cfg.dropout_rate)

    def _embed(self, tokens: Array, positions: Array) -> Array:
        dt = self.config.compute_dtype
        x = jnp.take(self.token_embedder, tokens, axis=0)  # [batch, len, d_model]
        if self.config.embed_scale:  # sqrt(d_model) rounded to float32, then to the embedding's dtype (transformers)
            x = x * jnp.asarray(np.float32(np.sqrt(self.config.d_model)), x.dtype)
        x = x.astype(dt)
        if self.config.position == "learned":
            x = x + jnp.take(self.position_embedder, positions, axis=0).astype(dt)
        return nn.with_logical_constraint(x, _EMBED)

    def hidden_states(self, tokens: Array, positions: Array | None = None, attention_mask: Array | None = None,
                      deterministic: bool = True, segment_ids: Array | None = None) -> Array:
        """Final-norm hidden states `[batch, len, d_model]` of `tokens` [batch, len].

        `attention_mask` [batch, len] is True (or 1) at real tokens; padding is never attended to. `positions`
        defaults to counting real tokens from 0 in each row. Packed rows (several sequences one after another)
        pass `segment_ids` [batch, len] instead of the mask: 1, 2, ... numbers the sequences, 0 marks padding; a
        token attends only within its sequence and positions restart at 0 with each.
        """
        if segment_ids is not None:
            positions = _segment_positions(segment_ids) if positions is None else positions
            visible = _segment_visible(segment_ids)
            counts = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)  # segments are contiguous
        else:
            mask = jnp.ones(tokens.shape, bool) if attention_mask is None else attention_mask.astype(bool)
            positions = _positions(mask) if positions is None else positions
            visible, counts = _causal_visible(mask), jnp.cumsum(mask, axis=1)
        biases = _layer_biases(self.config, visible, counts, counts)
        x = self.dropout(self._embed(tokens, positions), deterministic=deterministic)
        for layer, bias in zip(self.layers, biases):
            x, _ = layer(cotangent_barrier(x), positions, bias, deterministic, None, None)
        return self.final_norm(x)

    def __call__(self, tokens: Array, positions: Array | None = None, attention_mask: Array | None = None,
                 deterministic: bool = True, segment_ids: Array | None = None) -> Array:
        """Next-token logits `[batch, len, vocab]` (float32); arguments as in `hidden_states`."""
        return self.logits(self.hidden_states(tokens, positions, attention_mask, deterministic, segment_ids))

    def logits(self, h: Array) -> Array:
        """Hidden states `[batch, len, d_model]` -> logits `[batch, len, vocab]` (float32), soft-capped when
        `logit_softcap` is set."""
        dt = self.config.compute_dtype
        kernel = self.token_embedder.astype(dt).T if self.config.tie_embeddings else self.lm_head.astype(dt)
        logits = soft_cap(dense(h.astype(dt), kernel).astype(jnp.float32), self.config.logit_softcap)
        return nn.with_logical_constraint(logits, ("batch", "activation_length", "activation_vocab"))

    def prefill(self, tokens: Array, mask: Array, cache: dict) -> tuple[Array, dict]:
        """Runs prompts `tokens` [batch, P] (real tokens where `mask` [batch, P] is True, left- or right-padded) in
        one pass and writes their keys and values into slots 0..P-1 of the empty `cache` (P <= its max_len).
        Returns the logits `[batch, vocab]` after each row's last real token, and the cache."""
        mask = mask.astype(bool)
        positions = _positions(mask)
        length = tokens.shape[1]
        counts = jnp.cumsum(mask, axis=1)
        biases = _layer_biases(self.config, _causal_visible(mask), counts, counts)
        x = self._embed(tokens, positions)
        layers = []
        for layer, layer_cache, bias in zip(self.layers, cache["layers"], biases):
            x, kv = layer(x, positions, bias, True, None, None)
            layers.append({name: jax.lax.dynamic_update_slice(layer_cache[name], kv[name].astype(
                layer_cache[name].dtype), (0, 0, 0, 0)) for name in ("k", "v")})
        last = jnp.max(jnp.where(mask, jnp.arange(length), 0), axis=1)  # [batch] slot of the last real token
        h = self.final_norm(jnp.take_along_axis(x, last[:, None, None], axis=1))  # [batch, 1, d_model]
        valid = jax.lax.dynamic_update_slice(jnp.zeros_like(cache["valid"]), mask, (0, 0))
        return self.logits(h)[:, 0], {"layers": tuple(layers), "valid": valid, "index": jnp.int32(length),
                                      "position": jnp.sum(mask, axis=1, dtype=jnp.int32)}

    def decode_step(self, token: Array, cache: dict) -> tuple[Array, dict]:
        """Logits `[batch, vocab]` after one more token per row (`token` [batch]), and the updated cache: an
        `init_cache` one, or a `share_prompt` one (each prompt's keys and values kept once for its rows)."""
        index, position = cache["index"], cache["position"]
        valid = jax.lax.dynamic_update_slice(cache["valid"], jnp.ones((token.shape[0], 1), bool), (0, index))
        query = position[:, None] + 1  # the new token is real token number position + 1 of its row
        prompts = [None] * self.config.num_layers
        if "prompt" in cache:  # a prompt's rows advance together: one bias a prompt over its slots
            shared = cache["prompt"]
            batch = shared["valid"].shape[0]
            rows = token.shape[0] // batch
            prompt_counts = jnp.cumsum(shared["valid"], axis=1)  # [prompts, P]
            prompts = [dict(kv, bias=bias) for kv, bias in zip(shared["layers"], _layer_biases(
                self.config, shared["valid"][:, None, :], query.reshape(batch, rows)[:, :1], prompt_counts))]
            key_counts = jnp.repeat(prompt_counts[:, -1:], rows, axis=0) + jnp.cumsum(valid, axis=1)
        else:
            key_counts = jnp.cumsum(valid, axis=1)
        biases = _layer_biases(self.config, valid[:, None, :], query, key_counts)  # [batch, 1, 1, slots] per layer
        x = self._embed(token[:, None], position[:, None])
        layers = []
        for layer, layer_cache, bias, prompt in zip(self.layers, cache["layers"], biases, prompts):
            x, kv = layer(x, position[:, None], bias, True, layer_cache, index, prompt)
            layers.append(kv)
        logits = self.logits(self.final_norm(x))[:, 0]
        return logits, {**cache, "layers": tuple(layers), "valid": valid, "index": index + 1,
                        "position": position + 1}


def init_cache(config: DecoderConfig, batch: int, max_len: int) -> dict:
    """Empty KV cache for `batch` rows of up to `max_len` tokens (prompt and generated). A pytree of:
      `layers`: per layer `{'k', 'v'}` `[batch, kv_heads, max_len, head_dim]` (compute dtype);
      `valid`: `[batch, max_len]` bool, the slots holding real tokens;
      `index`: scalar int32, the slot the next token is written to (the same for every row);
      `position`: `[batch]` int32, the position id of each row's next token.
    Writing past `max_len` is not checked: size it for the prompt plus every generated token.
    """
    shape = (batch, config.num_kv_heads, max_len, config.head_dim)
    dt = config.compute_dtype
    return {"layers": tuple({"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)} for _ in range(config.num_layers)),
            "valid": jnp.zeros((batch, max_len), bool), "index": jnp.zeros((), jnp.int32),
            "position": jnp.zeros((batch,), jnp.int32)}


def share_prompt(cache: dict, num_samples: int, new_slots: int) -> dict:
    """A `prefill`ed cache of `batch` prompts -> the cache of their `num_samples` continuations each (consecutive
    rows of `[batch * num_samples]`), for `decode_step`: the prompts' keys and values stay one copy each
    (`'prompt'`: `'layers'`, `'valid'`), and the rows get `new_slots` slots of their own (`'layers'`, `'valid'`,
    `'index'` from 0). Attention then reads a prompt's keys once for all its rows instead of once a row."""
    batch, kv_heads, _, head_dim = cache["layers"][0]["k"].shape
    shape = (batch * num_samples, kv_heads, new_slots, head_dim)
    return {"prompt": {"layers": cache["layers"], "valid": cache["valid"]},
            "layers": tuple({name: jnp.zeros(shape, layer[name].dtype) for name in ("k", "v")}
                            for layer in cache["layers"]),
            "valid": jnp.zeros((batch * num_samples, new_slots), bool), "index": jnp.zeros((), jnp.int32),
            "position": jnp.repeat(cache["position"], num_samples)}
