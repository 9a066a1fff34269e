"""The reward-model pipeline end to end on a tiny model (SFT, ORM, PRM, expert iteration, selection table), its
resumption, the expert-iteration filter against hand-labelled samples, PRM800K label files and config errors."""
import json
import os
import shutil

import numpy as np
import pytest

from refiner_jax.reward import batches as reward_batches, labels as reward_labels
from refiner_jax.tasks import mwp, step_label_files
from refiner_jax.tasks.base import DataError
from refiner_jax.runs import run_config as config_lib
from refiner_jax.runs import reward_run, run_setup, seed_pool


def tiny_config():
    c = config_lib.base_config()
    c.pipeline = "reward"
    c.task.options = {"synthetic_sizes": {"train": 256, "val": 32, "test": 24}}
    c.tokenizer.vocab_size = 512
    c.lengths.input, c.lengths.target = 48, 24
    c.warmup.feedback_fraction = 0.0
    for stage in (c.warmup, c.reward, c.rl):
        stage.steps, stage.eval_every, stage.batch_size = 4, 2, 8
        stage.optimizer.warmup_steps = 1
    c.warmup.eval_examples = c.rl.eval_examples = 8
    c.reward.train_problems, c.reward.val_problems, c.reward.samples, c.reward.test_samples = 24, 8, 3, 4
    c.rl.problems, c.rl.samples, c.rl.threshold, c.rl.rounds = 24, 3, 0.0, 2
    c.reward.mixed_only = False  # a 4-step policy is wrong on every sample: no problem has both kinds
    c.rl.rewards = ("orm", "prm")  # a 4-step policy solves nothing, so the final-answer reward would keep nothing
    c.eval.examples, c.eval.batch_size, c.eval.bootstrap_samples = 24, 16, 50
    c.checkpoint.every = 2
    c.log_every = 2
    return c


@pytest.mark.slow
def test_reward_pipeline_end_to_end_and_resume(tmp_path, capsys):
    c = tiny_config()
    c.task.extra_problems = 8
    c.reward.labels, c.reward.rollout_completions = "rollouts", 2
    workdir = str(tmp_path / "run")
    results = reward_run.run(c, workdir)
    for stage in ("sft", "orm", "prm", "prm_rollouts", "rl_orm_1", "rl_orm_2", "rl_prm_2", "eval"):
        assert os.path.exists(os.path.join(workdir, stage, "DONE")), stage
    for kind in ("orm", "prm"):
        assert 0.0 <= results[kind]["paired_auroc"] <= 1.0 and 0.0 <= results[kind]["step_accuracy"] <= 1.0
        meta = json.load(open(os.path.join(workdir, kind, "export", "metadata.json")))
        assert meta["kind"] == kind and meta["head"] == "token" and meta["family"] == "t5"
    saved = json.load(open(os.path.join(workdir, "results.json")))
    table = saved["table"]
    matched = "SFT greedy, data-matched (the SFT policy)"
    assert list(table) == ["SFT greedy", "SFT majority vote (K=4)", matched,
                           "SFT majority vote (K=4), data-matched (the SFT policy)", "ORM rerank (K=4)",
                           "PRM rerank (K=4)", "ORM-weighted vote (K=4)", "PRM-weighted vote (K=4)",
                           "SFT log-prob rerank (K=4)", "PRM (rollout labels) rerank (K=4)", "ORM-RL greedy",
                           "PRM-RL greedy"]
    # The SFT policy trained on every problem the reward models learned from, so it is the matched baseline: the
    # same answers, and every rule's paired difference from it is the one from SFT greedy.
    assert table[matched] == table["SFT greedy"]
    deltas, against_matched = saved["paired_deltas"], saved["matched_paired_deltas"]
    assert deltas["baseline"] == "SFT greedy" and against_matched["baseline"] == matched
    assert against_matched["SFT greedy"] == {"mean": 0.0, "low": 0.0, "high": 0.0}
    assert {k: v for k, v in against_matched.items() if k not in ("baseline", "SFT greedy")} == {
        k: v for k, v in deltas.items() if k not in ("baseline", matched)}
    # Every rule against majority vote, the strongest rule without a reward model: point differences of the table.
    majority, against_majority = "SFT majority vote (K=4)", saved["majority_paired_deltas"]
    assert against_majority["baseline"] == majority
    assert set(against_majority) - {"baseline"} == set(table) - {majority}
    for name, cell in against_majority.items():
        if name != "baseline":
            assert cell["mean"] == pytest.approx(table[name]["final_answer_error"]["mean"]
                                                 - table[majority]["final_answer_error"]["mean"])
    for row in table.values():
        assert 0.0 <= row["final_answer_error"]["mean"] <= 1.0
        cell = row["final_answer_error"]
        assert cell["low"] <= cell["mean"] <= cell["high"]
    md = open(os.path.join(workdir, "results.md")).read()
    assert "| PRM rerank (K=4) |" in md and "Error at 30% abstention" in md
    # Every trained stage's validation curve and where it stopped (4 fixed steps, validated every 2).
    assert {"sft", "orm", "prm", "prm_rollouts", "rl_orm_1", "rl_orm_2", "rl_prm_2"} <= set(saved["convergence"])
    assert [s for s, _ in saved["convergence"]["sft"]["curve"]] == [2, 4]
    assert os.path.isfile(os.path.join(workdir, "convergence.png")) and "## Convergence" in md
    # The per-problem outcomes behind the table, for pooling seeds: each rule's error is its share of wrong answers.
    outcomes = seed_pool.read_outcomes(workdir)
    assert list(outcomes["rules"]) == list(table) and outcomes["seed"] == c.seed and outcomes["k"] == 4
    for name, outcome in outcomes["rules"].items():
        assert len(outcome.correct) == saved["problems"]
        assert table[name]["final_answer_error"]["mean"] == pytest.approx(1.0 - outcome.correct.mean())
    assert os.path.getsize(os.path.join(workdir, "abstention.png")) > 1000
    # Trace errors are compared in pairs, and every step verifier is scored on the first wrong step of the same
    # test samples, which are saved in ProcessBench's layout with their gold from the task's step checker.
    assert {"PRM rerank (K=4) - ORM rerank (K=4)", "PRM-RL greedy - ORM-RL greedy"} <= set(saved["trace_error_delta"])
    assert set(saved["first_error"]) == {"orm", "prm", "policy_log_prob", "prm_rollouts"}
    rollouts = saved["rollout_labels"]
    assert rollouts["rollouts"] > 0 and rollouts["rollouts"] % 2 == 0 and rollouts["agreement"]["all"]["steps"] > 0
    assert all(set(v) == {"f1", "acc_erroneous", "acc_correct"} for v in saved["first_error"].values())
    assert "prm - orm" in saved["first_error_delta"] and "First-error F1" in md
    cases = step_label_files.read_step_records(os.path.join(workdir, "eval", "first_error_cases.jsonl"))
    predictions = json.load(open(os.path.join(workdir, "eval", "first_error_predictions.json")))
    drawn = json.load(open(os.path.join(workdir, "samples", "sft_test.json")))["samples"]
    task = mwp.MWPTask(**c.task.options)
    test = {ex.uid: (ex, drawn[i]) for i, ex in enumerate(task.load("test"))}
    assert len(cases) == len(predictions["gold"]) == sum(bool(task.split_steps(h)) for hs in drawn for h in hs)
    for uid, gold, case in zip(predictions["uids"], predictions["gold"], cases):
        problem, j = uid.rsplit("/", 1)
        example, hs = test[problem]
        labels = task.step_labels(example, hs[int(j)])
        # The first step the checker rejects; a wrong answer after right steps is wrong at its last step.
        want = labels.index(False) if False in labels else (
            -1 if task.outcome_label(example, hs[int(j)]) else len(labels) - 1)
        assert gold == case.first_error == want
    assert all(len(v) == len(cases) for v in predictions["predictions"].values())
    # The 8 generated problems joined the 256 training problems of the SFT policy, and the first 24 of the reward
    # models and of expert iteration.
    sft, _ = reward_run.Run(c, workdir, ("sft",)).sft_spec()
    task = mwp.MWPTask(**c.task.options)
    first, generated = task.load("train")[0], task.fresh_problems(8)[3]
    assert sft.num_examples == 264
    assert sft.make_pairs(None, [0, 259], 0) == [(first.x, first.z), (generated.x, generated.z)]
    extra = [f"synth-extra-{i}" for i in range(8)]
    for name in ("sft_train", "rl_orm_1"):
        uids = json.load(open(os.path.join(workdir, "samples", f"{name}.json")))["uids"]
        assert uids == [f"synth-train-{i}" for i in range(24)] + extra, name
    samples = json.load(open(os.path.join(workdir, "samples", "sft_test.json")))
    assert samples["k"] == 4 and len(samples["samples"]) == 24 and all(len(s) == 4 for s in samples["samples"])
    # Threshold 0 keeps every distinct non-empty sample of the round.
    kept = json.load(open(os.path.join(workdir, "rl_orm_1", "kept.json")))
    drawn = json.load(open(os.path.join(workdir, "samples", "rl_orm_1.json")))["samples"]
    assert kept["kept"] == sum(len({h for h in hs if h.strip()}) for hs in drawn)
    # Among them, the wrong answers and wrong steps by the task's checker (the 8 extra problems are generated).
    uids = json.load(open(os.path.join(workdir, "samples", "rl_orm_1.json")))["uids"]
    known = {ex.uid: ex for ex in task.load("train") + task.fresh_problems(8)}
    distinct = [(known[u], h) for u, hs in zip(uids, drawn) for h in set(hs) if h.strip()]
    assert kept["kept_wrong_answer"] == sum(not task.outcome_label(ex, h) for ex, h in distinct)
    assert kept["kept_wrong_step"] == sum(False in task.step_labels(ex, h) or not task.step_labels(ex, h)
                                          for ex, h in distinct)
    assert saved["rl_kept"]["rl_orm_1"] == kept
    # A second run retrains nothing and draws no new samples.
    capsys.readouterr()
    again = reward_run.run(c, workdir)
    out = capsys.readouterr().out
    assert "[samples]" not in out and again["orm"] == results["orm"]
    # On that policy no problem has both right and wrong samples: mixed_only says so before training a model ...
    other = str(tmp_path / "other")
    for part in ("sft", "samples", "tokenizer", "config.json"):
        (shutil.copytree if os.path.isdir(os.path.join(workdir, part)) else shutil.copy)(
            os.path.join(workdir, part), os.path.join(other, part))
    c.reward.mixed_only = True
    with pytest.raises(config_lib.ConfigError, match="config.reward.mixed_only: only 0 samples"):
        reward_run.run(c, other, stages=("orm",))
    # ... and final-answer expert iteration keeps no sample: a clear error before any training.
    c.rl.rewards = ("final",)
    with pytest.raises(config_lib.ConfigError, match=r"kept 0 of 96 samples.*config.rl.threshold"):
        reward_run.run(c, workdir, stages=("rl",))


@pytest.mark.slow
def test_ranking_reward_models_train_on_whole_problems_for_both_families(tmp_path):
    """`configs/rm_mwp.py`'s reward models (scalar head, likelihood term, pairwise loss, joint LM loss) through the
    pipeline on a T5 and a decoder-only LM; their batches hold whole problems, in the order of the drawn indices."""
    for family, preset in (("t5", "t5-tiny"), ("decoder", "llama-tiny")):
        c = tiny_config()
        c.model.family, c.model.preset = family, preset
        c.reward.head, c.reward.likelihood, c.reward.pairwise_weight, c.reward.lm_weight = "scalar", True, 1.0, 0.1
        c.reward.batch_size = 6  # 2 problems of 3 samples
        c.rl.rewards = ()
        workdir = str(tmp_path / family)
        run = reward_run.Run(c, workdir, ("sft", "orm"))
        run.stage("sft", run.sft_spec)
        spec, init = run.reward_spec("orm")
        assert spec.stage.batch_size == 2 and spec.num_examples == 24 and float(init["likelihood_scale"]) == 1.0
        items = spec.make_pairs(None, [5, 2], 0)
        data = run.reward_data("orm", run.train, run.samples("sft", "sft_train", run.train, 3, c.seed))
        assert items == data[15:18] + data[6:9]
        assert spec.collate(items)["group"].tolist() == [0, 0, 0, 1, 1, 1]
        results = reward_run.run(c, workdir, stages=("orm",))
        assert 0.0 <= results["orm"]["paired_auroc"] <= 1.0
        meta = json.load(open(os.path.join(workdir, "orm", "export", "metadata.json")))
        assert meta["likelihood"] is True and meta["head"] == "scalar" and meta["family"] == family
        logged = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
        assert any("pair_loss" in m and "lm_loss" in m for m in logged if m["stage"] == "orm")
        scores = run.scorer(None, "orm").solution_scores([ex.x for ex in run.val], ["#0: add ( number0, number1 )"]
                                                         * len(run.val))
        assert scores.shape == (len(run.val),) and ((scores >= 0) & (scores < 1)).all()  # probabilities


def test_expert_iteration_keeps_what_the_final_answer_reward_accepts(tmp_path):
    """The "final" filter against hand-labelled samples: right answers kept once each, wrong and empty ones not."""
    task = mwp.MWPTask()
    gold = "#0: add ( number0, number1 ) | #1: multiply ( #0, number2 )"
    ex = mwp_example(gold)
    run = reward_run.Run.__new__(reward_run.Run)  # the filter needs only the task
    run.task, run.config = task, None
    samples = [[gold, "#0: add ( number1, number0 ) | #1: multiply ( number2, #0 )", gold,
                "#0: add ( number0, number2 )", ""]]
    kept = run.keep("final", [ex], samples)
    assert kept == [(ex, gold), (ex, "#0: add ( number1, number0 ) | #1: multiply ( number2, #0 )")]


def test_expert_iteration_with_answer_and_prm_keeps_right_answers_the_prm_passes():
    """"final_prm" against hand-labelled samples and hand-set PRM scores (threshold 0.5): a right answer the PRM
    doubts is dropped, a wrong answer it trusts too; "prm" alone keeps the latter, "final" the former."""
    task = mwp.MWPTask()
    gold = "#0: add ( number0, number1 ) | #1: multiply ( #0, number2 )"
    commuted = "#0: add ( number1, number0 ) | #1: multiply ( number2, #0 )"
    wrong = "#0: add ( number0, number2 )"
    ex = mwp_example(gold)
    prm_scores = {gold: 0.9, commuted: 0.2, wrong: 0.95}

    class StubScorer:
        def solution_scores(self, prompts, texts, reduction):
            assert reduction == "min"
            return np.array([prm_scores[t] for t in texts])

    run = reward_run.Run.__new__(reward_run.Run)
    run.task = task
    run.config = config_lib.base_config()
    run.config.rl.threshold, run.config.reward.prm_reduction = 0.5, "min"
    run.scorer = lambda params, kind: StubScorer() if kind == "prm" else None
    samples = [[gold, commuted, gold, wrong, ""]]
    assert run.keep("final_prm", [ex], samples) == [(ex, gold)]
    assert run.keep("prm", [ex], samples) == [(ex, gold), (ex, wrong)]
    assert run.keep("final", [ex], samples) == [(ex, gold), (ex, commuted)]


def test_extra_problems_need_a_problem_generator():
    task = mwp.MWPTask()
    assert run_setup.generated_problems(task, 3, 0, "/a/csv/folder") == ([], [])
    with pytest.raises(config_lib.ConfigError, match=r"config.task.extra_problems: 5 .* task.data_dir has no problem"):
        run_setup.generated_problems(task, 0, 5, "/a/csv/folder")  # a dataset read from files: no generator
    held, extra = run_setup.generated_problems(task, 3, 2, None)
    assert (held + extra) == task.fresh_problems(5) and len(extra) == 2  # held-out first, then the extra ones


def test_mixed_problems_keeps_the_problems_with_right_and_wrong_samples():
    def solution(last):
        return reward_labels.LabelledSolution("x", "t", ("t",), (last,))

    data = [solution(True), solution(False), solution(True), solution(True), solution(False), solution(False)]
    assert reward_run.mixed_problems(data, 2) == data[:2]  # problems (T, F), (T, T), (F, F)


def mwp_example(z):
    from refiner_jax.tasks.base import Example

    numbers = (1.0, 2.0, 3.0)
    value = mwp.execute(z, numbers)
    return Example("u", "a problem", z, repr(value), {"numbers": list(numbers), "answer": value})


def test_prm_trains_on_a_label_file_and_a_bad_file_names_its_line(tmp_path):
    good = {"question": {"problem": "What is 2 + 3 * 4?"},
            "label": {"finish_reason": "found_error", "steps": [
                {"completions": [{"text": "3 * 4 = 12", "rating": 1}], "chosen_completion": 0},
                {"completions": [{"text": "2 + 12 = 15", "rating": -1}], "chosen_completion": None}]}}
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    from refiner_jax.tasks.prm800k import read_prm800k

    record = read_prm800k(str(path))[0]
    solution = reward_labels.LabelledSolution(record.question, record.text, record.steps, record.labels)
    assert solution.labels == (True, False) and reward_batches.step_ends(solution.text, solution.steps) == [10, 22]
    bad = dict(good, label={"steps": [{"completions": [{"text": "x", "rating": 5}], "chosen_completion": 0}]})
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=":2:"):
        read_prm800k(str(path))
    c = tiny_config()
    c.reward.labels_file = str(path)
    with pytest.raises(DataError, match=":2:"):
        reward_run.run(c, str(tmp_path / "run"), stages=("sft", "prm"))


@pytest.mark.parametrize("field,value,message", [
    ("pipeline", "rlhf", "config.pipeline: 'rlhf' is not a pipeline"),
    ("reward.head", "mlp", "config.reward.head: 'mlp' is not a reward head"),
    ("reward.label_tokens", ("+", "+"), "config.reward.label_tokens: needs two different strings"),
    ("reward.neutral", "maybe", "config.reward.neutral"),
    ("reward.prm_reduction", "mean", "config.reward.prm_reduction"),
    ("reward.temperature", 0.0, "config.reward.temperature: must be > 0"),
    ("rl.rewards", ("final", "human"), "config.rl.rewards"),
    ("rl.threshold", 1.5, "config.rl.threshold"),
    ("reward.steps", 10, "config.reward.steps: 10 must exceed reward.optimizer.warmup_steps"),
    ("reward.pairwise_weight", -1.0, "config.reward.pairwise_weight: must be >= 0"),
    ("reward.fresh_problems", True, "config.reward.fresh_problems: was replaced by config.task.extra_problems"),
    ("task.extra_problems", -1, "config.task.extra_problems: must be >= 0"),
])
def test_reward_config_errors_name_the_field(tmp_path, field, value, message):
    c = config_lib.base_config()
    section, _, name = field.rpartition(".")
    (c[section] if section else c)[name] = value
    with pytest.raises(config_lib.ConfigError, match=message):
        reward_run.run(c, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("changes,message", [
    ({"labels_file": "labels.jsonl"}, "config.reward.pairwise_weight: ranks a problem's sampled solutions"),
    ({"microbatches": 2}, "config.reward.pairwise_weight: .*set reward.microbatches to 1"),
    ({"batch_size": 10}, "config.reward.batch_size: 10 must be a multiple of reward.samples 8"),
])
def test_pairwise_loss_config_errors(tmp_path, changes, message):
    c = config_lib.base_config()
    c.reward.pairwise_weight = 1.0
    c.reward.update(changes)
    with pytest.raises(config_lib.ConfigError, match=message):
        reward_run.run(c, str(tmp_path / "run"))


def test_label_tokens_must_be_single_tokens(tmp_path):
    c = tiny_config()
    c.reward.label_tokens = ("definitely correct", "-")
    with pytest.raises(ValueError, match="label_tokens"):
        reward_run.run(c, str(tmp_path / "run"), stages=("sft",))
