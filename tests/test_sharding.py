"""Mesh construction, logical-axis rules, the divisibility fallback and batch feeding.

Multi-device checks run this file as a script in a subprocess with 8 virtual CPU devices and assert on its JSON
report; they only trace (``eval_shape``) and place small arrays, so they need no compilation of the model.
"""
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path.insert(0, REPO)

import jax  # noqa: E402
from _devices import run_report  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P  # noqa: E402

from refiner_jax import sharding as shd  # noqa: E402


@pytest.mark.parametrize("shape,devices,want", [
    ({"fsdp": -1}, 8, (1, 8, 1)),
    ({"data": 2, "fsdp": -1, "tensor": 2}, 8, (2, 2, 2)),
    ([2, -1, 1], 8, (2, 4, 1)),
    ({"data": -1}, 1, (1, 1, 1)),
    ((1, 4, 2), 8, (1, 4, 2)),
])
def test_resolve_mesh_shape(shape, devices, want):
    assert shd.resolve_mesh_shape(shape, devices) == want


@pytest.mark.parametrize("shape,devices,message", [
    ({"data": 3, "fsdp": -1}, 8, "multiply to 3, which does not divide the 8"),
    ((2, 2, 1), 8, "multiplies to 4 but 8 devices"),
    ({"data": -1, "fsdp": -1}, 8, "at most one axis may be -1"),
    ({"model": 2}, 2, "unknown axes \\['model'\\]"),
    ((8, 1), 8, "must have 3 entries"),
    ({"fsdp": 0}, 1, "positive or -1"),
])
def test_resolve_mesh_shape_errors_are_actionable(shape, devices, message):
    with pytest.raises(ValueError, match=message):
        shd.resolve_mesh_shape(shape, devices)


@pytest.mark.parametrize("names,want", [
    # T5 parameters: embed -> fsdp (FSDP), mlp/heads/vocab -> tensor, kv and relpos buckets replicated.
    (("embed", "mlp"), P("fsdp", "tensor")),
    (("mlp", "embed"), P("tensor", "fsdp")),
    (("vocab", "embed"), P("tensor", "fsdp")),
    (("embed", "vocab"), P("fsdp", "tensor")),
    (("embed", "heads", "kv"), P("fsdp", "tensor", None)),
    (("heads", "kv", "embed"), P("tensor", None, "fsdp")),
    (("relpos_buckets", "heads"), P(None, "tensor")),
    (("embed",), P("fsdp")),
    # Activations: batch over (data, fsdp); fsdp is then taken, so nothing else may use it.
    (("batch", "activation_length", "activation_embed"), P(("data", "fsdp"), None, None)),
    (("batch", "activation_length", "activation_heads", "activation_kv"), P(("data", "fsdp"), None, "tensor", None)),
    (("batch", "activation_length", "activation_vocab"), P(("data", "fsdp"), None, "tensor")),
    (("batch", "embed"), P(("data", "fsdp"), None)),
])
def test_default_rules_map_t5_names(names, want):
    import flax.linen as nn
    assert nn.logical_to_mesh_axes(names, shd.DEFAULT_RULES) == want


@pytest.mark.parametrize("spec,shape,want", [
    (P(("data", "fsdp")), (16,), P(("data", "fsdp"))),
    (P(("data", "fsdp")), (12,), P("data")),  # 12 % 8 != 0, 12 % 2 == 0: keep the dividing prefix
    (P("fsdp", "tensor"), (6, 5), P(None, None)),  # 6 % 4, 5 % 2: replicate both
    (P("tensor", None, "fsdp"), (6, 32, 512), P("tensor", None, "fsdp")),
    (P(None, "tensor"), (32, 6), P(None, "tensor")),
    (P("fsdp"), (4, 3), P("fsdp", None)),
])
def test_fit_spec_replicates_indivisible_dims(spec, shape, want):
    mesh = AbstractMesh((2, 4, 2), shd.MESH_AXES)
    assert shd.fit_spec(spec, shape, mesh) == want


def test_normalize_rules_from_config_lists():
    rules = shd.normalize_rules([["batch", ["data", "fsdp"]], ["embed", ["fsdp"]], ["kv", None]])
    assert rules == (("batch", ("data", "fsdp")), ("embed", "fsdp"), ("kv", None))
    with pytest.raises(ValueError, match="must be a pair"):
        shd.normalize_rules([("embed",)])
    with pytest.raises(ValueError, match="'mlp' names mesh axes \\['model'\\]"):
        shd.normalize_rules([("mlp", "model")])


def test_without_mesh_axis_drops_it_from_every_rule():
    rules = [("batch", ["data", "fsdp"]), ("x", ["data", "tensor", "fsdp"]), ("y", "data"), ("embed", "fsdp")]
    assert shd.without_mesh_axis(rules, "data") == (
        ("batch", "fsdp"), ("x", ("tensor", "fsdp")), ("y", None), ("embed", "fsdp"))


def test_splitting_axes_counts_only_axes_longer_than_one():
    mesh = AbstractMesh((2, 1, 4), shd.MESH_AXES)
    tree = {"a": NamedSharding(mesh, P(None, "tensor")), "b": NamedSharding(mesh, P("fsdp")),
            "c": [NamedSharding(mesh, P(("data", "fsdp"), None))]}
    assert shd.splitting_axes(tree) == {"data", "tensor"}
    assert shd.splitting_axes({"b": tree["b"], "d": NamedSharding(mesh, P())}) == set()


def test_host_batch_slices_partition_the_global_batch(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 4)
    rows = []
    for i in range(4):
        monkeypatch.setattr(jax, "process_index", lambda i=i: i)
        sl = shd.host_batch_slice(32)
        rows.extend(range(32)[sl])
    assert rows == list(range(32))


def test_distributed_initialize_only_when_configured(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    assert not shd.maybe_initialize_distributed()
    assert not shd.maybe_initialize_distributed(num_processes=1)
    assert calls == []
    assert shd.maybe_initialize_distributed(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1)
    assert calls == [dict(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1)]


# ------------------------------------------------------------------------------------------------------------------
# 8-device checks (run in a subprocess)
# ------------------------------------------------------------------------------------------------------------------


def _state_bytes(abstract, shardings) -> dict:
    """Total bytes and bytes held by one device (every device holds one equal shard of each leaf)."""
    total = per_device = 0
    for x, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)):
        item = np.dtype(x.dtype).itemsize if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else 8
        total += int(np.prod(x.shape)) * item
        per_device += int(np.prod(s.shard_shape(x.shape))) * item
    return dict(total=total, per_device=per_device)


def _multi_device_report() -> dict:
    import jax.numpy as jnp

    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset
    from refiner_jax.training import abstract_train_state, make_optimizer

    assert jax.device_count() == 8, jax.devices()
    report = {}
    mesh = shd.make_mesh({"data": 2, "fsdp": -1, "tensor": 2})
    report["mesh"] = dict(shape=dict(mesh.shape), auto=all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types))

    tx, _ = make_optimizer({"name": "adamw"})
    for name, mesh_shape in [("t5-small", {"fsdp": 8}), ("flan-t5-small", {"data": 1, "fsdp": 2, "tensor": 4})]:
        model = T5(preset(name))
        init = lambda k, model=model: model.init(k, jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))[
            "params"]
        m = shd.make_mesh(mesh_shape)
        abstract, shardings = abstract_train_state(init, tx, m)
        specs = jax.tree.map(lambda s: tuple(str(a) for a in s.spec), shardings.params)
        layer = specs["encoder"]["layers_0"]
        report[name] = dict(params=_state_bytes(abstract.params, shardings.params),
                            state=_state_bytes(abstract, shardings),
                            query=layer["attention"]["query"], wi=layer["mlp"].get("wi", layer["mlp"].get("wi_0")),
                            mu_embedder=tuple(str(a) for a in shardings.opt_state[1][0].mu["token_embedder"].spec))

    # Batches: assembled from process-local rows, split over data x fsdp = 4 ways on the (2, 2, 2) mesh.
    local = {"inputs": np.arange(8 * 5, dtype=np.int32).reshape(8, 5)}
    batch = shd.make_global_batch(local, mesh)
    report["batch"] = dict(spec=str(batch["inputs"].sharding.spec),
                           shard_shape=list(batch["inputs"].addressable_shards[0].data.shape),
                           equal=bool(np.array_equal(np.asarray(batch["inputs"]), local["inputs"])))
    try:
        shd.make_global_batch({"inputs": np.zeros((6, 5), np.int32)}, mesh)
        report["bad_batch_error"] = None
    except ValueError as e:
        report["bad_batch_error"] = str(e)
    return report


@pytest.fixture(scope="module")
def report():
    return run_report(__file__, 8)


def test_mesh_is_auto_typed_with_filled_axis(report):
    assert report["mesh"] == dict(shape={"data": 2, "fsdp": 2, "tensor": 2}, auto=True)


def test_fsdp8_shards_params_and_adam_state_eightfold(report):
    r = report["t5-small"]
    # t5-small: every matrix and norm scale has a d_model=512 dimension split 8 ways; only the relative-position
    # tables (32 x 8 per stack) and the optimizer step counts stay whole.
    assert r["params"]["per_device"] < 0.126 * r["params"]["total"], r
    assert r["state"]["per_device"] < 0.126 * r["state"]["total"], r
    assert r["query"] == ["fsdp", "tensor", "None"] and r["mu_embedder"] == ["tensor", "fsdp"]


def test_indivisible_heads_fall_back_to_replication(report):
    # flan-t5-small has 6 heads: not divisible by tensor=4, so the heads dim of q/k/v/o is replicated, while
    # mlp (d_ff=1024) is still split 4 ways.
    r = report["flan-t5-small"]
    assert r["query"] == ["fsdp", "None", "None"]
    assert r["wi"] == ["fsdp", "tensor"]


def test_global_batch_from_process_local_rows(report):
    assert report["batch"] == dict(spec=str(P(("data", "fsdp"))), shard_shape=[2, 5], equal=True)
    assert "multiple of 4" in report["bad_batch_error"]


if __name__ == "__main__":
    print(json.dumps(_multi_device_report()))
