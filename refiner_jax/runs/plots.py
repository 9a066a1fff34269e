"""The runs' PNG figures: learning curves per stage, the convergence block's validation curves, REFINER's noise
study, a reward run's abstention curves, the joint system's tokens against error, and GRPO's reward, KL and
validation curves. Each function draws one file from already computed numbers and returns its path.
"""
from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from refiner_jax.reward.rerank import Curve

# Logged per training step, not learning progress: left out of the learning-curve plots.
_NOT_CURVES = frozenset({"stage", "step", "examples_per_s", "tokens_per_s", "learning_rate", "lr", "grad_norm",
                         "best_step"})


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_noise(results: Mapping[str, Any], path: str) -> str:
    """Primary metric (%) of the final hypotheses vs. the noise level epsilon, with 95% CI error bars; dashed
    lines for the generator alone and the trained critic when the results have those rows."""
    plt = _pyplot()
    noise = results["noise"]
    metric = noise.get("primary_metric") or results.get("primary_metric")
    eps = [r["epsilon"] for r in noise["rows"]]
    mean = [100 * r["mean"] for r in noise["rows"]]
    err = [[100 * (r["mean"] - r["low"]) if r.get("low") is not None else 0 for r in noise["rows"]],
           [100 * (r["high"] - r["mean"]) if r.get("high") is not None else 0 for r in noise["rows"]]]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.errorbar(eps, mean, yerr=err, marker="o", capsize=4, label="oracle critic + noise")
    styles = {"generator": ("gray", "generator alone"), "critic": ("tab:green", "trained critic")}
    for row in results.get("rows") or []:
        if row["key"] in styles and metric in row["metrics"]:
            color, label = styles[row["key"]]
            ax.axhline(100 * row["metrics"][metric]["mean"], color=color, linestyle="--", label=label)
    ax.set_xlabel("feedback noise ε (share of random feedback)")
    ax.set_ylabel(f"{metric} (%)")
    ax.set_title(f"{results.get('task', '')}: noisy critic, T={noise.get('turns', '?')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _curve_keys(records: Sequence[dict]) -> tuple[list[str], list[str]]:
    """(loss keys, validation keys) of a stage's records. Validation metrics are the numeric fields of records
    without a "loss" (evaluation records) and "val*" fields anywhere; per-type breakdowns ("a/b") are left out
    unless there is nothing else."""
    loss: list[str] = []
    val: list[str] = []
    for r in records:
        for k, v in r.items():
            if k in _NOT_CURVES or not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            target = loss if "loss" in k else val if "loss" not in r or k.startswith("val") else None
            if target is not None and k not in target:
                target.append(k)
    return loss, [k for k in val if "/" not in k] or val


def plot_learning_curves(by_stage: Mapping[str, Sequence[dict]], out_dir: str) -> dict[str, str]:
    """One PNG per stage of a `metrics.jsonl` (`results.read_metrics`): training loss (left) and validation metrics
    (right) vs. step."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    out = {}
    for stage, records in by_stage.items():
        loss_keys, val_keys = _curve_keys(records)
        if not loss_keys and not val_keys:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharex=True)
        for ax, keys, title in ((axes[0], loss_keys, "loss"), (axes[1], val_keys, "validation")):
            for k in keys:
                points = sorted((r["step"], r[k]) for r in records if isinstance(r.get(k), (int, float)))
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None,
                        label=k)
            ax.set_title(f"{stage}: {title}")
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if keys:
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "nothing logged", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        out[stage] = os.path.join(out_dir, f"curves_{stage}.png")
        fig.savefig(out[stage], dpi=110)
        plt.close(fig)
    return out


def plot_convergence(block: Mapping[str, Mapping], path: str) -> str:
    """One panel per trained stage: its validation curve, the exported (best) step marked, and a dashed line where
    it stopped early; returns `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = min(3, max(1, len(block)))
    rows = -(-len(block) // columns)
    fig = Figure(figsize=(4.2 * columns, 3.2 * rows))
    FigureCanvasAgg(fig)
    for i, (stage, c) in enumerate(block.items()):
        ax = fig.add_subplot(rows, columns, i + 1)
        steps, values = [p[0] for p in c["curve"]], [p[1] for p in c["curve"]]
        ax.plot(steps, values, marker=".")
        best = [v for s, v in c["curve"] if s == c["best_step"]]
        if best:
            ax.plot([c["best_step"]], best, marker="*", markersize=12, color="tab:red", linestyle="none",
                    label=f"exported (step {c['best_step']})")
            ax.legend(fontsize=7)
        if c["stopped_early"]:
            ax.axvline(c["last_step"], color="gray", linestyle="--")
        ax.set(title=f"{stage}" + (" (stopped early)" if c["stopped_early"] else ""), xlabel="step",
               ylabel=c.get("metric", "validation"))
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_abstention(curves: Mapping[str, Curve], path: str) -> str:
    """Error-vs-coverage PNG at `path`, one line per selection rule; returns `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 4.0))
    FigureCanvasAgg(fig)  # Agg without pyplot: no global backend switch, no window
    ax = fig.add_subplot()
    for name, curve in curves.items():
        ax.plot(100 * np.asarray(curve.coverage), 100 * np.asarray(curve.error), marker=".", label=name)
    ax.set(xlabel="coverage (% of problems answered)", ylabel="final-answer error (%)", title="Selective prediction")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    return path


def plot_tokens(points: Mapping[str, tuple[float, float]], path: str) -> str:
    """Final-answer error (%) against tokens per problem, one labelled point per row; returns `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.0 + 0.22 * len(points)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    markers = "osD^v<>p*hX"
    for i, (name, (tokens, error)) in enumerate(points.items()):
        ax.scatter([tokens], [100 * error], marker=markers[i % len(markers)], label=name)
    ax.set(xlabel="tokens per problem (all models)", ylabel="final-answer error (%)", title="Error against compute")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_grpo_curves(rounds: Mapping[str, Sequence[Mapping]], validation: Mapping[str, Sequence[Mapping]],
                     updates: int, path: str) -> str:
    """GRPO stages' curves against the gradient step, one line per stage: the mean reward and the k3 KL to the
    reference of each sample batch (`runs.grpo_stage.read_rounds`; batch b starts at step b * `updates`), and the
    validation final-answer error and trace error (%) of each evaluation (`metrics.jsonl` records); returns `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 7.0))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2).ravel()
    panels = (("reward", "mean reward of the sample batch", rounds, 1.0),
              ("kl", "KL to the SFT policy (k3, per token)", rounds, 1.0),
              ("final_answer_error", "validation final-answer error (%)", validation, 100.0),
              ("trace_error", "validation trace error (%)", validation, 100.0))
    for ax, (key, title, source, scale) in zip(axes, panels):
        for stage, records in source.items():
            points = [(r["batch"] * updates if source is rounds else r["step"], r.get(key)) for r in records]
            points = [(x, scale * y) for x, y in points if isinstance(y, (int, float)) and math.isfinite(y)]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None,
                        label=stage)
        ax.set(title=title, xlabel="gradient step")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    return path
