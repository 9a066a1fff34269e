"""Outcome- vs process-based feedback on math word problems (Uesato et al.'s comparison at laptop scale).

  --config=configs/rm_mwp.py          embedded synthetic MWP, a `llama-mini` policy (1.0M parameters, the REFINER
                                      default job's model) and reward models; runs on a CPU
  --config=configs/rm_mwp.py:t5       the same with t5-tiny
  --config=configs/rm_mwp.py:small    t5-small, more samples and steps (an accelerator recommended)
  --config=configs/rm_mwp.py:trace    the default on the trace-error variant of the generator: every problem whose
                                      numbers allow it gets values under which a wrong step reaches the right answer
                                      (`tasks/mwp/coincidences.py`), so right answers hide wrong steps as on GSM8K
  --config=configs/rm_mwp.py:trace_grpo  trace, plus a GRPO policy per reward beside each expert-iteration one, on
                                      the same samples drawn and gradient steps (`runs/grpo_stage.py`)

The PRM's labels come from the task's step checker (each `#k` step must compute a distinct subexpression of the gold
formula); `--config.reward.labels_file=PATH.jsonl` trains it on PRM800K-style human step labels instead.
"""
from refiner_jax.runs import run_config as base


def get_config(arg: str | None = None):
    config = base.base_config()
    config.pipeline = "reward"
    config.task.name = "mwp"
    config.warmup.feedback_fraction = 0.0  # plain SFT, x -> z
    # Reward models that start from the policy's log-likelihood of a solution and learn to rank each problem's right
    # samples above its wrong ones, on 16 policy samples of each of the policy's own training problems, as Uesato et
    # al.'s; `--config.task.extra_problems=N` adds N generated problems for the policy and reward models alike
    # (docs/reward_models.md).
    r = config.reward
    r.head, r.likelihood, r.pairwise_weight = "scalar", True, 1.0
    r.samples, r.train_problems, r.val_problems = 16, 4000, 500
    r.optimizer.learning_rate, r.steps, r.patience, r.eval_every = 3e-4, 800, 3, 400
    # Validating and saving less often keeps the whole job within 20 minutes on a 2-core CPU.
    config.checkpoint.every = 400
    config.rl.eval_every = config.rl.steps
    variant = arg or "default"
    if variant in ("default", "trace", "trace_grpo"):
        config.model.family = "decoder"
        config.model.preset = "llama-mini"
    if variant in ("trace", "trace_grpo"):
        # "unit" (x 1 and / 1 agree) is left out: the policy almost never confuses multiply and divide, so it adds
        # no trace errors (docs/reward_models.md).
        # `--config.task.options.synthetic_sizes.test=N --config.eval.examples=N` evaluates on N test problems; the
        # first 1,000 and everything trained stay the same (docs/reward_models.md).
        config.task.options = {"trace_rate": 1.0, "trace_kinds": ("distractor", "intermediate", "two_two"),
                               "synthetic_sizes": {"test": 1000}}
        config.reward.labels = "rollouts"  # a second PRM on Math-Shepherd rollout labels, beside the checker's
        # Expert iteration on the samples with the right answer that the PRM also passes, beside the answer alone: on
        # this variant the answer check keeps right answers reached through wrong steps.
        config.rl.rewards = ("final", "orm", "prm", "final_prm")
        if variant == "trace_grpo":
            # Each of the 2,000 problems' 4 samples once, in 100 batches of 20 problems, 2 updates on each: expert
            # iteration's 8,000 samples and 200 gradient steps.
            config.grpo.rewards = config.rl.rewards
    elif variant in ("default", "t5"):
        pass
    elif variant == "small":
        config.model.preset = "t5-small"
        config.warmup.steps = 3000
        config.reward.steps = 3000
        config.reward.test_samples = 96
        config.rl.rounds = 2
        config.rl.samples = 16
        config.rl.steps = 1000
    else:
        raise ValueError(f"unknown variant {variant!r} for rm_mwp.py; use one of: default, trace, trace_grpo, t5, "
                         "small")
    return config
