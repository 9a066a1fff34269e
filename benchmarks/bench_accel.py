"""Accelerator benchmark: training MFU and sampling throughput against transformers on the same device; one JSON.

  python benchmarks/bench_accel.py                # GPU / TPU host: the default jobs' models, qwen2.5-0.5b, t5-base
  python benchmarks/bench_accel.py --size tiny    # anywhere, CPU included: llama-tiny and t5-tiny, a few steps
  python benchmarks/bench_accel.py --models qwen2.5-0.5b --batch 64 --out bench.json

For each model: one AdamW train step (`training.make_train_step` on `pair_loss`) in `--dtype` (bfloat16: float32
parameters and optimizer state, bfloat16 products) with remat, parameters and batch split over an fsdp mesh of every
local device; its compile time, median step time, tokens/s and MFU (model FLOPs, XLA's count of the gradient without
remat, over step time and the product rate measured on this device first); transformers' step on the same weights
and batch (torch autocast in the same dtype, gradient checkpointing) where torch sees this device. Then sampling:
greedy (B prompts x 1) and top-p 0.5 (B/4 prompts x 4), `--prompt-len` + `--new-tokens` (EOS suppressed), ours
(`LanguageModel.sample`, parameters cast to the dtype) against `generate` in the same dtype on the same device.

Every model's entry is written to `--out` as it completes, so a run stopped early keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# JAX takes 75% of an accelerator's memory when it starts; leave room for torch on the same device.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")

from benchmarks import bench_support as support  # noqa: E402 (standard library only at import)

SIZES = {
    # the default jobs' models (llama-mini: REFINER and reward jobs; t5-small: the reward job's :t5), then larger
    "full": dict(models="llama-mini,t5-small,qwen2.5-0.5b,t5-base", batch=32, input_len=256, target_len=128,
                 steps=10, prompt_len=128, new_tokens=64, sample_batch=32, peak_n=8192, copy_mb=2048),
    "tiny": dict(models="llama-tiny,t5-tiny", batch=8, input_len=16, target_len=8, steps=2, prompt_len=8,
                 new_tokens=4, sample_batch=4, peak_n=512, copy_mb=16),
}


def _random_pairs(rng, n: int, input_len: int, target_len: int, vocab: int, eos: int):
    """n full-length (prompt, target) id rows, each ending with EOS."""
    prompts = rng.integers(3, vocab, size=(n, input_len)).tolist()
    targets = rng.integers(3, vocab, size=(n, target_len)).tolist()
    return [p[:-1] + [eos] for p in prompts], [t[:-1] + [eos] for t in targets]


def bench_model_train(preset: str, args, peak_tflops: float, torch, device) -> dict:
    """Our train step (and transformers', where torch runs here) on one model; see the module docstring."""
    import jax
    import numpy as np

    from refiner_jax import sharding
    from refiner_jax.models.language_model import LanguageModel, family_of
    from refiner_jax.training import create_train_state, make_optimizer, make_train_step
    from refiner_jax.training.steps import pair_loss

    config = support.model_config(preset, dtype=args.dtype, remat=True, dropout_rate=0.0)
    lm = LanguageModel(config)
    module = lm.module()
    mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
    tx, schedule = make_optimizer({"name": "adamw", "learning_rate": 1e-4, "grad_clip_norm": 1.0})
    start = time.perf_counter()
    state, shardings = create_train_state(lambda k: module.init(k, *lm.init_args())["params"], tx, mesh,
                                          seed=args.seed)
    jax.block_until_ready(state)
    init_s = time.perf_counter() - start
    rng = np.random.default_rng(args.seed)
    prompts, targets = _random_pairs(rng, args.batch, args.input_len, args.target_len, config.vocab_size,
                                     config.eos_ids[0])
    host_batch = lm.pair_batch(prompts, targets, args.input_len, args.target_len, config.eos_ids[0])
    batch = sharding.make_global_batch(host_batch, mesh)
    # Model FLOPs: the same model without remat, so recomputation does not count.
    plain = LanguageModel(config.replace(remat=False))
    flops = support.train_flops(pair_loss(plain, plain.module()), jax.device_get(state.params), host_batch)
    step = make_train_step(pair_loss(lm, module), tx, mesh, shardings, schedule=schedule)
    holder = {"state": state}

    def ours():
        holder["state"], metrics = step(holder["state"], batch)
        return float(metrics["loss"])  # blocks until the step has run

    # transformers' copy of the initial weights, taken before our first step updates (and donates) them.
    initial = jax.device_get(holder["state"].params) if torch is not None else None
    start = time.perf_counter()
    first_loss = ours()
    first_s = time.perf_counter() - start
    fns = {"ours": ours}
    if torch is not None:
        reference = support.transformers_model(config, initial, device, train=True)
        # transformers 5.x renamed it; the same per-layer checkpointing either way.
        getattr(reference, "activation_checkpointing_enable", reference.gradient_checkpointing_enable)()
        opt = torch.optim.AdamW(reference.parameters(), lr=1e-4, weight_decay=0.0)
        autocast = dict(device_type=device.type, dtype=getattr(torch, args.dtype), enabled=args.dtype != "float32")
        if family_of(config) == "t5":
            inputs = torch.from_numpy(host_batch["inputs"].astype(np.int64)).to(device)
            feed = dict(input_ids=inputs, attention_mask=(inputs != 0).long(),
                        labels=torch.from_numpy(host_batch["targets"].astype(np.int64)).to(device))
        else:
            tokens = torch.from_numpy(host_batch["tokens"].astype(np.int64)).to(device)
            labels = tokens.masked_fill(torch.from_numpy(host_batch["weights"] == 0).to(device), -100)
            feed = dict(input_ids=tokens, attention_mask=torch.from_numpy(host_batch["mask"]).long().to(device),
                        labels=labels)

        def theirs():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(**autocast):
                loss = reference(**feed).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
            opt.step()
            return loss.item()

        fns["transformers"] = theirs
        torch_first_loss = theirs()  # on the initial weights, like ours
    med = support.median_interleaved(fns, args.steps)
    tokens = args.batch * (args.input_len + args.target_len)
    out = {"batch": args.batch, "input_len": args.input_len, "target_len": args.target_len, "dtype": args.dtype,
           "remat": True, "mesh": dict(mesh.shape), "init_s": round(init_s, 2),
           "compile_s": round(max(first_s - med["ours"], 0.0), 2), "step_s": round(med["ours"], 6),
           "tokens_per_s": round(tokens / med["ours"], 1), "examples_per_s": round(args.batch / med["ours"], 2),
           "first_loss": round(first_loss, 4),
           "model_gflop_per_step": None if flops is None else round(flops / 1e9, 4),
           "mfu": None if flops is None else round(flops / med["ours"] / (peak_tflops * 1e12), 6)}
    if "transformers" in med:
        out["transformers"] = {"step_s": round(med["transformers"], 4), "first_loss": round(torch_first_loss, 4),
                               "tokens_per_s": round(tokens / med["transformers"], 1),
                               "mfu": None if flops is None else round(
                                   flops / med["transformers"] / (peak_tflops * 1e12), 4),
                               "speedup": round(med["transformers"] / med["ours"], 2)}
    return out


def bench_model_sample(preset: str, args, torch, device) -> dict:
    """Greedy and top-p sampling throughput of ours against `generate`, same weights, dtype and device."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from refiner_jax.models import init_params
    from refiner_jax.models.language_model import LanguageModel

    config = support.model_config(preset, dtype=args.dtype, param_dtype=args.dtype, dropout_rate=0.0)
    lm = LanguageModel(config)
    params = init_params(config.replace(param_dtype="float32"), jax.random.key(args.seed))
    ours_params = jax.tree.map(lambda x: x.astype(jnp.dtype(args.dtype)), params)
    reference = None
    if torch is not None:
        reference = support.transformers_model(config, params, device, train=False,
                                               torch_dtype=getattr(torch, args.dtype))
    generation_ids = support.generation_ids(config)
    rng = np.random.default_rng(args.seed)
    n = args.new_tokens
    results = {}
    for name, (batch, k, temperature, top_p) in {"greedy": (args.sample_batch, 1, 0.0, 1.0),
                                                 "top_p": (max(args.sample_batch // 4, 1), 4, 1.0, 0.5)}.items():
        prompts = rng.integers(3, config.vocab_size, size=(batch, args.prompt_len), dtype=np.int32)
        key = jax.random.key(args.seed)

        def ours():
            out = lm.sample(ours_params, prompts, key, max_new_tokens=n, num_samples=k, temperature=temperature,
                            top_p=top_p, min_new_tokens=n)
            return jax.block_until_ready(out)

        start = time.perf_counter()
        ours()
        first_s = time.perf_counter() - start
        fns = {"ours": ours}
        if reference is not None:
            theirs = support.transformers_generate(torch, reference, prompts, device, new_tokens=n, num_samples=k,
                                                   temperature=temperature, top_p=top_p,
                                                   generation_ids=generation_ids)
            fns["transformers"] = theirs
        med = support.median_interleaved(fns, args.sample_repeats)
        generated = batch * k * n
        entry = {"batch": batch, "num_samples": k, "prompt_len": args.prompt_len, "new_tokens": n,
                 "compile_s": round(max(first_s - med["ours"], 0.0), 2), "s": round(med["ours"], 4),
                 "tokens_per_s": round(generated / med["ours"], 1)}
        if "transformers" in med:
            entry["transformers_tokens_per_s"] = round(generated / med["transformers"], 1)
            entry["speedup"] = round(med["transformers"] / med["ours"], 2)
        results[name] = entry
    return results


def _torch_for(platform: str, wanted: str):
    """(torch, device) for transformers' side on this platform, or (None, reason)."""
    if wanted == "none":
        return None, "--torch-device none"
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    device = wanted if wanted != "auto" else ("cuda" if platform == "gpu" else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    if device == "cpu" and platform != "cpu":
        return None, f"torch has no device of JAX's platform {platform!r}"
    return torch, support.torch_setup(torch, os.cpu_count() or 1, device)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--models", help="comma-separated presets (default: the size's)")
    for name in ("batch", "input_len", "target_len", "steps", "prompt_len", "new_tokens", "sample_batch"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, help="default: the size's")
    parser.add_argument("--sample-repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--torch-device", choices=("auto", "cpu", "cuda", "none"), default="auto",
                        help="transformers' side: auto = CUDA on a GPU host, the CPU on a CPU host")
    parser.add_argument("--skip", choices=("train", "sample"), action="append", default=[])
    parser.add_argument("--out", help="also write the JSON here, rewritten after every model")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, value in SIZES[args.size].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    unknown = [m for m in args.models.split(",") if m not in support.FAMILY_OF]
    if unknown:
        raise SystemExit(f"--models: unknown preset(s) {unknown}; choose from {sorted(support.FAMILY_OF)}")

    import jax

    platform = jax.default_backend()
    torch, device = _torch_for(platform, args.torch_device)
    peak_dtype = "float32" if platform == "cpu" else args.dtype
    report = {"benchmark": "accel", "size": args.size, "platform": platform, "device_count": jax.device_count(),
              "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
              "torch": None if torch is None else torch.__version__,
              "torch_device": str(device) if torch is not None else None,
              "transformers_skipped_because": device if torch is None else None,
              "peak": {"matmul": support.matmul_peak(peak_dtype, args.peak_n),
                       "copy": support.copy_bandwidth(args.copy_mb)},
              "models": {}}
    peak = report["peak"]["matmul"]["tflops"]

    def write():
        text = json.dumps(report, indent=1)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        return text

    for preset in args.models.split(","):
        entry = report["models"][preset] = {"family": support.FAMILY_OF[preset]}
        if "train" not in args.skip:
            entry["train"] = bench_model_train(preset, args, peak, torch, device)
            write()
        if "sample" not in args.skip:
            entry["sample"] = bench_model_sample(preset, args, torch, device)
            write()
    print(write())
    return report


if __name__ == "__main__":
    main()
