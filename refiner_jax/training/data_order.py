"""Deterministic, resumable example order for training.

``EpochOrder`` yields global batches of example indices: epoch ``e`` visits ``permutation(seed, e)`` of
``range(num_examples)`` in consecutive chunks of ``batch_size`` (the incomplete tail chunk of each epoch is
dropped, so every step sees the same shape and the step compiles once). Its position is the small JSON-able dict
``state_dict()``; save it with each checkpoint (``Checkpointer.save(..., extra={'data': order.state_dict()})``) and
``load_state_dict`` it on resume to continue the exact same sequence. On several hosts every process computes the
same global indices and reads its own rows (``sharding.host_batch_slice``).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


class EpochOrder:
    """Epoch-seeded permutation iterator over ``num_examples`` in global batches of ``batch_size`` indices."""

    def __init__(self, num_examples: int, batch_size: int, seed: int = 0, shuffle: bool = True):
        if batch_size < 1 or num_examples < batch_size:
            raise ValueError(f"need 1 <= batch_size ({batch_size}) <= num_examples ({num_examples})")
        self.num_examples, self.batch_size, self.seed, self.shuffle = num_examples, batch_size, seed, shuffle
        self.epoch, self.batch_in_epoch = 0, 0
        self._order = self._epoch_order(0)

    @property
    def batches_per_epoch(self) -> int:
        return self.num_examples // self.batch_size

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_examples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)

    def next_indices(self) -> np.ndarray:
        """The next global batch of example indices ``[batch_size]`` (int64)."""
        if self.batch_in_epoch == self.batches_per_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        start = self.batch_in_epoch * self.batch_size
        self.batch_in_epoch += 1
        return self._order[start:start + self.batch_size]

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            yield self.next_indices()

    def state_dict(self) -> dict[str, Any]:
        """The position (plus the settings it is only valid for), as plain JSON-able values."""
        return dict(epoch=self.epoch, batch_in_epoch=self.batch_in_epoch, num_examples=self.num_examples,
                    batch_size=self.batch_size, seed=self.seed, shuffle=self.shuffle)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Moves to a position saved by ``state_dict``; refuses one saved for a different dataset or batching."""
        for name in ("num_examples", "batch_size", "seed", "shuffle"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"data order saved with {name}={state[name]!r} cannot resume a run with {name}="
                    f"{getattr(self, name)!r}; restore with the original data/config or start a fresh run")
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        self._order = self._epoch_order(self.epoch)
