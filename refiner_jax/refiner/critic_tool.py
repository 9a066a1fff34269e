"""A trained critic as a tool for any generator, and interactive refinement with a person as the critic.

Critic tool: JSONL in, one record per line `{"question": ..., "hypothesis": ..., "id": ... (optional)}` (e.g. an
LLM's answers), JSONL out with "feedback" added; optionally "prompt", a few-shot refinement prompt for an LLM:
demonstrations of (question, wrong hypothesis, critic feedback, corrected hypothesis), then the record's question,
hypothesis and feedback, asking for the revision. A question from another system has no gold answer, so it becomes
an `Example` with empty z and y; tasks whose critic input needs more than the question (Moral Stories reads the
gold moral action) take it from the record's "y" field. A line the tool cannot read (not JSON, a missing field, a
hypothesis the task's `RecordFormat` cannot parse) is not judged: it is written in its place with an "error" field.
The critic answers with the "No hint" threshold calibrated for it (`calibrated_threshold`), or one given explicitly.

Interactive refinement: `interactive_refine` shows the problem and the generator's hypothesis, a person types
feedback (Enter accepts the trained critic's suggestion; "ok" / "No hint" accepts the hypothesis), the generator
revises. `ask`/`show` are plain callables so scripts and tests can drive it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import sys
from typing import Callable, Iterable, Sequence

from refiner_jax import atomic_files
from refiner_jax.refiner import critics, feedback_loop
from refiner_jax.tasks.mwp.formula import parse_formula
from refiner_jax.tasks.base import (DEFAULT_REFINE_TEMPLATE, NO_HINT, DataError, Example, Task, as_task_question,
                                    gold_fields_read, is_no_hint, json_objects, raise_problems)


class CriticInputError(DataError):
    """A malformed input or demonstrations file; the message names the file, the line and what was expected."""


# ----------------------------------------------------------------------------------------------- records

_RECORD_HELP = ('one JSON object per line: {"question": "<problem text>", "hypothesis": "<answer to critique>"} '
                'with optional "id" (and "y" where the task\'s critic reads the gold answer)')


def read_records(lines: Iterable[str | bytes], source: str = "<input>",
                 problems: list[str] | None = None) -> list[dict]:
    """Parses and checks JSONL records (blank lines skipped); raises CriticInputError naming the line, or with
    `problems` adds its message there and skips the line."""
    records = []
    for number, record in json_objects(lines, source, _RECORD_HELP, CriticInputError, problems):
        problem = _record_problem(record, f"{source}:{number}")
        if problem is None:
            records.append({**record, "_line": number})
        elif problems is None:
            raise CriticInputError(problem)
        else:
            problems.append(problem)
    return records


def _record_problem(record: dict, where: str) -> str | None:
    for key in ("question", "hypothesis"):
        if key not in record:
            return f"{where}: missing \"{key}\" (keys: {sorted(record)}); expected {_RECORD_HELP}"
        if not isinstance(record[key], str):
            return (f"{where}: \"{key}\" must be a string, got {type(record[key]).__name__}; "
                    f"expected {_RECORD_HELP}")
    if "y" in record and not isinstance(record["y"], str):
        return f"{where}: \"y\" must be a string, got {type(record['y']).__name__}"
    return None


def read_jsonl(path: str, problems: list[str] | None = None) -> list[dict]:
    """The records of a JSONL file (`read_records`)."""
    if not os.path.isfile(path):
        raise CriticInputError(f"{path}: input file not found; expected {_RECORD_HELP}")
    with open(path, "rb") as f:
        return read_records(f, path, problems)


def records_to_examples(records: Sequence[dict], task: Task, source: str = "<input>") -> list[Example]:
    """Gold-free examples: x = the question, z = "" and y = the record's "y" (or ""). Raises CriticInputError when
    the task's critic input needs a gold field that the records cannot give."""
    needed = gold_fields_read(task)
    if "z" in needed:
        raise CriticInputError(f"task {task.name!r}: its critic input contains the gold hypothesis z, which an "
                               "external record cannot provide; this critic cannot be used as a tool")
    examples = []
    for i, r in enumerate(records):
        missing = _missing_gold(task, r, f"{source}:{r.get('_line', i + 1)}")
        if missing is not None:
            raise CriticInputError(missing)
        examples.append(Example(uid=str(r.get("id", f"line-{r.get('_line', i + 1)}")),
                                x=as_task_question(task, r["question"]), z="",
                                y=r.get("y", "") if "y" in needed else ""))
    return examples


def _missing_gold(task: Task, record: dict, where: str) -> str | None:
    if "y" in gold_fields_read(task) and not record.get("y"):
        return f"{where}: task {task.name!r}'s critic reads the gold answer; add it as \"y\" to every record"
    return None


@dataclasses.dataclass(frozen=True)
class RecordFormat:
    """The tool's input records for one task: an example record (the launcher's --help shows it), and what makes a
    hypothesis unreadable for the task's critic, (question, hypothesis) -> the problem and its fix, or None."""

    example: dict
    hypothesis_problem: Callable[[str, str], str | None] | None = None


_NUMBER = re.compile(r"\bnumber\d+\b")


def _mwp_hypothesis_problem(question: str, hypothesis: str) -> str | None:
    """An MWP hypothesis is an equation over the question's masked numbers (`numberK`)."""
    parsed = parse_formula(hypothesis)
    if parsed.formula is None:
        return (f"not an equation of the mwp task ({parsed.error}); write steps \"#k: op ( a, b )\" joined by "
                "\" | \" (op: add, subtract, multiply, divide; a, b: numberK or #j), e.g. "
                "\"#0: add ( number0, number1 )\"")
    unknown = sorted(set(_NUMBER.findall(hypothesis)) - set(_NUMBER.findall(question)))
    if unknown:
        return (f"uses {', '.join(unknown)}, which the question does not hold; write the question's numbers as "
                "number0, number1, ... (in order) and use those names in the equation")
    return None


RECORD_FORMATS = {
    "mwp": RecordFormat({"question": "Ann has number0 pens and buys number1 more . How many ?",
                         "hypothesis": "#0: add ( number0, number1 )"}, _mwp_hypothesis_problem),
}
GENERIC_RECORD_FORMAT = RecordFormat({"question": "<the problem, written as the task's data writes it>",
                                      "hypothesis": "<the answer to critique>"})


def record_format(task_name: str) -> RecordFormat:
    """The task's input records (MWP's: masked numbers and equations; any other task's: any text)."""
    return RECORD_FORMATS.get(task_name, GENERIC_RECORD_FORMAT)


def calibrated_threshold(workdir: str, threshold: float | None = None) -> float:
    """The "No hint" threshold the tool gives the run's trained critic: `threshold` when given, else the one
    calibrated for it (`critic/calibration.json`). Without either it refuses (FileNotFoundError naming the fix): an
    uncalibrated critic also criticises right hypotheses."""
    critic_dir = os.path.join(workdir, "critic")
    if not os.path.isdir(os.path.join(critic_dir, "export")):
        raise FileNotFoundError(f"{critic_dir}/export does not exist: {workdir} has no trained critic yet; train its "
                                f"critic stage (launch/train.py --workdir={workdir})")
    calibrated = critics.read_calibration(critic_dir) if threshold is None else threshold
    if calibrated is None:
        raise FileNotFoundError(
            f"{os.path.join(critic_dir, critics.CALIBRATION_FILE)} is missing: the critic of {workdir} is not "
            "calibrated yet (its \"No hint\" threshold is set once the run's training stages finish; without it "
            "the critic also criticises right hypotheses); rerun the run's launch/train.py command with "
            f"--workdir={workdir} --stages=eval (it calibrates, then evaluates), or pass --threshold explicitly")
    return float(calibrated)


# ----------------------------------------------------------------------------------------------- prompts


@dataclasses.dataclass(frozen=True)
class Demonstration:
    question: str
    hypothesis: str  # a wrong (or already right) answer
    feedback: str  # what the critic says about it
    revision: str  # the corrected answer


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How a refinement prompt reads: an instruction, then blocks of question / hypothesis / feedback / revision."""

    instruction: str
    hypothesis_label: str
    revision_label: str
    demonstrations: tuple[Demonstration, ...]


MWP_PROMPT = PromptFormat(
    instruction=("Each answer below is an equation: steps \"#k: op ( a, b )\" joined by \" | \", where op is add, "
                 "subtract, multiply or divide, numberK is the K-th number in the question and #j is the result "
                 "of step j. A critic has commented on the equation. Write the equation again with the problems "
                 "the feedback names fixed; when the feedback is \"No hint\", keep it as it is."),
    hypothesis_label="Equation",
    revision_label="Revised equation",
    demonstrations=(
        Demonstration("A baker made number0 cakes . He sold number1 cakes in the morning and number2 cakes in the "
                      "afternoon . How many cakes are left ?",
                      "#0: subtract ( number0, number1 ) | #1: add ( #0, number2 )",
                      "The operator in #1 is incorrect.",
                      "#0: subtract ( number0, number1 ) | #1: subtract ( #0, number2 )"),
        Demonstration("Sam has number0 marbles . He gives number1 marbles to each of his number2 friends . How "
                      "many marbles does Sam have left ?",
                      "#0: multiply ( number1, number2 ) | #1: subtract ( #0, number0 )",
                      "The first number in #1 is incorrect. The second number in #1 is incorrect.",
                      "#0: multiply ( number1, number2 ) | #1: subtract ( number0, #0 )"),
        Demonstration("A farm has number0 cows and number1 sheep . The farmer buys number2 more sheep . How many "
                      "animals are on the farm now ?",
                      "#0: add ( number0, number1 )",
                      "An operator is missing.",
                      "#0: add ( number0, number1 ) | #1: add ( #0, number2 )"),
        Demonstration("Each box holds number0 pencils . How many pencils are there in number1 boxes ?",
                      "#0: multiply ( number0, number1 ) | #1: add ( #0, number1 )",
                      "An operator is extra.",
                      "#0: multiply ( number0, number1 )"),
        Demonstration("A rope is number0 meters long . It is cut into pieces of number1 meters each . How many "
                      "pieces are there ?",
                      "#0: divide ( number0, number1 )",
                      NO_HINT,
                      "#0: divide ( number0, number1 )"),
    ),
)

GENERIC_PROMPT = PromptFormat(
    instruction=("A critic has commented on each answer below. Write the answer again with the problems the "
                 "feedback names fixed; when the feedback is \"No hint\", keep it as it is."),
    hypothesis_label="Answer",
    revision_label="Revised answer",
    demonstrations=(),
)


def prompt_format(task_name: str, demonstrations: Sequence[Demonstration] | None = None) -> PromptFormat:
    """The task's prompt format (MWP has built-in demonstrations); `demonstrations` replaces the built-in ones."""
    base = MWP_PROMPT if task_name == "mwp" else GENERIC_PROMPT
    return base if demonstrations is None else dataclasses.replace(base, demonstrations=tuple(demonstrations))


def read_demonstrations(path: str) -> list[Demonstration]:
    """Demonstrations from JSONL: {"question", "hypothesis", "feedback", "revision"} per line."""
    if not os.path.isfile(path):
        raise CriticInputError(f"{path}: demonstrations file not found; expected one JSON object per line with "
                               "string fields question, hypothesis, feedback and revision")
    out = []
    fields = [fld.name for fld in dataclasses.fields(Demonstration)]
    expected = f"a JSON object with string fields {fields}"
    with open(path, "rb") as f:
        for number, record in json_objects(f, path, expected, CriticInputError):
            if not all(isinstance(record.get(k), str) for k in fields):
                raise CriticInputError(f"{path}:{number}: expected {expected}")
            out.append(Demonstration(**{k: record[k] for k in fields}))
    return out


def _block(fmt: PromptFormat, question: str, hypothesis: str, feedback: str) -> str:
    return (f"Question: {question}\n{fmt.hypothesis_label}: {hypothesis}\nFeedback: {feedback}\n"
            f"{fmt.revision_label}:")


def render_prompt(question: str, hypothesis: str, feedback: str, fmt: PromptFormat = MWP_PROMPT) -> str:
    """A few-shot prompt asking an LLM to revise `hypothesis` given the critic's `feedback`; the LLM's
    continuation is the revision."""
    parts = [fmt.instruction]
    parts += [f"{_block(fmt, d.question, d.hypothesis, d.feedback)} {d.revision}" for d in fmt.demonstrations]
    parts.append(_block(fmt, question, hypothesis, feedback))
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------------------------- the tool


# (questions, hypotheses) -> (the first doubtful step of each, -1 for none; each one's step scores)
Locator = Callable[[list[str], list[str]], tuple[list[int], list[list[float]]]]


def annotate(records: Sequence[dict], critic: critics.Critic, task: Task, fmt: PromptFormat | None = None,
             source: str = "<input>", locate: Locator | None = None) -> list[dict]:
    """The records with the critic's "feedback" (and, with `fmt`, the refinement "prompt"; with `locate`, a step
    verifier's "located_step" and "step_scores", and, from a critic that can be asked about a step, its
    "located_feedback" on that step) added."""
    examples = records_to_examples(records, task, source)
    feedback = critic.feedback(examples, [r["hypothesis"] for r in records]) if records else []
    if len(feedback) != len(records):
        raise ValueError(f"the critic returned {len(feedback)} feedback texts for {len(records)} records; a critic "
                         "must answer every hypothesis it is given, in order")
    located, scores = (locate([r["question"] for r in records], [r["hypothesis"] for r in records])
                       if locate is not None and records else (None, None))
    explained: dict[int, str] = {}
    asked = [] if located is None else [i for i, k in enumerate(located) if k >= 0]
    if asked and isinstance(critic, critics.ExplainingCritic):
        said = critic.explain([examples[i] for i in asked], [records[i]["hypothesis"] for i in asked],
                              [int(located[i]) for i in asked])
        explained = dict(zip(asked, said))
    out = []
    for i, (r, f) in enumerate(zip(records, feedback)):
        record = {k: v for k, v in r.items() if k != "_line"}
        record["feedback"] = f
        if located is not None:
            record["located_step"], record["step_scores"] = int(located[i]), [float(v) for v in scores[i]]
        if i in explained:
            record["located_feedback"] = explained[i]
        if fmt is not None:
            record["prompt"] = render_prompt(r["question"], r["hypothesis"], f, fmt)
        out.append(record)
    return out


def budget_warning(critic: critics.Critic, examples: Sequence[Example], hypotheses: Sequence[str]) -> str | None:
    """A message when inputs of a trained critic exceed its token budget (their ends, the hypotheses, would be
    cut), else None; critics without a budget never warn."""
    if not isinstance(critic, critics.BudgetedCritic) or not examples:
        return None
    lengths = critic.input_lengths(examples, hypotheses)
    budget = critic.model.max_input
    over = sum(n > budget for n in lengths)
    if not over:
        return None
    return (f"warning: {over} of {len(lengths)} critic inputs (question + hypothesis) are longer than the critic's "
            f"{budget}-token budget (up to {max(lengths)}) and would lose the end of their hypothesis; pass "
            f"--max_input={max(lengths)} (the critic was trained on inputs of at most {budget} tokens)")


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What `run_tool` did: records judged (written with "feedback"), and one message per input line it could not
    read (file, line, field; written with "error" instead)."""

    written: int
    problems: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class InputLine:
    """One non-blank line of the tool's input: its number, the object it holds (None: not a JSON object) and why it
    cannot be judged (None: it can)."""

    line: int
    record: dict | None
    error: str | None


def read_input(task: Task, path: str) -> list[InputLine]:
    """Every non-blank line of a JSONL input, in order, each checked against the task's `RecordFormat` (fields,
    gold fields its critic reads, a hypothesis the task can parse). Raises CriticInputError when the file is
    missing or the task's critic cannot read external records at all."""
    if not os.path.isfile(path):
        raise CriticInputError(f"{path}: input file not found; expected {_RECORD_HELP}")
    records_to_examples([], task, path)  # a critic that reads the gold z takes no external record at all
    problems: list[str] = []
    with open(path, "rb") as f:
        lines = {number: InputLine(number, record, record_problem(task, record, f"{path}:{number}"))
                 for number, record in json_objects(f, path, _RECORD_HELP, CriticInputError, problems)}
    for problem in problems:  # `json_objects` names each bad line "<path>:<line>: ..."
        number = int(problem[len(path) + 1:].split(":", 1)[0])
        lines[number] = InputLine(number, None, problem)
    return [lines[number] for number in sorted(lines)]


def readable_input(task: Task, path: str) -> list[InputLine]:
    """`read_input`, raising CriticInputError (every bad line named) when no line can be judged."""
    lines = read_input(task, path)
    if all(entry.error is not None for entry in lines):
        raise_problems([entry.error for entry in lines], path, CriticInputError)
        raise CriticInputError(f"{path}: no records; expected {_RECORD_HELP}")
    return lines


def record_problem(task: Task, record: dict, where: str) -> str | None:
    """Why the tool cannot judge `record` (a missing or non-string field, a gold field the task's critic reads, a
    hypothesis the task cannot parse), naming `where` and the fix; None when it can."""
    problem = _record_problem(record, where)
    if problem is not None:
        return problem
    missing = _missing_gold(task, record, where)
    if missing is not None:
        return missing
    check = record_format(task.name).hypothesis_problem
    wrong = check(record["question"], record["hypothesis"]) if check is not None else None
    return None if wrong is None else f"{where}: \"hypothesis\" {record['hypothesis'][:80]!r}: {wrong}"


def run_tool(critic: critics.Critic, task: Task, input_path: str, output_path: str, render: bool = False,
             demonstrations: Sequence[Demonstration] | None = None, chunk_size: int = 1024,
             warn: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
             locate: Locator | None = None) -> ToolResult:
    """Reads `input_path` and writes one record per non-blank line to `output_path`, in order (chunks of
    `chunk_size` lines, into a temp file that replaces `output_path` only once complete): a readable record with the
    critic's "feedback" added, any other line as {"line": N, "error": why} with the fields it had. One summary of
    the unread lines, and inputs over a trained critic's token budget, go through `warn`. Raises CriticInputError,
    writing nothing, when no line can be read."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    lines = readable_input(task, input_path)
    problems = tuple(entry.error for entry in lines if entry.error is not None)
    good = [{**entry.record, "_line": entry.line} for entry in lines if entry.error is None]
    message = budget_warning(critic, records_to_examples(good, task, input_path), [r["hypothesis"] for r in good])
    if message:
        warn(message)
    fmt = prompt_format(task.name, demonstrations) if render else None
    written = 0
    with atomic_files.atomic_open(output_path) as f:
        for start in range(0, len(lines), chunk_size):
            chunk = lines[start:start + chunk_size]
            readable = [{**entry.record, "_line": entry.line} for entry in chunk if entry.error is None]
            judged = iter(annotate(readable, critic, task, fmt, input_path, locate))
            for entry in chunk:
                if entry.error is None:
                    record = next(judged)
                    written += 1
                else:
                    record = {**(entry.record or {}), "line": entry.line, "error": entry.error}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    if problems:
        warn(f"{len(problems)} of {len(lines)} records of {input_path} could not be read and were not judged; "
             f"{output_path} has them with an \"error\" field instead of \"feedback\" (the first: {problems[0]})")
    return ToolResult(written, problems)


# ----------------------------------------------------------------------------------------------- interactive

def interactive_refine(task: Task, generator, example: Example, suggest: critics.Critic | None = None,
                       turns: int = 3, template: str = DEFAULT_REFINE_TEMPLATE,
                       ask: Callable[[str], str] = input,
                       show: Callable[[str], None] = print) -> feedback_loop.Trajectory:
    """Refines one problem with a person as the critic (`critics.HumanCritic`); stops when the person answers
    "ok" or "No hint" (or accepts a "No hint" suggestion) or after `turns` revisions. Scores each turn when the
    example has a gold hypothesis."""

    def ask_feedback(prompt: str) -> str:
        typed = ask(prompt).strip()
        return NO_HINT if typed.lower() == "ok" or is_no_hint(typed) else typed

    human = critics.HumanCritic(suggest=suggest, ask=ask_feedback, show=show)
    scored = bool(example.z)
    [trajectory] = feedback_loop.refine(generator, human, task if scored else None, [example], turns,
                                        template)
    stopped = len(trajectory.feedback) > len(trajectory.hypotheses) - 1
    show(f"\nFinal hypothesis ({len(trajectory.hypotheses) - 1} revision(s)"
         f"{', accepted' if stopped else ', turn limit reached'}): {trajectory.hypotheses[-1]}")
    if scored:
        metric = task.primary_metric or next(iter(trajectory.scores[0]), None)
        show(f"Gold: {example.z}")
        if metric is not None:
            show(f"{metric} per turn: " + " -> ".join(f"{s.get(metric, float('nan')):.0%}"
                                                      for s in trajectory.scores))
    return trajectory


def choose_example(examples: Sequence[Example], ask: Callable[[str], str], show: Callable[[str], None],
                   rng: random.Random, task: Task | None = None) -> Example | None:
    """Asks for a problem: an index into `examples`, Enter for a random one, any other text is the problem
    itself (no gold; spelled like `task`'s questions, `as_task_question`), "q" quits (None)."""
    typed = ask(f"\nProblem: index 0-{len(examples) - 1}, Enter for a random one, or type a problem "
                "(q quits): " if examples else "\nType a problem (q quits): ").strip()
    if typed.lower() in ("q", "quit", "exit"):
        return None
    if examples and (not typed or typed.isdigit()):
        index = rng.randrange(len(examples)) if not typed else int(typed)
        if index >= len(examples):
            show(f"no problem {index}: there are {len(examples)}")
            return choose_example(examples, ask, show, rng, task)
        return examples[index]
    if not typed:
        return choose_example(examples, ask, show, rng, task)
    return Example(uid="typed", x=as_task_question(task, typed), z="", y="")


def interactive_loop(task: Task, generator, examples: Sequence[Example], suggest: critics.Critic | None = None,
                     turns: int = 3, template: str = DEFAULT_REFINE_TEMPLATE, ask: Callable[[str], str] = input,
                     show: Callable[[str], None] = print, seed: int = 0) -> list[feedback_loop.Trajectory]:
    """Problem after problem until the person quits; returns the trajectories."""
    rng = random.Random(seed)
    out = []
    try:
        while (example := choose_example(examples, ask, show, rng, task)) is not None:
            out.append(interactive_refine(task, generator, example, suggest, turns, template, ask, show))
    except EOFError:  # Ctrl-D ends the session like "q"
        show("")
    return out
