"""Helpers shared by test files: padded random prompts, and counting XLA compilations."""
import contextlib

import jax
import numpy as np


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
