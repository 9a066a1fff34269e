"""The benchmarks' own arithmetic (XLA's FLOP count behind MFU and GFLOP/s) against a hand count, the accelerator
benchmark run end to end at its tiny size on the CPU, in float32 so that its two sides' first losses can be held to
float32 rounding, the sampling benchmark's JSON at a tiny size (timings are the benchmarks' output and are not
checked), and the one-line error of the benchmarks that need torch where it is missing."""
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the benchmark scripts are not installed

from benchmarks import bench_support  # noqa: E402


def test_train_flops_of_a_dense_layer_is_its_two_products():
    # loss = sum((x @ w)^2): forward x @ w is 2mkn operations, the gradient w.r.t. w is x^T @ (2 y), 2mkn more; the
    # elementwise square, scale and sum add a few per output element (mn each), under 4 / k of the products.
    m, k, n = 64, 256, 32
    x = jnp.asarray(np.random.default_rng(0).normal(size=(m, k)), jnp.float32)

    def loss_fn(params, batch, rng):
        return jnp.sum((batch["x"] @ params["w"]) ** 2), {}

    flops = bench_support.train_flops(loss_fn, {"w": jnp.zeros((k, n))}, {"x": x})
    products = 4 * m * k * n
    assert products <= flops <= products * (1 + 4 / k)


def test_accel_bench_runs_at_tiny_size_on_cpu(tmp_path):
    out = tmp_path / "accel.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_accel.py"), "--size", "tiny",
                           "--dtype", "float32", "--steps", "1", "--sample-repeats", "1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout[proc.stdout.index("{"):]) == report
    assert report["platform"] == "cpu" and report["peak"]["matmul"]["tflops"] > 0
    has_torch = report["torch"] is not None
    assert has_torch or report["transformers_skipped_because"] == "torch is not installed"
    assert set(report["models"]) == {"llama-tiny", "t5-tiny"}
    for preset, entry in report["models"].items():
        train = entry["train"]
        assert train["remat"] and train["dtype"] == "float32" and train["mesh"]["fsdp"] == jax.device_count()
        # MFU is the FLOP count over step time and the measured peak. Each is rounded in the JSON (step 6
        # decimals, GFLOP 4, MFU 6, TFLOP/s 3): the relative error allowed is the sum of the half-units over the
        # values, doubled.
        peak = report["peak"]["matmul"]["tflops"]
        expected = train["model_gflop_per_step"] * 1e9 / train["step_s"] / (peak * 1e12)
        rounding = 5e-7 / train["step_s"] + 5e-5 / train["model_gflop_per_step"] + 5e-7 / train["mfu"] + 5e-4 / peak
        assert math.isclose(train["mfu"], expected, rel_tol=2 * rounding), (preset, train)
        if has_torch:
            # The same weights and batch in float32: the first losses (means over the batch's target tokens, JSON
            # rounded to 4 decimals) agree to float32 rounding accumulated through the layers, 1e-5 relative, with a
            # margin of 10 for the orders of summation.
            ours, theirs = train["first_loss"], train["transformers"]["first_loss"]
            assert math.isclose(ours, theirs, rel_tol=1e-4, abs_tol=1e-4), (preset, ours, theirs)
        for scenario in ("greedy", "top_p"):
            sample = entry["sample"][scenario]
            assert sample["tokens_per_s"] > 0 and sample["compile_s"] >= 0
            assert ("speedup" in sample) == has_torch


def test_sample_bench_times_the_shared_prompt_cache_and_records_the_decode_products():
    """`bench.py sample` on gpt2-tiny at a tiny size, top-p only, with YNNPACK products: the JSON names the choice,
    and the decoder-only side is timed with and without `share_prompt_cache`, both generating every token."""
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench.py"), "sample", "--preset",
                           "gpt2-tiny", "--scenarios", "top_p", "--repeats", "1", "--prompt-len", "8",
                           "--new-tokens", "4", "--host-devices", "1", "--decode-products", "ynnpack"],
                          cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    top_p = report["results"]["top_p"]
    assert report["decode_products"] == "ynnpack" and top_p["all_lengths_equal_new_tokens"]
    generated = top_p["batch"] * top_p["num_samples"] * top_p["new_tokens"]
    for side in ("ours", "ours_shared_prompt"):
        # tokens/s is the generated count over the median time, each rounded in the JSON (0.1 and 1e-4 s).
        rate = generated / top_p[f"{side}_s"]
        assert abs(top_p[f"{side}_tokens_per_s"] - rate) <= 0.05 + rate * 5e-5 / top_p[f"{side}_s"], (side, top_p)
    assert top_p["speedup_shared_prompt"] > 0 and top_p["ours_shared_prompt_compile_s"] >= 0


@pytest.mark.parametrize("command", ["sample", "train"])
def test_bench_without_torch_says_which_extra_to_install(command, tmp_path):
    """With torch unimportable (a `sitecustomize` that blocks it, kept across the bench's malloc restart), `bench.py
    sample` / `train` exit with status 2 and one line naming the test extra, not a traceback."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # import torch fails\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench.py"), command, "--preset", "tiny"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == ""
    assert proc.stderr.strip() == (f"error: bench.py {command} compares against transformers' PyTorch models and "
                                   "needs torch; install the test extra: pip install -e '.[test]'")


def test_decode_products_choice_sets_the_samplers_compile_options(monkeypatch):
    from refiner_jax import cpu, sampling

    def options(value):
        monkeypatch.setenv(cpu.DECODE_PRODUCTS, value)
        sampling.decode_options.cache_clear()
        return sampling.decode_options("cpu")

    try:
        assert options("ynnpack") is None  # XLA's defaults
        assert options("eigen") in (sampling._CPU_DECODE_OPTIONS, None)  # None: an XLA without the option
        monkeypatch.delenv(cpu.DECODE_PRODUCTS)
        sampling.decode_options.cache_clear()
        assert sampling.decode_options("cpu") == options("eigen")  # the default
        with pytest.raises(ValueError, match=r"REFINER_JAX_DECODE_PRODUCTS='mkl': use one of \('eigen', 'ynnpack'\)"):
            options("mkl")
    finally:
        monkeypatch.delenv(cpu.DECODE_PRODUCTS, raising=False)
        sampling.decode_options.cache_clear()
