"""The decoder-only LMs' configuration: `DecoderConfig` (GPT-2 and the Llama family: Llama, Qwen2, Mistral, Qwen3,
Gemma 3), the named architectures (`PRESETS`, `preset`) and the hub names of their released checkpoints
(`HUB_NAMES`)."""
from __future__ import annotations

import dataclasses

import numpy as np

from refiner_jax.models.layers import ConfigDtypes

_DTYPES = ("float32", "bfloat16", "float16")
ROPE_TYPES = ("default", "linear", "llama3")
NORMS = ("layernorm", "rmsnorm", "rmsnorm_plus_one")
MLPS = ("gelu", "swiglu", "geglu")


@dataclasses.dataclass(frozen=True)
class DecoderConfig(ConfigDtypes):
    """Architecture and numerics of a decoder-only LM. Hashable, so it can be a static jit argument.

    `num_kv_heads` and `head_dim` default (None) to `num_heads` and `d_model // num_heads`. Token ids come from the
    checkpoint's config; `eos_id` may be a tuple when a model has several end tokens.

    Sliding-window attention (Mistral, Qwen2, Qwen3, Gemma 3): with `sliding_window` set, a token of a windowed
    layer attends to itself and the `sliding_window - 1` real tokens before it (transformers' `q - k < window`).
    `window_layers` lists the windowed layers (None: every layer; Qwen2's layers from `max_window_layers` on;
    Gemma 3's local layers). With `local_rope_theta` set, the windowed layers also rotate by that base, unscaled,
    and the others by `rope_theta` with its rescaling (Gemma 3's local and global layers).

    Gemma 3 adds: norms scaled by 1 + w (`norm="rmsnorm_plus_one"`), a norm on each block's output as well as its
    input (`post_norms`), embeddings times sqrt(d_model) (`embed_scale`), a tanh-gelu gated feed-forward
    (`mlp="geglu"`), attention scaled by `query_pre_attn_scalar`**-0.5 instead of head_dim**-0.5, and optional
    soft-capping of the output logits (`logit_softcap`: x -> cap * tanh(x / cap)). `attn_softcap` caps attention
    logits likewise (Gemma 2's attention; transformers' Gemma 3 stores the setting but does not apply it).
    Qwen3 and Gemma 3 normalise each head's queries and keys before the rotation (`qk_norm`).
    """

    vocab_size: int = 50257
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    num_kv_heads: int | None = None
    head_dim: int | None = None
    d_ff: int = 3072
    max_positions: int = 1024
    position: str = "learned"  # "learned" (GPT-2) or "rope"
    rope_theta: float = 10000.0
    rope_type: str = "default"  # "default", "linear" or "llama3" rescaling of the rotary frequencies
    rope_factor: float = 1.0  # linear and llama3
    rope_low_freq_factor: float = 1.0  # llama3
    rope_high_freq_factor: float = 4.0  # llama3
    rope_original_max_positions: int = 8192  # llama3
    norm: str = "layernorm"  # "layernorm" (GPT-2), "rmsnorm" or "rmsnorm_plus_one" (scale 1 + w, Gemma 3)
    norm_eps: float = 1e-5
    mlp: str = "gelu"  # "gelu" (tanh approximation, GPT-2's gelu_new), "swiglu" or "geglu" (tanh-gelu gate)
    qk_norm: bool = False  # a norm over head_dim of each head's queries and keys, before the rotation
    post_norms: bool = False  # also normalise the attention and feed-forward outputs before each residual add
    embed_scale: bool = False  # token embeddings times sqrt(d_model), rounded to the embedding's dtype
    query_pre_attn_scalar: float | None = None  # logits scaled by its -1/2 power (None, head_dim: head_dim**-0.5)
    attn_softcap: float | None = None  # attention logits -> cap * tanh(logits / cap), before the mask
    logit_softcap: float | None = None  # output logits likewise
    local_rope_theta: float | None = None  # the windowed layers' rotary base (no rescaling); None: rope_theta
    qkv_bias: bool = True
    out_bias: bool = True  # attention output projection
    mlp_bias: bool = True
    tie_embeddings: bool = True  # output layer = token embedding transposed
    dropout_rate: float = 0.0  # embeddings, attention weights and residual branches
    initializer_range: float = 0.02
    dtype: str = "float32"  # compute dtype ("bfloat16" on accelerators)
    param_dtype: str = "float32"
    remat: bool = False  # rematerialise each layer's activations in the backward pass
    # Sampling several continuations of a prompt attends over one copy of its keys and values
    # (`decoder.share_prompt`) instead of a copy per continuation: faster; the same attention summed in another order.
    share_prompt_cache: bool = False
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | tuple[int, ...] | None = None
    sliding_window: int | None = None
    window_layers: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.d_model // max(self.num_heads, 1))
        if isinstance(self.eos_id, list):
            object.__setattr__(self, "eos_id", tuple(self.eos_id))
        if self.query_pre_attn_scalar == self.head_dim:  # the default scale: one spelling, so configs compare equal
            object.__setattr__(self, "query_pre_attn_scalar", None)
        self._check_window()
        choices = {"position": ("learned", "rope"), "rope_type": ROPE_TYPES, "norm": NORMS, "mlp": MLPS,
                   "dtype": _DTYPES, "param_dtype": _DTYPES}
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"DecoderConfig.{field} must be one of {allowed}, got {getattr(self, field)!r}")
        for field in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "d_ff",
                      "max_positions"):
            if getattr(self, field) <= 0:
                raise ValueError(f"DecoderConfig.{field} must be positive, got {getattr(self, field)}")
        for field in ("query_pre_attn_scalar", "attn_softcap", "logit_softcap", "local_rope_theta"):
            if getattr(self, field) is not None and not getattr(self, field) > 0:
                raise ValueError(f"DecoderConfig.{field} must be positive or None, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {self.head_dim}")

    def _check_window(self):
        """Validates the window and normalises `window_layers` (sorted; None when it names every layer; no layer
        windowed is no window)."""
        if self.sliding_window is None:
            if self.window_layers is not None:
                raise ValueError(f"window_layers={self.window_layers} needs a sliding_window")
            return
        if self.sliding_window <= 0:
            raise ValueError(f"DecoderConfig.sliding_window must be positive or None, got {self.sliding_window}")
        if self.window_layers is not None:
            layers = tuple(sorted(set(self.window_layers)))
            if any(not 0 <= i < self.num_layers for i in layers):
                raise ValueError(f"window_layers {self.window_layers} must be layer indices in [0, {self.num_layers})")
            everything = layers == tuple(range(self.num_layers))
            object.__setattr__(self, "window_layers", None if everything or not layers else layers)
            if not layers:
                object.__setattr__(self, "sliding_window", None)

    def layer_window(self, layer: int) -> int | None:
        """The attention window of layer `layer` (None: full causal attention)."""
        if self.window_layers is None or layer in self.window_layers:
            return self.sliding_window
        return None

    def local_rope(self, layer: int) -> bool:
        """Whether layer `layer` rotates by `local_rope_theta` (a windowed layer of a config that sets it)."""
        return self.local_rope_theta is not None and self.layer_window(layer) is not None

    @property
    def attention_scale(self) -> float:
        """The factor of the attention logits: `query_pre_attn_scalar` (else head_dim) to the power -1/2."""
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return () if self.eos_id is None else tuple(np.atleast_1d(self.eos_id).tolist())


_GPT2 = dict(position="learned", norm="layernorm", norm_eps=1e-5, mlp="gelu", qkv_bias=True, out_bias=True,
             mlp_bias=True, tie_embeddings=True)
_LLAMA = dict(position="rope", norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", qkv_bias=False, out_bias=False,
              mlp_bias=False)
_QWEN3 = dict(_LLAMA, qk_norm=True, rope_theta=1e6)
_GEMMA3 = dict(_LLAMA, norm="rmsnorm_plus_one", mlp="geglu", qk_norm=True, post_norms=True, embed_scale=True,
               tie_embeddings=True, rope_theta=1e6, local_rope_theta=1e4)


def _local_layers(layers: int) -> tuple[int, ...]:
    """Gemma 3's local layers: all but every sixth (transformers' sliding_window_pattern 6)."""
    return tuple(i for i in range(layers) if (i + 1) % 6)


PRESETS: dict[str, DecoderConfig] = {
    "gpt2-tiny": DecoderConfig(vocab_size=512, d_model=64, num_layers=2, num_heads=4, d_ff=256, max_positions=256,
                               bos_id=1, eos_id=1, **_GPT2),
    "llama-tiny": DecoderConfig(vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=176,
                                max_positions=512, tie_embeddings=False, bos_id=1, eos_id=2, **_LLAMA),
    # About t5-tiny's size (1.1M parameters with a 1024-token vocabulary), for the same jobs with either family.
    "llama-mini": DecoderConfig(vocab_size=1024, d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, d_ff=352,
                                max_positions=512, tie_embeddings=False, bos_id=1, eos_id=2, **_LLAMA),
    "gpt2": DecoderConfig(vocab_size=50257, d_model=768, num_layers=12, num_heads=12, d_ff=3072,
                          max_positions=1024, bos_id=50256, eos_id=50256, **_GPT2),
    "qwen2.5-0.5b": DecoderConfig(vocab_size=151936, d_model=896, num_layers=24, num_heads=14, num_kv_heads=2,
                                  d_ff=4864, max_positions=32768, rope_theta=1e6, tie_embeddings=True,
                                  bos_id=151643, eos_id=151643, **dict(_LLAMA, qkv_bias=True)),
    # head_dim apart from d_model / num_heads, as in the released Qwen3 and Gemma 3 models.
    "qwen3-tiny": DecoderConfig(vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                                d_ff=176, max_positions=512, tie_embeddings=False, bos_id=1, eos_id=2, **_QWEN3),
    # One local (window 64) and one global layer.
    "gemma3-tiny": DecoderConfig(vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=1, head_dim=32,
                                 d_ff=176, max_positions=512, sliding_window=64, window_layers=(0,),
                                 query_pre_attn_scalar=16, pad_id=0, bos_id=2, eos_id=1, **_GEMMA3),
    "qwen3-0.6b": DecoderConfig(vocab_size=151936, d_model=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                                head_dim=128, d_ff=3072, max_positions=40960, tie_embeddings=True, bos_id=151643,
                                eos_id=151645, **_QWEN3),
    "qwen3-1.7b": DecoderConfig(vocab_size=151936, d_model=2048, num_layers=28, num_heads=16, num_kv_heads=8,
                                head_dim=128, d_ff=6144, max_positions=40960, tie_embeddings=True, bos_id=151643,
                                eos_id=151645, **_QWEN3),
    "gemma3-1b": DecoderConfig(vocab_size=262144, d_model=1152, num_layers=26, num_heads=4, num_kv_heads=1,
                               head_dim=256, d_ff=6912, max_positions=32768, sliding_window=512,
                               window_layers=_local_layers(26), query_pre_attn_scalar=256, pad_id=0, bos_id=2,
                               eos_id=(1, 106), **_GEMMA3),
}

# Hub names of the presets' released checkpoints (for `models.hf_decoder.load_decoder` when online).
HUB_NAMES = {"gpt2": "openai-community/gpt2", "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B", "qwen3-0.6b": "Qwen/Qwen3-0.6B",
             "qwen3-1.7b": "Qwen/Qwen3-1.7B", "gemma3-1b": "google/gemma-3-1b-pt"}


def preset(name: str, **overrides) -> DecoderConfig:
    """The named architecture (`PRESETS`), with optional field overrides (e.g. `dtype="bfloat16"`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown decoder preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
