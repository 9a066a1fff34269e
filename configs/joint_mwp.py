"""The joint system on math word problems: a REFINER run's generator and critic and a reward run's PRM, combined as
locate (PRM) + explain (critic) + revise (generator, from the located step) + rerank (PRM), against each part alone
at equal compute (`runs/joint_run.py`).

  --config=configs/joint_mwp.py            the trace-error variant of the embedded generator (`rm_mwp.py:trace`), K = 16
  --config=configs/joint_mwp.py:converge   the same with every model it trains trained to its validation plateau
                                           (`refiner_mwp.py:converge`'s stages; the SFT policy and the PRM likewise)

`--config.joint.refiner_workdir=DIR --config.joint.reward_workdir=DIR` reuse finished runs (a REFINER run of
`configs/refiner_mwp.py`, a reward run of `configs/rm_mwp.py:trace`); left empty, the job first trains what it uses
of them (the REFINER run's warm-up, critic and loop; the reward run's SFT policy and PRM), in `<workdir>/refiner` and
`<workdir>/reward`, with the configs below.
"""
import importlib.util
import os

import ml_collections

from refiner_jax.runs import run_config


def _sibling(name: str, arg: str | None = None):
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def get_config(arg: str | None = None):
    if arg not in (None, "default", "converge"):
        raise ValueError(f"unknown variant {arg!r} for joint_mwp.py; use: default, converge")
    c = ml_collections.ConfigDict()
    c.pipeline = "joint"
    c.seed = 0
    c.reward_run = _sibling("rm_mwp", "trace")
    c.reward_run.reward.labels = "checker"  # the joint rows use the checker-labelled PRM only
    c.refiner_run = _sibling("refiner_mwp", "converge" if arg == "converge" else None)
    if arg == "converge":
        c.refiner_run.refiner.controls = False  # the joint rows use the REFINER generator and critic only
        run_config.use_convergence(c.reward_run, {"warmup": 3000}, patience=3, eval_examples=500)
        run_config.use_convergence(c.reward_run, {"reward": 2400}, patience=3)
    c.refiner_run.task = c.reward_run.task.to_dict()  # both runs on the same problems
    c.task = c.reward_run.task.to_dict()
    # One seed for the whole job: the runs it trains follow `--config.seed` unless given their own
    # (`--config.refiner_run.seed=S`); `+ 0` makes each a derived reference, so setting a run's seed leaves the job's.
    c.refiner_run.seed = c.get_ref("seed") + 0
    c.reward_run.seed = c.get_ref("seed") + 0
    # samples: K per test problem from the REFINER generator (temperature, top_p); turns: the REFINER loop's and the
    # joint system's revision rounds; the gate and the step threshold come from `val_problems` validation problems;
    # tables over `examples` test problems.
    c.joint = ml_collections.ConfigDict({
        "refiner_workdir": "", "reward_workdir": "", "samples": 16, "temperature": 0.7, "top_p": 1.0, "turns": 3,
        "examples": 1000, "val_problems": 300, "batch_size": 128, "bootstrap_samples": 1000, "abstention": 0.3})
    return c
