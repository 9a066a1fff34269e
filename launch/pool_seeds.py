"""One table over several seeds' runs of the same job (`refiner_jax.runs.seed_pool`).

    python launch/pool_seeds.py DIR_SEED0 DIR_SEED1 DIR_SEED2 [--out pooled.json] [--samples 1000]

Each DIR is a workdir of `launch/train.py --config=... --config.seed=S`. Reward runs (`configs/rm_*.py`): their
evaluations' `outcomes.json`, and where every run also saved `eval/first_error_predictions.json`, the verifiers'
first-error scores. Joint runs (`configs/joint_mwp.py`): `joint/outcomes.json`, every row against PRM reranking at
equal compute and the other baselines. REFINER runs (`configs/refiner_*.py`): each row's per-problem scores (`row_scores.json`), with
every row's paired difference from the generator alone and from each baseline row. Prints the pooled table in
Markdown; `--out` also writes it and the intervals as JSON.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from refiner_jax.runs import cli, seed_pool  # noqa: E402 (after the path line)


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors as the one `error:` line of the other launchers."""

    def error(self, message: str):
        cli.fail(f"{message}; see --help")


def main(argv=None) -> None:
    parser = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdirs", nargs="+", help="runs of one job (reward, joint or REFINER) with different seeds")
    parser.add_argument("--out", help="write the pooled results here as JSON")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap resamples")
    args = parser.parse_args(argv)
    if args.samples < 1:
        cli.fail(f"--samples={args.samples}: must be >= 1")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        cli.fail(f"--out={args.out}: the folder {os.path.dirname(os.path.abspath(args.out))} does not exist; create "
                 "it first")
    missing = [w for w in args.workdirs if not os.path.isdir(w)]
    if missing:
        cli.fail(f"{missing[0]}: no such run directory; give the workdirs of launch/train.py runs")
    try:
        pool = seed_pool.pool_refiner_seeds if seed_pool.is_refiner_run(args.workdirs[0]) else seed_pool.pool_seeds
        pooled = pool(args.workdirs, samples=args.samples)
    except (FileNotFoundError, ValueError) as e:  # seed_pool's messages name the run and the fix
        if isinstance(e, FileNotFoundError) and not cli.is_user_error(e):
            raise
        cli.fail(str(e))
    print(pooled["markdown"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({k: v for k, v in pooled.items() if k != "markdown"}, f, indent=2)


if __name__ == "__main__":
    main()
