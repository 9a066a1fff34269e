"""Models: the Flax T5 (`t5`), the decoder-only LM (`decoder`: GPT-2, Llama, Qwen2, Qwen3, Mistral, Gemma 3;
sampled with `decoder_sampling`), their transformers checkpoint bridges (`hf`, `hf_decoder`), one interface over
both families (`language_model`, with `init_params(config, rng)` for a preset of either family), LoRA adapters as a
parameter transform (`lora`) in PEFT's file layout (`peft_io`), the step-scoring reward model (`reward_model`) and
public process reward models (`hf_reward`). Models know nothing of tasks or training."""
from refiner_jax.models.decoder import Decoder
from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.language_model import LanguageModel, init_params
from refiner_jax.models.t5 import T5, shift_right
from refiner_jax.models.t5_config import PRESETS, T5Config, preset

__all__ = ["Decoder", "DecoderConfig", "LanguageModel", "PRESETS", "T5", "T5Config", "init_params", "preset",
           "shift_right"]
