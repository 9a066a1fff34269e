"""`models.language_model.LanguageModel`, the seam that lets every stage train and sample either model family: the
decoder-only LM's pair batches score the target only (checked against the sampler's own KV-cache log-probs and by
hand), `TextModel` generates and scores with it, and a REFINER run trains end to end with
`--config.model.family=decoder`."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.linen import meta
from _tolerance import NETWORK, REORDER, assert_f32_close, check_close

from refiner_jax.models.language_model import LanguageModel, config_from_dict
from refiner_jax.models.decoder_config import preset as decoder_preset
from refiner_jax.models.t5_config import preset as t5_preset
from refiner_jax.text_model import TextModel, load_text_model
from refiner_jax.tokenizers import ByteTokenizer
from refiner_jax.runs import refiner_run
from refiner_jax.runs import run_config as config_lib
from refiner_jax.runs import run_setup
from refiner_jax.training.steps import pair_loss


def _decoder():
    tok = ByteTokenizer()
    config = decoder_preset("llama-tiny", vocab_size=384, pad_id=tok.pad_id, eos_id=tok.eos_id, bos_id=None)
    lm = LanguageModel(config)
    params = meta.unbox(lm.module().init(jax.random.key(3), *lm.init_args())["params"])
    return tok, lm, params


def test_decoder_pair_batch_layout_by_hand():
    lm = LanguageModel(decoder_preset("gpt2-tiny"))
    batch = lm.pair_batch([[5, 6, 1], [7, 1]], [[8, 1], [9, 9, 9, 1]], 3, 3, 1)
    np.testing.assert_array_equal(batch["tokens"], [[5, 6, 1, 8, 1, 0], [7, 1, 9, 9, 1, 0]])  # target cut, EOS kept
    np.testing.assert_array_equal(batch["mask"], [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(batch["weights"], [[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 0]])
    # The positions whose next-token logits predict the target (8, EOS; 9, 9, EOS); -1 past the target's end.
    np.testing.assert_array_equal(batch["target_index"], [[2, 3, -1], [1, 2, 3]])
    t5 = LanguageModel(t5_preset("t5-tiny")).pair_batch([[5, 6, 1]], [[8, 1]], 4, 3, 1)
    np.testing.assert_array_equal(t5["inputs"], [[5, 6, 1, 0]])
    np.testing.assert_array_equal(t5["targets"], [[8, 1, 0]])


def test_decoder_scores_equal_the_samplers_cached_log_probs():
    """Teacher-forced log-probs of `pair_batch` (one pass over prompt + target, weights on the target) against the
    log-probs the KV-cache sampler reports for its own greedy continuations: two independent code paths."""
    tok, lm, params = _decoder()
    prompt_ids = [tok.encode(p) for p in ("12 + 7", "abc", "a longer prompt", "x")]
    prompts = np.zeros((4, 16), np.int32)
    for i, p in enumerate(prompt_ids):
        prompts[i, :len(p)] = p
    out = lm.sample(params, prompts, jax.random.key(0), max_new_tokens=8, num_samples=1, temperature=0.0, top_p=1.0)
    generated = []
    for row in np.asarray(out.tokens)[:, 0]:
        ids = row.tolist()
        generated.append(ids[:ids.index(tok.eos_id) + 1] if tok.eos_id in ids else ids)  # the EOS is scored too
    batch = lm.pair_batch(prompt_ids, generated, 16, 8, tok.eos_id)
    logits, targets, weights = lm.target_logits(lm.module(), params, batch)
    token = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.asarray(targets)[..., None], -1)[..., 0]
    teacher_forced = (token * np.asarray(weights)).sum(axis=1)
    # Sums of log-probs (all <= 0), so a row's sum bounds the magnitude of its terms.
    assert_f32_close(np.asarray(out.log_prob)[:, 0], teacher_forced, ulps=NETWORK, scale=np.abs(teacher_forced).max(),
                     what="decoder teacher-forced vs sampler log-probs")
    # TextModel scores texts through the same pair batches: its generate/score round trip on the byte tokenizer.
    model = TextModel(lm.config, params, tok, max_input=16, max_output=8, bucket=16, batch_size=4)
    texts = model.greedy(["12 + 7", "abc"])
    assert all(isinstance(t, str) for t in texts) and np.isfinite(model.score(["12 + 7", "abc"], texts)).all()


def test_decoder_pair_loss_ignores_prompt_tokens():
    """Changing what follows the prompt changes the loss; the loss is the mean over target tokens only."""
    tok, lm, params = _decoder()
    module = lm.module()
    batch = lm.pair_batch([tok.encode("question one"), tok.encode("q2")], [tok.encode("#0"), tok.encode("x y")],
                          16, 8, tok.eos_id)
    loss_sum, sums = pair_loss(lm, module)(params, {k: jnp.asarray(v) for k, v in batch.items()}, None)
    assert float(sums["tokens"]) == 3 + 4  # "#0" + EOS, "x y" + EOS
    logits, targets, weights = lm.target_logits(module, params, batch)
    nll = -np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.asarray(targets)[..., None], -1)[..., 0]
    want = (nll * np.asarray(weights)).sum()  # non-negative terms: the sum is their magnitude
    check_close("pair loss vs hand sum", abs(float(loss_sum) - want), ulps=REORDER, scale=want)


def test_decoder_target_part_logits_equal_the_whole_rows():
    """The loss over the target part only (`target_index`: the output layer at target_len positions a row) gives
    the same log-probs, loss and gradient as the output layer over every position of the same rows."""
    tok, lm, params = _decoder()
    module = lm.module()
    rng = np.random.default_rng(1)
    prompts = [tok.encode("".join(rng.choice(list("abc +1"), n))) for n in (3, 9, 1, 14, 6, 0)]
    targets = [tok.encode("".join(rng.choice(list("xyz=2"), n))) for n in (2, 7, 0, 5, 12, 3)]  # the 12 is cut
    part = {k: jnp.asarray(v) for k, v in lm.pair_batch(prompts, targets, 16, 8, tok.eos_id).items()}
    whole = {k: v for k, v in part.items() if k != "target_index"}
    logits, _, weights = lm.target_logits(module, params, part)
    assert logits.shape[1] == 8 and float(jnp.sum(weights)) == 3 + 8 + 1 + 6 + 8 + 4  # targets + EOS, cut at 8

    def weighted_log_probs(batch):
        logits, tgt, w = lm.target_logits(module, params, batch)
        lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.asarray(tgt)[..., None], -1)[..., 0]
        return np.sort(lp[np.asarray(w) > 0])
    assert_f32_close(weighted_log_probs(part), weighted_log_probs(whole), ulps=NETWORK, what="target-part log-probs")
    loss = pair_loss(lm, module)
    (loss0, sums0), grads0 = jax.value_and_grad(loss, has_aux=True)(params, whole, None)
    (loss1, sums1), grads1 = jax.value_and_grad(loss, has_aux=True)(params, part, None)
    assert float(sums1["tokens"]) == float(sums0["tokens"])
    check_close("target-part loss", abs(float(loss1) - float(loss0)), ulps=NETWORK, scale=float(loss0))
    scale = max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(grads0))
    for a, b in zip(jax.tree_util.tree_leaves(grads0), jax.tree_util.tree_leaves(grads1)):
        assert_f32_close(b, a, ulps=NETWORK, scale=scale, what="target-part gradient")


def test_packed_pair_batch_layout_by_hand():
    """First fit by decreasing length into rows of input_len + target_len; rows rounded up to the multiple."""
    lm = LanguageModel(decoder_preset("gpt2-tiny"))
    prompts, targets = [[5, 1], [6, 6, 6, 1], [7, 1], [8, 1]], [[2, 1], [3, 1], [4, 4, 1], [9, 1]]
    batch = lm.pair_batch(prompts, targets, 4, 3, 1, pack=1)  # lengths 4, 6, 5, 4 into rows of 7
    assert set(batch) == {"tokens", "segments", "weights"}
    np.testing.assert_array_equal(batch["tokens"], [[6, 6, 6, 1, 3, 1, 0], [7, 1, 4, 4, 1, 0, 0],
                                                    [5, 1, 2, 1, 0, 0, 0], [8, 1, 9, 1, 0, 0, 0]])
    np.testing.assert_array_equal(batch["segments"], [[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0],
                                                      [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0]])
    two = lm.pair_batch([[5, 1], [7, 1], [8, 1]], [[2, 1], [4, 1], [9, 1]], 4, 4, 1, pack=2)  # 4 + 4 fit in 8
    np.testing.assert_array_equal(two["tokens"], [[5, 1, 2, 1, 7, 1, 4, 1], [8, 1, 9, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(two["segments"], [[1, 1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(two["weights"], [[0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 0, 0, 0, 0]])
    many = lm.pair_batch([[5, 1]] * 34, [[2, 1]] * 34, 4, 4, 1, pack=1)  # 17 rows needed: a multiple of 34 // 8
    assert many["tokens"].shape == (20, 8) and many["segments"].max() == 2
    sharded = lm.pair_batch([[5, 1]] * 32, [[2, 1]] * 32, 4, 4, 1, pack=8)  # 16 rows: a multiple of 8 devices
    assert sharded["tokens"].shape == (16, 8)


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_packed_loss_and_gradients_equal_one_pair_per_row(name):
    """Several pairs in one row (segment-restricted attention, positions restarting per pair) give each pair's
    logits, the summed loss and its gradient exactly as one padded pair per row does (rotary and learned
    positions)."""
    tok = ByteTokenizer()
    config = decoder_preset(name, vocab_size=384, pad_id=tok.pad_id, eos_id=tok.eos_id, bos_id=None)
    lm = LanguageModel(config)
    module = lm.module()
    params = meta.unbox(module.init(jax.random.key(1), *lm.init_args())["params"])
    rng = np.random.default_rng(0)
    prompts = [tok.encode("".join(rng.choice(list("abc +1"), n))) for n in (3, 9, 1, 14, 6, 2, 5, 11)]
    targets = [tok.encode("".join(rng.choice(list("xyz=2"), n))) for n in (2, 4, 7, 1, 3, 5, 2, 6)]
    loss = pair_loss(lm, module)
    results = []
    for pack in (0, 2):
        batch = {k: jnp.asarray(v) for k, v in lm.pair_batch(prompts, targets, 16, 8, tok.eos_id, pack).items()}
        (value, sums), grads = jax.value_and_grad(loss, has_aux=True)(params, batch, None)
        results.append((batch, float(value), float(sums["tokens"]), grads))
    (padded, loss0, tokens0, grads0), (packed, loss1, tokens1, grads1) = results
    assert packed["tokens"].shape[0] < padded["tokens"].shape[0] and packed["segments"].max() >= 2
    assert tokens0 == tokens1
    # The same network over other row layouts: products blocked differently, masked terms exactly zero.
    check_close(f"{name} packed loss", abs(loss1 - loss0), ulps=NETWORK, scale=loss0)
    # Some true gradients are 0 and computed as cancellation (GPT-2's key bias: softmax ignores a shift shared by
    # every key), so the scale is the gradient's overall magnitude, its largest entry over every parameter.
    scale = max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(grads0))
    for a, b in zip(jax.tree_util.tree_leaves(grads0), jax.tree_util.tree_leaves(grads1)):
        assert_f32_close(b, a, ulps=NETWORK, scale=scale, what=f"{name} packed gradient")
    # Per pair: the target tokens' log-probs in the packed rows equal those of the pair's own padded row.
    def target_log_probs(batch):
        logits, tgt, w = lm.target_logits(module, params, batch)
        lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.asarray(tgt)[..., None], -1)[..., 0]
        return np.sort(lp[np.asarray(w) > 0])
    assert_f32_close(target_log_probs(packed), target_log_probs(padded), ulps=NETWORK,
                     what=f"{name} packed target log-probs")


def test_config_round_trip_keeps_tuples():
    config = decoder_preset("gpt2-tiny", eos_id=(1, 2))
    import dataclasses
    import json

    fields = json.loads(json.dumps(dataclasses.asdict(config)))
    assert config_from_dict("decoder", fields) == config


def test_share_prompt_cache_reaches_a_decoder_runs_model_config():
    from test_pipeline import tiny_config

    c = tiny_config()
    c.model.family, c.model.preset = "decoder", "gpt2-tiny"
    assert not run_setup.model_setup(c, ByteTokenizer())[0].share_prompt_cache
    c.model.share_prompt_cache = True
    assert run_setup.model_setup(c, ByteTokenizer())[0].share_prompt_cache


@pytest.mark.slow
def test_refiner_run_with_a_decoder_generator(tmp_path):
    from test_pipeline import tiny_config

    c = tiny_config()
    c.model.family, c.model.preset = "decoder", "gpt2-tiny"
    c.model.share_prompt_cache = True  # the REFINER loop's and the critic's samples read one copy of each prompt
    workdir = str(tmp_path / "run")
    results = refiner_run.run(c, workdir, stages=("warmup", "critic", "refiner"))
    for stage in ("warmup", "critic", "refiner"):
        assert os.path.exists(os.path.join(workdir, stage, "DONE"))
    assert 0.0 <= results["warmup"]["equation_em_canonical"] <= 1.0
    model = load_text_model(os.path.join(workdir, "refiner"), ByteTokenizer(), 8, 4)
    assert LanguageModel(model.config).family == "decoder" and model.config.eos_id == 1
    assert model.config.share_prompt_cache
    c.model.preset = "t5-tiny"
    with pytest.raises(config_lib.ConfigError, match="unknown preset 't5-tiny' for family 'decoder'"):
        refiner_run.run(c, str(tmp_path / "other"))


def test_run_config_param_dtype_checkpoint_keeps_a_bfloat16_checkpoint(tmp_path):
    """`model.param_dtype="checkpoint"` on a bfloat16 checkpoint gives bfloat16 parameters equal to the stored
    ones; the default ("float32") gives the same values as float32."""
    import json

    from safetensors.flax import save_file

    from refiner_jax.models import hf_decoder
    from test_pipeline import tiny_config

    tok, lm, params = _decoder()
    out = hf_decoder.save_decoder(lm.config, params, tmp_path / "bf16")
    state = hf_decoder.state_dict_from_params(lm.config, params)
    save_file({k: jnp.asarray(v, jnp.bfloat16) for k, v in state.items()}, str(out / "model.safetensors"))
    hf = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(hf, dtype="bfloat16")))
    c = tiny_config()
    c.model.family, c.model.checkpoint = "decoder", str(out)
    float32 = run_setup.model_setup(c, tok)[1]
    c.model.param_dtype = "checkpoint"
    config, kept = run_setup.model_setup(c, tok)
    assert config.param_dtype == "bfloat16"
    assert {x.dtype for x in jax.tree.leaves(kept)} == {jnp.dtype("bfloat16")}
    assert {x.dtype for x in jax.tree.leaves(float32)} == {np.dtype("float32")}
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a, np.float32), b), kept, float32)
    rounded = jax.tree.map(lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32), params)
    jax.tree.map(np.testing.assert_array_equal, float32, rounded)


def _t5():
    tok = ByteTokenizer()
    config = t5_preset("t5-tiny", vocab_size=384, num_layers=2, dropout_rate=0.0)
    lm = LanguageModel(config)
    params = meta.unbox(lm.module().init(jax.random.key(4), *lm.init_args())["params"])
    return tok, lm, params


@pytest.mark.parametrize("make", [_decoder, _t5], ids=["decoder", "t5"])
def test_a_forced_target_prefix_continues_as_the_model_would(make):
    """Forcing the first j tokens of the model's own greedy output (a different j per row: right-padded prefixes)
    leaves the rest of that greedy output unchanged: the prefix is read, not drawn, and the samples are what follows
    it. Through `TextModel`, every output starts with its prefix's text."""
    tok, lm, params = make()
    prompt_ids = [tok.encode(p) for p in ("12 + 7", "abc", "a longer prompt")]
    prompts = np.zeros((3, 16), np.int32)
    for i, p in enumerate(prompt_ids):
        prompts[i, :len(p)] = p
    greedy = dict(num_samples=1, temperature=0.0, top_p=1.0)
    full = np.asarray(lm.sample(params, prompts, jax.random.key(0), max_new_tokens=10, **greedy).tokens)[:, 0]
    cut = [1, 3, 2]
    forced = np.zeros((3, 4), np.int32)
    for i, j in enumerate(cut):
        assert tok.eos_id not in full[i, :j].tolist()
        forced[i, :j] = full[i, :j]
    rest = np.asarray(lm.sample(params, prompts, jax.random.key(0), max_new_tokens=10 - min(cut), target_prefix=forced,
                                **greedy).tokens)[:, 0]
    for i, j in enumerate(cut):
        np.testing.assert_array_equal(rest[i, :10 - j], full[i, j:], err_msg=f"row {i}, prefix of {j} tokens")
    model = TextModel(lm.config, params, tok, max_input=16, max_output=40, bucket=16, batch_size=2)
    prefixes = ["#0: add ( number0, number1 )", "", "#0: x"]
    out = model.generate(["12 + 7", "abc", "q"], num_samples=2, temperature=1.0, rng=jax.random.key(1),
                         prefixes=prefixes)
    assert all(text.startswith(p) for p, texts in zip(prefixes, out) for text in texts)
    with pytest.raises(ValueError, match="2 prefixes for 3 texts"):
        model.generate(["a", "b", "c"], prefixes=["x", "y"])
