"""`sample_decoder` (prefill once, then the shared sampling loop) against transformers' `generate` and teacher-forced
log-probs on a PyTorch GPT-2, Llama (grouped-query attention) and Mistral (a sliding window of 4 tokens, shorter than
the prompts plus their continuations) built locally with random weights, and on an instruct-style checkpoint whose
`generation_config.json` lists two end tokens; against the
same model fed its prompt token by token through `sampling.sample`; and split over a mesh of 2 host devices. Also
`sampling.sample`'s `first_logits` start against its prompt-feeding path, on a stub model."""
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _devices import run_report
from _helpers import compilations, decode_step, import_torch, padded_prompts
from _tolerance import NETWORK, PARITY, REORDER, assert_f32_close, check_close
from flax.linen import meta

from refiner_jax import sampling
from refiner_jax.models import hf_decoder
from refiner_jax.models.decoder import Decoder, init_cache
from refiner_jax.models.decoder_config import preset
from refiner_jax.models.decoder_sampling import pad_id, sample_decoder

LENGTHS = (7, 2, 5, 4)  # real tokens of the 4 prompts, left-padded to 7
MAX_NEW = 8


@pytest.fixture(scope="module", params=["gpt2", "llama", "mistral"])
def family(request, tmp_path_factory):
    """A random transformers model (the configs and weights of test_decoder) and our import of it."""
    transformers = pytest.importorskip("transformers")
    from test_decoder import HF_CONFIGS, _randomise

    ref = _randomise(transformers.AutoModelForCausalLM.from_config(HF_CONFIGS[request.param]()), seed=7)
    directory = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(directory)
    config, params = hf_decoder.load_decoder(directory)
    return types.SimpleNamespace(name=request.param, ref=ref, config=config, params=params)


def _generate(ref, tokens, mask, config, **generation):
    """transformers' greedy `generate`: new tokens `[b, steps]` (it stops once every row has ended) and the model
    log-probs `[b, steps, vocab]` of each step."""
    import torch

    with torch.no_grad():
        out = ref.generate(input_ids=torch.tensor(tokens, dtype=torch.long), do_sample=False,
                           attention_mask=torch.tensor(mask, dtype=torch.long), max_new_tokens=MAX_NEW,
                           eos_token_id=list(config.eos_ids), pad_token_id=pad_id(config),
                           return_dict_in_generate=True, output_logits=True, **generation)
    log_probs = torch.log_softmax(torch.stack(out.logits, 1).float(), -1).numpy()
    return out.sequences[:, tokens.shape[1]:].numpy(), log_probs


def test_greedy_equals_transformers_generate_with_several_eos_ids(family):
    """Left-padded prompts of different lengths; two end tokens that the model emits, so rows end early (and not at
    all when min_new_tokens bans them). Tokens, padding after the end and log-probs match transformers."""
    tokens, mask = padded_prompts(family.config.vocab_size, LENGTHS, "left")
    free, _ = _generate(family.ref, tokens, mask, family.config.replace(eos_id=()))
    config = family.config.replace(eos_id=(int(free[0, 2]), int(free[2, 4])))
    for min_new in (0, MAX_NEW):
        theirs, log_probs = _generate(family.ref, tokens, mask, config, min_new_tokens=min_new)
        out = sample_decoder(family.params, tokens, jax.random.key(0), config=config, max_new_tokens=MAX_NEW,
                             temperature=0.0, min_new_tokens=min_new, prompt_mask=mask)
        ours, lengths = np.asarray(out.tokens[:, 0]), np.asarray(out.lengths[:, 0])
        print(f"{family.name} min_new_tokens={min_new}: ours {ours.tolist()}, transformers {theirs.tolist()}")
        steps = theirs.shape[1]
        np.testing.assert_array_equal(ours[:, :steps], theirs)
        assert (ours[:, steps:] == pad_id(config)).all()
        expected = np.where(np.arange(steps) < lengths[:, None],
                            np.take_along_axis(log_probs, theirs[..., None], -1)[..., 0], 0.0)
        assert_f32_close(out.token_log_probs[:, 0, :steps], expected, ulps=PARITY,
                         what=f"{family.name} greedy log-probs vs transformers")
        # Sums of log-probs (all <= 0): a row's sum bounds the magnitude of its terms.
        assert_f32_close(out.log_prob[:, 0], expected.sum(-1), ulps=PARITY,
                         what=f"{family.name} greedy sequence log-probs vs transformers")
        ended = lengths < MAX_NEW
        assert not ended.any() if min_new else ended.any()
        assert np.isin(ours[np.arange(4), lengths - 1][ended], config.eos_ids).all()


def test_generation_config_end_tokens_stop_where_transformers_stops(tmp_path):
    """An instruct-style checkpoint: config.json ends at A, generation_config.json at A or B and pads with P. Loaded,
    our greedy rows stop at either end token and pad with P, where transformers' `generate` (reading the same file)
    does; config.json's end token alone would not stop row 0 at B."""
    torch = import_torch()
    transformers = pytest.importorskip("transformers")
    from test_decoder import HF_CONFIGS, _randomise

    ref = _randomise(transformers.AutoModelForCausalLM.from_config(HF_CONFIGS["mistral"]()), seed=11)
    ref.save_pretrained(tmp_path)
    plain, params = hf_decoder.load_decoder(tmp_path)
    tokens, mask = padded_prompts(plain.vocab_size, LENGTHS, "left", seed=2)

    def greedy(config):
        out = sample_decoder(params, tokens, jax.random.key(0), config=config, max_new_tokens=MAX_NEW,
                             temperature=0.0, prompt_mask=mask)
        return np.asarray(out.tokens[:, 0]), np.asarray(out.lengths[:, 0])

    free, _ = greedy(plain.replace(eos_id=()))
    end_a, end_b, pad = plain.eos_id, int(free[0, 2]), 5  # B: what row 0 first emits at step 2
    assert end_b not in free[0, :2] and end_a not in free[0, :3] and end_b != end_a, free
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": [end_a, end_b], "pad_token_id": pad}))
    config, _ = hf_decoder.load_decoder(tmp_path)
    assert (config.eos_ids, config.pad_id, plain.eos_ids) == ((end_a, end_b), pad, (end_a,))
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        theirs = ref.generate(input_ids=torch.tensor(tokens, dtype=torch.long), max_new_tokens=MAX_NEW,
                              attention_mask=torch.tensor(mask, dtype=torch.long), do_sample=False)
    theirs = theirs[:, tokens.shape[1]:].numpy()
    ours, lengths = greedy(config)
    print(f"generation_config end tokens {config.eos_ids}: ours {ours.tolist()}, transformers {theirs.tolist()}")
    np.testing.assert_array_equal(ours[:, :theirs.shape[1]], theirs)
    assert (ours[:, theirs.shape[1]:] == pad).all() and (ours[0, 3:] == pad).all()
    assert lengths[0] == 3 and greedy(plain)[1][0] > 3


def _teacher_forced_log_probs(ref, tokens, mask, new):
    """transformers' log-probs `[b, new_len]` of the continuations `new` `[b, new_len]` after the prompts."""
    import torch

    full = np.concatenate([tokens, new], 1)
    full_mask = np.concatenate([mask, np.ones_like(new, bool)], 1)
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor(full, dtype=torch.long),
                     attention_mask=torch.tensor(full_mask, dtype=torch.long),
                     position_ids=torch.tensor(np.maximum(np.cumsum(full_mask, 1) - 1, 0), dtype=torch.long)).logits
    log_probs = torch.log_softmax(logits.float(), -1).numpy()[:, tokens.shape[1] - 1:-1]
    return np.take_along_axis(log_probs, new[..., None], -1)[..., 0]


def test_samples_are_deterministic_scored_like_transformers_and_knobs_do_not_recompile(family):
    tokens, mask = padded_prompts(family.config.vocab_size, LENGTHS, "left", seed=1)
    kwargs = dict(config=family.config, max_new_tokens=MAX_NEW, num_samples=3, prompt_mask=mask)
    a = sample_decoder(family.params, tokens, jax.random.key(1), temperature=1.0, top_p=0.9, **kwargs)
    with compilations() as compiles:
        b = sample_decoder(family.params, tokens, jax.random.key(1), temperature=1.0, top_p=0.9, **kwargs)
        c = sample_decoder(family.params, tokens, jax.random.key(2), temperature=1.0, top_p=0.9, **kwargs)
        for knobs in (dict(temperature=0.7, top_p=0.5), dict(temperature=1.3, top_k=5), dict(temperature=0.0),
                      dict(temperature=0.9, top_k=3, top_p=0.8, min_new_tokens=4)):
            sample_decoder(family.params, tokens, jax.random.key(3), **knobs, **kwargs)
    assert compiles == []  # new keys and knobs reuse the program
    assert a.tokens.shape == (4, 3, MAX_NEW) and a.log_prob.shape == (4, 3)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.tokens, c.tokens)
    assert all(len({tuple(s) for s in prompt}) > 1 for prompt in np.asarray(a.tokens))
    # The returned log-probs are the model's: transformers' teacher-forced log-softmax of the sampled tokens.
    new = np.asarray(a.tokens).reshape(12, MAX_NEW)
    expected = _teacher_forced_log_probs(family.ref, np.repeat(tokens, 3, 0), np.repeat(mask, 3, 0), new)
    expected = np.where(np.arange(MAX_NEW) < np.asarray(a.lengths).reshape(12, 1), expected, 0.0)
    assert_f32_close(np.asarray(a.log_prob).reshape(12), expected.sum(-1), ulps=PARITY,
                     what=f"{family.name} sampled sequence log-probs vs transformers")


def test_shared_prompt_cache_samples_like_transformers(family):
    """`share_prompt_cache`: each prompt's keys and values kept once and read by all its samples (one softmax over
    the prompt's shared slots and the row's own). Greedy samples equal transformers' `generate` in every one of a
    prompt's rows, and sampled ones are scored by transformers' teacher-forced log-softmax, as without sharing:
    left-padded prompts, grouped-query heads (llama) and a window shorter than prompt plus continuation (mistral)."""
    config = family.config.replace(share_prompt_cache=True)
    tokens, mask = padded_prompts(config.vocab_size, LENGTHS, "left", seed=1)
    kwargs = dict(config=config, max_new_tokens=MAX_NEW, num_samples=3, prompt_mask=mask)
    greedy = sample_decoder(family.params, tokens, jax.random.key(0), temperature=0.0, min_new_tokens=MAX_NEW,
                            **kwargs)
    theirs, _ = _generate(family.ref, tokens, mask, config, min_new_tokens=MAX_NEW)
    np.testing.assert_array_equal(np.asarray(greedy.tokens), np.repeat(theirs[:, None], 3, axis=1))
    sampled = sample_decoder(family.params, tokens, jax.random.key(1), temperature=1.0, top_p=0.9, **kwargs)
    assert all(len({tuple(s) for s in prompt}) > 1 for prompt in np.asarray(sampled.tokens))
    new = np.asarray(sampled.tokens).reshape(12, MAX_NEW)
    expected = _teacher_forced_log_probs(family.ref, np.repeat(tokens, 3, 0), np.repeat(mask, 3, 0), new)
    expected = np.where(np.arange(MAX_NEW) < np.asarray(sampled.lengths).reshape(12, 1), expected, 0.0)
    assert_f32_close(np.asarray(sampled.token_log_probs).reshape(12, MAX_NEW), expected, ulps=PARITY,
                     what=f"{family.name} shared-prompt sampled log-probs vs transformers")


def test_first_logits_continue_the_prompt_feeding_path_step_for_step():
    """`sample` started from the logits after the prompt == `sample` feeding the prompt: same inputs at the same
    indices, same keys (so the same samples), only the prompt's steps skipped. Stub model: logits = table[input +
    index], so every output depends on the index each token is fed at."""
    table = 3.0 * jax.random.normal(jax.random.key(4), (64, 64))
    model = lambda t, i, c: (table[(t + i) % 64], c)  # noqa: E731
    prompt = jnp.asarray(np.random.default_rng(2).integers(0, 64, (6, 5)), jnp.int32)
    first_logits = table[(prompt[:, -1] + 4) % 64]  # after the last prompt token, fed at index 4

    @jax.jit
    def both(temperature):
        kwargs = dict(max_new_tokens=7, temperature=temperature, top_p=0.9, eos_id=(3, 11), pad_id=0)
        fed = sampling.sample(model, None, prompt, jax.random.key(5), **kwargs)
        started = sampling.sample(model, None, prompt, jax.random.key(5), first_logits=first_logits, **kwargs)
        return fed, started

    for temperature in (0.0, 1.0):
        fed, started = both(temperature)
        for x, y in zip(jax.tree.leaves(fed), jax.tree.leaves(started)):
            assert_f32_close(y, x, ulps=REORDER, what=f"first_logits start vs prompt feeding (T={temperature})")
    assert (np.asarray(fed.lengths) < 7).any()  # some rows end at one of the two EOS ids
    with pytest.raises(ValueError, match="first_logits"):
        sampling.sample(model, None, prompt, jax.random.key(0), max_new_tokens=2, first_logits=first_logits,
                        prompt_lengths=jnp.full((6,), 5), eos_id=(3, 11), pad_id=0)


def _random_params(config, seed: int = 0) -> dict:
    shapes = jax.eval_shape(lambda: Decoder(config).init(jax.random.key(0), jnp.ones((1, 1), jnp.int32)))
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: 0.3 * rng.standard_normal(s.shape, np.float32), meta.unbox(shapes["params"]))


TINY = preset("llama-tiny", vocab_size=97, eos_id=(16, 40))  # two tokens of its greedy continuations below


def test_prefill_equals_feeding_the_prompt_token_by_token():
    """One prefill pass of left-padded prompts, then the loop, == `sample` teacher-forcing the right-padded prompts
    through `decode_step` one token at a time; and right-padded prompts prefilled give the same tokens."""
    params = _random_params(TINY)
    left, left_mask = padded_prompts(TINY.vocab_size, LENGTHS, "left")
    right, right_mask = padded_prompts(TINY.vocab_size, LENGTHS, "right")

    @jax.jit
    def token_by_token(params, prompt, lengths):
        return sampling.sample(lambda t, i, c: decode_step(TINY, params, t, c),
                               init_cache(TINY, prompt.shape[0], prompt.shape[1] + MAX_NEW - 1), prompt,
                               jax.random.key(0), max_new_tokens=MAX_NEW, prompt_lengths=lengths, temperature=0.0,
                               eos_id=TINY.eos_ids, pad_id=pad_id(TINY))

    fed = token_by_token(params, right, right_mask.sum(1))
    for tokens, mask in ((left, left_mask), (right, right_mask)):
        out = sample_decoder(params, tokens, jax.random.key(0), config=TINY, max_new_tokens=MAX_NEW,
                             temperature=0.0, prompt_mask=mask)
        np.testing.assert_array_equal(out.tokens, fed.tokens)  # both [batch, 1, MAX_NEW]
        np.testing.assert_array_equal(out.lengths, fed.lengths)
        assert_f32_close(out.token_log_probs, fed.token_log_probs, ulps=NETWORK,
                         what="prefilled vs token-by-token log-probs")
    assert (np.asarray(fed.lengths) < MAX_NEW).any()  # EOS (one of two ids) ends some rows


def _mesh_report() -> dict:
    """Run in a subprocess with 2 host devices: `sample_decoder` split over a mesh against unsplit calls."""
    assert jax.device_count() == 2, jax.devices()
    params = _random_params(TINY)
    tokens, mask = padded_prompts(TINY.vocab_size, LENGTHS, "left")
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    kwargs = dict(config=TINY, max_new_tokens=MAX_NEW, prompt_mask=mask)
    greedy = sample_decoder(params, tokens, jax.random.key(0), temperature=0.0, **kwargs)
    split = sample_decoder(sampling.replicate(params, mesh), tokens, jax.random.key(0), temperature=0.0, mesh=mesh,
                           **kwargs)
    sampled = dict(kwargs, temperature=1.0, top_p=0.9, num_samples=2, mesh=mesh)
    a = sample_decoder(params, tokens, jax.random.key(7), **sampled)
    device_1 = sample_decoder(params, tokens[2:], jax.random.fold_in(jax.random.key(7), 1),
                              **dict(sampled, mesh=None, prompt_mask=mask[2:]))
    return {"greedy_equal": bool(np.array_equal(greedy.tokens, split.tokens)
                                 and np.array_equal(greedy.lengths, split.lengths)),
            "log_prob_diff": float(np.abs(np.asarray(greedy.log_prob) - np.asarray(split.log_prob)).max()),
            "log_prob_scale": float(np.abs(np.asarray(greedy.log_prob)).max()),
            "tokens_spec": str(split.tokens.sharding.spec),
            "device_1_equal": bool(np.array_equal(np.asarray(a.tokens)[2:], device_1.tokens))}


def test_split_over_two_host_devices_equals_one_device():
    r = run_report(__file__, 2)
    assert r["greedy_equal"], r
    check_close("decoder log-probs split over 2 devices", r["log_prob_diff"], ulps=NETWORK, scale=r["log_prob_scale"])
    assert r["tokens_spec"] == "P('data',)", r
    assert r["device_1_equal"], r  # device 1 samples its prompts as an unsplit call with key fold_in(key, 1)


if __name__ == "__main__":
    print(json.dumps(_mesh_report()))
