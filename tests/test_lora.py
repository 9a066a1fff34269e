"""LoRA adapters: the merge against a hand-worked case, PEFT's files both ways against transformers + peft logits,
the gradient against the full model's projected onto the adapters, a train step that moves only the adapters, their
sharding under fsdp, and a run with `model.lora` through the run config."""
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from _devices import run_report  # noqa: E402
from _tolerance import ELEMENTWISE, NETWORK, PARITY, REORDER, assert_f32_close, check_close  # noqa: E402
from refiner_jax import sharding as shd  # noqa: E402
from refiner_jax.models import lora as lora_lib  # noqa: E402
from refiner_jax.models import peft_io  # noqa: E402
from refiner_jax.models.decoder import Decoder  # noqa: E402
from refiner_jax.models.decoder_config import preset as decoder_preset  # noqa: E402
from refiner_jax.models.language_model import LanguageModel, init_params  # noqa: E402
from refiner_jax.training.state import create_lora_train_state  # noqa: E402
from refiner_jax.training.steps import make_train_step, masked_cross_entropy  # noqa: E402


def _random_adapters(lora, params, seed: int, scale: float = 0.3) -> dict:
    """Adapters with both factors random, so that the update is not zero."""
    adapters = lora_lib.init(params, lora, jax.random.key(seed))
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(treedef, [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


# ------------------------------------------------------------------------------------------- the math by hand


def test_merge_matches_a_hand_worked_update():
    # GPT-2's fused c_attn: x @ W for W [d, 3d] = query | key | value, each [d, heads, head_dim] in our layout.
    config = decoder_preset("gpt2-tiny", num_layers=1, d_model=8, num_heads=2, num_kv_heads=2, head_dim=4, d_ff=16)
    params = init_params(config, jax.random.key(0))
    lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=2, alpha=3.0, target_modules=("c_attn",)))
    (target,) = lora.targets
    assert (target.module, target.in_features, target.out_features) == ("transformer.h.0.attn.c_attn", 8, 24)
    a = np.arange(16, dtype=np.float32).reshape(8, 2) / 10  # [in, r]
    b = (np.arange(48, dtype=np.float32).reshape(2, 24) - 20) / 7  # [r, out]
    merged = lora_lib.merge(params, {"transformer": {"h": {"0": {"attn": {"c_attn": {"lora_a": a, "lora_b": b}}}}}},
                            lora)
    scale = 3.0 / 2
    for index, name in enumerate(("query", "key", "value")):
        before = np.asarray(params["layers_0"]["attention"][name])
        after = np.asarray(merged["layers_0"]["attention"][name])
        want = before.copy()
        for i in range(8):  # entry (i, head, j) is output column index * 8 + head * 4 + j of the fused module
            for head in range(2):
                for j in range(4):
                    column = index * 8 + head * 4 + j
                    want[i, head, j] += scale * (a[i, 0] * b[0, column] + a[i, 1] * b[1, column])
        assert_f32_close(after, want, ulps=ELEMENTWISE, what=f"merged {name}")
    # every other parameter is untouched
    assert np.array_equal(merged["layers_0"]["attention"]["out"], params["layers_0"]["attention"]["out"])


def test_fresh_adapters_follow_peft_init_and_leave_the_model_unchanged():
    config = decoder_preset("llama-tiny")
    params = init_params(config, jax.random.key(0))
    lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=8))
    assert lora.target_modules == ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
    adapters = lora_lib.init(params, lora, jax.random.key(1))
    down = adapters["model"]["layers"]["1"]["mlp"]["down_proj"]
    assert down["lora_a"].shape == (config.d_ff, 8) and down["lora_b"].shape == (8, config.d_model)
    bound = 1 / np.sqrt(config.d_ff)  # kaiming-uniform with a = sqrt(5) on a [r, in] weight
    assert 0.9 * bound < float(jnp.abs(down["lora_a"]).max()) <= bound and not np.any(down["lora_b"])
    merged = lora_lib.merge(params, adapters, lora)
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(merged), jax.tree.leaves(params)))


def test_unknown_target_modules_are_named():
    with pytest.raises(ValueError, match=r"target_modules \['q'\] are not linear modules of this llama model"):
        lora_lib.bind(decoder_preset("llama-tiny"), lora_lib.LoraConfig(rank=4, target_modules=("q",)))


def test_a_reward_head_is_trained_in_full_beside_the_adapters():
    config = decoder_preset("llama-tiny")
    lm = init_params(config, jax.random.key(0))
    params = {"lm": lm, "score_kernel": jnp.ones((config.d_model,)), "score_bias": jnp.zeros(())}
    lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=2, target_modules=("q_proj",)))
    base, trainable = lora_lib.split(params, lora, jax.random.key(1))
    assert set(base) == {"lm"} and set(trainable["trained"]) == {"score_kernel", "score_bias"}
    trainable["trained"]["score_bias"] = jnp.ones(())
    rebuilt = lora_lib.apply(base, trainable, lora)
    assert float(rebuilt["score_bias"]) == 1.0
    assert jax.tree.structure(rebuilt) == jax.tree.structure(params)


# -------------------------------------------------------------------------------- PEFT's files both ways


def _import_peft():
    """peft, the reference for adapter files; required where the test extra installs it (Python 3.11, with torch)."""
    from _helpers import _test_extra_requires

    if _test_extra_requires("peft"):
        import peft

        return peft
    return pytest.importorskip("peft", reason="peft is not installed: the test extra installs it on Python 3.11 only")


def _reference(kind: str, directory):
    """A random transformers model of `kind` saved in `directory`, and our import of it."""
    from _helpers import import_torch

    torch = import_torch()
    transformers = pytest.importorskip("transformers")
    from refiner_jax.models import hf, hf_decoder

    torch.manual_seed(0)
    if kind == "gpt2":
        hf_config = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_inner=48,
                                            n_positions=40, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        ref = transformers.GPT2LMHeadModel(hf_config)
    elif kind == "llama":
        hf_config = transformers.LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=56,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=16, max_position_embeddings=64, tie_word_embeddings=False)
        ref = transformers.LlamaForCausalLM(hf_config)
    else:
        hf_config = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                          num_decoder_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
                                          tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=0,
                                          pad_token_id=0, eos_token_id=1)
        ref = transformers.T5ForConditionalGeneration(hf_config)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(0.2 * torch.randn_like(p))
    ref.eval().save_pretrained(directory)
    config, params = hf.load_t5(directory) if kind == "t5" else hf_decoder.load_decoder(directory)
    return torch, transformers, config, params


_TOKENS = np.array([[5, 9, 17, 33, 2, 41, 7, 11], [12, 88, 3, 1, 60, 21, 4, 2]], np.int32)


def _ours(config, params) -> np.ndarray:
    if LanguageModel(config).family == "t5":
        from refiner_jax.models.t5 import T5, shift_right

        return np.asarray(T5(config).apply({"params": params}, _TOKENS, shift_right(_TOKENS[:, ::-1])))
    return np.asarray(Decoder(config).apply({"params": params}, _TOKENS))


def _theirs(torch, model, kind: str) -> np.ndarray:
    tokens = torch.tensor(_TOKENS, dtype=torch.long)
    with torch.no_grad():
        if kind == "t5":
            labels = torch.tensor(np.ascontiguousarray(_TOKENS[:, ::-1]), dtype=torch.long)
            return model(input_ids=tokens, labels=labels).logits.numpy()
        return model(input_ids=tokens).logits.numpy()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "t5"])
def test_our_adapter_files_load_in_peft_with_our_logits(tmp_path, kind):
    torch, transformers, config, params = _reference(kind, tmp_path / "model")
    peft = _import_peft()
    lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=4, alpha=8.0))
    adapters = _random_adapters(lora, params, seed=3)
    peft_io.save_adapters(tmp_path / "adapter", lora, adapters)
    auto = transformers.T5ForConditionalGeneration if kind == "t5" else transformers.AutoModelForCausalLM
    base = auto.from_pretrained(tmp_path / "model").eval()
    theirs = _theirs(torch, peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval(), kind)
    ours = _ours(config, lora_lib.merge(params, adapters, lora))
    assert np.abs(ours - _ours(config, params)).max() > 0.1 * np.abs(theirs).max()  # the adapters matter
    check_close(f"{kind} logits with our adapters vs peft", np.abs(ours - theirs).max(), ulps=PARITY,
                scale=np.abs(theirs).max())


@pytest.mark.parametrize("kind,targets", [("gpt2", ["c_attn", "c_fc"]), ("llama", ["q_proj", "v_proj", "down_proj"]),
                                          ("t5", ["q", "v", "wo"])])
def test_peft_adapter_files_load_here_with_peft_logits(tmp_path, kind, targets):
    torch, transformers, config, params = _reference(kind, tmp_path / "model")
    peft = _import_peft()
    auto = transformers.T5ForConditionalGeneration if kind == "t5" else transformers.AutoModelForCausalLM
    torch.manual_seed(1)
    model = peft.get_peft_model(auto.from_pretrained(tmp_path / "model"), peft.LoraConfig(
        r=3, lora_alpha=5, target_modules=targets, init_lora_weights=False, fan_in_fan_out=kind == "gpt2"))
    model.eval().save_pretrained(tmp_path / "adapter")
    theirs = _theirs(torch, model, kind)
    lora, adapters = peft_io.load_adapters(tmp_path / "adapter", config)
    assert (lora.config.rank, lora.config.alpha, lora.target_modules) == (3, 5.0, tuple(sorted(targets)))
    ours = _ours(config, lora_lib.merge(params, adapters, lora))
    assert np.abs(ours - _ours(config, params)).max() > 0.01 * np.abs(theirs).max()
    check_close(f"{kind} logits with peft's adapters", np.abs(ours - theirs).max(), ulps=PARITY,
                scale=np.abs(theirs).max())


def test_adapter_options_that_change_the_update_are_refused(tmp_path):
    config = decoder_preset("llama-tiny")
    lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=2, target_modules=("q_proj",)))
    peft_io.save_adapters(tmp_path, lora, lora_lib.init(init_params(config, jax.random.key(0)), lora,
                                                        jax.random.key(1)))
    fields = json.loads((tmp_path / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps(dict(fields, use_dora=True)))
    with pytest.raises(ValueError, match="use_dora=True is not supported"):
        peft_io.load_adapters(tmp_path, config)


# ------------------------------------------------------------------------------------ gradients and the step


def _lm_loss(module):
    def loss_fn(params, batch, rng):
        tokens = batch["tokens"]
        logits = module.apply({"params": params}, tokens)
        loss_sum, count = masked_cross_entropy(logits[:, :-1], tokens[:, 1:])
        return loss_sum, {"loss_sum": loss_sum, "tokens": count}

    return loss_fn


def _leaf(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def test_adapter_gradient_is_the_full_gradient_projected():
    config = decoder_preset("llama-tiny")
    params = init_params(config, jax.random.key(0))
    lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=3, alpha=6.0))
    adapters = _random_adapters(lora, params, seed=5, scale=0.1)
    loss = _lm_loss(Decoder(config))
    batch = {"tokens": jnp.asarray(_TOKENS % config.vocab_size)}
    merged = lora_lib.merge(params, adapters, lora)
    full = jax.grad(lambda p: loss(p, batch, None)[0])(merged)
    ours = jax.grad(lambda ad: loss(lora_lib.merge(params, ad, lora), batch, None)[0])(adapters)
    s = lora.config.scale
    for target in lora.targets:
        (part,) = target.parts
        g = np.asarray(_leaf(full, part.path), np.float64).reshape(target.in_features, target.out_features)
        a, b = (np.asarray(lora_lib.adapter_of(adapters, target)[k], np.float64) for k in ("lora_a", "lora_b"))
        got = lora_lib.adapter_of(ours, target)
        # d/dA of L(W + s A B) = s G B^T, d/dB = s A^T G; the scale is the sum of the magnitudes multiplied
        assert_f32_close(got["lora_a"], s * g @ b.T, ulps=NETWORK, scale=s * (np.abs(g) @ np.abs(b).T).max(),
                         what=f"{target.module} d/dA")
        assert_f32_close(got["lora_b"], s * a.T @ g, ulps=NETWORK, scale=s * (np.abs(a).T @ np.abs(g)).max(),
                         what=f"{target.module} d/dB")


def _lora_step(mesh, config, lora, steps: int = 2):
    """`steps` AdamW updates of llama-tiny's adapters on a fixed batch: (state, frozen base, losses)."""
    module = Decoder(config)
    tx = optax.adamw(1e-2)
    state, shardings, frozen = create_lora_train_state(
        lambda k: module.init(k, jnp.zeros((1, 8), jnp.int32))["params"], lora, tx, mesh, seed=0)
    step = make_train_step(_lm_loss(module), tx, mesh, shardings, frozen=frozen)
    batch = shd.make_global_batch({"tokens": np.tile(_TOKENS % config.vocab_size, (4, 1))}, mesh)
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return state, shardings, frozen, losses


def test_a_lora_step_moves_only_the_adapters():
    config = decoder_preset("llama-tiny")
    lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=4, target_modules=("q_proj", "v_proj", "up_proj")))
    mesh = shd.make_mesh((1, 1, 1))
    state, _, frozen, losses = _lora_step(mesh, config, lora, steps=0)
    base_before = jax.tree.map(np.array, frozen.params)
    state, _, frozen, losses = _lora_step(mesh, config, lora, steps=3)
    # the base is bit-identical, the adapters moved (lora_b left zero), the loss fell
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(base_before), jax.tree.leaves(frozen.params)))
    assert all(np.any(np.asarray(x)) for x in jax.tree.leaves(state.params))
    assert losses[-1] < losses[0]
    # the trained and optimised tree holds the adapters alone: Adam's two moments, one entry per adapter scalar
    assert set(state.params) == {"adapters"}
    adapter_shapes = sorted(x.shape for x in jax.tree.leaves(state.params))
    moment_shapes = sorted(x.shape for x in jax.tree.leaves(state.opt_state) if x.ndim)
    assert moment_shapes == sorted(adapter_shapes * 2)
    # 2 layers x rank 4 x (in + out) of q_proj (64 + 64), v_proj (64 + 2 kv heads x 16) and up_proj (64 + 176)
    assert lora_lib.count(state.params) == 2 * 4 * ((64 + 64) + (64 + 32) + (64 + 176))
    # the model's params are the base with the adapters merged in
    full = frozen.model_params(state.params)
    assert jax.tree.structure(full) == jax.tree.structure(base_before)


def _fsdp_report() -> dict:
    """On 8 virtual devices (fsdp=8): the adapters' and base's shardings and two LoRA steps' losses."""
    config = decoder_preset("llama-tiny")
    lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=4, target_modules=("q_proj", "v_proj", "up_proj")))
    state, shardings, frozen, losses = _lora_step(shd.make_mesh({"fsdp": 8}), config, lora)
    q = shardings.params["adapters"]["model"]["layers"]["0"]["self_attn"]["q_proj"]
    return {"lora_a": list(q["lora_a"].spec), "query": list(frozen.shardings["layers_0"]["attention"]["query"].spec),
            "losses": losses}


def test_adapters_shard_under_fsdp_and_train_as_on_one_device():
    report = run_report(__file__, 8, "fsdp")
    assert report["lora_a"][0] == "fsdp" and report["query"][0] == "fsdp"  # both split along the model dim
    config = decoder_preset("llama-tiny")
    lora = lora_lib.bind(config, lora_lib.LoraConfig(rank=4, target_modules=("q_proj", "v_proj", "up_proj")))
    *_, losses = _lora_step(shd.make_mesh((1, 1, 1)), config, lora)
    for one, eight in zip(losses, report["losses"]):
        check_close("lora loss on fsdp=8 vs one device", abs(one - eight), ulps=NETWORK, scale=abs(one))



# ------------------------------------------------------------------------------------------ through a run


@pytest.mark.parametrize("field,value,message", [
    ("rank", -1, "config.model.lora.rank: must be >= 0"),
    ("alpha", 0.0, "config.model.lora.alpha: must be positive"),
    ("target_modules", " , ", "config.model.lora.target_modules: names no module"),
])
def test_lora_config_fields_are_checked(field, value, message):
    from refiner_jax.runs import run_config as config_lib

    c = config_lib.base_config()
    assert config_lib.lora_config(c) is None  # rank 0: every parameter trains
    c.model.lora.rank, c.model.lora.target_modules = 8, "q, v"
    assert config_lib.lora_config(c) == lora_lib.LoraConfig(rank=8, alpha=16.0, target_modules=("q", "v"))
    c.model.lora[field] = value
    with pytest.raises(config_lib.ConfigError, match=message):
        config_lib.validate(c)


@pytest.mark.slow
def test_a_run_with_lora_trains_adapters_and_exports_the_merged_model(tmp_path):
    import orbax.checkpoint as ocp

    from refiner_jax import checkpoint as ckpt_lib
    from refiner_jax.models.language_model import config_from_dict
    from refiner_jax.runs import refiner_run
    from refiner_jax.runs import run_config as config_lib
    from test_pipeline import tiny_config

    c = tiny_config()
    c.model.lora.rank, c.model.lora.target_modules = 4, "q,v,wo"
    c.warmup.steps, c.warmup.eval_every = 2, 2
    workdir = tmp_path / "run"
    refiner_run.run(c, str(workdir), stages=("warmup",))
    stage = workdir / "warmup"
    # the checkpoint holds the adapters alone (and their optimizer state), no base parameter
    (step,) = [d for d in os.listdir(stage / "ckpt") if d.isdigit()]
    saved = ocp.PyTreeCheckpointer().metadata(str(stage / "ckpt" / step / "state"))
    saved = getattr(saved, "item_metadata", saved) or saved
    assert set(saved["params"]) == {"adapters"}
    # the export is the merged model: the base (the seed's init) plus PEFT's adapter files' update
    params, metadata = ckpt_lib.load_params(stage / "export")
    model_config = config_from_dict(metadata["family"], metadata["model_config"])
    lora, adapters = peft_io.load_adapters(stage / "adapter", model_config)
    assert lora.target_modules == ("q", "v", "wo") and any(np.any(x) for x in jax.tree.leaves(adapters))
    base = jax.tree.map(np.asarray, init_params(model_config, jax.random.split(jax.random.key(c.seed))[0]))
    merged = lora_lib.merge(base, adapters, lora)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(merged)):
        assert_f32_close(got, want, ulps=REORDER, scale=np.abs(want).max() + 1e-30, what="exported parameter")
    # a target module the model lacks is a config error
    c.model.lora.target_modules = "q_proj"
    with pytest.raises(config_lib.ConfigError, match="config.model.lora.target_modules: .*'q_proj'"):
        refiner_run.run(c, str(tmp_path / "other"), stages=("warmup",))



@pytest.mark.slow
def test_lora_bench_reports_both_modes_at_tiny_size():
    import subprocess

    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_lora.py"), "--preset", "llama-tiny",
                           "--rank", "4", "--length", "16", "--steps", "1"], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["lora"]["trained_params"] < report["full"]["trained_params"] == report["full"]["model_params"]
    assert report["lora_vs_full"]["optimizer_state_bytes"] < 0.1


if __name__ == "__main__":
    print(json.dumps({"fsdp": _fsdp_report}[sys.argv[1]]()))
