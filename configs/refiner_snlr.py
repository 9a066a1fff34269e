"""REFINER on synthetic natural-language reasoning (sNLR, HELM's "hard" rule/fact problems).

  --config=configs/refiner_snlr.py           freshly generated data (seeded; needs no files), decoder-only models
                                             (`llama-mini`, as the MWP default)
  --config=configs/refiner_snlr.py:released  REFINER's released splits (`task.data_dir` = the folder holding
                                             srn_{train,val,test}.json)
  --config=configs/refiner_snlr.py:t5        generated data with t5-tiny models
"""
from refiner_jax.tasks.base import shared_data_dir
from refiner_jax.runs import run_config as base


def get_config(arg: str | None = None):
    config = base.base_config()
    config.task.name = "snlr"
    config.task.options = {"train_size": 4000, "val_size": 300, "test_size": 1000}
    # Token budgets above the longest generated instance (subword vocabulary 1024): problem 83, chain 28,
    # critic input 108, revision input 119.
    config.lengths.input = 96
    config.lengths.refine_input = 128
    config.lengths.critic_input = 112
    config.lengths.target = 32
    config.eval.examples = 1000
    variant = arg or "default"
    if variant != "t5":
        config.model.family = "decoder"
        config.model.preset = "llama-mini"
    if variant == "released":
        config.task.options = {}
        config.task.data_dir = shared_data_dir("refiner", "srn")
    elif variant not in ("default", "t5"):
        raise ValueError(f"unknown variant {variant!r} for refiner_snlr.py; use default, released or t5")
    return config
