"""REFINER on math word problems.

  --config=configs/refiner_mwp.py          embedded synthetic MWP, a small decoder-only model (Llama-style
                                           `llama-mini`, 1.0M parameters); every stage runs on a laptop CPU
  --config=configs/refiner_mwp.py:t5       the same with T5 models of the same size (t5-tiny)
  --config=configs/refiner_mwp.py:converge the default trained to convergence: every stage stops after 3 validations
                                           on the whole validation split without a better score (caps: 6x the
                                           default's steps, 4x for the loop), a constant learning rate after warm-up,
                                           and the loop's controls (`refiner.controls`: the loop with random
                                           feedback, the warm-up continued without feedback) with their rows,
                                           and the inference factorial (`eval.factorial`)
  --config=configs/refiner_mwp.py:svamp    train on MAWPS+ASDiv-A, test on SVAMP (`task.data_dir` = the folder
                                           holding SVAMP's mawps-asdiv-a_svamp train.csv / dev.csv, or any source
                                           of README's Data sources: train.parquet / test.parquet, split=PATH
                                           pairs, a cached hub name)
  --config=configs/refiner_mwp.py:paper    UnifiedQA-T5-base generator and critic at the paper's hyper-parameters
                                           (an accelerator and a checkpoint directory or network access needed)
Any field can be overridden: `--config.refiner.turns=4 --config.model.preset=t5-small`.
"""
from refiner_jax.tasks.base import shared_data_dir
from refiner_jax.runs import run_config as base


def get_config(arg: str | None = None):
    config = base.base_config()
    config.task.name = "mwp"
    # The critic solves, then compares (`critics.SolverCritic`). Like the generator it learns from the training
    # problems only (`task.extra_problems` = 0), for as many steps as the generator's warm-up.
    config.critic.mode = "solve"
    variant = arg or "default"
    if variant in ("default", "converge"):
        # At this size a decoder-only generator solves far more of the problems than t5-tiny (docs/results/refiner.md).
        config.model.family = "decoder"
        config.model.preset = "llama-mini"
    if variant == "converge":
        base.use_convergence(config, {"warmup": 3000, "critic": 3000, "refiner": 1800}, patience=3,
                             eval_examples=500)  # the synthetic task's whole validation split
        config.refiner.controls = True
        config.eval.factorial = True
    elif variant in ("default", "t5"):
        pass
    elif variant == "svamp":
        config.task.data_dir = shared_data_dir("svamp", "mawps-asdiv-a_svamp")
        config.task.options.lowercase = True  # SVAMP's questions are lower case; the vocabulary is learned from train
        config.lengths.input = 128
        config.lengths.target = 48
        config.lengths.refine_input = 192
        config.lengths.critic_input = 160
        config.lengths.feedback = 32
        config.critic.steps = 3000
        config.warmup.steps = 3000
        config.refiner.steps = 1500
    elif variant == "paper":
        base.use_paper_settings(config, "unifiedqa-t5-base")
        config.task.data_dir = shared_data_dir("svamp", "mawps-asdiv-a_svamp")
    else:
        raise ValueError(f"unknown variant {variant!r} for refiner_mwp.py; use one of: default, converge, t5, svamp, "
                         "paper")
    return config
