"""The joint run (`pipeline = "joint"`, `configs/joint_mwp.py`): a REFINER run's generator and critic and a reward
run's PRM on the same problems, combined by `joint.locate_explain_revise` and compared with each part alone at
equal compute.

    refiner  the REFINER run's warm-up, critic and REFINER loop (`config.refiner_run`), unless
             `joint.refiner_workdir` names a finished run
    reward   the reward run's SFT policy and PRM (`config.reward_run`), unless `joint.reward_workdir` names a
             finished run
    joint    K (and up to 2K) samples of the REFINER generator per test problem, scored by the PRM, then every row
             of the table; `joint/results.md`, `results.json`, `tokens.png`

The gate (on the best sample's PRM score) and the step threshold (first-error F1) are chosen on validation samples.
Compute is counted per problem for every row; "PRM rerank, equal compute" draws as many samples as the full system
spends tokens, and "REFINER loop, equal compute" takes as many of the same samples through the loop as spend them,
then votes (`joint.loop_baselines`). The models never see a problem's values (numbers are masked), so runs trained
on the plain generator serve its trace-error variant alike.
"""
from __future__ import annotations

import math
import os
import re
from typing import Sequence

import jax
import ml_collections
import numpy as np

from refiner_jax import atomic_files
from refiner_jax.joint import locate_explain_revise as joint, loop_baselines
from refiner_jax.joint.revision_stats import revision_stats
from refiner_jax.refiner.critics import OracleCritic, SolverCritic
from refiner_jax.reward import first_error, rerank
from refiner_jax.reward.scorer import load_reward_model
from refiner_jax.runs import (plots, refiner_eval, refiner_run, results as results_lib, reward_run, run_config,
                              run_lock, seed_pool)
from refiner_jax.runs.run_info import RunInfo
from refiner_jax.tasks import get_task
from refiner_jax.tasks.base import Example, Task

STAGES = ("refiner", "reward", "joint")
# What the joint rows use of each run; the runs' own evaluations, baselines and the reward job's ORM and expert
# iteration are left to those jobs (`launch/train.py` on the same workdir adds them).
REFINER_STAGES = ("warmup", "critic", "refiner")
REWARD_STAGES = ("sft", "prm")
FULL = "locate + explain + revise + rerank"
ORACLE = "locate + the oracle's explanation (a bound) + revise + rerank"


def _need(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise run_config.ConfigError(f"config.joint.{field}: {message}")


def validate(config: ml_collections.ConfigDict) -> None:
    j = config.joint
    _need(j.samples >= 1, "samples", "must be >= 1 (K samples per problem)")
    _need(j.turns >= 1, "turns", "must be >= 1 (the REFINER loop's turns and the joint revision rounds)")
    _need(j.temperature > 0, "temperature", "must be > 0 (the K samples must differ)")
    _need(0 < j.top_p <= 1, "top_p", "must be in (0, 1]")
    for field in ("refiner_workdir", "reward_workdir"):
        path = j[field]
        _need(not path or os.path.isfile(os.path.join(path, run_config.CONFIG_FILE)), field,
              f"{path} is not a finished run directory (no {run_config.CONFIG_FILE}); train it first or leave "
              "the field empty to train one here")
    if j.reward_workdir:
        _need(os.path.isdir(os.path.join(j.reward_workdir, "prm", "export")), "reward_workdir",
              f"{j.reward_workdir} has no trained PRM (prm/export); run its prm stage first")
    if j.refiner_workdir:
        _need(os.path.isdir(os.path.join(j.refiner_workdir, "critic", "export")), "refiner_workdir",
              f"{j.refiner_workdir} has no trained critic (critic/export); run its critic stage first")
    else:
        run_config.validate(config.refiner_run)
    if not j.reward_workdir:
        run_config.validate(config.reward_run)


def run(config: ml_collections.ConfigDict, workdir: str, stages: Sequence[str] = STAGES) -> dict:
    """Trains what `config.joint` does not name, then evaluates every row; returns the results."""
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise run_config.ConfigError(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
    validate(config)
    j = config.joint
    refiner_dir = j.refiner_workdir or os.path.join(workdir, "refiner")
    reward_dir = j.reward_workdir or os.path.join(workdir, "reward")
    if not j.refiner_workdir and "refiner" in stages:
        refiner_run.run(config.refiner_run, refiner_dir, REFINER_STAGES)
    if not j.reward_workdir and "reward" in stages:
        reward_run.run(config.reward_run, reward_dir, REWARD_STAGES)
    if "joint" not in stages:
        return {}
    out_dir = os.path.join(workdir, "joint")
    os.makedirs(out_dir, exist_ok=True)
    lock = run_lock.acquire(out_dir)
    try:
        return evaluate(config, out_dir, refiner_dir, reward_dir)
    finally:
        lock.release()


class _Models:
    """The generator, critic, PRM and token counter of the two runs."""

    def __init__(self, config, task: Task, refiner_dir: str, reward_dir: str):
        j = config.joint
        info = RunInfo(refiner_dir, run_config.load(refiner_dir))
        _, self.generator, self.critic = refiner_eval.load_run_models(info, task, j.batch_size)
        self.tokenizer = info.tokenizer()
        reward = RunInfo(reward_dir, run_config.load(reward_dir))
        self.prm = load_reward_model(os.path.join(reward_dir, "prm"), reward.tokenizer(), task,
                                     reward.lengths["input"], reward.lengths["target"])
        self.template = info.config.refiner.template
        self.task = task

    def tokens(self, text: str) -> int:
        """Tokens a model writes for `text`: its tokens and the end token."""
        return len(self.tokenizer.encode(text, add_eos=False)) + 1

    def critic_cost(self, example: Example, solution: str, feedback: str, first: bool = True) -> tuple[int, int]:
        """(tokens, passes) of one critic call: a solving critic writes its own answer (greedy plus its samples) on
        its `first` call on a problem and scores the hypothesis on every call; the paper's critic writes its
        feedback."""
        if isinstance(self.critic, SolverCritic):
            own = self.tokens(self.critic.references([example])[0][0]) * (1 + self.critic.samples) if first else 0
            return own, (own + 1 + self.critic.samples if first else 0) + 1
        return self.tokens(feedback), self.tokens(feedback) + 1

    def explain_cost(self, example: Example, solution: str, said: str, first: bool = True) -> tuple[int, int]:
        """(tokens, passes) of asking the critic about one step: a solving critic's check costs what its feedback
        does; the paper's critic scores each of the task's sentences about the step and writes nothing."""
        if isinstance(self.critic, SolverCritic) or not self.task.step_sentences(0):
            return self.critic_cost(example, solution, said, first)
        return 0, len(self.task.step_sentences(0))

    def generate(self, inputs: list[str], prefixes: list[str]) -> list[str]:
        return [t[0] for t in self.generator.generate(inputs, prefixes=prefixes)]

    def steps(self, examples: Sequence[Example], solutions: list[list[str]]) -> list[list[np.ndarray]]:
        flat = self.prm.step_scores([ex.x for ex, hs in zip(examples, solutions) for _ in hs],
                                    [h for hs in solutions for h in hs])
        out, at = [], 0
        for hs in solutions:
            out.append(flat[at:at + len(hs)])
            at += len(hs)
        return out


def _gate(best_scores: np.ndarray, wrong: np.ndarray) -> float:
    """The best-sample score below which a problem is revised: the cut with the highest balanced accuracy at
    telling wrong chosen answers from right ones (validation)."""
    cuts = np.unique(best_scores)
    if cuts.size == 0 or wrong.all() or not wrong.any():
        return float("inf") if wrong.all() else float("-inf")

    def balanced(t):
        flagged = best_scores < t
        return (flagged[wrong].mean() + (~flagged[~wrong]).mean()) / 2

    return float(max(np.concatenate([cuts, [cuts[-1] + 1]]), key=balanced))


def evaluate(config, out_dir: str, refiner_dir: str, reward_dir: str) -> dict:
    j = config.joint
    task = get_task(config.task.name, **dict(config.task.options))
    data_dir = config.task.data_dir or None
    test, val = task.load("test", data_dir)[:j.examples], task.load("val", data_dir)[:j.val_problems]
    m = _Models(config, task, refiner_dir, reward_dir)
    k, rng = j.samples, jax.random.key(config.seed)
    draw = dict(temperature=j.temperature, top_p=j.top_p)
    pool = m.generator.generate([ex.x for ex in test], num_samples=2 * k, rng=rng, **draw)  # [n][2K]
    val_samples = m.generator.generate([ex.x for ex in val], num_samples=k, rng=jax.random.fold_in(rng, 1), **draw)
    pool_steps, val_steps = m.steps(test, pool), m.steps(val, val_samples)
    # Thresholds from validation: the step threshold by first-error F1, the gate on the best sample's score.
    flat_val = [(ex, h) for ex, hs in zip(val, val_samples) for h in hs]
    gold = [first_error.gold_first_error(task.step_labels(ex, h), task.outcome_label(ex, h)) for ex, h in flat_val]
    step_threshold = first_error.choose_threshold([s for ss in val_steps for s in ss], gold)
    best = [int(np.argmax([joint.solution_score(s) for s in ss])) for ss in val_steps]
    gate = _gate(np.array([joint.solution_score(ss[b]) for ss, b in zip(val_steps, best)]),
                 np.array([not task.outcome_label(ex, hs[b]) for ex, hs, b in zip(val, val_samples, best)]))
    sample_tokens = np.array([[m.tokens(h) for h in hs] for hs in pool])  # [n, 2K]

    def sampled(count) -> joint.Compute:
        """The cost of `count` samples per problem (one count, or one per problem), each scored once."""
        counts = np.broadcast_to(count, (len(pool),))
        tokens = np.where(np.arange(2 * k) < counts[:, None], sample_tokens, 0).sum(axis=1)
        return joint.Compute(tokens, tokens + 2 * counts)

    rows: dict[str, tuple[list[str], np.ndarray, joint.Compute]] = {}
    rows["first sample"] = ([hs[0] for hs in pool], np.array([joint.solution_score(ss[0]) for ss in pool_steps]),
                            sampled(1))
    answers = [[task.answer_key(ex, h) for h in hs] for ex, hs in zip(test, pool)]  # [n][2K]
    verifier = np.array([[joint.solution_score(s) for s in ss] for ss in pool_steps])  # [n, 2K]

    def selected(rule: str, count):
        """`rerank.RULES`' rule over the first `count` samples of each problem (one count, or one per problem): the
        chosen solutions (the first sample where none has an answer), their confidence and the samples' cost."""
        counts = np.broadcast_to(count, (len(pool),))
        width = int(counts.max())
        drawn = np.arange(width) < counts[:, None]  # [n, width]
        sel = rerank.select(rule, [[a if d else None for a, d in zip(row, ds)] for row, ds in zip(answers, drawn)],
                            {"verifier": np.where(drawn, verifier[:, :width], -np.inf)})
        return [hs[max(int(i), 0)] for hs, i in zip(pool, sel.index)], sel.confidence, sampled(count)

    for r in rerank.RULES:  # every rule over the verifier's scores: "PRM rerank (K)", "PRM-weighted vote (K)"
        if r.reads == "verifier":
            rows[r.label.format(k=k)] = selected(r.name, k)
    variants = {FULL: joint.Variant(), f"{FULL}, no gate": joint.Variant(gate=False),
                "locate + explain (only where the critic speaks unasked) + revise + rerank": joint.Variant(ask=False),
                "locate only (\"#k is wrong\") + revise + rerank": joint.Variant(explain=False),
                "explain only (the critic's feedback) + revise + rerank": joint.Variant(locate=False),
                "locate + explain + revise, the revision replaces the sample": joint.Variant(rerank=False),
                "locate + explain + revise + PRM-weighted vote": joint.Variant(vote=True),
                ORACLE: joint.Variant()}
    revisions = {}
    for label, variant in variants.items():
        asked = dict(critic=m.critic, critic_cost=m.critic_cost, explain_cost=m.explain_cost)
        if label == ORACLE:  # the gold-aware critic, charged nothing: how far better explanations could go
            asked = dict(critic=OracleCritic(task), critic_cost=_free, explain_cost=_free)
        out = joint.joint_refine(test, [hs[:k] for hs in pool], [ss[:k] for ss in pool_steps], task=task,
                                 generate=m.generate, score_steps=m.prm.step_scores, count_tokens=m.tokens,
                                 gate=gate, step_threshold=step_threshold, variant=variant, template=m.template,
                                 turns=j.turns, **asked)
        spent = sampled(k)
        revisions[f"{label} (K={k}, T={j.turns})"] = revision_stats(test, out, task)
        rows[f"{label} (K={k}, T={j.turns})"] = (out.chosen, out.confidence,
                                    joint.Compute(spent.tokens + out.compute.tokens, spent.passes + out.compute.passes))
    full_tokens = rows[f"{FULL} (K={k}, T={j.turns})"][2].tokens.mean()
    matched = int(min(2 * k, max(k, math.ceil(full_tokens / sample_tokens[:, :k].mean()))))
    equal = f"PRM rerank, equal compute (K={matched})"
    rows[equal] = selected("verifier_rerank", matched)
    # The same compute spent where the full system spends it: more samples only for the problems below the gate.
    doubted = rows[rerank.rule("verifier_rerank").label.format(k=k)][1] < gate
    extra = next((e for e in range(k + 1) if sampled(k + e * doubted).tokens.mean() >= full_tokens), k)
    gated = f"PRM rerank, {extra} more samples below the gate, equal compute"
    rows[gated] = selected("verifier_rerank", k + extra * doubted)
    vote_equal = f"PRM-weighted vote, equal compute (K={matched})"
    rows[vote_equal] = selected("verifier_weighted_vote", matched)
    refiner_label = f"REFINER loop (T={j.turns})"
    rows[refiner_label] = _refiner_loop(m, task, test, j.turns)
    # The loop at equal compute: the fewest of the 2K samples which, each taken through the loop, spend the full
    # system's tokens; then a majority vote over their answers.
    runs = loop_baselines.run_loops(test, pool, generator=m.generator, critic=m.critic, task=task, turns=j.turns,
                                    count_tokens=m.tokens, critic_cost=m.critic_cost, template=m.template)
    starts = loop_baselines.matched_starts(runs, full_tokens)
    loop_equal = f"REFINER loop, equal compute ({starts} sampled starts, T={j.turns}, majority vote)"
    rows[loop_equal] = (*loop_baselines.vote(runs, test, task, starts), runs.compute(starts))
    # Names for pooling seeds: what varies between seeds (K, the samples added, the starts) left out.
    stable = {equal: "PRM rerank, equal compute", gated: "PRM rerank, more samples below the gate, equal compute",
              vote_equal: "PRM-weighted vote, equal compute", loop_equal: "REFINER loop, equal compute"}
    return _report(config, out_dir, task, test, pool, rows, (equal, gated, vote_equal, refiner_label, loop_equal),
                   revisions, results_lib.convergence({"refiner": refiner_dir, "reward": reward_dir}),
                   stable, {"gate": gate, "step_threshold": step_threshold, "equal_compute_samples": matched,
                    "samples_added_below_gate": extra, "share_below_gate": float(doubted.mean()),
                    "refiner_loop_starts": starts})


def _free(example: Example, solution: str, said: str, first: bool) -> tuple[int, int]:
    return 0, 0


def _refiner_loop(m: _Models, task: Task, test: Sequence[Example], turns: int):
    """The REFINER loop alone: greedy, then critic and revision for `turns` rounds; its final answers, their PRM
    score (for abstention, not counted as compute) and its compute."""
    runs = loop_baselines.run_loops(test, [[z] for z in m.generator.greedy([ex.x for ex in test])],
                                    generator=m.generator, critic=m.critic, task=task, turns=turns,
                                    count_tokens=m.tokens, critic_cost=m.critic_cost, template=m.template)
    final = [hs[0] for hs in runs.final(1)]
    confidence = np.array([joint.solution_score(s) for s in
                           m.prm.step_scores([ex.x for ex in test], final)])
    return final, confidence, runs.compute(1)


def _report(config, out_dir: str, task: Task, test, pool, rows: dict, baselines: tuple[str, ...],
            revisions: dict, stages: dict, stable: dict, settings: dict) -> dict:
    """Writes the joint table's `results.json` (with `stages`, the trained runs' convergence block, also plotted
    in `convergence.png`), its outcomes for pooling seeds and `results.md`; returns the results."""
    j = config.joint
    first = np.array([task.outcome_label(ex, hs[0]) for ex, hs in zip(test, pool)])
    outcomes, extra = {}, {}
    for label, (chosen, confidence, compute) in rows.items():
        correct = np.array([task.outcome_label(ex, h) for ex, h in zip(test, chosen)])
        steps_ok = np.array([bool(labels) and all(labels) for labels in
                             (task.step_labels(ex, h) for ex, h in zip(test, chosen))])
        outcomes[label] = rerank.Outcome(correct, confidence, steps_ok)
        extra[label] = {"tokens_per_problem": float(compute.tokens.mean()),
                        "passes_per_problem": float(compute.passes.mean()),
                        "fixed": int((correct & ~first).sum()), "broken": int((~correct & first).sum())}
    table = rerank.results_table(outcomes, rate=j.abstention, samples=j.bootstrap_samples, seed=config.seed,
                                 more_baselines=baselines)
    results = {"table": {label: {**row, **extra[label]} for label, row in table.rows.items()},
               "paired_deltas": [{"baseline": b, **table.more_deltas[b]} for b in baselines],
               "revisions": revisions, "problems": table.n_problems, "rate": table.rate, "settings": settings,
               "convergence": stages}
    atomic_files.write_json(os.path.join(out_dir, "results.json"), results, indent=2, default=float)
    if stages:
        plots.plot_convergence(stages, os.path.join(out_dir, "convergence.png"))

    def name(label: str) -> str:
        return stable.get(label, label)

    atomic_files.write_json(os.path.join(out_dir, seed_pool.OUTCOMES_FILE), seed_pool.outcomes_record(
        {name(label): o for label, o in outcomes.items()}, seed=config.seed, k=j.samples, rate=j.abstention,
        trace_pairs=(), baseline=name(baselines[0]), labels={name(label): label for label in outcomes},
        baselines={"paired_deltas_vs_" + re.sub(r"[^a-z0-9]+", "_", name(b).lower()).strip("_"): name(b)
                   for b in baselines[1:]}))
    results_lib.write_joint_results(out_dir, task.name, table, extra, revisions)
    return results
