"""One reward-model table over several seeds' runs of the same job (`refiner_jax.runs.seed_pool`).

    python launch/pool_seeds.py DIR_SEED0 DIR_SEED1 DIR_SEED2 [--out pooled.json] [--samples 1000]

Each DIR is a reward run's workdir (`launch/train.py --config=configs/rm_mwp.py... --config.seed=S`) whose evaluation
wrote `outcomes.json`; where every run also saved `eval/first_error_predictions.json`, the verifiers' first-error
scores are pooled too. Prints the pooled table in Markdown; `--out` also writes it and the intervals as JSON.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from refiner_jax.runs import seed_pool  # noqa: E402 (after the path line)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdirs", nargs="+", help="reward runs of different seeds")
    parser.add_argument("--out", help="write the pooled results here as JSON")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap resamples")
    args = parser.parse_args(argv)
    try:
        pooled = seed_pool.pool_seeds(args.workdirs, samples=args.samples)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"pool_seeds: {e}") from None
    print(pooled["markdown"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({k: v for k, v in pooled.items() if k != "markdown"}, f, indent=2)


if __name__ == "__main__":
    main()
