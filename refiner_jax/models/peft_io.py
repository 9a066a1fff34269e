"""LoRA adapters as PEFT's files: `adapter_config.json` and `adapter_model.safetensors`.

`save_adapters` writes adapters (`models.lora`) so that ``PeftModel.from_pretrained(model, directory)`` puts them
on the transformers model that `hf.save_t5` / `hf_decoder.save_decoder` writes for the same parameters;
`load_adapters` reads such a directory (written here or by PEFT) back. A tensor is named after its transformers
module, ``base_model.model.<module>.lora_A.weight`` ``[rank, in]`` and ``...lora_B.weight`` ``[out, rank]``: the
transposes of our ``lora_a`` and ``lora_b``. Only plain LoRA is read: PEFT options that change the update
(rsLoRA, DoRA, per-module ranks, biases, extra trained modules) are refused by name.
"""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from refiner_jax.models import lora as lora_lib
from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.t5_config import T5Config

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
# adapter_config.json fields that must keep PEFT's default for the update to be plain LoRA, and that default.
_PLAIN = {"use_rslora": False, "use_dora": False, "bias": "none", "modules_to_save": None, "rank_pattern": {},
          "alpha_pattern": {}, "layers_to_transform": None}


def _task_type(lora: lora_lib.Lora) -> str:
    return "SEQ_2_SEQ_LM" if lora.model_type == "t5" else "CAUSAL_LM"


def save_adapters(directory: str | os.PathLike, lora: lora_lib.Lora, adapters: dict) -> pathlib.Path:
    """Writes PEFT's two adapter files for `adapters` (the tree of `lora.init`, arrays) into `directory`."""
    from safetensors.numpy import save_file

    tensors = {}
    for target in lora.targets:
        adapter = lora_lib.adapter_of(adapters, target)
        tensors[f"{_PREFIX}{target.module}.lora_A.weight"] = np.ascontiguousarray(
            np.asarray(adapter["lora_a"], np.float32).T)
        tensors[f"{_PREFIX}{target.module}.lora_B.weight"] = np.ascontiguousarray(
            np.asarray(adapter["lora_b"], np.float32).T)
    config = {"peft_type": "LORA", "task_type": _task_type(lora), "r": lora.config.rank,
              "lora_alpha": lora.config.alpha, "target_modules": list(lora.target_modules), "lora_dropout": 0.0,
              "fan_in_fan_out": lora.fan_in_fan_out, "init_lora_weights": True, "inference_mode": True,
              "base_model_name_or_path": None, **_PLAIN}
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    return directory


def read_config(directory: str | os.PathLike) -> lora_lib.LoraConfig:
    """The `LoraConfig` of a PEFT adapter directory; raises naming a field that is not plain LoRA."""
    path = pathlib.Path(directory) / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {directory} is not a PEFT adapter directory")
    fields = json.loads(path.read_text())
    if fields.get("peft_type") != "LORA":
        raise ValueError(f"{path}: peft_type is {fields.get('peft_type')!r}; only LORA adapters are read")
    for name, plain in _PLAIN.items():
        if (fields.get(name, plain) or None) != (plain or None):  # an absent, null or empty field is the default
            raise ValueError(f"{path}: {name}={fields[name]!r} is not supported; save the adapter with "
                             f"{name}={plain!r}")
    targets = fields.get("target_modules")
    if isinstance(targets, str):
        if targets != lora_lib.ALL_LINEAR:
            raise ValueError(f"{path}: target_modules {targets!r} is a pattern; list the module names instead")
        targets = [targets]
    return lora_lib.LoraConfig(rank=int(fields["r"]), alpha=float(fields["lora_alpha"]),
                               target_modules=tuple(sorted(targets)))


def load_adapters(directory: str | os.PathLike, model_config: T5Config | DecoderConfig
                  ) -> tuple[lora_lib.Lora, dict]:
    """``(lora, adapters)`` of a PEFT adapter directory for a model of `model_config`; raises naming a missing,
    unexpected or mis-shaped tensor."""
    from safetensors.numpy import load_file

    lora = lora_lib.bind(model_config, read_config(directory))
    path = pathlib.Path(directory) / WEIGHTS_FILE
    tensors = {k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B."): v
               for k, v in load_file(str(path)).items()}
    adapters: dict = {}
    r = lora.config.rank
    for target in lora.targets:
        entry = {}
        for side, name, shape in (("lora_a", "lora_A", (r, target.in_features)),
                                  ("lora_b", "lora_B", (target.out_features, r))):
            key = f"{_PREFIX}{target.module}.{name}.weight"
            if key not in tensors:
                raise ValueError(f"{path} lacks tensor {key!r}")
            tensor = tensors.pop(key)
            if tensor.shape != shape:
                raise ValueError(f"{path}: tensor {key!r} has shape {tensor.shape}, the model needs {shape}")
            entry[side] = np.asarray(tensor, np.float32).T
        lora_lib.set_adapter(adapters, target, entry)
    if tensors:
        raise ValueError(f"{path} has tensors this model does not have: {sorted(tensors)[:4]}")
    return lora, adapters
