"""Outcome- vs process-based feedback on GSM8K (`../shared/data/gsm8k`, or `--config.task.data_dir`: another folder,
a folder of `train.parquet` / `test.parquet`, or the hub's `openai/gsm8k:main` once cached; README, Data sources).

  --config=configs/rm_gsm8k.py          tiny: t5-tiny on a subword vocabulary learned from train, a few hundred
                                        problems per stage; runs end to end on a CPU (its error rates are near 100%:
                                        it shows the pipeline, not the paper's numbers)
  --config=configs/rm_gsm8k.py:paper    T5-large imported from transformers (`model.checkpoint`, a directory or hub
                                        name), K = 96 test samples, bf16: an accelerator needed

Solutions are GSM8K's newline-separated steps with `<<a op b=c>>` annotations; the PRM's labels come from the task's
step rule (each annotation's arithmetic and its operands, against the gold solution's values), the ORM's from the
`####` answer.
"""
from refiner_jax.tasks.base import shared_data_dir
from refiner_jax.runs import run_config as base


def get_config(arg: str | None = None):
    config = base.base_config()
    config.pipeline = "reward"
    config.task.name = "gsm8k"
    config.task.data_dir = shared_data_dir("gsm8k")
    config.warmup.feedback_fraction = 0.0
    config.reward.max_steps = 12
    variant = arg or "tiny"
    if variant == "tiny":
        config.tokenizer.vocab_size = 2048
        config.lengths.input = 160
        config.lengths.target = 192
        config.warmup.steps = 300
        config.warmup.eval_examples = 50
        config.warmup.eval_every = 150
        config.reward.samples = 4
        config.reward.train_problems = 300
        config.reward.val_problems = 50
        config.reward.steps = 200
        config.reward.eval_every = 100
        config.reward.test_samples = 8
        # A t5-tiny trained for minutes rarely writes a right answer: no problem has both right and wrong samples
        # and the final-answer reward would keep nothing, so the reward models train on every sample and expert
        # iteration is left out.
        config.reward.mixed_only = False
        config.rl.rewards = ()
        config.eval.examples = 200
    elif variant == "paper":
        config.model.preset = config.model.checkpoint = "t5-large"
        config.model.dtype = "bfloat16"
        config.tokenizer.kind = "hf"
        config.tokenizer.path = "google-t5/t5-large"
        config.lengths.input = 256
        config.lengths.target = 384
        config.warmup.steps = 20000
        config.reward.samples = 96
        config.reward.train_problems = 7000
        config.reward.val_problems = 500
        config.reward.steps = 20000
        config.reward.test_samples = 96
        config.rl.rounds = 3
        config.rl.samples = 96
        config.rl.problems = 7000
        config.rl.steps = 5000
        config.eval.examples = 1319
        for stage in (config.warmup, config.reward, config.rl):
            stage.optimizer.learning_rate = 1e-4
    else:
        raise ValueError(f"unknown variant {variant!r} for rm_gsm8k.py; use one of: tiny, paper")
    return config
