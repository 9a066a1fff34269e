"""The decoder-only LM as Qwen3 and Gemma 3 (text) against transformers' PyTorch `Qwen3ForCausalLM` and
`Gemma3ForCausalLM`, built locally with random weights, saved and imported with `load_decoder`: logits, cached
decoding of left- and right-padded prompts, greedy generation (our reference loop and the library's sampler) and
export. Qwen3: per-head query and key norms, a head_dim apart from hidden / heads, an untied head; and a tied one
with attention biases and a window on its upper layers. Gemma 3: (1 + w) norms before and after each block,
scaled embeddings, GeGLU, `query_pre_attn_scalar`, local layers (a window shorter than the prompts) and global
ones with their own rotary bases (the global one rescaled), with and without soft-capped logits; attention
soft-capping against transformers' Gemma 3 eager attention given the cap its config stores (as Gemma 2 passes it),
and its gradient against torch autograd."""
import json
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import import_torch
from _helpers import padded_prompts as _prompts
from _tolerance import ELEMENTWISE, PARITY, REORDER, assert_f32_close, tolerance
from flax.linen import meta

from refiner_jax.models import hf_decoder
from refiner_jax.models.decoder import MLP, Decoder, rope_frequencies
from refiner_jax.models.decoder_config import preset
from refiner_jax.models.decoder_sampling import pad_id, sample_decoder
from refiner_jax.models.layers import attend, param_count
from refiner_jax.sharding import DEFAULT_RULES

torch = import_torch()
transformers = pytest.importorskip("transformers")
from test_decoder import _forward, _randomise, _reference, check_cached_decoding, check_exported  # noqa: E402  (needs torch, imported above)

GEMMA3_LAYERS = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}


def _gemma3(**overrides):
    # Window 3 on layers 0, 1 and 3: the test prompts (up to 12 tokens with the decoded ones) run past it.
    fields = dict(vocab_size=109, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=12, sliding_window=3,
                  layer_types=list(GEMMA3_LAYERS), rope_parameters=json.loads(json.dumps(GEMMA3_ROPE)),
                  max_position_embeddings=64, rms_norm_eps=1e-6, attn_implementation="eager")
    return transformers.Gemma3TextConfig(**dict(fields, **overrides))


HF_CONFIGS = {
    "qwen3": lambda: transformers.Qwen3Config(
        vocab_size=107, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 100.0}),
    "qwen3-window": lambda: transformers.Qwen3Config(
        vocab_size=89, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=True, use_sliding_window=True, sliding_window=3, max_window_layers=1, bos_token_id=1,
        eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 100.0}),
    "gemma3": _gemma3,
    "gemma3-softcap": lambda: _gemma3(vocab_size=97, attn_logit_softcapping=1.5, final_logit_softcapping=4.0),
}
SHARED_CACHE = ("qwen3-window", "gemma3-softcap")
WINDOWS = {"qwen3": (None, None), "qwen3-window": (None, 3, 3), "gemma3": (3, 3, None, 3),
           "gemma3-softcap": (3, 3, None, 3)}


def _import(name: str, directory) -> types.SimpleNamespace:
    """A saved random transformers model `name` (HF_CONFIGS), its reference instance, and our import of it."""
    ref = _randomise(transformers.AutoModelForCausalLM.from_config(HF_CONFIGS[name]()), seed=len(name) + 3)
    ref.save_pretrained(directory)
    config, params = hf_decoder.load_decoder(directory)
    return types.SimpleNamespace(name=name, ref=ref, dir=directory, config=config, params=params)


@pytest.fixture(scope="module", params=sorted(HF_CONFIGS))
def family(request, tmp_path_factory):
    return _import(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return _import("gemma3", tmp_path_factory.mktemp("gemma3-alone"))


_prefill = jax.jit(lambda config, params, tokens, mask, cache: Decoder(config).apply(
    {"params": params}, tokens, mask, cache, method=Decoder.prefill), static_argnums=0)
_decode_step = jax.jit(lambda config, params, token, cache: Decoder(config).apply(
    {"params": params}, token, cache, method=Decoder.decode_step), static_argnums=0)


def test_imported_config_is_the_family(family):
    config = family.config
    assert hf_decoder.model_type(config) == ("qwen3" if family.name.startswith("qwen3") else "gemma3_text")
    assert tuple(config.layer_window(i) for i in range(config.num_layers)) == WINDOWS[family.name]
    assert config.qk_norm and config.head_dim * config.num_heads != config.d_model
    if family.name.startswith("gemma3"):
        assert (config.norm, config.mlp, config.post_norms, config.embed_scale) == ("rmsnorm_plus_one", "geglu",
                                                                                    True, True)
        assert (config.rope_theta, config.rope_type, config.rope_factor, config.local_rope_theta) == (
            1000.0, "linear", 2.0, 50.0)
        assert config.attention_scale == 12 ** -0.5 and config.tie_embeddings
    # transformers' Gemma 3 applies final_logit_softcapping but not attn_logit_softcapping: neither do we.
    assert (config.attn_softcap, config.logit_softcap) == (None, 4.0 if family.name == "gemma3-softcap" else None)


def test_logits_match_transformers(family):
    """Left-padded rows of 9, 4 and 6 tokens (longer than the windows of 3)."""
    tokens, mask = _prompts(family.config.vocab_size, (9, 4, 6), "left")
    logits, hidden = _forward(family.config, family.params, tokens, mask)
    ref_logits, ref_hidden = _reference(family.ref, tokens, mask)
    assert_f32_close(np.asarray(logits)[mask], ref_logits[mask], ulps=PARITY, what=f"{family.name} logits")
    assert_f32_close(np.asarray(hidden)[mask], ref_hidden[mask], ulps=PARITY, what=f"{family.name} hidden states")
    assert np.abs(ref_logits).max() > 1.0  # the comparison is not between near-zero tensors
    if family.name == "gemma3-softcap":  # the cap binds: uncapped, the logits would run past it
        uncapped, _ = _forward(family.config.replace(logit_softcap=None), family.params, tokens, mask)
        assert np.abs(np.asarray(uncapped)[mask]).max() > 4.0 > np.abs(ref_logits).max()


@pytest.mark.parametrize("padding", ["left", "right"])
def test_cached_decoding_matches_transformers(family, padding):
    check_cached_decoding(family, padding)


def test_greedy_generation_matches_transformers(family):
    """The library's sampler, greedy, == transformers' generate(do_sample=False); with two end tokens the model
    emits, each row is transformers' tokens up to its first end token, then padding. The sampler keeps one copy of
    each prompt's cache (`share_prompt_cache`, its own attention code) for the windowed Qwen3 and the soft-capped
    Gemma 3, a copy per sample for the others."""
    tokens, mask = _prompts(family.config.vocab_size, (6, 2, 4), "left", seed=3)
    new = 8
    with torch.no_grad():
        theirs = family.ref.generate(input_ids=torch.tensor(tokens, dtype=torch.long), max_new_tokens=new,
                                     attention_mask=torch.tensor(mask, dtype=torch.long), do_sample=False,
                                     eos_token_id=[], pad_token_id=0)[:, tokens.shape[1]:].numpy()  # no end
    assert theirs.shape == (3, new)
    config = family.config.replace(eos_id=(int(theirs[0, 2]), int(theirs[2, 4])),
                                   share_prompt_cache=family.name in SHARED_CACHE)
    ended = np.cumsum(np.cumsum(np.isin(theirs, config.eos_ids), axis=1), axis=1) > 1  # after a row's first end
    expected = np.where(ended, pad_id(config), theirs)
    out = sample_decoder(family.params, tokens, jax.random.key(0), config=config, max_new_tokens=new, num_samples=2,
                         temperature=0.0, prompt_mask=mask)
    print(f"{family.name} greedy: transformers {theirs.tolist()}, end tokens {config.eos_id}")
    np.testing.assert_array_equal(np.asarray(out.tokens), np.repeat(expected[:, None], 2, axis=1))
    assert ended.any()  # some row ended early


def test_export_loads_in_transformers_and_round_trips_exactly(family, tmp_path):
    rng = np.random.default_rng(5)
    params = jax.tree.map(lambda x: x + np.float32(0.05) * rng.standard_normal(x.shape, np.float32), family.params)
    out = hf_decoder.save_decoder(family.config, params, tmp_path / "export")
    ref, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True,
                                                                  attn_implementation="eager")
    assert type(ref).__name__ == type(family.ref).__name__
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert ref.config.layer_types == family.ref.config.layer_types
    check_exported(family, params, out, ref)


def test_gemma3_local_and_global_layers_rotate_by_their_own_bases(gemma3):
    """Our local and global rotary frequencies == transformers' for each layer type; with the global rotation on
    the local layers, or without the window, the logits move by far more than the tolerance."""
    rotary = gemma3.ref.model.rotary_emb
    for local, layer_type in ((True, "sliding_attention"), (False, "full_attention")):
        assert_f32_close(rope_frequencies(gemma3.config, local), getattr(rotary, f"{layer_type}_inv_freq").numpy(),
                         ulps=ELEMENTWISE, elementwise=True, what=f"gemma3 {layer_type} rope frequencies")
    tokens, mask = _prompts(gemma3.config.vocab_size, (12, 9, 10), "left", seed=4)
    logits, _ = _forward(gemma3.config, gemma3.params, tokens, mask)
    bound = 1000 * tolerance(PARITY, np.abs(np.asarray(logits)[mask]).max())
    for changed in (dict(local_rope_theta=None), dict(sliding_window=None, window_layers=None)):
        other, _ = _forward(gemma3.config.replace(**changed), gemma3.params, tokens, mask)
        assert np.abs(np.asarray(other) - np.asarray(logits))[mask].max() > bound, changed


def test_gemma3_feed_forward_block_and_scaled_embedding_match_transformers(gemma3):
    """The first layer's GeGLU block on inputs spread over the tanh-gelu's curved range (the whole model's logits
    dilute an activation's error), and the scaled embedding in bfloat16, where transformers rounds sqrt(d_model)
    to the embedding's dtype (5.65625 for 32): bit for bit."""
    config = gemma3.config
    x = np.random.default_rng(0).normal(0.0, 2.0, (3, 5, config.d_model)).astype(np.float32)
    ours = MLP(config).apply({"params": gemma3.params["layers_0"]["mlp"]}, jnp.asarray(x))
    with torch.no_grad():
        theirs = gemma3.ref.model.layers[0].mlp(torch.tensor(x)).numpy()
    assert_f32_close(ours, theirs, ulps=REORDER, what="gemma3 feed-forward block")
    tokens = np.arange(3, 11, dtype=np.int32)[None]
    bf16 = config.replace(dtype="bfloat16", param_dtype="bfloat16")
    params = jax.tree.map(lambda p: jnp.asarray(p, jnp.bfloat16), gemma3.params)
    ours = Decoder(bf16).apply({"params": params}, jnp.asarray(tokens), jnp.zeros_like(tokens),
                               method=lambda m, t, p: m._embed(t, p))
    embedding = transformers.AutoModelForCausalLM.from_pretrained(gemma3.dir, dtype=torch.bfloat16).model.embed_tokens
    with torch.no_grad():
        theirs = embedding(torch.tensor(tokens, dtype=torch.long)).float().numpy()
    np.testing.assert_array_equal(np.asarray(ours, np.float32), theirs)


def test_soft_capped_attention_gradient_equals_autodiff():
    """`layers.attend` with a soft cap: values and its written-out gradient == autodiff through the plain formula."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(0, 1.5, (2, 3, 5, 8)), jnp.float32) for _ in range(3))
    bias = jnp.asarray(np.where(rng.random((2, 1, 5, 5)) < 0.3, -1e10, 0.0), jnp.float32)
    cap = 2.0

    def plain(q, k, v):
        logits = cap * jnp.tanh(jnp.einsum("bhqd,bhkd->bhqk", q, k) / cap) + bias
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits, -1), v)

    weights = jnp.asarray(rng.normal(size=(2, 3, 5, 8)), jnp.float32)
    ours, ours_grad = jax.value_and_grad(lambda *a: jnp.sum(attend(*a, bias, None, 0.0, cap) * weights),
                                         argnums=(0, 1, 2))(q, k, v)
    theirs, theirs_grad = jax.value_and_grad(lambda *a: jnp.sum(plain(*a) * weights), argnums=(0, 1, 2))(q, k, v)
    assert_f32_close(ours, theirs, ulps=REORDER, scale=float(jnp.sum(jnp.abs(plain(q, k, v) * weights))),
                     what="soft-capped attention")
    for name, a, b in zip("qkv", ours_grad, theirs_grad):
        assert_f32_close(a, b, ulps=REORDER, what=f"soft-capped attention gradient d{name}")
    uncapped = jax.grad(lambda q: jnp.sum(attend(q, k, v, bias, None, 0.0) * weights))(q)
    assert np.abs(np.asarray(uncapped - ours_grad[0])).max() > 0.1  # the cap matters at these magnitudes


_GEMMA3_SMALL = dict(model_type="gemma3_text", vocab_size=11, hidden_size=16, intermediate_size=24,
                     num_hidden_layers=7, num_attention_heads=2, num_key_value_heads=1, head_dim=8)


@pytest.mark.parametrize("hf", [
    dict(),  # every default: window 4096, every sixth layer global, bases 1e6 and 1e4
    dict(sliding_window=512, sliding_window_pattern=3, rope_theta=5e5, rope_local_base_freq=2e3,
         rope_scaling={"rope_type": "linear", "factor": 8.0}),  # transformers 4's spelling
    dict(sliding_window=16, layer_types=["full_attention", "sliding_attention"] * 3 + ["full_attention"],
         rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 2e5},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}}),
], ids=["defaults", "transformers4", "layer_types"])
def test_gemma3_configs_follow_transformers(hf):
    """Each layer's window and rotary base as transformers' `Gemma3TextConfig` reads the same config.json, and
    back through config_to_hf."""
    ours = hf_decoder.config_from_hf(dict(_GEMMA3_SMALL, **hf))
    theirs = transformers.AutoConfig.for_model(**_GEMMA3_SMALL, **hf)
    assert [ours.layer_window(i) for i in range(7)] == [
        theirs.sliding_window if kind == "sliding_attention" else None for kind in theirs.layer_types]
    local, global_ = theirs.rope_parameters["sliding_attention"], theirs.rope_parameters["full_attention"]
    assert (ours.local_rope_theta, ours.rope_theta) == (local["rope_theta"], global_["rope_theta"])
    assert (ours.rope_type, ours.rope_factor) == (global_["rope_type"], global_.get("factor", 1.0))
    assert (ours.pad_id, ours.eos_id, ours.bos_id) == (theirs.pad_token_id, theirs.eos_token_id, theirs.bos_token_id)
    assert ours.attention_scale == theirs.query_pre_attn_scalar ** -0.5
    assert hf_decoder.config_from_hf(hf_decoder.config_to_hf(ours)) == ours


def test_qwen3_window_and_bias_fields_follow_transformers():
    small = dict(model_type="qwen3", vocab_size=11, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                 num_attention_heads=2)
    for hf in (dict(), dict(use_sliding_window=True, sliding_window=16, max_window_layers=1, attention_bias=True)):
        ours = hf_decoder.config_from_hf(dict(small, **hf))
        theirs = transformers.AutoConfig.for_model(**small, **hf)
        assert [ours.layer_window(i) for i in range(3)] == [
            theirs.sliding_window if kind == "sliding_attention" else None for kind in theirs.layer_types]
        assert ours.head_dim == theirs.head_dim == 128  # Qwen3's default, not hidden / heads
        assert ours.qkv_bias == ours.out_bias == theirs.attention_bias
        assert hf_decoder.config_from_hf(hf_decoder.config_to_hf(ours)) == ours


def test_unsupported_qwen3_and_gemma3_configs_are_rejected():
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        hf_decoder.config_from_hf(dict(_GEMMA3_SMALL, use_bidirectional_attention=True))
    with pytest.raises(ValueError, match="hidden_activation 'relu'"):
        hf_decoder.config_from_hf(dict(_GEMMA3_SMALL, hidden_activation="relu"))
    with pytest.raises(ValueError, match="local-layer rope"):
        hf_decoder.config_from_hf(dict(_GEMMA3_SMALL, rope_parameters={
            "full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "linear", "factor": 2.0}}))
    with pytest.raises(ValueError, match="gemma3_text layer_types marks sliding_attention layers but the config sets "
                                         "no window"):
        hf_decoder.config_from_hf(dict(_GEMMA3_SMALL, sliding_window=None))
    with pytest.raises(ValueError, match="qwen3 layer_types"):
        hf_decoder.config_from_hf(dict(model_type="qwen3", vocab_size=11, hidden_size=16, intermediate_size=24,
                                       num_hidden_layers=2, num_attention_heads=2, layer_types=["chunked"] * 2))
    with pytest.raises(ValueError, match="attn_softcap must be positive"):
        preset("gemma3-tiny", attn_softcap=0.0)
    with pytest.raises(ValueError, match="matches no transformers architecture"):
        hf_decoder.config_to_hf(preset("gemma3-tiny", local_rope_theta=None))
    with pytest.raises(ValueError, match="matches no transformers architecture"):
        hf_decoder.config_to_hf(preset("qwen3-tiny", embed_scale=True))


def test_presets_have_the_published_sizes():
    """Parameter counts of the released checkpoints' config.json shapes (tied output layers counted once; the
    Qwen3 ones 0.44B and 1.4B without embeddings, as their model cards give; Gemma 3 1B's as Keras Hub lists)."""
    counts = {"qwen3-0.6b": 596_049_920, "qwen3-1.7b": 1_720_574_976, "gemma3-1b": 999_885_952}
    for name, expected in counts.items():
        config = preset(name)
        shapes = jax.eval_shape(lambda c=config: Decoder(c).init(jax.random.key(0), jnp.ones((1, 1), jnp.int32)))
        assert param_count(meta.unbox(shapes["params"])) == expected, name
    assert hf_decoder.model_type(preset("qwen3-0.6b")) == "qwen3"
    gemma = preset("gemma3-1b")
    assert hf_decoder.model_type(gemma) == "gemma3_text"
    assert [i for i in range(26) if gemma.layer_window(i) is None] == [5, 11, 17, 23]
    assert gemma.layer_window(0) == 512 and gemma.attention_scale == 256 ** -0.5


@pytest.mark.parametrize("name", ["qwen3-tiny", "gemma3-tiny"])
def test_every_parameter_carries_logical_axes(name):
    abstract = jax.eval_shape(lambda: Decoder(preset(name)).init(jax.random.key(0), jnp.ones((1, 1), jnp.int32)))
    leaves = jax.tree.leaves(abstract["params"], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    known = {logical for logical, _ in DEFAULT_RULES}
    assert leaves and all(isinstance(leaf, nn.LogicallyPartitioned) for leaf in leaves)
    for leaf in leaves:
        assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= known, leaf.names


@pytest.fixture
def capped_attention(monkeypatch):
    """transformers' Gemma 3 eager attention given the `attn_logit_softcapping` its config stores, as Gemma 2's
    passes it (Gemma 3's stores the setting and drops it)."""
    from transformers.models.gemma3 import modeling_gemma3

    eager = modeling_gemma3.eager_attention_forward
    monkeypatch.setattr(modeling_gemma3, "eager_attention_forward", lambda module, *args, **kwargs: eager(
        module, *args, softcap=module.attn_logit_softcapping, **kwargs))


def test_soft_capped_attention_matches_transformers_in_logits_sampling_and_gradient(tmp_path, capped_attention):
    """`attn_softcap` (1.5, which binds at these magnitudes) with soft-capped output logits: logits of left-padded
    rows, greedy samples with one copy of each prompt's cache (`attend_shared` caps too), and the gradient of a
    next-token loss with respect to every parameter (tied embeddings summing both uses) == torch autograd."""
    family = _import("gemma3-softcap", tmp_path)
    config = family.config.replace(attn_softcap=family.ref.config.attn_logit_softcapping)
    tokens, mask = _prompts(config.vocab_size, (9, 4, 6), "left")
    logits, _ = _forward(config, family.params, tokens, mask)
    ref_logits, _ = _reference(family.ref, tokens, mask)
    assert_f32_close(np.asarray(logits)[mask], ref_logits[mask], ulps=PARITY, what="attention-capped logits")
    uncapped, _ = _forward(family.config, family.params, tokens, mask)
    assert np.abs(np.asarray(uncapped) - ref_logits)[mask].max() > 1000 * tolerance(PARITY, np.abs(ref_logits).max())

    tokens, mask = _prompts(config.vocab_size, (6, 2, 4), "left", seed=3)
    with torch.no_grad():
        theirs = family.ref.generate(input_ids=torch.tensor(tokens, dtype=torch.long), max_new_tokens=8,
                                     attention_mask=torch.tensor(mask, dtype=torch.long), do_sample=False,
                                     min_new_tokens=8, pad_token_id=pad_id(config))[:, tokens.shape[1]:].numpy()
    out = sample_decoder(family.params, tokens, jax.random.key(0), config=config.replace(share_prompt_cache=True),
                         max_new_tokens=8, num_samples=2, temperature=0.0, min_new_tokens=8, prompt_mask=mask)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.repeat(theirs[:, None], 2, axis=1))

    tokens = np.random.default_rng(8).integers(3, config.vocab_size, (2, 10)).astype(np.int32)

    def loss(params):
        logits = Decoder(config).apply({"params": params}, jnp.asarray(tokens[:, :-1]))
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

    ours = hf_decoder.state_dict_from_params(family.config, jax.jit(jax.grad(loss))(family.params))  # same names
    family.ref.zero_grad()
    logits = family.ref(input_ids=torch.tensor(tokens[:, :-1], dtype=torch.long)).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                      torch.tensor(tokens[:, 1:], dtype=torch.long).reshape(-1)).backward()
    theirs = {name: p.grad.numpy() for name, p in family.ref.named_parameters()}
    assert set(ours) == set(theirs)
    scale = max(float(np.abs(g).max()) for g in theirs.values())  # the gradient's overall magnitude
    for name, grad in ours.items():
        assert_f32_close(grad, theirs[name], ulps=PARITY, scale=scale, what=f"attention-capped gradient of {name}")
