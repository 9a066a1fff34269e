"""Benchmarks against transformers' PyTorch implementation; each subcommand prints one JSON object.

  python launch/bench.py sample --preset tiny|t5-small|gpt2-tiny|gpt2-small [--repeats 5]
  python launch/bench.py train --preset tiny|t5-small [--batch 32 --input-len 128 --target-len 64]

Timings are wall-clock medians of interleaved runs (ours, theirs, ours, ...) after a warm-up, in one process;
our compile time is reported separately. Not a test: numbers depend on the machine and its load. torch is held
to `--torch-threads` (default 2) while XLA uses every core: compare on a machine with that many cores (the JSON
records `cpu_cores`), or raise the flag to match. `--torch-device cuda` runs transformers on the GPU, beside JAX on its
default device; float32 products then use TF32 on both sides (JAX's default on recent NVIDIA GPUs).

`train` splits the batch over every JAX device (`--mesh-axis data`, or `fsdp` to split the parameters too), and
`sample` splits the prompts over every JAX device (`sample_t5(..., mesh=...)`, one decode loop per device). On a CPU,
`--host-devices` (default: one per core; for `train`, fewer where the batch does not divide) exposes the cores as
that many XLA host devices before JAX starts, so the devices' programs run in parallel; `--host-devices 1` measures
one device.

On Linux the bench first starts itself again with a faster malloc (`refiner_jax.cpu`: jemalloc where installed, else
glibc's transparent huge pages), as `launch/train.py` does; both sides run under it, and the JSON records `malloc`.
`REFINER_JAX_MALLOC=glibc` measures with glibc's malloc on huge pages; `GLIBC_TUNABLES=glibc.malloc.hugetlb=0` added
to it, on 4 KiB pages.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from refiner_jax import cpu  # noqa: E402 (standard library only: JAX has not started)

# bench name -> (family, model preset): T5 (`t5_sampling.sample_t5`) or decoder-only (`sample_decoder`, GPT-2 shapes).
SAMPLE_PRESETS = {"tiny": ("t5", "t5-tiny"), "t5-small": ("t5", "t5-small"), "gpt2-tiny": ("decoder", "gpt2-tiny"),
                  "gpt2-small": ("decoder", "gpt2")}


def _torch_setup(torch, args):
    """Thread count and device of the transformers side; on CUDA, TF32 products like JAX's default precision."""
    torch.set_num_threads(args.torch_threads)
    if args.torch_device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--torch-device cuda: torch sees no CUDA device; use --torch-device cpu")
        torch.set_float32_matmul_precision("high")
    return torch.device(args.torch_device)


def _torch_sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _median_interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds of each zero-argument callable, run round-robin `repeats` times after one warm-up round."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _t5_sampler(name: str, seed: int, device):
    """Our random T5 `name`, its `sample_t5`, and transformers' T5ForConditionalGeneration on the same weights."""
    import jax
    import jax.numpy as jnp
    import transformers
    from flax.linen import meta

    from refiner_jax.models import hf, t5_sampling
    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset

    config = preset(name, dropout_rate=0.0)
    dummy = jnp.ones((1, 8), jnp.int32)
    params = meta.unbox(T5(config).init(jax.random.key(seed), dummy, dummy)["params"])
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_t5(config, jax.device_get(params), tmp)
        reference = transformers.T5ForConditionalGeneration.from_pretrained(tmp).eval().to(device)
    return dict(config=config, params=params, sample=t5_sampling.sample_t5, reference=reference, echoes_prompt=False,
                generation=dict(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


def _decoder_sampler(name: str, seed: int, device):
    """Our random decoder-only LM `name`, its `sample_decoder`, and transformers' model on the same weights."""
    import jax
    import jax.numpy as jnp
    import transformers
    from flax.linen import meta

    from refiner_jax.models import hf_decoder
    from refiner_jax.models.decoder import Decoder
    from refiner_jax.models.decoder_config import preset
    from refiner_jax.models.decoder_sampling import pad_id, sample_decoder

    config = preset(name, dropout_rate=0.0)
    params = meta.unbox(Decoder(config).init(jax.random.key(seed), jnp.ones((1, 8), jnp.int32))["params"])
    with tempfile.TemporaryDirectory() as tmp:
        hf_decoder.save_decoder(config, jax.device_get(params), tmp)
        reference = transformers.AutoModelForCausalLM.from_pretrained(tmp).eval().to(device)
    return dict(config=config, params=params, sample=sample_decoder, reference=reference, echoes_prompt=True,
                generation=dict(pad_token_id=pad_id(config), eos_token_id=list(config.eos_ids)))


def bench_sample(args) -> dict:
    """Batch sampling throughput of ours vs transformers' `generate`, on the same architecture and weights (ours,
    exported for transformers): `models.t5_sampling.sample_t5` vs `T5ForConditionalGeneration` for the T5 presets, and
    `models.decoder_sampling.sample_decoder` (each prompt prefilled in one pass) vs `GPT2LMHeadModel` for the
    decoder-only ones.

    Scenarios: greedy (batch 32, 128 prompt tokens, exactly 64 new tokens) and top-p 0.5 (8 prompts x 8 samples,
    64 new tokens); EOS is suppressed in both implementations (min_new_tokens = max_new_tokens) so both generate
    the same number of tokens. Ours splits the prompts over all JAX devices when they divide the batch.
    """
    cpu.expose_host_devices(args.host_devices)
    import jax
    import numpy as np
    import torch
    import transformers
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    device = _torch_setup(torch, args)
    load_before = os.getloadavg()
    family, model_preset = SAMPLE_PRESETS[args.preset]
    side = (_t5_sampler if family == "t5" else _decoder_sampler)(model_preset, args.seed, device)
    config, reference = side["config"], side["reference"]
    rng = np.random.default_rng(args.seed)
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(AxisType.Auto,), devices=devices)
    params = jax.device_put(side["params"], NamedSharding(mesh, PartitionSpec()))  # replicated once, not per call
    # transformers' output starts with the prompt (decoder-only) or the decoder start token (T5).
    skip = args.prompt_len if side["echoes_prompt"] else 1

    scenarios = {
        "greedy": dict(batch=32, num_samples=1, temperature=0.0, top_p=1.0),
        "top_p": dict(batch=8, num_samples=8, temperature=1.0, top_p=0.5),
    }
    new_tokens = args.new_tokens
    results = {}
    for name in args.scenarios.split(","):
        sc = scenarios[name]
        prompts = rng.integers(2, config.vocab_size, size=(sc["batch"], args.prompt_len), dtype=np.int32)
        key = jax.random.key(args.seed)
        split = len(devices) > 1 and sc["batch"] % len(devices) == 0
        knobs = dict(config=config, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                     num_samples=sc["num_samples"], temperature=sc["temperature"], top_p=sc["top_p"],
                     max_top_k=args.max_top_k, mesh=mesh if split else None)

        def ours():
            return jax.block_until_ready(side["sample"](params, prompts, key, **knobs))

        generation = transformers.GenerationConfig(
            do_sample=sc["temperature"] > 0, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            num_return_sequences=sc["num_samples"], top_k=0 if sc["temperature"] > 0 else None,
            top_p=sc["top_p"] if sc["temperature"] > 0 else None, temperature=sc["temperature"] or None,
            **side["generation"])
        input_ids = torch.from_numpy(prompts.astype(np.int64)).to(device)

        def theirs():
            with torch.inference_mode():
                out = reference.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                         generation_config=generation)
            _torch_sync(torch, device)
            return out

        start = time.perf_counter()
        first = ours()
        first_call = time.perf_counter() - start
        theirs_tokens = theirs()[:, skip:].cpu().numpy()
        med = _median_interleaved({"ours": ours, "transformers": theirs}, args.repeats)
        generated = sc["batch"] * sc["num_samples"] * new_tokens
        ours_tokens = np.asarray(first.tokens).reshape(-1, new_tokens)
        entry = {
            "batch": sc["batch"], "num_samples": sc["num_samples"], "prompt_len": args.prompt_len,
            "new_tokens": new_tokens, "temperature": sc["temperature"], "top_p": sc["top_p"],
            "ours_devices": len(devices) if split else 1,
            "ours_s": round(med["ours"], 4), "transformers_s": round(med["transformers"], 4),
            "ours_tokens_per_s": round(generated / med["ours"], 1),
            "transformers_tokens_per_s": round(generated / med["transformers"], 1),
            "speedup": round(med["transformers"] / med["ours"], 2),
            "ours_compile_s": round(max(first_call - med["ours"], 0.0), 2),
            "all_lengths_equal_new_tokens": bool(np.all(np.asarray(first.lengths) == new_tokens)
                                                 and theirs_tokens.shape[1] == new_tokens),
        }
        if name == "greedy":
            # Float summation order differs, so long greedy runs may drift apart after a near-tie.
            entry["greedy_identical_rows"] = int(np.all(ours_tokens == theirs_tokens, axis=1).sum())
        results[name] = entry
    return {"benchmark": "sample", "preset": args.preset, "config": model_preset, "family": family,
            "repeats": args.repeats, "torch_threads": args.torch_threads, "torch_device": args.torch_device,
            "cpu_cores": os.cpu_count(), "max_top_k": args.max_top_k, "jax_devices": str(jax.devices()),
            "malloc": cpu.malloc_in_use(),
            # Other processes on the machine distort both timings (torch's thread pool the most): check these.
            "load_average_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "results": results}


def _add_sample_parser(subparsers) -> None:
    p = subparsers.add_parser("sample", help="batch sampling throughput vs transformers generate")
    p.add_argument("--preset", choices=sorted(SAMPLE_PRESETS), default="tiny")
    p.add_argument("--scenarios", default="greedy,top_p", help="comma-separated subset of greedy,top_p")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per implementation (median reported)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--max-top-k", type=int, default=64, help="static top-k bound of our sampler")
    p.add_argument("--torch-threads", type=int, default=2)
    p.add_argument("--torch-device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--host-devices", type=int, default=os.cpu_count() or 1,
                   help="XLA:CPU host devices to split our sampling over (default: one per core)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=bench_sample)


TRAIN_PRESETS = {"tiny": "t5-tiny", "t5-small": "t5-small"}


def bench_train(args) -> dict:
    """Training throughput of one jitted, donated AdamW step (`training.steps.make_train_step`) vs the same update
    in transformers' PyTorch T5 (forward with labels, backward, clip, AdamW), on identical weights and batches.

    Batch `--batch` rows of `--input-len` prompt and `--target-len` target tokens (no padding), dropout 0.1 in both.
    Ours splits the batch over every JAX device along `--mesh-axis`; on a CPU, `--host-devices` (default: one per
    core, or the largest smaller count that divides the batch) exposes the cores as that many XLA host devices
    first. XLA:CPU runs most elementwise work of a program on one thread and only its matrix products on every core,
    so the per-device programs overlap that work.
    """
    cores = os.cpu_count() or 1
    host_devices = args.host_devices or max(n for n in range(1, cores + 1) if args.batch % n == 0)
    cpu.expose_host_devices(host_devices)
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    from refiner_jax import sharding
    from refiner_jax.models import hf
    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset
    from refiner_jax.training import create_train_state, make_optimizer, make_train_step, seq2seq_loss

    device = _torch_setup(torch, args)
    torch.manual_seed(args.seed)
    load_before = os.getloadavg()
    config = preset(TRAIN_PRESETS[args.preset], dropout_rate=0.1)
    model = T5(config)
    dummy = jnp.ones((1, 8), jnp.int32)
    if args.batch % jax.device_count():
        raise SystemExit(f"--batch {args.batch} does not split over the {jax.device_count()} JAX devices; use a "
                         f"multiple of {jax.device_count()} or fewer --host-devices")
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1, args.mesh_axis: -1})
    tx, schedule = make_optimizer({"name": "adamw", "learning_rate": 1e-4, "grad_clip_norm": 1.0})
    state, shardings = create_train_state(lambda k: model.init(k, dummy, dummy)["params"], tx, mesh, seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_t5(config, jax.device_get(state.params), tmp)
        reference = transformers.T5ForConditionalGeneration.from_pretrained(tmp).train().to(device)
    torch_opt = torch.optim.AdamW(reference.parameters(), lr=1e-4, weight_decay=0.0)
    step = make_train_step(seq2seq_loss(model.apply), tx, mesh, shardings, schedule=schedule)

    rng = np.random.default_rng(args.seed)
    inputs = rng.integers(2, config.vocab_size, size=(args.batch, args.input_len), dtype=np.int32)
    targets = rng.integers(2, config.vocab_size, size=(args.batch, args.target_len), dtype=np.int32)
    targets[:, -1] = 1
    batch = sharding.make_global_batch({"inputs": inputs, "targets": targets}, mesh)
    torch_inputs = torch.from_numpy(inputs.astype(np.int64)).to(device)
    torch_labels = torch.from_numpy(targets.astype(np.int64)).to(device)
    holder = {"state": state}

    def ours():
        holder["state"], metrics = step(holder["state"], batch)
        return float(metrics["loss"])  # blocks until the step has run

    def theirs():
        torch_opt.zero_grad(set_to_none=True)
        loss = reference(input_ids=torch_inputs, attention_mask=torch.ones_like(torch_inputs),
                         labels=torch_labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        torch_opt.step()
        return loss.item()

    start = time.perf_counter()
    first_loss = ours()
    first_call = time.perf_counter() - start
    torch_first_loss = theirs()
    med = _median_interleaved({"ours": ours, "transformers": theirs}, args.repeats)
    tokens = args.batch * (args.input_len + args.target_len)
    return {"benchmark": "train", "preset": args.preset, "config": TRAIN_PRESETS[args.preset],
            "batch": args.batch, "input_len": args.input_len, "target_len": args.target_len,
            "repeats": args.repeats, "torch_threads": args.torch_threads, "torch_device": args.torch_device,
            "cpu_cores": os.cpu_count(), "jax_devices": str(jax.devices()), "mesh": dict(mesh.shape),
            "malloc": cpu.malloc_in_use(),
            "ours_s_per_step": round(med["ours"], 4), "transformers_s_per_step": round(med["transformers"], 4),
            "ours_examples_per_s": round(args.batch / med["ours"], 2),
            "transformers_examples_per_s": round(args.batch / med["transformers"], 2),
            "ours_tokens_per_s": round(tokens / med["ours"], 1),
            "transformers_tokens_per_s": round(tokens / med["transformers"], 1),
            "speedup": round(med["transformers"] / med["ours"], 2),
            "ours_compile_s": round(max(first_call - med["ours"], 0.0), 2),
            "first_step_loss": {"ours": round(first_loss, 4), "transformers": round(torch_first_loss, 4)},
            "load_average_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}


def _add_train_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="training-step throughput vs transformers (PyTorch)")
    p.add_argument("--preset", choices=sorted(TRAIN_PRESETS), default="t5-small")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--target-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="timed steps per implementation (median reported)")
    p.add_argument("--torch-threads", type=int, default=2)
    p.add_argument("--torch-device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--host-devices", type=int, default=0,
                   help="XLA:CPU host devices to split our batch over (default: one per core, or the largest "
                        "smaller count that divides --batch)")
    p.add_argument("--mesh-axis", choices=("data", "fsdp"), default="data",
                   help="the mesh axis over every JAX device: data (replicated parameters) or fsdp (split ones)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=bench_train)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_sample_parser(subparsers)
    _add_train_parser(subparsers)
    args = parser.parse_args(argv)
    print(json.dumps(args.func(args), indent=2))


if __name__ == "__main__":
    cpu.restart_with_fast_malloc()
    main()
