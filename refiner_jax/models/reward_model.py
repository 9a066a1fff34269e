"""A reward model: a language model read at the end of each reasoning step (Uesato et al.).

`RewardModel` wraps a T5 or a decoder-only LM (`lm`, its parameters under `params['lm']`, so a policy's
parameters initialise it as they are) and returns, for every step end of a solution, the log-odds that the solution
is correct so far. One forward pass over the whole solution scores all its steps: the model is causal over the
solution, so the hidden state after step i has read steps 0..i and nothing later.

Two heads, selectable:
- "token": the LM's own next-token logits of two label tokens at the step end, `logit[correct] - logit[wrong]`
  (a two-way softmax over them, as PRM800K and Math-Shepherd's step-tag models do); no new parameters.
- "scalar": a linear head on the final hidden state (Cobbe et al.'s verifier), zero-initialised so that training
  starts from log-odds 0 everywhere.

With `likelihood`, each step's log-odds also add `likelihood_scale` (learned, starting at 1) times the LM's own
log-likelihood of the solution so far, from the same forward pass: a reward model initialised from the policy then
starts from the policy's log-probability of the solution, a score no hidden state holds (a transformer does not see
how surprised it was by the tokens it read), and training moves both terms.

Outcome and process reward models are the same module; they differ only in their labels. `step_log_odds` and
`reference_lm` apply it to a batch of either family (`LanguageModel.step_batch`).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from refiner_jax.models.t5 import T5, shift_right
from refiner_jax.tokenizers import PAD_ID

HEADS = ("token", "scalar")


class RewardModel(nn.Module):
    """Step-end log-odds of correctness. `label_ids` = (correct, wrong) token ids, read by the "token" head."""

    lm: nn.Module
    head: str = "token"
    label_ids: tuple[int, int] = (0, 0)
    likelihood: bool = False

    def lm_logits(self, *lm_inputs: jax.Array, train: bool = False) -> jax.Array:
        """The wrapped LM's own next-token logits (for a language-modelling loss trained jointly with the reward)."""
        if isinstance(self.lm, T5):
            return self.lm(*lm_inputs, enable_dropout=train)
        tokens, mask = lm_inputs
        return self.lm(tokens, attention_mask=mask, deterministic=not train)

    @nn.compact
    def __call__(self, positions: jax.Array, *lm_inputs: jax.Array, solution_mask: jax.Array | None = None,
                 train: bool = False) -> jax.Array:
        """Log-odds `[batch, steps]` at `positions` [batch, steps] (indices into the LM's sequence whose hidden
        state has read exactly the solution up to the step's last token; padded entries may hold any index).

        `lm_inputs`: for T5, (encoder tokens [batch, in_len], decoder input tokens [batch, len]); for the decoder
        LM, (tokens [batch, len], attention mask [batch, len]). `solution_mask` [batch, len] (read with
        `likelihood`; default all ones): 1 at the positions where the token just read is a solution token.
        """
        if self.head not in HEADS:
            raise ValueError(f"unknown reward head {self.head!r}; use one of {HEADS}")
        if isinstance(self.lm, T5):
            h = self.lm.hidden_states(*lm_inputs, enable_dropout=train)
        else:
            tokens, mask = lm_inputs
            h = self.lm.hidden_states(tokens, attention_mask=mask, deterministic=not train)
        read = positions[..., None].astype(jnp.int32)
        at_steps = jnp.take_along_axis(h, read, axis=1)  # [batch, steps, d_model]
        if self.head == "token":
            logits = self.lm.logits(at_steps)  # [batch, steps, vocab]
            out = (logits[..., self.label_ids[0]] - logits[..., self.label_ids[1]]).astype(jnp.float32)
        else:
            kernel = self.param("score_kernel", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                                (h.shape[-1],), jnp.float32)
            bias = self.param("score_bias", nn.with_logical_partitioning(nn.initializers.zeros, ()), (),
                              jnp.float32)
            out = at_steps.astype(jnp.float32) @ kernel + bias
        if not self.likelihood:
            return out
        tokens = lm_inputs[1] if isinstance(self.lm, T5) else lm_inputs[0]  # what each position has just read
        log_probs = jax.nn.log_softmax(self.lm.logits(h[:, :-1]).astype(jnp.float32))  # [batch, len - 1, vocab]
        read_log_probs = jnp.take_along_axis(log_probs, tokens[:, 1:, None].astype(jnp.int32), axis=-1)[..., 0]
        if solution_mask is not None:
            read_log_probs = jnp.where(solution_mask[:, 1:] > 0, read_log_probs, 0.0)
        so_far = jnp.pad(jnp.cumsum(read_log_probs, axis=1), ((0, 0), (1, 0)))  # [batch, len]
        scale = self.param("likelihood_scale", nn.with_logical_partitioning(nn.initializers.ones, ()), (),
                           jnp.float32)
        return out + scale * jnp.take_along_axis(so_far, read[..., 0], axis=1)


def reference_lm(module: RewardModel, params: Any, batch: dict, rng: jax.Array | None = None
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The trunk's teacher-forced (logits [b, len, vocab], targets [b, len], weights [b, len]) of the reference
    solutions `batch['references']` given the prompts, for the joint language-modelling loss."""
    rngs = None if rng is None else {"dropout": rng}
    train = rng is not None
    references = batch["references"]
    if isinstance(module.lm, T5):
        logits = module.apply({"params": params}, batch["inputs"], shift_right(references), train=train, rngs=rngs,
                              method=RewardModel.lm_logits)
        return logits, references, references != PAD_ID
    weights = batch["reference_weights"]
    logits = module.apply({"params": params}, references, batch["reference_mask"], train=train, rngs=rngs,
                          method=RewardModel.lm_logits)
    return logits[:, :-1], references[:, 1:], weights[:, 1:]


def step_log_odds(module: RewardModel, params: Any, batch: dict, rng: jax.Array | None = None) -> jax.Array:
    """The reward model's log-odds [b, max_steps] on a `LanguageModel.step_batch` (dropout with `rng`)."""
    rngs = None if rng is None else {"dropout": rng}
    extra = {"solution_mask": batch["solution_mask"]} if module.likelihood else {}
    if isinstance(module.lm, T5):
        return module.apply({"params": params}, batch["positions"], batch["inputs"], shift_right(batch["targets"]),
                            train=rng is not None, rngs=rngs, **extra)
    return module.apply({"params": params}, batch["positions"], batch["tokens"], batch["mask"],
                        train=rng is not None, rngs=rngs, **extra)
