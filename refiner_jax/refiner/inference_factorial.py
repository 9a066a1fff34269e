"""Where the oracle's lead over the trained critic comes from, at inference only.

Two factors, crossed: who decides that a hypothesis is revised (`DECIDERS`: the oracle, which knows the gold, or the
trained critic with its calibrated threshold) and what text the generator then reads (`TEXTS`):
  * "oracle"   the oracle's sentences;
  * "critic"   the trained critic's sentences, whatever its threshold says (`CalibratedCritic.unthresholded`);
  * "location" only where the oracle's first error is (`task.location_feedback` of the first step it names);
  * "plain"    "There is an error.", the same for every revision.
A text source with nothing to say about a hypothesis its decider flags (the oracle on a right hypothesis the critic
doubts; the critic agreeing with a hypothesis the oracle rejects) gives the plain sentence instead; each cell counts
these `fallbacks`. Every cell runs the same loop (`feedback_loop.refine`, T turns) from the same turn-0 hypotheses,
so a cell's gain over the generator alone is paired per problem, and the (critic, critic) and (oracle, oracle) cells
are the results table's "+ trained critic" and "+ oracle critic" rows.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

from refiner_jax.refiner import critics, feedback_loop
from refiner_jax.refiner.evaluation import paired_gain, primary_metric
from refiner_jax.stats import bootstrap_ci
from refiner_jax.tasks.base import DEFAULT_REFINE_TEMPLATE, NO_HINT, Example, Task, is_no_hint

DECIDERS = ("oracle", "critic")
TEXTS = ("oracle", "critic", "location", "plain")
PLAIN = "There is an error."
_STEP = re.compile(r"#\s*(\d+)")

Speak = Callable[[list[Example], list[str]], list[str]]


@dataclasses.dataclass
class CrossedCritic:
    """`decider` decides which hypotheses are revised ("No hint" for the rest); `speak` says what each revision
    reads, `PLAIN` where it has nothing to say. Counts revisions asked for and plain fallbacks over its calls."""

    decider: critics.Critic
    speak: Speak
    revisions: int = 0
    fallbacks: int = 0

    def feedback(self, examples: Sequence[Example], hypotheses: Sequence[str]) -> list[str]:
        decided = feedback_loop.ask_critic(self.decider.feedback, examples, hypotheses)
        going = [i for i, f in enumerate(decided) if not is_no_hint(f)]
        out = [NO_HINT] * len(hypotheses)
        if going:
            said = feedback_loop.ask_critic(self.speak, [examples[i] for i in going], [hypotheses[i] for i in going])
            for i, text in zip(going, said):
                if is_no_hint(text) or not text.strip():
                    text, self.fallbacks = PLAIN, self.fallbacks + 1
                out[i] = text
            self.revisions += len(going)
        return out


def location_only(task: Task, oracle: critics.Critic) -> Speak:
    """Where the oracle's first named error is, and nothing about what is wrong there ("No hint" when it names no
    step)."""

    def speak(examples: list[Example], hypotheses: list[str]) -> list[str]:
        out = []
        for said in oracle.feedback(examples, hypotheses):
            step = _STEP.search(said) if not is_no_hint(said) else None
            out.append(task.location_feedback(int(step.group(1))) if step else NO_HINT)
        return out

    return speak


def speakers(task: Task, critic: critics.CalibratedCritic, oracle: critics.Critic) -> dict[str, Speak]:
    """Each text source of `TEXTS` as a function of (problems, hypotheses)."""
    return {"oracle": oracle.feedback, "critic": critic.unthresholded().feedback,
            "location": location_only(task, oracle), "plain": lambda examples, hypotheses: [PLAIN] * len(hypotheses)}


def run_factorial(task: Task, generators: Mapping[str, feedback_loop.Generator], critic: critics.CalibratedCritic,
                  examples: Sequence[Example], turns: int, template: str = DEFAULT_REFINE_TEMPLATE,
                  bootstrap_samples: int = 1000, seed: int = 0,
                  initial: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """{"turns", "primary_metric", "num_examples", "generators": {name: {"alone": {mean, low, high}, "cells":
    {"<decider>/<text>": {"mean", "low", "high", "gain": paired gain over the generator alone, "revisions",
    "fallbacks"}}}}} for every generator of `generators` (its greedy turn-0 answers, or `initial[name]`)."""
    examples = list(examples)
    oracle = critics.OracleCritic(task)
    deciders = {"oracle": oracle, "critic": critic}
    texts = speakers(task, critic, oracle)
    out: dict[str, Any] = {"turns": turns, "num_examples": len(examples), "generators": {}}
    for name, generator in generators.items():
        z0 = list(initial[name]) if initial and name in initial else generator.greedy([ex.x for ex in examples])
        cells, alone = {}, None
        for decider in DECIDERS:
            for text in TEXTS:
                crossed = CrossedCritic(deciders[decider], texts[text])
                runs = feedback_loop.refine(generator, crossed, task, examples, turns, template, initial=z0)
                metric = out.setdefault("primary_metric", primary_metric(task, list(runs[0].scores[0])))
                final = [float(t.scores[-1][metric]) for t in runs]
                if alone is None:
                    alone = dict(zip(("mean", "low", "high"), bootstrap_ci(
                        [float(t.scores[0][metric]) for t in runs], bootstrap_samples, seed)))
                mean, low, high = bootstrap_ci(final, bootstrap_samples, seed)
                cells[f"{decider}/{text}"] = {"mean": mean, "low": low, "high": high,
                                              "gain": paired_gain(runs, metric, None, bootstrap_samples, seed),
                                              "revisions": crossed.revisions, "fallbacks": crossed.fallbacks}
        out["generators"][name] = {"alone": alone, "cells": cells}
    return out


def factorial_markdown(block: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> list[str]:
    """One table per generator: a row per decider, a column per text; each cell the primary metric's gain over
    the generator alone, in points, with its paired 95% interval, and (revisions, plain fallbacks)."""
    metric = block.get("primary_metric", "")
    lines = [f"## Who decides x what the generator reads (T={block['turns']}, {block['num_examples']} problems)", "",
             f"Gain in {metric} over the generator alone, in points [paired 95% bootstrap interval]; (revisions "
             "asked for, of them given the plain sentence because the text source had nothing to say).", ""]
    for name, result in block["generators"].items():
        alone = result["alone"]
        lines += [f"**{(labels or {}).get(name, name)}** (alone: {100 * alone['mean']:.1f} "
                  f"[{100 * alone['low']:.1f}, {100 * alone['high']:.1f}])", "",
                  "| decides \\ reads | " + " | ".join(TEXTS) + " |", "|---" * (len(TEXTS) + 1) + "|"]
        for decider in DECIDERS:
            row = []
            for text in TEXTS:
                cell = result["cells"][f"{decider}/{text}"]
                g = cell["gain"]
                row.append(f"{100 * g['mean']:+.1f} [{100 * g['low']:+.1f}, {100 * g['high']:+.1f}] "
                           f"({cell['revisions']}, {cell['fallbacks']})")
            lines.append(f"| {decider} | " + " | ".join(row) + " |")
        lines.append("")
    return lines
