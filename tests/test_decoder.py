"""The decoder-only LM against transformers' PyTorch GPT-2, Llama (grouped-query attention, untied head, llama3
rope), Qwen2 (query/key/value biases, tied head, linear rope in the old config spelling), Mistral with a sliding
window shorter than the sequences, and Qwen2 with a window on its upper layers only (`use_sliding_window`,
`max_window_layers`), built locally with random weights; plus the checkpoint bridge and the KV-cache decoding API,
both checked against transformers."""
import functools
import json
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import decode_step, greedy_generate, import_torch, prefill
from _helpers import padded_prompts as _prompts
from _tolerance import ELEMENTWISE, NETWORK, PARITY, REORDER, assert_f32_close, tolerance
from flax.linen import meta

from refiner_jax.models import hf as hf_lib
from refiner_jax.models import hf_decoder
from refiner_jax.models.decoder import Decoder, init_cache, rope_frequencies
from refiner_jax.models.decoder_config import DecoderConfig, preset
from refiner_jax.models.layers import param_count
from refiner_jax.sharding import DEFAULT_RULES

torch = import_torch()
transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
HF_CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_inner=48, n_positions=40, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=1, eos_token_id=2),
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=101, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, rope_parameters=dict(LLAMA3_ROPE)),
    "qwen2": lambda: transformers.Qwen2Config(
        vocab_size=103, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, rope_parameters={"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}),
    # Windows of 4 and 3 tokens: the test prompts (up to 9 tokens, 11 and 14 with the decoded ones) run past them.
    "mistral": lambda: transformers.MistralConfig(
        vocab_size=91, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5, sliding_window=4,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 100.0}),
    "qwen2-window": lambda: transformers.Qwen2Config(
        vocab_size=83, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
        use_sliding_window=True, sliding_window=3, max_window_layers=1, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0}),
}
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "mistral": "MistralForCausalLM", "qwen2-window": "Qwen2ForCausalLM"}
WINDOWS = {"mistral": (4, 4), "qwen2-window": (None, 3, 3)}  # each layer's window (None: full attention)


def _randomise(model, seed: int):
    """Every tensor random (norm scales around 1, biases included) so that any mapping error shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_((0.1 if p.ndim == 1 else 0.2) * torch.randn_like(p))
    return model.eval()


def _import(name: str, directory) -> types.SimpleNamespace:
    """A saved random transformers model `name` (HF_CONFIGS), its reference instance, and our import of it."""
    ref = _randomise(transformers.AutoModelForCausalLM.from_config(HF_CONFIGS[name]()), seed=len(name))
    ref.save_pretrained(directory)
    if name == "qwen2":
        # The transformers-4 spelling: top-level rope_theta plus rope_scaling with "type"; the reference reloads it.
        hf = json.loads((directory / "config.json").read_text())
        hf.pop("rope_parameters")
        hf.update(rope_theta=1000.0, rope_scaling={"type": "linear", "factor": 2.0})
        (directory / "config.json").write_text(json.dumps(hf))
        ref = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
        assert ref.config.rope_parameters["rope_type"] == "linear"
    config, params = hf_decoder.load_decoder(directory)
    return types.SimpleNamespace(name=name, ref=ref, dir=directory, config=config, params=params)


@pytest.fixture(scope="module", params=sorted(HF_CONFIGS))
def family(request, tmp_path_factory):
    return _import(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module", params=sorted(WINDOWS))
def windowed(request, tmp_path_factory):
    """The families with sliding windows (Mistral; Qwen2 windowed from layer 1), as `family`."""
    return _import(request.param, tmp_path_factory.mktemp(request.param))


def _reference(ref, tokens, mask):
    """transformers' logits and final hidden states, positions counting real tokens (as `generate` numbers them).

    transformers measures a sliding window in slots, ours in real tokens: the same where a row's real tokens are
    contiguous. So each row runs left-padded, transformers' convention (its real tokens moved to the end, in order),
    and the outputs go back to the row's own slots.
    """
    order = np.argsort(mask, axis=1, kind="stable")  # padding slots first, then the real tokens in order
    tokens, mask = np.take_along_axis(tokens, order, 1), np.take_along_axis(mask, order, 1)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    args = dict(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(positions, dtype=torch.long))
    with torch.no_grad():
        outputs = ref(**args).logits.numpy(), ref.base_model(**args).last_hidden_state.numpy()
    results = tuple(np.empty_like(x) for x in outputs)
    for result, x in zip(results, outputs):
        np.put_along_axis(result, order[..., None], x, axis=1)
    return results


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, tokens, mask):
    def run(model, tokens, mask):
        h = model.hidden_states(tokens, attention_mask=mask)
        return model.logits(h), h

    return Decoder(config).apply({"params": params}, tokens, mask, method=run)


_prefill = jax.jit(prefill, static_argnums=0)
_decode_step = jax.jit(decode_step, static_argnums=0)


def test_logits_match_transformers(family):
    assert family.config.num_kv_heads == {"gpt2": 4, "llama": 2, "qwen2": 1, "mistral": 2, "qwen2-window": 2}[
        family.name]
    windows = tuple(family.config.layer_window(i) for i in range(family.config.num_layers))
    assert windows == WINDOWS.get(family.name, (None,) * family.config.num_layers)
    tokens, mask = _prompts(family.config.vocab_size, (9, 4, 6), "left")
    logits, hidden = _forward(family.config, family.params, tokens, mask)
    ref_logits, ref_hidden = _reference(family.ref, tokens, mask)
    assert_f32_close(np.asarray(logits)[mask], ref_logits[mask], ulps=PARITY, what=f"{family.name} logits")
    assert_f32_close(np.asarray(hidden)[mask], ref_hidden[mask], ulps=PARITY, what=f"{family.name} hidden states")
    assert np.abs(ref_logits).max() > 1.0  # the comparison is not between near-zero tensors


def test_feed_forward_block_matches_transformers(family):
    """The first layer's MLP (tanh-GELU for GPT-2, SwiGLU for Llama and Qwen2) on inputs spread over the
    activation's curved range, against transformers' block. The whole model's logits dilute an activation's error
    (the exact GELU for the tanh form changes them by less than float32 parity's margin); one block does not."""
    from refiner_jax.models.decoder import MLP

    x = np.random.default_rng(0).normal(0.0, 2.0, (3, 5, family.config.d_model)).astype(np.float32)
    ours = MLP(family.config).apply({"params": family.params["layers_0"]["mlp"]}, jnp.asarray(x))
    block = family.ref.transformer.h[0].mlp if family.name == "gpt2" else family.ref.model.layers[0].mlp
    with torch.no_grad():
        theirs = block(torch.tensor(x)).numpy()
    # Two products over d_model and d_ff and one activation: REORDER ulps of the output's magnitude.
    assert_f32_close(ours, theirs, ulps=REORDER, what=f"{family.name} feed-forward block")


@pytest.mark.parametrize("padding", ["left", "right"])
def test_cached_decoding_matches_transformers(family, padding):
    check_cached_decoding(family, padding)


def check_cached_decoding(family, padding):
    """prefill + decode_step, prompts of different lengths in one batch, == transformers' full forward pass."""
    config = family.config
    tokens, mask = _prompts(config.vocab_size, (7, 3, 5), padding, seed=1)
    steps = np.random.default_rng(2).integers(3, config.vocab_size, (3, 4)).astype(np.int32)
    full_tokens = np.concatenate([tokens, steps], axis=1)
    full_mask = np.concatenate([mask, np.ones_like(steps, bool)], axis=1)
    ref_logits, _ = _reference(family.ref, full_tokens, full_mask)
    last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)  # each prompt's last real token
    logits, cache = _prefill(config, family.params, tokens, mask, init_cache(config, 3, 12))
    scale = np.abs(ref_logits[full_mask]).max()
    assert_f32_close(logits, ref_logits[np.arange(3), last], ulps=PARITY, scale=scale,
                     what=f"{family.name} prefill logits ({padding} padding)")
    for i in range(steps.shape[1]):
        logits, cache = _decode_step(config, family.params, steps[:, i], cache)
        assert_f32_close(logits, ref_logits[:, mask.shape[1] + i], ulps=PARITY, scale=scale,
                         what=f"{family.name} decode step {i} logits ({padding} padding)")
    assert int(cache["index"]) == 11 and cache["position"].tolist() == [11, 7, 9]


def test_sliding_window_matters_and_a_longer_one_is_full_attention(windowed, tmp_path):
    """Rows of 9 to 12 tokens: with the window (3 or 4) our logits match transformers', and dropping the window
    moves them by far more than the tolerance. A window longer than every row (64) matches transformers with that
    window and equals full attention exactly."""
    config, params = windowed.config, windowed.params
    tokens, mask = _prompts(config.vocab_size, (12, 9, 10), "left", seed=4)
    logits, _ = _forward(config, params, tokens, mask)
    ref_logits, _ = _reference(windowed.ref, tokens, mask)
    assert_f32_close(np.asarray(logits)[mask], ref_logits[mask], ulps=PARITY,
                     what=f"{windowed.name} logits, window shorter than the rows")
    full, _ = _forward(config.replace(sliding_window=None, window_layers=None), params, tokens, mask)
    change = np.abs(np.asarray(full) - np.asarray(logits))[mask].max()
    assert change > 1000 * tolerance(PARITY, np.abs(ref_logits[mask]).max()), change
    long = config.replace(sliding_window=64)
    long_ref = transformers.AutoModelForCausalLM.from_pretrained(windowed.dir, sliding_window=64).eval()
    assert long_ref.config.sliding_window == 64
    long_logits, _ = _forward(long, params, tokens, mask)
    assert_f32_close(np.asarray(long_logits)[mask], _reference(long_ref, tokens, mask)[0][mask], ulps=PARITY,
                     what=f"{windowed.name} logits, window longer than the rows")
    np.testing.assert_array_equal(long_logits, full)


def test_window_counts_the_real_tokens_of_padded_and_packed_rows(windowed):
    """Right-padded rows, and two sequences packed in one row (`segment_ids`), give each sequence's logits alone."""
    config, params = windowed.config, windowed.params
    left, left_mask = _prompts(config.vocab_size, (9, 5, 7), "left", seed=6)
    right, right_mask = _prompts(config.vocab_size, (9, 5, 7), "right", seed=6)
    alone = np.asarray(_forward(config, params, left, left_mask)[0])[left_mask]  # rows' real tokens in order
    assert_f32_close(np.asarray(_forward(config, params, right, right_mask)[0])[right_mask], alone, ulps=NETWORK,
                     what=f"{windowed.name} right- vs left-padded windowed logits")
    packed = np.concatenate([left[0], left[1][left_mask[1]], np.zeros(2, np.int32)])[None]
    segments = np.repeat([1, 2, 0], (9, 5, 2))[None]
    logits = Decoder(config).apply({"params": params}, jnp.asarray(packed), segment_ids=jnp.asarray(segments))
    assert_f32_close(np.asarray(logits)[0, :14], alone[:14], ulps=NETWORK,
                     what=f"{windowed.name} packed vs separate windowed logits")


def test_greedy_generation_matches_transformers(family):
    """greedy_generate == transformers' generate(do_sample=False), also when rows end at (several) EOS ids."""
    tokens, mask = _prompts(family.config.vocab_size, (6, 2, 4), "left", seed=3)
    new = 8

    def both(config):
        ours = np.asarray(greedy_generate(config, family.params, tokens, mask, new))
        with torch.no_grad():
            out = family.ref.generate(input_ids=torch.tensor(tokens, dtype=torch.long), max_new_tokens=new,
                                      attention_mask=torch.tensor(mask, dtype=torch.long), do_sample=False,
                                      eos_token_id=list(config.eos_ids))
        return ours, out[:, tokens.shape[1]:].numpy()  # transformers stops once every row has ended

    ours, theirs = both(family.config)
    np.testing.assert_array_equal(ours, theirs)
    # Two tokens that the model emits as end tokens: rows stop there and continue with the pad id.
    config = family.config.replace(eos_id=(int(ours[0, 2]), int(ours[2, 4])))
    ours, theirs = both(config)
    print(f"{family.name} greedy with EOS {config.eos_id}: ours {ours.tolist()}, transformers {theirs.tolist()}")
    np.testing.assert_array_equal(ours[:, :theirs.shape[1]], theirs)
    assert (ours[:, theirs.shape[1]:] == (config.pad_id if config.pad_id is not None else config.eos_id[0])).all()
    assert np.isin(ours[:, 2], config.eos_ids).any()


def test_export_loads_in_transformers_and_round_trips_exactly(family, tmp_path):
    rng = np.random.default_rng(5)
    params = jax.tree.map(lambda x: x + np.float32(0.05) * rng.standard_normal(x.shape, np.float32), family.params)
    out = hf_decoder.save_decoder(family.config, params, tmp_path / "export")
    ref, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(ref).__name__ == ARCHITECTURES[family.name]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    check_exported(family, params, out, ref)


def check_exported(family, params, out, ref):
    """The exported directory `out` loads back to `family.config` and `params` exactly, and transformers' model
    `ref` read from it gives our logits."""
    config, loaded = hf_decoder.load_decoder(out)
    assert config == family.config
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    tokens, mask = _prompts(config.vocab_size, (9, 4, 6), "left")
    logits, _ = _forward(config, params, tokens, mask)
    ref_logits, _ = _reference(ref.eval(), tokens, mask)
    assert_f32_close(np.asarray(logits)[mask], ref_logits[mask], ulps=PARITY, what=f"exported {family.name} logits")



def test_export_writes_the_end_tokens_transformers_generate_reads(tmp_path):
    """Two end tokens and a pad token survive export: `generation_config.json`, read by transformers'
    `GenerationConfig` (what `generate` stops by), lists both, and `load_decoder` reads the same config back."""
    from transformers import GenerationConfig

    config = preset("llama-tiny", vocab_size=64, pad_id=5, eos_id=(3, 7)).replace(bos_id=1)
    params = Decoder(config).init(jax.random.key(0), np.ones((1, 4), np.int32))["params"]
    out = hf_decoder.save_decoder(config, meta.unbox(params), tmp_path / "export")
    generation = GenerationConfig.from_pretrained(out)
    assert (generation.eos_token_id, generation.pad_token_id, generation.bos_token_id) == ([3, 7], 5, 1)
    assert hf_decoder.load_decoder(out)[0] == config
    single = hf_decoder.save_decoder(config.replace(eos_id=3, bos_id=None), meta.unbox(params), tmp_path / "one")
    assert json.loads((single / "generation_config.json").read_text()) == {"eos_token_id": 3, "pad_token_id": 5}

def _llama_dict(**rope):
    return dict(model_type="llama", vocab_size=11, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=128, **rope)


@pytest.mark.parametrize("old, new", [
    ({"rope_theta": 1e6}, {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    ({"rope_theta": 300.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
     {"rope_parameters": {"rope_type": "linear", "rope_theta": 300.0, "factor": 2.0}}),
    ({"rope_theta": 500.0, "rope_scaling": {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}},
     {"rope_parameters": dict(LLAMA3_ROPE)}),
], ids=["default", "linear", "llama3"])
def test_rope_settings_from_old_and_new_config_keys(old, new):
    ours_old, ours_new = hf_decoder.config_from_hf(_llama_dict(**old)), hf_decoder.config_from_hf(_llama_dict(**new))
    assert ours_old == ours_new
    # The rotary frequencies equal transformers' for the same config.json.
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf_config = transformers.LlamaConfig(**{k: v for k, v in _llama_dict(**new).items() if k != "model_type"})
    rope_type = hf_config.rope_parameters["rope_type"]
    init = ROPE_INIT_FUNCTIONS.get(rope_type, LlamaRotaryEmbedding.compute_default_rope_parameters)
    assert_f32_close(rope_frequencies(ours_old), init(hf_config)[0].numpy(), ulps=ELEMENTWISE, elementwise=True,
                     what="rope frequencies vs transformers")
    assert hf_decoder.config_from_hf(_llama_dict()).rope_theta == 10000.0  # transformers' default


_SMALL = dict(vocab_size=11, hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
              max_position_embeddings=128)


@pytest.mark.parametrize("hf", [
    dict(model_type="mistral", sliding_window=4096),  # Mistral-7B-v0.1's config
    dict(model_type="mistral"),  # no key: transformers' default window
    dict(model_type="mistral", sliding_window=None),
    dict(model_type="qwen2", sliding_window=4096, max_window_layers=1),  # use_sliding_window false: no window
    dict(model_type="qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=1),
    dict(model_type="qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=0),
    dict(model_type="qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=3),
    dict(model_type="qwen2", use_sliding_window=True),  # defaults: window 4096 from layer 28 on, so none here
    dict(model_type="qwen2", use_sliding_window=True, sliding_window=16,
         layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    dict(model_type="llama", sliding_window=16),  # Llama has no window
], ids=lambda hf: "-".join(f"{k}={v}" for k, v in hf.items() if k != "layer_types"))
def test_window_layers_follow_transformers_configs(hf):
    """Each layer's window as transformers' config classes set it, and back through config_to_hf."""
    ours = hf_decoder.config_from_hf(dict(_SMALL, **hf))
    theirs = transformers.AutoConfig.for_model(**_SMALL, **hf)
    window = getattr(theirs, "sliding_window", None)
    if hf["model_type"] == "qwen2":
        expected = [window if kind == "sliding_attention" else None for kind in theirs.layer_types]
    else:
        expected = [window if hf["model_type"] == "mistral" else None] * 3
    assert [ours.layer_window(i) for i in range(3)] == expected
    assert hf_decoder.config_from_hf(hf_decoder.config_to_hf(ours)) == ours


def test_swish_is_silu():
    from transformers.activations import ACT2FN

    assert isinstance(ACT2FN["swish"], torch.nn.SiLU)
    for model in ("llama", "mistral", "qwen2"):
        silu = hf_decoder.config_from_hf(dict(_llama_dict(), model_type=model))
        assert hf_decoder.config_from_hf(dict(_llama_dict(), model_type=model, hidden_act="swish")) == silu


def test_param_dtype_from_a_bfloat16_checkpoint(tmp_path):
    """`param_dtype="checkpoint"` keeps a bfloat16 checkpoint's dtype (float32, the default, otherwise)."""
    ref = _randomise(transformers.AutoModelForCausalLM.from_config(HF_CONFIGS["mistral"]()), seed=3)
    ref.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    config, params = hf_decoder.load_decoder(tmp_path / "bf16", param_dtype="checkpoint")
    default, float32 = hf_decoder.load_decoder(tmp_path / "bf16")
    assert (config.param_dtype, default.param_dtype) == ("bfloat16", "float32")
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("bfloat16")}
    assert {x.dtype for x in jax.tree.leaves(float32)} == {np.dtype("float32")}
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a, np.float32), b), params, float32)
    np.testing.assert_array_equal(np.asarray(params["token_embedder"], np.float32),
                                  ref.model.embed_tokens.weight.detach().float().numpy())
    ref.float().save_pretrained(tmp_path / "f32")
    assert hf_decoder.load_decoder(tmp_path / "f32", param_dtype="checkpoint")[0].param_dtype == "float32"
    assert [hf_lib.checkpoint_dtype(hf) for hf in ({"torch_dtype": "float16"}, {"dtype": "auto"}, {})] == [
        "float16", "float32", "float32"]


def test_unsupported_configs_are_rejected():
    with pytest.raises(ValueError, match="unsupported model_type 'falcon'.*gpt2, llama, mistral, qwen2"):
        hf_decoder.config_from_hf({"model_type": "falcon"})
    with pytest.raises(ValueError, match="rope type 'yarn'.*default, linear, llama3"):
        hf_decoder.config_from_hf(_llama_dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}))
    assert hf_decoder.config_from_hf(dict(_llama_dict(), model_type="mistral", sliding_window=None)).qkv_bias is False
    with pytest.raises(ValueError, match="hidden_act 'gelu'.*silu"):
        hf_decoder.config_from_hf(dict(_llama_dict(), hidden_act="gelu"))
    qwen2 = dict(_llama_dict(), model_type="qwen2", num_hidden_layers=2)
    with pytest.raises(ValueError, match="layer_types.*'full_attention' or 'sliding_attention'"):
        hf_decoder.config_from_hf(dict(qwen2, use_sliding_window=True, layer_types=["chunked_attention"] * 2))
    with pytest.raises(ValueError, match="sliding_attention layers but the config sets no window"):
        hf_decoder.config_from_hf(dict(qwen2, layer_types=["full_attention", "sliding_attention"]))
    with pytest.raises(ValueError, match="sliding_window must be positive"):
        DecoderConfig(sliding_window=0)
    with pytest.raises(ValueError, match="window_layers"):
        DecoderConfig(num_layers=2, sliding_window=4, window_layers=(2,))
    with pytest.raises(ValueError, match="needs a sliding_window"):
        DecoderConfig(window_layers=(0,))
    assert DecoderConfig(num_layers=2, sliding_window=4, window_layers=()) == DecoderConfig(num_layers=2)
    with pytest.raises(ValueError, match="a sliding window needs Qwen2's biases or, on every layer, Mistral's"):
        hf_decoder.config_to_hf(preset("llama-tiny", sliding_window=8, window_layers=(1,)))
    with pytest.raises(ValueError, match="activation_function 'relu'"):
        hf_decoder.config_from_hf({"model_type": "gpt2", "activation_function": "relu"})
    with pytest.raises(ValueError, match="num_kv_heads"):
        DecoderConfig(num_heads=12, num_kv_heads=5)
    with pytest.raises(ValueError, match="position"):
        DecoderConfig(position="alibi")
    with pytest.raises(ValueError, match="unknown decoder preset"):
        preset("gpt5")
    with pytest.raises(ValueError, match="matches no transformers architecture"):
        hf_decoder.config_to_hf(preset("llama-tiny", norm="layernorm"))


def _random_params(config: DecoderConfig, seed: int = 0) -> dict:
    shapes = jax.eval_shape(lambda: Decoder(config).init(jax.random.key(0), jnp.ones((1, 1), jnp.int32)))
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: 0.2 * rng.standard_normal(s.shape, np.float32), meta.unbox(shapes["params"]))


def test_mismatches_name_the_tensor_and_parameter(tmp_path):
    config = preset("llama-tiny")
    state = hf_decoder.state_dict_from_params(config, _random_params(config))
    bad = dict(state, **{"model.layers.1.self_attn.q_proj.weight": np.zeros((60, 64), np.float32)})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.q_proj\.weight.*layers_1/attention/query"):
        hf_decoder.params_from_state_dict(config, bad)
    bad = dict(state, **{"model.layers.0.mlp.up_proj.weight": np.zeros((176, 60), np.float32)})
    with pytest.raises(ValueError, match=r"up_proj\.weight.*\(176, 60\).*layers_0/mlp/wi_1 needs \(64, 176\)"):
        hf_decoder.params_from_state_dict(config, bad)
    missing = {k: v for k, v in state.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match="missing tensor 'model.norm.weight'.*final_norm/scale"):
        hf_decoder.params_from_state_dict(config, missing)
    with pytest.raises(ValueError, match="model.layers.7.input_layernorm.weight"):
        hf_decoder.params_from_state_dict(config, dict(state, **{"model.layers.7.input_layernorm.weight": 0}))
    # The original GPT-2 checkpoints: keys without the `transformer.` prefix, plus causal-mask buffers.
    gpt2 = preset("gpt2-tiny")
    state = hf_decoder.state_dict_from_params(gpt2, _random_params(gpt2))
    legacy = {k.removeprefix("transformer."): v for k, v in state.items()}
    legacy["h.0.attn.bias"] = np.ones((1, 1, 8, 8), np.float32)
    jax.tree.map(np.testing.assert_array_equal, hf_decoder.params_from_state_dict(gpt2, legacy),
                 hf_decoder.params_from_state_dict(gpt2, state))
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf_decoder.load_decoder(tmp_path)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "qwen2.5-0.5b"])
def test_every_parameter_carries_logical_axes(name):
    config = preset(name, out_bias=name == "llama-tiny", mlp_bias=name != "qwen2.5-0.5b")
    abstract = jax.eval_shape(lambda: Decoder(config).init(jax.random.key(0), jnp.ones((1, 1), jnp.int32)))
    leaves = jax.tree.leaves(abstract["params"], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    known = {logical for logical, _ in DEFAULT_RULES}
    assert leaves and all(isinstance(leaf, nn.LogicallyPartitioned) for leaf in leaves)
    for leaf in leaves:
        assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= known, leaf.names
    specs = jax.tree.leaves(nn.get_partition_spec(abstract)["params"],
                            is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    assert len(specs) == len(leaves)


def test_presets_have_the_published_sizes():
    counts = {"gpt2": 124_439_808, "qwen2.5-0.5b": 494_032_768}  # from the released checkpoints
    for name, expected in counts.items():
        shapes = jax.eval_shape(lambda c=preset(name): Decoder(c).init(jax.random.key(0), jnp.ones((1, 1), jnp.int32)))
        assert param_count(meta.unbox(shapes["params"])) == expected, name
    assert hf_decoder.model_type(preset("qwen2.5-0.5b")) == "qwen2"
    assert hf_decoder.model_type(preset("gpt2")) == "gpt2"


def test_remat_changes_nothing_but_memory():
    config = preset("llama-tiny", vocab_size=64, d_model=32, d_ff=48)
    tokens = jnp.asarray(_prompts(config.vocab_size, (5, 3), "left")[0])
    params = _random_params(config, seed=1)

    def loss(p, cfg):
        return jnp.mean(jax.nn.log_softmax(Decoder(cfg).apply({"params": p}, tokens))[..., 3])

    def rematerialised(cfg):
        return str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(params, cfg)).count("remat")

    assert rematerialised(config) == 0
    assert rematerialised(config.replace(remat=True)) == config.num_layers
    plain, remat = (jax.jit(jax.grad(loss), static_argnums=1)(params, c) for c in (config, config.replace(remat=True)))
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(plain))  # the gradient's overall magnitude
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(remat)):  # the same operations, recomputed
        assert_f32_close(b, a, ulps=NETWORK, scale=scale, what="decoder remat gradient")


def test_fusion_boundary_passes_values_and_gradients_and_survives_compilation_on_cpu_only():
    # `fusion_boundary` returns its input bit for bit, NaN first element included (the conditional's other branch);
    # `cotangent_barrier` passes the gradient unchanged. The boundary is a conditional on CPU only, and it must
    # survive XLA:CPU's simplifier (two identical branches are merged away): the compiled gradient of a decoder
    # keeps one conditional per layer.
    from refiner_jax.models import decoder as decoder_module
    from refiner_jax.models.layers import cotangent_barrier, fusion_boundary

    x = jnp.array([[1.5, -2.0], [0.25, 3.0]])
    with_nan = x.at[0, 0].set(jnp.nan)
    boundary = jax.jit(fusion_boundary)
    np.testing.assert_array_equal(boundary(x), x)
    np.testing.assert_array_equal(boundary(with_nan), with_nan)
    weights = jnp.array([[2.0, -1.0], [0.5, 4.0]])
    np.testing.assert_array_equal(jax.jit(jax.grad(lambda v: jnp.sum(cotangent_barrier(v) * weights)))(x), weights)
    traced = jax.jit(fusion_boundary).trace(x)
    for platform, conditional in [("cpu", True), ("cuda", False), ("tpu", False)]:
        text = traced.lower(lowering_platforms=(platform,)).as_text()
        assert ("stablehlo.compare" in text) == conditional, platform  # the predicate: the first element, itself

    config = preset("gpt2-tiny", vocab_size=64, d_model=32, d_ff=48, num_layers=3)
    tokens = jnp.asarray(_prompts(config.vocab_size, (5, 3), "left")[0])
    params = _random_params(config, seed=2)

    def loss(p):
        return jnp.mean(jax.nn.log_softmax(Decoder(config).apply({"params": p}, tokens))[..., 3])

    compiled = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    assert compiled.count(" conditional(") >= config.num_layers
    # Without the boundary the gradient is the same: it changes what XLA fuses, not what it computes (bit for bit on
    # the machines measured; another fusion may contract a multiply-add differently, so a network's rounding apart).
    bounded = jax.jit(jax.grad(loss))(params)
    original = decoder_module.cotangent_barrier
    decoder_module.cotangent_barrier = lambda v: v
    try:
        plain = jax.jit(jax.grad(loss))(params)
    finally:
        decoder_module.cotangent_barrier = original
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(plain))  # the gradient's overall magnitude
    for a, b in zip(jax.tree.leaves(bounded), jax.tree.leaves(plain)):
        assert_f32_close(a, b, ulps=NETWORK, scale=scale, what="decoder gradient with vs without the boundary")
