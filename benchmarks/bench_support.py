"""Pieces shared by `benchmarks/bench.py` (CPU, against transformers) and `benchmarks/bench_accel.py` (any
accelerator): transformers' side on the same weights, interleaved timing, the machine's measured ceilings, model FLOPs.

Importing this module does not start JAX or torch; each function imports what it needs.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

TEST_EXTRA = "pip install -e '.[test]'"


def import_torch(command: str):
    """torch, or exit with status 2 and one line naming the missing extra: the benchmarks' transformers side is a
    test dependency, not the library's."""
    try:
        import torch
    except ImportError:
        print(f"error: {command} compares against transformers' PyTorch models and needs torch; install the test "
              f"extra: {TEST_EXTRA}", file=sys.stderr)
        raise SystemExit(2) from None
    return torch


def add_decode_products(parser) -> None:
    """`--decode-products`: where our decode loops' products run on CPU (`refiner_jax.cpu.DECODE_PRODUCTS`)."""
    from refiner_jax import cpu

    parser.add_argument("--decode-products", choices=cpu.DECODE_PRODUCTS_CHOICES,
                        default=os.environ.get(cpu.DECODE_PRODUCTS, "eigen"),
                        help="Eigen (the samplers' default on CPU) or YNNPACK (XLA's default) for our decode loops")


# Bench names -> (family, model preset) of every model either bench builds.
FAMILY_OF = {"t5-tiny": "t5", "t5-small": "t5", "t5-base": "t5", "gpt2-tiny": "decoder", "gpt2": "decoder",
             "llama-tiny": "decoder", "llama-mini": "decoder", "qwen2.5-0.5b": "decoder"}


def torch_setup(torch, threads: int, device: str):
    """Thread count and device of the transformers side; on CUDA, TF32 float32 products like JAX's default
    precision there."""
    torch.set_num_threads(threads)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--torch-device cuda: torch sees no CUDA device; use --torch-device cpu")
        torch.set_float32_matmul_precision("high")
    return torch.device(device)


def torch_sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_interleaved(fns: dict, repeats: int) -> dict:
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


def model_config(preset: str, **overrides):
    """The named T5 or decoder-only architecture with `overrides` (dtype, remat, dropout_rate, ...)."""
    from refiner_jax.models import decoder_config, t5_config

    module = t5_config if FAMILY_OF[preset] == "t5" else decoder_config
    return module.preset(preset, **overrides)


def generation_ids(config) -> dict:
    """transformers' `GenerationConfig` token ids of `config`'s model, as our samplers read them from the config."""
    from refiner_jax.models.decoder_sampling import pad_id
    from refiner_jax.models.language_model import family_of

    if family_of(config) == "t5":
        return dict(decoder_start_token_id=config.pad_id, pad_token_id=config.pad_id,
                    eos_token_id=list(config.eos_ids))
    return dict(pad_token_id=pad_id(config), eos_token_id=list(config.eos_ids))


def transformers_model(config, params, device, *, train: bool, torch_dtype=None):
    """transformers' PyTorch model of `config` on the same weights (ours, exported), on `device`, in `torch_dtype`
    (None: float32)."""
    import jax
    import transformers

    from refiner_jax.models import hf, hf_decoder
    from refiner_jax.models.language_model import family_of

    with tempfile.TemporaryDirectory() as tmp:
        if family_of(config) == "t5":
            hf.save_t5(config, jax.device_get(params), tmp)
            model = transformers.T5ForConditionalGeneration.from_pretrained(tmp)
        else:
            hf_decoder.save_decoder(config, jax.device_get(params), tmp)
            model = transformers.AutoModelForCausalLM.from_pretrained(tmp)
    model = model.train() if train else model.eval()
    return model.to(device=device, dtype=torch_dtype)


def transformers_generate(torch, reference, prompts, device, *, new_tokens: int, num_samples: int, temperature: float,
                          top_p: float, generation_ids: dict):
    """A zero-argument callable: transformers' `generate` on `prompts` [batch, P] (numpy ids), exactly `new_tokens`
    new tokens per sample (EOS suppressed), greedy at temperature 0, else nucleus `top_p` with no top-k; blocks
    until the device is done."""
    import numpy as np
    import transformers

    sampled = temperature > 0
    generation = transformers.GenerationConfig(
        do_sample=sampled, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        num_return_sequences=num_samples, top_k=0 if sampled else None, top_p=top_p if sampled else None,
        temperature=temperature or None, **generation_ids)
    input_ids = torch.from_numpy(prompts.astype(np.int64)).to(device)

    def generate():
        with torch.inference_mode():
            out = reference.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                     generation_config=generation)
        torch_sync(torch, device)
        return out

    return generate


def median_seconds(fn, *args, repeats: int) -> float:
    """Median seconds of `fn(*args)`, blocked until its result is ready, over `repeats` calls after one warm-up."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(dtype: str, n: int, repeats: int = 10) -> dict:
    """The default device's measured rate of one n x n x n product in `dtype` (median of `repeats` after a warm-up;
    random operands, since zeros run faster on some chips): the ceiling that MFU and GFLOP/s are read against."""
    import jax

    a, b = (jax.random.normal(k, (n, n), dtype) for k in jax.random.split(jax.random.key(0), 2))
    seconds = median_seconds(jax.jit(lambda a, b: a @ b), a, b, repeats=repeats)
    return {"dtype": dtype, "n": n, "tflops": round(2 * n ** 3 / seconds / 1e12, 3)}


def copy_bandwidth(megabytes: int, repeats: int = 10) -> dict:
    """The default device's measured memory bandwidth: bytes read plus written by `x + 1` over a float32 array of
    `megabytes` (median of `repeats`), the ceiling of weight-bound decode steps."""
    import jax
    import jax.numpy as jnp

    x = jax.random.normal(jax.random.key(0), (megabytes * 2 ** 18,), jnp.float32)
    seconds = median_seconds(jax.jit(lambda x: x + 1), x, repeats=repeats)
    return {"megabytes": megabytes, "gb_per_s": round(2 * x.nbytes / seconds / 1e9, 1)}


def train_flops(loss_fn, params, batch) -> float | None:
    """XLA's count of the floating-point operations of one gradient of `loss_fn` on `batch` (forward and backward,
    before optimisation): model FLOPs when the model is built without remat. The program is lowered for the CPU from
    abstract shapes, whatever the default device (a GPU's lowering has no count before compiling, and the count
    does not depend on the device). None where this jax cannot count."""
    import jax

    grad = jax.jit(jax.grad(lambda p, b: loss_fn(p, b, None)[0]))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (params, batch))
    try:
        cost = grad.trace(*abstract).lower(lowering_platforms=("cpu",)).cost_analysis()
    except Exception:  # noqa: BLE001 (a jax without this API or cost model: the JSON then says null)
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None
