"""Evaluates a trained REFINER run: generator alone, + trained critic (T=1, T), + oracle critic, flips, critic
quality and the noisy-critic study, on the task's test split.

    python launch/evaluate.py --workdir=/tmp/refiner_mwp
    python launch/evaluate.py --workdir=/tmp/refiner_mwp --turns 3 --examples 200

Writes `<workdir>/eval/`: results.md, results.json, predictions.jsonl, noise.png, curves_<stage>.png; prints the
markdown. The logic lives in `refiner_jax.runs.refiner_eval.evaluate_run`.
"""
from absl import app, flags

from refiner_jax.runs import refiner_eval, results

_WORKDIR = flags.DEFINE_string("workdir", None, "Trained run directory (launch/train.py --workdir).")
_TURNS = flags.DEFINE_integer("turns", None, "Refinement turns T (default: the run config's eval.turns).")
_EXAMPLES = flags.DEFINE_integer("examples", None, "Evaluate the first N test problems (default: eval.examples).")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Where the reports go (default <workdir>/eval).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    out = refiner_eval.evaluate_run(_WORKDIR.value, max_examples=_EXAMPLES.value, turns=_TURNS.value,
                                    out_dir=_OUT_DIR.value)
    results.print_results(out)


if __name__ == "__main__":
    app.run(main)
