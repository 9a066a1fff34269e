"""Import and export of transformers decoder-only checkpoints: GPT-2 (`GPT2LMHeadModel`) and the Llama family
(`LlamaForCausalLM`, `Qwen2ForCausalLM`, `MistralForCausalLM`, `Qwen3ForCausalLM` and Gemma 3's text model
`Gemma3ForCausalLM`, sliding windows included).

`load_decoder(name_or_dir)` reads `config.json` (with `generation_config.json`'s end and pad tokens when present)
plus `model.safetensors` (single or sharded) or `pytorch_model.bin` into `(DecoderConfig, params)`; a preset or hub
name is fetched only when the machine is online. `save_decoder(config, params, dir)` writes a directory that
`AutoModelForCausalLM.from_pretrained` loads with no missing or unexpected keys: a GPT-2, a Qwen2 (biases on
query/key/value only), a Mistral (no biases, a window on every layer), a Llama, a Qwen3 (query and key norms) or a
Gemma 3 (its norms, gating, scales and local rotary base). The name map is explicit, one row
per transformers tensor, and every mismatch names the tensor and the parameter.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
from typing import Callable

import jax.numpy as jnp
import numpy as np

from refiner_jax.models.decoder_config import HUB_NAMES, DecoderConfig
from refiner_jax.models.hf import (check_known, get_param, numerics_overrides, param_shapes, read_config,
                                   read_state_dict, resolve_checkpoint, set_checked, write_checkpoint)

SUPPORTED_MODEL_TYPES = ("gemma3_text", "gpt2", "llama", "mistral", "qwen2", "qwen3")
# Non-parameter tensors that older checkpoints store: GPT-2's causal-mask buffers, Llama's rotary frequencies.
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")

Path = tuple[str, ...]
# (transformers key, our parameter paths, ours -> theirs, theirs -> ours): fused tensors (GPT-2's c_attn) map to
# several parameters.
Row = tuple[str, tuple[Path, ...], Callable[..., np.ndarray], Callable[[np.ndarray], tuple[np.ndarray, ...]]]


def _row(ours: Path, theirs: str, to_hf=None, from_hf=None) -> Row:
    return (theirs, (ours,), to_hf or (lambda x: x), lambda w: ((from_hf or (lambda y: y))(w),))


def _transposed(ours: Path, theirs: str) -> Row:
    return _row(ours, theirs, np.transpose, np.transpose)


def config_from_hf(hf: dict) -> DecoderConfig:
    """DecoderConfig from a transformers `config.json` dict (model_type gemma3_text, gpt2, llama, mistral, qwen2 or
    qwen3)."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r} in config.json; refiner_jax's decoder supports "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    tokens = dict(pad_id=hf.get("pad_token_id"), bos_id=hf.get("bos_token_id"), eos_id=hf.get("eos_token_id"),
                  initializer_range=hf.get("initializer_range", 0.02))
    if model_type == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported GPT-2 activation_function {act!r}; supported: gelu_new (tanh gelu)")
        for key, default in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                             ("add_cross_attention", False)):
            if hf.get(key, default) != default:
                raise ValueError(f"unsupported GPT-2 config: {key}={hf[key]!r} (only {default} is implemented)")
        d = hf.get("n_embd", 768)
        return DecoderConfig(
            vocab_size=hf.get("vocab_size", 50257), d_model=d, num_layers=hf.get("n_layer", 12),
            num_heads=hf.get("n_head", 12), d_ff=hf.get("n_inner") or 4 * d, max_positions=hf.get("n_positions", 1024),
            position="learned", norm="layernorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5), mlp="gelu",
            qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=hf.get("tie_word_embeddings", True),
            dropout_rate=hf.get("resid_pdrop", 0.1), **tokens)
    if model_type == "gemma3_text":
        return _gemma3_config(hf, tokens)
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r} for {model_type}; supported: silu (swish)")
    heads = hf["num_attention_heads"]
    # transformers' Mistral and Qwen2 ignore attention_bias and mlp_bias (Qwen2 always has query/key/value biases);
    # Llama's and Qwen3's attention_bias covers the output projection too.
    bias = hf.get("attention_bias", False) if model_type in ("llama", "qwen3") else False
    # Qwen3's head_dim defaults to 128 (its config class), the others' to hidden_size / heads.
    head_dim = hf.get("head_dim") or (128 if model_type == "qwen3" else hf["hidden_size"] // heads)
    return DecoderConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
        d_ff=hf["intermediate_size"], max_positions=hf.get("max_position_embeddings", 2048), norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6), mlp="swiglu", qkv_bias=model_type == "qwen2" or bias,
        out_bias=model_type != "qwen2" and bias, mlp_bias=model_type == "llama" and hf.get("mlp_bias", False),
        qk_norm=model_type == "qwen3", tie_embeddings=hf.get("tie_word_embeddings", False),
        dropout_rate=hf.get("attention_dropout", 0.0), position="rope", **_rope_fields(hf), **_window_fields(hf),
        **tokens)


def _gemma3_config(hf: dict, tokens: dict) -> DecoderConfig:
    """A Gemma 3 text model's config; absent keys take `Gemma3TextConfig`'s defaults. transformers' Gemma 3 keeps
    `attn_logit_softcapping` in its config but never passes it to the attention (Gemma 2 does), so the import
    leaves attention uncapped too: the model computes what transformers computes."""
    act = hf.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_new"):
        raise ValueError(f"unsupported gemma3_text hidden_activation {act!r}; supported: gelu_pytorch_tanh")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("gemma3_text use_bidirectional_attention=true is not supported (causal attention only)")
    tokens = dict(tokens, pad_id=hf.get("pad_token_id", 0), eos_id=hf.get("eos_token_id", 1),
                  bos_id=hf.get("bos_token_id", 2))
    bias = hf.get("attention_bias", False)
    return DecoderConfig(
        vocab_size=hf.get("vocab_size", 262208), d_model=hf.get("hidden_size", 2304),
        num_layers=hf.get("num_hidden_layers", 26), num_heads=hf.get("num_attention_heads", 8),
        num_kv_heads=hf.get("num_key_value_heads", 4), head_dim=hf.get("head_dim", 256),
        d_ff=hf.get("intermediate_size", 9216), max_positions=hf.get("max_position_embeddings", 131072),
        position="rope", norm="rmsnorm_plus_one", norm_eps=hf.get("rms_norm_eps", 1e-6), mlp="geglu", qkv_bias=bias,
        out_bias=bias, mlp_bias=False, qk_norm=True, post_norms=True, embed_scale=True,
        query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256), logit_softcap=hf.get("final_logit_softcapping"),
        tie_embeddings=hf.get("tie_word_embeddings", True), dropout_rate=hf.get("attention_dropout") or 0.0,
        **_gemma3_rope_fields(hf), **_window_fields(hf), **tokens)


def _window_fields(hf: dict) -> dict:
    """`sliding_window` and `window_layers` as transformers reads them: Mistral windows every layer (its default
    window is 4096 when the key is absent; null turns it off); Qwen2 and Qwen3 only with `use_sliding_window`, on
    the layers `layer_types` marks 'sliding_attention', else on those from `max_window_layers` (default 28) on;
    Gemma 3 (default window 4096) on the layers `layer_types` marks, else on all but every
    `sliding_window_pattern`-th (default 6). Llama has no window."""
    kind = hf["model_type"]
    if kind == "mistral":
        return dict(sliding_window=hf.get("sliding_window", 4096))
    if kind not in ("qwen2", "qwen3", "gemma3_text"):
        return {}
    layers = hf.get("num_hidden_layers", 26)  # present in every config but a Gemma 3 of default depth
    types = hf.get("layer_types")
    if kind == "gemma3_text":
        window = hf.get("sliding_window", 4096)
        pattern = hf.get("sliding_window_pattern", 6)
        fallback = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        hint = "sliding_window null"
    else:
        window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window", False) else None
        first = hf.get("max_window_layers", 28) if window is not None else layers
        fallback = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
        hint = "use_sliding_window false or sliding_window null"
    types = fallback if types is None else types
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown or len(types) != layers:
        raise ValueError(f"{kind} layer_types {types} unsupported: expected {layers} entries, each "
                         "'full_attention' or 'sliding_attention'")
    windowed = tuple(i for i, layer in enumerate(types) if layer == "sliding_attention")
    if windowed and window is None:
        raise ValueError(f"{kind} layer_types marks sliding_attention layers but the config sets no window ({hint}); "
                         "set a window or mark every layer full_attention")
    return dict(sliding_window=window, window_layers=windowed) if windowed else {}


def _gemma3_rope_fields(hf: dict) -> dict:
    """Gemma 3's two rotary settings: the global layers' (base `rope_theta`, default 1e6, with `rope_scaling`) and
    the local layers' (base `rope_local_base_freq`, default 1e4, never rescaled), spelled either way:
    transformers 5's `rope_parameters` per layer type, or transformers 4's top-level keys."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        global_, local = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    else:
        global_, local = dict(params), {}
    global_.update(hf.get("rope_scaling") or {})
    global_.setdefault("rope_theta", hf.get("rope_theta", 1e6))
    local.setdefault("rope_theta", hf.get("rope_local_base_freq", 1e4))
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise ValueError(f"gemma3_text local-layer rope {local} is not supported (default rotation only)")
    positions = hf.get("max_position_embeddings", 131072)
    fields = _rope_fields({"rope_parameters": global_, "max_position_embeddings": positions})
    return dict(fields, local_rope_theta=float(local["rope_theta"]))


def _rope_fields(hf: dict) -> dict:
    """Rotary settings from either spelling: `rope_theta` + `rope_scaling` (transformers 4) or `rope_parameters`
    (transformers 5). As in transformers, a non-empty `rope_scaling` wins and `rope_theta` fills in."""
    params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"per-layer-type rope settings {sorted(params)} are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor={partial} is not supported (rotary positions on all dimensions only)")
    fields = dict(rope_theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))), rope_type=rope_type)
    if rope_type in ("linear", "llama3"):
        fields["rope_factor"] = float(params["factor"])
    if rope_type == "llama3":
        fields.update(rope_low_freq_factor=float(params["low_freq_factor"]),
                      rope_high_freq_factor=float(params["high_freq_factor"]),
                      rope_original_max_positions=int(params.get("original_max_position_embeddings",
                                                                 hf.get("max_position_embeddings", 2048))))
    elif rope_type not in ("default", "linear"):
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: default, linear, llama3")
    return fields


def model_type(config: DecoderConfig) -> str:
    """The transformers architecture `config` is: 'gpt2', 'qwen2', 'mistral' (a window, no biases), 'llama',
    'qwen3' (query and key norms) or 'gemma3_text'; raises when it is none of them."""
    windowed = config.sliding_window is not None
    gemma = (config.post_norms, config.embed_scale, config.query_pre_attn_scalar, config.attn_softcap,
             config.logit_softcap, config.local_rope_theta)
    plain = not any(x is not None and x is not False for x in gemma)  # none of Gemma 3's features
    layout = (config.position, config.norm, config.mlp)
    if layout == ("learned", "layernorm", "gelu") and plain and not config.qk_norm:
        if (config.qkv_bias and config.out_bias and config.mlp_bias and config.num_kv_heads == config.num_heads
                and config.head_dim * config.num_heads == config.d_model and not windowed):
            return "gpt2"
    elif layout == ("rope", "rmsnorm", "swiglu") and plain and config.qk_norm:
        if config.qkv_bias == config.out_bias and not config.mlp_bias:
            return "qwen3"
    elif layout == ("rope", "rmsnorm", "swiglu") and plain:
        if config.qkv_bias and not config.out_bias and not config.mlp_bias:
            return "qwen2"
        if not windowed and config.qkv_bias == config.out_bias:
            return "llama"
        if not (config.qkv_bias or config.out_bias or config.mlp_bias) and config.window_layers is None:
            return "mistral"
    elif layout == ("rope", "rmsnorm_plus_one", "geglu"):
        if (config.qk_norm and config.post_norms and config.embed_scale and config.local_rope_theta is not None
                and config.attn_softcap is None and config.qkv_bias == config.out_bias and not config.mlp_bias):
            return "gemma3_text"
    raise ValueError(f"this DecoderConfig matches no transformers architecture (GPT-2: learned positions, "
                     f"layernorm, gelu, all biases; Llama/Qwen2/Mistral: rope, rmsnorm, swiglu; a sliding window "
                     f"needs Qwen2's biases or, on every layer, Mistral's none; Qwen3: the same with qk_norm; "
                     f"Gemma 3: rope, rmsnorm_plus_one, geglu, qk_norm, post_norms, embed_scale, a "
                     f"local_rope_theta and no attn_softcap, which transformers' Gemma 3 ignores): {config}")


def _rope_parameters(config: DecoderConfig) -> dict:
    """transformers' rotary settings of `config`'s (global) layers."""
    rope = dict(rope_type=config.rope_type, rope_theta=config.rope_theta)
    if config.rope_type != "default":
        rope["factor"] = config.rope_factor
    if config.rope_type == "llama3":
        rope.update(low_freq_factor=config.rope_low_freq_factor, high_freq_factor=config.rope_high_freq_factor,
                    original_max_position_embeddings=config.rope_original_max_positions)
    return rope


def _layer_types(config: DecoderConfig) -> list[str]:
    return ["full_attention" if config.layer_window(i) is None else "sliding_attention"
            for i in range(config.num_layers)]


def config_to_hf(config: DecoderConfig) -> dict:
    """A transformers `config.json` dict for `config`."""
    kind = model_type(config)
    eos = list(config.eos_id) if isinstance(config.eos_id, tuple) else config.eos_id
    common = dict(model_type=kind, vocab_size=config.vocab_size, tie_word_embeddings=config.tie_embeddings,
                  initializer_range=config.initializer_range, pad_token_id=config.pad_id,
                  bos_token_id=config.bos_id, eos_token_id=eos, dtype="float32", use_cache=True)
    if kind == "gpt2":
        return dict(common, architectures=["GPT2LMHeadModel"], n_embd=config.d_model, n_layer=config.num_layers,
                    n_head=config.num_heads, n_inner=config.d_ff, n_positions=config.max_positions,
                    activation_function="gelu_new", layer_norm_epsilon=config.norm_eps,
                    resid_pdrop=config.dropout_rate, embd_pdrop=config.dropout_rate, attn_pdrop=config.dropout_rate)
    rope = _rope_parameters(config)
    shape = dict(hidden_size=config.d_model, intermediate_size=config.d_ff, num_hidden_layers=config.num_layers,
                 num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
                 head_dim=config.head_dim, max_position_embeddings=config.max_positions,
                 rms_norm_eps=config.norm_eps, attention_dropout=config.dropout_rate)
    # Both spellings of the rotary settings, for transformers 4 and 5 alike.
    old_rope = dict(rope_theta=config.rope_theta, rope_scaling=None if config.rope_type == "default" else rope)
    if kind == "gemma3_text":
        local = dict(rope_type="default", rope_theta=config.local_rope_theta)
        return dict(common, **shape, **old_rope, architectures=["Gemma3ForCausalLM"],
                    hidden_activation="gelu_pytorch_tanh", attention_bias=config.qkv_bias,
                    query_pre_attn_scalar=config.query_pre_attn_scalar or config.head_dim,
                    attn_logit_softcapping=None, final_logit_softcapping=config.logit_softcap,
                    sliding_window=config.sliding_window, layer_types=_layer_types(config),
                    rope_parameters={"full_attention": rope, "sliding_attention": local},
                    rope_local_base_freq=config.local_rope_theta, use_bidirectional_attention=False)
    architecture = {"qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                    "qwen3": "Qwen3ForCausalLM"}.get(kind, "LlamaForCausalLM")
    hf = dict(common, **shape, **old_rope, architectures=[architecture], hidden_act="silu", rope_parameters=rope)
    if kind in ("qwen2", "qwen3"):
        if kind == "qwen3":
            hf["attention_bias"] = config.qkv_bias
        if config.sliding_window is None:
            return dict(hf, use_sliding_window=False, sliding_window=None)
        types = _layer_types(config)
        return dict(hf, use_sliding_window=True, sliding_window=config.sliding_window, layer_types=types,
                    max_window_layers=types.index("sliding_attention"))
    if kind == "mistral":
        return dict(hf, sliding_window=config.sliding_window)
    return dict(hf, attention_bias=config.qkv_bias, mlp_bias=config.mlp_bias)


def _gpt2_rows(config: DecoderConfig) -> list[Row]:
    d, h, hd = config.d_model, config.num_heads, config.head_dim
    rows = [_row(("token_embedder",), "transformer.wte.weight"), _row(("position_embedder",), "transformer.wpe.weight")]
    for i in range(config.num_layers):
        ours, theirs = (f"layers_{i}",), f"transformer.h.{i}"
        att, mlp = ours + ("attention",), ours + ("mlp",)
        for norm, hf_norm in (("attention_norm", "ln_1"), ("mlp_norm", "ln_2")):
            rows += [_row(ours + (norm, "scale"), f"{theirs}.{hf_norm}.weight"),
                     _row(ours + (norm, "bias"), f"{theirs}.{hf_norm}.bias")]
        # c_attn is a Conv1D ([in, out] weight) whose output is query | key | value, each [heads * head_dim].
        rows.append((f"{theirs}.attn.c_attn.weight", (att + ("query",), att + ("key",), att + ("value",)),
                     lambda *qkv: np.concatenate([x.reshape(d, h * hd) for x in qkv], axis=1),
                     lambda w: tuple(x.reshape(d, h, hd) for x in np.split(w, 3, axis=1))))
        rows.append((f"{theirs}.attn.c_attn.bias", (att + ("query_bias",), att + ("key_bias",), att + ("value_bias",)),
                     lambda *qkv: np.concatenate([x.reshape(-1) for x in qkv]),
                     lambda w: tuple(x.reshape(h, hd) for x in np.split(w, 3))))
        rows += [_row(att + ("out",), f"{theirs}.attn.c_proj.weight", lambda x: x.reshape(h * hd, d),
                      lambda w: w.reshape(h, hd, d)),
                 _row(att + ("out_bias",), f"{theirs}.attn.c_proj.bias"),
                 _row(mlp + ("wi",), f"{theirs}.mlp.c_fc.weight"), _row(mlp + ("wi_bias",), f"{theirs}.mlp.c_fc.bias"),
                 _row(mlp + ("wo",), f"{theirs}.mlp.c_proj.weight"),
                 _row(mlp + ("wo_bias",), f"{theirs}.mlp.c_proj.bias")]
    rows += [_row(("final_norm", "scale"), "transformer.ln_f.weight"),
             _row(("final_norm", "bias"), "transformer.ln_f.bias")]
    return rows


def _llama_rows(config: DecoderConfig) -> list[Row]:
    d, hd = config.d_model, config.head_dim
    rows = [_row(("token_embedder",), "model.embed_tokens.weight")]
    # transformers' `post_attention_layernorm` is the feed-forward's input norm in Llama and the attention's output
    # norm in Gemma 3 (whose feed-forward norms are `pre_`/`post_feedforward_layernorm`).
    norms = [("attention_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")]
    if config.post_norms:
        norms = [("attention_norm", "input_layernorm"), ("attention_out_norm", "post_attention_layernorm"),
                 ("mlp_norm", "pre_feedforward_layernorm"), ("mlp_out_norm", "post_feedforward_layernorm")]
    for i in range(config.num_layers):
        ours, theirs = (f"layers_{i}",), f"model.layers.{i}"
        att, mlp = ours + ("attention",), ours + ("mlp",)
        rows += [_row(ours + (norm, "scale"), f"{theirs}.{hf_norm}.weight") for norm, hf_norm in norms]
        if config.qk_norm:
            rows += [_row(att + ("query_norm", "scale"), f"{theirs}.self_attn.q_norm.weight"),
                     _row(att + ("key_norm", "scale"), f"{theirs}.self_attn.k_norm.weight")]
        for name, proj, heads in (("query", "q_proj", config.num_heads), ("key", "k_proj", config.num_kv_heads),
                                  ("value", "v_proj", config.num_kv_heads)):
            # ours [d_model, heads, head_dim]  <->  theirs (nn.Linear) [heads * head_dim, d_model]
            rows.append(_row(att + (name,), f"{theirs}.self_attn.{proj}.weight", lambda x: x.reshape(d, -1).T,
                             lambda w, n=heads: w.T.reshape(d, n, hd)))
            if config.qkv_bias:
                rows.append(_row(att + (f"{name}_bias",), f"{theirs}.self_attn.{proj}.bias",
                                 lambda x: x.reshape(-1), lambda w, n=heads: w.reshape(n, hd)))
        h = config.num_heads
        rows.append(_row(att + ("out",), f"{theirs}.self_attn.o_proj.weight", lambda x: x.reshape(h * hd, d).T,
                         lambda w: w.T.reshape(h, hd, d)))
        if config.out_bias:
            rows.append(_row(att + ("out_bias",), f"{theirs}.self_attn.o_proj.bias"))
        for name, proj in (("wi_0", "gate_proj"), ("wi_1", "up_proj"), ("wo", "down_proj")):
            rows.append(_transposed(mlp + (name,), f"{theirs}.mlp.{proj}.weight"))
            if config.mlp_bias:
                rows.append(_row(mlp + (f"{name}_bias",), f"{theirs}.mlp.{proj}.bias"))
    rows.append(_row(("final_norm", "scale"), "model.norm.weight"))
    return rows


def name_map(config: DecoderConfig) -> list[Row]:
    """Every transformers tensor as (its key, our parameter paths, ours->theirs, theirs->ours)."""
    rows = _gpt2_rows(config) if model_type(config) == "gpt2" else _llama_rows(config)
    if not config.tie_embeddings:
        rows.append(_transposed(("lm_head",), "lm_head.weight"))
    return rows


@functools.lru_cache(maxsize=16)
def _expected_shapes(config: DecoderConfig) -> dict:
    from refiner_jax.models.decoder import Decoder

    return param_shapes(Decoder(config), 1)


def _names(paths: tuple[Path, ...]) -> str:
    return ", ".join("/".join(p) for p in paths)


def params_from_state_dict(config: DecoderConfig, state: dict[str, np.ndarray]) -> dict:
    """Our params tree from a transformers state dict (numpy arrays); raises naming any missing, unexpected or
    mis-shaped tensor."""
    state = {k: v for k, v in state.items() if not k.endswith(_BUFFER_SUFFIXES)}
    if model_type(config) == "gpt2" and not any(k.startswith("transformer.") for k in state):
        # The original GPT-2 checkpoints name the tensors of `GPT2Model`, without the `transformer.` prefix.
        state = {k if k == "lm_head.weight" else f"transformer.{k}": v for k, v in state.items()}
    rows = name_map(config)
    known = {theirs for theirs, *_ in rows} | ({"lm_head.weight"} if config.tie_embeddings else set())
    check_known(state, known, "DecoderConfig", "num_hidden_layers / biases / tie_word_embeddings")
    params: dict = {}
    dtype = jnp.dtype(config.param_dtype)  # numpy-compatible, bfloat16 included
    shapes = _expected_shapes(config)
    for theirs, ours, _, from_hf in rows:
        if theirs not in state:
            raise ValueError(f"checkpoint is missing tensor {theirs!r} (parameter {_names(ours)})")
        tensor = np.asarray(state[theirs])
        try:
            values = from_hf(tensor)
        except ValueError as e:
            raise ValueError(f"tensor {theirs!r} has shape {tensor.shape}, which does not fit parameter "
                             f"{_names(ours)} ({e})") from e
        for path, value in zip(ours, values):
            set_checked(params, path, value, shapes, theirs, tensor.shape, dtype)
    return params


def state_dict_from_params(config: DecoderConfig, params: dict) -> dict[str, np.ndarray]:
    """transformers-named float32 numpy tensors from our params tree."""
    return {theirs: np.ascontiguousarray(to_hf(*(np.asarray(get_param(params, p), np.float32) for p in ours)))
            for theirs, ours, to_hf, _ in name_map(config)}


def generation_tokens(directory: pathlib.Path) -> dict:
    """`eos_id` and `pad_id` from the directory's `generation_config.json` (those it sets), which transformers'
    `generate` uses over config.json's: an instruct checkpoint often lists several end tokens there."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return {}
    generation = json.loads(path.read_text())
    fields = {"eos_id": generation.get("eos_token_id"), "pad_id": generation.get("pad_token_id")}
    return {k: v for k, v in fields.items() if v is not None}


def load_decoder(name_or_dir: str | os.PathLike, **config_overrides) -> tuple[DecoderConfig, dict]:
    """(config, params) from a transformers checkpoint directory, a preset name or a hub name (online only).

    `config_overrides` change numerics fields such as `dtype`, `param_dtype`, `dropout_rate` or `remat`;
    `param_dtype="checkpoint"` keeps the dtype the checkpoint was saved in (`hf.checkpoint_dtype`). The end and pad
    tokens of `generation_config.json`, when present, win over config.json's.
    """
    directory = resolve_checkpoint(HUB_NAMES.get(str(name_or_dir), name_or_dir))
    hf = read_config(directory)
    config = config_from_hf(hf).replace(**{**generation_tokens(directory), **numerics_overrides(hf, config_overrides)})
    return config, params_from_state_dict(config, read_state_dict(directory))


def generation_fields(config: DecoderConfig) -> dict:
    """The `generation_config.json` fields transformers' `generate` stops and pads by: every end token (a list when
    there are several), the pad and bos tokens; those `config` sets."""
    eos = list(config.eos_id) if isinstance(config.eos_id, tuple) else config.eos_id
    fields = {"bos_token_id": config.bos_id, "eos_token_id": eos, "pad_token_id": config.pad_id}
    return {k: v for k, v in fields.items() if v is not None}


def save_decoder(config: DecoderConfig, params: dict, directory: str | os.PathLike) -> pathlib.Path:
    """Writes `config.json`, `generation_config.json` and `model.safetensors` that `AutoModelForCausalLM` and
    `GenerationConfig.from_pretrained` load (a tied output layer is not stored, as transformers saves it)."""
    return write_checkpoint(directory, config_to_hf(config), state_dict_from_params(config, params),
                            generation_fields(config))
