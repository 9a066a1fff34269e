"""Outcome- vs process-based feedback on math word problems (Uesato et al.'s comparison at laptop scale).

  --config=configs/rm_mwp.py          embedded synthetic MWP, t5-tiny policy and reward models; runs on a CPU
  --config=configs/rm_mwp.py:small    t5-small, more samples and steps (an accelerator recommended)

The PRM's labels come from the task's step checker (each `#k` step must compute a distinct subexpression of the gold
formula); `--config.reward.labels_file=PATH.jsonl` trains it on PRM800K-style human step labels instead.
"""
from refiner_jax.training import config as base


def get_config(arg: str | None = None):
    config = base.base_config()
    config.pipeline = "reward"
    config.task.name = "mwp"
    config.warmup.feedback_fraction = 0.0  # plain SFT, x -> z
    variant = arg or "default"
    if variant == "small":
        config.model.preset = "t5-small"
        config.warmup.steps = 3000
        config.reward.samples = 16
        config.reward.train_problems = 5000
        config.reward.steps = 3000
        config.reward.test_samples = 96
        config.rl.rounds = 2
        config.rl.samples = 16
        config.rl.steps = 1000
    elif variant != "default":
        raise ValueError(f"unknown variant {variant!r} for rm_mwp.py; use one of: default, small")
    return config
