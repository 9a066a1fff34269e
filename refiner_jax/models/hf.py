"""Import and export of transformers T5 checkpoints (`T5ForConditionalGeneration` directories).

`load_t5(name_or_dir)` reads `config.json` plus `model.safetensors` (single or sharded) or `pytorch_model.bin`
(the latter needs torch) into `(T5Config, params)`; a preset or hub name is fetched only when the machine is
online. `save_t5(config, params, dir)` writes a directory that `T5ForConditionalGeneration.from_pretrained` loads.
The name map is explicit (one row per tensor) and every mismatch names the parameter. The checkpoint-directory
helpers (`resolve_checkpoint`, `read_config`, `read_state_dict`, `write_checkpoint`, the params-tree checks) serve
`models.hf_decoder` too.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
from typing import Callable, Iterator

import jax.numpy as jnp
import numpy as np

from refiner_jax.models.t5_config import HUB_NAMES, T5Config

# transformers config fields that map one to one onto T5Config.
_CONFIG_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
                  "relative_attention_num_buckets", "relative_attention_max_distance", "dropout_rate",
                  "layer_norm_epsilon", "initializer_factor", "feed_forward_proj", "tie_word_embeddings")
# Keys the reference writes as aliases of `shared.weight`.
_TIED_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
# Stored by checkpoints saved before transformers 4.0 (the released t5-small/large, UnifiedQA) but never used:
# cross-attention has no position bias. transformers ignores it on load too.
_UNUSED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)

Path = tuple[str, ...]
Row = tuple[Path, str, Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]


def config_from_hf(hf: dict) -> T5Config:
    """T5Config from a transformers `config.json` dict (v1.0 and v1.1 spellings of the FFN accepted)."""
    fields = {k: hf[k] for k in _CONFIG_FIELDS if k in hf}
    proj = fields.get("feed_forward_proj", "relu")
    if proj in ("gated-gelu", "gated-gelu_new"):
        fields["feed_forward_proj"] = "gated-gelu"
    elif proj != "relu":
        raise ValueError(f"unsupported feed_forward_proj {proj!r} in config.json; refiner_jax's T5 supports "
                         "'relu' (T5 v1.0) and 'gated-gelu' (v1.1 / Flan-T5)")
    # Our `tie_word_embeddings` means "v1.0 output layer": the embedding as output projection plus the
    # d_model**-0.5 rescale. transformers 5 records the rescale as `scale_decoder_outputs` (and ties the weights of
    # every T5); earlier versions wrote `tie_word_embeddings: false` for v1.1.
    if "scale_decoder_outputs" in hf:
        fields["tie_word_embeddings"] = bool(hf["scale_decoder_outputs"])
    else:
        fields["tie_word_embeddings"] = hf.get("tie_word_embeddings", True) is not False
    return T5Config(**fields)


def config_to_hf(config: T5Config) -> dict:
    """A transformers `config.json` dict for `config`."""
    hf = {k: getattr(config, k) for k in _CONFIG_FIELDS}
    hf["num_decoder_layers"] = config.n_decoder_layers
    hf["dense_act_fn"] = "gelu_new" if config.feed_forward_proj == "gated-gelu" else "relu"
    hf["is_gated_act"] = config.feed_forward_proj == "gated-gelu"
    hf["scale_decoder_outputs"] = config.tie_word_embeddings
    hf.update(architectures=["T5ForConditionalGeneration"], model_type="t5", is_encoder_decoder=True,
              pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, use_cache=True)
    return hf


def _attention_rows(ours: Path, theirs: str, config: T5Config) -> Iterator[Row]:
    d, h, k = config.d_model, config.num_heads, config.d_kv
    for name, hf_name in (("query", "q"), ("key", "k"), ("value", "v")):
        # ours [d_model, heads, d_kv]  <->  theirs [heads*d_kv, d_model]
        yield (ours + (name,), f"{theirs}.{hf_name}.weight",
               lambda x: x.reshape(d, h * k).T, lambda w: w.T.reshape(d, h, k))
    # ours [heads, d_kv, d_model]  <->  theirs [d_model, heads*d_kv]
    yield ours + ("out",), f"{theirs}.o.weight", lambda x: x.reshape(h * k, d).T, lambda w: w.T.reshape(h, k, d)


def _mlp_rows(ours: Path, theirs: str, config: T5Config) -> Iterator[Row]:
    names = ("wi_0", "wi_1", "wo") if config.feed_forward_proj == "gated-gelu" else ("wi", "wo")
    for name in names:
        yield ours + (name,), f"{theirs}.DenseReluDense.{name}.weight", np.transpose, np.transpose


def _same(x: np.ndarray) -> np.ndarray:
    return x


def name_map(config: T5Config) -> list[Row]:
    """Every parameter as (our path, transformers key, ours->theirs, theirs->ours)."""
    rows: list[Row] = [(("token_embedder",), "shared.weight", _same, _same)]
    for stack, n_layers in (("encoder", config.num_layers), ("decoder", config.n_decoder_layers)):
        rows.append(((stack, "relpos_bias", "rel_embedding"),
                     f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", _same, _same))
        for i in range(n_layers):
            ours, theirs = (stack, f"layers_{i}"), f"{stack}.block.{i}.layer"
            if stack == "encoder":
                blocks = (("pre_attention_layer_norm", "attention", "0", "SelfAttention"),)
                mlp_index = "1"
            else:
                blocks = (("pre_self_attention_layer_norm", "self_attention", "0", "SelfAttention"),
                          ("pre_cross_attention_layer_norm", "encoder_decoder_attention", "1", "EncDecAttention"))
                mlp_index = "2"
            for norm, attn, idx, hf_attn in blocks:
                rows.append((ours + (norm, "scale"), f"{theirs}.{idx}.layer_norm.weight", _same, _same))
                rows.extend(_attention_rows(ours + (attn,), f"{theirs}.{idx}.{hf_attn}", config))
            rows.append((ours + ("pre_mlp_layer_norm", "scale"), f"{theirs}.{mlp_index}.layer_norm.weight",
                         _same, _same))
            rows.extend(_mlp_rows(ours + ("mlp",), f"{theirs}.{mlp_index}", config))
        norm = "encoder_norm" if stack == "encoder" else "decoder_norm"
        rows.append(((stack, norm, "scale"), f"{stack}.final_layer_norm.weight", _same, _same))
    if not config.tie_word_embeddings:
        rows.append((("decoder", "logits_dense", "kernel"), "lm_head.weight", np.transpose, np.transpose))
    return rows


def get_param(tree: dict, path: Path):
    """The leaf of a nested params dict at `path`; a KeyError naming the path when it is missing."""
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            raise KeyError(f"parameter {'/'.join(path)} is missing from the params tree")
        tree = tree[key]
    return tree


def set_param(tree: dict, path: Path, value) -> None:
    """Puts `value` at `path` of a nested params dict, making the dicts on the way."""
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def param_shapes(module, num_inputs: int) -> dict:
    """`module`'s unboxed params tree of shapes, from an abstract init on `num_inputs` `[1, 1]` token arrays (no
    arrays are allocated)."""
    import jax
    from flax.linen import meta

    tokens = jax.ShapeDtypeStruct((1, 1), np.int32)
    return meta.unbox(jax.eval_shape(lambda t: module.init(jax.random.key(0), *[t] * num_inputs), tokens)["params"])


def check_known(state: dict, known: set[str], config_name: str, fields: str) -> None:
    """Raises naming the tensors of `state` that are not `known`, and the config.json `fields` to check."""
    unexpected = sorted(set(state) - known)
    if unexpected:
        raise ValueError(f"checkpoint has tensors that this {config_name} does not use: {unexpected[:8]}"
                         f"{' ...' if len(unexpected) > 8 else ''}; check {fields} in config.json")


def set_checked(params: dict, path: Path, value: np.ndarray, shapes: dict, tensor: str, tensor_shape: tuple,
                dtype) -> None:
    """`set_param` of `value` (mapped from checkpoint tensor `tensor` of `tensor_shape`) as `dtype`; raises naming
    both when its shape is not that of `path` in the `shapes` tree."""
    expected = tuple(get_param(shapes, path).shape)
    if value.shape != expected:
        raise ValueError(f"tensor {tensor!r} has shape {tensor_shape}, which maps to {value.shape} but parameter "
                         f"{'/'.join(path)} needs {expected}")
    set_param(params, path, value.astype(dtype))


@functools.lru_cache(maxsize=16)
def _expected_shapes(config: T5Config) -> dict:
    from refiner_jax.models.t5 import T5

    return param_shapes(T5(config), 2)


def params_from_state_dict(config: T5Config, state: dict[str, np.ndarray]) -> dict:
    """Our params tree from a transformers state dict (numpy arrays); raises naming any missing, unexpected or
    mis-shaped tensor."""
    if not config.tie_word_embeddings and "lm_head.weight" not in state:
        state = dict(state, **{"lm_head.weight": state["shared.weight"]})  # v1.1 saved with tied weights
    rows = name_map(config)
    known = {theirs for _, theirs, _, _ in rows} | set(_TIED_ALIASES) | set(_UNUSED)
    if config.tie_word_embeddings:
        known.add("lm_head.weight")  # a tied checkpoint may still store it
    check_known(state, known, "T5Config", "num_layers / feed_forward_proj / tie_word_embeddings")
    params: dict = {}
    dtype = jnp.dtype(config.param_dtype)  # numpy-compatible, bfloat16 included
    shapes = _expected_shapes(config)
    for ours, theirs, _, from_hf in rows:
        if theirs not in state:
            raise ValueError(f"checkpoint is missing tensor {theirs!r} (parameter {'/'.join(ours)})")
        set_checked(params, ours, from_hf(np.asarray(state[theirs])), shapes, theirs, tuple(state[theirs].shape),
                    dtype)
    return params


def state_dict_from_params(config: T5Config, params: dict) -> dict[str, np.ndarray]:
    """transformers-named float32 numpy tensors from our params tree."""
    state = {}
    for ours, theirs, to_hf, _ in name_map(config):
        state[theirs] = np.ascontiguousarray(to_hf(np.asarray(get_param(params, ours), dtype=np.float32)))
    return state


def read_state_dict(directory: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a transformers checkpoint directory (safetensors, sharded or not, or a PyTorch pickle)."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return _read_safetensors(single)
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state = {}
        for shard in shards:
            state.update(_read_safetensors(directory / shard))
        return state
    bin_file = directory / "pytorch_model.bin"
    if bin_file.is_file():
        try:
            import torch
        except ImportError as e:
            raise ImportError(f"{bin_file} is a PyTorch pickle and reading it needs torch; install torch or "
                              "re-save the checkpoint as safetensors") from e
        raw = torch.load(bin_file, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in raw.items()}
    raise FileNotFoundError(f"no weights in {directory}: expected model.safetensors, "
                            "model.safetensors.index.json or pytorch_model.bin")


def read_config(directory: pathlib.Path) -> dict:
    """The `config.json` of a transformers checkpoint directory, as a dict."""
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} is missing: a transformers checkpoint directory needs config.json")
    return json.loads(config_file.read_text())


def checkpoint_dtype(hf: dict) -> str:
    """The parameter dtype config.json records (`dtype`, or transformers 4's `torch_dtype`); float32 when it names
    none of bfloat16, float16, float32."""
    name = str(hf.get("dtype") or hf.get("torch_dtype") or "float32").removeprefix("torch.")
    return name if name in ("bfloat16", "float16", "float32") else "float32"


def numerics_overrides(hf: dict, overrides: dict) -> dict:
    """`overrides` with `param_dtype="checkpoint"` replaced by the dtype the checkpoint was saved in."""
    if overrides.get("param_dtype") == "checkpoint":
        return dict(overrides, param_dtype=checkpoint_dtype(hf))
    return overrides


def write_checkpoint(directory: str | os.PathLike, hf_config: dict, state: dict[str, np.ndarray],
                     generation: dict | None = None) -> pathlib.Path:
    """Writes `config.json` and `model.safetensors`, the files transformers' `from_pretrained` reads, and
    `generation_config.json` when `generation` (its fields) is given."""
    from safetensors.numpy import save_file

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
    if generation:
        (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    with safe_open(str(path), framework="flax") as f:  # flax framework reads bfloat16 too
        return {k: np.asarray(f.get_tensor(k)) for k in f.keys()}


def resolve_checkpoint(name_or_dir: str | os.PathLike) -> pathlib.Path:
    """A local checkpoint directory, or a hub name's snapshot (fetched only when the machine is online)."""
    path = pathlib.Path(name_or_dir).expanduser()
    if path.is_dir():
        return path
    name = HUB_NAMES.get(str(name_or_dir), str(name_or_dir))
    if path.exists() or str(name_or_dir).startswith((".", "/", "~")):
        raise FileNotFoundError(f"{name_or_dir} is not a checkpoint directory (expected config.json and weights)")
    try:
        from huggingface_hub import snapshot_download

        return pathlib.Path(snapshot_download(name, allow_patterns=["config.json", "*.safetensors", "*.json",
                                                                    "pytorch_model.bin", "spiece.model"]))
    except Exception as e:  # offline, unknown repo, ...
        raise FileNotFoundError(
            f"could not find {name_or_dir!r}: not a local directory, and fetching hub model {name!r} failed "
            f"({type(e).__name__}: {e}). Download it on a machine with network access "
            f"(e.g. `huggingface-cli download {name} --local-dir DIR`) and pass DIR.") from e


def load_t5(name_or_dir: str | os.PathLike, **config_overrides) -> tuple[T5Config, dict]:
    """(config, params) from a transformers T5 checkpoint directory, a preset name or a hub name (online only).

    `config_overrides` change numerics fields such as `dtype`, `param_dtype`, `dropout_rate` or `remat`;
    `param_dtype="checkpoint"` keeps the dtype the checkpoint was saved in (`checkpoint_dtype`).
    """
    directory = resolve_checkpoint(name_or_dir)
    hf = read_config(directory)
    config = config_from_hf(hf).replace(**numerics_overrides(hf, config_overrides))
    return config, params_from_state_dict(config, read_state_dict(directory))


def save_t5(config: T5Config, params: dict, directory: str | os.PathLike) -> pathlib.Path:
    """Writes `config.json` and `model.safetensors` that `T5ForConditionalGeneration.from_pretrained` loads."""
    return write_checkpoint(directory, config_to_hf(config), state_dict_from_params(config, params))
