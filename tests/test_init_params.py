"""`models.init_params` for every preset of both families, abstractly (`jax.eval_shape`: nothing allocated), against
parameter counts worked out from the architectures and the released checkpoints' published totals."""
import functools

import jax
import numpy as np
import pytest

from refiner_jax.models import init_params
from refiner_jax.models.language_model import PRESETS, LanguageModel


def _t5_count(c) -> int:
    """T5 parameters from its shape: shared embedding (an untied LM head as large), per encoder layer self-attention
    q/k/v/o and a feed-forward (wi, or wi_0 and wi_1 gated, then wo) with a norm each, per decoder layer also
    cross-attention; one relative-position bias table per stack and a final norm per stack."""
    d, inner, ff = c.d_model, c.num_heads * c.d_kv, c.d_ff
    attention = 4 * d * inner + d  # q, k, v, o and the norm before it
    feed_forward = (3 if c.feed_forward_proj == "gated-gelu" else 2) * d * ff + d
    stacks = (c.num_layers * (attention + feed_forward) + c.n_decoder_layers * (2 * attention + feed_forward)
              + 2 * (c.relative_attention_num_buckets * c.num_heads + d))
    return (1 if c.tie_word_embeddings else 2) * c.vocab_size * d + stacks


def _decoder_count(c) -> int:
    """GPT-2 / Llama / Qwen2 parameters from the shape: token (and learned position) embeddings, per layer grouped
    query attention (q and o over all heads, k and v over the kv heads, optional biases), an MLP (two matrices, or
    three with SwiGLU, optional biases) and two norms (LayerNorm: scale and bias), a final norm, an untied head."""
    d, heads, kv = c.d_model, c.num_heads, c.num_kv_heads or c.num_heads
    head_dim = c.head_dim or d // heads
    norm = (2 if c.norm == "layernorm" else 1) * d
    attention = 2 * d * heads * head_dim + 2 * d * kv * head_dim
    attention += (heads + 2 * kv) * head_dim * c.qkv_bias + d * c.out_bias
    mlp = (3 if c.mlp == "swiglu" else 2) * d * c.d_ff + (c.d_ff + d) * c.mlp_bias
    embeddings = c.vocab_size * d * (1 if c.tie_embeddings else 2)
    embeddings += c.max_positions * d if c.position == "learned" else 0
    return embeddings + c.num_layers * (attention + mlp + 2 * norm) + norm


# Published totals of the released checkpoints (transformers' `num_parameters()`).
PUBLISHED = {("t5", "t5-small"): 60_506_624, ("t5", "flan-t5-small"): 76_961_152, ("decoder", "gpt2"): 124_439_808,
             ("decoder", "qwen2.5-0.5b"): 494_032_768}
# Architectures the counting functions above describe (other families add norms of their own).
COUNTED = [("t5", name) for name in PRESETS["t5"]] + [
    ("decoder", name) for name in ("gpt2-tiny", "llama-tiny", "llama-mini", "gpt2", "qwen2.5-0.5b")]


def _abstract_count(config) -> tuple[int, set]:
    shapes = jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))
    leaves = jax.tree.leaves(shapes)
    return sum(int(np.prod(x.shape)) for x in leaves), {str(x.dtype) for x in leaves}


@pytest.mark.parametrize("family,name", [(f, n) for f in PRESETS for n in PRESETS[f]])
def test_every_preset_initialises_abstractly(family, name):
    config = PRESETS[family][name]
    count, dtypes = _abstract_count(config)
    assert count > 0 and dtypes == {config.param_dtype}
    if (family, name) in COUNTED:
        assert count == (_t5_count if family == "t5" else _decoder_count)(config), (family, name)
    if (family, name) in PUBLISHED:
        assert count == PUBLISHED[family, name]


def test_init_params_are_unboxed_and_the_module_applies_them():
    """Concrete parameters of a tiny preset of each family: plain arrays (no partitioning boxes), random (the same
    key gives the same tree, another key another), and accepted by the family's module."""
    for family, name in (("t5", "t5-tiny"), ("decoder", "gpt2-tiny")):
        config = PRESETS[family][name]
        a, b = init_params(config, jax.random.key(0)), init_params(config, jax.random.key(0))
        other = init_params(config, jax.random.key(1))
        assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(a))
        assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
        assert not all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(other)))
        lm = LanguageModel(config)
        logits = lm.module().apply({"params": a}, *lm.init_args())
        assert logits.shape == (1, 8, config.vocab_size) and bool(np.isfinite(logits).all())
