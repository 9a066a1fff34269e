"""`bench.py profile`: where a decoder-only sampler's time goes, against the machine's measured ceilings.

Times, on one device, `sample_decoder` as a whole (greedy, exactly `--new-tokens`: prefill plus decode steps; the
prefill alone is the run with one new token) and three programs that each repeat one part of a decode step
`--new-tokens` times in one jitted loop, with the step's shapes: the weight products alone (every layer's
projections and MLP, then the output layer, on `--batch` rows), attention over a KV cache of prompt + new tokens
alone, and the next-token choice alone (greedy, and nucleus top-p 0.5) on `[batch, vocab]` logits. Against them: the
float32 product rate and the memory bandwidth measured here, the FLOPs and the weight bytes of one step, and the
floors they give (a step cannot take less than its FLOPs over the product rate, nor its weights over bandwidth); the
weight products' FLOPs only: attention's are small beside them at these lengths.
"""
from __future__ import annotations

import os

from benchmarks import bench_support as support


def _kernels(params) -> list:
    """The decoder layers' weight matrices as [inputs, outputs] (attention's [d, heads, head_dim] and
    [heads, head_dim, d] flattened), in layer order."""
    import jax

    out = []
    for path, x in jax.tree_util.tree_leaves_with_path(params):
        name = jax.tree_util.keystr(path)
        if "layers_" in name and x.ndim >= 2:
            out.append(x.reshape(-1, x.shape[-1]) if name.endswith("['out']") else x.reshape(x.shape[0], -1))
    return out


def profile_decode(args) -> dict:
    from refiner_jax import cpu

    cpu.expose_host_devices(1)
    os.environ[cpu.DECODE_PRODUCTS] = args.decode_products
    import jax
    import jax.numpy as jnp
    import numpy as np

    from refiner_jax import sampling
    from refiner_jax.models import init_params
    from refiner_jax.models.decoder_sampling import sample_decoder

    name = {"gpt2-small": "gpt2"}.get(args.preset, args.preset)
    config = support.model_config(name, dropout_rate=0.0)
    params = init_params(config, jax.random.key(args.seed))
    b, p, n = args.batch, args.prompt_len, args.new_tokens
    prompts = np.random.default_rng(args.seed).integers(3, config.vocab_size, size=(b, p), dtype=np.int32)
    key = jax.random.key(args.seed)

    def whole(new):
        return lambda: sample_decoder(params, prompts, key, config=config, max_new_tokens=new, min_new_tokens=new,
                                      temperature=0.0)

    prefill_s = support.median_seconds(whole(1), repeats=args.repeats)
    run_s = support.median_seconds(whole(n), repeats=args.repeats)
    step_ms = (run_s - prefill_s) / (n - 1) * 1e3

    kernels = _kernels(params)
    # The output layer as [d_model, vocab]: the untied head, else the token embedding transposed.
    output = params["lm_head"] if "lm_head" in params else params["token_embedder"].T
    width = max(max(w.shape) for w in kernels)

    @jax.jit
    def products(kernels, output, x):  # x [b, width]: each step runs every kernel on b rows, then the output layer
        def step(_, x):
            for w in kernels:
                x = x.at[:, :w.shape[1]].add(1e-6 * (x[:, :w.shape[0]] @ w))
            logits = x[:, :config.d_model] @ output  # [b, vocab]
            return x.at[:, :config.d_model].add(1e-6 * logits[:, :config.d_model])
        return jax.lax.fori_loop(0, n, step, x)

    x0 = jnp.asarray(np.random.default_rng(1).normal(size=(b, width)), jnp.float32)
    products_ms = support.median_seconds(products, kernels, output, x0, repeats=args.repeats) / n * 1e3

    heads, kv_heads, head_dim, slots = config.num_heads, config.num_kv_heads, config.head_dim, p + n
    cache = jnp.asarray(np.random.default_rng(2).normal(size=(config.num_layers, 2, b, kv_heads, slots, head_dim)),
                        jnp.float32)

    @jax.jit
    def attention(cache, q):  # q [b, heads, head_dim] against each layer's keys and values
        groups = heads // kv_heads

        def step(_, q):
            for layer in range(config.num_layers):
                k, v = cache[layer, 0], cache[layer, 1]  # [b, kv_heads, slots, head_dim]
                qg = q.reshape(b, kv_heads, groups, head_dim)
                w = jax.nn.softmax(jnp.einsum("bhgd,bhsd->bhgs", qg, k) * head_dim ** -0.5, axis=-1)
                q = q + 1e-3 * jnp.einsum("bhgs,bhsd->bhgd", w, v).reshape(b, heads, head_dim)
            return q
        return jax.lax.fori_loop(0, n, step, q)

    q0 = jnp.asarray(np.random.default_rng(3).normal(size=(b, heads, head_dim)), jnp.float32)
    attention_ms = support.median_seconds(attention, cache, q0, repeats=args.repeats) / n * 1e3

    logits0 = jnp.asarray(np.random.default_rng(4).normal(size=(b, config.vocab_size)) * 3, jnp.float32)

    def choice(temperature, top_p):
        @jax.jit
        def run(logits):
            def step(i, carry):
                logits, total = carry
                token, _ = sampling._next_token(
                    logits, jax.random.fold_in(key, i), jnp.ones((b,), bool), temperature=jnp.float32(temperature),
                    top_k=jnp.int32(0), top_p=jnp.float32(top_p), eos_ids=config.eos_ids, max_top_k=64)
                return logits.at[jnp.arange(b), token].add(-0.5), total + token
            return jax.lax.fori_loop(0, n, step, (logits, jnp.zeros((b,), jnp.int32)))
        return support.median_seconds(run, logits0, repeats=args.repeats) / n * 1e3

    greedy_ms, nucleus_ms = choice(0.0, 1.0), choice(1.0, 0.5)
    peak = support.matmul_peak("float32", 2048)
    bandwidth = support.copy_bandwidth(512)
    layer_values = sum(int(w.size) for w in kernels)
    weight_values = layer_values + int(output.size)
    step_flops = 2 * weight_values * b
    prefill_flops = 2 * layer_values * b * p + 2 * int(output.size) * b  # the output layer at the last token only
    return {"benchmark": "profile", "preset": args.preset, "config": name, "batch": b, "prompt_len": p,
            "new_tokens": n, "repeats": args.repeats, "cpu_cores": os.cpu_count(), "malloc": cpu.malloc_in_use(),
            "decode_products": args.decode_products,
            "jax_devices": str(jax.devices()),
            "whole_run_s": round(run_s, 3), "prefill_s": round(prefill_s, 3), "decode_step_ms": round(step_ms, 2),
            "products_alone_ms": round(products_ms, 2), "attention_alone_ms": round(attention_ms, 2),
            "greedy_choice_alone_ms": round(greedy_ms, 2), "nucleus_choice_alone_ms": round(nucleus_ms, 2),
            "matmul_peak_gflops_per_s": round(peak["tflops"] * 1e3, 1), "copy_gb_per_s": bandwidth["gb_per_s"],
            "step_gflop": round(step_flops / 1e9, 2), "step_weight_mb": round(weight_values * 4 / 2 ** 20, 1),
            "step_floor_ms": {"flops": round(step_flops / (peak["tflops"] * 1e12) * 1e3, 2),
                              "weights": round(weight_values * 4 / (bandwidth["gb_per_s"] * 1e9) * 1e3, 2)},
            "prefill_gflop": round(prefill_flops / 1e9, 1),
            "prefill_floor_s": round(prefill_flops / (peak["tflops"] * 1e12), 3)}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("profile", help="a decoder sampler's time per part against measured ceilings")
    p.add_argument("--preset", choices=("gpt2-tiny", "gpt2-small", "llama-mini", "qwen2.5-0.5b"),
                   default="gpt2-small")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    support.add_decode_products(p)
    p.set_defaults(func=profile_decode)
