"""Interactive refinement: you are the critic.

    python launch/refine.py --workdir=/tmp/refiner_mwp

Pick a test problem (or type one; MWP problems write their numbers as number0, number1, ...), read the generator's
hypothesis and the trained critic's suggested feedback, then type your own feedback, press Enter to use the
suggestion, or type "ok" (or "No hint") to accept the hypothesis. The generator revises until you accept or
--turns revisions are done. The logic lives in `refiner_jax.runs.refiner_eval.interactive_session`.
"""
from absl import flags

from refiner_jax.runs import cli, refiner_eval, run_config
from refiner_jax.runs.run_config import ConfigError

_SPLITS = ("train", "val", "test")
_WORKDIR = flags.DEFINE_string("workdir", None, "Trained run directory.")
_TURNS = flags.DEFINE_integer("turns", 3, "Most revisions per problem.")
_SPLIT = flags.DEFINE_string("split", "test", "Split whose problems are offered (train, val, test).")
_NO_CRITIC = flags.DEFINE_bool("no_critic", False, "Do not load the trained critic (no suggestions).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    if _TURNS.value < 1:
        raise ConfigError(f"--turns={_TURNS.value}: must be >= 1")
    if _SPLIT.value not in _SPLITS:
        raise ConfigError(f"--split={_SPLIT.value}: not a split{run_config.suggestion(_SPLIT.value, _SPLITS)}; use "
                          f"one of {', '.join(_SPLITS)}")
    run_config.load(_WORKDIR.value)  # not a run directory: an error before loading any model
    refiner_eval.interactive_session(_WORKDIR.value, _TURNS.value, _SPLIT.value, use_critic=not _NO_CRITIC.value)


if __name__ == "__main__":
    cli.run(main)
