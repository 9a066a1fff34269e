"""Public process reward models (PRMs) from transformers checkpoints, as a jitted scorer of tagged step ends.

A PRM reads a problem and its solution with a step tag token after every step and gives, at each tag, the
probability that the solution is right up to that step. Two layouts, told apart by config.json's `architectures`:

- a `...ForProcessRewardModel` (Qwen2.5-Math-PRM): the decoder stack (tensors `model.*`, any family
  `hf_decoder.config_from_hf` reads), then the head `score` = Linear(d, d) -> ReLU -> Linear(d, 2) (`score.0.*`,
  `score.2.*`) and no output layer; the probability is the softmax of the two logits at the tag, class 1;
- a causal LM (any checkpoint `hf_decoder.load_decoder` reads) read as Math-Shepherd's PRMs are: the softmax over
  the next-token logits of a good and a bad label token at the tag, the good one. Only those two columns of the
  output layer are multiplied, never the whole vocabulary.

`load_process_reward_model` returns `score_fn(input_ids, attention_mask)` -> `[batch, length]` float32, the
probability at every tag position and NaN elsewhere. Rows and lengths are padded to power-of-two buckets
(`sampling.bucket_size`), so a stream of batches compiles a few programs only. `qwen_prm_messages` and
`math_shepherd_text` lay a problem and its steps out the way each public model was trained to read them.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from refiner_jax import sampling
from refiner_jax.models.decoder import Decoder
from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.hf import numerics_overrides, read_config, read_state_dict, resolve_checkpoint
from refiner_jax.models.hf_decoder import config_from_hf, generation_tokens, load_decoder, params_from_state_dict

LAYOUTS = ("prm_head", "causal_lm")
QWEN_PRM_TAG = "<extra_0>"
QWEN_PRM_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
MATH_SHEPHERD_TAG = "ки"
_STEP_PREFIX = re.compile(r"Step \d+:")
_HEAD_TENSORS = ("score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias")

ScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class PRMConfig:
    """What a loaded PRM is: its decoder, its layout (`LAYOUTS`), the step tag id and, for a causal LM, the
    (good, bad) label token ids."""

    decoder: DecoderConfig
    layout: str
    step_tag_id: int
    label_ids: tuple[int, int] | None = None


def qwen_prm_messages(problem: str, steps: Sequence[str], tag: str = QWEN_PRM_TAG,
                      system: str = QWEN_PRM_SYSTEM) -> list[dict]:
    """The chat Qwen2.5-Math-PRM reads (render it with the tokenizer's `apply_chat_template`, no generation
    prompt): the system prompt, the problem as the user turn, and the steps joined by `tag` with a tag after the
    last one as the assistant turn."""
    return [{"role": "system", "content": system}, {"role": "user", "content": problem},
            {"role": "assistant", "content": tag.join(steps) + tag}]


def math_shepherd_text(problem: str, steps: Sequence[str], tag: str = MATH_SHEPHERD_TAG) -> str:
    """Math-Shepherd's layout: the problem, a space, then "Step k: <step> <tag>" lines ("Step k:" added where a
    step does not start with it already)."""
    lines = [s if _STEP_PREFIX.match(s) else f"Step {k + 1}: {s}" for k, s in enumerate(s.strip() for s in steps)]
    return f"{problem} " + "\n".join(f"{line} {tag}" for line in lines)


def _architecture(hf: dict) -> str:
    names = hf.get("architectures") or []
    return names[0] if names else ""


def _layout(hf: dict, where: str) -> str:
    arch = _architecture(hf)
    if arch.endswith("ForProcessRewardModel"):
        return "prm_head"
    if arch.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    raise ValueError(f"architecture {arch or '(none)'!r} in {where} is not a process reward model this loader "
                     "reads: expected a ...ForProcessRewardModel (Qwen2.5-Math-PRM) or a causal LM (...ForCausalLM, "
                     "GPT2LMHeadModel) with good_token_id and bad_token_id")


def layout_of(path: str | os.PathLike) -> str:
    """The layout (`LAYOUTS`) of the checkpoint at `path`, from its config.json; raises for any other
    architecture."""
    directory = resolve_checkpoint(path)
    return _layout(read_config(directory), str(directory / "config.json"))


def load_process_reward_model(path: str | os.PathLike, step_tag_id: int, good_token_id: int | None = None,
                              bad_token_id: int | None = None, **config_overrides) -> tuple[ScoreFn, PRMConfig]:
    """(score_fn, PRMConfig) of the PRM checkpoint at `path` (a directory or, online, a hub name).

    A `...ForProcessRewardModel` uses its own two-class head (no label ids); a causal LM needs `good_token_id` and
    `bad_token_id`. `config_overrides` change numerics fields as in `load_decoder` (e.g. `dtype="bfloat16"`,
    `param_dtype="checkpoint"` to keep a 7B model's bfloat16 weights).
    """
    directory = resolve_checkpoint(path)
    hf = read_config(directory)
    arch, layout = _architecture(hf), _layout(hf, str(directory / "config.json"))
    labels_given = (good_token_id, bad_token_id) != (None, None)
    if layout == "prm_head":
        if labels_given:
            raise ValueError(f"{arch} scores with its own two-class head; drop good_token_id / bad_token_id")
        # The head replaces the output layer, which the checkpoint lacks: read it as tied so none is expected.
        config = config_from_hf(hf).replace(tie_embeddings=True,
                                            **{**generation_tokens(directory),
                                               **numerics_overrides(hf, config_overrides)})
        state = read_state_dict(directory)
        params = {"lm": params_from_state_dict(config, {k: v for k, v in state.items()
                                                        if not k.startswith("score.")}),
                  "head": _head_params(config, state)}
        prm = PRMConfig(config, "prm_head", int(step_tag_id))
    else:
        if good_token_id is None or bad_token_id is None:
            raise ValueError(f"{arch} is a causal LM: pass good_token_id and bad_token_id, the label tokens it "
                             "predicts at each step tag (Math-Shepherd: the ids of '+' and '-')")
        config, lm = load_decoder(directory, **config_overrides)
        for name, token in (("good_token_id", good_token_id), ("bad_token_id", bad_token_id)):
            if not 0 <= token < config.vocab_size:
                raise ValueError(f"{name}={token} is outside the vocabulary [0, {config.vocab_size})")
        params = {"lm": lm}
        prm = PRMConfig(config, "causal_lm", int(step_tag_id), (int(good_token_id), int(bad_token_id)))
    if not 0 <= prm.step_tag_id < config.vocab_size:
        raise ValueError(f"step_tag_id={step_tag_id} is outside the vocabulary [0, {config.vocab_size})")
    return make_score_fn(prm, jax.device_put(params)), prm


def _head_params(config: DecoderConfig, state: dict) -> dict:
    """The `score` head's tensors as [in, out] kernels and biases; raises naming a missing or mis-shaped one."""
    d = config.d_model
    expected = dict(zip(_HEAD_TENSORS, ((d, d), (d,), (2, d), (2,))))
    for name, shape in expected.items():
        if name not in state:
            raise ValueError(f"checkpoint lacks {name!r}: a process reward model's head is score.0 = Linear(d, d), "
                             "score.2 = Linear(d, 2)")
        if tuple(state[name].shape) != shape:
            raise ValueError(f"tensor {name!r} has shape {tuple(state[name].shape)}; expected {shape} "
                             f"(hidden_size {d})")
    dtype = jnp.dtype(config.param_dtype)
    w0, b0, w1, b1 = (np.asarray(state[k]) for k in _HEAD_TENSORS)
    return {"w0": w0.T.astype(dtype), "b0": b0.astype(dtype), "w1": w1.T.astype(dtype), "b1": b1.astype(dtype)}


def _label_logits(prm: PRMConfig, params: dict, h: jax.Array) -> jax.Array:
    """[batch, len, 2] logits of (wrong, right) from final hidden states h [batch, len, d_model], float32."""
    dt = prm.decoder.compute_dtype
    h = h.astype(dt)
    if prm.layout == "prm_head":
        head = params["head"]
        x = jax.nn.relu(h @ head["w0"].astype(dt) + head["b0"].astype(dt))
        return (x @ head["w1"].astype(dt) + head["b1"].astype(dt)).astype(jnp.float32)
    lm, ids = params["lm"], jnp.array(prm.label_ids[::-1])  # (bad, good): class 1 is the good token
    kernel = lm["token_embedder"][ids].T if prm.decoder.tie_embeddings else lm["lm_head"][:, ids]  # [d_model, 2]
    return (h @ kernel.astype(dt)).astype(jnp.float32)


@functools.partial(jax.jit, static_argnums=0)
def _tag_probs(prm: PRMConfig, params: dict, ids: jax.Array, mask: jax.Array) -> jax.Array:
    h = Decoder(prm.decoder).apply({"params": params["lm"]}, ids, attention_mask=mask,
                                   method=Decoder.hidden_states)  # [batch, len, d_model]
    probs = jax.nn.softmax(_label_logits(prm, params, h), axis=-1)[..., 1]  # [batch, len]
    return jnp.where((ids == prm.step_tag_id) & mask, probs, jnp.nan)


def make_score_fn(prm: PRMConfig, params: dict) -> ScoreFn:
    """`score_fn(input_ids, attention_mask)` of a loaded PRM: `[batch, length]` float32 step probabilities at the
    tag positions, NaN elsewhere. Each row with real tokens must hold the tag at least once; rows and length are
    padded to buckets (all-pad rows, right padding, both dropped from the result)."""

    def score_fn(input_ids, attention_mask) -> np.ndarray:
        ids, mask = np.asarray(input_ids, np.int32), np.asarray(attention_mask).astype(bool)
        if ids.ndim != 2 or ids.shape != mask.shape:
            raise ValueError(f"input_ids {ids.shape} and attention_mask {mask.shape} must both be [batch, length]")
        untagged = np.flatnonzero(mask.any(axis=1) & ~((ids == prm.step_tag_id) & mask).any(axis=1))
        if untagged.size:
            raise ValueError(f"row {int(untagged[0])} holds no step tag (token id {prm.step_tag_id}); put the tag "
                             "after every step (qwen_prm_messages / math_shepherd_text) or pass the tag's id")
        real = mask.sum(axis=1)
        if real.size and real.max() > prm.decoder.max_positions:
            raise ValueError(f"row {int(real.argmax())} has {int(real.max())} tokens, over the model's "
                             f"max_position_embeddings {prm.decoder.max_positions}; shorten or split the solution")
        batch, length = ids.shape
        rows, cols = sampling.bucket_size(batch, minimum=1), sampling.bucket_size(length, minimum=16)
        padded_ids = np.zeros((rows, cols), np.int32)
        padded_mask = np.zeros((rows, cols), bool)
        padded_ids[:batch, :length], padded_mask[:batch, :length] = ids, mask
        return np.asarray(_tag_probs(prm, params, padded_ids, padded_mask))[:batch, :length]

    return score_fn
