"""Stopping a stage whose updates keep being skipped for a non-finite loss or gradient.

`steps.make_train_step` skips such an update inside the jitted step (parameters and optimizer state unchanged) and
reports it in the metric ``nonfinite_skips``. A `SkipCounter` keeps those per-step flags as device scalars and reads
them only where the training loop already waits for the device (logging, evaluation, checkpoints), so no step adds a
host sync; once the skips in a row reach the limit it raises `NonFiniteError`, before anything more is saved.
"""
from __future__ import annotations

from typing import Any

import jax

from refiner_jax import checkpoint as ckpt_lib


class NonFiniteError(RuntimeError):
    """A stage stopped because its last updates were all skipped: the loss or gradient was NaN or inf."""


class SkipCounter:
    """Counts the skipped updates of one stage: in a row (for the limit) and in all since it (re)started."""

    def __init__(self, stage: str, limit: int):
        if limit < 1:
            raise ValueError(f"the limit of non-finite updates in a row must be >= 1, got {limit}")
        self.stage, self.limit = stage, limit
        self.in_row, self.total = 0, 0
        self._pending: list[Any] = []  # device scalars of the steps since the last check

    def add(self, metrics: dict[str, Any]) -> None:
        """Records a train step's metrics (no host sync)."""
        self._pending.append(metrics["nonfinite_skips"])

    def check(self, step: int, checkpointer: ckpt_lib.Checkpointer) -> int:
        """Reads the flags recorded since the last check (waits for those steps); returns the skips in all, or
        raises `NonFiniteError` naming the stage, the step and the checkpoint a rerun resumes from."""
        for skipped in jax.device_get(self._pending):
            self.in_row = self.in_row + 1 if skipped else 0
            self.total += int(skipped > 0)
        self._pending = []
        if self.in_row < self.limit:
            return self.total
        checkpointer.wait_until_finished()
        latest = checkpointer.latest_step()
        resume = (f"the last good checkpoint is step {latest} in {checkpointer.directory}, where a rerun resumes"
                  if latest is not None else "no checkpoint of this stage was written, so a rerun starts it over")
        raise NonFiniteError(
            f"[{self.stage}] stopped at step {step}: its last {self.in_row} updates were skipped because the loss or "
            f"gradient was not finite (NaN or inf; config.max_nonfinite_skips is {self.limit}). Nothing non-finite "
            f"was saved: {resume}. Lower the stage's optimizer.learning_rate or set its grad_clip_norm, or fix the "
            "data that give a non-finite loss, then rerun.")
