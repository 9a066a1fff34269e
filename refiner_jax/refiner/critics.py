"""Critics: anything that maps (problems, hypotheses) to feedback strings, "No hint" meaning nothing to fix.

Trained critics (`ModelCritic`, the paper's x + hypothesis -> feedback; `SolverCritic`, solve then compare) also
give a `confidence` that each hypothesis is right and, asked about one step, `explain` it; `load_critic` reads a
run's trained critic with its calibrated threshold. These optional capabilities are declared as protocols
(`ConfidentCritic`, `ExplainingCritic`, `CalibratedCritic`, `BudgetedCritic`): any critic object that has the
methods has the capability, and callers ask with `isinstance`. `OracleCritic`, `NoisyCritic`, `HumanCritic` and
`CallableCritic` cover the gold, noisy, human and any Python function as critics.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, runtime_checkable

import jax
import numpy as np
from jax.sharding import Mesh

from refiner_jax.tasks.base import NO_HINT, Example, Task, as_task_question, gold_fields_read, sentences_about
from refiner_jax import text_model
from refiner_jax.text_model import TextModel

if TYPE_CHECKING:  # annotations only: runs/ imports refiner/, never the other way at run time
    from refiner_jax.runs.run_info import RunInfo

CRITIC_MODES = ("feedback", "solve")  # config.critic.mode: `ModelCritic` (x + hypothesis -> feedback), `SolverCritic`
CALIBRATION_FILE = "calibration.json"  # beside a trained critic's export: its calibrated "No hint" threshold


@runtime_checkable
class Critic(Protocol):
    """Anything that gives feedback on hypotheses; "No hint" means nothing to fix."""

    def feedback(self, examples: Sequence[Example], hypotheses: Sequence[str]) -> list[str]: ...


@runtime_checkable
class ConfidentCritic(Critic, Protocol):
    """A critic that also says how sure it is that each hypothesis is right: calibration, AUROC and reranking use
    it."""

    def confidence(self, examples: Sequence[Example], hypotheses: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class ExplainingCritic(Critic, Protocol):
    """A critic that can be asked about one step of each hypothesis (`steps[i]`, which the caller already doubts)
    and answers with its sentences about that step ("No hint" when it has none)."""

    def explain(self, examples: Sequence[Example], hypotheses: Sequence[str], steps: Sequence[int]) -> list[str]: ...


@runtime_checkable
class CalibratedCritic(Critic, Protocol):
    """A critic whose "No hint" is a calibrated decision on top of what it would say: `unthresholded` is the same
    critic saying whatever it finds, however unsure (what text the critic would give when someone else decides)."""

    def unthresholded(self) -> Critic: ...


@runtime_checkable
class BudgetedCritic(Critic, Protocol):
    """A critic whose inputs have a token budget (`model.max_input`): `input_lengths` measures each input, so that a
    caller can warn before an input loses its end."""

    model: TextModel

    def input_lengths(self, examples: Sequence[Example], hypotheses: Sequence[str]) -> list[int]: ...


@dataclasses.dataclass
class ModelCritic:
    """A trained critic: greedy feedback from (problem + hypothesis).

        critic = load_critic(run_config.load_run(workdir))  # a ModelCritic when config.critic.mode is "feedback"
        critic.feedback(["Tom has 3 apples ...", ...], ["#0: 3 + 5", ...])   # -> ["The operator in #0 ...", ...]

    Problems are `Example`s or plain question strings (for tasks whose critic reads only the question; Moral
    Stories' critic also reads the gold moral action, so it needs `Example`s).

    With a `threshold` (calibrated on validation, `evaluation.calibrate_threshold`) the answer is "No hint" exactly
    when the critic's log-probability of "No hint" reaches it, and its greedy feedback otherwise. Without one,
    `prefer_no_hint` replaces the greedy feedback by "No hint" whenever the critic gives "No hint" at least the
    probability of its greedy sentence: every error sentence starts alike ("The ..."), so their summed mass can win
    greedy decoding's first step although "No hint" is the most likely whole answer.
    """

    model: TextModel
    task: Task
    prefer_no_hint: bool = True
    threshold: float | None = None

    def feedback(self, examples: Sequence[Example | str], hypotheses: Sequence[str]) -> list[str]:
        texts, greedy_lp = self.model.generate_with_log_probs(self._inputs(examples, hypotheses))
        out = [t[0] for t in texts]
        if out and self.threshold is not None:
            no_hint_lp = self.no_hint_log_probs(examples, hypotheses)
            out = [NO_HINT if n >= self.threshold else f for f, n in zip(out, no_hint_lp)]
        elif out and self.prefer_no_hint:
            no_hint_lp = self.no_hint_log_probs(examples, hypotheses)
            out = [NO_HINT if n >= g else f for f, g, n in zip(out, greedy_lp[:, 0], no_hint_lp)]
        return out

    def unthresholded(self) -> "ModelCritic":
        """This critic's greedy feedback, without the threshold or the "No hint" preference."""
        return dataclasses.replace(self, threshold=None, prefer_no_hint=False)

    def confidence(self, examples: Sequence[Example | str], hypotheses: Sequence[str]) -> np.ndarray:
        """How sure the critic is that each hypothesis is right (higher: surer): its "No hint" log-probability."""
        return self.no_hint_log_probs(examples, hypotheses)

    def explain(self, examples: Sequence[Example | str], hypotheses: Sequence[str], steps: Sequence[int]
                ) -> list[str]:
        """The critic asked about one step of each hypothesis, `#steps[i]`, which the caller already doubts: of the
        task's sentences about that step (`task.step_sentences`), the one it finds most likely, whether or not it
        would speak unprompted. A task without them gets the sentences of its feedback about the step ("No hint"
        when none names it)."""
        asked = [self.task.step_sentences(k) for k in steps]
        if not all(asked):
            return [sentences_about(f, k) or NO_HINT for f, k in zip(self.feedback(examples, hypotheses), steps)]
        inputs = self._inputs(examples, hypotheses)
        log_probs = self.model.score([x for x, o in zip(inputs, asked) for _ in o], [s for o in asked for s in o])
        out, at = [], 0
        for o in asked:
            out.append(o[int(np.argmax(log_probs[at:at + len(o)]))])
            at += len(o)
        return out

    def no_hint_log_probs(self, examples: Sequence[Example | str], hypotheses: Sequence[str]) -> np.ndarray:
        """The critic's log-probability of answering "No hint" to each hypothesis, `[len(hypotheses)]`: a
        confidence that the hypothesis is right (evaluation reports how well it ranks right above wrong)."""
        inputs = self._inputs(examples, hypotheses)
        return self.model.score(inputs, [NO_HINT] * len(inputs))

    def input_lengths(self, examples: Sequence[Example | str], hypotheses: Sequence[str]) -> list[int]:
        """Tokens of each critic input (end token included); those over `model.max_input` lose their end, where
        the hypothesis is."""
        return [len(self.model.tokenizer.encode(t)) for t in self._inputs(examples, hypotheses)]

    def _inputs(self, examples: Sequence[Example | str], hypotheses: Sequence[str]) -> list[str]:
        examples = _as_examples(self.task, examples, hypotheses)
        return [self.task.critic_input(ex, h) for ex, h in zip(examples, hypotheses)]


def _as_examples(task: Task, examples: Sequence[Example | str], hypotheses: Sequence[str]) -> list[Example]:
    """Problems as `Example`s (question strings wrapped), checked against the hypotheses' count."""
    if len(examples) != len(hypotheses):
        raise ValueError(f"{len(examples)} problems but {len(hypotheses)} hypotheses; give one hypothesis each")
    if any(isinstance(ex, str) for ex in examples):
        needed = gold_fields_read(task)
        if needed:
            raise ValueError(f"task {task.name!r}'s critic reads the gold {sorted(needed)}, which a question "
                             "string does not carry; pass Example objects")
    return [Example(f"problem-{i}", as_task_question(task, ex), "", "") if isinstance(ex, str) else ex
            for i, ex in enumerate(examples)]


@dataclasses.dataclass
class SolverCritic:
    """A trained critic that solves the problem itself, then compares.

    Its model is trained as x -> z* (on more problems than the generator sees, where the task can make them); its
    own answer z_c to x is the reference against which the task's structural check (`task.oracle_feedback` with z_c
    as the gold) names the hypothesis' errors. It reads the hypothesis only through that check and through its
    `confidence` (0 when the check finds no error), so its verdict is relative to its own best answer for the same
    problem, not to how hard the problem looks:
      * `samples` = 0: z_c is its greedy answer; confidence = log p(hypothesis | x) - log p(z_c | x);
      * `samples` = K > 0: z_c is the answer most of its greedy answer and K samples (temperature 1) reach, voted
        by `task.answer_key` (ties to the first); confidence = (votes for the hypothesis' answer - votes for z_c's)
        / (K + 1), in [-1, 0].
    It says "No hint" when the check finds nothing, when z_c is itself malformed (nothing to compare against), or
    when the confidence reaches `threshold` (calibrated after training, `evaluation.calibrate_for_refinement`; 0 by
    default: a hypothesis at least as likely as its own answer is not criticised).

        critic = SolverCritic(load_text_model(workdir + "/critic", tokenizer, 56, 24), get_task("mwp"))
        critic.feedback(examples, ["#0: add ( number0, number1 )", ...])   # -> ["The operator in #0 ...", ...]
    """

    model: TextModel
    task: Task
    threshold: float = 0.0
    samples: int = 0
    # question -> (z_c, log p(z_c | x), votes per answer key or None)
    _references: dict = dataclasses.field(default_factory=dict, repr=False)

    def references(self, examples: Sequence[Example]) -> list[tuple[str, float, dict | None]]:
        """The critic's own answer to each problem, its log-probability and (with `samples`) the votes per answer;
        decoded once per question."""
        missing = {ex.x: ex for ex in examples if ex.x not in self._references}
        if missing:
            questions = list(missing)
            texts, log_probs = self.model.generate_with_log_probs(questions)
            if not self.samples:
                self._references.update({x: (t[0], float(lp[0]), None)
                                         for x, t, lp in zip(questions, texts, log_probs)})
            else:
                sampled = self.model.generate(questions, num_samples=self.samples, temperature=1.0,
                                              rng=jax.random.key(0))
                for x, greedy, lp, more in zip(questions, texts, log_probs, sampled):
                    answers = [greedy[0], *more]
                    keys = [self.task.answer_key(missing[x], a) for a in answers]
                    votes: dict = {}
                    for key in keys:
                        if key is not None:
                            votes[key] = votes.get(key, 0) + 1
                    winner = max(votes, key=votes.get) if votes else None  # dicts keep first-seen order: ties
                    z_c = answers[keys.index(winner)] if winner is not None else greedy[0]
                    self._references[x] = (z_c, float(lp[0]), votes)
        return [self._references[ex.x] for ex in examples]

    def judge(self, examples: Sequence[Example | str], hypotheses: Sequence[str]) -> tuple[list, np.ndarray]:
        """(the check's `Feedback` against z_c, or None where z_c is malformed; `confidence`) per hypothesis."""
        examples = _as_examples(self.task, examples, hypotheses)
        refs = self.references(examples)
        checks, to_score = [], []
        for i, (ex, (z_c, _, _)) in enumerate(zip(examples, refs)):
            reference = dataclasses.replace(ex, z=z_c)
            if not self.task.oracle_feedback(reference, z_c).ok:
                checks.append(None)
                continue
            checks.append(self.task.oracle_feedback(reference, hypotheses[i]))
            if not checks[-1].ok:
                to_score.append(i)
        confidence = np.zeros(len(examples), np.float32)
        if to_score and self.samples:
            for i in to_score:
                z_c, _, votes = refs[i]
                mine = votes.get(self.task.answer_key(examples[i], hypotheses[i]), 0)
                confidence[i] = (mine - votes.get(self.task.answer_key(examples[i], z_c), 0)) / (self.samples + 1)
        elif to_score:
            log_probs = self.model.score([examples[i].x for i in to_score], [hypotheses[i] for i in to_score])
            confidence[to_score] = log_probs - np.array([refs[i][1] for i in to_score], np.float32)
        return checks, confidence

    def feedback(self, examples: Sequence[Example | str], hypotheses: Sequence[str]) -> list[str]:
        checks, confidence = self.judge(examples, hypotheses)
        return [NO_HINT if check is None or check.ok or c >= self.threshold else check.text
                for check, c in zip(checks, confidence)]

    def unthresholded(self) -> "SolverCritic":
        """This critic naming every error its check finds, however sure it is of the hypothesis (its own answers,
        already decoded, are shared)."""
        return dataclasses.replace(self, threshold=math.inf, _references=self._references)

    def confidence(self, examples: Sequence[Example | str], hypotheses: Sequence[str]) -> np.ndarray:
        """How sure the critic is that each hypothesis is right (higher: surer), `[len(hypotheses)]`."""
        return self.judge(examples, hypotheses)[1]

    def explain(self, examples: Sequence[Example | str], hypotheses: Sequence[str], steps: Sequence[int]
                ) -> list[str]:
        """The critic asked about one step of each hypothesis, `#steps[i]`, which the caller already doubts: what its
        check against its own answer says about that step, whatever its confidence ("No hint" when the check finds
        nothing there or its own answer is malformed)."""
        checks, _ = self.judge(examples, hypotheses)
        return [(sentences_about(check.text, k) if check is not None else "") or NO_HINT
                for check, k in zip(checks, steps)]


def load_critic(run: RunInfo, task: Task | None = None, batch_size: int = 64, mesh: Mesh | None = None
                ) -> "ModelCritic | SolverCritic":
    """The trained critic of a run (`runs.run_config.load_run(workdir)`), as its `config.critic.mode` says ("feedback":
    `ModelCritic`, the paper's; "solve": `SolverCritic`), with its calibrated "No hint" threshold
    (`critic/calibration.json`) when the run made one. Task, tokenizer and token budgets come from the config."""
    task = task or run.task()
    critic_dir = os.path.join(run.workdir, "critic")
    mode = run.config.critic.mode
    if mode not in CRITIC_MODES:
        raise ValueError(f"{run.workdir}: config critic.mode {mode!r} is not one of {CRITIC_MODES}")
    lengths = run.lengths
    max_input, max_output = ((lengths["input"], lengths["target"]) if mode == "solve"
                             else (lengths["critic_input"], lengths["feedback"]))
    model = text_model.load_text_model(critic_dir, run.tokenizer(), max_input, max_output, max_input, batch_size,
                                       mesh=mesh)
    threshold = read_calibration(critic_dir)
    if mode == "solve":
        samples = int(run.config.critic.samples)
        return SolverCritic(model, task, 0.0 if threshold is None else threshold, samples)
    return ModelCritic(model, task, threshold=threshold)


def read_calibration(critic_dir: str) -> float | None:
    """The "No hint" threshold saved beside a trained critic, None when there is none."""
    path = os.path.join(critic_dir, CALIBRATION_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return float(json.load(f)["threshold"])


@dataclasses.dataclass
class OracleCritic:
    """The gold-aware critic of the task (what REFINER trains with and the "+ oracle" rows use)."""

    task: Task

    def feedback(self, examples, hypotheses):
        return [self.task.oracle_feedback(ex, h).text for ex, h in zip(examples, hypotheses)]

    def explain(self, examples, hypotheses, steps):
        """The oracle's sentences about step `#steps[i]` ("No hint" when that step holds none of its errors)."""
        return [sentences_about(f, k) or NO_HINT for f, k in zip(self.feedback(examples, hypotheses), steps)]


@dataclasses.dataclass
class NoisyCritic:
    """`critic`'s feedback, replaced with probability `epsilon` by random feedback: the oracle's feedback on a
    random perturbation of the same problem (a plausible sentence unrelated to the actual hypothesis)."""

    critic: Critic
    task: Task
    epsilon: float
    seed: int = 0

    def __post_init__(self):
        self._rng = random.Random(self.seed)

    def feedback(self, examples, hypotheses):
        out = self.critic.feedback(examples, hypotheses)
        for i, ex in enumerate(examples):
            if self._rng.random() < self.epsilon:
                out[i] = self.task.perturb(ex, self._rng)[1].text
        return out


@dataclasses.dataclass
class HumanCritic:
    """A person at the terminal types the feedback; an empty line accepts the suggestion when a critic gives one,
    and is asked again when none does."""

    suggest: Critic | None = None
    ask: Callable[[str], str] = input
    show: Callable[[str], None] = print

    def feedback(self, examples, hypotheses):
        suggestions = self.suggest.feedback(examples, hypotheses) if self.suggest else [None] * len(examples)
        out = []
        for ex, h, s in zip(examples, hypotheses, suggestions):
            self.show(f"\nProblem:    {ex.x}\nHypothesis: {h}" + (f"\nSuggested:  {s}" if s is not None else ""))
            typed = self.ask("Feedback (Enter accepts the suggestion): " if s is not None else "Feedback: ").strip()
            while not typed and s is None:
                typed = self.ask(f'Feedback (there is no suggestion: type it, or "{NO_HINT}" to accept the '
                                 "hypothesis): ").strip()
            out.append(typed or s)
        return out


@dataclasses.dataclass
class CallableCritic:
    """Any Python function `(examples, hypotheses) -> feedback strings` as a critic."""

    fn: Callable[[Sequence[Example], Sequence[str]], list[str]]

    def feedback(self, examples, hypotheses):
        return list(self.fn(examples, hypotheses))
