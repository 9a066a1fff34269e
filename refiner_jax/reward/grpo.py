"""Group-relative policy optimisation (GRPO) with outcome or step-level rewards: the advantages, the credit of each
step's reward to its tokens, the batch of a group of samples and the clipped-ratio loss with a KL penalty.

Advantages, for the G samples of one problem (a group), `eps` = `grpo.adv_eps`:
- outcome rewards r_i (one per sample): A_i = (r_i - mean_g r) / (std_g r + eps), with the population standard
  deviation; every token of sample i gets A_i. A group whose rewards are all equal gets A = 0 on every token: it
  adds nothing to the policy gradient, only its KL penalty.
- step rewards r_ij (one per step j of sample i): normalised over every step of the group's samples,
  q_ij = (r_ij - mean R) / (std R + eps), R the multiset of all the group's step rewards; token t of sample i, in
  step k(t), gets A_it = sum_{j >= k(t)} q_ij (the normalised rewards of its step and every later one). Token t
  is in the first step whose last token is at or after t; tokens after the last rewarded step (the end token, a
  step past the reward model's budget) are in the last rewarded step. A sample with no rewarded step has one step
  with reward 0 over all its tokens.

The loss of token t of sample i, with ratio rho = exp(logp - old), old the sampling policy's log-probability of the
token and ref the reference (SFT) policy's:
    L_it = -min(rho A_it, clip(rho, 1 - eps_clip, 1 + eps_clip) A_it) + beta * k3_it,
    k3_it = exp(ref - logp) - (ref - logp) - 1    (an unbiased, non-negative estimate of KL(policy || ref)),
summed over every target token of the batch and divided once by the batch's token count (`training.steps`' `tokens`
normaliser): every token weighs the same, whatever the length of its sample.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from refiner_jax.models.language_model import LanguageModel
from refiner_jax.reward.batches import encode_solution
from refiner_jax.tokenizers import Tokenizer

PER_TOKEN = ("advantages", "old_log_probs", "ref_log_probs")  # [rows, target_len] arrays a GRPO batch adds


def group_advantages(rewards: np.ndarray, eps: float) -> np.ndarray:
    """[groups, G] outcome rewards -> [groups, G] advantages (r - mean) / (std + eps) within each group."""
    r = np.asarray(rewards, np.float64)
    return (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + eps)


def step_advantages(step_rewards: Sequence[np.ndarray], eps: float) -> list[np.ndarray]:
    """One group's step rewards (an array per sample, one entry per rewarded step; an empty array counts as one
    step with reward 0) -> per sample, per step, the suffix sum of the group-normalised step rewards."""
    steps = [np.asarray(s, np.float64) if len(s) else np.zeros(1) for s in step_rewards]
    pooled = np.concatenate(steps)
    mean, std = pooled.mean(), pooled.std()
    return [np.cumsum(((s - mean) / (std + eps))[::-1])[::-1] for s in steps]


def token_advantages(per_step: np.ndarray, step_last: Sequence[int], n_tokens: int) -> np.ndarray:
    """[n_tokens] advantages from `per_step` [steps] (`step_advantages`' suffix sums), each step's tokens running
    from just past the previous step's last token (index `step_last[j - 1]`) to its own."""
    per_step = np.asarray(per_step, np.float64)
    last = np.asarray(step_last[:len(per_step)], np.int64)
    if len(last) < len(per_step):  # a sample with no step: its one reward covers every token
        return np.full(n_tokens, per_step[0])
    step = np.minimum(np.searchsorted(last, np.arange(n_tokens)), len(per_step) - 1)
    return per_step[step]


def grpo_batch(lm: LanguageModel, tokenizer: Tokenizer, prompts: Sequence[str], solutions: Sequence[str],
               steps: Sequence[Sequence[str]], advantages: Sequence[np.ndarray | float], input_len: int,
               target_len: int, rows: int) -> dict[str, np.ndarray]:
    """The unpacked `LanguageModel.pair_batch` of (prompt, solution) pairs, the solution tokenised step by step
    (`batches.encode_solution`, so every step ends on a token boundary), padded to `rows` rows with copies of the
    first pair that weigh nothing (`row_weights` [rows] 0), plus `advantages` [rows, target_len] (a float per
    solution, or an array over its steps: `step_advantages`' suffix sums, given to its tokens by
    `token_advantages`) and zero `old_log_probs` / `ref_log_probs` to fill in."""
    encoded = [encode_solution(tokenizer, s, st) for s, st in zip(solutions, steps)]
    n = len(encoded)
    if not 0 < n <= rows:
        raise ValueError(f"{n} samples for a batch of {rows} rows")
    prompt_ids = [tokenizer.encode(p) for p in prompts]
    pad = rows - n
    batch = lm.pair_batch(prompt_ids + prompt_ids[:1] * pad, [ids for ids, _ in encoded] + [encoded[0][0]] * pad,
                          input_len, target_len, tokenizer.eos_id)
    batch["row_weights"] = (np.arange(rows) < n).astype(np.float32)  # [rows]: the padding rows count for nothing
    adv = np.zeros((rows, target_len), np.float32)
    for i, ((ids, last), a) in enumerate(zip(encoded, advantages)):
        a = np.asarray(a, np.float64)
        tokens = token_advantages(a, last, len(ids)) if a.ndim else np.full(len(ids), float(a))
        m = min(len(ids), target_len)
        adv[i, :m] = tokens[:m]
    batch["advantages"] = adv
    batch["old_log_probs"] = np.zeros((rows, target_len), np.float32)
    batch["ref_log_probs"] = np.zeros((rows, target_len), np.float32)
    return batch


def token_log_probs(lm: LanguageModel, module, params: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
    """(log-probability of each target token [b, t], 0 where it does not count; weights [b, t]), teacher-forced,
    without dropout."""
    logits, targets, weights = lm.target_logits(module, params, batch, None)
    weights = weights * batch["row_weights"][:, None]
    valid = weights > 0
    logits = jnp.where(valid[..., None], logits.astype(jnp.float32), 0.0)
    log_p = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.where(valid, log_p, 0.0), weights.astype(jnp.float32)


@functools.lru_cache(maxsize=8)
def jitted_token_log_probs(lm: LanguageModel):
    """`token_log_probs` of `lm`'s module, jitted (one compile per batch shape)."""
    return jax.jit(lambda params, batch: token_log_probs(lm, lm.module(), params, batch))


def token_loss(log_p: jax.Array, old: jax.Array, ref: jax.Array, advantages: jax.Array, weights: jax.Array,
               eps_clip: float, kl_beta: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The summed GRPO loss of the module docstring over tokens with weight > 0 ([b, t] inputs), and its sums:
    `loss_sum`, `policy_loss_sum` (the clipped-ratio part), `kl_sum` (k3), `clipped_sum` (tokens whose clipped
    term was the smaller: no gradient through the ratio), `ratio_sum`, `tokens`."""
    valid = weights > 0
    log_ratio = jnp.where(valid, log_p - old, 0.0)
    ratio = jnp.exp(log_ratio)
    unclipped, clipped = ratio * advantages, jnp.clip(ratio, 1.0 - eps_clip, 1.0 + eps_clip) * advantages
    policy = -jnp.minimum(unclipped, clipped)
    ref_gap = jnp.where(valid, ref - log_p, 0.0)
    k3 = jnp.exp(ref_gap) - ref_gap - 1.0
    w = weights.astype(jnp.float32)
    policy_sum, kl_sum = jnp.sum(policy * w), jnp.sum(k3 * w)
    total = policy_sum + kl_beta * kl_sum
    return total, {"loss_sum": total, "policy_loss_sum": policy_sum, "kl_sum": kl_sum,
                   "clipped_sum": jnp.sum((clipped < unclipped) * w), "ratio_sum": jnp.sum(ratio * w),
                   "tokens": jnp.sum(w)}


def grpo_loss(lm: LanguageModel, module, eps_clip: float, kl_beta: float):
    """The GRPO loss of a `grpo_batch` as a `training.steps` loss function. The policy runs without dropout (the
    ratio compares it with the sampling policy, which sampled without), so the step's dropout key goes unused."""
    def loss_fn(params: Any, batch: dict, rng: jax.Array | None):
        log_p, weights = token_log_probs(lm, module, params, batch)
        return token_loss(log_p, batch["old_log_probs"], batch["ref_log_probs"], batch["advantages"], weights,
                          eps_clip, kl_beta)

    return loss_fn


def k3_mean(log_p: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> float:
    """The mean over counted tokens of the k3 estimate of KL(policy || ref) (host arrays)."""
    gap = np.where(weights > 0, ref - log_p, 0.0)
    return float(np.sum((np.exp(gap) - gap - 1.0) * weights) / max(np.sum(weights), 1.0))
