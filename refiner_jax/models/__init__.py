"""Models: the Flax T5 (`t5`) and its transformers checkpoint bridge (`hf`). Models know nothing of tasks or
training."""
from refiner_jax.models.t5 import PRESETS, T5, T5Config, preset, shift_right

__all__ = ["PRESETS", "T5", "T5Config", "preset", "shift_right"]
