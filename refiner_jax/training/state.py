"""The training state (one pytree) and its sharded, born-sharded creation.

``TrainState`` holds everything a resumed run needs besides the data position: parameters, optimizer state, the
number of updates applied, and the base PRNG key (per-step keys are ``fold_in(rng, step)``, so the random stream
resumes exactly). It carries no functions, so it checkpoints and restores as plain data; the optimizer ``tx`` and
the model's ``apply`` are passed to the step builders instead.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from refiner_jax import sharding as shd

InitParams = Callable[[jax.Array], Any]  # PRNG key -> params tree (leaves may be nn.LogicallyPartitioned boxes)


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer updates applied so far
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


def _make_state(init_params: InitParams, tx: optax.GradientTransformation) -> Callable[[jax.Array], TrainState]:
    def make(key: jax.Array) -> TrainState:
        params_key, state_key = jax.random.split(key)
        params = nn.meta.unbox(init_params(params_key))
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=state_key)

    return make


def train_state_shardings(init_params: InitParams, tx: optax.GradientTransformation, mesh: Mesh,
                          rules: shd.Rules = shd.DEFAULT_RULES) -> TrainState:
    """A ``TrainState`` of ``NamedSharding``s: parameters from their logical names (``sharding.param_shardings``),
    optimizer state following its parameters, step and rng replicated. Nothing is allocated."""
    key = jax.random.key(0)
    with shd.use_mesh(mesh, rules):
        boxed = jax.eval_shape(init_params, key)
        abstract = jax.eval_shape(_make_state(init_params, tx), key)
    params_sh = shd.param_shardings(boxed, mesh, rules)
    rep = shd.replicated(mesh)
    return TrainState(step=rep, params=params_sh,
                      opt_state=_opt_state_shardings(abstract.opt_state, abstract.params, params_sh, mesh), rng=rep)


def abstract_train_state(init_params: InitParams, tx: optax.GradientTransformation, mesh: Mesh,
                         rules: shd.Rules = shd.DEFAULT_RULES) -> tuple[TrainState, TrainState]:
    """``(abstract_state, shardings)``: ShapeDtypeStructs carrying the target shardings, the restore target for
    ``checkpoint.Checkpointer.restore`` on any mesh."""
    shardings = train_state_shardings(init_params, tx, mesh, rules)
    with shd.use_mesh(mesh, rules):
        abstract = jax.eval_shape(_make_state(init_params, tx), jax.random.key(0))
    return with_shardings(abstract, shardings), shardings


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
    key = jax.random.key(seed) if isinstance(seed, int) else seed
    with shd.use_mesh(mesh, rules):
        state = jax.jit(_make_state(init_params, tx), out_shardings=shardings)(key)
    return state, shardings
