"""Device mesh, logical-axis rules and shardings: the one place that maps logical axis names to mesh axes.

Models name the axes of their parameters (``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``, ``relpos_buckets``) and
activations (``batch``, ``activation_length``, ``activation_heads``, ...) with logical names and never mention
devices. This module turns those names into ``NamedSharding``s on a 3-axis mesh ``('data', 'fsdp', 'tensor')``:

* ``data``   - pure data parallelism: batch split, parameters replicated.
* ``fsdp``   - fully sharded data parallelism: batch split AND parameters/optimizer state split along ``embed``.
* ``tensor`` - tensor (model) parallelism over ``mlp``/``heads``/``vocab``.

The mesh uses ``AxisType.Auto``: Flax Linen logical partitioning emits sharding constraints, which act as hard
asserts on an Explicit mesh.

Typical use::

    mesh = make_mesh({'data': 1, 'fsdp': -1, 'tensor': 1})
    rules = DEFAULT_RULES
    abstract = jax.eval_shape(model.init, rng, enc, dec)            # boxed with nn.LogicallyPartitioned
    shardings = param_shardings(abstract['params'], mesh, rules)    # NamedSharding per leaf
    with use_mesh(mesh, rules):
        ...  # jit-traced code that calls model.apply
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")

# Logical axis -> mesh axes, in priority order (flax semantics: an earlier rule wins, and a mesh axis is used at
# most once per array). Parameters use the bare names (`embed`, `mlp`, ...); activations use `batch` and
# `activation_*` names so the two can be laid out differently: parameters are split along `embed` over fsdp
# (FSDP), activations along `batch` over (data, fsdp) with `activation_embed` replicated. Names not listed are
# replicated.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("joined_kv", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("relpos_buckets", None),
    ("length", None),
    ("activation_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    ("activation_embed", None),
    ("activation_kv", None),
    ("activation_length", None),
)

Rules = Sequence[tuple[str, Any]]


# ----------------------------------------------------------------------------------------------------------------
# Mesh
# ----------------------------------------------------------------------------------------------------------------


def resolve_mesh_shape(shape: Mapping[str, int] | Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Returns the mesh sizes for ``MESH_AXES``, filling in at most one ``-1`` so the product is ``num_devices``.

    ``shape`` is a mapping ``{'data': 1, 'fsdp': -1, 'tensor': 1}`` (missing axes default to 1) or a sequence in
    ``MESH_AXES`` order.
    """
    if isinstance(shape, Mapping):
        unknown = set(shape) - set(MESH_AXES)
        if unknown:
            raise ValueError(f"mesh config has unknown axes {sorted(unknown)}; valid axes are {MESH_AXES}")
        sizes = [int(shape.get(name, 1)) for name in MESH_AXES]
    else:
        sizes = [int(s) for s in shape]
        if len(sizes) != len(MESH_AXES):
            raise ValueError(f"mesh shape {tuple(sizes)} must have {len(MESH_AXES)} entries, one per {MESH_AXES}")
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh shape {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1 (fill in)")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh shape {dict(zip(MESH_AXES, sizes))}: sizes must be positive or -1")
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % fixed:
            raise ValueError(
                f"mesh shape {dict(zip(MESH_AXES, sizes))}: the fixed axes multiply to {fixed}, which does not "
                f"divide the {num_devices} available devices; change the fixed sizes")
        sizes[sizes.index(-1)] = num_devices // fixed
    elif fixed != num_devices:
        raise ValueError(
            f"mesh shape {dict(zip(MESH_AXES, sizes))} multiplies to {fixed} but {num_devices} devices are "
            f"available; make the product equal the device count or set one axis to -1")
    return tuple(sizes)


def make_mesh(shape: Mapping[str, int] | Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds an Auto-typed ``('data', 'fsdp', 'tensor')`` mesh over ``devices`` (default: all devices).

    ``jax.make_mesh`` orders devices for the physical interconnect (TPU/GPU topologies); ``tensor`` is the
    fastest-varying axis so tensor-parallel groups sit on neighbouring devices.
    """
    devices = list(jax.devices()) if devices is None else list(devices)
    sizes = resolve_mesh_shape(shape, len(devices))
    return jax.make_mesh(sizes, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def normalize_rules(rules: Rules) -> tuple[tuple[str, Any], ...]:
    """Turns rules from a config (lists, ConfigDict tuples) into the hashable tuple form flax expects."""
    out = []
    for entry in rules:
        if len(entry) != 2:
            raise ValueError(f"logical axis rule {entry!r} must be a pair (logical_name, mesh_axes)")
        name, axes = entry
        if isinstance(axes, (list, tuple)):
            axes = tuple(axes) if len(axes) != 1 else axes[0]
        unknown = set(_axis_names(axes))
        if unknown - set(MESH_AXES):
            raise ValueError(f"logical axis rule for {name!r} names mesh axes {sorted(unknown - set(MESH_AXES))}; "
                             f"the mesh axes are {MESH_AXES}")
        out.append((str(name), axes))
    return tuple(out)


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[None]:
    """Context under which Linen logical constraints resolve to ``mesh`` with ``rules`` (needed while tracing)."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(normalize_rules(rules)):
        yield


# ----------------------------------------------------------------------------------------------------------------
# Parameter shardings
# ----------------------------------------------------------------------------------------------------------------


def _axis_names(entry: Any) -> tuple[str, ...]:
    """A rule's or a PartitionSpec's entry (None, one mesh axis, or a tuple of them) as a tuple of mesh axes."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _axis_entry(names: tuple[str, ...]) -> Any:
    """The inverse of `_axis_names`: None, the one mesh axis, or the tuple."""
    return None if not names else names[0] if len(names) == 1 else names


def _axes_size(mesh: Mesh, axes: Any) -> int:
    return math.prod(mesh.shape[n] for n in _axis_names(axes))


def fit_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
    """Makes ``spec`` legal for an array of ``shape``: each dimension keeps the longest prefix of its mesh axes
    whose size product divides it (so a dimension that no mesh axis divides is replicated).

    Rule for indivisible parameters (e.g. 6 heads on tensor=4): fall back to replication of that dimension rather
    than fail; jit in/out shardings require even division. Activation constraints inside the model may still
    shard such dimensions unevenly, which XLA pads.
    """
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = _axis_names(axes)
        while names and dim % _axes_size(mesh, names):
            names = names[:-1]
        fitted.append(_axis_entry(names))
    return P(*fitted)


def logical_to_sharding(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                        rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """The sharding of one array whose dimensions carry logical ``names`` (with the divisibility fallback)."""
    spec = nn.logical_to_mesh_axes(tuple(names), normalize_rules(rules))
    fitted = fit_spec(spec, shape, mesh)
    if fitted != spec:
        logging.info("replicating indivisible dims: logical %s shape %s: %s -> %s", names, tuple(shape), spec, fitted)
    return NamedSharding(mesh, fitted)


def param_shardings(abstract_boxed: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """NamedShardings for a tree of ``nn.LogicallyPartitioned``-boxed leaves (e.g. ``jax.eval_shape(model.init,
    ...)['params']``). The result has the UNBOXED tree structure; unboxed leaves are replicated."""
    def one(leaf):
        if isinstance(leaf, nn.LogicallyPartitioned):
            return logical_to_sharding(leaf.names, leaf.value.shape, mesh, rules)
        return NamedSharding(mesh, P())

    return jax.tree.map(one, abstract_boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def place(x: Any, sharding: NamedSharding, dtype: Any = None) -> jax.Array:
    """`x` (a host value, a single-device array or a global one) as a global array with `sharding` (and `dtype`).
    Each process passes the same value and fills only its own devices' shards from it, so this also works where the
    sharding spans other hosts' devices; an array already split over the processes is returned as it is."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return x
    if jax.process_count() == 1:
        return jax.device_put(x if dtype is None else np.asarray(x, dtype), sharding)
    value = np.asarray(x, dtype)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def without_mesh_axis(rules: Rules, axis: str) -> tuple[tuple[str, Any], ...]:
    """``rules`` with mesh axis ``axis`` dropped from every entry: the rules inside a ``shard_map`` that is manual
    over ``axis``, whose arrays are already split along it."""
    return tuple((name, _axis_entry(tuple(n for n in _axis_names(axes) if n != axis)))
                 for name, axes in normalize_rules(rules))


def splitting_axes(shardings: Any) -> set[str]:
    """The mesh axes (of size > 1) along which some ``NamedSharding`` in the tree ``shardings`` splits its array."""
    return {n for s in jax.tree.leaves(shardings) for entry in s.spec for n in _axis_names(entry)
            if s.mesh.shape[n] > 1}


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated sharding on ``mesh`` (scalars, RNG keys, step counters)."""
    return NamedSharding(mesh, P())


def sharded_bytes(tree: Any) -> tuple[int, int]:
    """(total bytes, largest bytes held by one device) over the arrays in ``tree``: measures FSDP memory savings."""
    total, per_device = 0, {}
    for x in jax.tree.leaves(tree):
        total += x.size * x.dtype.itemsize
        for shard in x.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.size * x.dtype.itemsize
    return total, max(per_device.values(), default=0)


# ----------------------------------------------------------------------------------------------------------------
# Batches (data parallel feeding, multi-host)
# ----------------------------------------------------------------------------------------------------------------


def batch_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """Sharding of a batch array ``[batch, ...]``: the leading dim follows the ``batch`` rule, the rest replicated."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch",), normalize_rules(rules)))


def batch_divisor(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> int:
    """How many ways the batch dimension is split; global batch sizes must be multiples of this."""
    return _axes_size(mesh, batch_sharding(mesh, rules).spec[0])


def check_batch_size(global_batch_size: int, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> None:
    """Raises a ValueError naming the fix when ``global_batch_size`` cannot be split over the mesh and hosts."""
    div = batch_divisor(mesh, rules)
    if global_batch_size % div:
        raise ValueError(
            f"global batch size {global_batch_size} is not divisible by the {div} batch shards of mesh "
            f"{dict(mesh.shape)}; use a multiple of {div} (or change the mesh's data/fsdp sizes)")
    if global_batch_size % jax.process_count():
        raise ValueError(
            f"global batch size {global_batch_size} is not divisible by the {jax.process_count()} processes")


def host_batch_slice(global_batch_size: int) -> slice:
    """Rows of a global batch that this process loads: process ``i`` of ``n`` reads the ``i``-th contiguous
    ``global_batch_size // n`` rows and passes them to ``make_global_batch``. Where they land in the global array
    follows the device placement; losses are sums over rows, so that order does not change a step."""
    per_host = global_batch_size // jax.process_count()
    start = jax.process_index() * per_host
    return slice(start, start + per_host)


def make_global_batch(local_batch: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """Assembles per-process numpy arrays ``[global_batch // num_processes, ...]`` into global ``jax.Array``s
    sharded along the batch dimension (works unchanged on one host, where local == global)."""
    sharding = batch_sharding(mesh, rules)

    def one(x):
        x = np.asarray(x)
        global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
        check_batch_size(global_shape[0], mesh, rules)
        return jax.make_array_from_process_local_data(sharding, x, global_shape)

    return jax.tree.map(one, local_batch)


def is_main_process() -> bool:
    """Whether this process writes the run's shared files (process 0; always True on one process)."""
    return jax.process_index() == 0


def sync_processes(name: str) -> None:
    """Waits until every process gets here (a no-op on one process), e.g. before reading a file process 0 wrote."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def all_processes_ok(ok: bool) -> bool:
    """Whether `ok` holds on every process: a collective every process calls at the same point, so that a failure
    seen by one process (a refused lock, an unreadable file) stops or redirects all of them alike instead of
    leaving the others waiting at the next collective. `ok` itself on one process."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok, np.int32))))


def maybe_initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                                 process_id: int | None = None, enabled: bool = False) -> bool:
    """Calls ``jax.distributed.initialize`` for multi-process runs; a no-op for single-process ones.

    Runs it when ``enabled`` is True (cluster auto-detection: SLURM, Open MPI, TPU pods, Kubernetes) or when
    ``num_processes > 1`` (explicit coordinator). Must be called before any other JAX call. Returns whether it ran.
    """
    if not enabled and not (num_processes and num_processes > 1):
        return False
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)
    logging.info("distributed JAX: process %d of %d, %d local / %d global devices", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())
    return True
