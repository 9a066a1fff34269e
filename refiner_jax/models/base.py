"""The model seam: what training, sampling and reward models need from a language model of either family, so that
code outside `models/` holds no `if family` branches.

`LanguageModel(config)` wraps a `T5Config` (encoder-decoder: the prompt is encoded, the target decoded) or a
`DecoderConfig` (decoder-only: prompt and target are one sequence, the loss and the samples cover the target
part only) and gives, for (prompt ids, target ids) pairs:
- `module()` and `init_args()`: the Flax module and dummy inputs for `module.init`;
- `pair_batch(...)`: fixed-shape token arrays of a batch (one compiled train step per stage);
- `target_logits(module, params, batch, rng)`: logits aligned with the target tokens, the targets and their
  weights (what a loss or a log-probability needs);
- `sample(...)`: K continuations per prompt with the jitted sampler.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from refiner_jax import sampling
from refiner_jax.models.decoder import Decoder, DecoderConfig
from refiner_jax.models import t5_sampling
from refiner_jax.models.decoder_sampling import sample_decoder
from refiner_jax.models.t5 import T5, shift_right
from refiner_jax.models.t5_config import T5Config

FAMILIES = ("t5", "decoder")


def family_of(config: T5Config | DecoderConfig) -> str:
    return "t5" if isinstance(config, T5Config) else "decoder"


def config_from_dict(family: str, fields: dict) -> T5Config | DecoderConfig:
    """A model config from its saved fields (JSON turns tuples into lists)."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    return T5Config(**fields) if family == "t5" else DecoderConfig(**fields)


def _rows(ids: Sequence[Sequence[int]], length: int, eos_id: int) -> list[list[int]]:
    """Each row cut to `length` ids, keeping its last id (EOS) last when cut."""
    return [list(r) if len(r) <= length else list(r[:length - 1]) + [eos_id] for r in ids]


def _pack(prompts: list[list[int]], targets: list[list[int]], length: int, multiple: int) -> list[list[int]]:
    """Pair indices per row: first fit by decreasing length into rows of `length` tokens, then empty rows up to a
    multiple of `multiple` and of about len(pairs)/8 (never more rows than pairs)."""
    b = len(prompts)
    free: list[int] = []
    rows: list[list[int]] = []
    for i in sorted(range(b), key=lambda i: -(len(prompts[i]) + len(targets[i]))):
        need = len(prompts[i]) + len(targets[i])
        r = next((r for r, room in enumerate(free) if room >= need), len(rows))
        if r == len(rows):
            rows.append([])
            free.append(length)
        rows[r].append(i)
        free[r] -= need
    step = multiple * max(1, b // (8 * multiple))
    return rows + [[] for _ in range(min(b, -(-len(rows) // step) * step) - len(rows))]


@dataclasses.dataclass(frozen=True)
class LanguageModel:
    """A T5 or decoder-only LM behind one interface (see the module docstring)."""

    config: Any

    @property
    def family(self) -> str:
        return family_of(self.config)

    def module(self) -> nn.Module:
        return T5(self.config) if self.family == "t5" else Decoder(self.config)

    def init_args(self) -> tuple:
        dummy = jnp.ones((1, 8), jnp.int32)
        return (dummy, dummy) if self.family == "t5" else (dummy,)

    def pair_batch(self, prompts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], input_len: int,
                   target_len: int, eos_id: int, pack: int = 0) -> dict[str, np.ndarray]:
        """Token arrays for (prompt, target) id rows (each ending with EOS; pad id 0). T5: `inputs` [b, input_len],
        `targets` [b, target_len]. Decoder: `tokens` [b, input_len + target_len] = prompt then target, `mask` at
        real tokens and `weights` at target tokens.

        `pack` > 0 (decoder only) packs the pairs, first fit by decreasing length, into rows of the same length
        with `segments` (1, 2, ... per pair, 0 = padding) in place of `mask`; the row count is rounded up to a
        multiple of `pack` and of about b/8, so a stage's train step compiles for a few row counts (at most eight).
        A batch of pairs averaging 40% of the budget then takes about half the rows."""
        prompts, targets = _rows(prompts, input_len, eos_id), _rows(targets, target_len, eos_id)
        b = len(prompts)
        if self.family == "t5":
            inputs = np.zeros((b, input_len), np.int32)
            out = np.zeros((b, target_len), np.int32)
            for i, (p, t) in enumerate(zip(prompts, targets)):
                inputs[i, :len(p)], out[i, :len(t)] = p, t
            return {"inputs": inputs, "targets": out}
        length = input_len + target_len
        rows = _pack(prompts, targets, length, pack) if pack else [[i] for i in range(b)]
        tokens = np.zeros((len(rows), length), np.int32)
        segments = np.zeros(tokens.shape, np.int32)
        weights = np.zeros(tokens.shape, np.float32)
        for r, members in enumerate(rows):
            at = 0
            for s, i in enumerate(members, start=1):
                p, t = prompts[i], targets[i]
                tokens[r, at:at + len(p) + len(t)] = p + t
                segments[r, at:at + len(p) + len(t)] = s
                weights[r, at + len(p):at + len(p) + len(t)] = 1.0
                at += len(p) + len(t)
        if pack:
            return {"tokens": tokens, "segments": segments, "weights": weights}
        return {"tokens": tokens, "mask": (segments > 0).astype(np.int32), "weights": weights}

    def target_logits(self, module: nn.Module, params: Any, batch: dict, rng: jax.Array | None = None
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(logits [b, t, vocab] float32, targets [b, t], weights [b, t]) of a `pair_batch`, teacher-forced, with
        dropout when `rng` is given: logits[:, j] predict targets[:, j]."""
        rngs = None if rng is None else {"dropout": rng}
        if self.family == "t5":
            targets = batch["targets"]
            logits = module.apply({"params": params}, batch["inputs"], shift_right(targets),
                                  enable_dropout=rng is not None, rngs=rngs)
            weights = batch["weights"] if "weights" in batch else (targets != 0).astype(jnp.float32)
            return logits, targets, weights
        tokens = batch["tokens"]
        logits = module.apply({"params": params}, tokens, attention_mask=batch.get("mask"),
                              segment_ids=batch.get("segments"), deterministic=rng is None, rngs=rngs)
        return logits[:, :-1], tokens[:, 1:], batch["weights"][:, 1:]

    def sample(self, params: Any, prompts: np.ndarray, rng: jax.Array, *, max_new_tokens: int, num_samples: int,
               temperature: float, top_p: float, mesh=None) -> sampling.SampleOutput:
        """Continuations `[b, num_samples, max_new_tokens]` of right-padded prompts [b, len] (pad id 0)."""
        if self.family == "t5":
            return t5_sampling.sample_t5(params, prompts, rng, config=self.config, num_samples=num_samples,
                                         max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                         mesh=mesh)
        return sample_decoder(params, prompts, rng, config=self.config, max_new_tokens=max_new_tokens,
                              num_samples=num_samples, temperature=temperature, top_p=top_p,
                              prompt_mask=prompts != 0, mesh=mesh)
