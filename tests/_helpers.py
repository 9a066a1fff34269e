"""Helpers shared by test files: padded random prompts, counting XLA compilations, a reference greedy decode loop of
the decoder-only LM (what the library's sampler is checked against), and torch for the transformers-parity tests."""
import contextlib
import functools
import importlib.metadata

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from packaging.requirements import Requirement

from refiner_jax.models.decoder import Decoder, init_cache
from refiner_jax.models.decoder_config import DecoderConfig


def padded_prompts(vocab: int, lengths, padding: str, seed: int = 0):
    """Random prompts of `lengths` padded (id 0) to the longest, left or right: tokens and mask `[b, P]`."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    tokens, mask = np.zeros((len(lengths), width), np.int32), np.zeros((len(lengths), width), bool)
    for row, n in enumerate(lengths):
        cols = slice(width - n, width) if padding == "left" else slice(0, n)
        tokens[row, cols], mask[row, cols] = rng.integers(3, vocab, n), True
    return tokens, mask


@contextlib.contextmanager
def compilations():
    """Yields a list that collects one entry per XLA compilation inside the block."""
    events = []

    def on_event(event, _duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)


def prefill(config: DecoderConfig, params: dict, tokens: jax.Array, mask: jax.Array,
            cache: dict) -> tuple[jax.Array, dict]:
    """`Decoder.prefill` for a params tree: (logits `[batch, vocab]` after each prompt, filled cache)."""
    return Decoder(config).apply({"params": params}, tokens, mask, cache, method=Decoder.prefill)


def decode_step(config: DecoderConfig, params: dict, token: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
    """`Decoder.decode_step` for a params tree: (logits `[batch, vocab]`, updated cache)."""
    return Decoder(config).apply({"params": params}, token, cache, method=Decoder.decode_step)


@functools.partial(jax.jit, static_argnums=(0, 4))
def greedy_generate(config: DecoderConfig, params: dict, tokens: jax.Array, mask: jax.Array,
                    max_new_tokens: int) -> jax.Array:
    """Greedy continuations `[batch, max_new_tokens]` int32 of prompts `tokens` [batch, P] (`mask` as in `prefill`),
    as transformers' `generate(do_sample=False)`: after a row's first EOS it continues with `pad_id` (the first
    EOS id when the model has no pad token)."""
    cache = init_cache(config, tokens.shape[0], tokens.shape[1] + max_new_tokens)
    logits, cache = prefill(config, params, tokens, mask, cache)
    eos = jnp.asarray(config.eos_ids or (-1,), jnp.int32)
    pad = config.pad_id if config.pad_id is not None else (config.eos_ids or (0,))[0]

    def step(carry, _):
        logits, cache, done = carry
        token = jnp.where(done, pad, jnp.argmax(logits, axis=-1)).astype(jnp.int32)  # [batch]
        done = done | jnp.isin(token, eos)
        logits, cache = decode_step(config, params, token, cache)
        return (logits, cache, done), token

    done = jnp.zeros((tokens.shape[0],), bool)
    _, new = jax.lax.scan(step, (logits, cache, done), None, length=max_new_tokens)  # [max_new_tokens, batch]
    return new.T


# ------------------------------------------------------------------------------------------------ a tiny stage

TINY_VOCAB, TINY_INPUT_LEN, TINY_TARGET_LEN = 64, 8, 6


def t5_batch(seed: int, rows: int = 8, nan_row: int | None = None) -> dict:
    """A random T5 batch of `rows` with per-token weights for the one-layer t5-tiny of `train_tiny_stage`; with
    `nan_row`, that row's first weight is NaN (a NaN loss and gradient from a single row)."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(2, TINY_VOCAB, (rows, TINY_INPUT_LEN)).astype(np.int32)
    targets = rng.integers(2, TINY_VOCAB, (rows, TINY_TARGET_LEN)).astype(np.int32)
    targets[:, -1] = 1
    weights = np.ones((rows, TINY_TARGET_LEN), np.float32)
    if nan_row is not None:
        weights[nan_row, 0] = np.nan
    return {"inputs": inputs, "targets": targets, "weights": weights}


def tiny_t5_config():
    from refiner_jax.models.language_model import preset_config

    return preset_config("t5", "t5-tiny", TINY_VOCAB, 0, 1, num_layers=1, dropout_rate=0.0)


def train_tiny_stage(workdir: str, spec, **kwargs) -> dict:
    """`training.loop.train_stage` of `spec` (batches from its own `collate`) on `tiny_t5_config`'s model, one
    device, metrics logged in `workdir`."""
    from refiner_jax import sharding as shd
    from refiner_jax.tokenizers import ByteTokenizer
    from refiner_jax.training.loop import MetricsLog, train_stage

    log = MetricsLog(workdir)
    try:
        return train_stage(spec, workdir=workdir, model_config=tiny_t5_config(), tokenizer=ByteTokenizer(),
                           mesh=shd.make_mesh((1, 1, 1)), seed=0, log=log, **kwargs)
    finally:
        log.close()


def _test_extra_requires(name: str) -> bool:
    """Whether `pip install -e '.[test]'` installs `name` on this Python (the markers in setup.py decide)."""
    try:
        requirements = importlib.metadata.requires("refiner_jax") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(r.name == name and r.marker is not None and r.marker.evaluate({"extra": "test"})
               for r in map(Requirement, requirements))


def import_torch():
    """torch, the reference of the transformers-parity tests. Where the test extra installs it (Python 3.11, a CPU
    wheel) a missing torch fails the test; elsewhere (a multi-GB CUDA download) the test skips, saying why."""
    __tracebackhide__ = True  # a skip names the calling test's line
    if _test_extra_requires("torch"):
        import torch

        return torch
    return pytest.importorskip("torch", reason="torch is not installed: the test extra installs it only on Python "
                                               "3.11, where these transformers-parity tests run (see setup.py)")
