"""The batch sampler against hand-worked stub models, sort-based reference distributions, a cache-free greedy
loop over the teacher-forced T5, and transformers' PyTorch `generate` on the same weights."""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _devices import run_report
from _helpers import compilations, import_torch
from _tolerance import NETWORK, PARITY, REORDER, assert_f32_close, check_close
from flax.linen import meta

from refiner_jax import sampling
from refiner_jax.models import t5_sampling
from refiner_jax.models.t5 import T5

# ---------------------------------------------------------------------------------------------------------------
from refiner_jax.models.t5_config import T5Config

# ---------------------------------------------------------------------------------------------------------------
# Stub models with hand-worked expected tokens (cf. the worked examples in `sampling.sample`'s docstring)

VOCAB = 16
EOS = 5


def _successor(tokens, index, cache):
    """Next token = input + 1 (mod VOCAB), with one-hot logits scaled by 10."""
    return jax.nn.one_hot((tokens + 1) % VOCAB, VOCAB) * 10.0, cache


def _position_successor(tokens, index, cache):
    """Next token = input + its position (mod VOCAB): the output reveals the index each token was fed at."""
    return jax.nn.one_hot((tokens + index) % VOCAB, VOCAB) * 10.0, cache + 1


def _prefers_eos(tokens, index, cache):
    """EOS first (logit 3), then token 7 (logit 2), whatever the input."""
    logits = jnp.zeros((tokens.shape[0], VOCAB)).at[:, EOS].set(3.0).at[:, 7].set(2.0)
    return logits, cache


@functools.partial(jax.jit, static_argnums=0, static_argnames=("max_new_tokens", "max_top_k"))
def _run(model, prompt, lengths=None, *, max_new_tokens, max_top_k=64, temperature=1.0, top_k=0, top_p=1.0,
         min_new_tokens=0):
    """One sample per prompt, its axis dropped: `[batch, 1, ...]` -> `[batch, ...]` leaves."""
    out = sampling.sample(model, jnp.zeros(()), jnp.asarray(prompt, jnp.int32), jax.random.key(0),
                          max_new_tokens=max_new_tokens, prompt_lengths=lengths, eos_id=EOS, pad_id=0,
                          temperature=temperature, top_k=top_k, top_p=top_p, min_new_tokens=min_new_tokens,
                          max_top_k=max_top_k)
    assert out.tokens.shape == (len(prompt), 1, max_new_tokens) and out.lengths.shape == (len(prompt), 1)
    return jax.tree.map(lambda x: x[:, 0], out)


def test_greedy_stops_at_eos_pads_after_it_and_stops_at_max_new_tokens():
    out = _run(_successor, jnp.asarray([[2], [7], [4]]), max_new_tokens=4, temperature=0.0)
    np.testing.assert_array_equal(out.tokens, [[3, 4, 5, 0], [8, 9, 10, 11], [5, 0, 0, 0]])
    np.testing.assert_array_equal(out.lengths, [3, 4, 1])
    lp = 10.0 - np.log(np.exp(10.0) + VOCAB - 1)  # log p(argmax) of one-hot logits scaled by 10
    # log_softmax of logits of size 10 (a sum over the vocabulary), then up to 4 of them summed.
    assert_f32_close(out.token_log_probs, np.where(np.arange(4) < out.lengths[:, None], lp, 0.0), ulps=REORDER,
                     scale=10.0, what="greedy token log-probs")
    assert_f32_close(out.log_prob, out.lengths * lp, ulps=REORDER, scale=4 * 10.0, what="greedy sequence log-probs")


def test_prompt_is_teacher_forced_and_fed_at_consecutive_positions():
    # Row 0 (length 2): feed 7@0 -> forced 3; 3@1 -> 4; 4@2 -> 6; 6@3 -> 9; 9@4 -> 13.
    # Row 1 (length 1, the 9 is padding): 2@0 -> 2; 2@1 -> 3; 3@2 -> 5 = EOS.
    prompt = jnp.asarray([[7, 3], [2, 9]])
    out = _run(_position_successor, prompt, jnp.asarray([2, 1]), max_new_tokens=4, temperature=0.0)
    np.testing.assert_array_equal(out.tokens, [[4, 6, 9, 13], [2, 3, 5, 0]])
    np.testing.assert_array_equal(out.lengths, [4, 3])
    # Without lengths every row has the full prompt: row 1 feeds 2@0 -> forced 9; 9@1 -> 10; 10@2 -> 12; ...
    out = _run(_position_successor, prompt, max_new_tokens=4, temperature=0.0)
    np.testing.assert_array_equal(out.tokens, [[4, 6, 9, 13], [10, 12, 15, 3]])


@pytest.mark.parametrize("knobs", [dict(temperature=0.0), dict(temperature=1.0, top_p=0.01)],
                         ids=["greedy", "top_p"])
def test_min_new_tokens_suppresses_eos(knobs):
    prompt = jnp.asarray([[2], [2]])
    out = _run(_prefers_eos, prompt, max_new_tokens=6, **knobs)
    np.testing.assert_array_equal(out.tokens, [[5, 0, 0, 0, 0, 0]] * 2)
    out = _run(_prefers_eos, prompt, max_new_tokens=6, min_new_tokens=3, **knobs)
    np.testing.assert_array_equal(out.tokens, [[7, 7, 7, 5, 0, 0]] * 2)
    np.testing.assert_array_equal(out.lengths, [4, 4])
    # Reported log-probs are the model's, unaffected by the EOS suppression.
    logz = np.log(np.exp(3.0) + np.exp(2.0) + VOCAB - 2)
    np.testing.assert_allclose(out.token_log_probs[0], [2 - logz] * 3 + [3 - logz, 0, 0], rtol=1e-5)


def test_log_probs_are_raw_model_log_probs_under_temperature_and_top_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = jnp.log(jnp.asarray(probs, jnp.float32))
    model = lambda t, i, c: (jnp.broadcast_to(logits, (t.shape[0], 4)), c)  # noqa: E731
    out = sampling.sample(model, None, jnp.zeros((8, 1), jnp.int32), jax.random.key(3), max_new_tokens=3,
                          num_samples=8, temperature=0.7, top_p=0.8, eos_id=3, pad_id=0, min_new_tokens=3)
    tokens = np.asarray(out.tokens)  # [8 prompts, 8 samples, 3]
    assert set(np.unique(tokens)) == {0, 1}  # the 0.8-nucleus of probs ** (1 / 0.7) is {0, 1}
    np.testing.assert_allclose(out.token_log_probs, np.log(probs)[tokens], rtol=1e-5)
    np.testing.assert_allclose(out.log_prob, np.log(probs)[tokens].sum(-1), rtol=1e-5)


def test_temperature_towards_zero_equals_greedy():
    table = jax.random.normal(jax.random.key(1), (50, 50))
    model = lambda t, i, c: (table[t], c)  # noqa: E731
    prompt = jnp.arange(8, dtype=jnp.int32)[:, None] + 2
    greedy = _run(model, prompt, max_new_tokens=12, temperature=0.0)
    for top_p in (1.0, 0.9):
        cold = _run(model, prompt, max_new_tokens=12, temperature=1e-4, top_p=top_p)
        np.testing.assert_array_equal(cold.tokens, greedy.tokens)
    # An empty nucleus keeps only the most likely token.
    np.testing.assert_array_equal(_run(model, prompt, max_new_tokens=12, top_p=0.0).tokens, greedy.tokens)


def test_top_k_above_bound_is_an_error():
    with pytest.raises(ValueError, match="max_top_k"):
        sampling.sample(_successor, None, jnp.asarray([[2]]), jax.random.key(0), max_new_tokens=2, top_k=100,
                        max_top_k=64, eos_id=EOS, pad_id=0)


def _offset_successor(tokens, index, cache):
    """Next token = input + the row's offset held in the cache `[n]` (mod VOCAB): each row reads its own cache."""
    return jax.nn.one_hot((tokens + cache) % VOCAB, VOCAB) * 10.0, cache


def test_num_samples_repeats_prompt_lengths_and_cache_per_prompt():
    """K samples of each prompt are rows `[batch, K]`: each reads its prompt's cache row and length (hand-worked)."""
    prompt = jnp.asarray([[7, 3], [2, 9]])
    # Row 0 (offset 1, length 2): 7 -> forced 3; 3 -> 4 -> 5 = EOS. Row 1 (offset 3, length 1): 2 -> 5 = EOS.
    out = sampling.sample(_offset_successor, jnp.asarray([1, 3]), prompt, jax.random.key(0), max_new_tokens=4,
                          num_samples=3, prompt_lengths=np.asarray([2, 1]), temperature=0.0, eos_id=EOS, pad_id=15)
    np.testing.assert_array_equal(out.tokens, [[[4, 5, 15, 15]] * 3, [[5, 15, 15, 15]] * 3])
    np.testing.assert_array_equal(out.lengths, [[2] * 3, [1] * 3])
    assert out.token_log_probs.shape == (2, 3, 4) and out.log_prob.shape == (2, 3)
    # first_logits [batch, vocab] after the whole prompt are repeated too: row 0 starts at 9, row 1 at 4.
    first = jax.nn.one_hot(jnp.asarray([9, 4]), VOCAB) * 10.0
    out = sampling.sample(_offset_successor, jnp.asarray([1, 3]), prompt, jax.random.key(0), max_new_tokens=3,
                          num_samples=2, first_logits=first, temperature=0.0, eos_id=(), pad_id=0)
    np.testing.assert_array_equal(out.tokens, [[[9, 10, 11]] * 2, [[4, 7, 10]] * 2])


def test_samples_of_a_prompt_are_consecutive_rows_of_one_loop():
    """`num_samples=K` on `batch` prompts draws what one sample each of the prompts repeated K times (row i*K+j =
    prompt i) draws with the same key; and the K samples differ."""
    table = jax.random.normal(jax.random.key(1), (VOCAB, VOCAB)) * 2.0
    model = lambda t, i, c: (table[t], c)  # noqa: E731
    prompt = jnp.asarray([[2], [9], [4]])
    kwargs = dict(max_new_tokens=6, temperature=1.0, top_p=0.95, eos_id=EOS, pad_id=0)
    grouped = sampling.sample(model, None, prompt, jax.random.key(4), num_samples=5, **kwargs)
    flat = sampling.sample(model, None, jnp.repeat(prompt, 5, axis=0), jax.random.key(4), **kwargs)
    for x, y in zip(jax.tree.leaves(grouped), jax.tree.leaves(flat)):
        np.testing.assert_array_equal(x, np.asarray(y).reshape(x.shape))
    assert all(len({tuple(s) for s in samples}) > 1 for samples in np.asarray(grouped.tokens))


@pytest.mark.parametrize("lengths,match", [([0, 1], r"prompt_lengths must each be in \[1, 2\]"),
                                           ([1, 3], r"prompt_lengths must each be in \[1, 2\]"),
                                           ([1, 1, 1], r"prompt_lengths must have shape \[batch=2\]")])
def test_out_of_range_prompt_lengths_are_an_error(lengths, match):
    with pytest.raises(ValueError, match=match):
        sampling.sample(_successor, None, jnp.asarray([[7, 3], [2, 9]]), jax.random.key(0), max_new_tokens=2,
                        prompt_lengths=np.asarray(lengths), eos_id=EOS, pad_id=0)


def test_end_and_pad_ids_are_required_and_num_samples_positive():
    for missing in ("eos_id", "pad_id"):
        ids = {"eos_id": EOS, "pad_id": 0}
        del ids[missing]
        with pytest.raises(TypeError, match=missing):
            sampling.sample(_successor, None, jnp.asarray([[2]]), jax.random.key(0), max_new_tokens=2, **ids)
    with pytest.raises(ValueError, match="num_samples must be an int >= 1"):
        sampling.sample(_successor, None, jnp.asarray([[2]]), jax.random.key(0), max_new_tokens=2, num_samples=0,
                        eos_id=EOS, pad_id=0)


# ---------------------------------------------------------------------------------------------------------------
# Sampling distributions against a sort-based reference (the textbook / transformers definition)

TAIL = 294
# Six large probabilities, then a tail of distinct small ones; ids shuffled so order does not follow ids.
_P = np.concatenate([[0.3, 0.2, 0.15, 0.1, 0.05, 0.05], 0.15 * np.linspace(2, 1, TAIL) / np.linspace(2, 1, TAIL).sum()])
_PERM = np.random.default_rng(0).permutation(_P.size)
PROBS = np.empty_like(_P)
PROBS[_PERM] = _P
DRAWS = 20000


def _reference(probs, temperature, top_k, top_p):
    """Sampling distribution by full sort: temperature, then top-k, then the smallest set reaching top_p."""
    p = probs ** (1.0 / temperature)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    q = p[order]
    if top_k:
        q[top_k:] = 0
        q /= q.sum()
    if top_p < 1:
        before = np.cumsum(q) - q
        q = np.where(before < top_p, q, 0.0)
    out = np.zeros_like(p)
    out[order] = q / q.sum()
    return out


@jax.jit
def _draw_tokens(logits, key, temperature, top_k, top_p):
    """DRAWS samples of one prompt (`num_samples`), one token each."""
    model = lambda t, i, c: (jnp.broadcast_to(logits, (t.shape[0], logits.shape[0])), c)  # noqa: E731
    return sampling.sample(model, None, jnp.zeros((1, 1), jnp.int32), key, max_new_tokens=1, num_samples=DRAWS,
                           temperature=temperature, top_k=top_k, top_p=top_p, eos_id=(), pad_id=0).tokens[0, :, 0]


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 0.7),  # nucleus of 4 tokens
    (1.0, 0, 0.95),  # nucleus of ~200 tokens ending inside the tail, at a distinct probability
    (2.0, 0, 0.9),  # temperature before top-p
    (1.0, 3, 1.0),  # top-k
    (1.0, 3, 0.6),  # top-p within the renormalised top-k
    (0.5, 0, 1.0),  # temperature alone
])
def test_sampling_distribution_matches_sort_reference(temperature, top_k, top_p):
    from scipy import stats

    tokens = np.asarray(_draw_tokens(jnp.log(jnp.asarray(PROBS, jnp.float32)), jax.random.key(7), temperature,
                                     top_k, top_p))
    expected = _reference(PROBS, temperature, top_k, top_p)
    counts = np.bincount(tokens, minlength=PROBS.size)
    assert counts[expected == 0].sum() == 0, "sampled a token outside the top-k / nucleus set"
    # Chi-square over tokens with enough expected draws, the remaining support pooled into one bin.
    big = expected * DRAWS >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum()) * DRAWS
    keep = wanted > 0
    assert stats.chisquare(observed[keep], wanted[keep] * observed.sum() / wanted.sum()).pvalue > 1e-4


@pytest.mark.parametrize("top_k", [0, 8, 12])
def test_tied_tokens_at_the_nucleus_boundary_are_all_kept(top_k):
    """Eight equally likely tokens (then four far less likely ones): any top-p inside them keeps all eight, with or
    without top-k, whatever their ids (bfloat16 logits tie often)."""
    from scipy import stats

    logits = jnp.asarray([0.0] * 8 + [-9.0] * 4, jnp.float32)
    tokens = np.asarray(_draw_tokens(logits, jax.random.key(3), 1.0, top_k, 0.5))
    counts = np.bincount(tokens, minlength=12)
    assert counts[8:].sum() == 0
    assert stats.chisquare(counts[:8]).pvalue > 1e-4  # uniform over all eight, not only the lowest ids


# ---------------------------------------------------------------------------------------------------------------
# T5: cache vs recompute, transformers parity, samples, compilations

# Equal encoder / decoder depth: transformers' generate cache assumes it.
CONFIG = T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0)
PROMPTS = np.array([[5, 9, 17, 33, 2, 41, 7, 1, 0, 0, 0, 0],
                    [12, 88, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0],
                    [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 1],
                    [2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
MAX_NEW = 10


def _make_params():
    """Random weights of the right shapes, built on the host (no init compilation). Kernels are 3x the usual
    1/sqrt(fan_in) scale so that greedy output is not one repeated token, and the EOS embedding is doubled so that
    some rows end early."""
    dummy = jnp.ones((1, 4), jnp.int32)
    shapes = meta.unbox(jax.eval_shape(T5(CONFIG).init, jax.random.key(0), dummy, dummy)["params"])
    rng = np.random.default_rng(0)

    def fill(path, leaf):
        if path[-1].key == "scale":
            return jnp.asarray(1.0 + 0.2 * rng.standard_normal(leaf.shape), jnp.float32)
        std = 1.0 if path[-1].key == "token_embedder" else 3.0 * leaf.shape[0] ** -0.5
        return jnp.asarray(std * rng.standard_normal(leaf.shape), jnp.float32)

    params = jax.tree_util.tree_map_with_path(fill, shapes)
    params["token_embedder"] = params["token_embedder"].at[1].multiply(2.0)
    return params


@pytest.fixture(scope="module")
def params():
    return _make_params()


@pytest.fixture(scope="module")
def greedy(params):
    return t5_sampling.sample_t5(params, PROMPTS, jax.random.key(0), config=CONFIG, max_new_tokens=MAX_NEW,
                                 temperature=0.0)


def _recompute_greedy(params, prompts, max_new_tokens):
    """Greedy decoding without a cache: rerun the teacher-forced model on the whole prefix for every token."""
    forward = jax.jit(lambda p, e, d: T5(CONFIG).apply({"params": p}, e, d))
    batch = prompts.shape[0]
    decoder_inputs = np.zeros((batch, max_new_tokens), np.int32)  # start token, then the generated tokens
    tokens = np.zeros((batch, max_new_tokens), np.int32)
    log_probs = np.zeros((batch, max_new_tokens), np.float32)
    done = np.zeros(batch, bool)
    for t in range(max_new_tokens):
        # Positions after t do not influence position t (causal decoder), so a fixed-width input suffices.
        logits = np.asarray(forward(params, prompts, decoder_inputs))[:, t]  # [batch, vocab]
        step = logits.argmax(-1)
        lp = logits[np.arange(batch), step] - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) \
            - logits.max(-1)
        tokens[:, t] = np.where(done, 0, step)
        log_probs[:, t] = np.where(done, 0.0, lp)
        done |= step == 1
        if t + 1 < max_new_tokens:
            decoder_inputs[:, t + 1] = step
    return tokens, log_probs


def test_t5_greedy_with_cache_equals_full_recompute(params, greedy):
    tokens, log_probs = _recompute_greedy(params, PROMPTS, MAX_NEW)
    out = greedy
    assert out.tokens.shape == (4, 1, MAX_NEW)
    np.testing.assert_array_equal(out.tokens[:, 0], tokens)
    assert_f32_close(out.token_log_probs[:, 0], log_probs, ulps=NETWORK, what="t5 cached vs recomputed log-probs")
    np.testing.assert_array_equal(out.lengths[:, 0], [np.flatnonzero(np.append(r, 1) == 1)[0] + 1 if
                                                      (r == 1).any() else MAX_NEW for r in tokens])


def test_t5_greedy_on_bucket_padded_prompts_equals_transformers_generate(params, greedy, tmp_path):
    torch = import_torch()
    transformers = pytest.importorskip("transformers")
    from refiner_jax.models import hf

    hf.save_t5(CONFIG, jax.device_get(params), tmp_path)
    reference = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    padded = sampling.pad_to_bucket(PROMPTS, buckets=(8, 16, 32))  # [4, 16]: pad keys are masked
    assert padded.shape == (4, 16)
    ids = torch.from_numpy(PROMPTS.astype(np.int64))
    for min_new in (0, 3):
        generation = transformers.GenerationConfig(
            do_sample=False, num_beams=1, max_new_tokens=MAX_NEW, min_new_tokens=min_new, decoder_start_token_id=0,
            pad_token_id=0, eos_token_id=1, return_dict_in_generate=True, output_logits=True)
        with torch.inference_mode():
            ref = reference.generate(input_ids=ids, attention_mask=(ids > 0).long(), generation_config=generation)
        ref_tokens = ref.sequences[:, 1:].numpy()  # drop the start token; rows padded with 0 after EOS
        steps = ref_tokens.shape[1]
        ref_tokens = np.pad(ref_tokens, ((0, 0), (0, MAX_NEW - steps)))
        out = t5_sampling.sample_t5(params, padded, jax.random.key(0), config=CONFIG, max_new_tokens=MAX_NEW,
                                    temperature=0.0, min_new_tokens=min_new)
        np.testing.assert_array_equal(out.tokens[:, 0], ref_tokens)
        # Model log-probs of the chosen tokens, from the reference's raw logits.
        ref_lp = np.stack([torch.log_softmax(step.float(), -1).numpy() for step in ref.logits], 1)  # [b, steps, V]
        ref_lp = np.take_along_axis(ref_lp, ref_tokens[:, :steps, None], -1)[..., 0]
        ref_lp = np.where(np.arange(steps) < np.asarray(out.lengths[:, :1]), ref_lp, 0.0)
        assert_f32_close(out.token_log_probs[:, 0, :steps], ref_lp, ulps=PARITY,
                         what=f"t5 greedy log-probs vs transformers (min_new_tokens {min_new})")
        if min_new == 0:
            # EOS is exercised (some rows end early) and padding the prompts changed nothing.
            assert (np.asarray(out.lengths) < MAX_NEW).any()
            np.testing.assert_array_equal(out.tokens, greedy.tokens)
        else:
            assert (np.asarray(out.lengths) > min_new).all()


def test_t5_samples_differ_are_deterministic_and_knobs_do_not_recompile(params):
    kwargs = dict(config=CONFIG, max_new_tokens=MAX_NEW, num_samples=4)
    with compilations() as compiles:
        a = t5_sampling.sample_t5(params, PROMPTS, jax.random.key(1), temperature=1.0, top_p=0.95, **kwargs)
        assert compiles  # the listener sees compilations (a first call with these shapes compiles)
        compiles.clear()
        b = t5_sampling.sample_t5(params, PROMPTS, jax.random.key(1), temperature=1.0, top_p=0.95, **kwargs)
        c = t5_sampling.sample_t5(params, PROMPTS, jax.random.key(2), temperature=1.0, top_p=0.95, **kwargs)
        for knobs in (dict(temperature=0.7, top_p=0.5), dict(temperature=1.3, top_k=5), dict(temperature=0.0),
                      dict(temperature=0.9, top_k=3, top_p=0.8, min_new_tokens=4)):
            t5_sampling.sample_t5(params, PROMPTS, jax.random.key(3), **knobs, **kwargs)
    assert compiles == []  # no XLA compilation after the first call
    assert a.tokens.shape == (4, 4, MAX_NEW) and a.log_prob.shape == (4, 4)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.tokens, c.tokens)
    for prompt in np.asarray(a.tokens):  # the K samples of each prompt are not all the same
        assert len({tuple(s) for s in prompt}) > 1


def test_t5_row_chunks_leave_greedy_outputs_unchanged(params, greedy):
    """Decoding the batch as groups of prompts, one loop per group, gives the one-loop result row for row."""
    for chunks in (2, 4):
        out = t5_sampling.sample_t5(params, PROMPTS, jax.random.key(0), config=CONFIG, max_new_tokens=MAX_NEW,
                                    temperature=0.0, row_chunks=chunks)
        np.testing.assert_array_equal(out.tokens, greedy.tokens)
        np.testing.assert_array_equal(out.lengths, greedy.lengths)
        assert_f32_close(out.token_log_probs, greedy.token_log_probs, ulps=NETWORK,
                         what=f"t5 log-probs in {chunks} row chunks")
    kwargs = dict(config=CONFIG, max_new_tokens=MAX_NEW, temperature=1.0, top_p=0.9, row_chunks=2)
    a = t5_sampling.sample_t5(params, PROMPTS, jax.random.key(5), **kwargs)
    b = t5_sampling.sample_t5(params, PROMPTS, jax.random.key(5), **kwargs)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    with pytest.raises(ValueError, match="row_chunks=3 must be a positive divisor of the batch size 4"):
        t5_sampling.sample_t5(params, PROMPTS, jax.random.key(0), config=CONFIG, max_new_tokens=MAX_NEW, row_chunks=3)


def _mesh_report() -> dict:
    """Run in a subprocess with 4 virtual CPU devices: `sample_t5` split over a mesh against unsplit calls."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    assert jax.device_count() == 4, jax.devices()
    params = _make_params()
    prompts = np.concatenate([PROMPTS, PROMPTS[::-1]])  # 8 prompts: 2 per device
    mesh = jax.make_mesh((2, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    kwargs = dict(config=CONFIG, max_new_tokens=MAX_NEW)
    report = {}
    greedy = t5_sampling.sample_t5(params, prompts, jax.random.key(0), temperature=0.0, **kwargs)
    split = t5_sampling.sample_t5(jax.device_put(params, NamedSharding(mesh, P())), prompts, jax.random.key(0),
                                  temperature=0.0, mesh=mesh, **kwargs)
    report["greedy_equal"] = bool(np.array_equal(greedy.tokens, split.tokens)
                                  and np.array_equal(greedy.lengths, split.lengths))
    # Products over 2 rows instead of 8 may round differently.
    expected = np.asarray(greedy.token_log_probs)
    report["greedy_log_prob_diff"] = float(np.abs(expected - np.asarray(split.token_log_probs)).max())
    report["greedy_log_prob_scale"] = float(np.abs(expected).max())
    report["tokens_spec"] = str(split.tokens.sharding.spec)
    report["rows_per_shard"] = sorted({s.data.shape[0] for s in split.tokens.addressable_shards})
    sampled = dict(temperature=1.0, top_p=0.9, num_samples=3, **kwargs)
    a = t5_sampling.sample_t5(params, prompts, jax.random.key(7), mesh=mesh, **sampled)
    compiles = []
    listener = lambda event, _duration, **_: compiles.append(event) if event.endswith("backend_compile_duration") \
        else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        b = t5_sampling.sample_t5(params, prompts, jax.random.key(7), mesh=mesh, **sampled)
        t5_sampling.sample_t5(params, prompts, jax.random.key(8), mesh=mesh,
                              **dict(sampled, temperature=0.7, top_p=0.5))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    report["recompiles"] = len(compiles)
    report["sampled_repeat_equal"] = bool(np.array_equal(a.tokens, b.tokens))
    # Device i (row-major over the mesh) samples its two prompts as an unsplit call with key fold_in(key, i).
    report["sampled_per_device_equal"] = [
        bool(np.array_equal(np.asarray(a.tokens)[2 * i:2 * i + 2], t5_sampling.sample_t5(
            params, prompts[2 * i:2 * i + 2], jax.random.fold_in(jax.random.key(7), i), **sampled).tokens))
        for i in range(4)]
    with pytest.raises(ValueError) as error:
        t5_sampling.sample_t5(params, prompts[:6], jax.random.key(0), mesh=mesh, **kwargs)
    report["bad_batch_error"] = str(error.value)
    report.update(_text_model_mesh_report(mesh))
    return report


def _text_model_mesh_report(mesh) -> dict:
    """`text_model.TextModel` with a mesh: its batches of 3 texts padded to 4 rows and split over the 4 devices, against
    the same model on one device."""
    from refiner_jax import text_model
    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset
    from refiner_jax.tokenizers import ByteTokenizer

    tok = ByteTokenizer()
    config = preset("t5-tiny", vocab_size=tok.vocab_size, num_layers=1)
    params = T5(config).init(jax.random.key(1), np.ones((1, 8), np.int32), np.ones((1, 8), np.int32))["params"]
    texts = ["first problem", "a second", "third one here", "four", "and the fifth"]
    one = text_model.TextModel(config, params, tok, max_input=16, max_output=6, batch_size=3)
    split = text_model.TextModel(config, params, tok, max_input=16, max_output=6, batch_size=3, mesh=mesh)
    calls = []
    sample_t5 = t5_sampling.sample_t5

    def recording(params, prompts, rng, **kwargs):
        out = sample_t5(params, prompts, rng, **kwargs)
        replicated_on = {len(x.sharding.device_set) for x in jax.tree.leaves(params) if x.sharding.is_fully_replicated}
        calls.append((prompts.shape[0], len(out.tokens.sharding.device_set), sorted(replicated_on)))
        return out

    t5_sampling.sample_t5 = recording
    try:
        want, want_lp = one.generate_with_log_probs(texts)
        got, got_lp = split.generate_with_log_probs(texts)
        sampled = split.generate(texts, num_samples=2, temperature=1.0, top_p=0.9, rng=jax.random.key(3))
    finally:
        t5_sampling.sample_t5 = sample_t5
    return {"text_model_greedy_equal": got == want,
            "text_model_log_prob_diff": float(np.abs(got_lp - want_lp).max()),
            "text_model_log_prob_scale": float(np.abs(want_lp).max()),
            "text_model_calls": calls,
            "text_model_sampled_shape": [len(sampled), sorted({len(s) for s in sampled})]}


@pytest.fixture(scope="module")
def mesh_report():
    return run_report(__file__, 4)


def test_t5_split_over_a_mesh_equals_unsplit_calls_per_device(mesh_report):
    """Each device of a 2 x 2 mesh decodes its slice of the prompts alone: greedy tokens are those of one device,
    sampled rows those of an unsplit call on the slice with the device's folded key."""
    r = mesh_report
    assert r["greedy_equal"], r
    check_close("t5 log-probs split over a mesh", r["greedy_log_prob_diff"], ulps=NETWORK,
                scale=r["greedy_log_prob_scale"])
    assert r["tokens_spec"] == "P(('a', 'b'),)" and r["rows_per_shard"] == [2], r
    assert r["sampled_repeat_equal"] and r["sampled_per_device_equal"] == [True] * 4, r
    assert r["recompiles"] == 0, r  # new key, temperature and top_p: the split programs are reused
    assert r["bad_batch_error"].startswith("batch size 6 must divide by the mesh's 4 devices"), r


def test_text_model_splits_its_batches_over_a_mesh(mesh_report):
    """`text_model.TextModel(mesh=...)` pads each batch of 3 texts to 4 rows, one per device, and generates what the
    same model does on one device."""
    r = mesh_report
    assert r["text_model_greedy_equal"], r
    check_close("text model log-probs over a mesh", r["text_model_log_prob_diff"], ulps=NETWORK,
                scale=r["text_model_log_prob_scale"])
    # (rows, devices, devices the parameters arrive replicated on) of each call: two batches (3 + 2 texts) of 3 rows
    # on one device, then of 4 rows over the 4, whose parameters the model replicated once, not per call
    assert r["text_model_calls"][:4] == [[3, 1, [1]], [3, 1, [1]], [4, 4, [4]], [4, 4, [4]]], r
    assert r["text_model_sampled_shape"] == [5, [2]], r


def test_auto_row_chunks_only_splits_large_decode_state_of_small_models_on_cpu():
    from refiner_jax.models.t5_config import preset

    tiny, small = preset("t5-tiny"), preset("t5-small")
    # t5-tiny: 2.29 MB of decoder weights (LM head included); each prompt of 128 tokens + 64 new ones caches
    # 2 layers x (K, V) x 4 heads x 32 x 192 floats = 393 KB. With 8 rows that is 5.4 MB, under the 8 MiB budget;
    # 16 rows (8.6 MB) are over it.
    assert [t5_sampling.auto_row_chunks(tiny, b, 128, 1, 64, "cpu") for b in (8, 16, 32, 128)] == [1, 2, 4, 16]
    assert t5_sampling.auto_row_chunks(tiny, 24, 128, 1, 64, "cpu") == 2  # 12 rows: 7.0 MB
    assert t5_sampling.auto_row_chunks(tiny, 25, 128, 1, 64, "cpu") == 1  # over budget, but no even split
    assert t5_sampling.auto_row_chunks(tiny, 32, 128, 8, 64, "cpu") == 1  # samples share their prompt's state
    assert t5_sampling.auto_row_chunks(tiny, 32, 128, 1, 64, "gpu") == 1
    assert t5_sampling.auto_row_chunks(small, 128, 128, 1, 64, "cpu") == 1  # weights alone exceed the budget


def test_bucket_sizes():
    assert [sampling.bucket_size(n) for n in (1, 8, 9, 100, 128, 129)] == [8, 8, 16, 128, 128, 256]
    assert sampling.bucket_size(20, (16, 48, 32)) == 32
    with pytest.raises(ValueError, match="largest bucket"):
        sampling.bucket_size(65, (16, 64))
    np.testing.assert_array_equal(sampling.pad_to_bucket(np.ones((3, 5)), axis=0, minimum=4),
                                  np.concatenate([np.ones((3, 5)), np.zeros((1, 5))]))


if __name__ == "__main__":
    print(json.dumps(_mesh_report()))
