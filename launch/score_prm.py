"""Score a step-labelled file with a public process reward model (PRM) and report ProcessBench's first-error F1.

    python launch/score_prm.py --model=Qwen/Qwen2.5-Math-PRM-7B --input=gsm8k.json --output=scores.jsonl
    python launch/score_prm.py --model=DIR --input=math_shepherd.jsonl --output=scores.jsonl \\
        --step_tag=ки --good_token=+ --bad_token=-

--model: a checkpoint directory (or, online, a hub name) of a `...ForProcessRewardModel` (Qwen2.5-Math-PRM: the
steps joined by "<extra_0>" in its system/user/assistant chat) or of a causal LM read as Math-Shepherd's PRMs are
(the steps as "Step k: ... ки" lines; --good_token and --bad_token name the label tokens). --input: ProcessBench
(`problem`, `steps`, `label`), TRL stepwise (`prompt`, `completions`, `labels`) or Math-Shepherd (`input` with a tag
after each step, `label` with + or - in its place), as JSON, JSON lines or any data file `datasets` reads; steps
are read up to the first wrong one (later steps cannot change whether the first error is found).

--output gets one JSON line per solution: its id, gold first error (`label`, -1: none), `step_scores` (the PRM's
probability that the solution is right up to each step) and `prediction` (the first step scored below
--threshold, -1: none). The F1 table (accuracy on the erroneous solutions, on the correct ones, their harmonic
mean, with bootstrap intervals over problems) is printed as JSON and written to --table (default: the output's
name with `_f1.json`). Both files are written whole or not at all. The logic lives in
`refiner_jax.reward.scorer.load_public_prm` and `refiner_jax.reward.first_error`.
"""
from __future__ import annotations

import json
import os

from absl import flags

from refiner_jax import atomic_files
from refiner_jax.reward import first_error
from refiner_jax.reward.scorer import load_public_prm
from refiner_jax.runs import cli
from refiner_jax.tasks.step_label_files import read_step_records

_MODEL = flags.DEFINE_string("model", None, "PRM checkpoint directory or hub name.")
_INPUT = flags.DEFINE_string("input", None, "ProcessBench, TRL stepwise or Math-Shepherd file.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON lines of per-step scores to write.")
_TABLE = flags.DEFINE_string("table", None, "F1 table to write (default: <output stem>_f1.json).")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "Tokenizer directory or hub name (default: the model's).")
_STEP_TAG = flags.DEFINE_string("step_tag", None, "Step tag text (default: <extra_0> for a PRM head, ки for a "
                                "causal LM).")
_GOOD = flags.DEFINE_string("good_token", None, "A causal LM's label token of a right step (Math-Shepherd: +).")
_BAD = flags.DEFINE_string("bad_token", None, "A causal LM's label token of a wrong step (Math-Shepherd: -).")
_THRESHOLD = flags.DEFINE_float("threshold", 0.5, "A step scored below this is predicted wrong.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Solutions per forward pass.")
_DTYPE = flags.DEFINE_string("dtype", None, "Compute dtype (e.g. bfloat16); default the model's float32.")
_SAMPLES = flags.DEFINE_integer("bootstrap_samples", 1000, "Bootstrap resamples of the F1 intervals.")
flags.mark_flags_as_required(["model", "input", "output"])


def table_path(output: str) -> str:
    """The default F1 table path beside `output`."""
    return os.path.splitext(output)[0] + "_f1.json"


def score_file(model: str, source: str, output: str, table: str | None = None, tokenizer: str | None = None,
               step_tag: str | None = None, good_token: str | None = None, bad_token: str | None = None,
               threshold: float = 0.5, batch_size: int = 8, bootstrap_samples: int = 1000, **config_overrides) -> dict:
    """Scores every solution of `source` with the PRM `model`, writes `output` and the F1 table; returns the
    table."""
    records = read_step_records(source)
    if not records:
        raise ValueError(f"{source} holds no step-labelled solutions")
    scorer = load_public_prm(model, tokenizer, step_tag, good_token, bad_token, batch_size, **config_overrides)
    step_scores, predictions = first_error.step_score_predictions(records, scorer.score_steps, threshold)
    scores, _ = first_error.score_records(records, {"prm": predictions}, samples=bootstrap_samples)
    erroneous = sum(r.first_error >= 0 for r in records)
    result = {"model": model, "input": source, "threshold": threshold, "cases": len(records),
              "erroneous": erroneous, "correct": len(records) - erroneous, **scores["prm"]}
    with atomic_files.atomic_open(output) as f:
        for i, (record, steps, predicted) in enumerate(zip(records, step_scores, predictions)):
            f.write(json.dumps({"id": record.uid or str(i), "label": record.first_error,
                                "step_scores": [float(v) for v in steps], "prediction": int(predicted)}) + "\n")
    with atomic_files.atomic_open(table or table_path(output)) as f:
        f.write(json.dumps(result, indent=2) + "\n")
    return result


def main(argv):
    del argv
    overrides = {"dtype": _DTYPE.value} if _DTYPE.value else {}
    try:
        result = score_file(_MODEL.value, _INPUT.value, _OUTPUT.value, _TABLE.value, _TOKENIZER.value, _STEP_TAG.value,
                            _GOOD.value, _BAD.value, _THRESHOLD.value, _BATCH.value, _SAMPLES.value, **overrides)
    except ValueError as e:  # the loader's and the scorer's messages name the input and the fix
        cli.fail(str(e))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    cli.run(main)
