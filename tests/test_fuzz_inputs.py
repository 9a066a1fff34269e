"""Property-based fuzzing of every data reader, the critic tool's input and the formula / calculator parsers: on any
input a reader returns its records or raises `DataError` (messages naming the file and line), and the parsers
agree with independent references (Python's own arithmetic, a prefix evaluator written here). Each target runs a
few hundred cases by default and 10,000 under `-m slow`."""
import fractions
import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refiner_jax.refiner import critic_tool
from refiner_jax.tasks import DataError, dataset_rows
from refiner_jax.tasks.gsm8k import gsm8k_task
from refiner_jax.tasks.gsm8k.calculator import (CalcError, calculator_completion, evaluate_expression, format_number,
                                                parse_number)
from refiner_jax.tasks.moral_stories import moral_stories_task
from refiner_jax.tasks.moral_stories.moral_stories_task import read_actor_file
from refiner_jax.tasks.mwp import formula, svamp_data
from refiner_jax.tasks.prm800k import read_prm800k
from refiner_jax.tasks.snlr import SNLRTask

QUICK, FULL = 200, 10_000


def fuzz(*strategies, quick=QUICK, full=FULL):
    """(default-suite test, slow test of `full` cases) of one property."""
    def make(body):
        def run(n):
            return settings(max_examples=n, deadline=None, database=None,
                            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                   HealthCheck.function_scoped_fixture])(given(*strategies)(body))
        return run(quick), pytest.mark.slow(run(full))
    return make


# ----------------------------------------------------------------------------------------------- input strategies

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                  max_size=4),
                    max_leaves=12)
ANY_VALUE = JSON | st.sampled_from(["", "#### 5", "1 2", "number0", "ки", "+", "-", "<|M_ACT|>", "\ud800",
                                    "\ud83d\ude00"])


def records(fields: dict):
    """Objects with the reader's fields, each holding a plausible value or anything, some fields missing."""
    return st.fixed_dictionaries({}, optional={k: v | ANY_VALUE for k, v in fields.items()})


def jsonl_bytes(record_strategy):
    """JSON lines mixing near-valid records, arbitrary JSON, blank lines and raw (often non-UTF-8) bytes."""
    line = (record_strategy.map(lambda r: json.dumps(r).encode()) | JSON.map(lambda v: json.dumps(v).encode())
            | st.binary(max_size=20).filter(lambda b: b"\n" not in b) | st.just(b""))
    return st.lists(line, max_size=6).map(lambda lines: b"\n".join(lines))


GSM8K_RECORD = records({"question": st.text(max_size=20),
                        "answer": st.builds(lambda a, n: f"{a}\n#### {n}", st.text(max_size=10), st.integers())})
COMPLETION = st.fixed_dictionaries({}, optional={"text": st.text(max_size=8) | ANY_VALUE,
                                                 "rating": st.sampled_from([-1, 0, 1, None, 2, "1", True, 0.5])})
PRM_STEP = st.fixed_dictionaries({}, optional={
    "completions": st.lists(COMPLETION, max_size=3) | ANY_VALUE,
    "chosen_completion": st.sampled_from([None, 0, 1, 2, -1, "0", True]),
    "human_completion": st.none() | st.text(max_size=6) | COMPLETION | ANY_VALUE})
PRM_RECORD = records({"question": st.fixed_dictionaries({"problem": st.text(max_size=10) | ANY_VALUE}),
                      "label": st.fixed_dictionaries({"steps": st.lists(PRM_STEP, max_size=4) | ANY_VALUE,
                                                      "finish_reason": st.sampled_from(["solution", None, 3])}),
                      "is_quality_control_question": st.booleans()})
CRITIC_RECORD = records({"question": st.text(max_size=10), "hypothesis": st.text(max_size=10),
                         "y": st.text(max_size=5), "id": st.text(max_size=5)})


def _named(message: str, path) -> None:
    """Every line of a reader's error names the file (or counts the lines left out)."""
    assert message.strip()
    for line in message.splitlines():
        assert line.startswith(str(path)) or line.startswith("... and"), line


def _read(reader, path, data: bytes):
    path.write_bytes(data)
    try:
        return reader(path)
    except DataError as e:
        _named(str(e), path)
        return None


# ----------------------------------------------------------------------------------------------- file readers


@fuzz(jsonl_bytes(GSM8K_RECORD))
def _gsm8k_reader(tmp_path, data):
    rows = _read(gsm8k_task.read_jsonl, tmp_path / "test.jsonl", data)
    assert rows is None or all(isinstance(r["question"], str) and "####" in r["answer"] for r in rows)


test_gsm8k_reader, test_gsm8k_reader_full = _gsm8k_reader


@fuzz(jsonl_bytes(PRM_RECORD))
def _prm800k_reader(tmp_path, data):
    for neutral in ("positive", "skip"):
        solutions = _read(lambda p: read_prm800k(p, neutral=neutral), tmp_path / "labels.jsonl", data)
        for s in solutions or ():
            assert len(s.steps) == len(s.labels) == len(s.ratings) > 0
            assert list(s.labels) == sorted(s.labels, reverse=True)  # prefix labels: right, then wrong


test_prm800k_reader, test_prm800k_reader_full = _prm800k_reader


@fuzz(jsonl_bytes(CRITIC_RECORD))
def _critic_tool_input(tmp_path, data):
    """Every non-blank line is either a record or exactly one problem naming its line."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    problems = []
    records_read = critic_tool.read_jsonl(str(path), problems)
    lines = [n for n, line in enumerate(data.split(b"\n"), 1) if line.strip()]
    named = [int(re.match(re.escape(str(path)) + r":(\d+):", p).group(1)) for p in problems]
    assert sorted([r["_line"] for r in records_read] + named) == [
        n for n in lines if not _blank_text(data.split(b"\n")[n - 1], first=n == 1)]
    for r in records_read:  # text that can be written back out as UTF-8
        (r["question"] + r["hypothesis"]).encode("utf-8")  # raises if not


def _blank_text(line: bytes, first: bool) -> bool:
    """Whether a line is blank text (a byte-order mark may open the file)."""
    try:
        return not line.decode("utf-8-sig" if first else "utf-8").strip()
    except UnicodeDecodeError:
        return False


test_critic_tool_input, test_critic_tool_input_full = _critic_tool_input

CSV_FIELD = st.text(alphabet='abc number0123 .-+*/,"\n\r', max_size=12)


@fuzz(st.lists(st.lists(CSV_FIELD, min_size=0, max_size=5), max_size=5), st.binary(max_size=8))
def _svamp_csv_reader(tmp_path, rows, noise):
    header = "Question,Numbers,Equation,Answer,Type\n"
    body = "".join(",".join('"' + f.replace('"', '""') + '"' if i % 2 else f for i, f in enumerate(r)) + "\n"
                   for r in rows)
    examples = _read(lambda p: svamp_data._examples_from_csv(str(p), "mawps"), tmp_path / "train.csv",
                     (header + body).encode() + noise)
    for e in examples or ():
        assert formula.parse_formula(e.z).ok and math.isfinite(e.meta["answer"])


test_svamp_csv_reader, test_svamp_csv_reader_full = _svamp_csv_reader

MORAL_RECORD = records({"id": st.text(max_size=4), "actor_input": st.builds(
    lambda a, b, c: f"<|SIT|> {a} <|INT|> {b} <|I_ACT|> {c} <|NRM|>", *[st.text(max_size=5)] * 3),
    "actor_output": st.builds(lambda a, b: f"{a} <|M_ACT|> {b}", st.text(max_size=5), st.text(max_size=5))})


@fuzz(st.lists(MORAL_RECORD | JSON, max_size=4) | JSON, st.binary(max_size=6))
def _moral_stories_reader(tmp_path, value, noise):
    _read(read_actor_file, tmp_path / "actor_test.json", json.dumps(value).encode() + noise)


test_moral_stories_reader, test_moral_stories_reader_full = _moral_stories_reader

SNLR_RECORD = records({"fact": st.sampled_from(["The poppy is red and strong.", "Fred is big and kind."]),
                       "rules": st.lists(st.sampled_from(["If a poppy is red, then the poppy is strong.",
                                                          "If something is big and kind, then it is blue."]),
                                         max_size=2),
                       "consequents": st.sampled_from(["Nothing", "The poppy is strong", "Fred is blue"])})


@fuzz(st.lists(SNLR_RECORD | JSON, max_size=3) | JSON, st.binary(max_size=6))
def _snlr_reader(tmp_path, value, noise):
    (tmp_path / "srn_test.json").write_bytes(json.dumps(value).encode() + noise)
    try:
        SNLRTask().load("test", str(tmp_path))
    except DataError as e:
        _named(str(e), tmp_path / "srn_test.json")


test_snlr_reader, test_snlr_reader_full = _snlr_reader


_files_made = iter(range(10**9))


@fuzz(jsonl_bytes(GSM8K_RECORD), st.sampled_from(["jsonl", "json"]), quick=20, full=1000)
def _data_files_through_datasets(tmp_path, monkeypatch, data, suffix):
    """The same fuzzed lines as data files read by `datasets.load_dataset` (about 0.1 s a case, so fewer cases):
    examples or a `DataError` naming the file (a line `null` used to kill the process inside pyarrow)."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    path = tmp_path / f"test{next(_files_made)}.{suffix}"
    path.write_bytes(data)
    try:
        examples = gsm8k_task.GSM8KTask().load("test", f"test={path}")
    except DataError as e:
        assert str(path) in str(e)
        return
    assert all(isinstance(e.x, str) and e.y for e in examples)


test_data_files_through_datasets, test_data_files_through_datasets_full = _data_files_through_datasets


# ----------------------------------------------------------------------------------------------- dataset rows


MWP_ROW = records({"Question": st.text(max_size=10), "Numbers": st.lists(st.floats(allow_nan=False), max_size=3),
                   "Equation": st.sampled_from(["- number0 number1", "( 1.0 + 2.0 )", "* number2 3.0"]),
                   "Answer": st.floats(allow_nan=False), "Body": st.text(alphabet="ab 12.", max_size=10)})


@fuzz(st.lists(MWP_ROW, max_size=4))
def _mwp_dataset_rows(rows):
    try:
        records_ = [dataset_rows.mwp_record(r, f"rows: row {i + 1}") for i, r in enumerate(rows)]
        examples = svamp_data.examples_from_records(records_, "rows", "svamp")
    except DataError as e:
        assert all(line.startswith(("rows: row ", "rows: ")) for line in str(e).splitlines())
        return
    assert len(examples) == len(rows)


test_mwp_dataset_rows, test_mwp_dataset_rows_full = _mwp_dataset_rows

MORAL_ROW = (records({"ID": st.text(max_size=4), "norm": st.text(max_size=8), "situation": st.text(max_size=8),
                      "intention": st.text(max_size=8), "moral_action": st.text(max_size=8),
                      "immoral_action": st.text(max_size=8)})
             | records({"id": st.text(max_size=4), "actor_input": st.text(max_size=12),
                        "actor_output": st.text(max_size=12)}))


@fuzz(MORAL_ROW)
def _moral_dataset_rows(row):
    """A Moral Stories row maps to an actor record that the actor check accepts and that makes an example whose
    input holds the story's fields in order, or it is refused naming the row."""
    where = "rows: row 1"
    try:
        record = dataset_rows.moral_record(row, where)
    except DataError as e:
        assert str(e).startswith(where)
        return
    problem = moral_stories_task._record_problem(where, None, record)
    if problem is not None:
        assert problem.startswith(where)
        return
    example = moral_stories_task.MoralStoriesTask._example(record)
    if "actor_input" not in row:
        story = [" ".join(row[k].split()) for k in ("situation", "intention", "immoral_action")]
        assert [example.meta[k] for k in ("situation", "intention", "immoral_action")] == story
        assert example.z == " ".join(row["norm"].split())


test_moral_dataset_rows, test_moral_dataset_rows_full = _moral_dataset_rows

TAGGED = st.lists(st.tuples(st.text(alphabet="ab 1+-", max_size=6), st.sampled_from("+-")), max_size=4)
STEP_ROW = (records({"input": st.text(max_size=8), "label": st.text(max_size=8)})
            | TAGGED.map(lambda steps: {"input": "".join(f"{t} ки" for t, _ in steps),
                                        "label": "".join(f"{t} {m}" for t, m in steps)})
            | records({"problem": st.text(max_size=6), "steps": st.lists(st.text(max_size=5), max_size=3),
                       "label": st.integers(-2, 3), "final_answer_correct": st.booleans()})
            | PRM_RECORD | JSON.filter(lambda v: isinstance(v, dict)))


@fuzz(STEP_ROW)
def _step_label_rows(row):
    try:
        solution = dataset_rows.step_label_row(row, "rows: row 1", "rows:1", "positive")
    except DataError as e:
        assert str(e).startswith("rows: row 1")
        return
    if solution is not None:
        assert len(solution.steps) == len(solution.labels) > 0
        assert list(solution.labels) == sorted(solution.labels, reverse=True)


test_step_label_rows, test_step_label_rows_full = _step_label_rows

INFIX = st.text(alphabet="0123456789.+-*/() ", max_size=24)


@fuzz(INFIX)
def _infix_equations(equation):
    """SVAMP.json's infix equations: rewritten in prefix, they compute what Python computes, or are refused."""
    try:
        prefix = dataset_rows.infix_to_prefix(equation, [], "row")
    except DataError:
        return
    value = formula.execute(formula.compile_prefix(prefix), [])
    try:
        expected = eval(equation, {"__builtins__": {}})  # digits, operators and parentheses only
    except (SyntaxError, ZeroDivisionError, TypeError, OverflowError):
        return
    if isinstance(expected, (int, float)) and math.isfinite(expected) and "**" not in equation \
            and "//" not in equation:
        assert value is not None and math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-9)


test_infix_equations, test_infix_equations_full = _infix_equations


# ----------------------------------------------------------------------------------------------- formula parser

FORMULA_TEXT = st.lists(st.sampled_from(["#0:", "#1:", "#2:", "add", "subtract", "substract", "multiply", "divide",
                                         "power", "(", ")", ",", "number0", "number1", "number12", "#0", "#1", "#5",
                                         "2.5", "-3", "|", "EOS", "<END>", "x", ""]), max_size=14).map(" ".join)


@fuzz(FORMULA_TEXT | st.text(max_size=30))
def _formula_parser(text):
    """Total: never raises; a parsed formula prints to a text that parses back to it; execution is None or
    finite."""
    parsed = formula.parse_formula(text)
    assert parsed.ok == (parsed.error is None)
    if parsed.ok:
        assert formula.parse_formula(formula.format_formula(parsed.formula)).formula == parsed.formula
    value = formula.execute(text, [2.0, 0.0, 7.5])
    assert value is None or math.isfinite(value)


test_formula_parser, test_formula_parser_full = _formula_parser

PREFIX_TOKENS = st.lists(st.sampled_from(["+", "-", "*", "/", "number0", "number1", "number2", "#0", "2", "0",
                                          "3.5", "x"]), max_size=12)


def _prefix_value(tokens, numbers):
    """An independent prefix evaluator: (value, tokens used)."""
    head, rest = tokens[0], tokens[1:]
    if head in "+-*/":
        a, rest = _prefix_value(rest, numbers)
        b, rest = _prefix_value(rest, numbers)
        return (a + b if head == "+" else a - b if head == "-" else a * b if head == "*" else a / b), rest
    return (numbers[int(head[6:])] if head.startswith("number") else float(head)), rest


@fuzz(PREFIX_TOKENS)
def _prefix_compiler(tokens):
    numbers = [4.0, 0.5, 3.0]
    try:
        compiled = formula.compile_prefix(" ".join(tokens))
    except ValueError:
        return
    try:
        expected, rest = _prefix_value(tokens, numbers)
    except ZeroDivisionError:
        assert formula.execute(compiled, numbers) is None
        return
    assert rest == []
    assert formula.execute(compiled, numbers) == (expected if math.isfinite(expected) else None)


test_prefix_compiler, test_prefix_compiler_full = _prefix_compiler


# ----------------------------------------------------------------------------------------------- calculator

CALC_TEXT = st.text(alphabet="0123456789.,+-*/() ", max_size=30) | st.text(max_size=12)


def _python_value(expr: str):
    """Python's exact arithmetic on the same text, number literals as fractions (thousands commas dropped)."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", expr)
    text = re.sub(r"\d+(?:\.\d*)?|\.\d+", lambda m: f"F('{m.group()}')", text)
    return eval(text, {"__builtins__": {}, "F": fractions.Fraction})


@fuzz(CALC_TEXT)
def _calculator(expr):
    """The calculator's value is Python's exact value, and it refuses (CalcError) what Python cannot compute."""
    try:
        value = evaluate_expression(expr)
    except CalcError as e:
        value = e
    if not re.fullmatch(r"[0-9.,+\-*/() ]*", expr) or "**" in expr or "//" in expr:
        return  # outside the calculator's alphabet (refused above, or not Python's syntax)
    try:
        expected = _python_value(expr)
    except (SyntaxError, ZeroDivisionError, TypeError, ValueError, AttributeError, MemoryError, RecursionError):
        assert isinstance(value, CalcError), (expr, value)
        return
    if isinstance(value, CalcError):
        assert "nested too deeply" in str(value) or not isinstance(expected, fractions.Fraction), (expr, value)
    else:
        assert value == expected
        assert calculator_completion(f"a <<{expr}=") == format_number(value) + ">>"


test_calculator, test_calculator_full = _calculator


@fuzz(st.fractions(max_denominator=10**6).filter(lambda v: abs(v) < 10**12), st.text(max_size=12))
def _number_formatting(value, text):
    """A formatted number parses back to itself up to the 6 decimals it keeps; parsing any text never raises."""
    back = parse_number(format_number(value))
    assert back is not None and abs(back - value) <= fractions.Fraction(1, 2 * 10**6)
    assert parse_number(text) is None or isinstance(parse_number(text), fractions.Fraction)


test_number_formatting, test_number_formatting_full = _number_formatting


# ----------------------------------------------------------------------------------------------- found by the fuzz


@pytest.mark.parametrize("depth", [5, 5000])
def test_deeply_nested_equations_are_refused_not_a_crash(depth):
    equation = "+ " * depth + "1 " * (depth + 1)
    if depth < 100:
        assert formula.execute(formula.compile_prefix(equation), []) == depth + 1
    else:
        with pytest.raises(ValueError, match="nested"):
            formula.compile_prefix(equation)
        with pytest.raises(DataError, match="nested"):
            dataset_rows.infix_to_prefix("(" * depth + "1" + ")" * depth, [], "row 1")
