"""REFINER on Moral Stories: the generator writes the norm (z) and the moral action (y); the critic flags
contradictions and semantically misaligned norms. Only the dev and test files are public here, so this trains on
dev and tests on test (`task.data_dir` = the folder holding actor_dev.json / actor_test.json).
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
    if arg:
        raise ValueError(f"refiner_moral.py has no variant {arg!r}")
    return config
