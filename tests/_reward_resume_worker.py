"""A small reward-pipeline run that a test can SIGKILL mid-stage; driven by tests/test_reward_resume.py.

    python tests/_reward_resume_worker.py WORKDIR [--pause STAGE:STEP]

Runs `reward_run.run` on `config()`, every stage, logging every update; prints ``LOGGED <stage> <step>`` (flushed)
as an update's training metrics are logged. Checkpoint saves wait until they are on disk, so a kill after an update
always finds the checkpoints saved before it. With ``--pause STAGE:STEP`` it prints ``PAUSED`` after that update
and sleeps, for the test to SIGKILL it there.
"""
import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from refiner_jax import checkpoint as ckpt_lib  # noqa: E402
from refiner_jax.runs import reward_run  # noqa: E402
from refiner_jax.training import loop  # noqa: E402
from test_reward_pipeline import tiny_config  # noqa: E402


def config():
    """The tiny reward config, one expert-iteration reward and round, a lighter evaluation, one log per update."""
    c = tiny_config()
    c.rl.rewards, c.rl.rounds = ("orm",), 1
    c.reward.test_samples, c.eval.examples, c.eval.bootstrap_samples = 2, 8, 20
    c.log_every = 1
    return c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--pause", default="")
    args = ap.parse_args()
    pause = tuple(args.pause.split(":")) if args.pause else None
    write, save = loop.MetricsLog.write, ckpt_lib.Checkpointer.save

    def logged(self, stage, step, metrics):
        write(self, stage, step, metrics)
        if "loss" in metrics:  # the training metrics, not the evaluation's
            print(f"LOGGED {stage} {step}", flush=True)
            if pause == (stage, str(step)):
                print("PAUSED", flush=True)
                time.sleep(600)

    def saved(self, *a, **k):
        started = save(self, *a, **k)
        self.wait_until_finished()
        return started

    loop.MetricsLog.write, ckpt_lib.Checkpointer.save = logged, saved
    reward_run.run(config(), args.workdir)


if __name__ == "__main__":
    main()
