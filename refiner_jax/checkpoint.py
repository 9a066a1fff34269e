"""Checkpoints: full training state for resuming (``Checkpointer``) and params-only exports for inference.

Layout of a run directory managed by ``Checkpointer``::

    <directory>/<step>/state/    the TrainState pytree (Orbax PyTree format, OCDBT), saved from any sharding
    <directory>/<step>/extra/    small JSON (data-iterator position, anything resumable that is not an array)
    <directory>/<step>/metrics/  the validation metrics passed at save time (used for best-checkpoint retention)

Saves are asynchronous (training continues while arrays are written) and atomic: a step directory appears only
once complete, and leftovers of a save interrupted by a crash are removed on the next start. A latest checkpoint
damaged afterwards (a truncated or unreadable file) is reported by ``restore``, which falls back to the newest one
that reads and moves the damaged ones to ``<directory>.damaged/<step>``. Restoring reads into
``jax.ShapeDtypeStruct``s that carry the *target* shardings, so a checkpoint written on one mesh loads onto any other
mesh or device count (``training.state.abstract_train_state`` builds that target).

A params-only export (``export_params`` / ``load_params``) is a separate directory ``<dir>/params`` plus
``<dir>/metadata.json``; it has no optimizer state and is what inference and fine-tuning from a trained model load.
A LoRA stage also exports its adapters as PEFT's files (``export_adapters``).
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.sharding import SingleDeviceSharding

from refiner_jax import atomic_files
from refiner_jax import sharding as shd

_POLICIES = ocp.checkpoint_managers


def _restore_args(target: Any) -> Any:
    return ocp.checkpoint_utils.construct_restore_args(target)


class DamagedCheckpointWarning(UserWarning):
    """The latest checkpoint could not be read; an older one was restored instead."""


class NoReadableCheckpointError(RuntimeError):
    """No checkpoint of a directory could be read into the restore target."""


class Checkpointer:
    """Periodic, asynchronous full-state checkpoints with keep-last-N plus keep-best-by-metric retention.

    Args:
      directory: run checkpoint directory (created if missing).
      save_interval_steps: ``should_save(step)`` / ``save(step, ...)`` act on multiples of this.
      keep_last: the ``keep_last`` most recent checkpoints are always kept.
      best_metric: a key of the ``metrics`` given to ``save``; the ``keep_best`` best checkpoints by it are kept too
        (checkpoints saved without metrics count only for keep_last). None: keep-last only.
      best_mode: 'min' (e.g. a loss) or 'max' (e.g. an accuracy).
      async_save: write in a background thread (call ``wait_until_finished`` or ``close`` before reading).

    Use it as a context manager (or call ``close``) so pending writes finish before the process exits.
    """

    def __init__(self, directory: str | os.PathLike, *, save_interval_steps: int = 1000, keep_last: int = 3,
                 best_metric: str | None = None, best_mode: str = "min", keep_best: int = 1,
                 async_save: bool = True):
        if best_mode not in ("min", "max"):
            raise ValueError(f"best_mode must be 'min' or 'max', got {best_mode!r}")
        if save_interval_steps < 1 or keep_last < 1 or keep_best < 1:
            raise ValueError("save_interval_steps, keep_last and keep_best must all be >= 1")
        self.directory = os.path.abspath(os.fspath(directory))
        self.best_metric, self.best_mode = best_metric, best_mode
        policies = [_POLICIES.LatestN(keep_last)]
        best_fn = None
        if best_metric is not None:
            best_fn = lambda metrics: float(metrics[best_metric])  # noqa: E731
            policies.append(_POLICIES.BestN(get_metric_fn=best_fn, reverse=best_mode == "min", n=keep_best,
                                            keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            save_decision_policy=_POLICIES.FixedIntervalPolicy(save_interval_steps),
            preservation_policy=_POLICIES.AnyPreservationPolicy(policies),
            best_fn=best_fn, best_mode=best_mode,
            enable_async_checkpointing=async_save, cleanup_tmp_directories=True, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    # -- saving ----------------------------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` (without ``force``) would write a checkpoint."""
        return self._manager.should_save(step)

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None,
             metrics: dict[str, float] | None = None, force: bool = False) -> bool:
        """Saves ``state`` (any pytree of arrays, e.g. a TrainState) and ``extra`` (JSON-able dict) as ``step`` if
        it is a save step (or ``force``); returns whether a save started. ``metrics`` are validation results for
        best-checkpoint retention. Saving a step that already exists is a no-op."""
        if step in self._manager.all_steps():
            return False
        if metrics is not None:
            if self.best_metric is not None and self.best_metric not in metrics:
                raise ValueError(f"save(metrics=...) lacks the best_metric {self.best_metric!r} this Checkpointer "
                                 f"ranks by; got keys {sorted(metrics)}")
            metrics = {k: float(v) for k, v in metrics.items()}
        args = ocp.args.Composite(state=ocp.args.PyTreeSave(state), extra=ocp.args.JsonSave(dict(extra or {})))
        return self._manager.save(step, args=args, metrics=metrics, force=force)

    # -- restoring -------------------------------------------------------------------------------------------------

    def _step_or_latest(self, step: int | None) -> int:
        if step is None:
            step = self._manager.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        elif step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; "
                                    f"available: {self._manager.all_steps()}")
        return step

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """``(state, extra)`` of ``step`` (default: latest), with arrays laid out as the ShapeDtypeStructs of
        ``target`` say (shape, dtype, sharding) - e.g. ``abstract_train_state(...)[0]`` for the current mesh.

        Without ``step``, a latest checkpoint that cannot be read (a truncated or missing file) is reported with a
        `DamagedCheckpointWarning` and the next older one is tried; once one reads, the unreadable newer ones are
        moved to ``<directory>.damaged/`` (so training saves those steps afresh). When none reads, nothing is moved
        and `NoReadableCheckpointError` names every step's error."""
        if step is not None:
            return self._restore(self._step_or_latest(step), target)
        failed = []
        for candidate in sorted(self._manager.all_steps(), reverse=True):
            restored, error = self._restore_or_error(candidate, target)
            if not shd.all_processes_ok(error is None):  # a step any process cannot read is skipped by all
                error = error or OSError("another process of this run cannot read it")
                failed.append((candidate, error))
                warnings.warn(f"checkpoint step {candidate} at {os.path.join(self.directory, str(candidate))} "
                              f"cannot be read ({type(error).__name__}: {_first_line(error)}); trying the one "
                              "before it", DamagedCheckpointWarning, stacklevel=2)
                continue
            self._set_aside([s for s, _ in failed])
            return restored
        if not failed:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        raise NoReadableCheckpointError(
            f"no checkpoint in {self.directory} can be read: "
            + "; ".join(f"step {s}: {type(e).__name__}: {_first_line(e)}" for s, e in failed)
            + ". If they were written by another model or config, rerun with that config; if they are damaged, "
            f"move {self.directory} away to start the stage over")

    def _restore_or_error(self, step: int, target: Any) -> tuple[Any, BaseException | None]:
        """(restored, None), or (None, the error) when this process cannot read `step`. Either way every process
        leaves at the same collective: orbax's restore ends with a barrier, and a process whose read failed before
        it meets the others there under another name, which fails that barrier on every process alike (orbax and
        tensorstore raise ValueError, OSError, KeyError, JSON errors)."""
        try:
            return self._restore(step, target), None
        except Exception as e:
            if _barrier_mismatch(e):
                return None, OSError("another process of this run cannot read it")
            try:
                shd.sync_processes(f"checkpoint step {step} unreadable")
            except AssertionError:
                pass
            return None, e

    def _restore(self, step: int, target: Any) -> tuple[Any, dict[str, Any]]:
        args = ocp.args.Composite(state=ocp.args.PyTreeRestore(item=target, restore_args=_restore_args(target)),
                                  extra=ocp.args.JsonRestore())
        restored = self._manager.restore(step, args=args)
        return restored.state, dict(restored.extra or {})

    def _set_aside(self, steps: list[int]) -> None:
        """Moves the step directories of ``steps`` to ``<directory>.damaged/`` and forgets them."""
        if not steps:
            return
        if shd.is_main_process():
            aside = self.directory + ".damaged"
            os.makedirs(aside, exist_ok=True)
            for step in steps:
                destination = os.path.join(aside, str(step))
                if os.path.exists(destination):
                    shutil.rmtree(destination)
                os.replace(os.path.join(self.directory, str(step)), destination)
        shd.sync_processes("damaged checkpoints set aside")
        self._manager.reload()

    def restore_params(self, target: Any, step: int | None = None) -> Any:
        """Only the ``params`` of a saved TrainState (no optimizer state is read): for fine-tuning with a fresh
        optimizer or evaluating a checkpoint. ``target`` is the abstract params tree with shardings."""
        step = self._step_or_latest(step)
        item = {"params": target}
        args = ocp.args.Composite(state=ocp.args.PyTreeRestore(item=item, restore_args=_restore_args(item),
                                                               partial_restore=True))
        return self._manager.restore(step, args=args).state["params"]

    # -- bookkeeping -----------------------------------------------------------------------------------------------

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def best_step(self) -> int | None:
        """The kept step with the best ``best_metric`` (None if no checkpoint has metrics or no best_metric)."""
        if self.best_metric is None:
            return None
        scored = [s for s in self._manager.all_steps() if self._manager.metrics(s)]
        return self._manager.best_step() if scored else None

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def metrics(self, step: int) -> dict[str, float] | None:
        return self._manager.metrics(step)

    def wait_until_finished(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _barrier_mismatch(error: BaseException) -> bool:
    """Whether `error` is a barrier that other processes reached under another name (jax's
    `sync_global_devices`): this process got through its own read."""
    return isinstance(error, AssertionError) and "sync_global_devices name mismatch" in str(error)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]


# ------------------------------------------------------------------------------------------------------------------
# Params-only export
# ------------------------------------------------------------------------------------------------------------------


def export_params(directory: str | os.PathLike, params: Any, metadata: dict[str, Any] | None = None) -> None:
    """Writes ``params`` to ``<directory>/params`` and ``metadata`` (JSON-able: model config, vocabulary, the
    step it came from, ...) to ``<directory>/metadata.json``; overwrites an earlier export. Blocks until done."""
    directory = os.path.abspath(os.fspath(directory))
    ocp.PyTreeCheckpointer().save(os.path.join(directory, "params"), args=ocp.args.PyTreeSave(params), force=True)
    if shd.is_main_process():
        atomic_files.write_json(os.path.join(directory, "metadata.json"), dict(metadata or {}), indent=2,
                                sort_keys=True)
    shd.sync_processes("export_params")  # the export is complete for every process once this returns


def export_adapters(directory: str | os.PathLike, lora: Any, adapters: Any) -> None:
    """Writes LoRA ``adapters`` (a `models.lora.Lora`'s tree) as PEFT's adapter files in ``directory``, replacing an
    earlier export whole. Every process calls it: the adapters are gathered from their shards, process 0 writes."""
    from jax.experimental import multihost_utils

    from refiner_jax.models import peft_io

    host = (multihost_utils.process_allgather(adapters, tiled=True) if jax.process_count() > 1
            else jax.device_get(adapters))
    if shd.is_main_process():
        directory = os.path.abspath(os.fspath(directory))
        partial = directory + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        peft_io.save_adapters(partial, lora, host)
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(partial, directory)
    shd.sync_processes("export_adapters")


def load_params(directory: str | os.PathLike, target: Any = None) -> tuple[Any, dict[str, Any]]:
    """``(params, metadata)`` from an ``export_params`` directory.

    ``target``: abstract params (ShapeDtypeStructs with shardings) to load onto a mesh; None loads every array
    onto this process's first device with its saved shape and dtype.
    """
    directory = os.path.abspath(os.fspath(directory))
    path = os.path.join(directory, "params")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} does not exist: {directory} is not a params export (see export_params)")
    checkpointer = ocp.PyTreeCheckpointer()
    if target is None:
        saved = checkpointer.metadata(path).item_metadata.tree
        device = SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved)
    params = checkpointer.restore(path, args=ocp.args.PyTreeRestore(item=target, restore_args=_restore_args(target)))
    meta_path = os.path.join(directory, "metadata.json")
    metadata = {}
    if os.path.exists(meta_path):
        with open(meta_path, encoding="utf-8") as f:
            metadata = json.load(f)
    return params, metadata
