"""Losses, optimizers and the jit-sharded train/eval steps.

The multi-device checks run this file as a script in a subprocess with 8 virtual CPU devices (XLA_FLAGS must be set
before JAX starts, and the rest of the suite keeps its single device); the script prints a JSON report of measured
differences that the tests below assert on.
"""
import json
import math
import os
import re
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path.insert(0, REPO)

import jax  # noqa: E402
from _devices import run_report  # noqa: E402
from _tolerance import NETWORK, REORDER, check_close, tolerance  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from refiner_jax.training import make_optimizer, make_schedule, masked_cross_entropy, mean_metrics  # noqa: E402


def _np_cross_entropy(logits, targets, weights, z_loss=0.0):
    """Reference: per-position -log softmax(target) (+ z-loss) in float64, weighted sum and weight count."""
    logits = logits.astype(np.float64)
    m = logits.max(-1, keepdims=True)
    log_z = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    nll = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0] + z_loss * log_z ** 2
    return float((nll * weights).sum()), float(weights.sum())


def test_masked_cross_entropy_hand_example():
    # vocab 3. Position 0: uniform logits, target 2 -> ln 3. Position 1: logits [0, ln 2, 0], target 1 ->
    # -log(2/4) = ln 2. Position 2: target 0 (pad) with NaN logits -> must not count at all.
    logits = jnp.array([[[0.0, 0.0, 0.0], [0.0, math.log(2.0), 0.0], [jnp.nan, jnp.nan, jnp.nan]]])
    targets = jnp.array([[2, 1, 0]])
    loss_sum, count = masked_cross_entropy(logits, targets)
    assert float(count) == 2.0
    assert float(loss_sum) == pytest.approx(math.log(6.0), rel=1e-6)


def test_masked_cross_entropy_matches_numpy_with_pads_weights_and_zloss():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7, 11)).astype(np.float32) * 3
    targets = rng.integers(1, 11, size=(3, 7))
    targets[0, 4:] = 0
    targets[2, 1:] = 0
    weights = (targets != 0).astype(np.float32)
    got = masked_cross_entropy(jnp.asarray(logits), jnp.asarray(targets))
    np.testing.assert_allclose(np.array(got, np.float64), _np_cross_entropy(logits, targets, weights), rtol=1e-5)
    # Explicit weights (train on a subset of tokens, or up-weight some) and the z-loss term.
    custom = weights * rng.uniform(0.5, 2.0, size=weights.shape)
    custom[1, :3] = 0.0
    got = masked_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(custom), z_loss=1e-2)
    np.testing.assert_allclose(np.array(got, np.float64), _np_cross_entropy(logits, targets, custom, 1e-2),
                               rtol=1e-5)


def test_masked_cross_entropy_gradient_matches_analytic_formula():
    # d/dlogits of sum_t w_t * (log_z_t - logit_t[target] + z * log_z_t**2) is
    # w_t * ((1 + 2 z log_z_t) * softmax_t - onehot_t), worked out by hand and evaluated in float64.
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 5, 13)).astype(np.float32) * 4
    targets = rng.integers(1, 13, size=(2, 5))
    targets[1, 3:] = 0
    weights = (targets != 0) * rng.uniform(0.5, 2.0, size=targets.shape)
    z = 1e-2
    x = logits.astype(np.float64)
    log_z = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    softmax = np.exp(x - log_z[..., None])
    onehot = np.eye(13)[targets]
    expected = weights[..., None] * ((1 + 2 * z * log_z)[..., None] * softmax - onehot)
    grad = jax.grad(lambda l: masked_cross_entropy(l, jnp.asarray(targets), jnp.asarray(weights, jnp.float32),
                                                   z_loss=z)[0])(jnp.asarray(logits))
    np.testing.assert_allclose(np.asarray(grad, np.float64), expected, rtol=1e-5, atol=1e-7)
    assert not np.any(np.asarray(grad)[1, 3:])  # pad positions get no gradient


def test_masked_cross_entropy_gradient_is_zero_at_masked_nonfinite_positions():
    logits = jnp.array([[[0.0, 1.0, 2.0], [jnp.nan, jnp.inf, -jnp.inf]]])
    targets = jnp.array([[2, 0]])
    grad = np.asarray(jax.grad(lambda l: masked_cross_entropy(l, targets)[0])(logits))
    assert np.all(np.isfinite(grad)) and not np.any(grad[0, 1])
    p = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    np.testing.assert_allclose(grad[0, 0], p - np.array([0.0, 0.0, 1.0]), rtol=1e-6)


def test_seq2seq_loss_accuracy_counts_targets_with_the_largest_logit():
    from refiner_jax.training import seq2seq_loss

    # A stand-in model whose logits are fixed: position 0 predicts token 2, position 1 token 1, position 2 ties
    # tokens 1 and 2, position 3 is pad (its largest logit is its target's, and it must not count).
    logits = jnp.array([[[0.0, 1.0, 5.0], [0.0, 3.0, 1.0], [0.0, 4.0, 4.0], [9.0, 0.0, 0.0]]])
    loss_fn = seq2seq_loss(lambda variables, inputs, decoder_inputs, **kw: logits)
    batch = {"inputs": jnp.array([[5, 1]]), "targets": jnp.array([[2, 2, 2, 0]])}
    _, sums = loss_fn({}, batch, None)
    assert float(sums["accuracy_sum"]) == 2.0 and float(sums["tokens"]) == 3.0


def test_mean_metrics_divides_sums_by_tokens():
    out = mean_metrics({"loss_sum": jnp.float32(6.0), "accuracy_sum": jnp.float32(3.0), "tokens": jnp.float32(4.0)})
    assert {k: float(v) for k, v in out.items()} == {"loss": 1.5, "accuracy": 0.75, "tokens": 4.0}
    assert float(mean_metrics({"loss_sum": jnp.float32(0.0), "tokens": jnp.float32(0.0)})["loss"]) == 0.0


def test_schedules_hand_values():
    base = dict(learning_rate=1.0, warmup_steps=10, total_steps=110, end_lr_factor=0.1)
    wl = make_schedule(dict(base, schedule="warmup_linear"))
    # 0 -> 1 over 10 steps, then 1 -> 0.1 over 100 steps.
    for step, want in [(0, 0.0), (5, 0.5), (10, 1.0), (60, 0.55), (110, 0.1), (500, 0.1)]:
        assert float(wl(step)) == pytest.approx(want, abs=1e-6), step
    wc = make_schedule(dict(base, schedule="warmup_cosine"))
    # Half-way through the cosine: 0.1 + 0.9 * (1 + cos(pi/2)) / 2 = 0.55.
    for step, want in [(5, 0.5), (10, 1.0), (60, 0.55), (110, 0.1)]:
        assert float(wc(step)) == pytest.approx(want, abs=1e-6), step
    lin = make_schedule(dict(base, schedule="linear", warmup_steps=0))
    assert float(lin(55)) == pytest.approx(1.0 - 0.9 * 55 / 110, abs=1e-6)
    # 'linear' has no warm-up, so a warmup_steps longer than the run is ignored, not an error.
    assert float(make_schedule(dict(base, schedule="linear", warmup_steps=500))(55)) == pytest.approx(float(lin(55)))
    rs = make_schedule(dict(learning_rate=0.01, schedule="rsqrt", warmup_steps=100))
    assert float(rs(50)) == pytest.approx(0.01) and float(rs(400)) == pytest.approx(0.005)
    assert float(make_schedule({"learning_rate": 3e-4})(1234)) == pytest.approx(3e-4)


def test_optimizer_config_errors_name_the_field():
    with pytest.raises(ValueError, match="unknown fields.*'lr'"):
        make_optimizer({"lr": 1e-3})
    with pytest.raises(ValueError, match="optimizer.name"):
        make_optimizer({"name": "sgd"})
    with pytest.raises(ValueError, match="total_steps"):
        make_optimizer({"schedule": "warmup_cosine", "warmup_steps": 10})


def test_adamw_decays_matrices_not_norm_scales():
    params = {"kernel": jnp.full((2, 3), 2.0), "scale": jnp.full((3,), 2.0)}
    tx, _ = make_optimizer(dict(name="adamw", learning_rate=1.0, weight_decay=0.1, grad_clip_norm=0))
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zero, tx.init(params), params)
    # Zero gradients: Adam's step is 0, so only decoupled decay acts: -lr * wd * p = -0.2 on matrices only.
    np.testing.assert_allclose(updates["kernel"], -0.2)
    np.testing.assert_allclose(updates["scale"], 0.0)


def test_global_norm_clipping_feeds_clipped_gradients_to_adam():
    # Reference: hand-rolled Adam (b1=0.9, b2=0.999, eps=1e-8, lr=1) on gradients clipped to global norm 1.
    grads = [np.array([60.0, 80.0]), np.array([0.3, -0.4])]  # norms 100 (clipped to 1) and 0.5 (kept)
    mu, nu, want = np.zeros(2), np.zeros(2), []
    for t, g in enumerate(grads, start=1):
        g = g / max(1.0, np.linalg.norm(g))
        mu, nu = 0.9 * mu + 0.1 * g, 0.999 * nu + 0.001 * g * g
        want.append(-(mu / (1 - 0.9 ** t)) / (np.sqrt(nu / (1 - 0.999 ** t)) + 1e-8))
    tx, _ = make_optimizer(dict(name="adamw", learning_rate=1.0, grad_clip_norm=1.0))
    params = jnp.zeros(2)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for g, w in zip(grads, want):
        u, state = update(jnp.asarray(g, jnp.float32), state, params)
        np.testing.assert_allclose(u, w, rtol=1e-4)  # float32 vs the float64 reference


def _adafactor_first_update(g: np.ndarray, p: np.ndarray, lr: float, param_scale: bool) -> np.ndarray:
    """Adafactor's first update (Shazeer & Stern, 2018), float64: the second moment is g^2 (decay 0 at step 1),
    factored into row and column means for a matrix; the update g / sqrt(v) is clipped to RMS <= 1 and optionally
    scaled by max(1e-3, RMS(p))."""
    g = g.astype(np.float64)
    sq = g * g + 1e-30
    v = np.outer(sq.mean(1), sq.mean(0)) / sq.mean() if g.ndim == 2 else sq
    x = g / np.sqrt(v)
    x = x / max(1.0, np.sqrt(np.mean(x * x)))
    if param_scale:
        x = x * max(1e-3, np.sqrt(np.mean(p.astype(np.float64) ** 2)))
    return -lr * x


@pytest.mark.parametrize("param_scale", [False, True])
def test_adafactor_first_update_matches_the_paper(param_scale):
    rng = np.random.default_rng(0)
    # A gradient that is not rank one, with very different row scales: factoring matters.
    grads = {"kernel": (rng.normal(size=(4, 3)) * np.array([[1.0], [3.0], [0.2], [5.0]])).astype(np.float32),
             "scale": np.array([2.0, -0.5, 0.1], np.float32)}
    params = {"kernel": rng.normal(size=(4, 3)).astype(np.float32), "scale": np.full(3, 0.5, np.float32)}
    tx, _ = make_optimizer(dict(name="adafactor", learning_rate=0.1, min_dim_size_to_factor=2, grad_clip_norm=0.0,
                                multiply_by_parameter_scale=param_scale))
    state = tx.init(params)
    factored = state[0]
    assert factored.v_row["kernel"].size + factored.v_col["kernel"].size == 4 + 3  # factored, not [4, 3]
    assert factored.v["scale"].shape == (3,)  # vectors keep a full second moment
    updates, _ = jax.jit(tx.update)(grads, state, params)
    for name in grads:
        np.testing.assert_allclose(updates[name], _adafactor_first_update(grads[name], params[name], 0.1,
                                                                          param_scale), rtol=2e-5)


# ------------------------------------------------------------------------------------------------------------------
# 8-device checks (run in a subprocess)
# ------------------------------------------------------------------------------------------------------------------


def _batch(rows: int, rng: np.random.Generator) -> dict:
    """T5 batch with ragged padding: inputs [rows, 12], targets [rows, 10] (eos-terminated, 0-padded)."""
    inputs = np.zeros((rows, 12), np.int32)
    targets = np.zeros((rows, 10), np.int32)
    for i in range(rows):
        n, t = int(rng.integers(3, 13)), int(rng.integers(1, 10))
        inputs[i, :n] = rng.integers(2, 384, n)
        targets[i, :t] = rng.integers(2, 384, t)
        targets[i, t] = 1
    return {"inputs": inputs, "targets": targets}


def _max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


_ALL_REDUCE = re.compile(r"= (\([^=]*?\)|\S+) all-reduce(?:-start)?\(")  # the result shape of each all-reduce
_OTHER_COLLECTIVES = re.compile(r" (all-gather|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(")


def _multi_device_report() -> dict:
    from jax.sharding import PartitionSpec as P

    from refiner_jax import sharding as shd
    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset
    from refiner_jax.training import (create_train_state, make_eval_step, make_train_step, seq2seq_loss,
                                      train_state_shardings)
    from refiner_jax.training.steps import _sum_over

    n = jax.device_count()
    model = T5(preset("t5-tiny", num_layers=1, dropout_rate=0.0))
    init = lambda k: model.init(k, jnp.ones((2, 12), jnp.int32), jnp.ones((2, 10), jnp.int32))["params"]  # noqa
    loss_fn = seq2seq_loss(model.apply)
    tx = optax.sgd(1.0)  # params_after = params - grad, so the update exposes the gradient
    batch = _batch(16, np.random.default_rng(0))
    report = {"devices": n}

    # Single-device reference, and the same step with one data shard's rows replaced by another's: the deviation
    # that a dropped shard would show.
    mesh1 = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    state, sh1 = create_train_state(init, tx, mesh1, seed=0)
    params0 = jax.device_get(state.params)
    keep = jax.tree.map(jnp.copy, state)
    state, ref_metrics = make_train_step(loss_fn, tx, mesh1, sh1)(state, batch)
    ref_params = jax.device_get(state.params)
    ref_grads = jax.tree.map(np.subtract, params0, ref_params)
    report["ref_loss"] = float(ref_metrics["loss"])
    report["grad_scale"] = float(max(np.abs(g).max() for g in jax.tree.leaves(ref_grads)))
    shard = 16 // n
    dropped = {k: np.concatenate([v[:-shard], v[:shard]]) for k, v in batch.items()}
    bad_state, bad_metrics = make_train_step(loss_fn, tx, mesh1, sh1)(jax.tree.map(jnp.copy, keep), dropped)
    report["dropped_shard"] = dict(
        loss_diff=abs(float(bad_metrics["loss"]) - report["ref_loss"]),
        grads_diff=_max_diff(jax.tree.map(np.subtract, params0, jax.device_get(bad_state.params)), ref_grads))

    def compare(name, state, step):
        state, metrics = step(state, batch)
        params = jax.device_get(state.params)
        report[name] = dict(
            loss_diff=abs(float(metrics["loss"]) - report["ref_loss"]),
            tokens_equal=float(metrics["tokens"]) == float(ref_metrics["tokens"]),
            grad_norm_rel=abs(float(metrics["grad_norm"]) / float(ref_metrics["grad_norm"]) - 1),
            grads_diff=_max_diff(jax.tree.map(np.subtract, params0, params), ref_grads),
            params_diff=_max_diff(params, ref_params))
        return state

    # Pure FSDP, born sharded.
    mesh8 = shd.make_mesh({"fsdp": -1})
    state8, sh8 = create_train_state(init, tx, mesh8, seed=0)
    report["init_diff_fsdp"] = _max_diff(jax.device_get(state8.params), params0)
    total, per_device = shd.sharded_bytes(state8.params)
    report["fsdp_param_bytes"] = dict(total=total, max_per_device=per_device)
    emb = state8.params["token_embedder"]
    report["embedding_shard_shape"] = list(emb.addressable_shards[0].data.shape)
    step8 = make_train_step(loss_fn, tx, mesh8, sh8)
    state8 = compare("fsdp", state8, step8)
    state8, _ = step8(state8, batch)
    report["fsdp_num_compiled_after_2_calls"] = step8.num_compiled()
    report["fsdp_state_sharding_kept"] = state8.params["token_embedder"].sharding == sh8.params["token_embedder"]

    # Gradient accumulation alone: 4 microbatches (a lax.scan) on the single device.
    compare("single_microbatch4", jax.tree.map(jnp.copy, keep),
            make_train_step(loss_fn, tx, mesh1, sh1, num_microbatches=4))
    # Pure data parallelism runs by hand (shard_map, one flat all-reduce on CPU), alone and with 2 microbatches.
    mesh_d8 = shd.make_mesh({"data": -1})
    sh_d8 = train_state_shardings(init, tx, mesh_d8)
    step_d8 = make_train_step(loss_fn, tx, mesh_d8, sh_d8)
    hlo = step_d8.lower(jax.device_put(keep, sh_d8), batch).compile().as_text()
    report["data_all_reduce_operands"] = [shape.count("[") for shape in _ALL_REDUCE.findall(hlo)]
    report["data_other_collectives"] = _OTHER_COLLECTIVES.findall(hlo)
    compare("data", jax.device_put(jax.tree.map(jnp.copy, keep), sh_d8), step_d8)
    compare("data_microbatch2", jax.device_put(jax.tree.map(jnp.copy, keep), sh_d8),
            make_train_step(loss_fn, tx, mesh_d8, sh_d8, num_microbatches=2))
    # `_sum_over` in both forms against numpy: integers in float32 and bfloat16 leaves add up exactly.
    parts = {"w": np.arange(48, dtype=np.float32).reshape(8, 2, 3),
             "b": (np.arange(32) % 5).reshape(8, 4).astype(jnp.bfloat16), "n": np.arange(8, dtype=np.float32)}
    for flat in (True, False):
        add = jax.jit(jax.shard_map(lambda t: _sum_over(jax.tree.map(lambda x: x[0], t), "data", flat), mesh=mesh_d8,
                                    in_specs=P("data"), out_specs=P(), check_vma=False))
        summed = add(parts)
        report[f"sum_over_flat_{flat}"] = {
            k: [str(summed[k].dtype), summed[k].shape == v.shape[1:],
                float(np.max(np.abs(np.asarray(summed[k], np.float64) - v.astype(np.float64).sum(0))))]
            for k, v in parts.items()}

    # With dropout, every data shard draws its own masks: 8 copies of one row, one per shard, must lose differently.
    dropout_loss = seq2seq_loss(T5(preset("t5-tiny", num_layers=1, dropout_rate=0.1)).apply)

    def with_squares(params, rows, rng):
        loss_sum, sums = dropout_loss(params, rows, rng)
        return loss_sum, {**sums, "square_sum": jnp.square(loss_sum)}  # summed over shards: sum of squared losses

    copies = {k: np.repeat(v[:1], n, axis=0) for k, v in batch.items()}
    _, metrics = make_train_step(with_squares, tx, mesh_d8, sh_d8)(
        jax.device_put(jax.tree.map(jnp.copy, keep), sh_d8), copies)
    shard_losses_sum, shard_squares_sum = (float(metrics[k]) * float(metrics["tokens"]) for k in ("loss", "square"))
    report["data_dropout_spread"] = n * shard_squares_sum / shard_losses_sum ** 2 - 1  # 0 iff all shards agree

    # data=2, fsdp=2, tensor=2 (on 8 devices) from the same initial state, with 4 microbatches on top.
    mesh222 = shd.make_mesh((2, n // 4, 2) if n >= 4 else (1, 1, n))
    sh222 = train_state_shardings(init, tx, mesh222)
    compare("mixed_microbatch4", jax.device_put(jax.tree.map(jnp.copy, keep), sh222),
            make_train_step(loss_fn, tx, mesh222, sh222, num_microbatches=4))

    # The decoder-only LM's pair loss (prompt + target in one sequence, loss on the target): one device, pure data
    # parallelism and FSDP from the same initial state.
    from refiner_jax.models.language_model import LanguageModel
    from refiner_jax.models.decoder_config import preset as decoder_preset
    from refiner_jax.training.steps import pair_loss

    dlm = LanguageModel(decoder_preset("llama-tiny", vocab_size=384, num_layers=1))
    dmodel = dlm.module()
    dinit = lambda k: dmodel.init(k, jnp.ones((2, 22), jnp.int32))["params"]  # noqa: E731
    dbatch = dlm.pair_batch([[int(t) for t in r if t] for r in batch["inputs"]],
                            [[int(t) for t in r if t] for r in batch["targets"]], 12, 10, 1)
    dloss = pair_loss(dlm, dmodel)
    dstate1, dsh1 = create_train_state(dinit, tx, mesh1, seed=0)
    dparams0 = jax.device_get(dstate1.params)
    dstate1, dm1 = make_train_step(dloss, tx, mesh1, dsh1)(dstate1, dbatch)
    ddropped = {k: np.concatenate([v[:-shard], v[:shard]]) for k, v in dbatch.items()}
    dbad, dbad_m = make_train_step(dloss, tx, mesh1, dsh1)(create_train_state(dinit, tx, mesh1, seed=0)[0], ddropped)
    report["decoder_dropped_shard"] = dict(params_diff=_max_diff(jax.device_get(dbad.params),
                                                                 jax.device_get(dstate1.params)),
                                           loss_diff=abs(float(dbad_m["loss"]) - float(dm1["loss"])))
    for name, mesh in (("decoder_data", mesh_d8), ("decoder_fsdp", mesh8)):
        state, _ = create_train_state(dinit, tx, mesh, seed=0)
        state, m = make_train_step(dloss, tx, mesh, train_state_shardings(dinit, tx, mesh))(state, dbatch)
        report[name] = dict(params_diff=_max_diff(jax.device_get(state.params), jax.device_get(dstate1.params)),
                            moved=_max_diff(dparams0, jax.device_get(dstate1.params)),
                            loss_diff=abs(float(m["loss"]) - float(dm1["loss"])), loss=float(dm1["loss"]),
                            tokens=[float(m["tokens"]), float(dm1["tokens"]), float(dbatch["weights"].sum())])

    # Eval sums: equal to the training loss; 8 all-pad rows appended (a padded last batch) change nothing.
    eval_step = make_eval_step(loss_fn, mesh1, sh1.params)
    sums = eval_step(keep.params, batch)
    padded = {k: np.concatenate([v, np.zeros((8, v.shape[1]), v.dtype)]) for k, v in batch.items()}
    sums_padded = eval_step(keep.params, padded)
    report["eval"] = dict(loss_rel=abs(float(mean_metrics(sums)["loss"]) / report["ref_loss"] - 1),
                          padded_rel={k: abs(float(sums_padded[k]) - float(sums[k])) / max(abs(float(sums[k])), 1.0)
                                      for k in sums})
    return report


@pytest.fixture(scope="module")
def report():
    # REFINER_TEST_DEVICES=2 or 4 reruns the comparisons on fewer devices (the tolerance study, docs/testing.md).
    return run_report(__file__, int(os.environ.get("REFINER_TEST_DEVICES", 8)), timeout=600,
                      JAX_DISABLE_MOST_OPTIMIZATIONS="1")


@pytest.mark.parametrize("name", ["decoder_data", "decoder_fsdp"])
def test_sharded_decoder_step_equals_single_device_step(report, name):
    """One SGD step at lr 1: parameters differ by the gradients' rounding, NETWORK ulps of how far they moved;
    the loss, a token mean of non-negative terms, by REORDER ulps of itself. A dropped shard misses both by 10x."""
    r, bad = report[name], report["decoder_dropped_shard"]
    assert r["moved"] > 1e-3
    check_close(f"{name}: params", r["params_diff"], ulps=NETWORK, scale=r["moved"])
    check_close(f"{name}: loss", r["loss_diff"], ulps=REORDER, scale=r["loss"])
    assert r["tokens"][0] == r["tokens"][1] == r["tokens"][2] > 0  # the target tokens only
    assert bad["params_diff"] > 10 * tolerance(NETWORK, r["moved"]), bad
    assert bad["loss_diff"] > 10 * tolerance(REORDER, r["loss"]), bad


def test_born_sharded_init_equals_single_device_init(report):
    assert report["init_diff_fsdp"] == 0.0  # the same random bits on every layout: no arithmetic to round


@pytest.mark.parametrize("mesh", ["fsdp", "mixed_microbatch4", "data", "data_microbatch2", "single_microbatch4"])
def test_sharded_step_equals_single_device_step(report, mesh):
    """One SGD step at lr 1 exposes the gradient: it and the updated parameters may differ by NETWORK ulps of the
    largest gradient entry, the loss and gradient norm by REORDER ulps of themselves. 4 microbatches of 4 rows
    with different token counts on one device (`single_microbatch4`) are exact only because sums are normalised
    once. One data shard's rows dropped must miss every bound by 10x."""
    r, bad = report[mesh], report["dropped_shard"]
    assert r["tokens_equal"]
    check_close(f"train step {mesh}: loss", r["loss_diff"], ulps=REORDER, scale=report["ref_loss"])
    check_close(f"train step {mesh}: grad norm (relative)", r["grad_norm_rel"], ulps=REORDER, scale=1.0)
    check_close(f"train step {mesh}: grads", r["grads_diff"], ulps=NETWORK, scale=report["grad_scale"])
    check_close(f"train step {mesh}: params", r["params_diff"], ulps=NETWORK, scale=report["grad_scale"])
    assert bad["loss_diff"] > 10 * tolerance(REORDER, report["ref_loss"]), bad
    assert bad["grads_diff"] > 10 * tolerance(NETWORK, report["grad_scale"]), bad


def test_pure_data_parallel_step_adds_the_shards_in_one_flat_all_reduce(report):
    # Gradients of every parameter and the metric sums, in one float32 buffer; no other collective.
    assert report["data_all_reduce_operands"] == [1]
    assert report["data_other_collectives"] == []


@pytest.mark.parametrize("flat", [True, False])
def test_sum_over_data_shards_matches_numpy_and_keeps_dtypes(report, flat):
    assert report[f"sum_over_flat_{flat}"] == {"w": ["float32", True, 0.0], "b": ["bfloat16", True, 0.0],
                                               "n": ["float32", True, 0.0]}


def test_data_shards_draw_their_own_dropout_masks(report):
    assert report["data_dropout_spread"] > 1e-4


def test_fsdp_splits_parameters_over_every_device(report):
    b, n = report["fsdp_param_bytes"], report["devices"]
    # Every T5 matrix has an `embed` (d_model=128) dimension, split n ways; only tiny tables stay whole.
    assert b["max_per_device"] < (1 / n + 0.005) * b["total"], b
    assert report["embedding_shard_shape"] == [384, 128 // n]  # [vocab, d_model / n]
    assert report["fsdp_state_sharding_kept"]


def test_step_compiles_once_per_shape(report):
    assert report["fsdp_num_compiled_after_2_calls"] == 1


def test_eval_sums_match_training_loss_and_ignore_pad_rows(report):
    # The same program's sums with and without all-pad rows: only the loss's reduction order may differ.
    check_close("eval loss vs train loss (relative)", report["eval"]["loss_rel"], ulps=REORDER, scale=1.0)
    for k, rel in report["eval"]["padded_rel"].items():
        check_close(f"eval sums with pad rows: {k} (relative)", rel, ulps=REORDER, scale=1.0)


if __name__ == "__main__":
    print(json.dumps(_multi_device_report()))
