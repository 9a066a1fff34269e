"""Batch sampling from autoregressive decoders inside one jitted `lax.while_loop` (no host sync per token).

`sample` is model-agnostic: it drives a `tokens_to_logits(tokens, index, cache) -> (logits, cache)` step callback
and serves the T5 decoder (`models.t5_sampling.sample_t5`), a decoder-only LM or any other model; it imports no
model. A prompt is either teacher-forced through the loop token by token, or prefilled by the model in one pass
whose last logits start the loop (`first_logits`; `models.decoder_sampling.sample_decoder`). K samples per prompt
(`num_samples`) are K rows of the same loop; every sampler returns `[batch, K, ...]` leaves, K = 1 included. The end
and pad ids are required arguments (the model samplers take them from the model's config). Decoding modes: greedy
(temperature 0), temperature, top-k, top-p (nucleus), and top-k with top-p; min/max new tokens; every sequence
stops at EOS (one id or several) and the loop exits once all have.

Temperature, top-k, top-p and min_new_tokens are traced values: changing them never recompiles. Nothing sorts
the vocabulary (on XLA:CPU, `jnp.sort` or `lax.top_k(x, vocab)` of 64 x 32k logits takes ~0.3-0.6 s, far more
than a T5-small decoder step):
  * top-k uses `lax.top_k(logits, max_top_k)` with a static bound (default 64) and masks ranks >= top_k; top_k
    is clamped to the bound (`sample` and the model samplers raise when a Python int top_k exceeds it). With top_k > 0
    the nucleus is taken inside the renormalised top-k set, so it always lies within the bound: exact.
  * top-p alone (top_k = 0) is exact for any nucleus size, without a bound: rejection sampling from the full
    distribution with an exact membership test (`_sample_nucleus`), a handful of passes over the logits per step
    (measured ~6 ms for 64 x 32k logits, less than `lax.top_k(x, 64)` itself). A bounded top-k-then-nucleus
    scheme would silently truncate flat distributions: a random-weight T5-small's top-0.5 nucleus holds ~5,000
    tokens, and trained models have such steps too.
  Ties at the nucleus boundary are all kept; the most likely token is always kept.

Returned log-probs are the model's own (log_softmax of the raw logits), not those of the temperature / top-k /
top-p / min-length modified distribution: they are what reranking, scoring and RL need.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from refiner_jax import cpu
from refiner_jax import sharding as shd

Cache = Any
# (tokens [n] int32, index scalar int32, cache) -> (logits [n, vocab], cache)
TokensToLogits = Callable[[jax.Array, jax.Array, Cache], tuple[jax.Array, Cache]]

_BLOCK = 32  # vocabulary block size of `_argmax` and of `_sample_nucleus`'s two-level draw (measured best)
_CANDIDATES = 15  # candidates per row and round of `_sample_nucleus` (2**k - 1: k passes decide them)
_MAX_ROUNDS = 64  # rejection rounds before an undecided row takes the most likely token


@flax.struct.dataclass
class SampleOutput:
    """Sampled continuations: `[batch, num_samples, ...]` leaves from every sampler (`sample`, `sample_t5`,
    `sample_decoder`, `LanguageModel.sample`), with `num_samples` = 1 kept as an axis of size 1."""

    tokens: jax.Array  # [batch, k, max_new_tokens] int32; pad after the end (EOS included when emitted)
    lengths: jax.Array  # [batch, k] int32 generated tokens, EOS included
    token_log_probs: jax.Array  # [batch, k, max_new_tokens] float32 model log-probs; 0 after the end
    log_prob: jax.Array  # [batch, k] float32 sum of token_log_probs


@flax.struct.dataclass
class _LoopState:
    step: jax.Array  # scalar int32: position of `token` in the decoder input stream
    token: jax.Array  # [n] int32 decoder input at `step`
    tokens: jax.Array  # [n, max_new] int32
    log_probs: jax.Array  # [n, max_new] float32
    num_new: jax.Array  # [n] int32 tokens generated so far
    done: jax.Array  # [n] bool
    cache: Cache


def repeat_rows(cache: Cache, num_samples: int) -> Cache:
    """The cache of `batch` prompts -> that of their `num_samples` samples each: every array leaf with a leading
    (row) axis repeated along it, a prompt's samples on consecutive rows; scalar leaves (a shared write index) kept.
    `sample`'s default `repeat_cache`."""
    if num_samples == 1:
        return cache
    return jax.tree.map(lambda x: jnp.repeat(x, num_samples, axis=0) if jnp.ndim(x) else x, cache)


def sample(tokens_to_logits: TokensToLogits, cache: Cache, prompt: jax.Array, rng: jax.Array, *,
           max_new_tokens: int, eos_id: int | Sequence[int], pad_id: int, num_samples: int = 1,
           prompt_lengths: jax.Array | None = None, temperature=1.0, top_k=0, top_p=1.0, min_new_tokens=0,
           max_top_k: int = 64, first_logits: jax.Array | None = None,
           repeat_cache: Callable[[Cache, int], Cache] = repeat_rows) -> SampleOutput:
    """Sample `num_samples` continuations of up to `max_new_tokens` tokens after each prompt row; a pure, jittable
    function returning `[batch, num_samples, ...]` leaves (see `SampleOutput`).

    The K samples of a prompt are K rows of one loop over n = batch * K rows, consecutive (rows i*K .. i*K+K-1
    belong to prompt i): `sample` repeats the prompt, `prompt_lengths`, `first_logits` and (with `repeat_cache`)
    the cache itself, so the caller builds them for the `batch` prompts.

    Args:
      tokens_to_logits: one decoder step. Called with the current input tokens `[n]` int32, their position `index`
        (scalar int32, 0 for `prompt[:, 0]`) and the cache of the n rows; returns next-token logits `[n, vocab]`
        and the cache.
      cache: initial cache of the `batch` prompts; once repeated it must hold `P + max_new_tokens - 1` positions.
      prompt: `[batch, P]` int32 decoder inputs fed before sampling starts: `[start_token]` for T5, the prompt for
        an LM (right-padded when `prompt_lengths` is given). Position 0 is fed first.
      rng: PRNG key; the same key gives the same samples.
      max_new_tokens: static length of the output.
      eos_id: the end token id, or several (a row ends at any of them; `()`: rows end at max_new_tokens). Required:
        a vocabulary's own ids, never a family's default.
      pad_id: the id written after a row's end. Required, as eos_id.
      num_samples: static K, samples per prompt (>= 1).
      prompt_lengths: `[batch]` int32 valid prompt tokens per row, each in [1, P]; None means all P. Checked when
        given as concrete values (host arrays or lists); traced values are the caller's to keep in range.
      temperature: 0 means greedy (argmax); otherwise logits are divided by it before top-k / top-p.
      top_k: 0 disables; else keep the k most likely tokens (at most max_top_k).
      top_p: 1 disables; else keep the smallest most-likely set whose probability reaches top_p (the top token is
        always kept). With top_k > 0 the nucleus is taken within the renormalised top-k set.
      min_new_tokens: EOS cannot be among the first `min_new_tokens` generated tokens.
      max_top_k: static bound of top_k (see the module docstring).
      first_logits: `[batch, vocab]` logits after the whole prompt, from a prefill that already wrote all P prompt
        positions into `cache` (a prompt whose rows are shorter is left-padded by the caller; `prompt_lengths` must
        be None). Sampling then starts from them and feeds only generated tokens, the first at index P; the prompt
        serves for its shape. Each step draws with the key of the same step of the prompt-feeding path.
      repeat_cache: `(cache of the batch prompts, K) -> cache of the n rows`; `repeat_rows` (the default) copies
        every row K times. A model whose K samples can read one copy of the prompt's keys and values passes its own
        (`models.decoder.share_prompt`).

    Returns:
      SampleOutput with `[batch, num_samples, ...]` leaves.

    Worked example (greedy; a model whose next token is always `input + 1`; eos_id=5, max_new_tokens=4):
      prompt [[2]]          -> tokens [[[3, 4, 5, 0]]], lengths [[3]]    (EOS emitted, then padding)
      prompt [[7]]          -> tokens [[[8, 9, 10, 11]]], lengths [[4]]  (max_new_tokens reached)
      prompt [[7, 3]], prompt_lengths [2]
                            -> inputs fed: 7, 3 (forced, not 8), 4;  tokens [[[4, 5, 0, 0]]], lengths [[2]]
      prompt [[7, 3]], first_logits predicting 4
                            -> inputs fed: 4;  tokens [[[4, 5, 0, 0]]], lengths [[2]]
      prompt [[2]], min_new_tokens=3 on a model that prefers EOS, then 7
                            -> tokens [[[7, 7, 7, 5]]], lengths [[4]]
      prompt [[2]], num_samples=2 -> tokens [[[3, 4, 5, 0], [3, 4, 5, 0]]] (greedy samples agree)
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if max_top_k < 1:
        raise ValueError(f"max_top_k must be >= 1, got {max_top_k}")
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    _check_top_k(top_k, max_top_k)
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be [batch, P] with P >= 1 (start token for T5), got shape {prompt.shape}")
    batch, prompt_len = prompt.shape
    if first_logits is not None and (prompt_lengths is not None or first_logits.shape[0] != batch):
        raise ValueError(f"first_logits [batch={batch}, vocab] comes after the whole prompt: left-pad it and pass "
                         f"prompt_lengths=None (got first_logits of shape {first_logits.shape})")
    if prompt_lengths is not None:
        _check_prompt_lengths(prompt_lengths, batch, prompt_len)
    knobs = dict(temperature=jnp.asarray(temperature, jnp.float32), top_k=jnp.asarray(top_k, jnp.int32),
                 top_p=jnp.asarray(top_p, jnp.float32), eos_ids=tuple(np.atleast_1d(eos_id).tolist()),
                 max_top_k=max_top_k)
    min_new_tokens = jnp.asarray(min_new_tokens, jnp.int32)
    # A prompt's samples are consecutive rows of the loop's n = batch * num_samples.
    n = batch * num_samples
    prompt = jnp.repeat(prompt, num_samples, axis=0)  # [n, P]
    lengths = None if prompt_lengths is None else jnp.repeat(jnp.asarray(prompt_lengths, jnp.int32), num_samples)
    if first_logits is not None:
        first_logits = jnp.repeat(first_logits, num_samples, axis=0)  # [n, vocab]
    cache = repeat_cache(cache, num_samples)
    forcing = prompt_len > 1 and first_logits is None
    rows = jnp.arange(n)

    def advance(state: _LoopState, logits: jax.Array) -> _LoopState:
        """The loop's step once the logits `[n, vocab]` after input `state.step` are known: the next input token
        (forced inside a prompt, else drawn), and the output it adds."""
        logits = logits.astype(jnp.float32)
        key = jax.random.fold_in(rng, state.step)
        token, log_prob = _next_token(logits, key, state.num_new >= min_new_tokens, **knobs)
        emit = ~state.done
        if forcing:
            forced_token = jax.lax.dynamic_index_in_dim(prompt, jnp.minimum(state.step + 1, prompt_len - 1),
                                                        axis=1, keepdims=False)  # [n]
            forced = state.step + 1 < (prompt_len if lengths is None else lengths)
            token = jnp.where(forced, forced_token, token)
            emit &= ~forced
        out_token = jnp.where(emit, token, pad_id)
        out_log_prob = jnp.where(emit, log_prob, 0.0)
        if lengths is None:  # every row writes the same column: a cheap dynamic update
            column = jnp.maximum(state.step + 1 - prompt_len, 0)
            tokens = jax.lax.dynamic_update_slice(state.tokens, out_token[:, None], (0, column))
            log_probs = jax.lax.dynamic_update_slice(state.log_probs, out_log_prob[:, None], (0, column))
        else:
            column = jnp.where(emit, state.num_new, max_new_tokens)  # out of range -> dropped
            tokens = state.tokens.at[rows, column].set(out_token, mode="drop")
            log_probs = state.log_probs.at[rows, column].set(out_log_prob, mode="drop")
        num_new = state.num_new + emit
        done = state.done | (emit & _is_eos(token, knobs["eos_ids"])) | (num_new >= max_new_tokens)
        return _LoopState(step=state.step + 1, token=token, tokens=tokens, log_probs=log_probs, num_new=num_new,
                          done=done, cache=state.cache)

    def body(state: _LoopState) -> _LoopState:
        logits, cache = tokens_to_logits(state.token, state.step, state.cache)
        return advance(state.replace(cache=cache), logits)

    def cond(state: _LoopState) -> jax.Array:
        return ~jnp.all(state.done)

    # With first_logits the loop starts at the prompt's last input, whose logits are already known.
    init = _LoopState(step=jnp.asarray(0 if first_logits is None else prompt_len - 1, jnp.int32),
                      token=prompt[:, 0 if first_logits is None else -1],
                      tokens=jnp.full((n, max_new_tokens), pad_id, jnp.int32),
                      log_probs=jnp.zeros((n, max_new_tokens), jnp.float32),
                      num_new=jnp.zeros((n,), jnp.int32), done=jnp.zeros((n,), bool), cache=cache)
    if first_logits is not None:
        init = advance(init, first_logits)
    final = jax.lax.while_loop(cond, body, init)
    out = SampleOutput(tokens=final.tokens, lengths=final.num_new, token_log_probs=final.log_probs,
                       log_prob=final.log_probs.sum(-1))
    return jax.tree.map(lambda x: x.reshape(batch, num_samples, *x.shape[1:]), out)


def _check_prompt_lengths(prompt_lengths, batch: int, width: int) -> None:
    """Raises unless `prompt_lengths` has shape [batch] and, when concrete, every entry lies in [1, width]."""
    if np.shape(prompt_lengths) != (batch,):
        raise ValueError(f"prompt_lengths must have shape [batch={batch}], got {np.shape(prompt_lengths)}")
    try:
        values = np.asarray(prompt_lengths)
    except jax.errors.TracerArrayConversionError:  # traced (inside jit): not checked
        return
    if values.size and (values.min() < 1 or values.max() > width):
        raise ValueError(f"prompt_lengths must each be in [1, {width}] (the prompt's width; a row needs at least "
                         f"one token, its start token for T5), got {values.tolist()}")




def _check_top_k(top_k, max_top_k: int) -> None:
    if isinstance(top_k, (int, np.integer)) and top_k > max_top_k:
        raise ValueError(f"top_k={top_k} exceeds max_top_k={max_top_k}; pass max_top_k >= {top_k}")


def _is_eos(tokens, eos_ids: tuple[int, ...]):
    """Whether each of `tokens` (any shape, int32) is one of the static `eos_ids` -> bool, same shape."""
    return functools.reduce(jnp.logical_or, [tokens == e for e in eos_ids], jnp.zeros(tokens.shape, bool))


def _next_token(logits, key, allow_eos, *, temperature, top_k, top_p, eos_ids, max_top_k):
    """Next token `[n]` and its model log-prob `[n]` from raw logits `[n, vocab]`."""
    vocab = logits.shape[-1]
    banned = _is_eos(jnp.arange(vocab), eos_ids) & ~allow_eos[:, None]  # [n, vocab]; applied inside each branch so
    # that XLA fuses it into the branch's first pass instead of materialising a masked copy of the logits.

    def sampled():
        scaled = jnp.where(banned, -jnp.inf, logits / temperature)
        return jax.lax.cond(top_k > 0, lambda: _sample_top_k(scaled, key, top_k, top_p, max_top_k),
                            lambda: _sample_nucleus(scaled, key, top_p))

    def greedy():
        return _argmax(jnp.where(banned, -jnp.inf, logits))

    # An empty nucleus (top_p <= 0) keeps only the most likely token, like temperature 0.
    token = jax.lax.cond((temperature > 0) & (top_p > 0), sampled, greedy)
    chosen = jnp.take_along_axis(logits, token[:, None], axis=-1)[:, 0]
    return token, chosen - jax.nn.logsumexp(logits, axis=-1)


def _argmax(x):
    """First index of the maximum of each row of `x` [n, vocab] -> [n] int32. A block maximum, then an argmax
    inside the winning block: 8x faster than `jnp.argmax` (a variadic reduce) on a 32k vocabulary on XLA:CPU."""
    n, vocab = x.shape
    num_blocks = -(-vocab // _BLOCK)
    blocks = jnp.pad(x, ((0, 0), (0, num_blocks * _BLOCK - vocab)), constant_values=-jnp.inf)
    blocks = blocks.reshape(n, num_blocks, _BLOCK)
    block = jnp.argmax(jnp.max(blocks, axis=-1), axis=-1)  # [n]
    inside = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]  # [n, block]
    return (block * _BLOCK + jnp.argmax(inside, axis=-1)).astype(jnp.int32)


def _sample_top_k(scaled, key, top_k, top_p, max_top_k):
    """Draw from softmax(scaled) `[n, vocab]` restricted to the top_k (<= max_top_k) most likely tokens, then to
    the top-p nucleus of that renormalised set; exact, found by `lax.top_k` with the static bound."""
    bound = min(max_top_k, scaled.shape[-1])
    values, indices = jax.lax.top_k(scaled, bound)  # [n, bound] descending
    rank = jnp.arange(bound)
    in_k = rank < top_k
    values = jnp.where(in_k, values, -jnp.inf)
    probs = jax.nn.softmax(values, axis=-1)  # [n, bound]
    # Probability of the strictly more likely tokens: tokens tied at the nucleus boundary are all kept, whatever
    # their ids (a cumulative sum over ranks would keep only the lowest ids of a tie).
    before = jnp.sum(jnp.where(values[:, None, :] > values[:, :, None], probs[:, None, :], 0.0), axis=-1)
    keep = in_k & ((before < top_p) | (rank == 0))
    pick = jax.random.categorical(key, jnp.where(keep, values, -jnp.inf))  # [n]
    return jnp.take_along_axis(indices, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)


def _sample_nucleus(scaled, key, top_p):
    """Exact draw from the top-p nucleus of softmax(scaled) `[n, vocab]` (all of it when top_p >= 1), no sort.

    Rejection sampling: candidates are drawn from the full distribution and candidate x is accepted iff the
    probability of the tokens more likely than x is below top_p, which is exactly nucleus membership; the first
    accepted candidate is distributed as the renormalised nucleus. Membership is monotone in x's probability, so
    each round sorts its `_CANDIDATES` (15) candidates and binary-searches the boundary among them: 4 passes over
    the vocabulary decide all 15. Each candidate is accepted with probability >= max(top_p, p_max), so a second
    round is rare ((1 - top_p)**15 per row). Draws use a two-level inverse CDF (block sums, then a scan inside the
    chosen block) rather than one Gumbel variate per vocabulary entry. Cost: about 8 passes over the logits,
    whatever the nucleus size; `lax.top_k` alone costs more.
    """
    n, vocab = scaled.shape
    weights = jnp.exp(scaled - jnp.max(scaled, axis=-1, keepdims=True))  # [n, vocab] unnormalised probabilities
    num_blocks = -(-vocab // _BLOCK)
    blocks = jnp.pad(weights, ((0, 0), (0, num_blocks * _BLOCK - vocab))).reshape(n, num_blocks, _BLOCK)
    block_mass = blocks.sum(-1)  # [n, blocks]
    block_cum = jax.lax.associative_scan(jnp.add, block_mass, axis=-1)  # jnp.cumsum is quadratic on XLA:CPU
    total = block_cum[:, -1]  # [n]
    last_block = num_blocks - 1 - jnp.argmax((block_mass > 0)[:, ::-1], axis=-1)  # [n] last block with mass
    rows = jnp.arange(n)

    def draw(round_key):  # -> [n, C] candidate token ids, each distributed as softmax(scaled)
        u = jax.random.uniform(round_key, (n, _CANDIDATES)) * total[:, None]  # [n, C]
        block = jnp.minimum(jnp.sum(block_cum[:, None, :] <= u[..., None], axis=-1), last_block[:, None])
        start = jnp.where(block > 0, jnp.take_along_axis(block_cum, jnp.maximum(block - 1, 0), axis=-1), 0.0)
        inside = jnp.take_along_axis(blocks, block[..., None], axis=1)  # [n, C, block]
        inside_cum = jnp.cumsum(inside, axis=-1)
        last = _BLOCK - 1 - jnp.argmax((inside > 0)[..., ::-1], axis=-1)  # [n, C] last token with mass
        offset = jnp.minimum(jnp.sum(inside_cum <= (u - start)[..., None], axis=-1), last)
        return block * _BLOCK + offset

    def accept(candidates):  # [n, C] -> [n, C] bool
        w = jnp.take_along_axis(weights, candidates, axis=-1)  # [n, C]
        desc = -jnp.sort(-w, axis=-1)  # the mass above desc[:, j] grows with j
        limit = top_p * total

        def search(_, bounds):  # invariant: desc[lo - 1] accepted (lo = 0: none yet), desc[hi] rejected
            lo, hi = bounds
            mid = (lo + hi) // 2
            threshold = desc[rows, jnp.minimum(mid, _CANDIDATES - 1)]
            ok = jnp.sum(jnp.where(weights > threshold[:, None], weights, 0.0), axis=-1) < limit
            return jnp.where(ok, mid + 1, lo), jnp.where(ok, hi, mid)

        steps = int(np.ceil(np.log2(_CANDIDATES + 1)))
        lo, _ = jax.lax.fori_loop(0, steps, search, (jnp.zeros(n, jnp.int32), jnp.full(n, _CANDIDATES, jnp.int32)))
        smallest = desc[rows, jnp.maximum(lo - 1, 0)]  # lo = number of accepted candidate values
        return (lo[:, None] > 0) & (w >= smallest[:, None])

    def body(state):
        round_, token, done = state
        candidates = draw(jax.random.fold_in(key, round_))
        ok = jax.lax.cond(top_p < 1, accept, lambda c: jnp.ones(c.shape, bool), candidates)  # [n, C]
        found = ok.any(-1) & ~done
        first = jnp.take_along_axis(candidates, jnp.argmax(ok, axis=-1)[:, None], axis=-1)[:, 0]
        return round_ + 1, jnp.where(found, first, token), done | found

    def cond(state):
        round_, _, done = state
        return (round_ < _MAX_ROUNDS) & ~jnp.all(done)

    init = (jnp.zeros((), jnp.int32), jnp.zeros((n,), jnp.int32), jnp.zeros((n,), bool))
    _, token, done = jax.lax.while_loop(cond, body, init)
    # Rows still undecided (tiny top_p on a flat distribution): the most likely token, always in the nucleus.
    token = jax.lax.cond(jnp.all(done), lambda: token,
                         lambda: jnp.where(done, token, _argmax(scaled)))
    return token.astype(jnp.int32)


# ----------------------------------------------------------------------------------------------------------------
# Model samplers' shared pieces: traced knobs, compiler options, and splitting prompts over a mesh


# On CPU the decode loop's matmuls go to Eigen rather than YNNPACK (which keeps the reductions). Their few rows
# meet weights streamed from memory on every step; measured on 2 cores with weights out of cache, t5-small decoder
# products of 32 rows run 1.4-2.1x faster in Eigen. Interleaved runs of the decode program: t5-small greedy 23%
# less time, t5-tiny greedy 14% and top-p 11% less, t5-small top-p 3% more (within the spread). The encoder's
# large products are faster in YNNPACK, so `models.t5_sampling` compiles it apart, with the defaults. Which is
# faster depends on the CPU and the model (gpt2-small decodes faster with YNNPACK on an AVX-512 Xeon,
# docs/performance.md), and the two round differently: `REFINER_JAX_DECODE_PRODUCTS=ynnpack` keeps XLA's defaults.
_CPU_DECODE_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}


@functools.cache
def decode_options(platform: str) -> dict | None:
    """`_CPU_DECODE_OPTIONS` on CPU when this XLA knows them and `REFINER_JAX_DECODE_PRODUCTS` is unset or `eigen`,
    else None (the defaults). Read once, at the first compile of a sampler."""
    choice = os.environ.get(cpu.DECODE_PRODUCTS, "eigen")
    if choice not in cpu.DECODE_PRODUCTS_CHOICES:
        raise ValueError(f"{cpu.DECODE_PRODUCTS}={choice!r}: use one of {cpu.DECODE_PRODUCTS_CHOICES}")
    if platform != "cpu" or choice == "ynnpack":
        return None
    try:
        jax.jit(lambda x: x + 1, compiler_options=_CPU_DECODE_OPTIONS).lower(jnp.zeros(())).compile()
    except jax.errors.JaxRuntimeError:
        return None
    return _CPU_DECODE_OPTIONS


def traced_knobs(temperature, top_k, top_p, min_new_tokens, max_top_k: int) -> tuple[jax.Array, ...]:
    """The sampling knobs as arrays, passed to a compiled sampler as arguments so that new values reuse it; raises
    when a Python int top_k exceeds the static bound."""
    _check_top_k(top_k, max_top_k)
    return (jnp.asarray(temperature, jnp.float32), jnp.asarray(top_k, jnp.int32), jnp.asarray(top_p, jnp.float32),
            jnp.asarray(min_new_tokens, jnp.int32))


def check_split(batch: int, mesh: Mesh | None) -> tuple[int, str]:
    """(devices the prompts are split over, their platform); raises when the batch does not divide by them."""
    devices = 1 if mesh is None else mesh.size
    if batch % devices:
        raise ValueError(f"batch size {batch} must divide by the mesh's {devices} devices; pad the batch with "
                         f"all-pad rows (`pad_to_bucket(tokens, [{-(-batch // devices) * devices}], axis=0)`)")
    return devices, jax.default_backend() if mesh is None else mesh.devices.flat[0].platform


def split_rows(fn: Callable, mesh: Mesh, rows: Sequence[bool], rng_arg: int | None = None) -> Callable:
    """`fn` on every device of `mesh` (unjitted `shard_map`), each on its slice of the prompts: the arguments flagged
    in `rows`, and every output, split along their leading axis over all the mesh's axes; the others replicated.
    Argument `rng_arg` (a key) is folded with the device's index in the mesh, so that each device draws its own
    samples. No communication between devices."""
    spec = P(mesh.axis_names)

    def local(*args):
        if rng_arg is None:
            return fn(*args)
        rng = jax.random.fold_in(args[rng_arg], jax.lax.axis_index(mesh.axis_names))
        return fn(*args[:rng_arg], rng, *args[rng_arg + 1:])

    # check_vma=False: a sampling loop's state starts as per-device constants (caches, counters) that become
    # per-device values; every input and output here is either replicated or split along the batch.
    return jax.shard_map(local, mesh=mesh, in_specs=tuple(spec if split else P() for split in rows), out_specs=spec,
                         check_vma=False)


def replicate(params, mesh: Mesh):
    """`params` replicated over `mesh`'s devices, as the model samplers take them (`mesh=mesh`) without a copy per
    call."""
    return jax.tree.map(lambda x: shd.place(x, NamedSharding(mesh, P())), params)


def place_rows(tree, mesh: Mesh):
    """`tree`'s arrays split along their leading axis over all of `mesh`'s axes (a sampler's prompts)."""
    return jax.tree.map(lambda x: shd.place(x, NamedSharding(mesh, P(mesh.axis_names))), tree)


# ----------------------------------------------------------------------------------------------------------------
# Length buckets


def bucket_size(size: int, buckets: Sequence[int] | None = None, minimum: int = 8) -> int:
    """The smallest of `buckets` that is >= size; with no buckets, the next power of two (at least `minimum`)."""
    if buckets is None:
        return max(minimum, 1 << max(0, int(size) - 1).bit_length())
    fitting = [b for b in sorted(buckets) if b >= size]
    if not fitting:
        raise ValueError(f"size {size} exceeds the largest bucket {max(buckets)}; add a larger bucket")
    return fitting[0]


def pad_to_bucket(tokens, buckets: Sequence[int] | None = None, axis: int = -1, pad_id: int = 0,
                  minimum: int = 8) -> np.ndarray:
    """Pad `tokens` with `pad_id` along `axis` up to `bucket_size`, so a stream of varying lengths reuses a few
    compiled programs. Padding the prompt axis leaves T5 outputs unchanged (pad keys are masked); padding the batch
    axis adds all-pad rows whose outputs should be dropped."""
    tokens = np.asarray(tokens)
    axis = axis % tokens.ndim
    target = bucket_size(tokens.shape[axis], buckets, minimum)
    widths = [(0, 0)] * tokens.ndim
    widths[axis] = (0, target - tokens.shape[axis])
    return np.pad(tokens, widths, constant_values=pad_id)
