"""Sampling from the decoder-only LM (`models.decoder`) with the library's jitted sampler (`sampling.sample`).

`sample_decoder` is one compiled program per shape: each prompt is prefilled once, in one forward pass over all its
tokens (`Decoder.prefill`); its KV cache is repeated for its K samples (with `DecoderConfig.share_prompt_cache`,
kept once and read by all K: `decoder.share_prompt`); the shared sampling loop then starts from
the prefill's last logits and feeds only the generated tokens (`Decoder.decode_step`). Prompts come left-padded, as
transformers' `generate` takes them; right-padded ones give the same tokens (their padding slots stay masked).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from refiner_jax import sampling
from refiner_jax.models.decoder import Decoder, init_cache, share_prompt
from refiner_jax.models.decoder_config import DecoderConfig


def _sample(params, prompts, mask, rng, temperature, top_k, top_p, min_new_tokens, *, config: DecoderConfig,
            num_samples: int, max_new_tokens: int, max_top_k: int) -> sampling.SampleOutput:
    """`sample_decoder` on arrays: prompts and mask `[batch, P]` -> `[batch, num_samples, ...]` leaves."""
    model = Decoder(config)
    variables = {"params": params}
    batch, prompt_len = prompts.shape
    shared = config.share_prompt_cache and num_samples > 1
    # The last generated token is never fed: P + max_new_tokens - 1 slots (the prompt's P apart when shared).
    cache = init_cache(config, batch, prompt_len + (0 if shared else max_new_tokens - 1))
    logits, cache = model.apply(variables, prompts, mask, cache, method=Decoder.prefill)  # logits [batch, vocab]
    # `sample` repeats logits and cache for a prompt's K samples (consecutive rows of [batch * K, ...]; the cache's
    # slot index, a scalar, is shared), or keeps one copy of the prompt's keys and values for them (`share_prompt`).
    repeat_cache = (lambda c, k: share_prompt(c, k, max(max_new_tokens - 1, 1))) if shared else sampling.repeat_rows

    def tokens_to_logits(tokens, index, cache):  # the cache tracks `index` (slot) and each row's position itself
        return model.apply(variables, tokens, cache, method=Decoder.decode_step)

    return sampling.sample(tokens_to_logits, cache, prompts, rng, num_samples=num_samples, first_logits=logits,
                           repeat_cache=repeat_cache, max_new_tokens=max_new_tokens, temperature=temperature,
                           top_k=top_k, top_p=top_p, min_new_tokens=min_new_tokens, eos_id=config.eos_ids,
                           pad_id=pad_id(config), max_top_k=max_top_k)


_STATIC = ("config", "num_samples", "max_new_tokens", "max_top_k")


@functools.cache
def _sample_jit(platform: str):
    return jax.jit(_sample, static_argnames=_STATIC, compiler_options=sampling.decode_options(platform))


@functools.cache
def _sample_split(mesh: Mesh, **static):
    """`_sample` on every device of `mesh`, each on its slice of the prompts, in its own loop with its own key."""
    rows = (False, True, True, False, False, False, False, False)  # (params, prompts, mask, rng, *knobs)
    return jax.jit(sampling.split_rows(functools.partial(_sample, **static), mesh, rows, rng_arg=3),
                   compiler_options=sampling.decode_options(mesh.devices.flat[0].platform))


def pad_id(config: DecoderConfig) -> int:
    """The id written after a sample's end: the model's pad token, else 0."""
    return 0 if config.pad_id is None else config.pad_id


def sample_decoder(params, prompts, rng, *, config: DecoderConfig, max_new_tokens: int, num_samples: int = 1,
                   temperature=1.0, top_k=0, top_p=1.0, min_new_tokens=0, max_top_k: int = 64, prompt_mask=None,
                   mesh: Mesh | None = None) -> sampling.SampleOutput:
    """`num_samples` continuations per prompt from a decoder-only LM (jitted; `[batch, num_samples, ...]` leaves).

    Compiled once per (config, batch, prompt length, num_samples, max_new_tokens, max_top_k, mesh): temperature,
    top_k, top_p and min_new_tokens are traced (see `sampling.sample` for their meaning). A row ends at any of
    `config.eos_ids` (none: at max_new_tokens) and is padded with `pad_id(config)` after it. Returned log-probs are
    the model's own, as in `sampling.sample`.

    Args:
      params: the decoder's unboxed parameters (arguments of the compiled program, not constants in it).
      prompts: `[batch, P]` int32 token ids, left-padded (transformers' convention; right padding also works).
      rng: PRNG key; the same key gives the same samples.
      prompt_mask: `[batch, P]` bool or 0/1, True at real tokens (transformers' `attention_mask`); None: all real.
        Every row needs at least one real token.
      mesh: split the prompts over every device of this mesh (the batch must divide by its size), as
        `models.t5_sampling.sample_t5` does: each device prefills and samples its slice in its own loop, with key
        `fold_in(rng, device index)`; greedy outputs equal the unsplit ones. Place parameters with
        `sampling.replicate(params, mesh)` once to avoid a copy per call.
    """
    prompts = jnp.asarray(prompts, jnp.int32)
    if prompts.ndim != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts must be [batch, P] with P >= 1, got shape {prompts.shape}")
    batch, prompt_len = prompts.shape
    if config.position == "learned" and prompt_len + max_new_tokens - 1 > config.max_positions:
        raise ValueError(f"{prompt_len} prompt + {max_new_tokens} new tokens exceed the model's {config.max_positions} "
                         "learned positions")
    mask = jnp.ones(prompts.shape, bool) if prompt_mask is None else jnp.asarray(prompt_mask).astype(bool)
    devices, platform = sampling.check_split(batch, mesh)
    knobs = sampling.traced_knobs(temperature, top_k, top_p, min_new_tokens, max_top_k)
    static = dict(config=config, num_samples=num_samples, max_new_tokens=max_new_tokens, max_top_k=max_top_k)
    if devices == 1:
        return _sample_jit(platform)(params, prompts, mask, rng, *knobs, **static)
    params, (prompts, mask) = sampling.replicate(params, mesh), sampling.place_rows((prompts, mask), mesh)
    return _sample_split(mesh, **static)(params, prompts, mask, rng, *knobs)
