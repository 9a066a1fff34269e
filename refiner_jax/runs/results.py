"""The reports of both runs, in one place: REFINER's evaluation (`results.md` tables, `results.json`,
`predictions.jsonl`, PNG plots) from the dict of `refiner.evaluation.evaluate_refinement` (+ "noise" from
`noise_study`, + "training" from `training_summary`), a reward run's rules table and abstention plot, and every
pipeline's "convergence" block (`convergence`: each trained stage's validation curve and where it stopped) with its
plot `convergence.png` (the figures are drawn by `runs.plots`). Task metrics are shown in % as `mean [low, high]`
(95% bootstrap CI over examples); a metric without a CI (corpus-level) carries a dagger.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Sequence

from refiner_jax import atomic_files
from refiner_jax.refiner.inference_factorial import factorial_markdown
from refiner_jax.runs import plots
from refiner_jax.reward.rerank import COLUMNS, Curve, RulesTable

STAGES = ("warmup", "critic", "refiner")
# The generators of the inference factorial (`refiner.inference_factorial`), by their stage.
FACTORIAL_LABELS = {"refiner": "REFINER generator", "matched": "Matched generator (same updates, no feedback)"}
# A REFINER evaluation's per-problem primary metric of every row, beside its results.json (`runs.seed_pool` reads it).
ROW_SCORES_FILE = "row_scores.json"


# ----------------------------------------------------------------------------------------------- formatting


def _pct(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def _auroc(quality: Mapping[str, Any]) -> str:
    return _pct(quality.get("auroc"))  # absent from results written before it was measured


def format_ci(cell: Mapping[str, Any], signed: bool = False) -> str:
    """`mean [low, high]` in %, or `mean †` when the metric has no CI; `signed` writes a difference (`+1.2`)."""
    pct = (lambda v: ("+" if v is not None and v > 0 else "") + _pct(v)) if signed else _pct
    if cell.get("low") is None or cell.get("high") is None:
        return f"{pct(cell['mean'])} †"
    return f"{pct(cell['mean'])} [{pct(cell['low'])}, {pct(cell['high'])}]"


def _num(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return "nan" if math.isnan(value) else f"{value:.4g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _metric_order(results: Mapping[str, Any], metrics: Sequence[str]) -> list[str]:
    primary = results.get("primary_metric")
    return ([primary] if primary in metrics else []) + [m for m in metrics if m != primary]


# ----------------------------------------------------------------------------------------------- markdown


def render_markdown(results: Mapping[str, Any], images: Sequence[str] = ()) -> str:
    """The whole report as markdown; `images` are PNG file names (relative to the report) to embed."""
    task = results.get("task", "?")
    primary = results.get("primary_metric", "?")
    lines = [f"# REFINER evaluation: {task}", ""]
    info = [f"{results.get('num_examples', '?')} test examples", f"up to T={results.get('turns', '?')} turns"]
    if results.get("generator_stage"):
        info.append(f"generator: `{results['generator_stage']}` stage")
    lines += ["; ".join(info) + ". Task metrics in %, as mean [95% percentile-bootstrap CI over examples, "
              f"{results.get('bootstrap_samples', '?')} resamples]; primary metric: **{primary}**.", ""]

    rows = results.get("rows") or []
    if rows:
        metrics = _metric_order(results, list(rows[0]["metrics"]))
        lines += ["## Refinement", ""]
        versus = list(dict.fromkeys(k for r in rows for k in r.get("gain_vs") or {}))  # the baseline rows
        header = (["Setting"] + [f"**{m}**" if m == primary else m for m in metrics] + [f"Δ {primary} (paired)"]
                  + [f"Δ vs `{k}`" for k in versus])
        lines += _table(header, [[r["label"]] + [format_ci(r["metrics"][m]) if m in r["metrics"] else "–"
                                                 for m in metrics]
                                 + [format_ci(r["gain"], signed=True) if r.get("gain") else "–"]
                                 + [format_ci(r["gain_vs"][k], signed=True) if k in (r.get("gain_vs") or {}) else "–"
                                    for k in versus] for r in rows])
        if any(r["metrics"][m].get("low") is None for r in rows for m in metrics if m in r["metrics"]):
            lines += ["", "† corpus-level metric: the task's whole-set value, no per-example CI."]
        if any(r.get("gain") for r in rows):
            lines += ["", f"Δ: change of {primary} from the generator alone on the same problems, with a paired "
                          "bootstrap CI (examples resampled with both settings' scores); Δ vs `key`: the same "
                          "paired change from that baseline row (`refiner.baselines`)."]
        lines.append("")

    flips = results.get("flips") or {}
    if flips:
        lines += [f"## Flips ({primary})", "",
                  "Examples that go wrong → right or right → wrong between turns (an example that stopped at "
                  "\"No hint\" keeps its hypothesis); revised: examples that got a new hypothesis in between.", ""]
        names = {"critic": "trained critic", "oracle": "oracle critic"}
        table = [[names.get(c, c), f"{f['from']} → {f['to']}", f["wrong_to_right"], f["right_to_wrong"],
                  f"{f['net']:+d}", f["revised"]] for c, fl in flips.items() for f in fl]
        lines += _table(["Critic", "Turns", "Wrong → right", "Right → wrong", "Net", "Revised"], table) + [""]

    quality = results.get("critic_quality")
    if quality:
        lines += ["## Critic quality", "",
                  f"Feedback exact match with the oracle (sentence order ignored) on {quality['n']} held-out "
                  f"perturbed hypotheses (one `perturb` per test problem, seed {quality['seed']}), by gold error "
                  "type (a hypothesis with several errors counts under each):", ""]
        lines += _table(["Gold error", "n", "Feedback EM"],
                        [[k, v["n"], format_ci(v)] for k, v in quality["feedback_em"].items()])
        det = quality["has_error"]
        lines += ["", "Detecting an error (feedback other than \"No hint\"). AUROC: the critic's confidence that a "
                  "hypothesis is right as an error score over all hypotheses; paired AUROC: the same within each "
                  "problem only (its gold vs its perturbations; the generator's greedy answer and 4 samples), which "
                  "telling easy problems from hard ones cannot raise. 50 = chance:", ""]
        table = [["held-out perturbations", quality["n"], _pct(det["precision"]), _pct(det["recall"]),
                  _pct(det["f1"]), _auroc(quality), _pct(quality.get("paired_auroc")), "–"]]
        gen = quality.get("on_generator")
        if gen:
            g = gen["has_error"]
            samples = quality.get("on_generator_samples") or {}
            table.append(["generator's turn-0 hypotheses", gen["n"], _pct(g["precision"]), _pct(g["recall"]),
                          _pct(g["f1"]), _auroc(gen), _pct(samples.get("paired_auroc")), _pct(gen["feedback_em"])])
        lines += _table(["Hypotheses", "n", "Precision", "Recall", "F1", "AUROC", "Paired AUROC", "Feedback EM"],
                        table) + [""]

    noise = results.get("noise")
    if noise and noise.get("rows"):
        metric = noise.get("primary_metric", primary)
        lines += [f"## Noisy critic (T={noise.get('turns', '?')})", "",
                  "The oracle critic's feedback replaced, with probability ε, by random feedback (oracle feedback "
                  f"on a random perturbation of the same problem); {metric} of the final hypotheses.", ""]
        lines += _table(["ε", metric], [[f"{r['epsilon']:g}", format_ci(r)] for r in noise["rows"]]) + [""]

    lines += convergence_markdown(results.get("convergence") or {})
    if results.get("factorial"):
        lines += factorial_markdown(results["factorial"], FACTORIAL_LABELS)
    training = results.get("training") or {}
    if training:
        lines += ["## Training", "", "Final validation metrics of each stage (its `DONE` file).", ""]
        table = [[stage, _num(done.get("best_step", "–")),
                  ", ".join(f"{k}={_num(v)}" for k, v in done.items() if k != "best_step") or "–"]
                 for stage, done in training.items()]
        lines += _table(["Stage", "Best step", "Validation metrics"], table) + [""]

    if images:
        lines += ["## Plots", ""] + [f"![{os.path.splitext(p)[0]}]({p})" for p in images] + [""]
    return "\n".join(lines)


def print_results(results: Mapping[str, Any] | str) -> None:
    """Prints the markdown report of a results dict (or of a `results.json` path)."""
    print(render_markdown(load_results(results) if isinstance(results, str) else results))


# ----------------------------------------------------------------------------------------------- files


def _done_files(workdir: str) -> dict[str, dict]:
    """`{stage: DONE contents}` of every finished stage of `workdir` (pipeline order first, eval/ left out)."""
    if not os.path.isdir(workdir):
        return {}
    others = sorted(d for d in os.listdir(workdir) if d not in STAGES and d != "eval")  # eval/: the evaluation's
    out = {}
    for stage in list(STAGES) + others:
        path = os.path.join(workdir, stage, "DONE")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                try:
                    out[stage] = json.load(f)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: not valid JSON ({e}); delete it and rerun the stage") from e
    return out


def training_summary(workdir: str) -> dict[str, dict]:
    """`{stage: final metrics}` from `<workdir>/<stage>/DONE` of every finished stage (pipeline order first)."""
    return {stage: {k: v for k, v in done.items() if k != "convergence"}
            for stage, done in _done_files(workdir).items()}


def convergence(workdirs: Mapping[str, str]) -> dict[str, dict]:
    """`{stage: {best_step, last_step, stopped_early, curve}}` of every trained stage of each run directory
    (`{prefix: workdir}`; stage keys `prefix/stage`, or just `stage` for the prefix ""), from its `DONE` file
    (`training.loop.train_stage`); stages finished before curves were recorded are left out."""
    return {f"{prefix}/{stage}" if prefix else stage: done["convergence"]
            for prefix, workdir in workdirs.items() for stage, done in _done_files(workdir).items()
            if "convergence" in done}


def convergence_markdown(block: Mapping[str, Mapping]) -> list[str]:
    """The convergence block as a markdown section (lines; none for an empty block)."""
    if not block:
        return []
    rows = [[stage, c["best_step"], c["last_step"], "yes" if c["stopped_early"] else "no", c.get("metric", "–"),
             _num(max((v for _, v in c["curve"]), default=float("nan")))] for stage, c in block.items()]
    return ["## Convergence", "", "Each trained stage's validation metric, evaluated every `eval_every` updates: the "
            "exported (best) step, the last step trained and whether the stage stopped on a plateau before its "
            "`steps` cap (`convergence.png`).", "",
            *_table(["Stage", "Best step", "Last step", "Stopped early", "Metric", "Best value"], rows), ""]


def read_records(path: str) -> list[dict]:
    """The JSON objects of a JSON-lines log a run appends to, in file order; a line that does not parse (a write
    cut short by a stop) or is not an object is skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                out.append(record)
    return out


def read_metrics(path: str) -> dict[str, list[dict]]:
    """`metrics.jsonl` records grouped by stage, in file order. Lines that do not parse (a write cut short) and
    records without "stage"/"step" are skipped."""
    by_stage: dict[str, list[dict]] = {}
    for record in read_records(path):
        if "stage" in record and "step" in record:
            by_stage.setdefault(str(record["stage"]), []).append(record)
    return by_stage


def _jsonable(value: Any) -> Any:
    """NaN/inf to null so results.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def load_results(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_results(results: Mapping[str, Any], out_dir: str, workdir: str | None = None) -> dict[str, str]:
    """Writes results.json (without trajectories and per-problem scores), predictions.jsonl (the trajectories),
    `ROW_SCORES_FILE` (each row's per-problem primary metric, with the run's seed), noise.png, one curves_<stage>.png
    per stage of `<workdir>/metrics.jsonl`, and results.md. Returns {name: path}."""
    os.makedirs(out_dir, exist_ok=True)
    paths: dict[str, str] = {}
    if workdir:
        results = {**results, "convergence": convergence({"": workdir})}
    summary = {k: v for k, v in results.items() if k not in ("trajectories", "row_scores")}
    paths["json"] = os.path.join(out_dir, "results.json")
    atomic_files.write_json(paths["json"], _jsonable(summary), indent=2)
    if results.get("row_scores"):
        paths["row_scores"] = os.path.join(out_dir, ROW_SCORES_FILE)
        record = {"seed": results.get("seed"), **results["row_scores"]}
        atomic_files.write_json(paths["row_scores"], _jsonable(record))
    if results.get("trajectories"):
        paths["predictions"] = os.path.join(out_dir, "predictions.jsonl")
        with atomic_files.atomic_open(paths["predictions"]) as f:
            for record in results["trajectories"]:
                f.write(json.dumps(_jsonable(record)) + "\n")
    images = []
    if results.get("noise", {}).get("rows"):
        paths["noise_plot"] = plots.plot_noise(results, os.path.join(out_dir, "noise.png"))
        images.append(os.path.basename(paths["noise_plot"]))
    if results.get("convergence"):
        paths["convergence_plot"] = plots.plot_convergence(results["convergence"],
                                                           os.path.join(out_dir, "convergence.png"))
        images.append(os.path.basename(paths["convergence_plot"]))
    metrics_path = os.path.join(workdir, "metrics.jsonl") if workdir else None
    if metrics_path and os.path.isfile(metrics_path):
        for stage, path in plots.plot_learning_curves(read_metrics(metrics_path), out_dir).items():
            paths[f"curves_{stage}"] = path
            images.append(os.path.basename(path))
    paths["markdown"] = os.path.join(out_dir, "results.md")
    atomic_files.write_text(paths["markdown"], render_markdown(results, images))
    return paths


# ----------------------------------------------------------------------------------------------- reward runs


def markdown_table(table: RulesTable) -> str:
    """A reward run's `rerank.RulesTable` in Markdown, errors in % as `value [low, high]` (its `results.md`)."""
    header = ["Rule", "Final-answer error (%)", "Trace error (%)", f"Error at {100 * table.rate:g}% abstention (%)"]
    blocks = ({table.baseline: table.deltas} if table.deltas else {}) | table.more_deltas
    header += [f"Δ final-answer error vs {baseline}, paired" for baseline in blocks]
    rows = []
    for name, row in table.rows.items():
        cells = ["–" if math.isnan(row[c]["mean"]) else format_ci(row[c]) for c in COLUMNS]
        cells += [format_ci(deltas[name], signed=True) if name in deltas else "–" for deltas in blocks.values()]
        rows.append([name, *cells])
    lines = _table(header, rows)
    lines.append(f"\n{table.n_problems} problems; brackets: {100 * (1 - table.alpha):g}% percentile-bootstrap "
                 f"interval over problems ({table.samples} resampled sets shared by all rules).")
    return "\n".join(lines) + "\n"


def first_error_markdown(scores: Mapping[str, Mapping], deltas: Mapping[str, Mapping]) -> str:
    """The first-error table (ProcessBench's metrics, %) and its paired F1 differences in Markdown."""
    rows = [[name, *(format_ci(row[m]) for m in ("f1", "acc_erroneous", "acc_correct"))]
            for name, row in scores.items()]
    lines = _table(["Verifier", "First-error F1 (%)", "Accuracy, erroneous (%)", "Accuracy, correct (%)"], rows)
    lines += [f"- Δ F1 {name}: {format_ci(d, signed=True)}" for name, d in deltas.items()]
    return "\n".join(lines) + "\n"


def write_reward_results(workdir: str, task_name: str, table: RulesTable, quality: Mapping[str, Mapping],
                         curves: Mapping[str, Curve], first_errors: Mapping[str, Mapping] | None = None,
                         first_error_deltas: Mapping[str, Mapping] | None = None,
                         stages: Mapping[str, Mapping] | None = None) -> str:
    """A reward run's `results.md` (the rules table, its paired trace-error differences, the first-error table,
    the reward models' quality, the abstention plot, the `stages`' convergence block) and `abstention.png` (and
    `convergence.png`) in `workdir`; prints and returns it."""
    plots.plot_abstention(curves, os.path.join(workdir, "abstention.png"))
    lines = [f"# {task_name}: outcome- vs process-based feedback\n", markdown_table(table)]
    if table.trace_deltas:
        lines.append("Trace error, paired differences (percentage points):\n")
        lines += [f"- {name}: {format_ci(d, signed=True)}" for name, d in table.trace_deltas.items()]
    if first_errors:
        lines += ["\nFirst wrong step of each test sample (ProcessBench's protocol; step scorers thresholded on "
                  "validation samples):\n", first_error_markdown(first_errors, first_error_deltas or {})]
    lines.append("\nReward models and two baselines on the SFT policy's test samples (paired AUROC: within a "
                 "problem, right vs wrong samples):\n")
    lines += [f"- {name}: " + ", ".join(f"{key} {100 * v:.1f}" for key, v in q.items() if isinstance(v, float))
              for name, q in quality.items()]
    lines.append("\n![abstention](abstention.png)\n")
    if os.path.isfile(os.path.join(workdir, "grpo_curves.png")):  # `plots.plot_grpo_curves`, when the run trained GRPO
        lines.append("![GRPO curves](grpo_curves.png)\n")
    if stages:
        plots.plot_convergence(stages, os.path.join(workdir, "convergence.png"))
        lines += convergence_markdown(stages) + ["![convergence](convergence.png)\n"]
    text = "\n".join(lines)
    atomic_files.write_text(os.path.join(workdir, "results.md"), text)
    print(text)
    return text


def write_joint_results(out_dir: str, task_name: str, table: RulesTable, extra: Mapping[str, Mapping],
                        revisions: Mapping[str, Mapping[str, int]]) -> str:
    """A joint run's `results.md` (every row with its compute, fixed / broken and paired differences, then what each
    variant's revisions did, `joint.revision_stats`) and `tokens.png` (final-answer error against tokens per problem)
    in `out_dir`; prints and returns the markdown."""
    header = ["Row", "Final-answer error (%)", "Trace error (%)", f"Error at {100 * table.rate:g}% abstention (%)",
              "Fixed / broken vs the first sample", "Tokens per problem", "Forward passes per problem"]
    header += [f"Δ final-answer error vs {b}, paired" for b in table.more_deltas]
    rows = []
    for name, row in table.rows.items():
        e = extra[name]
        cells = ["–" if math.isnan(row[c]["mean"]) else format_ci(row[c]) for c in COLUMNS]
        cells += [f"{e['fixed']} / {e['broken']}", f"{e['tokens_per_problem']:.0f}", f"{e['passes_per_problem']:.0f}"]
        cells += [format_ci(d[name], signed=True) if name in d else "–" for d in table.more_deltas.values()]
        rows.append([name, *cells])
    text = "\n".join([f"# {task_name}: locate, explain, revise, rerank\n", *_table(header, rows),
                      f"\n{table.n_problems} problems; brackets: {100 * (1 - table.alpha):g}% percentile-bootstrap "
                      "interval over problems (the same resampled sets for every row).", *_revisions_table(revisions),
                      "\n![tokens](tokens.png)\n"])
    plots.plot_tokens({n: (e["tokens_per_problem"], table.rows[n]["final_answer_error"]["mean"])
                       for n, e in extra.items()}, os.path.join(out_dir, "tokens.png"))
    atomic_files.write_text(os.path.join(out_dir, "results.md"), text)
    print(text)
    return text


def _revisions_table(revisions: Mapping[str, Mapping[str, int]]) -> list[str]:
    """What each variant's revisions did (counts over the problems it revised), as markdown lines."""
    if not revisions:
        return []
    columns = [("revised", "revised"), ("critic_hint", "the critic had a hint"),
               ("critic_names_located_step", "the critic named the located step"),
               ("critic_right_about_located", "… as the oracle does"),
               ("best_has_wrong_step", "the best sample had a wrong step"),
               ("located_first_error", "… located at its first wrong step"),
               ("prefix_all_right", "… forced prefix all right"), ("best_right", "best sample right"),
               ("revision_right", "a revision right"),
               ("revision_right_best_wrong", "… where the best sample is wrong"), ("kept", "revision kept"),
               ("kept_right", "kept and right"), ("fixed", "fixed vs the best sample"),
               ("broken", "broken vs the best sample")]
    rows = [[name, *(str(counts.get(key, "–")) for key, _ in columns)] for name, counts in revisions.items()]
    header = ["Row", *(title for _, title in columns)]
    return ["\n## What the revisions did (problems revised)\n", *_table(header, rows)]
