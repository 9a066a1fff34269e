"""PRM800K step-label reading: hand-made files with hand-worked steps, labels and outcomes; data errors."""
import gzip
import json

import pytest

from refiner_jax.tasks import DataError
from refiner_jax.tasks.prm800k import NEUTRAL_MODES, LabelledSolution, read_prm800k


def _c(text, rating):
    return {"text": text, "rating": rating, "flagged": False}


def _step(completions, chosen=0, human=None):
    return {"completions": completions, "human_completion": human, "chosen_completion": chosen}


def _line(steps, finish="solution", problem="What is x^2 if x = 2?", qc=False, screening=False):
    row = {"labeler": "l", "timestamp": "t", "is_quality_control_question": qc,
           "is_initial_screening_question": screening,
           "question": {"problem": problem, "ground_truth_answer": "4", "pre_generated_steps": []},
           "label": {"steps": steps, "total_time": 1, "finish_reason": finish}}
    return json.dumps(row)


def _write(tmp_path, lines, name="prm800k.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


# +1, then 0 (chosen), then labelling stops at an error: no chosen completion; the step is the first -1.
FOUND_ERROR = _line([
    _step([_c("Let x = 2.", 1)]),
    _step([_c("Note that 2 is even.", 0), _c("Square it.", 1)]),
    _step([_c("So x^2 = 4.", 0), _c("So x^2 = 5.", -1), _c("Unrated.", None), _c("So x^2 = 8.", -1)], chosen=None),
], finish="found_error")
SOLVED = _line([_step([_c("x = 2.", 1)]), _step([_c("x^2 = 4.", 1)]), _step([_c("# Answer\n\n4", 1)])])


@pytest.mark.parametrize("neutral, steps, ratings, labels", [
    ("positive", ("Let x = 2.", "Note that 2 is even.", "So x^2 = 5."), (1, 0, -1), (True, True, False)),
    ("negative", ("Let x = 2.", "Note that 2 is even."), (1, 0), (True, False)),
    ("skip", ("Let x = 2.", "So x^2 = 5."), (1, -1), (True, False)),
])
def test_found_error_under_each_neutral_mode(tmp_path, neutral, steps, ratings, labels):
    [rec] = read_prm800k(_write(tmp_path, [FOUND_ERROR]), neutral=neutral)
    assert rec == LabelledSolution("prm800k:1", "What is x^2 if x = 2?", steps, ratings, labels, False)
    assert rec.text == "\n".join(steps)


@pytest.mark.parametrize("neutral", NEUTRAL_MODES)
def test_solved_record(tmp_path, neutral):
    [rec] = read_prm800k(_write(tmp_path, [SOLVED]), neutral=neutral)
    assert rec.steps == ("x = 2.", "x^2 = 4.", "# Answer\n\n4") and rec.ratings == (1, 1, 1)
    assert rec.labels == (True, True, True) and rec.outcome is True
    assert rec.text == "x = 2.\nx^2 = 4.\n# Answer\n\n4"


def test_human_completion_and_outcomes(tmp_path):
    human = _line([
        _step([_c("x = 2.", 1)]),
        _step([_c("x^2 = 5.", -1)], chosen=None, human={"text": "x^2 = 4.", "rating": None}),
        _step([_c("Wrong.", -1), _c("# Answer\n\n4", 1)], chosen=1),
    ])
    human_wrong = _line([_step([_c("x = 3.", 1)], chosen=None, human={"text": "x = 5.", "rating": -1}),
                         _step([_c("never read", 2)])], finish="found_error")  # reading stops at the -1
    unfinished = _line([_step([_c("x = 9.", -1)], chosen=None, human="x = 2.")], finish=None)
    gave_up = _line([_step([_c("x = 2.", 1)]), _step([_c("?", None)], chosen=None)], finish="give_up")
    a, b, c, d = read_prm800k(_write(tmp_path, [human, human_wrong, unfinished, gave_up]))
    assert a.steps == ("x = 2.", "x^2 = 4.", "# Answer\n\n4") and a.ratings == (1, 1, 1) and a.outcome is True
    assert (b.steps, b.ratings, b.labels, b.outcome) == (("x = 5.",), (-1,), (False,), False)
    assert (c.steps, c.ratings, c.labels, c.outcome) == (("x = 2.",), (1,), (True,), None)
    assert (d.steps, d.labels, d.outcome) == (("x = 2.",), (True,), False)


def test_skipped_lines_and_uids(tmp_path):
    flagged = _line([_step([_c("Bad question.", None)], chosen=None)], finish="flagged_bad_question")
    all_neutral = _line([_step([_c("Hmm.", 0)])])
    lines = [_line([_step([_c("qc", 1)])], qc=True), "", flagged, SOLVED,
             _line([_step([_c("screen", 1)])], screening=True), all_neutral]
    path = _write(tmp_path, lines, name="phase2_train.jsonl")
    assert [r.uid for r in read_prm800k(path)] == ["phase2_train:4", "phase2_train:6"]
    assert [r.uid for r in read_prm800k(path, neutral="skip")] == ["phase2_train:4"]
    kept = read_prm800k(path, skip_quality_control=False)
    assert [r.uid for r in kept] == ["phase2_train:1", "phase2_train:4", "phase2_train:5", "phase2_train:6"]
    assert read_prm800k(path, skip_quality_control=False, max_records=2) == kept[:2]
    assert read_prm800k(path, max_records=0) == []


def test_gzip(tmp_path):
    path = tmp_path / "phase1_test.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(FOUND_ERROR + "\n" + SOLVED + "\n")
    recs = read_prm800k(path)
    assert [r.uid for r in recs] == ["phase1_test:1", "phase1_test:2"]
    assert recs == read_prm800k(_write(tmp_path, [FOUND_ERROR, SOLVED], name="phase1_test.jsonl"))
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match="broken.jsonl.gz: not a readable"):
        read_prm800k(tmp_path / "broken.jsonl.gz")


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected an object with 'question' and 'label'"),
    (json.dumps({"label": {"steps": []}}), "no 'question' with a string 'problem'"),
    (json.dumps({"question": {"problem": "p"}}), "no 'label' with a list 'steps'"),
    (json.dumps({"question": {"problem": "p"}, "label": {}}), "no 'label' with a list 'steps'"),
    (_line([_step([_c("a", 1)]), _step([_c("b", 1), _c("c", 2)])]),
     r"step 2 completion 1 has rating 2; ratings are -1, 0, 1 or null \(PRM800K\)"),
    (_line([_step([_c("a", True)])]), "step 1 completion 0 has rating True"),
    (_line([_step([_c("a", 1)], human={"text": "h", "rating": "+1"}, chosen=None)]),
     "step 1 human completion has rating '\\+1'"),
    (_line([_step([_c("a", 1), _c("b", 1)], chosen=2)]), "step 1 has chosen_completion 2; expected null or an index"),
    (_line([_step([_c("a", 1)], chosen=-1)]), "step 1 has chosen_completion -1"),
    (_line([_step([_c("a", None)])]), "step 1: the chosen completion 0 has no rating"),
    (_line([_step([{"rating": 1}])]), "step 1 completion 0 has no text"),
    (_line([_step([_c("  ", 1)])]), "step 1 completion 0 has no text"),
    (_line([_step([], chosen=None, human={"rating": None})]), "step 1 human completion has no text"),
    (_line([_step([_c("a", 1)]), "step"]), "step 2 is not an object"),
    (_line([_step("abc")]), "step 1: 'completions' is not a list of objects"),
    (_line([_step({})]), "step 1: 'completions' is not a list of objects"),
])
def test_malformed_line_raises_with_line_number(tmp_path, line, message):
    path = _write(tmp_path, [SOLVED, line])
    with pytest.raises(DataError, match=message) as err:
        read_prm800k(path)
    assert str(err.value).startswith(f"{path}:2: ")


def test_missing_file_and_unknown_mode(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl: file not found; expected PRM800K step labels"):
        read_prm800k(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="unknown neutral mode 'zero'.*positive.*negative.*skip"):
        read_prm800k(_write(tmp_path, [SOLVED]), neutral="zero")
