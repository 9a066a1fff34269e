"""One table over several seeds of the reward job or the joint job: each run's per-problem outcomes (`outcomes.json`,
written by its evaluation; the joint job's in `joint/`) pooled rule by rule, with intervals that resample each seed's
test problems within that seed.

A seed's own table answers "does this hold on these 1,000 problems"; the pooled one how the rules compare over
several trained pipelines at once: more problems (seeds x test problems), so tighter intervals, and a different
model behind every block of them. The intervals resample test problems, not seeds: they say how sure the pooled
difference is for these trained models, not for the next seed's. Abstention keeps the most confident share of all
pooled problems. The verifiers' first-error predictions (`eval/first_error_predictions.json`) are pooled the same way.
REFINER runs are pooled from each evaluation's per-problem scores of every row (`results.ROW_SCORES_FILE`):
`pool_refiner_seeds`.

    python launch/pool_seeds.py DIR_SEED0 DIR_SEED1 DIR_SEED2
"""
from __future__ import annotations

import json
import math
import os
from typing import Mapping, Sequence

import numpy as np

from refiner_jax.refiner.baselines import BASELINE_LABELS
from refiner_jax.reward import first_error, rerank
from refiner_jax.runs import results, run_config
from refiner_jax.stats import bootstrap_columns

OUTCOMES_FILE = "outcomes.json"
# Each verifier's first-error prediction on a run's test samples, written by `runs.step_studies`.
FIRST_ERROR_FILE = os.path.join("eval", "first_error_predictions.json")


def outcomes_record(outcomes: Mapping[str, rerank.Outcome], *, seed: int, k: int, rate: float,
                    trace_pairs: Sequence[tuple[str, str]], baselines: Mapping[str, str] | None = None,
                    baseline: str = "SFT greedy", labels: Mapping[str, str] | None = None) -> dict:
    """The per-problem results of every rule of one evaluation, as JSON (a confidence of -inf, "no answer", as
    null), with the rule every other is differenced from (`baseline`) and its further baseline rules (`baselines`:
    results.json key -> rule, e.g. `majority_paired_deltas`), which a pooled table differences from too. `labels`:
    the run's own row label of a rule whose name here leaves out what varies between seeds (the joint job's "PRM
    rerank, equal compute" is K = 17 on one seed and 18 on another)."""
    def confidence(values: np.ndarray) -> list:
        return [float(v) if math.isfinite(v) else None for v in np.asarray(values, float)]

    return {"seed": seed, "k": k, "rate": rate, "trace_pairs": [list(p) for p in trace_pairs],
            "baseline": baseline, "baselines": dict(baselines or {}), "labels": dict(labels or {}),
            "rules": {name: {"correct": np.asarray(o.correct, bool).tolist(), "confidence": confidence(o.confidence),
                             "steps_correct": None if o.steps_correct is None
                             else np.asarray(o.steps_correct, bool).tolist()}
                      for name, o in outcomes.items()}}


def read_outcomes(workdir: str) -> dict:
    """A reward run's `outcomes.json` (a joint run's `joint/outcomes.json`), its rules as `rerank.Outcome`s."""
    path = os.path.join(workdir, OUTCOMES_FILE)
    if not os.path.isfile(path) and os.path.isfile(os.path.join(workdir, "joint", OUTCOMES_FILE)):
        path = os.path.join(workdir, "joint", OUTCOMES_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no per-problem outcomes; evaluate the run again with this version: delete "
                                f"{workdir}/eval and {workdir}/results.json, then run its launch/train.py command "
                                f"with --workdir={workdir} --stages=rl,eval")
    with open(path) as f:
        record = json.load(f)
    rules = {}
    for name, r in record["rules"].items():
        conf = np.array([-np.inf if v is None else v for v in r["confidence"]], float)
        steps = None if r["steps_correct"] is None else np.asarray(r["steps_correct"], bool)
        rules[name] = rerank.Outcome(np.asarray(r["correct"], bool), conf, steps)
    return {"baseline": "SFT greedy", **record, "rules": rules}


def _read_seeds(workdirs: Sequence[str], read) -> tuple[list[dict], list[int]]:
    """`read(workdir)` of each run and their seeds; at least two runs, of different seeds."""
    if len(workdirs) < 2:
        raise ValueError(f"pool at least two runs' workdirs, got {len(workdirs)}")
    runs = [read(w) for w in workdirs]
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) < len(seeds):
        raise ValueError(f"the runs share seeds {seeds}: pool runs of different seeds")
    return runs, seeds


def pool_seeds(workdirs: Sequence[str], samples: int = 1000, alpha: float = 0.05) -> dict:
    """The rules every run has, each run's problems one stratum: `table` (as a run's results.json), the paired
    final-answer Δ against the runs' baseline rule ("SFT greedy" for the reward job, "PRM rerank, equal compute" for
    the joint job; `paired_deltas`) and against each further baseline every run names (e.g.
    `majority_paired_deltas`), the runs' trace-error pairs (`trace_error_delta`), the
    pooled first-error scores where every run saved its predictions (`pool_first_errors`) and the table in Markdown
    (`markdown`)."""
    runs, seeds = _read_seeds(workdirs, read_outcomes)
    for key in ("k", "rate", "baseline"):
        if len({r[key] for r in runs}) > 1:
            raise ValueError(f"the runs differ in {key}: {[r[key] for r in runs]}; pool runs of one job")
    first = runs[0]["baseline"]
    names = [n for n in runs[0]["rules"] if all(n in r["rules"] for r in runs)]
    if first not in names:
        raise ValueError(f"every run needs its {first!r} rule, the baseline of the paired deltas")
    names = [first] + [n for n in names if n != first]
    pooled = {}
    for name in names:
        parts = [r["rules"][name] for r in runs]
        steps = (None if any(p.steps_correct is None for p in parts)
                 else np.concatenate([p.steps_correct for p in parts]))
        pooled[name] = rerank.Outcome(np.concatenate([p.correct for p in parts]),
                                      np.concatenate([p.confidence for p in parts]), steps)
    pairs = [tuple(p) for p in runs[0]["trace_pairs"] if p[0] in pooled and p[1] in pooled]
    strata = [len(r["rules"][first].correct) for r in runs]
    more = {key: rule for key, rule in runs[0].get("baselines", {}).items()
            if rule in pooled and rule != first and all(r.get("baselines", {}).get(key) == rule for r in runs)}
    table = rerank.results_table(pooled, rate=runs[0]["rate"], samples=samples, seed=min(seeds), alpha=alpha,
                                 more_baselines=tuple(more.values()), trace_pairs=pairs, strata=strata)
    text = (f"Seeds {seeds} pooled, K = {runs[0]['k']}: {table.n_problems} problems ({strata} per seed), each "
            f"seed's problems resampled within it.\n\n" + results.markdown_table(table))
    if table.trace_deltas:
        text += "\nΔ trace error (points, paired): " + "; ".join(
            f"{pair} {results.format_ci(cell, signed=True)}" for pair, cell in table.trace_deltas.items()) + ".\n"
    varying = {name: [r.get("labels", {}).get(name, name) for r in runs] for name in names}
    varying = {name: seen for name, seen in varying.items() if any(label != name for label in seen)}
    if varying:
        text += "\nEach seed's own row labels: " + "; ".join(
            f"{name}: {', '.join(seen)}" for name, seen in varying.items()) + ".\n"
    out = {"seeds": seeds, "workdirs": list(workdirs), "problems_per_seed": strata, "k": runs[0]["k"],
           "labels_per_seed": varying,
           "table": table.rows, "paired_deltas": {"baseline": table.baseline, **table.deltas},
           **table.delta_blocks(more), "trace_error_delta": table.trace_deltas, "rate": table.rate,
           "problems": table.n_problems}
    firsts = pool_first_errors(workdirs, samples=samples, seed=min(seeds), alpha=alpha)
    if firsts is not None:
        out.update(firsts)
        text += ("\nFirst-error F1 (%), pooled: " + "; ".join(
            f"{name} {results.format_ci(cell['f1'])}" for name, cell in firsts["first_error"].items())
            + ".\nΔ first-error F1 (points, paired): " + "; ".join(
            f"{pair} {results.format_ci(cell, signed=True)}" for pair, cell in firsts["first_error_delta"].items())
            + ".\n")
    return {**out, "markdown": text}


def pool_first_errors(workdirs: Sequence[str], samples: int = 1000, seed: int = 0, alpha: float = 0.05
                      ) -> dict | None:
    """ProcessBench's first-error scores of the verifiers every run has, over all runs' test samples at once, each
    run's problems resampled within it (`first_error`, `first_error_delta` as in a run's results.json); None when
    a run has no `eval/first_error_predictions.json`."""
    paths = [os.path.join(w, FIRST_ERROR_FILE) for w in workdirs]
    if not all(os.path.isfile(p) for p in paths):
        return None
    records = []
    for path in paths:
        with open(path) as f:
            record = json.load(f)
        missing = [k for k in ("uids", "gold", "predictions") if k not in record]
        if missing:
            raise ValueError(f"{path} lacks {missing}: evaluate that run again with this version (--stages=rl,eval)")
        records.append(record)
    names = [n for n in records[0]["predictions"] if all(n in r["predictions"] for r in records)]
    gold, groups, strata = [], [], []
    predictions = {n: [] for n in names}
    offset = 0
    for r in records:
        # A case's uid is "<problem uid>/<sample>": the problem's samples are resampled together.
        problems = {}
        local = [problems.setdefault(uid.rsplit("/", 1)[0], len(problems)) for uid in r["uids"]]
        groups += [offset + i for i in local]
        strata.append(len(problems))
        offset += len(problems)
        gold += r["gold"]
        for n in names:
            predictions[n] += r["predictions"][n]
    pairs = [(a, b) for a, b in first_error.PAIRS if a in predictions and b in predictions]
    table, deltas = first_error.scores(gold, predictions, groups, samples, seed, alpha, pairs=pairs, strata=strata)
    return {"first_error": table, "first_error_delta": deltas}


def is_refiner_run(workdir: str) -> bool:
    """Whether `workdir` holds a REFINER run (its config's pipeline, or its evaluation's per-problem scores)."""
    if os.path.isfile(os.path.join(workdir, results.ROW_SCORES_FILE)):
        return True
    return (os.path.isfile(os.path.join(workdir, run_config.CONFIG_FILE))
            and run_config.load(workdir).get("pipeline", "refiner") == "refiner")


def read_row_scores(workdir: str) -> dict:
    """A REFINER run's per-problem scores of every row (`results.ROW_SCORES_FILE`, written by its evaluation)."""
    path = os.path.join(workdir, results.ROW_SCORES_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no per-problem scores; evaluate the run again with this version: "
                                f"python launch/evaluate.py --workdir={workdir} --out_dir={workdir}")
    with open(path) as f:
        record = json.load(f)
    missing = [k for k in ("seed", "uids", "metric", "rows") if k not in record]
    if missing:
        raise ValueError(f"{path} lacks {missing}: evaluate that run again with this version")
    return record


def pool_refiner_seeds(workdirs: Sequence[str], samples: int = 1000, alpha: float = 0.05) -> dict:
    """One REFINER table over several seeds' runs: each row every run has, its primary metric over all runs' test
    problems at once (`rows`: {key: {mean, low, high}}), and its paired difference from the generator alone and from
    every baseline row (`gain_vs`: {key: {baseline: {mean, low, high}}}), as fractions like a run's results.json;
    each run's problems are resampled within that run, one set of resamples for every cell; `markdown` holds the
    table (in %)."""
    runs, seeds = _read_seeds(workdirs, read_row_scores)
    if len({r["metric"] for r in runs}) > 1:
        raise ValueError(f"the runs score different metrics: {[r['metric'] for r in runs]}")
    for w, r in zip(workdirs, runs):
        bad = [k for k, v in r["rows"].items() if len(v) != len(r["uids"])]
        if bad:
            raise ValueError(f"{os.path.join(w, results.ROW_SCORES_FILE)}: rows {bad} do not score every one of its "
                             f"{len(r['uids'])} problems")
    keys = [k for k in runs[0]["rows"] if all(k in r["rows"] for r in runs)]
    if "generator" not in keys:
        raise ValueError("every run needs its 'generator' row (the generator alone), the baseline of the deltas")
    strata = [len(r["uids"]) for r in runs]
    scores = np.array([np.concatenate([np.asarray(r["rows"][k], np.float64) for r in runs]) for k in keys]).T
    against = ["generator"] + [k for k in BASELINE_LABELS if k in keys]
    columns = [scores] + [scores - scores[:, [keys.index(b)]] for b in against]  # [problems, rows] each
    means, lows, highs = bootstrap_columns(np.concatenate(columns, axis=1), samples, min(seeds), alpha, strata)

    def cell(j: int) -> dict:
        return {"mean": float(means[j]), "low": float(lows[j]), "high": float(highs[j])}

    n = len(keys)
    rows = {k: cell(i) for i, k in enumerate(keys)}
    gain_vs = {k: {b: cell((a + 1) * n + i) for a, b in enumerate(against) if b != k} for i, k in enumerate(keys)}
    header = ["row", f"{runs[0]['metric']} (%)"] + [f"Δ vs {'generator alone' if b == 'generator' else f'`{b}`'}"
                                                   for b in against]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    labels = runs[0].get("labels", {})
    for k in keys:
        cells = [f"{labels[k]} (`{k}`)" if k in labels else k, results.format_ci(rows[k])]
        cells += ["–" if b == k else results.format_ci(gain_vs[k][b], signed=True) for b in against]
        lines.append("| " + " | ".join(cells) + " |")
    text = (f"Seeds {seeds} pooled: {sum(strata)} problems ({strata} per seed), each seed's problems resampled "
            "within it; Δ in points, paired.\n\n" + "\n".join(lines) + "\n")
    return {"seeds": seeds, "workdirs": list(workdirs), "problems_per_seed": strata, "metric": runs[0]["metric"],
            "rows": rows, "gain_vs": gain_vs, "markdown": text}
