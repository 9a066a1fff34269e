"""Reasoning tasks (pure Python/numpy): MWP, sNLR, Moral Stories, GSM8K.

`get_task(name, **options)` returns a task object implementing `tasks.base.Task`.
"""
from __future__ import annotations

import importlib

from refiner_jax.tasks.base import (
    DEFAULT_REFINE_TEMPLATE,
    NO_HINT,
    DataError,
    Example,
    Feedback,
    StepError,
    Task,
    refine_input,
)

# task name -> (module, class name)
_REGISTRY = {
    "mwp": ("refiner_jax.tasks.mwp", "MWPTask"),
    "snlr": ("refiner_jax.tasks.snlr", "SNLRTask"),
    "moral_stories": ("refiner_jax.tasks.moral_stories", "MoralStoriesTask"),
    "gsm8k": ("refiner_jax.tasks.gsm8k", "GSM8KTask"),
}


def get_task(name: str, **options) -> Task:
    """Builds the task called `name` with its options (e.g. `get_task("mwp", no_change_rate=0.2)`)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(_REGISTRY)}")
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = [
    "DEFAULT_REFINE_TEMPLATE", "NO_HINT", "DataError", "Example", "Feedback", "StepError", "Task",
    "get_task", "refine_input",
]
