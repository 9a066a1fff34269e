"""The moral_stories task as a package (its module, moved unchanged; split by idea in the next commit)."""
from refiner_jax.tasks.moral_stories.moral_stories_task import *  # noqa: F401,F403
