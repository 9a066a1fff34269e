"""The training state (one pytree) and its sharded, born-sharded creation.

``TrainState`` holds everything a resumed run needs besides the data position: parameters, optimizer state, the
number of batches trained on, and the base PRNG key (per-step keys are ``fold_in(rng, step)``, so the random stream
resumes exactly). It carries no functions, so it checkpoints and restores as plain data; the optimizer ``tx`` and
the model's ``apply`` are passed to the step builders instead.

With LoRA (`create_lora_train_state`) the state's params are the trainable tree of `models.lora.split` (adapters,
a reward head): the optimizer state and the checkpoints cover nothing else, and the frozen base (`FrozenBase`) is
made again from the stage's initial parameters, which a restart reads the same way.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from refiner_jax import sharding as shd
from refiner_jax.models import lora as lora_lib

InitParams = Callable[[jax.Array], Any]  # PRNG key -> params tree (leaves may be nn.LogicallyPartitioned boxes)


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: batches trained on so far (a skipped non-finite one too: `make_train_step`)
    params: Any
    opt_state: Any
    rng: jax.Array  # typed PRNG key (base of the per-step dropout keys)


def _opt_state_shardings(abstract_opt_state: Any, abstract_params: Any, params_shardings: Any,
                         mesh: Mesh) -> Any:
    """Optimizer-state leaves that mirror a parameter (same tree path suffix and shape: Adam's mu/nu, Adafactor's
    unfactored v) take that parameter's sharding; everything else (counts, Adafactor's factored row/column
    statistics, which are vectors) is replicated."""
    by_path = {path: (leaf.shape, sh) for (path, leaf), sh in
               zip(jax.tree_util.tree_flatten_with_path(abstract_params)[0], jax.tree.leaves(params_shardings))}
    rep = shd.replicated(mesh)

    def one(path, leaf):
        for k in range(len(path)):
            hit = by_path.get(path[k:])
            if hit is not None:
                return hit[1] if hit[0] == leaf.shape else rep
        return rep

    return jax.tree_util.tree_map_with_path(one, abstract_opt_state)


def _as_key(seed: int | jax.Array) -> jax.Array:
    """A typed PRNG key from an int seed, a typed key, or a legacy uint32[2] key."""
    if isinstance(seed, jax.Array) and jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
        return seed
    if isinstance(seed, (jax.Array, np.ndarray)) and seed.shape == (2,):
        return jax.random.wrap_key_data(seed)
    return jax.random.key(int(seed))


def _make_state(init_params: InitParams, tx: optax.GradientTransformation) -> Callable[[jax.Array], TrainState]:
    def make(key: jax.Array) -> TrainState:
        params_key, state_key = jax.random.split(key)
        params = nn.meta.unbox(init_params(params_key))
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=state_key)

    return make


def abstract_train_state(init_params: InitParams, tx: optax.GradientTransformation, mesh: Mesh,
                         rules: shd.Rules = shd.DEFAULT_RULES) -> tuple[TrainState, TrainState]:
    """``(abstract_state, shardings)`` without allocating anything: ShapeDtypeStructs that carry their target
    ``NamedSharding`` (the restore target for ``checkpoint.Checkpointer.restore`` on any mesh), and the matching
    ``TrainState`` of shardings: parameters from their logical names (``sharding.param_shardings``), optimizer
    state following its parameters, step and rng replicated."""
    with shd.use_mesh(mesh, rules):
        boxed = jax.eval_shape(init_params, jax.random.key(0))
    params = nn.meta.unbox(boxed)
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                          opt_state=jax.eval_shape(tx.init, params), rng=jax.eval_shape(jax.random.key, 0))
    params_sh = shd.param_shardings(boxed, mesh, rules)
    rep = shd.replicated(mesh)
    shardings = TrainState(step=rep, params=params_sh, rng=rep,
                           opt_state=_opt_state_shardings(abstract.opt_state, params, params_sh, mesh))
    return with_shardings(abstract, shardings), shardings


def train_state_shardings(init_params: InitParams, tx: optax.GradientTransformation, mesh: Mesh,
                          rules: shd.Rules = shd.DEFAULT_RULES) -> TrainState:
    """The ``TrainState`` of ``NamedSharding``s of ``abstract_train_state``."""
    return abstract_train_state(init_params, tx, mesh, rules)[1]


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """Attaches ``shardings`` (same tree) to the ShapeDtypeStructs (or arrays) of ``abstract``."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)


def create_train_state(init_params: InitParams, tx: optax.GradientTransformation, mesh: Mesh,
                       rules: shd.Rules = shd.DEFAULT_RULES, seed: int | jax.Array = 0
                       ) -> tuple[TrainState, TrainState]:
    """``(state, shardings)`` with the state born sharded: one ``jax.jit(init, out_shardings=...)`` call, so no
    device ever holds the full replicated parameters.

    ``init_params(key)`` returns the model parameters, e.g. ``lambda k: model.init(k, enc, dec)['params']`` with
    small dummy ``enc``/``dec`` token arrays. ``seed`` (int or PRNG key) is split into the parameter-init key and
    the state's base rng; the values do not depend on the mesh.
    """
    shardings = train_state_shardings(init_params, tx, mesh, rules)
    key = _as_key(seed)
    with shd.use_mesh(mesh, rules):
        state = jax.jit(_make_state(init_params, tx), out_shardings=shardings)(key)
    return state, shardings


def train_state_from_params(params: Any, init_params: InitParams, tx: optax.GradientTransformation, mesh: Mesh,
                            rules: shd.Rules = shd.DEFAULT_RULES, seed: int | jax.Array = 0
                            ) -> tuple[TrainState, TrainState]:
    """``(state, shardings)``: a fresh state (step 0, new optimizer state) around given parameters, e.g. a
    converted pretrained checkpoint or a params-only export, placed with the model's logical shardings.

    ``params`` must match the tree and shapes ``init_params`` produces; the first mismatch is reported by path. The
    state's rng is the one ``create_train_state`` would give for the same ``seed``.
    """
    abstract, shardings = abstract_train_state(init_params, tx, mesh, rules)
    want = dict(jax.tree_util.tree_flatten_with_path(abstract.params)[0])
    got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    for path in sorted(set(want) | set(got), key=jax.tree_util.keystr):
        name = jax.tree_util.keystr(path)
        if path not in got:
            raise ValueError(f"params lack {name} (expected shape {want[path].shape})")
        if path not in want:
            raise ValueError(f"params have {name}, which the model does not define")
        if tuple(np.shape(got[path])) != want[path].shape:
            raise ValueError(f"params{name} has shape {tuple(np.shape(got[path]))}, the model expects "
                             f"{want[path].shape}")
    params = jax.tree.map(lambda x, a: shd.place(x, a.sharding, a.dtype), params, abstract.params)

    def make(params: Any, key: jax.Array) -> TrainState:
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                          rng=jax.random.split(key)[1])

    with shd.use_mesh(mesh, rules):
        state = jax.jit(make, out_shardings=shardings)(params, _as_key(seed))
    return state, shardings


@dataclasses.dataclass(frozen=True)
class FrozenBase:
    """Parameters a LoRA train step reads but never updates: the model's params are
    ``lora.apply(params, state.params)``, with ``state.params`` the trainable tree (adapters, a reward head)."""

    params: Any
    shardings: Any
    lora: lora_lib.Lora

    def model_params(self, trainable: Any) -> Any:
        """The model's whole params tree for a trainable tree (adapters merged into their kernels; one program)."""
        return _merged(self.params, trainable, self.lora)


_merged = jax.jit(lora_lib.apply, static_argnums=2)


def trainable_init(init_params: InitParams, lora: lora_lib.Lora) -> InitParams:
    """``key -> trainable tree`` of ``lora.split`` for the model ``init_params`` makes from that key: fresh adapters
    (key ``fold_in(key, 1)``) with their logical axis names, and the parameters outside the language model."""
    def init(key: jax.Array) -> Any:
        return lora_lib.split(init_params(key), lora, jax.random.fold_in(key, 1))[1]

    return init


def create_lora_train_state(init_params: InitParams, lora: lora_lib.Lora, tx: optax.GradientTransformation,
                            mesh: Mesh, rules: shd.Rules = shd.DEFAULT_RULES, seed: int | jax.Array = 0,
                            params: Any = None) -> tuple[TrainState, TrainState, FrozenBase]:
    """``(state, shardings, frozen)`` for training LoRA adapters: the state holds only the trainable tree
    (`trainable_init`; the optimizer state covers nothing else) and ``frozen`` the language model's parameters,
    both born sharded. The base is ``params`` when given (a pretrained or earlier stage's model), else the model
    ``create_train_state`` would initialise for the same ``seed``."""
    init_trainable = trainable_init(init_params, lora)
    params_key = jax.random.split(_as_key(seed))[0]

    def base(key: jax.Array) -> Any:
        return lora_lib.base_of(init_params(key), lora)

    with shd.use_mesh(mesh, rules):
        boxed = jax.eval_shape(base, params_key)
    base_sh = shd.param_shardings(boxed, mesh, rules)
    if params is None:
        state, shardings = create_train_state(init_trainable, tx, mesh, rules, seed=seed)
        with shd.use_mesh(mesh, rules):
            frozen = jax.jit(lambda k: nn.meta.unbox(base(k)), out_shardings=base_sh)(params_key)
        return state, shardings, FrozenBase(frozen, base_sh, lora)
    abstract = nn.meta.unbox(boxed)
    frozen = jax.tree.map(lambda x, a, s: shd.place(x, s, a.dtype), lora_lib.base_of(params, lora), abstract, base_sh)
    trainable = lora_lib.split(params, lora, jax.random.fold_in(params_key, 1))[1]
    state, shardings = train_state_from_params(trainable, init_trainable, tx, mesh, rules, seed=seed)
    return state, shardings, FrozenBase(frozen, base_sh, lora)
