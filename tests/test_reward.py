"""Reward models: labels, the step encoding, one-pass scoring against scoring each prefix on its own, the loss
against a hand computation, and a sharded reward-model train step on 8 virtual devices against 1 device.

The multi-device check runs this file as a script in a subprocess (XLA_FLAGS must be set before JAX starts).
"""
import math
import os
import sys

import numpy as np
import pytest

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from _tolerance import NETWORK, REORDER, assert_f32_close, check_close, tolerance  # noqa: E402
from refiner_jax.reward import batches as reward_batches, labels as reward_labels, scorer as reward_scorer  # noqa: E402
from refiner_jax.models import decoder as decoder_lib  # noqa: E402
from refiner_jax.models.decoder_config import preset as decoder_preset  # noqa: E402
from refiner_jax.models.reward_model import RewardModel, reference_lm, step_log_odds  # noqa: E402
from refiner_jax.models.t5 import T5, shift_right  # noqa: E402
from refiner_jax.models.t5_config import preset  # noqa: E402
from refiner_jax.tasks import mwp  # noqa: E402
from refiner_jax.tasks.base import Example  # noqa: E402
from refiner_jax.tokenizers import ByteTokenizer  # noqa: E402
from refiner_jax.training.steps import reward_loss  # noqa: E402

G3 = "#0: add ( number0, number1 ) | #1: multiply ( #0, number2 ) | #2: subtract ( #1, number3 )"
WRONG_STEP_1 = "#0: add ( number1, number0 ) | #1: multiply ( #0, number3 ) | #2: subtract ( #1, number3 )"
NUMBERS = (1.0, 2.0, 3.0, 4.0)  # G3 = (1 + 2) * 3 - 4 = 5


def example(z=G3):
    value = mwp.execute(z, NUMBERS)
    return Example("u", "a problem with four numbers", z, repr(value), {"numbers": list(NUMBERS), "answer": value})


# --------------------------------------------------------------------------------------------------- labels


@pytest.mark.parametrize("hypothesis,orm,prm", [
    (G3, [True] * 3, [True] * 3),
    (WRONG_STEP_1, [False] * 3, [True, False, False]),
    # 3 * 3 - 4 = 5: the right answer by steps that are no subexpressions of the gold (1 + 2) * 3 - 4.
    ("#0: multiply ( number2, number2 ) | #1: subtract ( #0, number3 )", [True] * 2, [False, False]),
    ("#0: add ( number0, number1 ) | #1: multiply ( #0, number2 )", [False] * 2, [True, True]),
])
def test_orm_and_prm_labels_by_hand(hypothesis, orm, prm):
    task = mwp.MWPTask()
    assert reward_labels.step_labels("orm", task, example(), hypothesis) == orm
    assert reward_labels.step_labels("prm", task, example(), hypothesis) == prm
    with pytest.raises(ValueError, match="kind"):
        reward_labels.step_labels("vrm", task, example(), hypothesis)


def test_step_ends_cover_the_text_and_reject_foreign_steps():
    steps = mwp.MWPTask().split_steps(G3 + " <END>")
    ends = reward_batches.step_ends(G3 + " <END>", steps)
    assert ends == [G3.index(" |"), G3.index(" | #2"), len(G3 + " <END>")]  # the end marker belongs to the last
    with pytest.raises(ValueError, match="substrings"):
        reward_batches.step_ends(G3, ["#1: nothing like it"])


def test_step_ends_are_token_boundaries_in_training_and_scoring_batches():
    """The token read for step i is the last token of exactly text[:end_i], in the training batch of a labelled
    solution and in the scorer's batch of the same text."""
    tok = ByteTokenizer()
    task = mwp.MWPTask()
    text = WRONG_STEP_1 + " <END>"
    train = reward_batches.t5_batch(tok, [reward_labels.labelled("prm", task, example(), text)], 8, 128, 4)
    ends = reward_batches.step_ends(text, task.split_steps(text))
    positions = train["positions"][0, :3]
    for p, end in zip(positions, ends):
        assert tok.decode(train["targets"][0, :p]) == text[:end]
    assert train["labels"][0].tolist() == [1.0, 0.0, 0.0, 0.0] and train["label_mask"][0].tolist() == [1, 1, 1, 0]
    model = RewardModel(T5(preset("t5-tiny", vocab_size=384, num_layers=1)), "token", (ord("+") + 3, ord("-") + 3))
    scorer = reward_scorer.RewardScorer(model, None, tok, 8, 128, 4, batch_size=2, split_steps=task.split_steps)
    seen = {}
    scorer._fn = lambda params, batch: seen.update(batch) or jnp.zeros(batch["positions"].shape)
    scorer.step_scores([example().x], [text])
    for key in ("inputs", "targets", "positions", "solution_mask"):
        np.testing.assert_array_equal(seen[key][:1], train[key])


def test_budget_cuts_mask_steps_that_do_not_fit():
    tok = ByteTokenizer()
    task = mwp.MWPTask()
    batch = reward_batches.t5_batch(tok, [reward_labels.labelled("orm", task, example(), G3)], 8, 40, 2)
    assert batch["label_mask"][0].tolist() == [1, 0]  # step 1 ends past 39 tokens; only 2 steps kept anyway
    assert batch["targets"][0, -1] == tok.eos_id


def test_label_ids_need_single_tokens():
    tok = ByteTokenizer()
    assert reward_labels.label_ids(tok, ("+", "-")) == tuple(tok.encode(c, add_eos=False)[0] for c in "+-")
    with pytest.raises(ValueError, match="label_tokens"):
        reward_labels.label_ids(tok, ("good", "-"))


# --------------------------------------------------------------------------------------------------- one pass


def _perturb_params(params, seed=1):
    """Random values for every leaf (the scalar head starts at zero, which would hide misplaced reads)."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [0.5 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def _tiny_lm(family):
    if family == "t5":
        return T5(preset("t5-tiny", vocab_size=384, num_layers=2, dropout_rate=0.0))
    return decoder_lib.Decoder(decoder_preset("llama-tiny", vocab_size=384, max_positions=256))


def _batch_of(family, tok, sols):
    if family == "t5":
        return reward_batches.t5_batch(tok, sols, 40, 112, 4)
    return reward_batches.decoder_batch(tok, sols, 160, 4)


def _init(model, family, batch):
    lm_inputs = (batch["inputs"], batch["targets"]) if family == "t5" else (batch["tokens"], batch["mask"])
    return _perturb_params(model.init(jax.random.key(0), jnp.asarray(batch["positions"]), *lm_inputs)["params"])


@pytest.mark.parametrize("family", ["t5", "decoder"])
@pytest.mark.parametrize("head,likelihood", [("token", False), ("scalar", False), ("token", True)])
def test_one_forward_pass_equals_scoring_each_prefix_separately(family, head, likelihood):
    tok = ByteTokenizer()
    task = mwp.MWPTask()
    model = RewardModel(_tiny_lm(family), head, reward_labels.label_ids(tok, ("+", "-")), likelihood)
    solutions = [reward_labels.labelled("prm", task, example(), h) for h in (G3 + " <END>", WRONG_STEP_1)]

    def batch_of(sols):
        return _batch_of(family, tok, sols)

    full = batch_of(solutions)
    params = _init(model, family, full)
    scores = np.asarray(step_log_odds(model, params, full))  # [2, 4]
    # Reading one token off would change a score by far more than the float32 rounding allowed below.
    assert np.abs(np.diff(scores[:, :3], axis=1)).min() > 1e-2
    for row, sol in enumerate(solutions):
        ends = reward_batches.step_ends(sol.text, sol.steps)
        for i, end in enumerate(ends):
            prefix = reward_labels.LabelledSolution(sol.prompt, sol.text[:end], sol.steps[:i + 1], sol.labels[:i + 1])
            alone = np.asarray(step_log_odds(model, params, batch_of([prefix])))[0, i]
            assert_f32_close(scores[row, i], alone, ulps=NETWORK, scale=np.abs(scores).max(),
                             what=f"{family} one-pass step score vs the prefix alone")


@pytest.mark.parametrize("family", ["t5", "decoder"])
def test_likelihood_term_is_the_lms_log_probability_of_the_solution_so_far(family):
    """With `likelihood`, a step's log-odds gain scale x sum of log p(token | everything before it) over the
    solution's tokens up to the step's last, summed here token by token from the plain LM's logits."""
    tok = ByteTokenizer()
    task = mwp.MWPTask()
    lm = _tiny_lm(family)
    with_term = RewardModel(lm, "token", reward_labels.label_ids(tok, ("+", "-")), likelihood=True)
    without = RewardModel(lm, "token", reward_labels.label_ids(tok, ("+", "-")))
    solution = reward_labels.labelled("orm", task, example(), WRONG_STEP_1)
    batch = _batch_of(family, tok, [solution])
    params = dict(_init(with_term, family, batch))
    params["likelihood_scale"] = jnp.asarray(0.7, jnp.float32)
    gain = np.asarray(step_log_odds(with_term, params, batch) - step_log_odds(without, params, batch))
    prompt = tok.encode(solution.prompt)
    ids, last = reward_batches.encode_solution(tok, solution.text, solution.steps)
    if family == "t5":
        logits = lm.apply({"params": params["lm"]}, batch["inputs"], shift_right(batch["targets"]))[0]
        at = list(range(len(ids)))  # logits[j] predicts solution token j
    else:
        logits = lm.apply({"params": params["lm"]}, batch["tokens"], attention_mask=batch["mask"])[0]
        at = [len(prompt) + j - 1 for j in range(len(ids))]  # the position before solution token j predicts it
    logits = np.asarray(logits, np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    for i, end in enumerate(last):
        expect = sum(log_probs[at[j], ids[j]] for j in range(end + 1))
        # A sum of log-probs (all <= 0) from the same logits: its magnitude bounds its terms'.
        check_close(f"{family} likelihood term", abs(gain[0, i] - 0.7 * expect), ulps=REORDER, scale=abs(0.7 * expect))


@pytest.mark.parametrize("family", ["t5", "decoder"])
def test_policy_step_log_probs_are_the_lms_log_probability_of_each_step(family):
    """`scorer.policy_step_log_probs`, the policy as a step verifier: each step's sum of log p(token | everything
    before it), summed here token by token from the plain LM's logits."""
    tok = ByteTokenizer()
    task = mwp.MWPTask()
    lm = _tiny_lm(family)
    solution = reward_labels.labelled("orm", task, example(), WRONG_STEP_1)
    batch = _batch_of(family, tok, [solution])
    params = _init(RewardModel(lm, "token", (0, 0)), family, batch)["lm"]
    got = reward_scorer.policy_step_log_probs(params, lm.config, tok, task, 40, 112, 4, [solution.prompt],
                                              [solution.text])[0]
    prompt = tok.encode(solution.prompt)
    ids, last = reward_batches.encode_solution(tok, solution.text, solution.steps)
    if family == "t5":
        logits = lm.apply({"params": params}, batch["inputs"], shift_right(batch["targets"]))[0]
        at = list(range(len(ids)))
    else:
        logits = lm.apply({"params": params}, batch["tokens"], attention_mask=batch["mask"])[0]
        at = [len(prompt) + j - 1 for j in range(len(ids))]
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1, keepdims=True)
    log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    starts = [0] + [end + 1 for end in last[:-1]]
    assert len(got) == len(last) == 3
    for i, (start, end) in enumerate(zip(starts, last)):
        expect = sum(log_probs[at[j], ids[j]] for j in range(start, end + 1))
        # Differences of running sums of log-probs: the running sum's magnitude bounds the rounding.
        check_close(f"{family} step {i} log-prob", abs(got[i] - expect), ulps=REORDER,
                    scale=abs(sum(log_probs[at[j], ids[j]] for j in range(end + 1))))


def test_decoder_reference_rows_for_the_joint_lm_loss():
    """The decoder's reference targets are the gold solution's tokens after the prompt, each predicted from the
    position before it: the cross-entropy equals the one summed by hand from the LM's logits."""
    tok = ByteTokenizer()
    task = mwp.MWPTask()
    lm = _tiny_lm("decoder")
    model = RewardModel(lm, "token", reward_labels.label_ids(tok, ("+", "-")))
    solution = reward_labels.labelled("orm", task, example(), WRONG_STEP_1)
    batch = _batch_of("decoder", tok, [solution, reward_labels.LabelledSolution("q", "#0: x", ("#0: x",), (True,))])
    params = _init(model, "decoder", batch)
    logits, targets, weights = reference_lm(model, params, batch)
    from refiner_jax.training.steps import masked_cross_entropy
    ce, count = masked_cross_entropy(logits, targets, weights)
    row = tok.encode(solution.prompt) + tok.encode(G3)
    full = np.asarray(lm.apply({"params": params["lm"]}, jnp.asarray([row]), attention_mask=jnp.ones((1, len(row)))),
                      np.float64)[0]
    p = len(tok.encode(solution.prompt))
    expect = -sum(full[t - 1, row[t]] - np.log(np.exp(full[t - 1]).sum()) for t in range(p, len(row)))
    assert float(count) == len(row) - p  # the second row has no reference: no weight
    check_close("decoder reference cross-entropy", abs(float(ce) - expect), ulps=NETWORK, scale=expect)


# --------------------------------------------------------------------------------------------------- loss


def test_reward_loss_by_hand():
    log_odds = np.array([[2.0, -1.0, 5.0], [0.5, 3.0, -2.0]], np.float32)
    batch = {"labels": np.array([[1, 0, 1], [0, 1, 0]], np.float32),
             "label_mask": np.array([[1, 1, 0], [1, 1, 1]], np.float32)}
    loss_sum, sums = reward_loss(lambda p, b, r: jnp.asarray(log_odds))(None, batch, None)
    # -log sigmoid(2), -log(1 - sigmoid(-1)), (masked), -log(1 - sigmoid(0.5)), -log sigmoid(3), -log(1 - sigmoid(-2))
    expect = sum(math.log1p(math.exp(-v)) for v in (2.0, 1.0, -0.5, 3.0, 2.0))
    assert float(loss_sum) == pytest.approx(expect, rel=1e-6)
    assert float(sums["tokens"]) == 5 and float(sums["accuracy_sum"]) == 4  # 0.5 for a wrong step is the miss


def test_pairwise_term_by_hand():
    """Pairs are (right, wrong) solutions of one problem (same group); a solution's label and score are its last
    labelled step's; rows without a labelled step never pair."""
    log_odds = np.array([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0], [0.2, 0.0], [0.0, 0.0], [-4.0, 0.0]], np.float32)
    batch = {"labels": np.array([[1, 1], [1, 0], [1, 0], [0, 0], [1, 0], [0, 0]], np.float32),
             "label_mask": np.array([[1, 1], [1, 1], [1, 0], [1, 0], [0, 0], [1, 0]], np.float32),
             "group": np.array([0, 0, 1, 1, 1, 1], np.int32)}
    # Solution scores 2, -1 | 3, 0.2, (none), -4; labels 1, 0 | 1, 0, (none), 0. Pairs: (0, 1), (2, 3), (2, 5).
    pairs = [(2.0, -1.0), (3.0, 0.2), (3.0, -4.0)]
    _, plain = reward_loss(lambda p, b, r: jnp.asarray(log_odds))(None, batch, None)
    total, sums = reward_loss(lambda p, b, r: jnp.asarray(log_odds), pairwise_weight=0.5)(None, batch, None)
    expect = sum(math.log1p(math.exp(wrong - right)) for right, wrong in pairs)
    assert float(sums["pair_loss_sum"]) == pytest.approx(expect, rel=1e-6)
    assert float(total) == pytest.approx(float(plain["loss_sum"]) + 0.5 * expect, rel=1e-6)
    _, by_min = reward_loss(lambda p, b, r: jnp.asarray(log_odds), pairwise_weight=1.0, reduction="min")(
        None, batch, None)  # scores 1, -1 | 3, 0.2, -4: the same pairs, row 0 now scores 1
    expect_min = sum(math.log1p(math.exp(wrong - right)) for right, wrong in [(1.0, -1.0)] + pairs[1:])
    assert float(by_min["pair_loss_sum"]) == pytest.approx(expect_min, rel=1e-6)


def test_joint_language_modelling_term_by_hand():
    """lm_weight x the summed token cross-entropy of the reference rows (pad ignored), added to the step loss."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    references = np.array([[2, 4, 1], [3, 1, 0]], np.int32)
    batch = {"labels": np.ones((2, 1), np.float32), "label_mask": np.ones((2, 1), np.float32),
             "references": references}
    log_odds = jnp.zeros((2, 1))
    loss, sums = reward_loss(lambda p, b, r: log_odds,
                             lambda p, b, r: (jnp.asarray(logits), references, references != 0), 0.5)(None, batch, None)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ce = -sum(log_softmax[i, j, references[i, j]] for i in range(2) for j in range(3) if references[i, j])
    assert float(sums["lm_loss_sum"]) == pytest.approx(ce, rel=1e-5)
    assert float(loss) == pytest.approx(2 * math.log(2) + 0.5 * ce, rel=1e-5)


# --------------------------------------------------------------------------------------------------- 8 devices


def _mixed_mesh(n: int) -> tuple:
    """data x fsdp x tensor over n devices: (2, 2, 2) on 8, (2, 1, 2) on 4, (1, 1, 2) on 2."""
    return (2, n // 4, 2) if n >= 4 else (1, 1, n)


def _max_diff(a, b) -> float:
    return max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _multi_device_report() -> dict:
    """Two SGD steps of a reward model on 1 device and on data-, fsdp- and mixed-parallel meshes of every device
    (8 in the test; 2 or 4 when run by hand with fewer virtual devices), and on 1 device with one data shard's
    rows replaced by another's (a dropped shard): the deviation a real sharding bug would show."""
    from refiner_jax import sharding as shd
    from refiner_jax.training import create_train_state, make_train_step, train_state_shardings

    n = jax.device_count()
    tok = ByteTokenizer()
    task = mwp.MWPTask()
    hyps = [G3, WRONG_STEP_1, G3 + " <END>", "#0: add ( number0, number1 )"] * 4
    sols = [reward_labels.labelled(kind, task, example(), h) for kind in ("prm", "orm") for h in hyps[:8]]
    batch = reward_batches.t5_batch(tok, sols, 16, 112, 4)
    batch["group"] = np.arange(16, dtype=np.int32) // 2  # problems of 2 solutions, whole on every data shard
    shard = 16 // n
    dropped = {k: (v if k == "group" else np.concatenate([v[:-shard], v[:shard]])) for k, v in batch.items()}
    report = {"devices": n}
    for name, head, likelihood, pairwise in (("token", "token", False, 0.0), ("scalar", "scalar", False, 0.0),
                                             ("pairwise", "scalar", True, 1.0)):
        model = RewardModel(T5(preset("t5-tiny", vocab_size=384, num_layers=1, dropout_rate=0.0)), head,
                            reward_labels.label_ids(tok, ("+", "-")), likelihood)
        args = (jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 16), jnp.int32), jnp.ones((1, 112), jnp.int32))
        init = lambda k: model.init(k, *args)["params"]  # noqa: E731
        loss = reward_loss(lambda p, b, r: step_log_odds(model, p, b, r), pairwise_weight=pairwise)
        tx = optax.sgd(1e-2 if likelihood else 1.0)  # the likelihood term's gradient sums over every token

        def two_steps(mesh, rows):
            state, _ = create_train_state(init, tx, mesh, seed=0)
            step = make_train_step(loss, tx, mesh, train_state_shardings(init, tx, mesh))
            state, _ = step(state, rows)
            state, metrics = step(state, rows)  # a second step moves the zero head too
            return jax.device_get(state.params), {k: float(v) for k, v in metrics.items()}

        mesh1 = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
        keep = jax.device_get(create_train_state(init, tx, mesh1, seed=0)[0].params)
        params1, m1 = two_steps(mesh1, batch)
        bad_params, bad_m = two_steps(mesh1, dropped)
        ref = {"moved": _max_diff(keep, params1), "loss": m1["loss"], "tokens": m1["tokens"],
               "dropped_shard": {"params_diff": _max_diff(bad_params, params1),
                                 "loss_diff": abs(bad_m["loss"] - m1["loss"])}}
        for mesh_name, axes in (("data", {"data": -1}), ("fsdp", {"fsdp": -1}), ("mixed", _mixed_mesh(n))):
            params, m = two_steps(shd.make_mesh(axes), batch)
            report[f"{name}_{mesh_name}"] = {**ref, "params_diff": _max_diff(params, params1),
                                             "loss_diff": abs(m["loss"] - m1["loss"]),
                                             "pair_loss": m.get("pair_loss", 0.0), "mesh_tokens": m["tokens"]}
    return report


@pytest.fixture(scope="module")
def report():
    from _devices import run_report

    # REFINER_TEST_DEVICES=2 or 4 reruns the comparisons on fewer devices (the tolerance study, docs/testing.md).
    return run_report(__file__, int(os.environ.get("REFINER_TEST_DEVICES", 8)), timeout=600,
                      JAX_DISABLE_MOST_OPTIMIZATIONS="1")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["token", "scalar", "pairwise"])
@pytest.mark.parametrize("mesh", ["data", "fsdp", "mixed"])
def test_sharded_reward_step_equals_single_device(report, variant, mesh):
    """Token and scalar heads, and a scalar head with the likelihood term and the pairwise loss.

    Parameters after two steps differ by the rounding of the gradients' reductions, taken over other shards:
    NETWORK ulps of how far the steps moved them. The loss is a token mean of non-negative terms, so its own
    magnitude bounds the sum of its terms: REORDER ulps of it. One shard's rows dropped must miss both by 10x."""

    r = report[f"{variant}_{mesh}"]
    assert (r["pair_loss"] > 0) == (variant == "pairwise")
    assert r["moved"] > 1e-3  # the steps changed the parameters, so equality below says something
    check_close(f"reward step {variant} {mesh}: params", r["params_diff"], ulps=NETWORK, scale=r["moved"])
    check_close(f"reward step {variant} {mesh}: loss", r["loss_diff"], ulps=REORDER, scale=r["loss"])
    assert r["mesh_tokens"] == r["tokens"] > 0
    bad = r["dropped_shard"]
    assert bad["params_diff"] > 10 * tolerance(NETWORK, r["moved"]), bad
    assert bad["loss_diff"] > 10 * tolerance(REORDER, r["loss"]), bad


if __name__ == "__main__":
    import json

    print(json.dumps(_multi_device_report()))
