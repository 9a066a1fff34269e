"""Rows of `datasets` (data files or hub datasets, `data_sources`) mapped onto each task's own records, so that the
task's own checks and conversions make the same `Example`s from either:

- GSM8K (`openai/gsm8k`): `question`, `answer`, as in its JSON lines;
- SVAMP / MAWPS / ASDiv-A: the SVAMP repository's masked columns (`Question`, `Numbers`, `Equation` in prefix over
  `numberK`, `Answer`), or SVAMP.json's (`Body`, `Question`, `Equation` in infix over literal numbers, `Answer`), as
  the hub's SVAMP copies hold it: the numbers of the text are masked in order and the equation rewritten over them;
- Moral Stories: REFINER's actor records (`id`, `actor_input`, `actor_output`) or the dataset's own story fields
  (`ID` or `guid`, `norm`, `situation`, `intention`, `moral_action`, `immoral_action`, as `demelin/moral_stories`
  holds them), rendered into the actor layout;
- sNLR: REFINER's `srn_*.json` records (`rules`, `fact`, `consequents`, ...), one per row;
- step labels for process reward models: PRM800K (`question`, `label`), Math-Shepherd (`input` with a `ки` tag
  after each step, `label` with `+` or `-` in its place), ProcessBench (`problem`, `steps`, `label` = the first
  wrong step or -1, `final_answer_correct`) and TRL's stepwise supervision (`prompt`, `completions` = one string
  per step, `labels` = one boolean per step), as `tasks.prm800k.LabelledSolution`s (`step_label_files` writes the
  last two).
"""
from __future__ import annotations

import os
import re

from refiner_jax.tasks import data_sources, prm800k
from refiner_jax.tasks.base import DataError, raise_problems

_TEXT_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w]|\.\d)")
_INFIX_TOKEN = re.compile(r"\s*(\d+(?:\.\d+)?|[-+*/()])")
_SHEPHERD_TAG = "ки"
_MAX_PARENTHESES = 100  # nesting of an infix equation (a bound on recursion, far above any dataset's)


def gsm8k_record(row: dict) -> dict:
    """A GSM8K row as its JSON-lines record."""
    return {"question": row.get("question"), "answer": row.get("answer")}


def moral_record(row: dict, where: str) -> dict:
    """A Moral Stories row as an actor record: kept when it has `actor_input`, else rendered from the story fields
    (`<|SIT|> situation <|INT|> intention <|I_ACT|> immoral action <|NRM|>` -> `norm <|M_ACT|> moral action`)."""
    if "actor_input" in row:
        return {k: row.get(k) for k in ("id", "actor_input", "actor_output")}
    fields = ("norm", "situation", "intention", "moral_action", "immoral_action")
    wrong = [k for k in fields if not isinstance(row.get(k), str) or not row[k].strip()]
    if wrong:
        raise DataError(f"{where}: field '{wrong[0]}' is missing or not a non-empty string; expected REFINER's "
                        "actor fields (id, actor_input, actor_output) or Moral Stories' (ID, " + ", ".join(fields)
                        + ")")
    story = {k: " ".join(row[k].split()) for k in fields}
    uid = row.get("ID", row.get("guid"))
    return {"id": uid if isinstance(uid, str) else where,
            "actor_input": f"<|SIT|> {story['situation']} <|INT|> {story['intention']} <|I_ACT|> "
                           f"{story['immoral_action']} <|NRM|>",
            "actor_output": f"{story['norm']} <|M_ACT|> {story['moral_action']}"}


def _number_text(value) -> str:
    return value if isinstance(value, str) else repr(value)


def mwp_record(row: dict, where: str) -> dict:
    """An MWP row as a record of SVAMP's masked csvs (`Question`, `Numbers`, `Equation`, `Answer`, `Type`), the
    SVAMP.json layout converted (numbers masked in text order, the infix equation written in prefix over them)."""
    if "Numbers" not in row and isinstance(row.get("Body"), str):
        return _masked_svamp(row, where)
    numbers = row.get("Numbers")
    if isinstance(numbers, (list, tuple)):
        numbers = " ".join(_number_text(v) for v in numbers)
    return {"Question": row.get("Question"), "Numbers": numbers, "Equation": row.get("Equation"),
            "Answer": None if row.get("Answer") is None else _number_text(row["Answer"]), "Type": row.get("Type")}


def _masked_svamp(row: dict, where: str) -> dict:
    body, question, equation = row.get("Body"), row.get("Question"), row.get("Equation")
    if not isinstance(question, str) or not isinstance(equation, str):
        raise DataError(f"{where}: expected string fields 'Body', 'Question' and 'Equation' (SVAMP.json layout)")
    text = f"{body.strip()} {question.strip()}".strip()
    numbers: list[float] = []

    def mask(m: re.Match) -> str:
        numbers.append(float(m.group()))
        return f"number{len(numbers) - 1}"

    masked = _TEXT_NUMBER.sub(mask, text)
    prefix = infix_to_prefix(equation, numbers, where)
    answer = row.get("Answer")
    return {"Question": masked, "Numbers": " ".join(repr(v) for v in numbers), "Equation": prefix,
            "Answer": None if answer is None else _number_text(answer), "Type": row.get("Type")}


def infix_to_prefix(equation: str, numbers: list[float], where: str) -> str:
    """An infix equation over literal numbers (`"( 76.0 - 25.0 )"`) in prefix notation, each literal written as
    the first `numberK` of that value (a constant when the text has no such number); `DataError` when malformed."""
    tokens, pos = [], 0
    while pos < len(equation.rstrip()):
        m = _INFIX_TOKEN.match(equation, pos)
        if m is None:
            raise DataError(f"{where}: Equation {equation!r} has an unexpected character at {pos}; expected numbers, "
                            "+ - * / and parentheses")
        tokens.append(m.group(1))
        pos = m.end()
    index = 0

    def operand(depth: int) -> list[str]:
        nonlocal index
        if index >= len(tokens):
            raise DataError(f"{where}: Equation {equation!r} ends early")
        token = tokens[index]
        index += 1
        if token == "(":
            if depth >= _MAX_PARENTHESES:
                raise DataError(f"{where}: Equation nested in more than {_MAX_PARENTHESES} parentheses")
            inner = expression(depth + 1)
            if index >= len(tokens) or tokens[index] != ")":
                raise DataError(f"{where}: Equation {equation!r} has an unclosed parenthesis")
            index += 1
            return inner
        if token in "+-*/)":
            raise DataError(f"{where}: Equation {equation!r} has {token!r} where a number was expected")
        value = float(token)
        return [f"number{numbers.index(value)}" if value in numbers else token]

    def expression(depth: int, level: int = 0) -> list[str]:  # level 0: + and -, level 1: * and /
        nonlocal index
        out = operand(depth) if level else expression(depth, 1)
        while index < len(tokens) and tokens[index] in ("+-" if level == 0 else "*/"):
            op = tokens[index]
            index += 1
            out = [op] + out + (operand(depth) if level else expression(depth, 1))
        return out

    prefix = expression(0)
    if index != len(tokens):
        raise DataError(f"{where}: Equation {equation!r} has trailing tokens {tokens[index:]}")
    return " ".join(prefix)


# ----------------------------------------------------------------------------------------------- step labels


def read_step_labels(source: str, neutral: str = "positive") -> list[prm800k.LabelledSolution]:
    """Labelled solutions of a step-label source, PRM800K, Math-Shepherd, ProcessBench or TRL stepwise rows: a
    `.jsonl` / `.jsonl.gz` file (PRM800K's reader, each line by `step_label_row`), else data files or a hub dataset
    (`data_sources`, every split in order)."""
    if neutral not in prm800k.NEUTRAL_MODES:
        raise ValueError(f"unknown neutral mode {neutral!r}; choose one of {prm800k.NEUTRAL_MODES}")
    if source.endswith((".jsonl", ".jsonl.gz")) and os.path.isfile(source):
        return prm800k.read_prm800k(source, neutral=neutral, row_reader=step_label_row)
    out, problems = [], []
    for where, rows in data_sources.all_rows(source):
        for i, row in enumerate(rows):
            try:
                solution = step_label_row(row, f"{where}: row {i + 1}", f"{where}:{i + 1}", neutral)
            except DataError as e:
                problems.append(str(e))
                continue
            if solution is not None:
                out.append(solution)
    raise_problems(problems, source)
    return out


def step_label_row(row: dict, where: str, uid: str, neutral: str) -> prm800k.LabelledSolution | None:
    """One row's labelled solution, by its layout; None for a row PRM800K's reader skips."""
    if isinstance(row.get("label"), dict):
        return prm800k.solution_from_row(row, where, uid, neutral, skip_quality_control=True)
    if isinstance(row.get("input"), str) and isinstance(row.get("label"), str):
        question, rated = _shepherd_steps(row["input"], row["label"], where)
        return prm800k.labelled_solution(uid, question, rated, "solution", neutral)
    if isinstance(row.get("problem"), str) and isinstance(row.get("steps"), list):
        return _processbench(row, where, uid, neutral)
    if "completions" in row or "labels" in row:
        return _trl_stepwise(row, where, uid, neutral)
    raise DataError(f"{where}: not a step-label row; expected PRM800K ('question', 'label'), Math-Shepherd "
                    "('input', 'label' strings), ProcessBench ('problem', 'steps', 'label') or TRL stepwise "
                    "('prompt', 'completions', 'labels') fields")


def _shepherd_steps(text: str, labels: str, where: str) -> tuple[str, list[tuple[str, int]]]:
    """(question, [(step, rating)]) of a Math-Shepherd row: steps end at each `ки`, whose place in `label` holds
    `+` (right) or `-` (wrong); the question is the text before "Step 1:"."""
    pieces = text.split(_SHEPHERD_TAG)[:-1]
    if not pieces:
        raise DataError(f"{where}: 'input' has no '{_SHEPHERD_TAG}' step tag; expected Math-Shepherd's layout")
    rated, pos = [], 0
    for k, piece in enumerate(pieces):
        mark = labels[pos + len(piece):pos + len(piece) + 1]
        if labels[pos:pos + len(piece)] != piece or mark not in ("+", "-"):
            raise DataError(f"{where}: 'label' does not match 'input' at step {k + 1}; expected the input with '+' "
                            f"or '-' in place of each '{_SHEPHERD_TAG}'")
        rated.append((piece, 1 if mark == "+" else -1))
        pos += len(piece) + 1
    first = rated[0][0]
    split_at = first.find("Step 1:")
    question = first[:split_at].strip() if split_at > 0 else ""
    rated[0] = (first[split_at:] if split_at > 0 else first, rated[0][1])
    rated = [(step.strip(), r) for step, r in rated]
    if any(not step for step, _ in rated):
        raise DataError(f"{where}: an empty step between '{_SHEPHERD_TAG}' tags")
    return question, rated


def _processbench(row: dict, where: str, uid: str, neutral: str) -> prm800k.LabelledSolution | None:
    steps, first_wrong = row["steps"], row.get("label")
    if not all(isinstance(s, str) and s.strip() for s in steps):
        raise DataError(f"{where}: 'steps' must be a list of non-empty strings (ProcessBench)")
    if type(first_wrong) is not int or not -1 <= first_wrong < len(steps):
        raise DataError(f"{where}: 'label' is {first_wrong!r}; expected the index of the first wrong step, below "
                        f"{len(steps)}, or -1 when none is (ProcessBench)")
    answer_correct = row.get("final_answer_correct", True)
    if answer_correct is not None and type(answer_correct) is not bool:
        raise DataError(f"{where}: 'final_answer_correct' is {answer_correct!r}; expected true, false or null "
                        "(ProcessBench)")
    if first_wrong >= 0:
        rated = [(s, 1) for s in steps[:first_wrong]] + [(steps[first_wrong], -1)]
        finish = None
    else:  # null: the answer was not checked, so the outcome is unknown
        rated = [(s, 1) for s in steps]
        finish = None if answer_correct is None else "solution" if answer_correct else "wrong_answer"
    return prm800k.labelled_solution(uid, row["problem"], rated, finish, neutral)


def _trl_stepwise(row: dict, where: str, uid: str, neutral: str) -> prm800k.LabelledSolution | None:
    """A TRL stepwise-supervision row (`prompt`, `completions`: one string per step, `labels`: one boolean per
    step) as ProcessBench's: the steps up to and including the first False; the outcome is False then, else unknown
    (TRL rows say nothing of the final answer). Labels after the first False are not read: labelling stops there."""
    prompt, steps, labels = row.get("prompt"), row.get("completions"), row.get("labels")
    if not isinstance(prompt, str):
        raise DataError(f"{where}: 'prompt' is {_shown(prompt)}; expected the problem as a string (TRL stepwise)")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) and s.strip() for s in steps):
        raise DataError(f"{where}: 'completions' is {_shown(steps)}; expected a non-empty list of non-empty "
                        "strings, one per step (TRL stepwise)")
    if not isinstance(labels, list) or not all(type(v) is bool for v in labels):
        raise DataError(f"{where}: 'labels' is {_shown(labels)}; expected a list of booleans (true/false), one per "
                        "step (TRL stepwise)")
    if len(labels) != len(steps):
        raise DataError(f"{where}: 'labels' has {len(labels)} values for {len(steps)} 'completions'; expected one "
                        "boolean per step (TRL stepwise)")
    end = labels.index(False) + 1 if False in labels else len(steps)
    rated = [(s, 1 if ok else -1) for s, ok in zip(steps[:end], labels[:end])]
    return prm800k.labelled_solution(uid, prompt, rated, None, neutral)


def _shown(value) -> str:
    """A field's value for a message: missing, or its repr cut short (a row may hold long texts)."""
    if value is None:
        return "missing or null"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
