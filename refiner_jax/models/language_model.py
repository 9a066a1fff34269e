"""The model seam: what training, sampling and reward models need from a language model of either family, so that
code outside `models/` holds no `if family` branches.

`LanguageModel(config)` wraps a `T5Config` (encoder-decoder: the prompt is encoded, the target decoded) or a
`DecoderConfig` (decoder-only: prompt and target are one sequence, the loss and the samples cover the target
part only) and gives, for (prompt ids, target ids) pairs:
- `module()` and `init_args()`: the Flax module and dummy inputs for `module.init` (`init_params(config, rng)`:
  the initialised, unboxed parameters);
- `pair_batch(...)`, `text_pair_batch(...)`: fixed-shape token arrays of a batch (one compiled train step per
  stage); `step_batch(...)`: a reward model's batch of solutions read at their step ends;
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
from refiner_jax.models.decoder import Decoder
from refiner_jax.models.decoder_config import PRESETS as DECODER_PRESETS
from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.decoder_config import preset as decoder_preset
from refiner_jax.models import t5_sampling
from refiner_jax.models.decoder_sampling import sample_decoder
from refiner_jax.models.t5 import T5, shift_right
from refiner_jax.models.t5_config import PRESETS as T5_PRESETS
from refiner_jax.models.t5_config import T5Config
from refiner_jax.models.t5_config import preset as t5_preset

FAMILIES = ("t5", "decoder")
PRESETS = {"t5": T5_PRESETS, "decoder": DECODER_PRESETS}  # family -> preset name -> architecture


def family_of(config: T5Config | DecoderConfig) -> str:
    return "t5" if isinstance(config, T5Config) else "decoder"


def preset_config(family: str, name: str, vocab_size: int, pad_id: int, eos_id: int,
                  **overrides) -> T5Config | DecoderConfig:
    """The preset `name` of `family` for a tokenizer's vocabulary (a decoder-only LM also takes its pad and end ids;
    prompt and target share its positions, so it has no start token)."""
    if family == "decoder":
        return decoder_preset(name, vocab_size=vocab_size, pad_id=pad_id, eos_id=eos_id, bos_id=None, **overrides)
    return t5_preset(name, vocab_size=vocab_size, **overrides)


def init_params(config: T5Config | DecoderConfig, rng: jax.Array) -> Any:
    """Freshly initialised parameters of either family's model: the unboxed pytree that training, sampling and
    checkpoints take (`jax.eval_shape(functools.partial(init_params, config), rng)` gives its shapes without
    allocating). Not jitted: for a large model under a mesh, `training.state.create_train_state` initialises each
    parameter on its own devices instead."""
    lm = LanguageModel(config)
    return nn.meta.unbox(lm.module().init(rng, *lm.init_args())["params"])


def load_checkpoint(family: str, checkpoint: str, **overrides) -> tuple[T5Config | DecoderConfig, Any]:
    """(model config, params) of a transformers checkpoint directory (or hub name) of `family`."""
    from refiner_jax.models import hf, hf_decoder

    load = hf_decoder.load_decoder if family == "decoder" else hf.load_t5
    return load(checkpoint, **overrides)


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


def _steps_batch(rows: Sequence[tuple[list[int], list[int]]], labels: Sequence[Sequence[bool]] | None,
                 length: int, max_steps: int, offsets: Sequence[int], starts: Sequence[int], eos_id: int,
                 pad_id: int) -> dict:
    """Token ids [b, length] (truncated rows keep EOS last), read positions = `offsets` + each step's last-token
    index [b, max_steps], labels and label mask [b, max_steps]; steps cut off by either budget are masked.
    `solution_mask` [b, length] is 1 at the read positions whose token just read is one of the solution's: row i's
    tokens `starts[i]` up to its EOS (excluded), read at `offsets[i]` + their index."""
    b = len(rows)
    tokens = np.full((b, length), pad_id, np.int32)
    positions = np.zeros((b, max_steps), np.int32)
    mask = np.zeros((b, max_steps), np.float32)
    out_labels = np.zeros((b, max_steps), np.float32)
    solution = np.zeros((b, length), np.float32)
    for i, (ids, last) in enumerate(rows):
        if len(ids) > length:
            ids = ids[:length - 1] + [eos_id]
        tokens[i, :len(ids)] = ids
        solution[i, starts[i] + offsets[i]:min(len(ids) - 1 + offsets[i], length)] = 1.0
        kept = [j for j, t in enumerate(last[:max_steps]) if t < len(ids) - 1]  # the step's tokens all fit
        positions[i, :len(kept)] = np.asarray([last[j] for j in kept], np.int32) + offsets[i]
        mask[i, :len(kept)] = 1.0
        if labels is not None and labels[i]:  # a scorer's solutions come without labels
            out_labels[i, :len(kept)] = [float(labels[i][j]) for j in kept]
    return {"tokens": tokens, "positions": positions, "labels": out_labels, "label_mask": mask,
            "solution_mask": solution}


def t5_step_batch(tokenizer, rows: Sequence[tuple[list[int], list[int]]], solutions: Sequence, input_len: int,
                  target_len: int, max_steps: int) -> dict[str, np.ndarray]:
    """A T5 reward-model batch of encoded solutions `rows` ((ids, index of each step's last token)) and their
    `solutions` (`prompt`, `labels`, `reference`): `inputs` [b, input_len] (prompts), `targets` [b, target_len]
    (solutions; the decoder reads them shifted right, so its output at position t has read targets[:t] and a step
    ending at token j is read at j + 1), `positions`, `labels`, `label_mask` [b, max_steps], `solution_mask`."""
    batch = _steps_batch(rows, [s.labels for s in solutions], target_len, max_steps, [1] * len(rows),
                         [0] * len(rows), tokenizer.eos_id, tokenizer.pad_id)
    batch["targets"] = batch.pop("tokens")
    batch["inputs"] = tokenizer.encode_batch([s.prompt for s in solutions], input_len, pad_to=input_len)
    # The reference solutions, for the joint LM loss (all pad where unknown: such rows add nothing to it).
    batch["references"] = np.zeros((len(solutions), target_len), np.int32)
    for i, s in enumerate(solutions):
        if s.reference:
            ids = tokenizer.encode(s.reference)
            ids = ids[:target_len - 1] + [tokenizer.eos_id] if len(ids) > target_len else ids
            batch["references"][i, :len(ids)] = ids
    return batch


def decoder_step_batch(tokenizer, rows: Sequence[tuple[list[int], list[int]]], solutions: Sequence, length: int,
                       max_steps: int) -> dict[str, np.ndarray]:
    """A decoder-LM reward-model batch of encoded solutions `rows` and their `solutions`: `tokens` [b, length] =
    prompt ids and EOS (as the decoder policy reads its prompts, `LanguageModel.pair_batch`), then solution ids,
    right-padded, with `mask` [b, length] at real tokens; a step ending at solution token j is read at
    len(prompt) + 1 + j. `references`, `reference_mask` and `reference_weights` [b, length] (1 at the reference's
    tokens): the same layout with the gold solution, for the joint LM loss (no weight where unknown)."""
    prompts = [tokenizer.encode(s.prompt) for s in solutions]
    rows = [(p + ids, [len(p) + t for t in last]) for p, (ids, last) in zip(prompts, rows)]
    batch = _steps_batch(rows, [s.labels for s in solutions], length, max_steps, [0] * len(rows),
                         [len(p) for p in prompts], tokenizer.eos_id, tokenizer.pad_id)
    batch["mask"] = np.zeros(batch["tokens"].shape, np.int32)
    for i, (ids, _) in enumerate(rows):
        batch["mask"][i, :min(len(ids), length)] = 1
    batch["references"] = np.full((len(solutions), length), tokenizer.pad_id, np.int32)
    batch["reference_mask"] = np.zeros((len(solutions), length), np.int32)
    batch["reference_weights"] = np.zeros((len(solutions), length), np.float32)
    for i, (p, s) in enumerate(zip(prompts, solutions)):
        if s.reference and len(p) < length:
            ids = (p + tokenizer.encode(s.reference))[:length]
            batch["references"][i, :len(ids)] = ids
            batch["reference_mask"][i, :len(ids)] = 1
            batch["reference_weights"][i, len(p):len(ids)] = 1.0
    return batch


def _joined(prompts: np.ndarray, suffixes: np.ndarray) -> np.ndarray:
    """Right-padded rows of each prompt's tokens followed by its suffix's (pad id 0 in all three)."""
    rows = [[t for t in p if t] + [t for t in f if t] for p, f in zip(prompts.tolist(), suffixes.tolist())]
    out = np.zeros((len(rows), prompts.shape[1] + suffixes.shape[1]), np.int32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


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

        Unpacked decoder rows also carry `target_index` [b, target_len]: the position in the row whose next-token
        logit predicts each target token (-1 past the target's end), so that the loss computes the output layer
        over the target part only, a fraction target_len / (input_len + target_len) of the row.

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
        target_index = np.full((b, target_len), -1, np.int32)
        for i, (p, t) in enumerate(zip(prompts, targets)):
            target_index[i, :len(t)] = np.arange(len(p) - 1, len(p) - 1 + len(t))
        return {"tokens": tokens, "mask": (segments > 0).astype(np.int32), "weights": weights,
                "target_index": target_index}

    def text_pair_batch(self, tokenizer, pairs: Sequence[tuple[str, str]], input_len: int, target_len: int,
                        pack: int = 0) -> dict[str, np.ndarray]:
        """`pair_batch` of (prompt, target) texts, truncated / padded to the fixed lengths so a stage's train step
        compiles once (a decoder's packed batches: once per row count, a few). T5 rows are padded to the budgets."""
        if self.family == "t5":
            inputs = tokenizer.encode_batch([p[0] for p in pairs], input_len, pad_to=input_len)
            targets = tokenizer.encode_batch([p[1] for p in pairs], target_len, pad_to=target_len)
            return {"inputs": inputs, "targets": targets}
        return self.pair_batch([tokenizer.encode(p[0]) for p in pairs], [tokenizer.encode(p[1]) for p in pairs],
                               input_len, target_len, tokenizer.eos_id, pack=pack)

    def step_batch(self, tokenizer, rows: Sequence[tuple[list[int], list[int]]], solutions: Sequence,
                   input_len: int, target_len: int, max_steps: int) -> dict[str, np.ndarray]:
        """A reward-model batch of this family (`t5_step_batch`, `decoder_step_batch`: prompt and solution in one
        sequence of input_len + target_len tokens)."""
        if self.family == "t5":
            return t5_step_batch(tokenizer, rows, solutions, input_len, target_len, max_steps)
        return decoder_step_batch(tokenizer, rows, solutions, input_len + target_len, max_steps)

    def target_logits(self, module: nn.Module, params: Any, batch: dict, rng: jax.Array | None = None
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(logits [b, t, vocab] float32, targets [b, t], weights [b, t]) of a `pair_batch`, teacher-forced, with
        dropout when `rng` is given: logits[:, j] predict targets[:, j]. A decoder's unpacked rows give the target
        part only (`target_index`); packed rows every position but the last."""
        rngs = None if rng is None else {"dropout": rng}
        if self.family == "t5":
            targets = batch["targets"]
            logits = module.apply({"params": params}, batch["inputs"], shift_right(targets),
                                  enable_dropout=rng is not None, rngs=rngs)
            weights = batch["weights"] if "weights" in batch else (targets != 0).astype(jnp.float32)
            return logits, targets, weights
        tokens = batch["tokens"]
        hidden = module.apply({"params": params}, tokens, attention_mask=batch.get("mask"),
                              segment_ids=batch.get("segments"), deterministic=rng is None, rngs=rngs,
                              method="hidden_states")  # [b, len, d_model]
        if "target_index" not in batch:  # packed rows: every position but the last predicts a token
            logits = module.apply({"params": params}, hidden, method="logits")
            return logits[:, :-1], tokens[:, 1:], batch["weights"][:, 1:]
        index = batch["target_index"]  # [b, t]: the position predicting each target token, -1 past the end
        at = jnp.maximum(index, 0)
        logits = module.apply({"params": params}, jnp.take_along_axis(hidden, at[..., None], axis=1), method="logits")
        targets = jnp.take_along_axis(tokens, at + 1, axis=1)
        weights = jnp.where(index >= 0, jnp.take_along_axis(batch["weights"], at + 1, axis=1), 0.0)
        return logits, targets, weights

    def sample(self, params: Any, prompts: np.ndarray, rng: jax.Array, *, max_new_tokens: int, num_samples: int,
               temperature: float, top_p: float, mesh=None, target_prefix: np.ndarray | None = None,
               min_new_tokens: int = 0) -> sampling.SampleOutput:
        """Continuations `[b, num_samples, max_new_tokens]` of right-padded prompts [b, len] (pad id 0). With
        `target_prefix` [b, L] (right-padded ids, no EOS), each target starts with those tokens, forced, and the
        samples are what follows them. EOS is suppressed before `min_new_tokens` tokens."""
        if self.family == "t5":
            return t5_sampling.sample_t5(params, prompts, rng, config=self.config, num_samples=num_samples,
                                         max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                         min_new_tokens=min_new_tokens, mesh=mesh, target_prefix=target_prefix)
        if target_prefix is not None:  # the decoder reads prompt then target as one sequence: prefill both
            prompts = _joined(np.asarray(prompts), np.asarray(target_prefix))
        return sample_decoder(params, prompts, rng, config=self.config, max_new_tokens=max_new_tokens,
                              num_samples=num_samples, temperature=temperature, top_p=top_p,
                              min_new_tokens=min_new_tokens, prompt_mask=prompts != 0, mesh=mesh)
