"""GRPO: group-normalised advantages and step-to-token credit on hand-worked cases, the loss's gradient against a
hand-derived one, the budget shared with expert iteration, config errors, and GRPO stages of a tiny reward run."""
import json
import re
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tolerance import NETWORK, REORDER, assert_f32_close
from refiner_jax.models.decoder_config import DecoderConfig
from refiner_jax.models.language_model import LanguageModel
from refiner_jax.reward import grpo
from refiner_jax.runs import grpo_stage, reward_run
from refiner_jax.runs import run_config as config_lib
from refiner_jax.tokenizers import ByteTokenizer
from refiner_jax.training.steps import masked_cross_entropy
from test_reward_pipeline import tiny_config

EPS = 1e-4


def test_group_advantages_hand_worked():
    # Group 1: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5; group 2 all equal -> every advantage 0.
    out = grpo.group_advantages(np.array([[1.0, 0.0, 0.0, 1.0], [0.7, 0.7, 0.7, 0.7]]), EPS)
    a = 0.5 / (0.5 + EPS)
    np.testing.assert_allclose(out, [[a, -a, -a, a], [0.0, 0.0, 0.0, 0.0]], rtol=1e-12, atol=0)
    # Two samples 0.2 and 0.8: mean 0.5, std 0.3.
    np.testing.assert_allclose(grpo.group_advantages(np.array([[0.2, 0.8]]), EPS),
                               [[-0.3 / (0.3 + EPS), 0.3 / (0.3 + EPS)]], rtol=1e-12)


def test_step_advantages_and_token_credit_hand_worked():
    # Three samples of one problem: steps (0.9, 0.1), (0.5,), and one with no rewarded step (one step, reward 0).
    # Pooled rewards 0.9, 0.1, 0.5, 0: mean 0.375; deviations 0.525, -0.275, 0.125, -0.375;
    # variance (0.275625 + 0.075625 + 0.015625 + 0.140625) / 4 = 0.126875.
    std = np.sqrt(0.126875)
    q = np.array([0.525, -0.275, 0.125, -0.375]) / (std + EPS)
    out = grpo.step_advantages([np.array([0.9, 0.1]), np.array([0.5]), np.array([])], EPS)
    np.testing.assert_allclose(out[0], [q[0] + q[1], q[1]], rtol=1e-12)  # suffix sums
    np.testing.assert_allclose(out[1], [q[2]], rtol=1e-12)
    np.testing.assert_allclose(out[2], [q[3]], rtol=1e-12)
    # Steps ending at tokens 2 and 5 of 7 tokens: tokens 0-2 step 0, 3-5 step 1, the end token (6) step 1 too.
    np.testing.assert_array_equal(grpo.token_advantages(np.array([10.0, 20.0]), [2, 5], 7),
                                  [10, 10, 10, 20, 20, 20, 20])
    # Only the first step rewarded (the second past the reward model's budget): every later token is in it.
    np.testing.assert_array_equal(grpo.token_advantages(np.array([10.0]), [2, 5], 7), [10] * 7)
    # No step at all: the one pseudo-step's advantage on every token.
    np.testing.assert_array_equal(grpo.token_advantages(np.array([-3.0]), [], 4), [-3] * 4)


def _lm():
    return LanguageModel(DecoderConfig(vocab_size=300, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                       d_ff=32, max_positions=64, pad_id=0, eos_id=1, bos_id=None))


def test_grpo_batch_places_each_steps_advantage_on_its_tokens():
    tok = ByteTokenizer()
    lm = _lm()
    # Byte tokens: "ab" + " cd" + EOS; steps end at tokens 1 and 4. A second sample with a scalar advantage.
    batch = grpo.grpo_batch(lm, tok, ["q", "q"], ["ab cd", "xy"], [["ab", " cd"], ["xy"]],
                            [np.array([2.0, -1.0]), 0.5], input_len=8, target_len=10, rows=4)
    np.testing.assert_array_equal(batch["advantages"][0], [2, 2, -1, -1, -1, -1, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch["advantages"][1], [0.5, 0.5, 0.5, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch["row_weights"], [1, 1, 0, 0])
    assert batch["old_log_probs"].shape == batch["ref_log_probs"].shape == (4, 10)


def test_loss_gradient_matches_hand_derivation_on_a_linear_policy():
    """logits = x W: dL/dlogp_t = w_t (-A_t rho_t [ratio term not clipped] + beta (1 - exp(ref_t - logp_t))),
    dlogp_t/dlogits = onehot - softmax, dL/dW = sum_t x_t^T dL/dlogits_t, computed in float64 by hand."""
    rng = np.random.default_rng(0)
    b, t, d, v = 3, 5, 4, 7
    x = rng.normal(size=(b, t, d))
    w_mat = rng.normal(size=(d, v)) * 0.5
    targets = rng.integers(0, v, size=(b, t))
    weights = (rng.random((b, t)) > 0.2).astype(np.float64)
    logits = x @ w_mat
    log_soft = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    log_p = np.take_along_axis(log_soft, targets[..., None], -1)[..., 0]
    # Old log-probs put ratios on both sides of the clip range and inside it; advantages of both signs.
    old = log_p - rng.choice([-0.5, -0.05, 0.0, 0.05, 0.5], size=(b, t))
    ref = log_p + rng.normal(size=(b, t)) * 0.3
    adv = rng.normal(size=(b, t))
    eps_clip, beta = 0.2, 0.1

    def loss(w):
        lg = jnp.einsum("btd,dv->btv", jnp.asarray(x, jnp.float32), w)
        lp = jnp.take_along_axis(jax.nn.log_softmax(lg), jnp.asarray(targets)[..., None], -1)[..., 0]
        return grpo.token_loss(lp, jnp.asarray(old, jnp.float32), jnp.asarray(ref, jnp.float32),
                               jnp.asarray(adv, jnp.float32), jnp.asarray(weights, jnp.float32), eps_clip, beta)[0]

    got = jax.grad(loss)(jnp.asarray(w_mat, jnp.float32))
    rho = np.exp(log_p - old)
    clipped = np.clip(rho, 1 - eps_clip, 1 + eps_clip) * adv < rho * adv  # the clipped term is the minimum
    d_logp = weights * (np.where(clipped, 0.0, -adv * rho) + beta * (1.0 - np.exp(ref - log_p)))
    soft = np.exp(log_soft)
    onehot = np.eye(v)[targets]
    d_logits = d_logp[..., None] * (onehot - soft)
    want = np.einsum("btd,btv->dv", x, d_logits)
    assert clipped.any() and (~clipped & (weights > 0)).any()
    scale = float(np.einsum("btd,btv->dv", np.abs(x), np.abs(d_logits)).max())
    assert_f32_close(got, want, ulps=NETWORK, scale=scale, what="GRPO loss gradient (linear policy)")
    # The loss itself: k3 is >= 0, and the sums count only weighted tokens.
    total, sums = grpo.token_loss(jnp.asarray(log_p, jnp.float32), jnp.asarray(old, jnp.float32),
                                  jnp.asarray(ref, jnp.float32), jnp.asarray(adv, jnp.float32),
                                  jnp.asarray(weights, jnp.float32), eps_clip, beta)
    gap = ref - log_p
    k3 = np.exp(gap) - gap - 1
    assert float(sums["tokens"]) == weights.sum()
    assert_f32_close(sums["kl_sum"], np.sum(k3 * weights), ulps=REORDER, scale=np.sum(np.abs(k3 * weights)),
                     what="k3 sum")


def test_loss_at_ratio_one_is_the_advantage_weighted_likelihood_gradient():
    """With old = the current policy and no KL, the GRPO gradient of a tiny decoder's batch is the gradient of
    the advantage-weighted token cross-entropy (`masked_cross_entropy`, a separate implementation)."""
    tok = ByteTokenizer()
    lm = _lm()
    module = lm.module()
    params = module.init(jax.random.key(0), *lm.init_args())["params"]
    batch = grpo.grpo_batch(lm, tok, ["ab", "c"], ["x y", "zz"], [["x", " y"], ["zz"]],
                            [np.array([1.5, -0.5]), -2.0], input_len=6, target_len=8, rows=4)
    log_p, weights = grpo.jitted_token_log_probs(lm)(params, batch)
    batch["old_log_probs"] = np.asarray(log_p)
    loss_fn = grpo.grpo_loss(lm, module, eps_clip=0.2, kl_beta=0.0)
    got = jax.jit(jax.grad(lambda p: loss_fn(p, batch, None)[0]))(params)

    def weighted_nll(p):  # masked_cross_entropy counts positive weights only: the two signs apart
        logits, targets, w = lm.target_logits(module, p, batch, None)
        w, a = w * batch["row_weights"][:, None], batch["advantages"]
        return (masked_cross_entropy(logits, targets, w * np.maximum(a, 0))[0]
                - masked_cross_entropy(logits, targets, w * np.maximum(-a, 0))[0])

    want = jax.jit(jax.grad(weighted_nll))(params)
    scale = max(float(np.max(np.abs(h))) for h in jax.tree.leaves(want))  # the whole gradient's magnitude
    for (path, g), h in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        assert_f32_close(g, h, ulps=NETWORK, scale=scale, what=str(path))
    assert float(np.asarray(weights).sum()) == 4 + 3  # "x y" + EOS and "zz" + EOS; padding rows count nothing


def test_grpo_takes_expert_iterations_budget_and_config_errors():
    c = tiny_config()
    budget = grpo_stage.accounting(c, 24)  # rl.steps 4, grpo.updates 2: 2 sample batches of 12 problems
    ei, g = budget["expert_iteration"], budget["grpo"]
    assert ei["samples"] == g["samples"] == 3 * 24 and ei["gradient_steps"] == g["gradient_steps"] == 4
    assert (g["sample_batches"], g["problems_per_batch"], g["rows_per_step"]) == (2, 12, 36)
    with pytest.raises(config_lib.ConfigError, match="grpo.updates"):
        grpo_stage.accounting(c, 25)
    for field, value, message in (("updates", 3, "divide rl.steps"), ("eps_clip", 0.0, "eps_clip"),
                                  ("kl_beta", -1.0, "kl_beta"), ("rewards", ("best",), "grpo.rewards")):
        c = tiny_config()
        c.grpo[field] = value
        with pytest.raises(config_lib.ConfigError, match=message):
            config_lib.validate(c)


@pytest.mark.slow
def test_final_answer_grpo_round_records_its_budget(tmp_path):
    """SFT and one final-answer GRPO round of a tiny run: its budget, a record per sample batch, its KL to the
    SFT policy (0 at the first batch, drawn from the SFT policy itself), and its export."""
    c = tiny_config()
    c.grpo.rewards, c.rl.rounds, c.grpo.optimizer.warmup_steps = ("final",), 1, 1
    workdir = str(tmp_path / "run")
    results = reward_run.run(c, workdir, ("sft", "grpo"))
    assert results["grpo_final_1"]["best_step"] in (2, 4)
    budget = json.load(open(os.path.join(workdir, "grpo_final_1", "accounting.json")))
    assert budget["grpo"]["samples"] == budget["expert_iteration"]["samples"] == 72
    rounds = grpo_stage.read_rounds(workdir, "grpo_final_1")
    assert [(r["batch"], r["step"], r["samples"]) for r in rounds] == [(0, 0, 36), (1, 2, 36)]
    assert abs(rounds[0]["kl"]) < 1e-5 and 0.0 <= rounds[0]["equal_reward_groups"] <= 1.0
    assert os.path.isdir(os.path.join(workdir, "grpo_final_1", "export"))


@pytest.mark.slow
def test_grpo_rows_trace_deltas_and_curves(tmp_path):
    """ORM and PRM GRPO after the reward models, evaluated beside expert iteration: their rows, the trace-error
    pairs, the recorded budgets and the curves' plot."""
    c = tiny_config()
    c.rl.rounds, c.rl.rewards, c.grpo.rewards, c.grpo.optimizer.warmup_steps = 1, ("prm",), ("orm", "prm"), 1
    workdir = str(tmp_path / "run")
    reward_run.run(c, workdir)
    saved = json.load(open(os.path.join(workdir, "results.json")))
    assert {"ORM-GRPO greedy", "PRM-GRPO greedy", "PRM-RL greedy"} <= set(saved["table"])
    assert {"PRM-GRPO greedy - ORM-GRPO greedy", "PRM-GRPO greedy - PRM-RL greedy"} <= set(saved["trace_error_delta"])
    for stage in ("grpo_orm_1", "grpo_prm_1"):
        record = saved["grpo"][stage]
        assert record["grpo"]["samples"] == record["expert_iteration"]["samples"] == 72
        assert record["sample_batches_drawn"] == 2 and record["mean_kl"] >= 0
    assert saved["rl_kept"]["rl_prm_1"]["gradient_steps"] == 4
    assert os.path.getsize(os.path.join(workdir, "grpo_curves.png")) > 1000


@pytest.mark.slow
def test_grpo_with_lora_trains_adapters_on_the_sft_policy(tmp_path):
    """With `model.lora`, GRPO trains fresh adapters on the (merged) SFT policy: its first sample batch is drawn
    from exactly the reference (KL 0), its checkpoint holds adapters alone, and its export moves only the adapted
    kernels away from the SFT policy's."""
    import orbax.checkpoint as ocp

    from refiner_jax import checkpoint as ckpt_lib

    c = tiny_config()
    c.model.lora.rank, c.model.lora.target_modules = 4, "q,v"
    c.grpo.rewards, c.rl.rounds, c.grpo.optimizer.warmup_steps = ("final",), 1, 1
    c.grpo.optimizer.learning_rate = 1e-2
    workdir = str(tmp_path / "run")
    reward_run.run(c, workdir, ("sft", "grpo"))
    rounds = grpo_stage.read_rounds(workdir, "grpo_final_1")
    assert len(rounds) == 2 and abs(rounds[0]["kl"]) < 1e-5
    stage = os.path.join(workdir, "grpo_final_1")
    step = max(d for d in os.listdir(os.path.join(stage, "ckpt")) if d.isdigit())
    saved = ocp.PyTreeCheckpointer().metadata(os.path.join(stage, "ckpt", step, "state"))
    saved = getattr(saved, "item_metadata", saved) or saved
    assert set(saved["params"]) == {"adapters"}
    sft, _ = ckpt_lib.load_params(os.path.join(workdir, "sft", "export"))
    grpo_params, _ = ckpt_lib.load_params(os.path.join(stage, "export"))
    moved = {jax.tree_util.keystr(path) for path, a in jax.tree_util.tree_flatten_with_path(sft)[0]
             if not np.array_equal(np.asarray(a), np.asarray(_at(grpo_params, path)))}
    # the adapted kernels are T5's "q" and "v", named query and value in our tree
    assert moved and all(re.search(r"\['(query|value)'\]$", p) for p in moved), moved


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree
