"""LoRA adapters as a transform of a model's parameter tree, for either model family.

An adapter belongs to one linear module of the model's transformers counterpart (PEFT's unit: `q_proj`, GPT-2's
fused `c_attn`, T5's `q`), named as in the transformers checkpoint, and holds ``lora_a [in, rank]`` and
``lora_b [rank, out]`` in the ``x @ W`` orientation. Its update ``(alpha / rank) * lora_a @ lora_b`` is added to
the module's kernels in our layout: a fused module's output columns are split over its kernels (GPT-2's query, key
and value share one ``lora_a``, as under PEFT). Where each kernel sits inside the module's matrix is read once from
the checkpoint name map (`hf.name_map`, `hf_decoder.name_map`) by mapping index arrays, so the adapters follow the
same layout as the checkpoint import and export.

Training with adapters differentiates a *trainable* tree only: ``{"adapters": ..., "trained": ...}``, where
``trained`` holds the parameters outside the language model (a reward model's head), trained in full. The frozen
*base* is the language model's parameters (under their key, e.g. ``{"lm": ...}``, when the model wraps one);
`apply` rebuilds the model's whole tree from both. Adapters start as PEFT's do: ``lora_a`` uniform in
``+-1/sqrt(in)`` (Kaiming-uniform with a = sqrt(5)), ``lora_b`` zero, so the adapted model starts as the base.
Adapter leaves carry logical axis names (the kernel's input axis on ``lora_a``, its output axis on ``lora_b``), so
they shard with the model under an fsdp or tensor mesh.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.t5_config import T5Config

ALL_LINEAR = "all-linear"
# Linear modules of each transformers architecture, as PEFT names them (`all-linear` takes these; the output layer
# and the embeddings are never adapted).
LINEAR_MODULES = {
    "t5": ("q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo"),
    "gpt2": ("c_attn", "c_proj", "c_fc"),
    **{kind: ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
       for kind in ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")},
}

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Rank (0: no adapters, the whole model trains), ``alpha`` (the update is scaled by alpha / rank, PEFT's
    ``lora_alpha``) and the adapted modules by their transformers names, or ``("all-linear",)``."""

    rank: int = 0
    alpha: float = 16.0
    target_modules: tuple[str, ...] = (ALL_LINEAR,)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class Part:
    """One kernel of a module: its path in the language model's params, the module's output columns
    ``[start, start + width)`` it takes, and its shape (``[in, width]`` reshaped row-major)."""

    path: Path
    start: int
    width: int
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Target:
    """One adapted module: its transformers name (``model.layers.0.self_attn.q_proj``) and kernels."""

    module: str
    in_features: int
    out_features: int
    parts: tuple[Part, ...]


@dataclasses.dataclass(frozen=True)
class Lora:
    """A `LoraConfig` bound to a model config: the resolved PEFT module names and the `Target`s."""

    config: LoraConfig
    model_type: str  # 't5' or a key of hf_decoder's architectures ('gpt2', 'llama', 'qwen2', ...)
    target_modules: tuple[str, ...]
    targets: tuple[Target, ...]

    @property
    def fan_in_fan_out(self) -> bool:
        """GPT-2's modules are Conv1D (weights stored [in, out]); PEFT records this in the adapter config."""
        return self.model_type == "gpt2"


def _family(model_config: T5Config | DecoderConfig) -> tuple[str, list]:
    """(architecture, name map rows as (transformers key, our paths, ours -> theirs)) of a model config."""
    from refiner_jax.models import hf, hf_decoder

    if isinstance(model_config, T5Config):
        return "t5", [(theirs, (ours,), to_hf) for ours, theirs, to_hf, _ in hf.name_map(model_config)]
    return (hf_decoder.model_type(model_config),
            [(theirs, ours, to_hf) for theirs, ours, to_hf, _ in hf_decoder.name_map(model_config)])


def _param_shapes(model_config: T5Config | DecoderConfig) -> dict:
    from refiner_jax.models import hf
    from refiner_jax.models.language_model import LanguageModel

    return hf.param_shapes(LanguageModel(model_config).module(), 2 if isinstance(model_config, T5Config) else 1)


def _parts(module: str, paths: tuple[Path, ...], shapes: list[tuple[int, ...]], to_hf, fan_in_fan_out: bool
           ) -> tuple[int, int, tuple[Part, ...]]:
    """(in, out, parts) of a module whose checkpoint tensor `to_hf` builds from our kernels: the kernels' flat
    indices are mapped through it and must come out as row-major [in, width] column blocks."""
    sizes = [int(np.prod(s)) for s in shapes]
    offsets = np.cumsum([0] + sizes)
    weight = to_hf(*(np.arange(n, dtype=np.int64).reshape(s) + o for n, s, o in zip(sizes, shapes, offsets)))
    if weight.ndim != 2:
        raise ValueError(f"module {module} is not a linear layer (its weight has shape {weight.shape})")
    matrix = weight if fan_in_fan_out else weight.T  # [in, out]
    n_in, n_out = matrix.shape
    parts = []
    for path, size, shape, offset in zip(paths, sizes, shapes, offsets):
        hits = np.flatnonzero(matrix[0] == offset)
        start = int(hits[0]) if hits.size and size % n_in == 0 else -1
        width = size // n_in
        block = matrix[:, start:start + width] if start >= 0 else None
        if block is None or block.shape != (n_in, width) or not np.array_equal(
                block, np.arange(size).reshape(n_in, width) + offset):
            raise ValueError(f"module {module}: parameter {'/'.join(path)} is not a column block of its weight")
        parts.append(Part(path, start, width, tuple(shape)))
    return n_in, n_out, tuple(parts)


@functools.lru_cache(maxsize=32)
def bind(model_config: T5Config | DecoderConfig, config: LoraConfig) -> Lora:
    """The adapted modules of `model_config` under `config`; raises naming a target module the model lacks."""
    kind, rows = _family(model_config)
    linear = LINEAR_MODULES[kind]
    names = tuple(config.target_modules)
    wanted = linear if names == (ALL_LINEAR,) else names
    unknown = sorted(set(wanted) - set(linear))
    if config.rank < 1 or config.alpha <= 0:
        raise ValueError(f"LoRA needs rank >= 1 and alpha > 0, got rank {config.rank}, alpha {config.alpha}")
    if unknown or not wanted:
        raise ValueError(f"target_modules {list(unknown or names)} are not linear modules of this {kind} model; use "
                         f"'{ALL_LINEAR}' or some of {list(linear)}")
    shapes = _param_shapes(model_config)
    cache: dict = {}  # every layer has the same layout: probed once per module kind and shapes
    targets = []
    for theirs, ours, to_hf in rows:
        module, _, tensor = theirs.rpartition(".")
        if tensor != "weight" or module.rpartition(".")[2] not in wanted:
            continue
        shape_list = [tuple(np.shape(_get(shapes, p))) for p in ours]
        key = (re.sub(r"\.\d+\.", ".N.", module), tuple(shape_list))
        if key not in cache:
            cache[key] = _parts(module, ours, shape_list, to_hf, kind == "gpt2")
        n_in, n_out, parts = cache[key]
        targets.append(Target(module, n_in, n_out, tuple(dataclasses.replace(p, path=q) for p, q in zip(parts, ours))))
    present = {t.module.rpartition(".")[2] for t in targets}
    if not targets:
        has = {theirs.rsplit(".", 2)[-2] for theirs, _, _ in rows if theirs.endswith(".weight")} & set(linear)
        raise ValueError(f"target_modules {list(names)} match no module of this {kind} model; it has {sorted(has)}")
    return Lora(config, kind, tuple(sorted(present)), tuple(targets))


def _get(tree: Any, path: Path) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: Path, value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _module_path(module: str) -> Path:
    return tuple(module.split("."))


def adapter_of(adapters: dict, target: Target) -> dict:
    """``{'lora_a', 'lora_b'}`` of `target` in an adapters tree."""
    return _get(adapters, _module_path(target.module))


def set_adapter(adapters: dict, target: Target, entry: dict) -> None:
    """Puts `target`'s ``{'lora_a', 'lora_b'}`` into an adapters tree."""
    _set(adapters, _module_path(target.module), entry)


def _lm_root(tree: dict, lora: Lora) -> Path:
    """Where the language model's parameters sit in `tree`: () or one key (a reward model's ``lm``)."""
    probe = lora.targets[0].parts[0].path
    if _has(tree, probe):
        return ()
    roots = [k for k, v in tree.items() if isinstance(v, dict) and _has(v, probe)]
    if len(roots) != 1:
        raise ValueError(f"no language model parameters (with {'/'.join(probe)}) found for the LoRA adapters")
    return (roots[0],)


def _has(tree: Any, path: Path) -> bool:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return True


def _names(leaf: Any) -> tuple | None:
    return tuple(leaf.names) if isinstance(leaf, nn.LogicallyPartitioned) else None


def init(params: Any, lora: Lora, rng: jax.Array) -> dict:
    """Fresh adapters ``{module parts...: {'lora_a' [in, r], 'lora_b' [r, out]}}`` (float32) for the language model
    params `params` (arrays or shapes). Boxed (``nn.LogicallyPartitioned``) params give boxed adapters, named after
    their kernel's input and output axes."""
    root = _lm_root(params, lora)
    lm = _get(params, root)
    r = lora.config.rank
    adapters: dict = {}
    for index, target in enumerate(lora.targets):
        bound = 1.0 / np.sqrt(target.in_features)
        a = jax.random.uniform(jax.random.fold_in(rng, index), (target.in_features, r), jnp.float32, -bound, bound)
        b = jnp.zeros((r, target.out_features), jnp.float32)
        first = target.parts[0]
        names = _names(_get(lm, first.path))
        if names is not None:
            in_dims = len(first.shape) - _out_dims(first.shape, first.width)
            a = nn.LogicallyPartitioned(a, (names[0], None))
            b = nn.LogicallyPartitioned(b, (None, names[in_dims]))
        set_adapter(adapters, target, {"lora_a": a, "lora_b": b})
    return adapters


def _out_dims(shape: tuple[int, ...], width: int) -> int:
    """How many trailing dims of a kernel make up its `width` output columns."""
    size = 1
    for k in range(len(shape)):
        size *= shape[len(shape) - 1 - k]
        if size == width:
            return k + 1
    raise ValueError(f"kernel shape {shape} has no trailing dims of {width} columns")


def merge(params: Any, adapters: dict, lora: Lora) -> Any:
    """`params` with every adapted kernel ``W`` replaced by ``W + (alpha / rank) * lora_a @ lora_b`` (in float32,
    cast back to W's dtype), in the kernel's own layout. `params` is the language model's tree, or a tree holding it
    under one key."""
    root = _lm_root(params, lora)
    lm = jax.tree.map(lambda x: x, _get(params, root))  # a copy of the dict structure; leaves shared
    for target in lora.targets:
        adapter = adapter_of(adapters, target)
        delta = lora.config.scale * (adapter["lora_a"].astype(jnp.float32) @ adapter["lora_b"].astype(jnp.float32))
        for part in target.parts:
            kernel = _get(lm, part.path)
            update = delta[:, part.start:part.start + part.width].reshape(part.shape)
            _set(lm, part.path, (kernel.astype(jnp.float32) + update).astype(kernel.dtype))
    if not root:
        return lm
    return {**params, root[0]: lm}


def split(params: Any, lora: Lora, rng: jax.Array) -> tuple[Any, dict]:
    """``(base, trainable)`` of a model's params: the frozen language model (under its key when the model wraps
    one) and ``{'adapters': fresh adapters, 'trained': every parameter outside the language model}`` (``trained``
    only when there are such)."""
    root = _lm_root(params, lora)
    trainable = {"adapters": init(params, lora, rng)}
    if not root:
        return params, trainable
    trainable["trained"] = {k: v for k, v in params.items() if k != root[0]}
    return {root[0]: params[root[0]]}, trainable


def apply(base: Any, trainable: dict, lora: Lora) -> Any:
    """The model's whole params tree from the frozen `base` and the `trainable` tree of `split`."""
    merged = merge(base, trainable["adapters"], lora)
    return {**merged, **trainable["trained"]} if "trained" in trainable else merged


def base_of(params: Any, lora: Lora) -> Any:
    """The frozen base of `split` alone (no adapters made)."""
    root = _lm_root(params, lora)
    return {root[0]: params[root[0]]} if root else params


def count(tree: Any) -> int:
    """Number of scalars in a tree of arrays or shapes."""
    return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(nn.meta.unbox(tree))))
