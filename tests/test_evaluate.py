"""Evaluation: bootstrap CIs, the refinement table, flips, critic quality and the noise study.

Most tests run a toy task whose outcomes are worked out by hand. Problem i: x = "q{i}", gold z = "g{i}"; the
oracle says "No hint" for the gold and "Use g{i}." otherwise. The generator answers INITIAL[x] at turn 0 and
revises by the feedback: "Use X." -> X, "Change it." -> previous + "!", anything else -> previous + "?". `perturb`
ignores its rng: even problems stay unchanged, odd ones become "w{i}".
"""
import json
import os
import re

import numpy as np
import pytest
from _tolerance import NETWORK, assert_f32_close

from refiner_jax import stats, text_model
from refiner_jax.refiner import critics, evaluation, feedback_loop
from refiner_jax.runs import refiner_eval, run_info
from refiner_jax.tasks import get_task
from refiner_jax.tasks.base import NO_HINT, Example, Feedback, StepError, Task

EXAMPLES = [Example(uid=str(i), x=f"q{i}", z=f"g{i}", y="") for i in range(4)]
INITIAL = {"q0": "g0", "q1": "bad1", "q2": "bad2", "q3": "g3"}
# The trained critic's (stateless) feedback per (uid, hypothesis); anything else gets "No hint".
CRITIC_SCRIPT = {("0", "g0"): "Change it.", ("1", "bad1"): "Use g1.", ("1", "w1"): "Use g1.",
                 ("2", "bad2"): "Hmm.", ("2", "bad2?"): "Use g2."}
_REFINE = re.compile(r"^(q\d+) Previous Answer: (.*) Feedback: (.*)$")


class ToyTask(Task):
    name = "toy"
    error_kinds = ("wrong",)
    primary_metric = "em"

    def critic_input(self, example, hypothesis):
        return f"{example.x} {hypothesis}"

    def oracle_feedback(self, example, hypothesis):
        if hypothesis == example.z:
            return Feedback((), NO_HINT)
        return Feedback((StepError("wrong"),), f"Use {example.z}.")

    def perturb(self, example, rng):
        hypothesis = example.z if int(example.uid) % 2 == 0 else f"w{example.uid}"
        return hypothesis, self.oracle_feedback(example, hypothesis)

    def score(self, predictions, examples):
        right = [p == e.z for p, e in zip(predictions, examples)]
        # `all_right` is a whole-set metric: not the mean of its per-example values.
        return {"em": sum(right) / len(right), "all_right": float(all(right))}


class ToyGenerator:
    def __init__(self):
        self.calls: list[list[str]] = []

    def greedy(self, texts):
        self.calls.append(list(texts))
        out = []
        for text in texts:
            m = _REFINE.match(text)
            if m is None:
                out.append(INITIAL[text])
                continue
            previous, feedback = m.group(2), m.group(3)
            if feedback.startswith("Use "):
                out.append(feedback[4:].rstrip("."))
            elif feedback == "Change it.":
                out.append(previous + "!")
            else:
                out.append(previous + "?")
        return out


class ScriptedCritic:
    def __init__(self):
        self.seen = 0

    def feedback(self, examples, hypotheses):
        self.seen += len(examples)
        return [CRITIC_SCRIPT.get((ex.uid, h), NO_HINT) for ex, h in zip(examples, hypotheses)]


# ----------------------------------------------------------------------------------------------- bootstrap


def test_bootstrap_constant_values_give_a_point_interval():
    assert stats.bootstrap_ci([1.0] * 50, samples=200) == (1.0, 1.0, 1.0)
    assert stats.bootstrap_ci([0.0] * 7, samples=200) == (0.0, 0.0, 0.0)


def test_bootstrap_two_values_hand_worked():
    # Resampled means of [0, 1] are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and 97.5% percentiles
    # are 0 and 1 (each end holds ~25% of the mass, far above 2.5%).
    assert stats.bootstrap_ci([0.0, 1.0], samples=4000, seed=3) == (0.5, 0.0, 1.0)


def test_bootstrap_binomial_matches_normal_approximation():
    # 50/100 successes: mean 0.5, standard error sqrt(0.25 / 100) = 0.05, 95% CI ~ 0.5 -/+ 1.96 * 0.05.
    mean, low, high = stats.bootstrap_ci([1.0] * 50 + [0.0] * 50, samples=4000, seed=1)
    assert mean == 0.5
    assert low == pytest.approx(0.402, abs=0.02) and high == pytest.approx(0.598, abs=0.02)


def test_bootstrap_matches_scipy_percentile_bootstrap():
    scipy_stats = pytest.importorskip("scipy.stats")
    values = np.random.default_rng(0).normal(3.0, 2.0, size=300)
    ref = scipy_stats.bootstrap((values,), np.mean, n_resamples=6000, method="percentile", confidence_level=0.95,
                                random_state=np.random.default_rng(1))
    mean, low, high = stats.bootstrap_ci(values, samples=6000, seed=2)
    width = ref.confidence_interval.high - ref.confidence_interval.low
    assert mean == pytest.approx(values.mean())
    assert low == pytest.approx(ref.confidence_interval.low, abs=0.05 * width)
    assert high == pytest.approx(ref.confidence_interval.high, abs=0.05 * width)


def test_bootstrap_is_seeded_and_independent_of_memory_blocking(monkeypatch):
    values = np.random.default_rng(5).random(101)
    whole = stats.bootstrap_ci(values, samples=500, seed=9)
    assert stats.bootstrap_ci(values, samples=500, seed=9) == whole
    monkeypatch.setattr(stats, "_MAX_BOOTSTRAP_CELLS", 101 * 7)  # blocks of 7 resamples
    assert stats.bootstrap_ci(values, samples=500, seed=9) == pytest.approx(whole)


def test_bootstrap_rejects_bad_arguments_and_handles_empty():
    with pytest.raises(ValueError, match="samples"):
        stats.bootstrap_ci([1.0], samples=0)
    with pytest.raises(ValueError, match="alpha"):
        stats.bootstrap_ci([1.0], alpha=1.5)
    assert all(np.isnan(v) for v in stats.bootstrap_ci([]))


# ----------------------------------------------------------------------------------------------- refinement
# Hand-worked trajectories of the toy (T=3):
#   trained critic: q0 g0 -Change it.-> g0! -No hint (stop)        right, wrong, wrong, wrong
#                   q1 bad1 -Use g1.-> g1 -No hint                 wrong, right, right, right
#                   q2 bad2 -Hmm.-> bad2? -Use g2.-> g2 -No hint   wrong, wrong, right, right
#                   q3 g3 -No hint                                 right, right, right, right
#   oracle critic:  q0 stop; q1 -> g1; q2 -> g2; q3 stop           all right after turn 1


@pytest.fixture(scope="module")
def toy_results():
    generator, critic = ToyGenerator(), ScriptedCritic()
    results = evaluation.evaluate_refinement(ToyTask(), generator, critic, None, EXAMPLES, turns=3,
                                             bootstrap_samples=500)
    return results, generator, critic


def test_rows_and_metrics_hand_worked(toy_results):
    results, _, _ = toy_results
    rows = {r["key"]: r for r in results["rows"]}
    assert [r["key"] for r in results["rows"]] == ["generator", "critic_t1", "critic", "oracle"]
    assert [r["label"] for r in results["rows"]] == ["Generator alone", "+ trained critic (T=1)",
                                                     "+ trained critic (T=3)", "+ oracle critic (T=3)"]
    assert results["primary_metric"] == "em" and results["num_examples"] == 4
    assert rows["generator"]["metrics"]["em"]["mean"] == 0.5
    assert rows["critic_t1"]["metrics"]["em"]["mean"] == 0.5
    assert rows["critic"]["metrics"]["em"]["mean"] == 0.75
    assert rows["oracle"]["metrics"]["em"] == {"mean": 1.0, "low": 1.0, "high": 1.0}
    for row in rows.values():
        em = row["metrics"]["em"]
        assert 0.0 <= em["low"] <= em["mean"] <= em["high"] <= 1.0
        assert em["low"] * 4 == int(em["low"] * 4)  # a resampled mean of four 0/1 values


def test_paired_gain_hand_worked(toy_results):
    rows = {r["key"]: r for r in toy_results[0]["rows"]}
    assert "gain" not in rows["generator"]
    # Per-example change from turn 0: T=1 trained critic q0 -1 (g0 -> g0!), q1 +1; T=3 adds q2 +1; oracle q1, q2 +1.
    assert rows["critic_t1"]["gain"]["mean"] == 0.0
    assert rows["critic"]["gain"]["mean"] == 0.25
    assert rows["oracle"]["gain"]["mean"] == 0.5
    for key in ("critic_t1", "critic", "oracle"):
        gain = rows[key]["gain"]
        assert -1.0 <= gain["low"] <= gain["mean"] <= gain["high"] <= 1.0
        assert gain["low"] * 4 == int(gain["low"] * 4) and gain["high"] * 4 == int(gain["high"] * 4)
    assert rows["oracle"]["gain"]["low"] >= 0.0  # no example got worse, so no resample can
    assert rows["critic_t1"]["gain"]["low"] < 0.0 < rows["critic_t1"]["gain"]["high"]


def test_whole_set_metric_keeps_task_value_without_ci(toy_results):
    rows = {r["key"]: r for r in toy_results[0]["rows"]}
    # Generator alone: 2/4 right, so all_right is 0 for the set although the per-example mean is 0.5.
    assert rows["generator"]["metrics"]["all_right"] == {"mean": 0.0, "low": None, "high": None}
    # Oracle: every example right; the whole-set value equals the per-example mean, so it gets a CI.
    assert rows["oracle"]["metrics"]["all_right"] == {"mean": 1.0, "low": 1.0, "high": 1.0}


def test_one_turn_zero_generation_and_no_rerun(toy_results):
    _, generator, critic = toy_results
    first_turn_calls = [c for c in generator.calls if all(t in INITIAL for t in c)]
    assert first_turn_calls == [["q0", "q1", "q2", "q3"]]
    # Trained critic: 4 (turn 1) + 3 (turn 2: q0, q1, q2) + 1 (turn 3: q2) in refinement + 4 held-out hypotheses.
    assert critic.seen == 12


def test_flips_hand_worked(toy_results):
    flips = toy_results[0]["flips"]
    assert flips["critic"] == [
        {"from": 0, "to": 1, "wrong_to_right": 1, "right_to_wrong": 1, "net": 0, "revised": 3},
        {"from": 1, "to": 2, "wrong_to_right": 1, "right_to_wrong": 0, "net": 1, "revised": 1},
        {"from": 2, "to": 3, "wrong_to_right": 0, "right_to_wrong": 0, "net": 0, "revised": 0},
        {"from": 0, "to": 3, "wrong_to_right": 2, "right_to_wrong": 1, "net": 1, "revised": 3},
    ]
    assert flips["oracle"][0] == {"from": 0, "to": 1, "wrong_to_right": 2, "right_to_wrong": 0, "net": 2,
                                  "revised": 2}
    assert flips["oracle"][-1] == {"from": 0, "to": 3, "wrong_to_right": 2, "right_to_wrong": 0, "net": 2,
                                   "revised": 2}


def test_critic_quality_hand_worked(toy_results):
    # Held-out set: q0 g0 (gold No hint; critic "Change it." -> miss, false alarm), q1 w1 (gold "Use g1."; hit),
    # q2 g2 (gold No hint; critic No hint -> hit), q3 w3 (gold "Use g3."; critic No hint -> miss).
    q = toy_results[0]["critic_quality"]
    assert q["n"] == 4
    assert {k: (v["n"], v["mean"]) for k, v in q["feedback_em"].items()} == {
        "all": (4, 0.5), "no_error": (2, 0.5), "any_error": (2, 0.5), "wrong": (2, 0.5)}
    det = q["has_error"]
    assert (det["precision"], det["recall"], det["f1"]) == (0.5, 0.5, 0.5)
    # Turn-0 hypotheses g0, bad1, bad2, g3: critic says Change it. / Use g1. / Hmm. / No hint; oracle says
    # No hint / Use g1. / Use g2. / No hint -> EM 2/4; flagged 3, truly wrong 2, both 2.
    gen = q["on_generator"]
    assert gen["feedback_em"] == 0.5
    assert gen["has_error"]["precision"] == pytest.approx(2 / 3) and gen["has_error"]["recall"] == 1.0


def test_trajectories_are_returned(toy_results):
    records = {(r["setting"], r["uid"]): r for r in toy_results[0]["trajectories"]}
    assert records[("critic", "2")]["hypotheses"] == ["bad2", "bad2?", "g2"]
    assert records[("critic", "2")]["feedback"] == ["Hmm.", "Use g2.", "No hint"]
    assert records[("oracle", "0")]["hypotheses"] == ["g0"]


def test_without_critic_only_generator_and_oracle_rows():
    results = evaluation.evaluate_refinement(ToyTask(), ToyGenerator(), None, None, EXAMPLES, turns=2,
                                             bootstrap_samples=50)
    assert [r["label"] for r in results["rows"]] == ["Generator alone", "+ oracle critic (T=2)"]
    assert "critic_quality" not in results and list(results["flips"]) == ["oracle"]


def test_noise_study_hand_worked():
    # epsilon 1: every feedback is the oracle's on toy.perturb: No hint for even problems (q2 stays wrong),
    # "Use g{i}." for odd ones -> 3/4. epsilon 0: the oracle -> 4/4. In between: q2 is the only one at stake.
    noise = evaluation.noise_study(ToyTask(), ToyGenerator(), None, EXAMPLES, epsilons=(0.0, 0.5, 1.0), turns=3,
                                   bootstrap_samples=200)
    assert noise["primary_metric"] == "em"
    by_eps = {r["epsilon"]: r for r in noise["rows"]}
    assert by_eps[0.0]["mean"] == 1.0 and (by_eps[0.0]["low"], by_eps[0.0]["high"]) == (1.0, 1.0)
    assert by_eps[1.0]["mean"] == 0.75
    assert by_eps[0.5]["mean"] in (0.75, 1.0)
    # Over 400 copies of q2 (even uids: random feedback is "No hint", which stops them wrong), epsilon 0.5 fixes
    # the half whose first feedback is the oracle's.
    at_stake = [Example(str(2 * i), EXAMPLES[2].x, EXAMPLES[2].z, EXAMPLES[2].y) for i in range(400)]
    half = evaluation.noise_study(ToyTask(), ToyGenerator(), None, at_stake, epsilons=(0.0, 0.5, 1.0), turns=3,
                                  bootstrap_samples=50)
    means = [r["mean"] for r in half["rows"]]
    assert means[0] == 1.0 and means[2] == 0.0
    assert 0.4 < means[1] < 0.6
    with pytest.raises(ValueError, match="epsilon"):
        evaluation.noise_study(ToyTask(), ToyGenerator(), None, EXAMPLES, epsilons=(1.5,))


def test_critic_quality_ignores_sentence_order_on_mwp():
    task = get_task("mwp")
    examples = task.load("test")[:40]

    def reversed_oracle(exs, hyps):  # the oracle's sentences in reverse order: still an exact match
        out = []
        for ex, h in zip(exs, hyps):
            sentences = re.split(r"(?<=\.) ", task.oracle_feedback(ex, h).text)
            out.append(" ".join(reversed(sentences)))
        return out

    quality = evaluation.critic_quality(task, critics.CallableCritic(reversed_oracle), examples, bootstrap_samples=50)
    assert quality["feedback_em"]["all"]["mean"] == 1.0
    assert quality["has_error"]["precision"] == 1.0 and quality["has_error"]["recall"] == 1.0
    assert sum(v["n"] for k, v in quality["feedback_em"].items() if k == "no_error") > 0
    # A critic that always says No hint: EM only on the unchanged hypotheses; it never flags an error.
    silent = evaluation.critic_quality(task, critics.CallableCritic(lambda e, h: ["No hint"] * len(e)), examples,
                                       bootstrap_samples=50)
    assert silent["feedback_em"]["no_error"]["mean"] == 1.0
    assert silent["feedback_em"]["operator"]["mean"] == 0.0
    assert silent["has_error"]["recall"] == 0.0 and np.isnan(silent["has_error"]["precision"])
    assert quality["auroc"] is None  # a plain callable has no confidence to rank by

    class ConfidentOracle:  # the oracle's feedback, and a "No hint" log-probability of 0 when right, -5 when wrong
        feedback = staticmethod(critics.OracleCritic(task).feedback)

        @staticmethod
        def confidence(exs, hyps):
            return np.array([0.0 if task.oracle_feedback(ex, h).ok else -5.0 for ex, h in zip(exs, hyps)])

    confident = evaluation.critic_quality(task, ConfidentOracle(), examples, bootstrap_samples=50)
    assert confident["auroc"] == 1.0 and confident["paired_auroc"] == 1.0
    assert quality["paired_auroc"] is None


def test_error_auroc_hand_worked_and_against_pair_counting():
    # Wrong hypotheses have confidences 0.1 and 0.5, right ones 0.9 and 0.5: of the 4 (wrong, right) pairs three
    # rank the wrong one lower and one ties -> 3.5 / 4.
    assert stats.error_auroc([0.9, 0.1, 0.5, 0.5], [False, True, True, False]) == 0.875
    assert stats.error_auroc([1, 2, 3], [True, False, False]) == 1.0
    assert stats.error_auroc([3, 2, 1], [True, False, False]) == 0.0
    assert stats.error_auroc([7, 7, 7], [True, False, True]) == 0.5
    assert np.isnan(stats.error_auroc([1.0, 2.0], [False, False]))
    rng = np.random.default_rng(0)
    conf = rng.integers(0, 6, size=300).astype(float)  # many ties
    wrong = rng.random(300) < 0.4
    pairs = conf[wrong][:, None] - conf[~wrong][None, :]
    assert stats.error_auroc(conf, wrong) == pytest.approx(np.mean((pairs < 0) + 0.5 * (pairs == 0)))


# ----------------------------------------------------------------------------------------------- trained runs


class _MWPFakeModel:
    """Generator: the gold formula for problems with an even index, a formula with a wrong operator for odd ones,
    and the gold whenever it revises. Critic: always "No hint"."""

    def __init__(self, examples, role):
        self.gold = {ex.x: (i, ex.z) for i, ex in enumerate(examples)}
        self.role = role

    def greedy(self, texts):
        if self.role == "critic":
            return ["No hint"] * len(texts)
        out = []
        for text in texts:
            x = text.split(" Previous Answer: ")[0]
            i, gold = self.gold[x]
            revising = " Previous Answer: " in text
            out.append(gold if revising or i % 2 == 0 else gold.replace("add", "multiply").replace(
                "subtract", "multiply").replace("divide", "multiply") + " | #9: add ( number0, number0 )")
        return out

    def generate_with_log_probs(self, texts, num_samples=1, **_):
        return [[t] * num_samples for t in self.greedy(texts)], np.zeros((len(texts), num_samples))

    def score(self, texts, targets):  # every target equally likely: the critic's "No hint" stands
        return np.zeros(len(texts))


def test_evaluate_run_writes_reports(tmp_path, monkeypatch):
    task = get_task("mwp")
    examples = task.load("test")[:5]
    config = {"seed": 0, "task": {"name": "mwp", "data_dir": "", "options": {}},
              "lengths": {"refine_input": 64, "target": 32, "critic_input": 64, "feedback": 32},
              "refiner": {"template": "{x} Previous Answer: {z} Feedback: {f}"},
              "eval": {"examples": 5, "turns": 2, "batch_size": 8, "noise_levels": [0.0, 1.0],
                       "bootstrap_samples": 100}}
    workdir = tmp_path / "run"
    for stage in ("critic", "refiner", "matched"):
        (workdir / stage / "export").mkdir(parents=True)
    (workdir / "critic" / "DONE").write_text(json.dumps({"best_step": 10, "feedback_em": 0.9}))
    (workdir / "config.json").write_text(json.dumps(config))
    (workdir / "metrics.jsonl").write_text(json.dumps({"stage": "critic", "step": 5, "loss": 2.0}) + "\n")
    monkeypatch.setattr(run_info.RunInfo, "tokenizer", lambda self: None)
    loaded = []

    def fake_load(stage_dir, tokenizer, max_input, max_output, bucket=16, batch_size=64, mesh=None):
        loaded.append((os.path.basename(stage_dir), max_input, max_output, batch_size))
        return _MWPFakeModel(examples, os.path.basename(stage_dir))

    monkeypatch.setattr(text_model, "load_text_model", fake_load)
    results = refiner_eval.evaluate_run(str(workdir))
    assert sorted(loaded) == [("critic", 64, 32, 8), ("matched", 64, 32, 8), ("refiner", 64, 32, 8)]
    rows = {r["key"]: r["metrics"]["equation_em_canonical"]["mean"] for r in results["rows"]}
    # Problems 0, 2, 4 right at turn 0; the critic never objects; the oracle gets the other two fixed. The paper's
    # feedback critic cannot solve, so there is no critic-alone row; the matched generator and the best of the
    # generator's (identical) samples answer like the generator, and the matched generator with each critic like
    # the generator with it.
    assert rows == {"generator": 0.6, "critic_t1": 0.6, "critic": 0.6, "oracle": 1.0, "generator_matched": 0.6,
                    "generator_matched_critic": 0.6, "generator_matched_oracle": 1.0, "generator_rerank": 0.6}
    oracle = next(r for r in results["rows"] if r["key"] == "oracle")
    assert set(oracle["gain_vs"]) == {"generator_matched", "generator_matched_critic", "generator_matched_oracle",
                                      "generator_rerank"}
    assert oracle["gain_vs"]["generator_rerank"]["mean"] == pytest.approx(0.4)
    assert oracle["gain_vs"]["generator_matched_oracle"]["mean"] == pytest.approx(0.0)
    assert [(r["epsilon"], r["mean"]) for r in results["noise"]["rows"]][0] == (0.0, 1.0)
    assert results["training"] == {"critic": {"best_step": 10, "feedback_em": 0.9}}
    out = workdir / "eval"
    for name in ("results.md", "results.json", "predictions.jsonl", "noise.png", "curves_critic.png"):
        assert (out / name).is_file(), name
    report = (out / "results.md").read_text()
    assert "| + oracle critic (T=2) | 100.0 [100.0, 100.0] |" in report
    assert ("| Δ vs `generator_matched` | Δ vs `generator_matched_critic` | Δ vs `generator_matched_oracle` | "
            "Δ vs `generator_rerank` |") in report
    assert "| Matched generator + oracle critic (T=2) | 100.0 [100.0, 100.0] |" in report
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"][3]["gain_vs"]["generator_matched"]["mean"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="examples=0: evaluate at least one test problem"):
        refiner_eval.evaluate_run(str(workdir), max_examples=0)


def test_evaluate_run_without_generator_names_the_fix(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"task": {"name": "mwp", "data_dir": "", "options": {}},
                                                      "lengths": {}}))
    with pytest.raises(FileNotFoundError, match="refiner/export or warmup/export"):
        refiner_eval.evaluate_run(str(tmp_path), max_examples=2)


# ----------------------------------------------------------------------------------------------- the loop's edges


@pytest.mark.parametrize("text,stop", [("No hint", True), ("no hint", True), ("  No   hint. ", True),
                                       ("NO HINT!", True), ("No hints", False), ("Use g1.", False), ("", False)])
def test_no_hint_in_any_spelling_stops_refinement(text, stop):
    critic = critics.CallableCritic(lambda examples, hypotheses: [text] * len(examples))
    trajectory = feedback_loop.refine(ToyGenerator(), critic, ToyTask(), EXAMPLES[1:2], turns=2)[0]
    assert trajectory.feedback == ([text] if stop else [text, text])
    assert len(trajectory.hypotheses) == (1 if stop else 3)
    assert evaluation._has_error(text) is not stop


def test_a_critic_that_skips_hypotheses_is_an_error():
    critic = critics.CallableCritic(lambda examples, hypotheses: ["Use g1."] * (len(examples) - 1))
    with pytest.raises(ValueError, match="returned 3 feedback texts for 4 hypotheses"):
        feedback_loop.refine(ToyGenerator(), critic, ToyTask(), EXAMPLES, turns=1)


class _EchoModel:
    """Stands in for the critic's TextModel: 'feedback' names the input it was given; "No hint" never wins."""

    def generate_with_log_probs(self, texts):
        return [[f"saw <{t}>"] for t in texts], np.zeros((len(texts), 1))

    def score(self, texts, targets):
        return np.array([0.0 if target != NO_HINT else -1.0 for target in targets])


def test_model_critic_takes_question_strings():
    task = get_task("mwp")
    critic = critics.ModelCritic(_EchoModel(), task)
    questions = ["Tom has 3 apples and buys 5 more. How many apples does he have?", "Ann has 9 pens."]
    got = critic.feedback(questions, ["#0: 3 + 5", "#0: 9 - 1"])
    want = [task.critic_input(Example("any", q, "", ""), h) for q, h in zip(questions, ["#0: 3 + 5", "#0: 9 - 1"])]
    assert got == [f"saw <{w}>" for w in want]
    with pytest.raises(ValueError, match="2 problems but 1 hypotheses"):
        critic.feedback(questions, ["#0: 3 + 5"])
    moral = critics.ModelCritic(_EchoModel(), get_task("moral_stories"))
    with pytest.raises(ValueError, match=r"reads the gold \['y'\].*pass Example objects"):
        moral.feedback(["A story."], ["a norm"])


def test_text_model_log_probs_follow_each_text_across_batches_and_padding():
    """Three prompts in batches of two (the last one padded): each text's greedy output and log-probability are the
    sampler's for that prompt run alone."""
    import jax

    from refiner_jax.models import t5_sampling
    from refiner_jax.models.t5 import T5
    from refiner_jax.models.t5_config import preset
    from refiner_jax.tokenizers import ByteTokenizer

    tok = ByteTokenizer()
    config = preset("t5-tiny", vocab_size=tok.vocab_size)
    params = T5(config).init(jax.random.key(0), np.ones((1, 8), np.int32), np.ones((1, 8), np.int32))["params"]
    model = text_model.TextModel(config, params, tok, max_input=16, max_output=6, bucket=16, batch_size=2)
    texts = ["first problem", "a second", "third one here"]
    outputs, log_probs = model.generate_with_log_probs(texts)
    assert log_probs.shape == (3, 1) and [o[0] for o in outputs] == model.greedy(texts)
    for text, lp in zip(texts, log_probs[:, 0]):
        alone = t5_sampling.sample_t5(params, tok.encode_batch([text], 16, pad_to=16), jax.random.key(0), config=config,
                                      num_samples=1, max_new_tokens=6, temperature=0.0)
        # Batched with other texts (another padding) against alone: the same network, other row blocking.
        assert_f32_close(lp, float(alone.log_prob[0, 0]), ulps=NETWORK, what="text model log-prob vs alone")
    assert len(set(np.round(log_probs[:, 0], 4))) == 3
