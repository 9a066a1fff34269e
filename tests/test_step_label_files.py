"""Step-label interchange formats: hand-written ProcessBench and TRL stepwise rows read to hand-worked steps and
labels; records written as ProcessBench / TRL JSON lines and as a `datasets.Dataset` match hand-written rows and
read back to the same steps and first errors; every kind of malformed TRL row names its file, line and field."""
import json
import re

import pytest

from refiner_jax.tasks import DataError
from refiner_jax.tasks.dataset_rows import read_step_labels
from refiner_jax.tasks.step_label_files import (StepRecord, read_step_records, trl_stepwise_dataset,
                                                write_processbench, write_trl_stepwise)

# ProcessBench's layout (Qwen/ProcessBench): the second step is the first wrong one.
BENCH_LINE = ('{"id": "gsm8k-7", "generator": "Qwen2-7B-Instruct", "problem": "Tom has 3 apples and buys 2 more. '
              'How many apples does he have?", "steps": ["Tom starts with 3 apples.", "He buys 2 more, so 3 * 2 = 6.",'
              ' "The answer is 6."], "final_answer_correct": false, "label": 1}\n')
# TRL's stepwise-supervision example (its dataset-formats guide).
TRL_LINE = ('{"prompt": "Which number is larger, 9.8 or 9.11?", "completions": ["The fractional part of 9.8 is 0.8, '
            'while the fractional part of 9.11 is 0.11.", "Since 0.11 is greater than 0.8, the number 9.11 is larger '
            'than 9.8."], "labels": [true, false]}\n')
TRL_STEPS = ("The fractional part of 9.8 is 0.8, while the fractional part of 9.11 is 0.11.",
             "Since 0.11 is greater than 0.8, the number 9.11 is larger than 9.8.")

RIGHT = StepRecord("What is 1+1?", ("1+1 = 2.", "The answer is 2."), -1, True, "sum-0")
WRONG = StepRecord("What is 2*3?", ("2*3 = 5.",), 0, False, "prod-0")
UNKNOWN = StepRecord("What is 4-1?", ("4-1 = 3.", "So 3."), -1)


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path_factory, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.getbasetemp() / "hf_datasets")


def _lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_record_labels_and_first_error():
    record = StepRecord("p", ("a", "b", "c", "d"), 1)
    assert record.labels == (True, False, False, False)
    assert StepRecord("p", ("a", "b"), -1).labels == (True, True)
    assert StepRecord.from_labels("p", ["a", "b", "c"], [True, False, False]).first_error == 1
    assert StepRecord.from_labels("p", ["a", "b", "c"], [True, False, True]).first_error == 1  # own correctness
    assert StepRecord.from_labels("p", ["a", "b"], [True, True], uid="u") == StepRecord("p", ("a", "b"), -1, None, "u")
    with pytest.raises(ValueError, match="first_error is 2; expected the index of the first wrong step, below 2"):
        StepRecord("p", ("a", "b"), 2)
    with pytest.raises(ValueError, match="steps is"):
        StepRecord("p", ("a", " "), -1)
    with pytest.raises(ValueError, match="3 labels for 2 steps"):
        StepRecord.from_labels("p", ["a", "b"], [True, True, False])


def test_processbench_line_reads_to_its_steps_up_to_the_first_error(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text(BENCH_LINE, encoding="utf-8")
    solution, = read_step_labels(str(path))
    assert solution.question == "Tom has 3 apples and buys 2 more. How many apples does he have?"
    assert solution.steps == ("Tom starts with 3 apples.", "He buys 2 more, so 3 * 2 = 6.")
    assert (solution.ratings, solution.labels, solution.outcome) == ((1, -1), (True, False), False)
    assert read_step_records(path) == [StepRecord(solution.question, solution.steps, 1, False, "bench:1")]


def test_trl_rows_read_like_processbench(tmp_path):
    later_true = {"prompt": "q", "completions": ["a", "b", "c"], "labels": [True, False, True]}
    all_true = {"prompt": "q", "completions": ["a", "b"], "labels": [True, True]}
    path = tmp_path / "trl.jsonl"
    path.write_text(TRL_LINE + json.dumps(later_true) + "\n" + json.dumps(all_true) + "\n", encoding="utf-8")
    docs, later, right = read_step_labels(str(path))
    assert (docs.question, docs.steps) == ("Which number is larger, 9.8 or 9.11?", TRL_STEPS)
    assert (docs.ratings, docs.labels, docs.outcome) == ((1, -1), (True, False), False)
    assert (later.steps, later.labels, later.outcome) == (("a", "b"), (True, False), False)  # labelling stopped
    assert (right.steps, right.labels, right.outcome) == (("a", "b"), (True, True), None)  # answer not given
    assert [(r.steps, r.first_error, r.final_answer_correct) for r in read_step_records(path)] == [
        (TRL_STEPS, 1, False), (("a", "b"), 1, False), (("a", "b"), -1, None)]


def test_processbench_written_rows_and_round_trip(tmp_path):
    path = tmp_path / "out" / "bench.jsonl"
    write_processbench(path, [RIGHT, WRONG, UNKNOWN])
    assert _lines(path) == [
        {"id": "sum-0", "problem": "What is 1+1?", "steps": ["1+1 = 2.", "The answer is 2."], "label": -1,
         "final_answer_correct": True},
        {"id": "prod-0", "problem": "What is 2*3?", "steps": ["2*3 = 5."], "label": 0, "final_answer_correct": False},
        {"id": "2", "problem": "What is 4-1?", "steps": ["4-1 = 3.", "So 3."], "label": -1,
         "final_answer_correct": None}]
    right, wrong, unknown = read_step_labels(str(path))
    assert (right.labels, right.outcome, wrong.labels, wrong.outcome) == ((True, True), True, (False,), False)
    assert (unknown.labels, unknown.outcome) == ((True, True), None)  # null: the answer was not checked
    back = read_step_records(path)
    assert [(r.problem, r.steps, r.first_error, r.final_answer_correct) for r in back] == [
        (r.problem, r.steps, r.first_error, r.final_answer_correct) for r in (RIGHT, WRONG, UNKNOWN)]


def test_trl_written_rows_and_round_trip(tmp_path):
    path = tmp_path / "trl.jsonl"
    write_trl_stepwise(path, [RIGHT, WRONG, StepRecord("p", ("a", "b", "c"), 1)])
    assert _lines(path) == [
        {"prompt": "What is 1+1?", "completions": ["1+1 = 2.", "The answer is 2."], "labels": [True, True]},
        {"prompt": "What is 2*3?", "completions": ["2*3 = 5."], "labels": [False]},
        {"prompt": "p", "completions": ["a", "b", "c"], "labels": [True, False, False]}]
    back = read_step_records(path)
    assert [(r.problem, r.steps, r.first_error) for r in back] == [
        ("What is 1+1?", ("1+1 = 2.", "The answer is 2."), -1), ("What is 2*3?", ("2*3 = 5.",), 0),
        ("p", ("a", "b"), 1)]  # steps after the first error are not read back


def test_trl_dataset_columns_rows_and_folder_round_trip(tmp_path):
    dataset = trl_stepwise_dataset([RIGHT, WRONG])
    assert dataset.column_names == ["prompt", "completions", "labels"]
    assert dataset.to_list() == [
        {"prompt": "What is 1+1?", "completions": ["1+1 = 2.", "The answer is 2."], "labels": [True, True]},
        {"prompt": "What is 2*3?", "completions": ["2*3 = 5."], "labels": [False]}]
    assert trl_stepwise_dataset([]).features == dataset.features  # typed even when empty
    (tmp_path / "saved").mkdir()
    dataset.to_json(tmp_path / "saved" / "train.jsonl")
    dataset.to_parquet(tmp_path / "saved" / "test.parquet")
    expected = [(("1+1 = 2.", "The answer is 2."), (True, True)), (("2*3 = 5.",), (False,))]
    solutions = read_step_labels(str(tmp_path / "saved"))  # every split: test.parquet, then train.jsonl
    assert [(s.steps, s.labels) for s in solutions] == expected * 2


def test_trl_folder_of_data_files(tmp_path):
    write_trl_stepwise(tmp_path / "data" / "train.jsonl", [StepRecord("p", ("a", "b", "c"), 2)])
    assert [(r.steps, r.first_error) for r in read_step_records(tmp_path / "data")] == [(("a", "b", "c"), 2)]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"prompt": "p", "completions": ["a"], "labels": [true, true]}\n')
    with pytest.raises(DataError, match=re.escape(f"{bad / 'train.jsonl'}: row 1: 'labels' has 2 values for 1")):
        read_step_labels(str(bad))


@pytest.mark.parametrize("row, field, expected", [
    ({"prompt": "p", "completions": ["a", "b"], "labels": [1, 0]}, "labels", "a list of booleans"),
    ({"prompt": "p", "completions": ["a"], "labels": "true"}, "labels", "a list of booleans"),
    ({"prompt": "p", "completions": ["a", "b"], "labels": [True]}, "labels", "has 1 values for 2 'completions'"),
    ({"prompt": "p", "completions": ["a", ""], "labels": [True, True]}, "completions", "non-empty strings"),
    ({"prompt": "p", "completions": ["a", 3], "labels": [True, True]}, "completions", "non-empty strings"),
    ({"prompt": "p", "completions": [], "labels": []}, "completions", "a non-empty list"),
    ({"completions": ["a"], "labels": [True]}, "prompt", "missing or null; expected the problem as a string"),
    ({"prompt": "p", "labels": [True]}, "completions", "missing or null"),
    ({"prompt": "p", "completions": ["a"]}, "labels", "missing or null"),
])
def test_malformed_trl_rows_name_file_line_and_field(tmp_path, row, field, expected):
    path = tmp_path / "trl.jsonl"
    path.write_text(TRL_LINE + json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{re.escape(f'{path}:2')}: '{field}' .*{re.escape(expected)}"):
        read_step_labels(str(path))


def test_processbench_final_answer_correct_must_be_a_boolean_or_null(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text(BENCH_LINE.replace('"final_answer_correct": false', '"final_answer_correct": "no"'))
    with pytest.raises(DataError, match=re.escape(f"{path}:1: 'final_answer_correct' is 'no'; expected true")):
        read_step_records(path)
