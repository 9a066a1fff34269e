"""Benchmarks against transformers' PyTorch implementation; each subcommand prints one JSON object.

  python benchmarks/bench.py sample --preset tiny|t5-small|gpt2-tiny|gpt2-small [--repeats 5]
  python benchmarks/bench.py train --preset tiny|t5-small|gpt2-tiny|llama-mini|gpt2-small|qwen2.5-0.5b
      [--batch 32 --input-len 128 --target-len 64 --fill 0.5 --rows padded|packed]
  python benchmarks/bench.py profile --preset gpt2-small [--batch 32]   (no transformers: decode_profile.py)
  python benchmarks/bench.py stage --workdir RUN [--stage refiner]   (a REFINER run's update, part by part:
      stage_timing.py)

`sample` and `train` need the test extra (torch, for transformers' side): pip install -e '.[test]'.
The accelerator benchmark (bf16, remat, fsdp, MFU) is `benchmarks/bench_accel.py`.

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
`REFINER_JAX_MALLOC=glibc` measures with glibc's malloc on huge pages, `REFINER_JAX_MALLOC=glibc-retain` with glibc
keeping freed memory, `REFINER_JAX_MALLOC=system` with the malloc and settings the process started with.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bench_support as support  # noqa: E402 (standard library only at import)
from benchmarks import decode_profile  # noqa: E402 (likewise)
from benchmarks import stage_timing  # noqa: E402 (likewise)
from refiner_jax import cpu  # noqa: E402 (standard library only: JAX has not started)

# bench name -> (family, model preset): T5 (`t5_sampling.sample_t5`) or decoder-only (`sample_decoder`, GPT-2 shapes).
SAMPLE_PRESETS = {"tiny": ("t5", "t5-tiny"), "t5-small": ("t5", "t5-small"), "gpt2-tiny": ("decoder", "gpt2-tiny"),
                  "gpt2-small": ("decoder", "gpt2")}


def _sampler(name: str, seed: int, device):
    """Our random model `name`, its sampler (`sample_t5` or `sample_decoder`), and transformers' model on the same
    weights."""
    import jax

    from refiner_jax.models import init_params, t5_sampling
    from refiner_jax.models.decoder_sampling import sample_decoder

    config = support.model_config(name, dropout_rate=0.0)
    params = init_params(config, jax.random.key(seed))
    reference = support.transformers_model(config, params, device, train=False)
    t5 = support.FAMILY_OF[name] == "t5"
    return dict(config=config, params=params, sample=t5_sampling.sample_t5 if t5 else sample_decoder,
                reference=reference, echoes_prompt=not t5, generation=support.generation_ids(config))


def bench_sample(args) -> dict:
    """Batch sampling throughput of ours vs transformers' `generate`, on the same architecture and weights (ours,
    exported for transformers): `models.t5_sampling.sample_t5` vs `T5ForConditionalGeneration` for the T5 presets, and
    `models.decoder_sampling.sample_decoder` (each prompt prefilled in one pass) vs `GPT2LMHeadModel` for the
    decoder-only ones.

    Scenarios: greedy (batch 32, 128 prompt tokens, exactly 64 new tokens) and top-p 0.5 (8 prompts x 8 samples,
    64 new tokens); EOS is suppressed in both implementations (min_new_tokens = max_new_tokens) so both generate
    the same number of tokens. Ours splits the prompts over all JAX devices when they divide the batch. Where a
    decoder-only model draws several samples a prompt, ours is also timed with `share_prompt_cache`.
    """
    torch = support.import_torch("bench.py sample")
    cpu.expose_host_devices(args.host_devices)
    os.environ[cpu.DECODE_PRODUCTS] = args.decode_products
    import jax
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    device = support.torch_setup(torch, args.torch_threads, args.torch_device)
    load_before = os.getloadavg()
    family, model_preset = SAMPLE_PRESETS[args.preset]
    side = _sampler(model_preset, args.seed, device)
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

        timed = {"ours": ours}
        if family == "decoder" and sc["num_samples"] > 1:  # also with one copy of each prompt's keys and values
            shared_knobs = dict(knobs, config=config.replace(share_prompt_cache=True))
            timed["ours_shared_prompt"] = lambda: jax.block_until_ready(
                side["sample"](params, prompts, key, **shared_knobs))

        theirs = support.transformers_generate(torch, reference, prompts, device, new_tokens=new_tokens,
                                               num_samples=sc["num_samples"], temperature=sc["temperature"],
                                               top_p=sc["top_p"], generation_ids=side["generation"])

        start = time.perf_counter()
        first = ours()
        first_call = time.perf_counter() - start
        theirs_tokens = theirs()[:, skip:].cpu().numpy()
        compile_s = {}
        for label in set(timed) - {"ours"}:
            start = time.perf_counter()
            timed[label]()
            compile_s[label] = time.perf_counter() - start
        med = support.median_interleaved({**timed, "transformers": theirs}, args.repeats)
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
        if "ours_shared_prompt" in med:
            entry.update({"ours_shared_prompt_s": round(med["ours_shared_prompt"], 4),
                          "ours_shared_prompt_tokens_per_s": round(generated / med["ours_shared_prompt"], 1),
                          "speedup_shared_prompt": round(med["transformers"] / med["ours_shared_prompt"], 2),
                          "ours_shared_prompt_compile_s": round(max(compile_s["ours_shared_prompt"]
                                                                    - med["ours_shared_prompt"], 0.0), 2)})
        if name == "greedy":
            # Float summation order differs, so long greedy runs may drift apart after a near-tie.
            entry["greedy_identical_rows"] = int(np.all(ours_tokens == theirs_tokens, axis=1).sum())
        results[name] = entry
    return {"benchmark": "sample", "preset": args.preset, "config": model_preset, "family": family,
            "repeats": args.repeats, "torch_threads": args.torch_threads, "torch_device": args.torch_device,
            "cpu_cores": os.cpu_count(), "max_top_k": args.max_top_k, "jax_devices": str(jax.devices()),
            "malloc": cpu.malloc_in_use(), "decode_products": args.decode_products,
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
    support.add_decode_products(p)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=bench_sample)


TRAIN_PRESETS = ("tiny", "t5-small", "gpt2-tiny", "llama-mini", "gpt2-small", "qwen2.5-0.5b")
_TRAIN_CONFIG = {"tiny": "t5-tiny", "gpt2-small": "gpt2"}  # bench name -> model preset where they differ


def _train_pairs(rng, n: int, input_len: int, target_len: int, fill: float, vocab: int, eos: int):
    """n (prompt, target) id rows ending with EOS, each part's length uniform in [fill * budget, budget]."""
    def row(budget):
        length = int(rng.integers(max(int(fill * budget), 2), budget + 1))
        return rng.integers(3, vocab, size=length - 1).tolist() + [eos]

    return [row(input_len) for _ in range(n)], [row(target_len) for _ in range(n)]


def bench_train(args) -> dict:
    """Training throughput of one jitted, donated AdamW step (`training.steps.make_train_step` on `pair_loss`) vs
    the same update in transformers' PyTorch model (forward with labels, backward, clip, AdamW), on identical
    weights and examples: T5 presets against `T5ForConditionalGeneration`, decoder-only ones (GPT-2, Llama, Qwen2
    shapes) against `AutoModelForCausalLM` with the loss on the target tokens only.

    `--batch` (prompt, target) pairs of `--input-len` + `--target-len` tokens, each part's length drawn uniformly
    from [`--fill` x budget, budget] (1.0: no padding). transformers takes one pair per row, padded, with an
    attention mask; ours the same (`--rows padded`) or, for decoder-only models, the pairs packed first-fit into
    fewer rows with segment ids (`--rows packed`, as the jobs train). Dropout `--dropout` in both (default 0.1 for
    T5, 0 for decoder-only models: transformers' Llama has no residual dropout to match ours).

    Ours splits the batch over every JAX device along `--mesh-axis`; on a CPU, `--host-devices` (default: one per
    core, or the largest smaller count that divides the batch) exposes the cores as that many XLA host devices
    first. XLA:CPU runs most elementwise work of a program on one thread and only its matrix products on every core,
    so the per-device programs overlap that work. GFLOP/s is XLA's count of the gradient's operations (forward and
    backward) over the step time, beside the machine's measured float32 product rate.
    """
    torch = support.import_torch("bench.py train")
    cores = os.cpu_count() or 1
    host_devices = args.host_devices or max(n for n in range(1, cores + 1) if args.batch % n == 0)
    cpu.expose_host_devices(host_devices)
    import jax
    import numpy as np

    from refiner_jax import sharding
    from refiner_jax.models.language_model import LanguageModel
    from refiner_jax.training import create_train_state, make_optimizer, make_train_step
    from refiner_jax.training.steps import pair_loss

    device = support.torch_setup(torch, args.torch_threads, args.torch_device)
    torch.manual_seed(args.seed)
    load_before = os.getloadavg()
    name = _TRAIN_CONFIG.get(args.preset, args.preset)
    t5 = support.FAMILY_OF[name] == "t5"
    dropout = args.dropout if args.dropout is not None else (0.1 if t5 else 0.0)
    if args.rows == "packed" and t5:
        raise SystemExit("--rows packed: only decoder-only models pack pairs into rows; T5 takes --rows padded")
    config = support.model_config(name, dropout_rate=dropout)
    lm = LanguageModel(config)
    module = lm.module()
    if args.batch % jax.device_count():
        raise SystemExit(f"--batch {args.batch} does not split over the {jax.device_count()} JAX devices; use a "
                         f"multiple of {jax.device_count()} or fewer --host-devices")
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1, args.mesh_axis: -1})
    tx, schedule = make_optimizer({"name": "adamw", "learning_rate": 1e-4, "grad_clip_norm": 1.0})
    state, shardings = create_train_state(lambda k: module.init(k, *lm.init_args())["params"], tx, mesh,
                                          seed=args.seed)
    reference = support.transformers_model(config, jax.device_get(state.params), device, train=True)
    torch_opt = torch.optim.AdamW(reference.parameters(), lr=1e-4, weight_decay=0.0)
    step = make_train_step(pair_loss(lm, module), tx, mesh, shardings, schedule=schedule)

    rng = np.random.default_rng(args.seed)
    eos = config.eos_ids[0]
    prompts, targets = _train_pairs(rng, args.batch, args.input_len, args.target_len, args.fill,
                                    config.vocab_size, eos)
    padded = lm.pair_batch(prompts, targets, args.input_len, args.target_len, eos)
    ours_batch = padded if args.rows == "padded" else lm.pair_batch(
        prompts, targets, args.input_len, args.target_len, eos, pack=jax.device_count())
    batch = sharding.make_global_batch(ours_batch, mesh)
    flops = support.train_flops(pair_loss(lm, module), jax.device_get(state.params), ours_batch)
    peak = support.matmul_peak("float32", 2048)
    if t5:
        inputs = torch.from_numpy(padded["inputs"].astype(np.int64)).to(device)
        targets_t = torch.from_numpy(padded["targets"].astype(np.int64)).to(device)
        feed = dict(input_ids=inputs, attention_mask=(inputs != 0).long(), labels=targets_t.masked_fill(
            targets_t == 0, -100), decoder_attention_mask=(targets_t != 0).long())
    else:
        tokens = torch.from_numpy(padded["tokens"].astype(np.int64)).to(device)
        feed = dict(input_ids=tokens, attention_mask=torch.from_numpy(padded["mask"]).long().to(device),
                    labels=tokens.masked_fill(torch.from_numpy(padded["weights"] == 0).to(device), -100))
    holder = {"state": state}

    def ours():
        holder["state"], metrics = step(holder["state"], batch)
        return float(metrics["loss"])  # blocks until the step has run

    def theirs():
        torch_opt.zero_grad(set_to_none=True)
        loss = reference(**feed).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        torch_opt.step()
        return loss.item()

    start = time.perf_counter()
    first_loss = ours()
    first_call = time.perf_counter() - start
    torch_first_loss = theirs()
    med = support.median_interleaved({"ours": ours, "transformers": theirs}, args.repeats)
    tokens = sum(len(p) + len(t) for p, t in zip(prompts, targets))  # real tokens, padding not counted
    rows = next(iter(ours_batch.values())).shape[0]
    return {"benchmark": "train", "preset": args.preset, "config": name, "family": "t5" if t5 else "decoder",
            "batch": args.batch, "input_len": args.input_len, "target_len": args.target_len, "fill": args.fill,
            "rows": args.rows, "ours_rows": rows, "dropout": dropout,
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
            "ours_gflop_per_step": None if flops is None else round(flops / 1e9, 2),
            "ours_gflops_per_s": None if flops is None else round(flops / med["ours"] / 1e9, 1),
            "matmul_peak_gflops_per_s": round(peak["tflops"] * 1e3, 1),
            "first_step_loss": {"ours": round(first_loss, 4), "transformers": round(torch_first_loss, 4)},
            "load_average_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}


def _add_train_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="training-step throughput vs transformers (PyTorch)")
    p.add_argument("--preset", choices=TRAIN_PRESETS, default="t5-small")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--target-len", type=int, default=64)
    p.add_argument("--fill", type=float, default=1.0,
                   help="each prompt and target is this share of its budget or longer (uniform; 1.0: full rows)")
    p.add_argument("--rows", choices=("padded", "packed"), default="padded",
                   help="ours: one pair per padded row, or pairs packed into rows (decoder-only models)")
    p.add_argument("--dropout", type=float, help="default: 0.1 for T5, 0.0 for decoder-only models")
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
    decode_profile.add_parser(subparsers)
    stage_timing.add_parser(subparsers)
    args = parser.parse_args(argv)
    print(json.dumps(args.func(args), indent=2))


if __name__ == "__main__":
    cpu.restart_with_fast_malloc()
    main()
