"""What a run directory says about itself: the config it was trained with and its tokenizer."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from refiner_jax.tasks import get_task
from refiner_jax.tasks.base import Task
from refiner_jax.tokenizers import Tokenizer, load_tokenizer


@dataclasses.dataclass
class RunInfo:
    """A run directory's config (`runs.run_config.load`, defaults filled) and tokenizer (`<workdir>/tokenizer`)."""

    workdir: str
    config: Any

    @property
    def lengths(self) -> dict:
        return self.config["lengths"]

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(os.path.join(self.workdir, "tokenizer"))

    def task(self) -> Task:
        return get_task(self.config["task"]["name"], **dict(self.config["task"]["options"]))
