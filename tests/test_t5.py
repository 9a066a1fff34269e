"""The Flax T5 against transformers' PyTorch T5 (random weights built locally), plus the HF checkpoint bridge."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.linen import meta

from _helpers import import_torch
from _tolerance import NETWORK, PARITY, REORDER, assert_f32_close, check_close
from refiner_jax.models import hf
from refiner_jax.models.t5 import T5, relative_position_buckets, shift_right
from refiner_jax.models.t5_config import T5Config, preset

torch = import_torch()
transformers = pytest.importorskip("transformers")

V10 = dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4,
           relative_attention_num_buckets=8, relative_attention_max_distance=20, feed_forward_proj="relu",
           tie_word_embeddings=True, dropout_rate=0.0)
V11 = dict(V10, feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=2)


def _torch_t5(fields: dict, seed: int):
    """A reference T5 with every tensor (norm scales included) randomised so that any mapping error shows."""
    torch.manual_seed(seed)
    config = transformers.T5Config(**fields, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.5 if "relative_attention_bias" in name else p.std().clamp(min=0.05)))
    return model


def _batch():
    # Two prompts of different lengths (padding in the batch) and decoder inputs with padding too.
    enc = np.array([[5, 9, 17, 33, 2, 41, 7, 1, 0, 0, 0, 0],
                    [12, 88, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    targets = np.array([[8, 14, 6, 1, 0, 0, 0],
                        [30, 2, 19, 44, 71, 3, 1]], np.int32)
    return enc, targets


@pytest.mark.parametrize("fields", [V10, V11], ids=["t5-v1.0", "t5-v1.1"])
def test_logits_match_transformers(tmp_path, fields):
    ref = _torch_t5(fields, seed=0)
    ref.save_pretrained(tmp_path)
    config, params = hf.load_t5(tmp_path)
    assert config.feed_forward_proj == fields["feed_forward_proj"]
    assert config.tie_word_embeddings == fields["tie_word_embeddings"]
    enc, targets = _batch()
    model = T5(config)
    encoded = model.apply({"params": params}, jnp.asarray(enc), method=T5.encode)
    logits = model.apply({"params": params}, jnp.asarray(enc), shift_right(jnp.asarray(targets)))
    with torch.no_grad():
        enc_t = torch.tensor(enc, dtype=torch.long)
        mask = (enc_t > 0).long()
        ref_encoded = ref.encoder(input_ids=enc_t, attention_mask=mask).last_hidden_state.numpy()
        ref_logits = ref(input_ids=enc_t, attention_mask=mask,
                         labels=torch.tensor(targets, dtype=torch.long)).logits.numpy()
    real = enc > 0
    enc_diff = np.abs(np.asarray(encoded) - ref_encoded)[real].max()
    logit_diff = np.abs(np.asarray(logits) - ref_logits).max()
    print(f"{fields['feed_forward_proj']}: encoder max|diff| {enc_diff:.2e}, logits max|diff| {logit_diff:.2e}")
    check_close("t5 encoder vs transformers", enc_diff, ulps=PARITY, scale=np.abs(ref_encoded)[real].max())
    check_close("t5 logits vs transformers", logit_diff, ulps=PARITY, scale=np.abs(ref_logits).max())
    assert np.abs(ref_logits).max() > 1.0  # the comparison is not between near-zero tensors


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_buckets_match_reference(bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    for buckets, max_distance in ((32, 128), (8, 20)):
        ours = relative_position_buckets(300, 300, bidirectional, buckets, max_distance)
        rel = torch.arange(300)[None, :] - torch.arange(300)[:, None]
        theirs = T5Attention._relative_position_bucket(rel, bidirectional, buckets, max_distance).numpy()
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("fields", [V10, V11], ids=["t5-v1.0", "t5-v1.1"])
def test_loss_gradients_match_transformers(tmp_path, fields):
    # Every parameter's gradient of the mean token cross-entropy (padding in prompts and targets) against
    # transformers' backward pass; this covers the relative-position bias, the tied/untied output layer and the
    # loss's hand-written gradient.
    from refiner_jax.training import seq2seq_loss

    ref = _torch_t5(fields, seed=1)
    ref.save_pretrained(tmp_path)
    config, params = hf.load_t5(tmp_path)
    enc, targets = _batch()
    loss_fn = seq2seq_loss(T5(config).apply)

    def mean_loss(p):
        loss_sum, sums = loss_fn(p, {"inputs": jnp.asarray(enc), "targets": jnp.asarray(targets)}, None)
        return loss_sum / sums["tokens"]

    loss, grads = jax.value_and_grad(mean_loss)(params)
    ours = hf.state_dict_from_params(config, grads)
    enc_t = torch.tensor(enc, dtype=torch.long)
    labels = torch.tensor(np.where(targets > 0, targets, -100), dtype=torch.long)
    ref_loss = ref(input_ids=enc_t, attention_mask=(enc_t > 0).long(),
                   decoder_input_ids=torch.tensor(np.asarray(shift_right(jnp.asarray(targets))), dtype=torch.long),
                   labels=labels).loss
    ref_loss.backward()
    # A mean of non-negative cross-entropies: its own magnitude bounds its terms'.
    check_close("t5 loss vs transformers", abs(float(loss) - ref_loss.item()), ulps=PARITY, scale=ref_loss.item())
    theirs = {name: p.grad.numpy() for name, p in ref.named_parameters()}
    if "lm_head.weight" in ours and ref.lm_head.weight is ref.shared.weight:
        # transformers 5 shares one tensor between T5's embedding and output layer even for v1.1 (which only skips
        # the output scaling), so its gradient is the sum of our two.
        ours["shared.weight"] = ours["shared.weight"] + ours.pop("lm_head.weight")
    assert set(theirs) <= set(ours)
    for name, grad in theirs.items():
        scale = np.abs(grad).max()
        assert scale > 0, name
        assert_f32_close(ours[name], grad, ulps=PARITY, scale=scale, what=f"t5 gradient {name} vs transformers")


@pytest.mark.parametrize("fields", [V10, V11], ids=["t5-v1.0", "t5-v1.1"])
def test_export_loads_in_transformers_and_round_trips_exactly(tmp_path, fields):
    config = T5Config(**fields)
    params = meta.unbox(T5(config).init(jax.random.key(3), jnp.ones((1, 4), jnp.int32),
                                        jnp.ones((1, 3), jnp.int32))["params"])
    out = hf.save_t5(config, params, tmp_path / "export")
    ref, info = transformers.T5ForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    # The reference's tensors equal ours under the documented transposes.
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    np.testing.assert_array_equal(sd["shared.weight"], np.asarray(params["token_embedder"]))
    np.testing.assert_array_equal(sd["encoder.block.1.layer.1.DenseReluDense.wo.weight"],
                                  np.asarray(params["encoder"]["layers_1"]["mlp"]["wo"]).T)
    q = np.asarray(params["decoder"]["layers_0"]["encoder_decoder_attention"]["query"])
    np.testing.assert_array_equal(sd["decoder.block.0.layer.1.EncDecAttention.q.weight"],
                                  q.reshape(config.d_model, -1).T)
    # Export -> import is exact.
    config2, params2 = hf.load_t5(out)
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, params2)
    # And the model we exported computes what the reference computes.
    enc, targets = _batch()
    ours = T5(config).apply({"params": params}, jnp.asarray(enc), shift_right(jnp.asarray(targets)))
    with torch.no_grad():
        theirs = ref(input_ids=torch.tensor(enc, dtype=torch.long), attention_mask=torch.tensor(enc > 0).long(),
                     labels=torch.tensor(targets, dtype=torch.long)).logits.numpy()
    assert_f32_close(ours, theirs, ulps=PARITY, what="exported t5 logits vs transformers")


@pytest.mark.parametrize("untied", [False, True], ids=["v1.0-tied", "v1.1-untied"])
@pytest.mark.parametrize("with_output_kernel", [False, True], ids=["own-head", "output-kernel"])
def test_cached_decode_step_equals_teacher_forcing(untied, with_output_kernel):
    """Step-by-step decoding with the cache == the teacher-forced forward pass, also when the sampler hands
    `decode_step` the precomputed `output_kernel` (the tied embedding transposed, or v1.1's untied kernel)."""
    config = T5Config(**dict(V11, dropout_rate=0.0)) if untied else preset("t5-tiny", dropout_rate=0.0)
    model = T5(config)
    enc, targets = _batch()
    enc = jnp.asarray(enc) % config.vocab_size
    dec_in = shift_right(jnp.asarray(targets))
    params = meta.unbox(model.init(jax.random.key(1), enc, dec_in)["params"])
    full = model.apply({"params": params}, enc, dec_in)  # [b, len, V]
    encoded = model.apply({"params": params}, enc, method=T5.encode)
    cross = model.apply({"params": params}, encoded, method=T5.cross_kv)
    cache = T5.init_cache(config, enc.shape[0], 16)
    kernel = model.apply({"params": params}, method=T5.output_kernel) if with_output_kernel else None
    step = jax.jit(lambda *a: model.apply({"params": params}, *a, method=T5.decode_step))
    for i in range(dec_in.shape[1]):
        step_logits, cache = step(dec_in[:, i], jnp.int32(i), cache, cross, enc > 0, kernel)
        assert_f32_close(step_logits, full[:, i], ulps=NETWORK, scale=np.abs(full).max(),
                         what="t5 cached decode step vs teacher forcing")


def test_decode_step_shares_cross_kv_across_samples():
    """k decoder rows per prompt over one copy of the prompt's cross K/V == teacher forcing on k copies of it."""
    config = preset("t5-tiny", dropout_rate=0.0)
    model = T5(config)
    enc, targets = _batch()
    enc = jnp.asarray(enc) % config.vocab_size
    k = 3
    dec_targets = jnp.asarray(np.random.default_rng(3).integers(2, config.vocab_size, (enc.shape[0] * k, 6)))
    dec_in = shift_right(dec_targets)  # [b * k, len], a prompt's samples adjacent and all different
    params = meta.unbox(model.init(jax.random.key(1), enc, shift_right(jnp.asarray(targets)))["params"])
    full = model.apply({"params": params}, jnp.repeat(enc, k, axis=0), dec_in)  # [b * k, len, V]
    encoded = model.apply({"params": params}, enc, method=T5.encode)
    cross = model.apply({"params": params}, encoded, method=T5.cross_kv)  # per prompt, not per sample
    cache = T5.init_cache(config, enc.shape[0] * k, dec_in.shape[1])
    step = jax.jit(lambda *a: model.apply({"params": params}, *a, method=T5.decode_step))
    for i in range(dec_in.shape[1]):
        step_logits, cache = step(dec_in[:, i], jnp.int32(i), cache, cross, enc > 0)
        assert_f32_close(step_logits, full[:, i], ulps=NETWORK, scale=np.abs(full).max(),
                         what="t5 decode step over shared cross K/V vs teacher forcing")


def test_remat_changes_nothing_but_memory():
    config = T5Config(**dict(V11, dropout_rate=0.1))
    enc, targets = _batch()
    enc, targets = jnp.asarray(enc), jnp.asarray(targets)
    params = meta.unbox(T5(config).init(jax.random.key(2), enc, targets)["params"])

    def loss(p, cfg):
        logits = T5(cfg).apply({"params": p}, enc, shift_right(targets), enable_dropout=True,
                               rngs={"dropout": jax.random.key(7)})
        return jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    grad_fn = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    plain = grad_fn(params, config)
    remat = grad_fn(params, config.replace(remat=True))
    # The same operations recomputed: at most a fusion's rounding apart.
    check_close("t5 remat loss", abs(float(plain[0]) - float(remat[0])), ulps=REORDER, scale=abs(float(plain[0])))
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(plain[1]))  # the gradient's overall magnitude
    for a, b in zip(jax.tree.leaves(plain[1]), jax.tree.leaves(remat[1])):
        assert_f32_close(b, a, ulps=NETWORK, scale=scale, what="t5 remat gradient")
    # ... and remat really is on: each layer's forward is recomputed in the backward pass (one checkpoint per layer).
    def rematerialised(cfg):
        return str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(params, cfg)).count("remat")

    assert rematerialised(config) == 0
    assert rematerialised(config.replace(remat=True)) == config.num_layers + config.n_decoder_layers


def test_mismatches_name_the_parameter(tmp_path):
    config = T5Config(**V10)
    params = meta.unbox(T5(config).init(jax.random.key(0), jnp.ones((1, 2), jnp.int32),
                                        jnp.ones((1, 2), jnp.int32))["params"])
    state = hf.state_dict_from_params(config, params)
    bad = dict(state)
    bad["encoder.block.1.layer.1.DenseReluDense.wi.weight"] = np.zeros((7, 32), np.float32)
    with pytest.raises(ValueError,
                       match=r"encoder\.block\.1\.layer\.1\.DenseReluDense\.wi\.weight.*encoder/layers_1/mlp/wi"):
        hf.params_from_state_dict(config, bad)
    missing = dict(state)
    del missing["decoder.final_layer_norm.weight"]
    with pytest.raises(ValueError, match="decoder.final_layer_norm.weight.*decoder/decoder_norm/scale"):
        hf.params_from_state_dict(config, missing)
    # Checkpoints saved before transformers 4.0 (the released t5-small, UnifiedQA) store an unused cross-attention
    # position bias; like transformers, the import ignores it.
    legacy = dict(state, **{"decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight":
                            np.ones((config.relative_attention_num_buckets, config.num_heads), np.float32)})
    jax.tree.map(np.testing.assert_array_equal, hf.params_from_state_dict(config, legacy),
                 hf.params_from_state_dict(config, state))
    extra = dict(state, **{"decoder.block.9.layer.0.layer_norm.weight": np.ones(32, np.float32)})
    with pytest.raises(ValueError, match="decoder.block.9"):
        hf.params_from_state_dict(config, extra)
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.load_t5(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(config)))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        hf.load_t5(tmp_path)


def test_presets_match_transformers_configs():
    # Published architecture numbers of the released checkpoints (parameter counts from their model cards).
    counts = {"t5-small": 60_506_624, "flan-t5-small": 76_961_152}
    for name, expected in counts.items():
        config = preset(name)
        shapes = jax.eval_shape(lambda c=config: T5(c).init(jax.random.key(0), jnp.ones((1, 1), jnp.int32),
                                                             jnp.ones((1, 1), jnp.int32)))["params"]
        n = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(meta.unbox(shapes)))
        assert n == expected, name


def test_bad_config_is_rejected_early():
    with pytest.raises(ValueError, match="feed_forward_proj"):
        T5Config(feed_forward_proj="swish")
    with pytest.raises(ValueError, match="unknown T5 preset"):
        preset("t5-gigantic")


@pytest.mark.parametrize("bias_shape", [(2, 3, 5, 7), (1, 3, 5, 7), (2, 1, 1, 7)], ids=["full", "batch-1", "mask"])
@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_attention_core_gradients_match_autodiff(bias_shape, rate):
    # `attend`'s hand-written backward pass (dropout mask recomputed from its seed) against autodiff of the same
    # attention written with plain operations and the mask applied as a fixed scale.
    from refiner_jax.models.layers import attend, dropout

    keys = jax.random.split(jax.random.key(4), 5)
    q, k, v = (jax.random.normal(key, shape) for key, shape in zip(keys, [(2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4)]))
    bias = jax.random.normal(keys[3], bias_shape)
    g = jax.random.normal(keys[4], (2, 3, 5, 4))
    seed = jnp.uint32(77) if rate else None
    scale = dropout(jnp.ones((2, 3, 5, 7)), seed, rate)
    assert rate == 0.0 or 0 < int((scale == 0).sum()) < scale.size

    def reference(q, k, v, bias):
        weights = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) + bias, axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", weights * scale, v)

    ours, ours_vjp = jax.vjp(lambda *a: attend(*a, seed, rate), q, k, v, bias)
    theirs, theirs_vjp = jax.vjp(reference, q, k, v, bias)
    # The same softmax attention; the backward pass is written by hand, so its products are taken in another order.
    assert_f32_close(ours, theirs, ulps=REORDER, what="attention forward vs autodiff reference")
    for name, a, b in zip("q k v bias".split(), ours_vjp(g), theirs_vjp(g)):
        assert a.shape == b.shape, name
        assert_f32_close(a, b, ulps=REORDER, what=f"attention gradient d{name} vs autodiff reference")


def test_product_over_rows_copies_transposes_on_cpu_only():
    # `product_over_rows` (kernel gradients; attention's key and value gradients) against hand-worked products,
    # with either operand the narrower and with batch axes; the transposed copies that steer XLA:CPU to YNNPACK
    # must not reach GPU or TPU programs, whose libraries read a transposed operand for free.
    from refiner_jax.models.layers import product_over_rows

    a = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # [rows 3, 2]
    b = jnp.array([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # [rows 3, 3]
    a_t_b = np.array([[6.0, 8.0, 7.0], [8.0, 10.0, 10.0]])
    product = jax.jit(product_over_rows)
    np.testing.assert_array_equal(product(a, b), a_t_b)
    np.testing.assert_array_equal(product(b, a), a_t_b.T)
    batched = product(jnp.stack([b, 2 * b]), jnp.stack([a, -a]))  # [2, 3, 2]
    np.testing.assert_array_equal(batched, np.stack([a_t_b.T, -2 * a_t_b.T]))
    for x, y in [(a, b), (b, a)]:
        traced = product.trace(x, y)
        for platform, barrier in [("cpu", True), ("cuda", False), ("tpu", False)]:
            text = traced.lower(lowering_platforms=(platform,)).as_text()
            assert ("optimization_barrier" in text) == barrier, platform
            assert text.count("dot_general") == 1, platform
