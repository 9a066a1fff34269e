"""T5 encoder-decoder in Flax Linen, numerically matching the reference T5 (v1.0 / UnifiedQA and v1.1 / Flan-T5).

Entry points (all pure `model.apply` methods):
  `__call__`     teacher-forced logits, for training and scoring;
  `encode`       encoder outputs;
  `decode`       teacher-forced decoder logits from encoder outputs;
  `cross_kv`     the cross-attention keys/values of every decoder layer, computed once per prompt;
  `decode_step`  one decoder token with an explicit self-attention KV cache (`T5.init_cache`), for the sampler;
  `output_kernel` the output projection as a `[d_model, vocab]` matrix, computed once for a decode loop.

T5 details that differ from a textbook Transformer (NOTE: each one matters for parity):
  * RMS norm without mean subtraction or bias, computed in float32;
  * attention logits are NOT scaled by 1/sqrt(d_kv) (the scale lives in the initialisers);
  * relative position buckets (bidirectional in the encoder, causal in the decoder) own one bias table per stack,
    shared by all its layers; cross-attention has no position bias;
  * no biases anywhere; no sqrt(d) scaling of input embeddings;
  * v1.0 ties the output layer to the embedding and rescales the decoder output by d_model**-0.5;
    v1.1 has a separate `logits_dense` and no rescale; v1.1's FFN is gated-gelu (tanh approximation).
Tokens: pad 0, eos 1; the decoder starts from token 0. `T5Config` and the named presets: `models/t5_config.py`.

Every parameter carries logical axis names (`embed`, `vocab`, `heads`, `kv`, `mlp`, `relpos_buckets`) and
activations carry `activation_*` names; `refiner_jax.sharding` maps both to mesh axes.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from refiner_jax.models.layers import (MASK_VALUE, Dropout, attend, broadcast_batch, dense, heads_major,
                                      key_mask_bias, rms_norm)
from refiner_jax.models.t5_config import T5Config

DECODER_START_ID = 0

Array = jax.Array


def shift_right(targets: Array) -> Array:
    """Decoder inputs for teacher forcing: targets shifted one step right, starting with the start token."""
    start = jnp.full_like(targets[:, :1], DECODER_START_ID)
    return jnp.concatenate([start, targets[:, :-1]], axis=1)


@functools.lru_cache(maxsize=64)
def relative_position_buckets(q_len: int, k_len: int, bidirectional: bool, num_buckets: int,
                              max_distance: int, q_offset: int = 0) -> np.ndarray:
    """Bucket id of every (query, key) pair, `[q_len, k_len]` int32 (static: computed once on the host).

    Small distances get one bucket each, larger ones logarithmically wider buckets up to `max_distance`; the
    bidirectional variant spends half the buckets on keys after the query. Float32 arithmetic as in the reference.
    """
    query = np.arange(q_len, dtype=np.int64)[:, None] + q_offset
    key = np.arange(k_len, dtype=np.int64)[None, :]
    rel = key - query
    buckets = np.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).astype(np.int64) * num_buckets
        dist = np.abs(rel)
    else:
        dist = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        scaled = (np.log(dist.astype(np.float32) / np.float32(max_exact))
                  / np.float32(np.log(max_distance / max_exact)) * np.float32(num_buckets - max_exact))
    large = max_exact + np.nan_to_num(scaled, neginf=0.0).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    buckets += np.where(dist < max_exact, dist, large)
    return buckets.astype(np.int32)


def _normal(std: float):
    return nn.initializers.normal(stddev=std)


class RMSNorm(nn.Module):
    """T5 layer norm: scale only, no mean subtraction, statistics in float32."""

    config: T5Config

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                           (x.shape[-1],), cfg.weight_dtype)
        return rms_norm(x, scale, cfg.layer_norm_epsilon, cfg.compute_dtype)


class RelativePositionBias(nn.Module):
    """The per-stack relative position bias table `[buckets, heads]` and its lookup."""

    config: T5Config
    bidirectional: bool

    def setup(self):
        cfg = self.config
        self.rel_embedding = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(_normal(cfg.initializer_factor * cfg.d_model ** -0.5),
                                         ("relpos_buckets", "heads")),
            (cfg.relative_attention_num_buckets, cfg.num_heads), cfg.weight_dtype)

    def __call__(self, q_len: int, k_len: int) -> Array:
        """Bias for a full [q_len, k_len] attention: `[1, heads, q_len, k_len]`."""
        cfg = self.config
        buckets = relative_position_buckets(q_len, k_len, self.bidirectional, cfg.relative_attention_num_buckets,
                                            cfg.relative_attention_max_distance)
        bias = jnp.take(self.rel_embedding, jnp.asarray(buckets), axis=0)  # [q, k, heads]
        return jnp.transpose(bias, (2, 0, 1))[None].astype(jnp.float32)

    def row(self, index: Array, k_len: int) -> Array:
        """Bias for the single query at traced position `index` against keys 0..k_len-1: `[1, heads, 1, k_len]`."""
        cfg = self.config
        table = relative_position_buckets(k_len, k_len, self.bidirectional, cfg.relative_attention_num_buckets,
                                          cfg.relative_attention_max_distance)
        buckets = jax.lax.dynamic_index_in_dim(jnp.asarray(table), index, axis=0, keepdims=False)  # [k_len]
        bias = jnp.take(self.rel_embedding, buckets, axis=0)  # [k_len, heads]
        return jnp.transpose(bias, (1, 0))[None, :, None, :].astype(jnp.float32)



class Attention(nn.Module):
    """Multi-head attention without logit scaling; keys/values can be projected once and reused (`project_kv`)."""

    config: T5Config

    def setup(self):
        cfg = self.config
        f = cfg.initializer_factor
        inner = cfg.num_heads * cfg.d_kv
        shape_in = (cfg.d_model, cfg.num_heads, cfg.d_kv)
        axes_in = ("embed", "heads", "kv")
        self.query = self.param("query", nn.with_logical_partitioning(_normal(f * (cfg.d_model * cfg.d_kv) ** -0.5),
                                                                      axes_in), shape_in, cfg.weight_dtype)
        self.key = self.param("key", nn.with_logical_partitioning(_normal(f * cfg.d_model ** -0.5), axes_in),
                              shape_in, cfg.weight_dtype)
        self.value = self.param("value", nn.with_logical_partitioning(_normal(f * cfg.d_model ** -0.5), axes_in),
                                shape_in, cfg.weight_dtype)
        self.out = self.param("out", nn.with_logical_partitioning(_normal(f * inner ** -0.5), ("heads", "kv", "embed")),
                              (cfg.num_heads, cfg.d_kv, cfg.d_model), cfg.weight_dtype)
        self.dropout = Dropout(cfg.dropout_rate)

    def project_kv(self, x: Array) -> tuple[Array, Array]:
        """Keys and values of `x` [batch, len, d_model] -> two `[batch, heads, len, d_kv]`.

        Heads before length: the decode cache is written one position at a time and read whole every step, and
        this layout lets XLA read it without a transpose.
        """
        return heads_major(*self.project(x, "key", "value"))

    def __call__(self, x: Array, bias: Array, deterministic: bool, kv: tuple[Array, Array] | None = None) -> Array:
        """Attend from `x` [batch, q, d_model] over itself, or over keys/values `kv` (two `[batch, heads, k, d_kv]`
        from `project_kv`) when given.

        Self-attention projects queries, keys and values in one product, and the attention products run
        heads-major (`attend`): from `[batch, q, heads, d_kv]` queries XLA:CPU copied operands transposed inside
        the products. Both together took a t5-tiny train step 1-4% less time on a 2-core CPU, a t5-small one 2%.
        `bias` (float32, `[batch or 1, heads or 1, q or 1, k]`) holds position bias and masks.
        """
        cfg = self.config
        dt = cfg.compute_dtype
        b, q_len = x.shape[:2]
        if kv is None:
            q, k, v = heads_major(*self.project(x, "query", "key", "value"))
        else:
            (q,), (k, v) = heads_major(*self.project(x, "query")), kv
        seed = self.dropout.seed(b * cfg.num_heads * q_len * k.shape[2], deterministic)
        ctx = attend(q, k, v, bias, seed, cfg.dropout_rate)  # [batch, heads, q, d_kv]
        ctx = ctx.transpose(0, 2, 1, 3).reshape(b, q_len, -1)  # [batch, q, heads * d_kv]
        out = dense(ctx, self.out.astype(dt).reshape(-1, cfg.d_model))
        return nn.with_logical_constraint(out, ("batch", "activation_length", "activation_embed"))

    def project(self, x: Array, *names: str) -> tuple[Array, ...]:
        """`x` [batch, len, d_model] through the named `[d_model, heads, d_kv]` kernels ('query', 'key', 'value')
        -> one `[batch, len, heads, d_kv]` per name, computed as a single row-major 2-D matmul (`dense`).

        In the decode loop, einsums to heads-major layouts made XLA:CPU copy a transposed kernel (and `x`) on every
        step; a row-major 2-D product reads both as stored. The kernels' concatenation is loop-invariant, so XLA
        hoists it out of the loop.
        """
        cfg = self.config
        dt = cfg.compute_dtype
        b, length, d = x.shape
        kernel = jnp.concatenate([getattr(self, name).astype(dt).reshape(d, -1) for name in names], axis=1)
        y = dense(x.astype(dt).reshape(b * length, d), kernel)  # [batch * len, len(names) * heads * d_kv]
        return tuple(part.reshape(b, length, cfg.num_heads, cfg.d_kv) for part in jnp.split(y, len(names), axis=1))

    def decode(self, q: Array, keys: Array, values: Array, bias: Array) -> Array:
        """Inference attention of queries `q` [batch, q, heads, d_kv] (from `project`) over keys and values
        `[batch, heads, k, d_kv]` (from `project_kv`) -> `[batch, q, d_model]`; the same result as `__call__`,
        without dropout."""
        cfg = self.config
        dt = cfg.compute_dtype
        b, q_len = q.shape[:2]
        logits = jnp.einsum("bqhd,bhkd->bhqk", q, keys).astype(jnp.float32) + bias  # [batch, heads, q, k]
        weights = jax.nn.softmax(logits, axis=-1).astype(dt)
        ctx = jnp.einsum("bhqk,bhkd->bqhd", weights, values).reshape(b * q_len, -1)  # [batch * q, heads * d_kv]
        out = ctx @ self.out.astype(dt).reshape(-1, cfg.d_model)
        return nn.with_logical_constraint(out.reshape(b, q_len, cfg.d_model),
                                          ("batch", "activation_length", "activation_embed"))


class MLP(nn.Module):
    """Feed-forward block: relu (v1.0) or gated tanh-gelu (v1.1), dropout after the activation."""

    config: T5Config

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        cfg = self.config
        dt = cfg.compute_dtype
        f = cfg.initializer_factor
        wi_init = nn.with_logical_partitioning(_normal(f * cfg.d_model ** -0.5), ("embed", "mlp"))
        shape = (cfg.d_model, cfg.d_ff)
        x = x.astype(dt)
        if cfg.feed_forward_proj == "gated-gelu":
            wi_0 = self.param("wi_0", wi_init, shape, cfg.weight_dtype)
            wi_1 = self.param("wi_1", wi_init, shape, cfg.weight_dtype)
            h = jax.nn.gelu(dense(x, wi_0.astype(dt)), approximate=True) * dense(x, wi_1.astype(dt))
        else:
            wi = self.param("wi", wi_init, shape, cfg.weight_dtype)
            h = jax.nn.relu(dense(x, wi.astype(dt)))
        h = nn.with_logical_constraint(h, ("batch", "activation_length", "activation_mlp"))
        h = Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
        wo = self.param("wo", nn.with_logical_partitioning(_normal(f * cfg.d_ff ** -0.5), ("mlp", "embed")),
                        (cfg.d_ff, cfg.d_model), cfg.weight_dtype)
        return dense(h, wo.astype(dt))


class EncoderLayer(nn.Module):
    config: T5Config

    def setup(self):
        self.pre_attention_layer_norm = RMSNorm(self.config)
        self.attention = Attention(self.config)
        self.pre_mlp_layer_norm = RMSNorm(self.config)
        self.mlp = MLP(self.config)
        self.dropout = Dropout(self.config.dropout_rate)

    def __call__(self, x: Array, bias: Array, deterministic: bool) -> Array:
        h = self.pre_attention_layer_norm(x)
        x = x + self.dropout(self.attention(h, bias, deterministic), deterministic=deterministic)
        h = self.pre_mlp_layer_norm(x)
        x = x + self.dropout(self.mlp(h, deterministic), deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "activation_length", "activation_embed"))


class DecoderLayer(nn.Module):
    config: T5Config

    def setup(self):
        self.pre_self_attention_layer_norm = RMSNorm(self.config)
        self.self_attention = Attention(self.config)
        self.pre_cross_attention_layer_norm = RMSNorm(self.config)
        self.encoder_decoder_attention = Attention(self.config)
        self.pre_mlp_layer_norm = RMSNorm(self.config)
        self.mlp = MLP(self.config)
        self.dropout = Dropout(self.config.dropout_rate)

    def _mlp_block(self, x, deterministic):
        h = self.pre_mlp_layer_norm(x)
        x = x + self.dropout(self.mlp(h, deterministic), deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "activation_length", "activation_embed"))

    def __call__(self, x, encoded, self_bias, cross_bias, deterministic: bool):
        h = self.pre_self_attention_layer_norm(x)
        x = x + self.dropout(self.self_attention(h, self_bias, deterministic), deterministic=deterministic)
        h = self.pre_cross_attention_layer_norm(x)
        cross_kv = self.encoder_decoder_attention.project_kv(encoded)
        attended = self.encoder_decoder_attention(h, cross_bias, deterministic, kv=cross_kv)
        return self._mlp_block(x + self.dropout(attended, deterministic=deterministic), deterministic)

    def cross_kv(self, encoded: Array) -> tuple[Array, Array]:
        return self.encoder_decoder_attention.project_kv(encoded)

    def step(self, x, index, cache, cross_k, cross_v, self_bias, cross_bias):
        """One position `x` [batch, 1, d_model] at `index`; writes its key/value into `cache` and attends over it."""
        h = self.pre_self_attention_layer_norm(x)
        q, k, v = self.self_attention.project(h, "query", "key", "value")  # [batch, 1, heads, d_kv]
        zero = jnp.zeros((), jnp.int32)
        start = (zero, zero, index, zero)
        keys = jax.lax.dynamic_update_slice(cache["k"], k.transpose(0, 2, 1, 3).astype(cache["k"].dtype), start)
        values = jax.lax.dynamic_update_slice(cache["v"], v.transpose(0, 2, 1, 3).astype(cache["v"].dtype), start)
        x = x + self.self_attention.decode(q, keys, values, self_bias)
        h = self.pre_cross_attention_layer_norm(x)
        n, length, d = h.shape
        prompts = cross_k.shape[0]
        if n != prompts:  # the samples of a prompt share its cross K/V: fold them into the query axis
            h = h.reshape(prompts, n // prompts * length, d)
        (q,) = self.encoder_decoder_attention.project(h, "query")
        x = x + self.encoder_decoder_attention.decode(q, cross_k, cross_v, cross_bias).reshape(n, length, d)
        return self._mlp_block(x, True), {"k": keys, "v": values}


def _layer_class(cls, config: T5Config):
    # `deterministic` (positional argument 3 for the encoder, 5 for the decoder, counting self) is static.
    if not config.remat:
        return cls
    return nn.remat(cls, static_argnums=(3,) if cls is EncoderLayer else (5,))


class T5(nn.Module):
    """The T5 encoder-decoder. Parameters: `token_embedder`, `encoder/*`, `decoder/*` (see `models.hf` for the
    mapping to transformers names)."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = self.param(
            "token_embedder", nn.with_logical_partitioning(_normal(cfg.initializer_factor), ("vocab", "embed")),
            (cfg.vocab_size, cfg.d_model), cfg.weight_dtype)
        self.encoder = Encoder(cfg)
        self.decoder = T5Decoder(cfg)

    def _embed(self, tokens: Array) -> Array:
        x = jnp.take(self.token_embedder, tokens, axis=0).astype(self.config.compute_dtype)
        return nn.with_logical_constraint(x, ("batch", "activation_length", "activation_embed"))

    def encode(self, encoder_input_tokens: Array, enable_dropout: bool = False) -> Array:
        """Encoder outputs `[batch, enc_len, d_model]`; pad tokens (id 0) are masked as keys."""
        return self.encoder(self._embed(encoder_input_tokens), encoder_input_tokens > 0, not enable_dropout)

    def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array,
               enable_dropout: bool = False) -> Array:
        """Teacher-forced next-token logits `[batch, dec_len, vocab]` (float32)."""
        h = self.decoder(self._embed(decoder_input_tokens), encoded, encoder_input_tokens > 0, not enable_dropout)
        return self._logits(h)

    def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
                 enable_dropout: bool = False) -> Array:
        """Logits `[batch, dec_len, vocab]` (float32) of the decoder fed `decoder_input_tokens`."""
        encoded = self.encode(encoder_input_tokens, enable_dropout)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, enable_dropout)

    def hidden_states(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
                      enable_dropout: bool = False) -> Array:
        """The decoder's final-norm outputs `[batch, dec_len, d_model]`, before the output projection (reward
        heads read them; `logits` turns them into next-token logits)."""
        encoded = self.encode(encoder_input_tokens, enable_dropout)
        return self.decoder(self._embed(decoder_input_tokens), encoded, encoder_input_tokens > 0, not enable_dropout)

    def logits(self, h: Array) -> Array:
        """Hidden states `[..., d_model]` -> next-token logits `[..., vocab]` (float32)."""
        return self._logits(h)

    def cross_kv(self, encoded: Array) -> tuple[tuple[Array, Array], ...]:
        """Per decoder layer, the cross-attention keys and values `[batch, heads, enc_len, d_kv]` of `encoded`, for
        `decode_step`."""
        return self.decoder.cross_kv(encoded)

    def decode_step(self, tokens: Array, index: Array, cache: dict, cross_kv: tuple, encoder_mask: Array,
                    output_kernel: Array | None = None):
        """Logits `[batch, vocab]` for the token after `tokens` [batch] at position `index`, and the updated cache.

        `cache` comes from `T5.init_cache` (then from the previous step), `cross_kv` from `cross_kv`,
        `encoder_mask` [prompts, enc_len] is True at real (non-pad) prompt tokens. `cross_kv` and `encoder_mask` may
        cover `prompts` = batch / k prompts whose k samples are adjacent rows of `tokens`: the samples then share
        one copy of their prompt's cross-attention keys/values instead of k. `output_kernel` (from `output_kernel`,
        computed once before a decode loop) replaces the model's own output projection.
        """
        x = self._embed(tokens[:, None])
        h, cache = self.decoder.step(x, index, cache, cross_kv, encoder_mask)
        return self._logits(h, output_kernel)[:, 0], cache

    def output_kernel(self) -> Array:
        """The output projection as one `[d_model, vocab]` matrix: the tied embedding transposed (v1.0) or the
        untied kernel (v1.1).

        XLA:CPU's Eigen matmul multiplies by the embedding's `[vocab, d_model]` layout at about half the speed of
        this one, and a transpose written next to the product is folded back into it; the sampler materialises
        this copy once, outside its decode loop.
        """
        if self.config.tie_word_embeddings:
            return self.token_embedder.astype(self.config.compute_dtype).T
        return self.decoder.logits_dense.variables["params"]["kernel"].astype(self.config.compute_dtype)

    def _logits(self, h: Array, output_kernel: Array | None = None) -> Array:
        cfg = self.config
        dt = cfg.compute_dtype
        if cfg.tie_word_embeddings:
            h = h * (cfg.d_model ** -0.5)
        if output_kernel is not None:
            logits = h.astype(dt) @ output_kernel.astype(dt)
        elif cfg.tie_word_embeddings:
            logits = dense(h.astype(dt), self.token_embedder.astype(dt).T)
        else:
            logits = self.decoder.logits_dense(h)
        logits = logits.astype(jnp.float32)
        return nn.with_logical_constraint(logits, ("batch", "activation_length", "activation_vocab"))

    @staticmethod
    def init_cache(config: T5Config, batch: int, max_len: int) -> dict:
        """Empty self-attention cache: per decoder layer keys `'k'` and values `'v'` `[batch, heads, max_len, d_kv]`."""
        dt = config.compute_dtype
        shape = (batch, config.num_heads, max_len, config.d_kv)
        return {f"layers_{i}": {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)}
                for i in range(config.n_decoder_layers)}


class LogitsDense(nn.Module):
    """The untied (v1.1) output projection `[d_model, vocab]`."""

    config: T5Config

    @nn.compact
    def __call__(self, h: Array) -> Array:
        cfg = self.config
        init = _normal(cfg.initializer_factor * cfg.d_model ** -0.5)
        kernel = self.param("kernel", nn.with_logical_partitioning(init, ("embed", "vocab")),
                            (cfg.d_model, cfg.vocab_size), cfg.weight_dtype)
        return dense(h.astype(cfg.compute_dtype), kernel.astype(cfg.compute_dtype))


class Encoder(nn.Module):
    config: T5Config

    def setup(self):
        cfg = self.config
        self.relpos_bias = RelativePositionBias(cfg, bidirectional=True)
        layer = _layer_class(EncoderLayer, cfg)
        self.layers = [layer(cfg, name=f"layers_{i}") for i in range(cfg.num_layers)]
        self.encoder_norm = RMSNorm(cfg)
        self.dropout = Dropout(cfg.dropout_rate)

    def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
        length = x.shape[1]
        # [batch, heads, len, len]
        bias = broadcast_batch(self.relpos_bias(length, length), x.shape[0]) + key_mask_bias(mask)
        x = self.dropout(x, deterministic=deterministic)
        for layer in self.layers:
            x = layer(x, bias, deterministic)
        return self.dropout(self.encoder_norm(x), deterministic=deterministic)


class T5Decoder(nn.Module):
    """T5's decoder stack (self-attention, cross-attention to the encoder, MLP per layer)."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.relpos_bias = RelativePositionBias(cfg, bidirectional=False)
        layer = _layer_class(DecoderLayer, cfg)
        self.layers = [layer(cfg, name=f"layers_{i}") for i in range(cfg.n_decoder_layers)]
        self.decoder_norm = RMSNorm(cfg)
        self.dropout = Dropout(cfg.dropout_rate)
        if not cfg.tie_word_embeddings:
            self.logits_dense = LogitsDense(cfg)

    def __call__(self, x: Array, encoded: Array, encoder_mask: Array, deterministic: bool) -> Array:
        length = x.shape[1]
        causal = jnp.tril(jnp.ones((length, length), bool))
        self_bias = self.relpos_bias(length, length) + jnp.where(causal, 0.0, MASK_VALUE)[None, None]
        self_bias = broadcast_batch(self_bias, x.shape[0])  # [batch, heads, len, len]
        cross_bias = key_mask_bias(encoder_mask)
        x = self.dropout(x, deterministic=deterministic)
        for layer in self.layers:
            x = layer(x, encoded, self_bias, cross_bias, deterministic)
        return self.dropout(self.decoder_norm(x), deterministic=deterministic)

    def cross_kv(self, encoded: Array):
        return tuple(layer.cross_kv(encoded) for layer in self.layers)

    def step(self, x: Array, index: Array, cache: dict, cross_kv: tuple, encoder_mask: Array):
        max_len = cache["layers_0"]["v"].shape[2]
        visible = jnp.arange(max_len) <= index  # keys written so far
        self_bias = self.relpos_bias.row(index, max_len) + jnp.where(visible, 0.0, MASK_VALUE)[None, None, None]
        cross_bias = key_mask_bias(encoder_mask)
        new_cache = {}
        for i, layer in enumerate(self.layers):
            name = f"layers_{i}"
            x, new_cache[name] = layer.step(x, index, cache[name], *cross_kv[i], self_bias, cross_bias)
        return self.decoder_norm(x), new_cache
