"""The snlr task as a package (its module, moved unchanged; split by idea in the next commit)."""
from refiner_jax.tasks.snlr.snlr_task import *  # noqa: F401,F403
