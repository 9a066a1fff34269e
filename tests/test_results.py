"""Reports: markdown tables, strict results.json, predictions, plots, training summary, learning curves."""
import json
import math

import pytest

from refiner_jax.runs import plots, results as results_lib


def _ci(mean, low, high):
    return {"mean": mean, "low": low, "high": high}


RESULTS = {
    "task": "mwp",
    "primary_metric": "equation_em_canonical",
    "num_examples": 200,
    "turns": 3,
    "bootstrap_samples": 1000,
    "rows": [
        {"key": "generator", "label": "Generator alone", "turns": 0,
         "metrics": {"equation_em_strict": _ci(0.40, 0.335, 0.47), "equation_em_canonical": _ci(0.455, 0.39, 0.52),
                     "corpus_bleu": _ci(0.3125, None, None)}},
        {"key": "critic", "label": "+ trained critic (T=3)", "turns": 3,
         "metrics": {"equation_em_strict": _ci(0.43, 0.36, 0.5), "equation_em_canonical": _ci(0.5, 0.43, 0.57),
                     "corpus_bleu": _ci(0.33, None, None)}},
        {"key": "oracle", "label": "+ oracle critic (T=3)", "turns": 3,
         "metrics": {"equation_em_strict": _ci(0.6, 0.53, 0.67), "equation_em_canonical": _ci(0.66, 0.595, 0.725),
                     "corpus_bleu": _ci(0.5, None, None)}},
    ],
    "flips": {"critic": [{"from": 0, "to": 1, "wrong_to_right": 12, "right_to_wrong": 3, "net": 9, "revised": 40},
                         {"from": 0, "to": 3, "wrong_to_right": 14, "right_to_wrong": 5, "net": 9, "revised": 41}]},
    "critic_quality": {
        "n": 200, "seed": 0,
        "feedback_em": {"all": {"n": 200, **_ci(0.7, 0.64, 0.76)}, "no_error": {"n": 40, **_ci(0.95, 0.875, 1.0)},
                        "operator": {"n": 50, **_ci(0.8, 0.68, 0.9)}},
        "has_error": {"precision": 0.9, "recall": 0.8, "f1": 0.8470588, "true_positives": 128,
                      "predicted_errors": 142, "gold_errors": 160},
        "auroc": 0.8125, "paired_auroc": 0.9,
        "on_generator": {"n": 200, "feedback_em": 0.55,  # written before AUROC was measured: no "auroc"
                         "has_error": {"precision": float("nan"), "recall": 0.0, "f1": float("nan")}},
        "on_generator_samples": {"paired_auroc": 0.725, "hypotheses": 610, "wrong": 300, "problems_with_pairs": 90},
    },
    "noise": {"primary_metric": "equation_em_canonical", "turns": 3,
              "rows": [{"epsilon": e, **_ci(m, m - 0.06, m + 0.06)} for e, m in
                       ((0.0, 0.66), (0.25, 0.6), (0.5, 0.55), (0.75, 0.5), (1.0, 0.46))]},
    "training": {"critic": {"best_step": 1200, "feedback_em": 0.71}, "refiner": {"best_step": 400,
                                                                                   "equation_em_canonical": 0.5}},
    "trajectories": [{"setting": "critic", "uid": "svamp-0", "hypotheses": ["a", "b"], "feedback": ["f", "No hint"],
                      "scores": [{"em": 0.0}, {"em": 1.0}]}],
}


def test_markdown_tables_hand_checked():
    md = results_lib.render_markdown(RESULTS)
    assert md.startswith("# REFINER evaluation: mwp")
    # Primary metric first, in bold; values in % with one decimal.
    assert "| Setting | **equation_em_canonical** | equation_em_strict | corpus_bleu |" in md
    assert "| Generator alone | 45.5 [39.0, 52.0] | 40.0 [33.5, 47.0] | 31.2 † |" in md
    assert "| + oracle critic (T=3) | 66.0 [59.5, 72.5] | 60.0 [53.0, 67.0] | 50.0 † |" in md
    assert "† corpus-level metric" in md
    assert "| trained critic | 0 → 3 | 14 | 5 | +9 | 41 |" in md
    assert "| no_error | 40 | 95.0 [87.5, 100.0] |" in md
    assert "| held-out perturbations | 200 | 90.0 | 80.0 | 84.7 | 81.2 | 90.0 | – |" in md
    assert "| generator's turn-0 hypotheses | 200 | – | 0.0 | – | – | 72.5 | 55.0 |" in md
    assert "| 0.25 | 60.0 [54.0, 66.0] |" in md
    assert "| critic | 1200 | feedback_em=0.71 |" in md
    assert "| refiner | 400 | equation_em_canonical=0.5 |" in md


def test_markdown_of_partial_results():
    md = results_lib.render_markdown({"task": "snlr", "primary_metric": "ir_em", "rows": RESULTS["rows"][:1]})
    assert "## Refinement" in md and "## Flips" not in md and "## Noisy critic" not in md


def test_write_results_files(tmp_path, capsys):
    workdir = tmp_path / "run"
    workdir.mkdir()
    lines = [{"stage": "critic", "step": s, "loss": 3.0 / s, "examples_per_s": 100.0} for s in (50, 100, 150)]
    lines += [{"stage": "critic", "step": 100, "val_feedback_em": 0.4, "val_feedback_em/operator": 0.3},
              {"stage": "critic", "step": 150, "val_feedback_em": 0.6, "val_feedback_em/operator": 0.5},
              {"stage": "refiner", "step": 20, "loss": 1.0}]
    (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + '\n{"stage": "ref')
    paths = results_lib.write_results(RESULTS, str(tmp_path / "eval"), workdir=str(workdir))
    assert sorted(paths) == ["curves_critic", "curves_refiner", "json", "markdown", "noise_plot", "predictions"]
    for key in ("curves_critic", "curves_refiner", "noise_plot"):
        with open(paths[key], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    def no_constants(name):
        raise AssertionError(f"results.json holds {name}")

    saved = json.loads(open(paths["json"]).read(), parse_constant=no_constants)
    assert "trajectories" not in saved
    assert saved["critic_quality"]["on_generator"]["has_error"]["precision"] is None
    assert saved["rows"][0]["metrics"]["equation_em_canonical"] == _ci(0.455, 0.39, 0.52)
    assert [json.loads(l)["uid"] for l in open(paths["predictions"])] == ["svamp-0"]
    md = open(paths["markdown"]).read()
    assert "![noise](noise.png)" in md and "![curves_critic](curves_critic.png)" in md
    results_lib.print_results(paths["json"])
    assert "| Generator alone | 45.5 [39.0, 52.0]" in capsys.readouterr().out


def test_read_metrics_and_curve_keys(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"stage": "critic", "step": 50, "loss": 1.5, "accuracy": 0.7, "tokens_per_s": 9.0}\n'
                    'garbage\n'
                    '{"stage": "critic", "step": 100, "feedback_em": 0.5, "feedback_em/operator": 0.25}\n'
                    '{"step": 3}\n'
                    '{"stage": "warmup", "step": 10, "loss": 2.0, "val_loss": 2.5, "val_equation_em": 0.1}\n')
    by_stage = results_lib.read_metrics(str(path))
    assert {k: [r["step"] for r in v] for k, v in by_stage.items()} == {"critic": [50, 100], "warmup": [10]}
    assert plots._curve_keys(by_stage["critic"]) == (["loss"], ["feedback_em"])
    assert plots._curve_keys(by_stage["warmup"]) == (["loss", "val_loss"], ["val_equation_em"])


def test_training_summary_reads_done_files(tmp_path):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "DONE").write_text('{"best_step": 7, "equation_em": 0.25}')
    (tmp_path / "critic").mkdir()
    (tmp_path / "critic" / "DONE").write_text('{"best_step": 3}')
    (tmp_path / "refiner").mkdir()  # not finished
    assert list(results_lib.training_summary(str(tmp_path)).items()) == [
        ("warmup", {"best_step": 7, "equation_em": 0.25}), ("critic", {"best_step": 3})]  # in run order
    (tmp_path / "refiner" / "DONE").write_text("{oops")
    with pytest.raises(ValueError, match="refiner/DONE"):
        results_lib.training_summary(str(tmp_path))
    assert results_lib.training_summary(str(tmp_path / "missing")) == {}


def test_format_ci():
    assert results_lib.format_ci(_ci(0.5, 0.25, 0.75)) == "50.0 [25.0, 75.0]"
    assert results_lib.format_ci(_ci(0.006, -0.004, 0.016), signed=True) == "+0.6 [-0.4, +1.6]"
    assert results_lib.format_ci(_ci(0.123, None, None)) == "12.3 †"
    assert results_lib.format_ci(_ci(math.nan, math.nan, math.nan)) == "– [–, –]"
    assert results_lib.format_ci(_ci(None, None, None), signed=True) == "– †"  # NaN as results.json stores it
