"""The interface every reasoning task implements.

A task turns its raw data into `Example`s (input x, intermediate hypothesis z, answer y), renders the texts the
generator and critic read, critiques a hypothesis against the gold one (the oracle critic), perturbs gold
hypotheses into plausible mistakes for critic training, splits hypotheses into steps for reward models and scores
predictions. Everything here is pure Python/numpy so tasks run on any machine, without JAX.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import re
from typing import Any, Hashable, Iterable, Iterator, Mapping, Protocol, Sequence

NO_HINT = "No hint"

# Default template for the generator's refinement input (x, previous hypothesis z', feedback f).
DEFAULT_REFINE_TEMPLATE = "{x} Previous Answer: {z} Feedback: {f}"


class DataError(ValueError):
    """Bad input data: a missing source, or malformed lines or fields. The message names the file (or dataset), the
    line or row and the field, and what was expected; a file with several bad lines gets one message line each
    (`raise_problems`)."""


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # JSON's spelling of a UTF-16 surrogate, paired or not
_SHOWN_PROBLEMS = 20  # bad lines listed in one error; the rest are counted


def raise_problems(problems: Sequence[str], source: str, error: type[Exception] = DataError) -> None:
    """Raises `error` listing every bad line of `source` (one message line each; a single one is the message
    itself); nothing when `problems` is empty."""
    if len(problems) == 1:
        raise error(problems[0])
    if problems:
        more = len(problems) - _SHOWN_PROBLEMS
        raise error(f"{source}: {len(problems)} bad lines:\n" + "\n".join(problems[:_SHOWN_PROBLEMS])
                    + (f"\n... and {more} more" if more > 0 else ""))


def shared_data_dir(*parts: str) -> str:
    """Absolute path of a dataset folder: under `$REFINER_DATA`, else under the shared datasets beside the checkout
    (`../shared/data`). Absolute, so that a run's saved config works from any directory."""
    root = os.environ.get("REFINER_DATA")
    base = pathlib.Path(root) if root else pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"
    return str(base.joinpath(*parts).absolute())


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem: generator input `x`, gold intermediate steps `z`, gold answer `y`.

    `meta` holds what the task needs to execute or check hypotheses (numbers, rules, ...); it is plain data
    (JSON-serialisable).
    """

    uid: str
    x: str
    z: str
    y: str
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StepError:
    """One structured error: its `kind` (task-specific name, e.g. "operator"), the step index it refers to
    (None when it concerns the whole hypothesis) and an optional `detail` (e.g. the misaligned phrase)."""

    kind: str
    step: int | None = None
    detail: str | None = None


@dataclasses.dataclass(frozen=True)
class Feedback:
    """Structured errors plus the natural-language feedback sentence the critic learns to produce."""

    errors: tuple[StepError, ...]
    text: str

    @property
    def ok(self) -> bool:
        return not self.errors


class Task(Protocol):
    """What training, refinement and reward models need from a task (see `tasks/mwp/` for the reference one).

    Every task subclasses it. `name` and the methods that hold only a docstring are required; the attributes with a
    value and the methods that return something are optional hooks, called directly everywhere: their defaults suit
    a task that reads a dataset and has no sentences of its own about single steps (override what the task has).
    """

    name: str
    error_kinds: tuple[str, ...] = ()  # every `StepError.kind` this task can emit, for per-type metrics
    primary_metric: str = ""  # the `score` key that model selection and the tables lead with ("": the first key)
    lowercase: bool = False  # the task lower-cases its questions: typed ones are too (`as_task_question`)
    special_tokens: tuple[str, ...] = ()  # markers of the task's texts that a trained tokenizer keeps whole

    def load(self, split: str, data_dir: str | None = None, **kwargs) -> list[Example]:
        """Examples of `split` ("train", "val", "test"); `data_dir=None` means the task's default source."""

    def target(self, example: Example) -> str:
        """The generator's training target: the gold hypothesis z, and whatever the generator writes after it
        (Moral Stories: `<|M_ACT|>` and the moral action); `score` and `oracle_feedback` read this format."""

    def critic_input(self, example: Example, hypothesis: str) -> str:
        """The text the critic reads: the problem followed by a hypothesis."""

    def oracle_feedback(self, example: Example, hypothesis: str) -> Feedback:
        """Gold-aware feedback on `hypothesis`; `Feedback.ok` when nothing is wrong. Never raises."""

    def perturb(self, example: Example, rng: random.Random) -> tuple[str, Feedback]:
        """A plausible wrong (or, at the configured rate, unchanged) hypothesis and its oracle feedback."""

    def split_steps(self, hypothesis: str) -> list[str]:
        """The hypothesis cut into reasoning steps (reward models score each one)."""

    def step_labels(self, example: Example, hypothesis: str) -> list[bool]:
        """Per-step correctness of `hypothesis`, aligned with `split_steps` (process reward-model labels)."""

    def outcome_label(self, example: Example, hypothesis: str) -> bool:
        """Whether the hypothesis reaches the right final answer (outcome reward-model label)."""

    def answer_key(self, example: Example, hypothesis: str) -> Hashable | None:
        """The hypothesis' final answer in a form where equal answers compare equal (for voting among samples);
        None when it has none."""

    def score(self, predictions: Sequence[str], examples: Sequence[Example]) -> dict[str, float]:
        """Task metrics of predicted hypotheses against the examples' gold ones (per-example means)."""

    def fresh_problems(self, n: int, data_dir: str | None = None) -> list[Example]:
        """`n` problems of the task's own generator that no split holds, the same ones for the same arguments
        (extra training problems, held-out reward-model problems); [] for a task without a generator or when
        `data_dir` names a dataset."""
        return []

    def step_sentences(self, step: int) -> list[str]:
        """Every sentence the critic can say about step `#step` (a trained critic asked about one step picks the
        likeliest, `critics.ModelCritic.explain`); [] when the task has no such vocabulary, and the critic's own
        feedback about the step is used instead."""
        return []

    def location_feedback(self, step: int) -> str:
        """Feedback that says only where the error is, with no claim about what is wrong (the joint system's
        "locate only" ablation)."""
        return f"Step #{step} is incorrect."


def json_objects(lines: Iterable[str | bytes], source: str, expected: str, error: type[Exception] = DataError,
                 problems: list[str] | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON-lines text (`lines`: an open file, text or binary,
    stdin, a list). A line that is not UTF-8 or not a JSON object raises `error` naming `source`, the line and what
    was `expected`; with `problems` its message is added there instead and the line skipped."""
    for number, line in enumerate(lines, start=1):
        try:
            row = _json_line(line, number, source, expected, error)
        except error as e:
            if problems is None:
                raise
            problems.append(str(e))
            continue
        if row is not None:
            yield number, row


def _json_line(line: str | bytes, number: int, source: str, expected: str, error: type[Exception]) -> dict | None:
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{source}:{number}: not UTF-8 text (byte 0x{line[e.start]:02x} at byte {e.start + 1} of the "
                        f"line); save the file as UTF-8; expected {expected}") from None
    elif number == 1:
        line = line.removeprefix("\ufeff")
    if not line.strip():
        return None
    try:
        row = json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        raise error(f"{source}:{number}: not valid JSON ({e.msg} at column {e.colno}); expected {expected}") from None
    except RecursionError:
        raise error(f"{source}:{number}: JSON nested too deeply; expected {expected}") from None
    if not isinstance(row, dict):
        raise error(f"{source}:{number}: got a JSON {type(row).__name__}; expected {expected}")
    if _SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise error(f"{source}:{number}: an unpaired surrogate escape (\\ud800-\\udfff) is not text; "
                        f"expected {expected}") from None
    return row


def refine_input(x: str, hypothesis: str, feedback: str, template: str = DEFAULT_REFINE_TEMPLATE) -> str:
    """The generator's input for a revision turn: problem, previous hypothesis and its feedback."""
    return template.format(x=x, z=hypothesis, f=feedback)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def feedback_sentences(text: str) -> frozenset[str]:
    """The feedback's sentences, whitespace- and case-normalised, as a set (their order carries no meaning)."""
    parts = (" ".join(p.split()).lower() for p in _SENTENCE_END.split(text.strip()))
    return frozenset(p for p in parts if p)


def is_no_hint(feedback: str) -> bool:
    """Whether feedback says there is nothing to fix: "No hint", in any case and spacing, with or without a final
    period (critics and people write it all these ways)."""
    return " ".join(feedback.split()).rstrip(".!").lower() == NO_HINT.lower()


_WHOLE_SENTENCE = re.compile(r"[^.!?]*[.!?]")


def sentences_about(feedback: str, step: int) -> str:
    """The sentences of `feedback` that name step `#step` ("" when none does)."""
    mark = re.compile(rf"#\s*{step}(?!\d)")
    return " ".join(s.strip() for s in _WHOLE_SENTENCE.findall(feedback) if mark.search(s))


def as_task_question(task: "Task | None", text: str) -> str:
    """A problem from outside the dataset (typed, or another system's) spelled like the task's own questions: lower
    case when the task lower-cases its data (`Task.lowercase`), as the models were trained on."""
    return text.lower() if task is not None and task.lowercase else text


def gold_fields_read(task: "Task") -> set[str]:
    """Which gold fields ("z", "y") `task.critic_input` puts into the critic's input (probed with marker values)."""
    markers = {"z": "\u2063gold-z\u2063", "y": "\u2063gold-y\u2063"}
    text = task.critic_input(Example("probe", "question", markers["z"], markers["y"]), "hypothesis")
    return {field for field, marker in markers.items() if marker in text}


def feedback_matches(predicted: str, gold: str) -> bool:
    """Exact match of two feedback texts, insensitive to sentence order, spacing and case."""
    return feedback_sentences(predicted) == feedback_sentences(gold)
