"""The REFINER table's baselines: the log-probability rerank, the paired differences from each baseline row, and
which baselines a run's critic allows, on the toy task of test_evaluate (worked out by hand)."""
import numpy as np
import pytest
from test_evaluate import EXAMPLES, ScriptedCritic, ToyGenerator, ToyTask

from refiner_jax.refiner import baselines, critics, evaluation
from refiner_jax.runs import refiner_eval, results as results_lib, run_config, run_info, seed_pool


def test_rerank_picks_each_problems_most_likely_sample():
    samples = [["a", "b", "c"], ["d", "e", "f"]]
    assert baselines.best_by_log_prob(samples, np.array([[-3.0, -1.0, -2.0], [-0.5, -0.5, -4.0]])) == ["b", "d"]

    class Sampler:  # the generator: three samples per problem, the likeliest in a different place for each
        def generate_with_log_probs(self, texts, *, num_samples, temperature, top_p, rng):
            self.asked = (list(texts), num_samples, temperature, top_p)
            table = {"q0": (["x", "y", "z"], [-2.0, -0.1, -5.0]), "q1": (["u", "v", "w"], [-3.0, -4.0, -1.0])}
            return [table[t][0] for t in texts], np.array([table[t][1] for t in texts])

    sampler = Sampler()
    assert baselines.rerank_answers(sampler, EXAMPLES[:2], 3, 1.0, 0.5, seed=0) == ["y", "w"]
    assert sampler.asked == (["q0", "q1"], 3, 1.0, 0.5)


@pytest.fixture(scope="module")
def with_baselines():
    results = evaluation.evaluate_refinement(ToyTask(), ToyGenerator(), ScriptedCritic(), None, EXAMPLES, turns=3,
                                             bootstrap_samples=400)
    # Right per problem: generator 1 0 0 1; + critic (T=3) 0 1 1 1; oracle 1 1 1 1; critic alone 1 1 0 0;
    # rerank 1 0 0 1 (the generator's own answers).
    answers = {"critic_alone": ["g0", "g1", "bad2", "bad3"], "generator_rerank": ["g0", "bad1", "bad2", "g3"]}
    labels = {"critic_alone": "Critic alone", "generator_rerank": "Rerank"}
    baselines.add_baselines(ToyTask(), EXAMPLES, results, answers, labels, samples=400, seed=0)
    return {r["key"]: r for r in results["rows"]}


def test_baseline_rows_and_their_gain_from_the_generator(with_baselines):
    assert list(with_baselines) == ["generator", "critic_t1", "critic", "oracle", "critic_alone", "generator_rerank"]
    assert with_baselines["critic_alone"]["label"] == "Critic alone"
    assert with_baselines["critic_alone"]["metrics"]["em"]["mean"] == 0.5
    assert with_baselines["critic_alone"]["metrics"]["all_right"] == {"mean": 0.0, "low": None, "high": None}
    assert with_baselines["critic_alone"]["gain"]["mean"] == 0.0  # +1 on q1, -1 on q3


def test_gain_vs_is_the_paired_difference_from_each_baseline(with_baselines):
    # Hand-computed per-problem differences and their means:
    #   critic (T=3) - critic alone: -1 0 +1 +1 -> 0.25;  oracle - critic alone: 0 0 +1 +1 -> 0.5
    #   generator - critic alone: 0 -1 0 +1 -> 0;  critic (T=3) - rerank: -1 +1 +1 0 -> 0.25
    gains = {key: {b: g["mean"] for b, g in row["gain_vs"].items()} for key, row in with_baselines.items()}
    assert gains["critic"] == {"critic_alone": 0.25, "generator_rerank": 0.25}
    assert gains["oracle"] == {"critic_alone": 0.5, "generator_rerank": 0.5}
    assert gains["generator"] == {"critic_alone": 0.0, "generator_rerank": 0.0}
    assert gains["critic_alone"] == {"generator_rerank": 0.0}  # a row is not compared with itself
    assert gains["generator_rerank"] == {"critic_alone": 0.0}
    oracle = with_baselines["oracle"]["gain_vs"]["critic_alone"]
    assert 0.0 <= oracle["low"] <= oracle["high"] <= 1.0  # no problem got worse, so no resample can
    assert oracle["low"] * 4 == int(oracle["low"] * 4)  # a resampled mean of four values in {0, 1}
    same = with_baselines["generator"]["gain_vs"]["generator_rerank"]
    assert same == {"mean": 0.0, "low": 0.0, "high": 0.0}  # identical answers differ nowhere


def test_per_problem_scores_are_written_beside_the_table_for_pooling(tmp_path):
    results = evaluation.evaluate_refinement(ToyTask(), ToyGenerator(), ScriptedCritic(), None, EXAMPLES, turns=3,
                                             bootstrap_samples=50)
    baselines.add_baselines(ToyTask(), EXAMPLES, results, {"critic_alone": ["g0", "g1", "bad2", "bad3"]},
                            {"critic_alone": "Critic alone"}, samples=50, seed=0)
    results["seed"] = 3
    results_lib.write_results(results, str(tmp_path))
    record = seed_pool.read_row_scores(str(tmp_path))
    # The same per-problem rights as the fixture's comment above, in the problems' order.
    assert record["seed"] == 3 and record["metric"] == "em" and record["uids"] == [ex.uid for ex in EXAMPLES]
    assert record["rows"]["generator"] == [1, 0, 0, 1] and record["rows"]["critic"] == [0, 1, 1, 1]
    assert record["rows"]["oracle"] == [1, 1, 1, 1] and record["rows"]["critic_alone"] == [1, 1, 0, 0]
    assert record["labels"]["critic_alone"] == "Critic alone" and record["labels"]["generator"] == "Generator alone"
    with open(tmp_path / "results.json") as f:
        assert "row_scores" not in f.read()


def test_critic_alone_only_for_a_critic_that_solves(tmp_path, monkeypatch):
    config = run_config.base_config()
    run = run_info.RunInfo(str(tmp_path), config)  # no matched stage: that row is left out

    class Model:  # a critic's model: answers every problem with its gold, or the same formula again
        def generate_with_log_probs(self, texts, num_samples=1, **_):
            return [[{"q0": "g0", "q1": "g1"}[t]] * num_samples for t in texts], np.zeros((len(texts), num_samples))

    generator = Model()
    solver = critics.SolverCritic(Model(), ToyTask())
    answers, labels = refiner_eval.baseline_answers(run, ToyTask(), EXAMPLES[:2], generator, solver, 3, 8)
    assert answers == {"critic_alone": ["g0", "g1"], "generator_rerank": ["g0", "g1"]}
    assert labels["generator_rerank"] == "Generator, best of 4 samples by its log-probability"
    feedback_critic = critics.ModelCritic(Model(), ToyTask())
    answers, _ = refiner_eval.baseline_answers(run, ToyTask(), EXAMPLES[:2], generator, feedback_critic, 3, 8)
    assert set(answers) == {"generator_rerank"}
