"""Models: the Flax T5 (`t5`), the decoder-only LM (`decoder`: GPT-2, Llama, Qwen2; sampled with
`decoder_sampling`), their transformers checkpoint bridges (`hf`, `hf_decoder`), one interface over both families
(`language_model`) and the step-scoring reward model (`reward_model`). Models know nothing of tasks or training."""
from refiner_jax.models.decoder import Decoder
from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.t5 import T5, shift_right
from refiner_jax.models.t5_config import PRESETS, T5Config, preset

__all__ = ["Decoder", "DecoderConfig", "PRESETS", "T5", "T5Config", "preset", "shift_right"]
