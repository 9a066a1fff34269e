"""A reward model: a language model read at the end of each reasoning step (reference spec §6.2).

`RewardModel` wraps a T5 or a decoder-only LM (`lm`, its parameters under `params['lm']`, so a policy's
parameters initialise it as they are) and returns, for every step end of a solution, the log-odds that the solution
is correct so far. One forward pass over the whole solution scores all its steps: the model is causal over the
solution, so the hidden state after step i has read steps 0..i and nothing later.

Two heads, selectable:
- "token": the LM's own next-token logits of two label tokens at the step end, `logit[correct] - logit[wrong]`
  (a two-way softmax over them, as PRM800K and Math-Shepherd's step-tag models do); no new parameters.
- "scalar": a linear head on the final hidden state (Cobbe et al.'s verifier), zero-initialised so that training
  starts from log-odds 0 everywhere.

Outcome and process reward models are the same module; they differ only in their labels.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from refiner_jax.models.t5 import T5

HEADS = ("token", "scalar")


class RewardModel(nn.Module):
    """Step-end log-odds of correctness. `label_ids` = (correct, wrong) token ids, read by the "token" head."""

    lm: nn.Module
    head: str = "token"
    label_ids: tuple[int, int] = (0, 0)

    def lm_logits(self, *lm_inputs: jax.Array, train: bool = False) -> jax.Array:
        """The wrapped LM's own next-token logits (for a language-modelling loss trained jointly with the reward)."""
        if isinstance(self.lm, T5):
            return self.lm(*lm_inputs, enable_dropout=train)
        tokens, mask = lm_inputs
        return self.lm(tokens, attention_mask=mask, deterministic=not train)

    @nn.compact
    def __call__(self, positions: jax.Array, *lm_inputs: jax.Array, train: bool = False) -> jax.Array:
        """Log-odds `[batch, steps]` at `positions` [batch, steps] (indices into the LM's sequence whose hidden
        state has read exactly the solution up to the step's last token; padded entries may hold any index).

        `lm_inputs`: for T5, (encoder tokens [batch, in_len], decoder input tokens [batch, len]); for the decoder
        LM, (tokens [batch, len], attention mask [batch, len]).
        """
        if self.head not in HEADS:
            raise ValueError(f"unknown reward head {self.head!r}; use one of {HEADS}")
        if isinstance(self.lm, T5):
            h = self.lm.hidden_states(*lm_inputs, enable_dropout=train)
        else:
            tokens, mask = lm_inputs
            h = self.lm.hidden_states(tokens, attention_mask=mask, deterministic=not train)
        h = jnp.take_along_axis(h, positions[..., None].astype(jnp.int32), axis=1)  # [batch, steps, d_model]
        if self.head == "token":
            logits = self.lm.logits(h)  # [batch, steps, vocab]
            return logits[..., self.label_ids[0]] - logits[..., self.label_ids[1]]
        kernel = self.param("score_kernel", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                            (h.shape[-1],), jnp.float32)
        bias = self.param("score_bias", nn.with_logical_partitioning(nn.initializers.zeros, ()), (), jnp.float32)
        return h.astype(jnp.float32) @ kernel + bias
