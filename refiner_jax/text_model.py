"""A language model of either family with its tokenizer, as a batched text -> text function.

`TextModel` pads prompts to fixed batch and length buckets so the jitted sampler compiles a handful of times per run;
`load_text_model` reads a finished training stage's export.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from refiner_jax import checkpoint as ckpt_lib
from refiner_jax import sampling
from refiner_jax.models.language_model import LanguageModel, config_from_dict
from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.t5_config import T5Config
from refiner_jax.tokenizers import Tokenizer


@dataclasses.dataclass
class TextModel:
    """A language model of either family (`models.language_model.LanguageModel`) with its tokenizer as a batched text -> text
    function.

    `max_input` / `max_output` are token budgets; prompts are padded to multiples of `bucket` tokens and to
    `batch_size` rows, so a stream of batches reuses a few compiled shapes. With a `mesh`, each batch's prompts are
    split over its devices, one decode loop per device (`sample_t5`, `sample_decoder`; rows padded to a multiple of
    the device count), instead of one loop on the default device; a mesh over several processes needs every process
    to generate the same texts together.
    """

    config: T5Config | DecoderConfig
    params: Any
    tokenizer: Tokenizer
    max_input: int
    max_output: int
    bucket: int = 16
    batch_size: int = 64
    mesh: Mesh | None = None

    def __post_init__(self):
        if self.mesh is not None and self.mesh.size > 1:
            self.params = sampling.replicate(self.params, self.mesh)  # once, not once per batch

    def generate(self, texts: Sequence[str], *, num_samples: int = 1, top_p: float = 1.0, temperature: float = 0.0,
                 rng: jax.Array | None = None, prefixes: Sequence[str] | None = None) -> list[list[str]]:
        """`num_samples` continuations per text (greedy when temperature is 0), `[len(texts)][num_samples]`. With
        `prefixes`, each output starts with its text's prefix, kept token for token (its tokens are forced, not
        drawn), and the model writes the rest: the outputs are the whole targets, prefix included."""
        return self.generate_with_log_probs(texts, num_samples=num_samples, top_p=top_p, temperature=temperature,
                                            rng=rng, prefixes=prefixes)[0]

    def generate_with_log_probs(self, texts: Sequence[str], *, num_samples: int = 1, top_p: float = 1.0,
                                temperature: float = 0.0, rng: jax.Array | None = None,
                                prefixes: Sequence[str] | None = None) -> tuple[list[list[str]], np.ndarray]:
        """`generate`'s texts and each one's model log-probability (unscaled by temperature, end token included
        when it was produced; with `prefixes`, of the generated part only), `[len(texts), num_samples]`."""
        if prefixes is not None and len(prefixes) != len(texts):
            raise ValueError(f"{len(prefixes)} prefixes for {len(texts)} texts; give one per text")
        rng = jax.random.key(0) if rng is None else rng
        out: list[list[str]] = []
        log_probs = []
        devices = 1 if self.mesh is None else self.mesh.size
        padded = -(-self.batch_size // devices) * devices
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start:start + self.batch_size])
            rows = chunk + [""] * (padded - len(chunk))
            prompts = self.tokenizer.encode_batch(rows, self.max_input, pad_to=self.bucket)
            forced = None
            if prefixes is not None:  # [batch, L] prefix ids without EOS, the same bucket rounding
                forced = self.tokenizer.encode_batch(list(prefixes[start:start + self.batch_size])
                                                     + [""] * (padded - len(chunk)), self.max_output,
                                                     pad_to=self.bucket, add_eos=False)
            result = LanguageModel(self.config).sample(
                self.params, prompts, jax.random.fold_in(rng, start), num_samples=num_samples,
                max_new_tokens=self.max_output, temperature=temperature, top_p=top_p, mesh=self.mesh,
                target_prefix=forced)
            tokens = _to_host(result.tokens)  # [batch, k, len]
            if forced is not None:  # decode prefix and continuation together (`decode` skips the pads between)
                tokens = np.concatenate([np.broadcast_to(forced[:, None], (*tokens.shape[:2], forced.shape[1])),
                                         tokens], axis=2)
            for i in range(len(chunk)):
                out.append(self.tokenizer.decode_batch(tokens[i]))
            log_probs.append(_to_host(result.log_prob)[:len(chunk)])  # [batch, k]
        return out, (np.concatenate(log_probs) if log_probs else np.zeros((0, num_samples), np.float32))

    def greedy(self, texts: Sequence[str]) -> list[str]:
        return [s[0] for s in self.generate(texts)]

    def score(self, texts: Sequence[str], targets: Sequence[str]) -> np.ndarray:
        """Model log-probability of each target (EOS included) given its text, `[len(texts)]` (teacher-forced)."""
        out = []
        for start in range(0, len(texts), self.batch_size):
            chunk = slice(start, start + self.batch_size)
            n = len(texts[chunk])
            pad = [""] * (self.batch_size - n)
            batch = LanguageModel(self.config).pair_batch(
                [self.tokenizer.encode(t) for t in list(texts[chunk]) + pad],
                [self.tokenizer.encode(t) for t in list(targets[chunk]) + pad], self.max_input, self.max_output,
                self.tokenizer.eos_id)
            out.append(np.asarray(_sequence_log_probs(self.params, batch, config=self.config))[:n])
        return np.concatenate(out) if out else np.zeros(0, np.float32)


def _to_host(x: jax.Array) -> np.ndarray:
    """The whole value of `x` on this host, gathered from the other processes where they hold part of it."""
    return np.asarray(x) if x.is_fully_addressable else np.asarray(multihost_utils.process_allgather(x, tiled=True))


@functools.partial(jax.jit, static_argnames=("config",))
def _sequence_log_probs(params, batch, *, config: T5Config | DecoderConfig):
    lm = LanguageModel(config)
    logits, targets, weights = lm.target_logits(lm.module(), params, batch)  # [batch, len, vocab]
    token = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(weights > 0, token, 0.0), axis=-1)  # [batch]


def load_text_model(stage_dir: str, tokenizer: Tokenizer, max_input: int, max_output: int, bucket: int = 16,
                    batch_size: int = 64, mesh: Mesh | None = None) -> TextModel:
    """The exported parameters of a finished training stage (`<workdir>/<stage>`) as a `TextModel` (sampling over
    `mesh`'s devices when given)."""
    export = os.path.join(stage_dir, "export")
    if not os.path.isdir(export):
        raise FileNotFoundError(f"{export} does not exist: train the stage first "
                                "(python launch/train.py --config=... --workdir=...)")
    params, metadata = ckpt_lib.load_params(export)
    config = config_from_dict(metadata.get("family", "t5"), metadata["model_config"])
    return TextModel(config, params, tokenizer, max_input, max_output, bucket, batch_size, mesh)

