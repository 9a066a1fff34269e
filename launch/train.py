"""Trains and evaluates one run of the config's pipeline: REFINER (tokenizer, warm-up, critic, REFINER loop,
evaluation) or reward models (SFT policy, ORM, PRM, expert iteration, K-sample selection).

    python launch/train.py --config=configs/refiner_mwp.py --workdir=/tmp/refiner_mwp
    python launch/train.py --config=configs/refiner_mwp.py:svamp --config.task.data_dir=PATH --workdir=...
    python launch/train.py --config=configs/refiner_snlr.py --config.refiner.turns=4 --workdir=...
    python launch/train.py --config=configs/rm_mwp.py --workdir=/tmp/rm_mwp

    python launch/train.py --config=configs/refiner_mwp.py --workdir=/tmp/refiner_mwp --dry_run

Rerunning with the same --workdir skips finished stages and resumes an interrupted one. `--dry_run` checks the config
and the data, prints the resolved config, the data source and the stages with their updates, and exits without
creating the workdir.

Data: every run prints its data source first, and where it came from. `--config.task.data_dir` names it (a folder,
split=PATH data files or a hub name); the configs of datasets (`:svamp`, `refiner_moral.py`, `rm_gsm8k.py`,
`refiner_snlr.py:released`) name a folder under $REFINER_DATA, or, when that is unset, under the shared data folder
beside the checkout (../shared/data); an empty task.data_dir uses the task's embedded default (the MWP and SNLR
generators).

A mistake in the flags, the config or the data ends as one line `error: ...` and exit status 2, before the workdir
is created. The logic lives in `refiner_jax.runs.refiner_run` and `refiner_jax.runs.reward_run`; this file only
parses flags. On Linux it first starts itself again with a faster malloc for XLA:CPU (`refiner_jax.cpu`: jemalloc
where installed, else glibc's transparent huge pages; `REFINER_JAX_MALLOC=glibc` keeps glibc's malloc,
`REFINER_JAX_MALLOC=glibc-retain` keeps it and its freed memory, `REFINER_JAX_MALLOC=system` the malloc and settings
the process started with).
"""
if __name__ == "__main__":  # before JAX starts or any flag is read
    from refiner_jax import cpu
    cpu.restart_with_fast_malloc()

import os

import jax
from absl import flags
from ml_collections import config_flags

from refiner_jax import cpu, sharding
from refiner_jax.runs import cli, joint_run, refiner_run, reward_run, run_setup
from refiner_jax.runs.run_config import ConfigError
from refiner_jax.tasks import data_sources

_PIPELINES = {"refiner": refiner_run, "reward": reward_run, "joint": joint_run}

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file (configs/*.py[:variant]); override any field with --config.FIELD=VALUE. "
    "Its data source is config.task.data_dir: the dataset configs name a folder under $REFINER_DATA (unset: "
    "../shared/data beside the checkout); empty: the task's embedded generator.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/refiner", "Run directory (checkpoints, metrics, results).")
_STAGES = flags.DEFINE_list("stages", [], f"Stages to run (default: all of the config's pipeline): from "
                            f"{refiner_run.STAGES} (config.pipeline 'refiner'), {reward_run.STAGES} ('reward') or "
                            f"{joint_run.STAGES} ('joint').")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Check the config and the data, print the resolved config, the data "
                             "source and the stages with their updates, and exit without creating the workdir.")
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
    config, workdir = _CONFIG.value, _WORKDIR.value
    pipeline = config.get("pipeline", "refiner")
    if pipeline not in _PIPELINES:
        raise ConfigError(f"config.pipeline: {pipeline!r} is not a pipeline{cli.suggestion(pipeline, _PIPELINES)}; "
                          f"use one of {sorted(_PIPELINES)}")
    module = _PIPELINES[pipeline]
    stages = tuple(_STAGES.value) or module.STAGES
    for stage in stages:
        if stage not in module.STAGES:
            raise ConfigError(f"--stages: {stage!r} is not a stage of the {pipeline} pipeline"
                              f"{cli.suggestion(stage, module.STAGES)}; choose from {', '.join(module.STAGES)}")
    if _HOST_DEVICES.value < 0:
        raise ConfigError(f"--host_devices={_HOST_DEVICES.value}: use a positive count, or 0 for one per core")
    given = "task.data_dir" in cli.config_overrides()
    print(data_sources.describe(config.task.data_dir, given), flush=True)
    data_sources.require(config.task.data_dir, given)
    host_devices = cpu.expose_host_devices(_HOST_DEVICES.value or os.cpu_count() or 1)
    if not _DRY_RUN.value:
        sharding.maybe_initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                                              enabled=_MULTIHOST.value)
    if jax.default_backend() == "cpu" and jax.local_device_count() != host_devices:
        raise ConfigError(f"--host_devices={_HOST_DEVICES.value}: JAX started its CPU backend with "
                          f"{jax.local_device_count()} devices before it could apply; set XLA_FLAGS="
                          f"{cpu.HOST_DEVICES_FLAG}={host_devices} in the environment instead")
    if _DRY_RUN.value:
        _dry_run(config, module, workdir, stages)
        return
    module.run(config, workdir, stages)


def _plan(config, module, workdir: str, stages: tuple[str, ...], name: str = "") -> list[str]:
    """`run_setup.check` of a refiner or reward run (`name`: the joint config's section holding it), then its
    stages' plan."""
    run_setup.check(config, workdir, stages, module.STAGES, run_setup.training_sections(config, module.STAGES))
    indent, prefix = ("  ", f"config.{name}.") if name else ("", "config.")
    return [indent + line for line in run_setup.stage_plan(config, workdir, stages, prefix)]


def _fields(config, prefix: str = ""):
    """(dotted field, value) of every leaf of a config, in its order."""
    for key, value in config.items():
        if hasattr(value, "items"):
            yield from _fields(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _dry_run(config, module, workdir: str, stages: tuple[str, ...]) -> None:
    """Checks what `module.run` would check before its first stage and prints the plan; writes nothing."""
    if module is joint_run:
        joint_run.validate(config)
        lines = []
        for name, sub, sub_stages, given in (
                ("refiner", joint_run.refiner_run, joint_run.REFINER_STAGES, config.joint.refiner_workdir),
                ("reward", joint_run.reward_run, joint_run.REWARD_STAGES, config.joint.reward_workdir)):
            if name not in stages:
                continue
            if given:
                lines.append(f"  {name:<15} none: config.joint.{name}_workdir names the finished run {given}")
                continue
            lines.append(f"  {name:<15} a {name} run in {os.path.join(workdir, name)}:")
            lines += _plan(config[f"{name}_run"], sub, os.path.join(workdir, name), sub_stages, f"{name}_run")
        if "joint" in stages:
            lines.append(f"  {'joint':<15} evaluation (no training): {config.joint.samples} samples per test problem")
    else:
        lines = _plan(config, module, workdir, stages)
    print("Resolved config (each field as --config.FIELD would set it):")
    print("\n".join(f"  {field} = {value!r}" for field, value in _fields(config)))
    print(f"Stages of the {config.get('pipeline', 'refiner')} pipeline:")
    print("\n".join(lines))
    state = "exists; nothing in it was changed" if os.path.exists(workdir) else "was not created"
    print(f"Dry run: the config and the data are valid; {workdir} {state}.")


if __name__ == "__main__":
    cli.run(main)
