"""Sampling from the T5 (`models.t5`) with the library's jitted sampler (`sampling.sample`).

`sample_t5` is two compiled programs: the encoder, which computes each prompt's cross-attention keys/values once,
and the decode loop, whose samples of a prompt share them. On a CPU it decodes groups of prompts one after another
when their decode state outgrows the caches (`auto_row_chunks`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from refiner_jax import sampling
from refiner_jax.models.t5 import DECODER_START_ID, T5


def _encode(params, encoder_tokens, *, config):
    """Cross-attention keys/values of every decoder layer for `[batch, enc_len]` prompts (see `T5.cross_kv`)."""
    model = T5(config)
    encoded = model.apply({"params": params}, encoder_tokens, method=T5.encode)  # [batch, enc_len, d_model]
    return model.apply({"params": params}, encoded, method=T5.cross_kv)


def _decode(params, cross_kv, encoder_tokens, rng, temperature, top_k, top_p, min_new_tokens, decoder_prompt,
            *, config, num_samples, max_new_tokens, max_top_k, row_chunks):
    """`sample_t5`'s decode loop on the encoded prompts -> `[batch, num_samples, ...]` leaves. `decoder_prompt`
    [batch, P]: the start token, then each row's forced target prefix (right-padded with `config.pad_id`)."""
    model = T5(config)
    variables = {"params": params}
    encoder_mask = encoder_tokens != config.pad_id  # [batch, enc_len], per prompt: a prompt's samples share it
    output_kernel = model.apply(variables, method=T5.output_kernel)  # [d_model, vocab], once, outside the loop
    forced = decoder_prompt.shape[1]

    def decode(args):
        cross_kv, encoder_mask, prompt, key = args  # one group of prompts
        lengths = 1 + jnp.sum(prompt[:, 1:] != config.pad_id, axis=1) if forced > 1 else None  # [rows]

        def tokens_to_logits(tokens, index, cache):  # tokens [rows * num_samples]: samples share cross_kv
            return model.apply(variables, tokens, index, cache, cross_kv, encoder_mask, output_kernel,
                               method=T5.decode_step)

        cache = T5.init_cache(config, prompt.shape[0], forced - 1 + max_new_tokens)
        return sampling.sample(tokens_to_logits, cache, prompt, key, num_samples=num_samples, prompt_lengths=lengths,
                               max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                               min_new_tokens=min_new_tokens, eos_id=config.eos_ids, pad_id=config.pad_id,
                               max_top_k=max_top_k)

    if row_chunks == 1:
        return decode((cross_kv, encoder_mask, decoder_prompt, rng))
    # One decode loop per group of prompts, run one after another.
    out = jax.lax.map(decode, (jax.tree.map(lambda x: x.reshape(row_chunks, -1, *x.shape[1:]),
                                            (cross_kv, encoder_mask, decoder_prompt))
                               + (jax.random.split(rng, row_chunks),)))
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)  # [chunks, rows, k, ...] -> [batch, k, ...]


_STATIC = ("config", "num_samples", "max_new_tokens", "max_top_k", "row_chunks")
_encode_jit = jax.jit(_encode, static_argnames=("config",))


@functools.cache
def _decode_jit(platform: str):
    """`_decode` compiled with `sampling.decode_options(platform)`."""
    return jax.jit(_decode, static_argnames=_STATIC, compiler_options=sampling.decode_options(platform))


@functools.cache
def _encode_split(mesh: Mesh, config):
    """`_encode` on every device of `mesh`, each on its slice of the prompts (parameters replicated)."""
    return jax.jit(sampling.split_rows(functools.partial(_encode, config=config), mesh, (False, True)))


@functools.cache
def _decode_split(mesh: Mesh, **static):
    """`_decode` on every device of `mesh`: each decodes its slice of the prompts in its own loop, with its own
    key, and no communication between devices."""
    # (params, cross_kv, encoder_tokens, rng, temperature, top_k, top_p, min_new_tokens, decoder_prompt)
    rows = (False, True, True, False, False, False, False, False, True)
    return jax.jit(sampling.split_rows(functools.partial(_decode, **static), mesh, rows, rng_arg=3),
                   compiler_options=sampling.decode_options(mesh.devices.flat[0].platform))


_CACHE_BUDGET = 8 * 2 ** 20  # bytes of decoder weights + decode state that one row group may use on a CPU
_MIN_CHUNK_ROWS = 8


def auto_row_chunks(config, batch: int, enc_len: int, num_samples: int, max_new_tokens: int,
                    platform: str | None = None) -> int:
    """How many groups of prompts `sample_t5` decodes one after another by default (1 = the whole batch at once).

    A decode step reads the decoder's weights and every row's cached keys and values. For a small model on a CPU
    with many distinct prompts, that state outgrows the caches and each step re-reads it from memory; decoding
    row groups whose weights + state fit `_CACHE_BUDGET` in turn keeps each group cache-resident for all its
    steps. Measured on 2 cores (1 MiB L2 each, 32 MiB L3), t5-tiny greedy, 32 prompts x 128 tokens -> 64: 4
    groups of 8 take 0.77-0.92x the time of one batch of 32 (encoder included). Only on CPU, only with one sample
    per prompt (the samples of a prompt share its cross-attention state already), and never below
    `_MIN_CHUNK_ROWS` rows.
    """
    if (platform or jax.default_backend()) != "cpu" or num_samples != 1:
        return 1
    weight_bytes = np.dtype(config.weight_dtype).itemsize * (
        config.vocab_size * config.d_model + config.n_decoder_layers * (
            8 * config.d_model * config.num_heads * config.d_kv
            + (3 if config.feed_forward_proj == "gated-gelu" else 2) * config.d_model * config.d_ff))
    row_bytes = (np.dtype(config.compute_dtype).itemsize * config.n_decoder_layers * 2 * config.num_heads
                 * config.d_kv * (enc_len + max_new_tokens))
    if weight_bytes + batch * row_bytes <= _CACHE_BUDGET:
        return 1
    rows = batch
    while rows % 2 == 0 and rows // 2 >= _MIN_CHUNK_ROWS and weight_bytes + rows * row_bytes > _CACHE_BUDGET:
        rows //= 2
    return batch // rows if weight_bytes + rows * row_bytes <= _CACHE_BUDGET else 1


def sample_t5(params, encoder_tokens, rng, *, config, max_new_tokens: int, num_samples: int = 1, temperature=1.0,
              top_k=0, top_p=1.0, min_new_tokens=0, max_top_k: int = 64,
              row_chunks: int | None = None, mesh: Mesh | None = None, target_prefix=None) -> sampling.SampleOutput:
    """`num_samples` continuations per prompt from a T5 (jitted; returns `[batch, num_samples, ...]` leaves).

    Each prompt is encoded once and its cross-attention keys/values computed once, then shared by its samples;
    the self-attention cache is preallocated for `max_new_tokens`. Two programs, the encoder and the decode loop,
    each compiled once per (config, batch, prompt length, num_samples, max_new_tokens, max_top_k, row_chunks, mesh):
    temperature, top_k, top_p and min_new_tokens are traced (see `sampling.sample` for their meaning). Pad prompt
    lengths to a few buckets (`sampling.pad_to_bucket`) to keep compilations bounded. A row ends at `config.eos_ids`
    and is padded with `config.pad_id` (T5's 1 and 0).

    Args:
      params: the T5's unboxed parameters (passed to the compiled function as arguments, not baked in).
      encoder_tokens: `[batch, enc_len]` int32 prompts, pad (`config.pad_id`, 0) on the right.
      rng: PRNG key.
      row_chunks: decode the batch (with a mesh: each device's slice) as this many groups of prompts, one after
        another (must divide it); None picks it with `auto_row_chunks`. Greedy outputs do not depend on it; sampled
        ones do (each group draws from its own key), but are fixed for a given key and row_chunks.
      mesh: split the prompts over every device of this mesh (all its axes; the batch must divide by its size):
        each device encodes and decodes its slice in its own loop, which ends when its own rows have, with no
        communication. Parameters are replicated; place them with `sampling.replicate(params, mesh)` once to avoid a
        copy per call. A mesh over several processes needs every process to pass the same prompts and key (parameters
        split over the processes are gathered). Greedy outputs equal the single-device ones; sampled rows of device
        i are those of an unsplit call on its slice with key `fold_in(rng, i)`. On a CPU, host devices (`XLA_FLAGS=
        --xla_force_host_platform_device_count=<cores>`, set before JAX starts) run their loops in parallel: a
        decode step of a small model is many small operations, and two loops keep two cores busy where one splits
        each operation (t5-tiny on 2 cores: 1.5-1.9x the tokens/s of one device, t5-small greedy 1.1-1.2x).
      target_prefix: `[batch, L]` int32 ids, right-padded with 0: each prompt's output starts with these tokens,
        teacher-forced through the loop (not returned: the samples continue them, `max_new_tokens` more at most).
    """
    encoder_tokens = jnp.asarray(encoder_tokens, jnp.int32)
    batch, enc_len = encoder_tokens.shape
    start = jnp.full((batch, 1), DECODER_START_ID, jnp.int32)
    decoder_prompt = start if target_prefix is None else jnp.concatenate(
        [start, jnp.asarray(target_prefix, jnp.int32)], axis=1)  # [batch, 1 + L]
    devices, platform = sampling.check_split(batch, mesh)
    if row_chunks is None:
        row_chunks = auto_row_chunks(config, batch // devices, enc_len, num_samples, max_new_tokens, platform)
    if row_chunks < 1 or (batch // devices) % row_chunks:
        raise ValueError(f"row_chunks={row_chunks} must be a positive divisor of the batch size {batch // devices}"
                         + (f" on each of the {devices} devices" if devices > 1 else ""))
    knobs = sampling.traced_knobs(temperature, top_k, top_p, min_new_tokens, max_top_k)
    static = dict(config=config, num_samples=num_samples, max_new_tokens=max_new_tokens, max_top_k=max_top_k,
                  row_chunks=row_chunks)
    if devices == 1:
        cross_kv = _encode_jit(params, encoder_tokens, config=config)
        return _decode_jit(platform)(params, cross_kv, encoder_tokens, rng, *knobs, decoder_prompt, **static)
    params = sampling.replicate(params, mesh)
    encoder_tokens, decoder_prompt = sampling.place_rows((encoder_tokens, decoder_prompt), mesh)
    cross_kv = _encode_split(mesh, config)(params, encoder_tokens)
    return _decode_split(mesh, **static)(params, cross_kv, encoder_tokens, rng, *knobs, decoder_prompt)

