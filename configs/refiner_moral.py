"""REFINER on Moral Stories: the generator writes the norm (z) and the moral action (y); the critic flags
contradictions and semantically misaligned norms. Only the dev and test files are public here, so this trains on
dev and tests on test (`task.data_dir` = the folder holding actor_dev.json / actor_test.json).

  --config=configs/refiner_moral.py      decoder-only models (`llama-mini`, as the MWP default)
  --config=configs/refiner_moral.py:t5   t5-tiny models
"""
from refiner_jax.tasks.base import shared_data_dir
from refiner_jax.runs import run_config as base


def get_config(arg: str | None = None):
    config = base.base_config()
    config.task.name = "moral_stories"
    config.task.data_dir = shared_data_dir("refiner", "moral_stories")
    config.tokenizer.vocab_size = 2048
    config.lengths.input = 160
    config.lengths.refine_input = 224
    config.lengths.critic_input = 224
    config.lengths.target = 64
    config.lengths.feedback = 48
    variant = arg or "default"
    if variant == "default":
        config.model.family = "decoder"
        config.model.preset = "llama-mini"
    elif variant != "t5":
        raise ValueError(f"unknown variant {variant!r} for refiner_moral.py; use default or t5")
    return config
