"""Evaluates a trained REFINER run: generator alone, + trained critic (T=1, T), + oracle critic, flips, critic
quality and the noisy-critic study, on the task's test split.

    python launch/evaluate.py --workdir=/tmp/refiner_mwp
    python launch/evaluate.py --workdir=/tmp/refiner_mwp --turns 3 --examples 200
    python launch/evaluate.py --workdir=/tmp/refiner_mwp --factorial

Writes `<workdir>/eval/`: results.md, results.json, predictions.jsonl, noise.png, curves_<stage>.png; prints the
markdown. With `--factorial`, only the inference factorial (who decides to revise x what text the generator reads,
`refiner_jax.refiner.inference_factorial`) runs, into `<workdir>/eval/factorial.{md,json}`. The logic lives in
`refiner_jax.runs.refiner_eval`.
"""
import os

from absl import flags

from refiner_jax.refiner.inference_factorial import factorial_markdown
from refiner_jax.runs import cli, refiner_eval, results, run_config
from refiner_jax.runs.run_config import ConfigError
from refiner_jax.tasks import data_sources

_WORKDIR = flags.DEFINE_string("workdir", None, "Trained run directory (launch/train.py --workdir).")
_TURNS = flags.DEFINE_integer("turns", None, "Refinement turns T (default: the run config's eval.turns).")
_EXAMPLES = flags.DEFINE_integer("examples", None, "Evaluate the first N test problems (default: eval.examples).")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Where the reports go (default <workdir>/eval).")
_FACTORIAL = flags.DEFINE_bool("factorial", False, "Run only the inference factorial (who decides to revise x what "
                                "text the generator reads) and write factorial.md/json.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    for name, value in (("turns", _TURNS.value), ("examples", _EXAMPLES.value)):
        if value is not None and value < 1:
            raise ConfigError(f"--{name}={value}: must be >= 1")
    config = run_config.load(_WORKDIR.value)
    refiner_eval.generator_stage_dir(_WORKDIR.value)  # a run with no trained generator: an error before loading
    data_dir = config.task.data_dir
    print(f"[data] source: {data_dir or 'embedded'}; from the run's "
          f"{os.path.join(_WORKDIR.value, run_config.CONFIG_FILE)}", flush=True)
    data_sources.require(data_dir)
    if _FACTORIAL.value:
        block = refiner_eval.factorial_run(_WORKDIR.value, max_examples=_EXAMPLES.value, turns=_TURNS.value,
                                           out_dir=_OUT_DIR.value)
        print("\n".join(factorial_markdown(block, results.FACTORIAL_LABELS)))
        return
    out = refiner_eval.evaluate_run(_WORKDIR.value, max_examples=_EXAMPLES.value, turns=_TURNS.value,
                                    out_dir=_OUT_DIR.value)
    results.print_results(out)


if __name__ == "__main__":
    cli.run(main)
