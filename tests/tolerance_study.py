"""Runs the numerical tests under other CPU thread and virtual-device counts with REFINER_TOLERANCE_LOG set, and
prints the worst deviation seen for each kind of tolerance (tests/_tolerance.py) as a markdown table.

    python tests/tolerance_study.py --out /tmp/study        # about 45 minutes on 2 cores
    python tests/tolerance_study.py --out /tmp/study --summary-only
"""
import argparse
import collections
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMERICAL = ["tests/test_t5.py", "tests/test_decoder.py", "tests/test_model_seam.py", "tests/test_reward.py",
             "tests/test_sampling.py", "tests/test_decoder_sampling.py", "tests/test_train_steps.py",
             "tests/test_checkpoint.py",
             "tests/test_evaluate.py::test_text_model_log_probs_follow_each_text_across_batches_and_padding"]
SHARDED = ["tests/test_reward.py", "tests/test_train_steps.py", "-k", "sharded or device or eval_sums or fsdp"]
ONE_CORE = {"OMP_NUM_THREADS": "1", "TASKSET": "0"}
CONFIGS = {  # name: (environment, pytest arguments)
    "default": ({}, NUMERICAL),
    "one_thread": (ONE_CORE, NUMERICAL),
    "xla_eigen_single": ({"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}, NUMERICAL),
    "devices4": ({"REFINER_TEST_DEVICES": "4"}, SHARDED),
    "devices2": ({"REFINER_TEST_DEVICES": "2"}, SHARDED),
    "devices2_one_thread": ({"REFINER_TEST_DEVICES": "2", **ONE_CORE}, SHARDED),
    "multiprocess": ({}, ["-m", "slow", "tests/test_multiprocess.py::test_two_processes_train_like_one[2,2,1]"]),
}


def run(name: str, out: str) -> str:
    extra, args = CONFIGS[name]
    log = os.path.join(out, f"{name}.jsonl")
    if os.path.exists(log):
        os.remove(log)
    env = dict(os.environ, REFINER_TOLERANCE_LOG=log, **{k: v for k, v in extra.items() if k != "TASKSET"})
    command = [sys.executable, "-m", "pytest", "-q", *args]
    if "TASKSET" in extra:
        command = ["taskset", "-c", extra["TASKSET"], *command]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]


def summary(out: str) -> str:
    """Per kind (ulps): the comparison with the largest deviation / tolerance over every configuration."""
    worst = collections.defaultdict(lambda: (-1.0, "", ""))
    counts = collections.Counter()
    for name in CONFIGS:
        path = os.path.join(out, f"{name}.jsonl")
        if not os.path.exists(path):
            continue
        for line in open(path, encoding="utf-8"):
            r = json.loads(line)
            counts[r["ulps"]] += 1
            ratio = r["deviation"] / r["tolerance"] if r["tolerance"] else (0.0 if r["deviation"] == 0 else 1e9)
            if ratio > worst[r["ulps"]][0]:
                worst[r["ulps"]] = (ratio, r["what"], name)
    rows = ["| tolerance (ulps of the scale) | checks | worst deviation (ulps) | margin | where |",
            "| --- | --- | --- | --- | --- |"]
    for ulps in sorted(worst):
        ratio, what, name = worst[ulps]
        rows.append(f"| {ulps:g} | {counts[ulps]} | {ratio * ulps:.1f} | {1 / ratio if ratio else float('inf'):.1f}x "
                    f"| {what} ({name}) |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not args.summary_only:
        for name in args.configs:
            print(f"{name}: {run(name, args.out)}", flush=True)
    print(summary(args.out))


if __name__ == "__main__":
    main()
