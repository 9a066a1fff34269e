"""Trains and evaluates one run of the config's pipeline: REFINER (tokenizer, warm-up, critic, REFINER loop,
evaluation) or reward models (SFT policy, ORM, PRM, expert iteration, K-sample selection).

    python launch/train.py --config=configs/refiner_mwp.py --workdir=/tmp/refiner_mwp
    python launch/train.py --config=configs/refiner_mwp.py:svamp --config.task.data_dir=PATH --workdir=...
    python launch/train.py --config=configs/refiner_snlr.py --config.refiner.turns=4 --workdir=...
    python launch/train.py --config=configs/rm_mwp.py --workdir=/tmp/rm_mwp

Rerunning with the same --workdir skips finished stages and resumes an interrupted one. The logic lives in
`refiner_jax.runs.refiner_run` and `refiner_jax.runs.reward_run`; this file only parses flags. On Linux it first
starts itself again with a faster malloc for XLA:CPU (`refiner_jax.cpu`: jemalloc where installed, else glibc's
transparent huge pages; `REFINER_JAX_MALLOC=glibc` keeps glibc's malloc, `REFINER_JAX_MALLOC=glibc-retain` keeps it
and its freed memory, `REFINER_JAX_MALLOC=system` the malloc and settings the process started with).
"""
if __name__ == "__main__":  # before JAX starts or any flag is read
    from refiner_jax import cpu
    cpu.restart_with_fast_malloc()

import os

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from refiner_jax import cpu, sharding
from refiner_jax.runs import joint_run, refiner_run, reward_run

_PIPELINES = {"refiner": refiner_run, "reward": reward_run, "joint": joint_run}

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py[:variant]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/refiner", "Run directory (checkpoints, metrics, results).")
_STAGES = flags.DEFINE_list("stages", [], f"Stages to run (default: all of the config's pipeline): from "
                            f"{refiner_run.STAGES} (config.pipeline 'refiner'), {reward_run.STAGES} ('reward') or "
                            f"{joint_run.STAGES} ('joint').")
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() (TPU pod slices, multi-node "
                                "GPU clusters; the cluster is auto-detected).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for a multi-process run "
                                   "on machines JAX does not auto-detect (with --num_processes, --process_id).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run (with --coordinator_address).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0 .. num_processes - 1.")
_HOST_DEVICES = flags.DEFINE_integer("host_devices", 1, "On a CPU: split it into this many XLA host devices (0: one "
                                     "per core). The mesh's axes then span them: batches and the sampler's prompts "
                                     "are split over them. Ignored on GPU and TPU.")
flags.mark_flags_as_required(["config"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # keep checkpointing chatter out of the progress output
    if _HOST_DEVICES.value < 0:
        raise app.UsageError(f"--host_devices={_HOST_DEVICES.value}: use a positive count, or 0 for one per core")
    host_devices = cpu.expose_host_devices(_HOST_DEVICES.value or os.cpu_count() or 1)
    sharding.maybe_initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                                          enabled=_MULTIHOST.value)
    if jax.default_backend() == "cpu" and jax.local_device_count() != host_devices:
        raise app.UsageError(f"JAX started its CPU backend with {jax.local_device_count()} devices before "
                             f"--host_devices={_HOST_DEVICES.value} could apply; set XLA_FLAGS="
                             f"{cpu.HOST_DEVICES_FLAG}={host_devices} in the environment instead")
    pipeline = _CONFIG.value.get("pipeline", "refiner")
    if pipeline not in _PIPELINES:
        raise app.UsageError(f"config.pipeline {pipeline!r} is not a pipeline; use one of {sorted(_PIPELINES)}")
    module = _PIPELINES[pipeline]
    module.run(_CONFIG.value, _WORKDIR.value, tuple(_STAGES.value) or module.STAGES)


if __name__ == "__main__":
    app.run(main)
