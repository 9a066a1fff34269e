"""The mwp task as a package (its module, moved unchanged; split by idea in the next commit)."""
from refiner_jax.tasks.mwp.mwp_task import *  # noqa: F401,F403
