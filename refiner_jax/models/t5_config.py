"""T5's configuration: `T5Config` (field names mirror `transformers.T5Config`), the named architectures
(`PRESETS`, `preset`) and the hub names of their released checkpoints (`HUB_NAMES`)."""
from __future__ import annotations

import dataclasses

from refiner_jax.models.layers import ConfigDtypes


@dataclasses.dataclass(frozen=True)
class T5Config(ConfigDtypes):
    """Architecture and numerics of a T5; field names mirror `transformers.T5Config`. Hashable (usable as static)."""

    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int | None = None  # None: same as num_layers
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    initializer_factor: float = 1.0
    feed_forward_proj: str = "relu"  # "relu" (v1.0) or "gated-gelu" (v1.1 / Flan-T5)
    tie_word_embeddings: bool = True  # v1.0: True (with the d_model**-0.5 rescale); v1.1: False
    dtype: str = "float32"  # compute dtype ("bfloat16" on accelerators)
    param_dtype: str = "float32"
    remat: bool = False  # rematerialise each layer's activations in the backward pass

    def __post_init__(self):
        if self.feed_forward_proj not in ("relu", "gated-gelu"):
            raise ValueError(f"feed_forward_proj must be 'relu' or 'gated-gelu', got {self.feed_forward_proj!r}")
        for field in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads"):
            if getattr(self, field) <= 0:
                raise ValueError(f"T5Config.{field} must be positive, got {getattr(self, field)}")
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"T5Config.{field} must be float32, bfloat16 or float16, got {getattr(self, field)!r}")

    @property
    def n_decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    # T5's token-id convention, shared by its checkpoints and tokenizers: pad 0 (also the decoder's start token),
    # end 1. Read-only, as `DecoderConfig`'s `pad_id` / `eos_ids` are read by the samplers.
    @property
    def pad_id(self) -> int:
        return 0

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (1,)


_V10 = dict(feed_forward_proj="relu", tie_word_embeddings=True)
_V11 = dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)

PRESETS: dict[str, T5Config] = {
    "t5-tiny": T5Config(vocab_size=384, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4, **_V10),
    "t5-small": T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, **_V10),
    "t5-base": T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, **_V10),
    "t5-large": T5Config(d_model=1024, d_kv=64, d_ff=4096, num_layers=24, num_heads=16, **_V10),
    "flan-t5-small": T5Config(d_model=512, d_kv=64, d_ff=1024, num_layers=8, num_heads=6, **_V11),
    "flan-t5-base": T5Config(d_model=768, d_kv=64, d_ff=2048, num_layers=12, num_heads=12, **_V11),
    "flan-t5-large": T5Config(d_model=1024, d_kv=64, d_ff=2816, num_layers=24, num_heads=16, **_V11),
    "unifiedqa-t5-base": T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, **_V10),
    "unifiedqa-t5-large": T5Config(d_model=1024, d_kv=64, d_ff=4096, num_layers=24, num_heads=16, **_V10),
}

# Hub names of the presets' released checkpoints (for `models.hf.load_t5` when online).
HUB_NAMES = {
    "t5-small": "google-t5/t5-small",
    "t5-base": "google-t5/t5-base",
    "t5-large": "google-t5/t5-large",
    "flan-t5-small": "google/flan-t5-small",
    "flan-t5-base": "google/flan-t5-base",
    "flan-t5-large": "google/flan-t5-large",
    "unifiedqa-t5-base": "allenai/unifiedqa-t5-base",
    "unifiedqa-t5-large": "allenai/unifiedqa-t5-large",
}


def preset(name: str, **overrides) -> T5Config:
    """The named architecture (`PRESETS`), with optional field overrides (e.g. `dtype="bfloat16"`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown T5 preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
