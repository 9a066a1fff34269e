"""Interactive refinement: you are the critic.

    python launch/refine.py --workdir=/tmp/refiner_mwp

Pick a test problem (or type one; MWP problems write their numbers as number0, number1, ...), read the generator's
hypothesis and the trained critic's suggested feedback, then type your own feedback, press Enter to use the
suggestion, or type "ok" (or "No hint") to accept the hypothesis. The generator revises until you accept or
--turns revisions are done. The logic lives in `refiner_jax.runs.refiner_eval.interactive_session`.
"""
from absl import app, flags

from refiner_jax.runs import refiner_eval

_WORKDIR = flags.DEFINE_string("workdir", None, "Trained run directory.")
_TURNS = flags.DEFINE_integer("turns", 3, "Most revisions per problem.")
_SPLIT = flags.DEFINE_string("split", "test", "Split whose problems are offered (train, val, test).")
_NO_CRITIC = flags.DEFINE_bool("no_critic", False, "Do not load the trained critic (no suggestions).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    refiner_eval.interactive_session(_WORKDIR.value, _TURNS.value, _SPLIT.value, use_critic=not _NO_CRITIC.value)


if __name__ == "__main__":
    app.run(main)
