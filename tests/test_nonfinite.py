"""Non-finite guard: a NaN batch changes no parameter or optimizer value, is counted, and the next clean step is
the step a run that never saw it would take (one device, pure data parallelism and FSDP, with microbatches); a
stage whose updates keep being skipped stops with an error naming its last checkpoint, which holds finite values.

The sharded checks run this file as a script with 2 virtual CPU devices (XLA_FLAGS must be set before JAX starts).
"""
import json
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _devices import run_report  # noqa: E402
from _helpers import TINY_INPUT_LEN as INPUT_LEN, TINY_TARGET_LEN as TARGET_LEN, TINY_VOCAB as VOCAB  # noqa: E402
from _helpers import t5_batch, tiny_t5_config, train_tiny_stage  # noqa: E402

from refiner_jax import sharding as shd  # noqa: E402
from refiner_jax.training import create_train_state, make_optimizer, make_train_step, seq2seq_loss  # noqa: E402

ROWS = 8


def _host(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Bit for bit (NaN == NaN would not matter: the values compared here are finite)."""
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b))


def _guard_report() -> dict:
    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset

    model = T5(preset("t5-tiny", num_layers=1, vocab_size=VOCAB, dropout_rate=0.0))
    init = lambda k: model.init(k, jnp.ones((1, INPUT_LEN), jnp.int32),  # noqa: E731
                                jnp.ones((1, TARGET_LEN), jnp.int32))["params"]
    # Warm-up makes the learning rate depend on the optimizer's count: a skip that advanced it would change the
    # next update.
    tx, schedule = make_optimizer(dict(name="adamw", learning_rate=1e-2, schedule="warmup_linear", warmup_steps=3,
                                       total_steps=10, weight_decay=0.01, grad_clip_norm=1.0))
    loss = seq2seq_loss(model.apply)
    clean, poisoned = t5_batch(1), t5_batch(2, nan_row=0)  # row 0: one microbatch, one data shard
    n = jax.device_count()
    layouts = {"one_device": ((1, 1, 1), 1)}
    if n >= 2:
        layouts.update(data_microbatch2=((n, 1, 1), 2), fsdp_microbatch2=((1, n, 1), 2))
    report = {}
    for name, (shape, micro) in layouts.items():
        mesh = shd.make_mesh(shape, devices=jax.devices()[:int(np.prod(shape))])
        state, shardings = create_train_state(init, tx, mesh, seed=0)
        step = make_train_step(loss, tx, mesh, shardings, num_microbatches=micro, schedule=schedule)
        before = _host((state.params, state.opt_state))
        state, bad = step(state, poisoned)
        skipped = _host((state.params, state.opt_state))
        state, good = step(state, clean)
        # The reference: a fresh state's first step on the clean batch alone.
        ref_state, ref = step(create_train_state(init, tx, mesh, seed=0)[0], clean)
        after, want = _host((state.params, state.opt_state)), _host((ref_state.params, ref_state.opt_state))
        report[name] = dict(
            bad_loss_finite=bool(np.isfinite(float(bad["loss"]))), bad_skips=float(bad["nonfinite_skips"]),
            unchanged=_same(skipped, before), step_after_skip=int(state.step) - 1,
            good_skips=float(good["nonfinite_skips"]), ref_skips=float(ref["nonfinite_skips"]),
            same_as_reference=_same(after, want), loss_as_reference=float(good["loss"]) == float(ref["loss"]),
            moved=max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                      for a, b in zip(after, before) if a.dtype.kind == "f"),
            num_compiled=step.num_compiled())
    return report


@pytest.fixture(scope="module")
def report():
    return run_report(__file__, 2, timeout=600, JAX_DISABLE_MOST_OPTIMIZATIONS="1")


@pytest.mark.parametrize("layout", ["one_device", "data_microbatch2", "fsdp_microbatch2"])
def test_a_nan_batch_is_skipped_and_the_next_step_is_the_clean_one(report, layout):
    r = report[layout]
    assert not r["bad_loss_finite"] and r["bad_skips"] == 1.0  # the injected NaN reached the loss, and counted
    assert r["unchanged"]  # parameters and optimizer state (Adam's moments and count) bit for bit
    assert r["step_after_skip"] == 1  # the step counts the skipped batch
    assert r["good_skips"] == r["ref_skips"] == 0.0
    # The same compiled program on identical parameters and optimizer state: the same update, bit for bit.
    assert r["same_as_reference"] and r["loss_as_reference"]
    assert r["moved"] > 1e-4  # the clean step did update
    assert r["num_compiled"] == 1


# ------------------------------------------------------------------------------------------------------------------
# A stage that keeps meeting non-finite batches
# ------------------------------------------------------------------------------------------------------------------


def test_a_stage_stops_after_consecutive_skips_and_saves_only_finite_values(tmp_path):
    import ml_collections

    from refiner_jax.checkpoint import Checkpointer
    from refiner_jax.models.language_model import LanguageModel
    from refiner_jax.training import abstract_train_state
    from refiner_jax.training.loop import StageSpec
    from refiner_jax.training.nonfinite import NonFiniteError

    bad_from = 4  # the batches of updates 5, 6, 7, 8 are poisoned
    stage = ml_collections.ConfigDict(dict(steps=8, batch_size=ROWS, microbatches=1, eval_every=4,
                                           optimizer=dict(name="adamw", learning_rate=1e-2, schedule="constant")))

    def make_pairs(params, indices, step):
        return [step] * len(indices)

    def collate(steps):
        return t5_batch(steps[0], nan_row=3 if steps[0] >= bad_from else None)

    spec = StageSpec("nan_stage", stage, 32, make_pairs, lambda params: {"score": 0.0}, "score", INPUT_LEN,
                     TARGET_LEN, collate=collate)
    with pytest.raises(NonFiniteError) as err:
        train_tiny_stage(str(tmp_path), spec, checkpoint_every=2, keep=5, log_every=2, max_nonfinite_skips=3)
    ckpt_dir = os.path.join(str(tmp_path), "nan_stage", "ckpt")
    message = str(err.value)
    # Checked at step 6 (2 in a row: under the limit, saved) and step 8 (4 in a row: stopped before saving).
    assert "[nan_stage] stopped at step 8" in message and "last 4 updates were skipped" in message
    assert f"last good checkpoint is step 6 in {ckpt_dir}" in message and "config.max_nonfinite_skips is 3" in message
    logged = [json.loads(line) for line in open(tmp_path / "metrics.jsonl") if "nonfinite_skips" in line]
    assert [(m["step"], m["nonfinite_skips"]) for m in logged] == [(2, 0.0), (4, 0.0), (6, 2.0)]

    lm = LanguageModel(tiny_t5_config())
    module = lm.module()
    tx, _ = make_optimizer(dict(stage.optimizer, total_steps=8))
    target, _ = abstract_train_state(lambda k: module.init(k, *lm.init_args())["params"], tx, shd.make_mesh((1, 1, 1)))
    with Checkpointer(ckpt_dir) as ck:
        assert ck.all_steps() == [2, 4, 6]
        at4, _ = ck.restore(target, step=4)
        at6, _ = ck.restore(target, step=6)
    leaves6 = _host((at6.params, at6.opt_state))
    assert all(np.isfinite(x).all() for x in leaves6 if x.dtype.kind == "f")
    assert _same(leaves6, _host((at4.params, at4.opt_state)))  # updates 5 and 6 were skipped
    assert int(at6.step) == 6


if __name__ == "__main__":
    print(json.dumps(_guard_report()))
