"""The gsm8k task as a package (its module, moved unchanged; split by idea in the next commit)."""
from refiner_jax.tasks.gsm8k.gsm8k_task import *  # noqa: F401,F403
