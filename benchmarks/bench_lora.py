"""LoRA against full fine-tuning: one train step of a decoder-only preset, each mode in its own process.

  python benchmarks/bench_lora.py [--preset qwen2.5-0.5b --rank 16 --targets all-linear --batch 2 --length 128
      --steps 3 --modes lora,full]

Each mode (``lora``: adapters on `--targets`, PEFT's module names; ``full``: every parameter) runs in a fresh
subprocess, so its peak resident memory (``getrusage`` max RSS) is its own: the model's random initialisation,
AdamW's state, the compiled step and its buffers. Per mode the JSON gives the compile time (the first step), the
median wall time of `--steps` further steps, the trained parameters, the optimizer state's bytes and the peak RSS
(a mode that fails, e.g. out of memory, gives its error instead); ``lora_vs_full`` holds the ratios when both
ran. Next-token loss on random tokens, float32, one device. Not a test: the times depend on the machine and its
load.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = ("lora", "full")


def _one_mode(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from refiner_jax import sharding as shd
    from refiner_jax.models import lora as lora_lib
    from refiner_jax.models.decoder import Decoder
    from refiner_jax.models.decoder_config import preset
    from refiner_jax.training.state import create_lora_train_state, create_train_state
    from refiner_jax.training.steps import make_train_step, masked_cross_entropy

    config = preset(args.preset)
    module = Decoder(config)

    def init_fn(key):
        return module.init(key, jnp.zeros((1, 8), jnp.int32))["params"]

    def loss_fn(params, batch, rng):
        tokens = batch["tokens"]
        loss_sum, count = masked_cross_entropy(module.apply({"params": params}, tokens)[:, :-1], tokens[:, 1:])
        return loss_sum, {"loss_sum": loss_sum, "tokens": count}

    mesh = shd.make_mesh((1, 1, 1))
    tx = optax.adamw(1e-4)
    frozen = None
    if args.mode == "lora":
        targets = tuple(t for t in args.targets.split(",") if t)
        lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=args.rank, alpha=2.0 * args.rank,
                                                         target_modules=targets))
        state, shardings, frozen = create_lora_train_state(init_fn, lora, tx, mesh, seed=0)
        model_params = lora_lib.count(frozen.params)
    else:
        state, shardings = create_train_state(init_fn, tx, mesh, seed=0)
        model_params = lora_lib.count(state.params)
    step = make_train_step(loss_fn, tx, mesh, shardings, frozen=frozen)
    tokens = np.random.default_rng(0).integers(1, config.vocab_size, (args.batch, args.length), dtype=np.int32)
    batch = shd.make_global_batch({"tokens": tokens}, mesh)
    start = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return {"mode": args.mode, "model_params": model_params, "trained_params": lora_lib.count(state.params),
            "optimizer_state_bytes": int(sum(x.nbytes for x in jax.tree.leaves(state.opt_state))),
            "first_step_s": round(compile_s, 3), "step_s_median": round(statistics.median(times), 3),
            "step_s_all": [round(t, 3) for t in times], "last_loss": float(metrics["loss"]),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", default="all-linear", help="PEFT module names, comma-separated, or all-linear")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to run, each in a subprocess")
    parser.add_argument("--mode", choices=MODES, help="run one mode in this process (the subprocesses use it)")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(_one_mode(args)))
        return
    report = {"preset": args.preset, "rank": args.rank, "targets": args.targets, "batch": [args.batch, args.length],
              "cpu_cores": os.cpu_count()}
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"--modes: unknown mode {mode!r}; use some of {MODES}")
        command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--mode", mode]
        proc = subprocess.run(command, capture_output=True, text=True)
        report[mode] = (json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else
                        {"error": f"exit status {proc.returncode}: {proc.stderr.strip()[-600:]}"})
    if "step_s_median" in report.get("lora", {}) and "step_s_median" in report.get("full", {}):
        report["lora_vs_full"] = {key: round(report["lora"][key] / report["full"][key], 4) for key in
                                  ("trained_params", "optimizer_state_bytes", "step_s_median", "peak_rss_mib")}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
