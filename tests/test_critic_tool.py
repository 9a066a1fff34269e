"""The critic as a tool (JSONL in/out, LLM refinement prompts) and interactive refinement with scripted answers."""
import json
import re

import numpy as np
import pytest

from refiner_jax import text_model
from refiner_jax.refiner import critic_tool, critics
from refiner_jax.runs import refiner_eval, run_info
from refiner_jax.tasks import get_task
from refiner_jax.tasks.base import NO_HINT, Example, Task, feedback_matches


@pytest.fixture(scope="module")
def mwp():
    return get_task("mwp")


class RecordingCritic:
    """Says "No hint" for a one-step formula, "An operator is extra." otherwise; records what it was given."""

    def __init__(self, task):
        self.task = task
        self.inputs = []
        self.examples = []

    def feedback(self, examples, hypotheses):
        self.examples += list(examples)
        self.inputs += [self.task.critic_input(ex, h) for ex, h in zip(examples, hypotheses)]
        return [NO_HINT if "|" not in h else "An operator is extra." for h in hypotheses]


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_round_trip(tmp_path, mwp):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [json.dumps({"id": "a", "question": "Tom has number0 apples .", "hypothesis": "number0"}),
                 "",
                 json.dumps({"question": "Q2 number0 number1", "hypothesis": "#0: add ( number0, number1 ) | "
                                                                            "#1: add ( #0, number1 )",
                             "model": "some-llm"})])
    critic = RecordingCritic(mwp)
    assert critic_tool.run_tool(critic, mwp, str(src), str(dst)) == critic_tool.ToolResult(2, ())
    out = [json.loads(line) for line in dst.read_text().splitlines()]
    assert out == [
        {"id": "a", "question": "Tom has number0 apples .", "hypothesis": "number0", "feedback": NO_HINT},
        {"question": "Q2 number0 number1", "hypothesis": "#0: add ( number0, number1 ) | #1: add ( #0, number1 )",
         "model": "some-llm", "feedback": "An operator is extra."}]
    # Gold-free examples: x is the question, no gold; a record without an id is named by its line (3).
    assert [(e.uid, e.x, e.z, e.y) for e in critic.examples] == [
        ("a", "Tom has number0 apples .", "", ""), ("line-3", "Q2 number0 number1", "", "")]
    assert critic.inputs[0] == "Tom has number0 apples . number0"


def test_a_step_verifier_adds_the_located_step(tmp_path, mwp):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    hyp = "#0: add ( number0, number1 ) | #1: add ( #0, number1 )"
    _write(src, [json.dumps({"question": "Q2 number0 number1", "hypothesis": hyp})])
    seen = []

    def locate(questions, hypotheses):  # a stub verifier: the second step is the first below its threshold
        seen.append((questions, hypotheses))
        return [1], [[0.9, 0.2]]

    critic_tool.run_tool(RecordingCritic(mwp), mwp, str(src), str(dst), locate=locate)
    out = json.loads(dst.read_text())
    assert out["located_step"] == 1 and out["step_scores"] == [0.9, 0.2] and out["feedback"] == "An operator is extra."
    assert seen == [(["Q2 number0 number1"], [hyp])]
    assert "located_feedback" not in out  # this critic cannot be asked about a step


def test_a_critic_that_can_be_asked_explains_the_located_step(tmp_path, mwp):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    hyp = "#0: add ( number0, number1 ) | #1: add ( #0, number1 )"
    _write(src, [json.dumps({"question": "Q1 number0 number1", "hypothesis": hyp}),
                 json.dumps({"question": "Q2 number0 number1", "hypothesis": hyp})])

    class Asked(RecordingCritic):
        def explain(self, examples, hypotheses, steps):
            self.asked = ([e.x for e in examples], list(steps))
            return [f"The operator in #{k} is incorrect." for k in steps]

    critic = Asked(mwp)
    # The verifier finds nothing doubtful in the first record (-1) and doubts step 0 of the second.
    critic_tool.run_tool(critic, mwp, str(src), str(dst), locate=lambda qs, hs: ([-1, 0], [[0.9, 0.8], [0.1, 0.8]]))
    first, second = (json.loads(line) for line in dst.read_text().splitlines())
    assert critic.asked == (["Q2 number0 number1"], [0])
    assert "located_feedback" not in first and second["located_feedback"] == "The operator in #0 is incorrect."


GOOD = '{"question": "q number0", "hypothesis": "number0"}'  # a readable MWP record


@pytest.mark.parametrize("line, expected", [
    ('{"question": "q", "hypothesis": "h"', r":2: not valid JSON"),
    ('["question", "hypothesis"]', r":2: got a JSON list"),
    ('{"question": "q"}', r":2: missing \"hypothesis\""),
    ('{"question": 3, "hypothesis": "h"}', r":2: \"question\" must be a string, got int"),
])
def test_malformed_lines_name_line_and_format(tmp_path, mwp, line, expected):
    """A bad line is reported, naming the file, its line and the format, and not judged: the output keeps it in its
    place with an "error" field instead of "feedback"; one summary line counts it."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [GOOD, line])
    warned = []
    result = critic_tool.run_tool(RecordingCritic(mwp), mwp, str(src), str(dst), warn=warned.append)
    [problem] = result.problems
    assert re.search(expected, problem) and str(src) in problem
    assert "question" in problem and "hypothesis" in problem
    assert result.written == 1
    [summary] = warned
    assert summary.startswith(f"1 of 2 records of {src} could not be read") and problem in summary
    good, bad = (json.loads(x) for x in dst.read_text().splitlines())
    assert good == {**json.loads(GOOD), "feedback": NO_HINT}
    assert bad["line"] == 2 and bad["error"] == problem and "feedback" not in bad
    _write(src, [line])  # nothing usable: an error, and nothing written
    with pytest.raises(critic_tool.CriticInputError, match=expected.replace(":2:", ":1:")):
        critic_tool.run_tool(RecordingCritic(mwp), mwp, str(src), str(tmp_path / "none.jsonl"))
    assert not (tmp_path / "none.jsonl").exists()


def test_hypotheses_the_task_cannot_parse_are_not_judged(tmp_path, mwp):
    """Plain text is no MWP equation, and an equation over numbers the question does not hold (raw digits in the
    question) cannot be read against it: both get an "error" naming the format, and the critic never sees them."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [json.dumps({"id": "plain", "question": "Tom has number0 apples and buys number1 .",
                             "hypothesis": "5 + 3 = 8"}),
                 json.dumps({"id": "digits", "question": "Tom has 5 apples and buys 3 .",
                             "hypothesis": "#0: add ( number0, number1 )"}),
                 json.dumps({"id": "ok", "question": "Tom has number0 apples and buys number1 .",
                             "hypothesis": "#0: add ( number0, number1 )"})])
    critic, warned = RecordingCritic(mwp), []
    result = critic_tool.run_tool(critic, mwp, str(src), str(dst), warn=warned.append)
    assert [e.uid for e in critic.examples] == ["ok"] and result.written == 1
    plain, digits, ok = (json.loads(line) for line in dst.read_text().splitlines())
    assert "not an equation of the mwp task" in plain["error"] and '"#0: add ( number0, number1 )"' in plain["error"]
    assert "number0, number1, which the question does not hold" in digits["error"]
    assert (plain["line"], digits["line"]) == (1, 2) and "feedback" not in plain and ok["feedback"] == NO_HINT
    assert len(warned) == 1 and warned[0].startswith("2 of 3 records")


def test_the_documented_example_record_is_readable(mwp):
    example = critic_tool.record_format("mwp").example
    assert critic_tool.record_problem(mwp, example, "help:1") is None
    assert critic_tool.record_problem(mwp, {**example, "hypothesis": "he has 8 apples"}, "help:1") is not None


def test_a_critic_without_its_calibration_is_refused(tmp_path):
    """An uncalibrated critic criticises right hypotheses: the tool needs the run's calibration or a --threshold."""
    with pytest.raises(FileNotFoundError, match="no trained critic yet"):
        critic_tool.calibrated_threshold(str(tmp_path))
    (tmp_path / "critic" / "export").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"calibration.json is missing: .*--stages=eval.*--threshold"):
        critic_tool.calibrated_threshold(str(tmp_path))
    assert critic_tool.calibrated_threshold(str(tmp_path), -0.5) == -0.5
    (tmp_path / "critic" / critics.CALIBRATION_FILE).write_text(json.dumps({"threshold": -1.25}))
    assert critic_tool.calibrated_threshold(str(tmp_path)) == -1.25
    assert critic_tool.calibrated_threshold(str(tmp_path), 0.0) == 0.0  # an explicit one wins


def test_bad_bytes_and_empty_files(tmp_path, mwp):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b'{"question": "caf\xe9", "hypothesis": "h"}\n'
                    b'{"question": "ok \\ud83d\\ude00 number0", "hypothesis": "number0"}\n'
                    b'{"question": "q"}\n{"question": "\\ud800", "hypothesis": "h"}\n')
    result = critic_tool.run_tool(RecordingCritic(mwp), mwp, str(src), str(dst), warn=lambda m: None)
    assert result.written == 1 and [p.split(": ")[0] for p in result.problems] == [f"{src}:1", f"{src}:3",
                                                                                  f"{src}:4"]
    assert "not UTF-8 text (byte 0xe9" in result.problems[0] and '"hypothesis"' in result.problems[1]
    assert "unpaired surrogate" in result.problems[2]
    out = [json.loads(line) for line in dst.read_text(encoding="utf-8").splitlines()]
    assert [r.get("line") for r in out] == [1, None, 3, 4]
    assert out[1]["question"] == "ok \U0001F600 number0"  # a paired one is text
    src.write_text("\n\n")
    with pytest.raises(critic_tool.CriticInputError, match="in.jsonl: no records"):
        critic_tool.run_tool(RecordingCritic(mwp), mwp, str(src), str(dst))


def test_gold_fields_of_the_critic_inputs():
    assert critic_tool.gold_fields_read(get_task("mwp")) == set()
    assert critic_tool.gold_fields_read(get_task("snlr")) == set()
    moral = get_task("moral_stories")  # its critic reads the gold moral action y
    assert critic_tool.gold_fields_read(moral) == {"y"}
    with pytest.raises(critic_tool.CriticInputError, match=r":1: .*add it as \"y\""):
        critic_tool.records_to_examples([{"question": "q", "hypothesis": "h", "_line": 1}], moral)
    [ex] = critic_tool.records_to_examples([{"question": "q", "hypothesis": "h", "y": "act", "_line": 1}], moral)
    assert (ex.x, ex.z, ex.y) == ("q", "", "act")


def test_builtin_demonstrations_agree_with_the_oracle(mwp):
    demos = critic_tool.MWP_PROMPT.demonstrations
    assert len(demos) >= 3 and any(d.feedback == NO_HINT for d in demos)
    for d in demos:
        gold = Example("demo", d.question, d.revision, "")
        assert feedback_matches(mwp.oracle_feedback(gold, d.hypothesis).text, d.feedback), d
        assert mwp.oracle_feedback(gold, d.revision).ok
        assert set(re.findall(r"number\d", d.hypothesis + d.revision)) <= set(re.findall(r"number\d", d.question))


def test_rendered_prompt_layout(tmp_path, mwp):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [json.dumps({"question": "Ann has number0 pens .", "hypothesis": "#0: add ( number0, number0 ) | "
                                                                                 "#1: add ( #0, number0 )"})])
    critic_tool.run_tool(RecordingCritic(mwp), mwp, str(src), str(dst), render=True)
    [record] = [json.loads(line) for line in dst.read_text().splitlines()]
    prompt = record["prompt"]
    blocks = prompt.split("\n\n")
    assert blocks[0] == critic_tool.MWP_PROMPT.instruction
    assert len(blocks) == 2 + len(critic_tool.MWP_PROMPT.demonstrations)
    first = critic_tool.MWP_PROMPT.demonstrations[0]
    assert blocks[1] == (f"Question: {first.question}\nEquation: {first.hypothesis}\nFeedback: {first.feedback}\n"
                         f"Revised equation: {first.revision}")
    assert blocks[-1] == ("Question: Ann has number0 pens .\n"
                          "Equation: #0: add ( number0, number0 ) | #1: add ( #0, number0 )\n"
                          "Feedback: An operator is extra.\nRevised equation:")


def test_custom_demonstrations(tmp_path):
    demos = tmp_path / "demos.jsonl"
    _write(demos, [json.dumps({"question": "Q", "hypothesis": "H", "feedback": "F", "revision": "R"})])
    fmt = critic_tool.prompt_format("snlr", critic_tool.read_demonstrations(str(demos)))
    assert critic_tool.render_prompt("q", "h", "f", fmt).endswith(
        "Question: Q\nAnswer: H\nFeedback: F\nRevised answer: R\n\nQuestion: q\nAnswer: h\nFeedback: f\n"
        "Revised answer:")
    _write(demos, [json.dumps({"question": "Q", "hypothesis": "H"})])
    with pytest.raises(critic_tool.CriticInputError, match=":1: expected a JSON object with string fields"):
        critic_tool.read_demonstrations(str(demos))
    with pytest.raises(critic_tool.CriticInputError, match="missing.jsonl: demonstrations file not found"):
        critic_tool.read_demonstrations(str(tmp_path / "missing.jsonl"))


def test_a_critic_that_skips_records_is_an_error(tmp_path, mwp):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [json.dumps({"question": f"q{i} number0", "hypothesis": "number0"}) for i in range(3)])
    one = critics.CallableCritic(lambda examples, hypotheses: [NO_HINT])
    with pytest.raises(ValueError, match="returned 1 feedback texts for 3 records"):
        critic_tool.run_tool(one, mwp, str(src), str(dst))
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        critic_tool.run_tool(RecordingCritic(mwp), mwp, str(src), str(dst), chunk_size=0)


def test_inputs_over_the_critic_budget_are_reported(tmp_path, mwp):
    """A ModelCritic cuts inputs at its token budget, and the hypothesis comes last: the tool says how many records
    would lose theirs and how long the longest is (one byte per token here, plus the end token)."""
    from refiner_jax.tokenizers import ByteTokenizer

    model = type("Model", (), {"tokenizer": ByteTokenizer(), "max_input": 20})()
    critic = critics.ModelCritic(model, mwp)
    examples = [Example("a", "q", "", ""), Example("b", "a longer question", "", "")]
    hypotheses = ["#0: x", "#0: add ( number0, number1 )"]  # inputs of 1 + 1 + 5 + 1 and 17 + 1 + 28 + 1 tokens
    assert critic.input_lengths(examples, hypotheses) == [8, 47]
    assert critic_tool.budget_warning(critic, examples, hypotheses) == (
        "warning: 1 of 2 critic inputs (question + hypothesis) are longer than the critic's 20-token budget (up "
        "to 47) and would lose the end of their hypothesis; pass --max_input=47 (the critic was trained on inputs "
        "of at most 20 tokens)")
    model.max_input = 47
    assert critic_tool.budget_warning(critic, examples, hypotheses) is None
    assert critic_tool.budget_warning(RecordingCritic(mwp), examples, hypotheses) is None  # no budget to exceed


def test_questions_from_outside_follow_the_task_casing(tmp_path, mwp):
    """With MWP's `lowercase` option (the :svamp config) the models saw lower-case questions only, so records and
    typed problems are lower-cased too; without it they pass unchanged."""
    records = [{"question": "Tom has number0 Apples .", "hypothesis": "h", "_line": 1}]
    lowered = get_task("mwp", lowercase=True)
    assert critic_tool.records_to_examples(records, lowered)[0].x == "tom has number0 apples ."
    assert critic_tool.records_to_examples(records, mwp)[0].x == "Tom has number0 Apples ."
    seen = []
    generator = type("G", (), {"greedy": lambda self, texts: seen.extend(texts) or ["h"] * len(texts)})()
    critic_tool.interactive_loop(lowered, generator, [], None, turns=1,
                                 ask=_scripted(["Ann Has 3 Pens", "ok", "q"]), show=lambda m: None)
    assert seen == ["ann has 3 pens"]


# ----------------------------------------------------------------------------------------------- interactive


class FixingGenerator:
    """Turn 0: the scripted answer for the problem. Revisions: "Use X." -> X, anything else -> previous + "?"."""

    def __init__(self, first):
        self.first = first

    def greedy(self, texts):
        out = []
        for text in texts:
            m = re.match(r"^(.*) Previous Answer: (.*) Feedback: (.*)$", text)
            if m is None:
                out.append(self.first[text])
            elif m.group(3).startswith("Use "):
                out.append(m.group(3)[4:].rstrip("."))
            else:
                out.append(m.group(2) + "?")
        return out


class ScoreTask(Task):
    name = "toy"
    primary_metric = "em"

    def critic_input(self, example, hypothesis):
        return f"{example.x} {hypothesis}"

    def score(self, predictions, examples):
        return {"em": sum(p == e.z for p, e in zip(predictions, examples)) / len(examples)}


def _scripted(answers):
    answers = iter(answers)
    return lambda prompt: next(answers)


def test_interactive_session_scripted():
    examples = [Example("0", "q0", "g0", ""), Example("1", "q1", "g1", "")]
    generator = FixingGenerator({"q0": "g0", "q1": "bad1", "Ann has 3 pens": "3"})
    suggest = critics.CallableCritic(lambda exs, hyps: [NO_HINT if h == e.z else f"Use {e.z}." for e, h in
                                                       zip(exs, hyps)])
    shown = []
    # Problem 1: Enter takes the suggestion "Use g1." -> g1; "ok" accepts. Then a typed problem without gold:
    # "hmm" -> "3?", typed "Use 4." -> "4"; the turn limit (2) ends it. Then quit.
    answers = ["1", "", "ok", "Ann has 3 pens", "hmm", "Use 4.", "q"]
    trajectories = critic_tool.interactive_loop(ScoreTask(), generator, examples, suggest, turns=2,
                                                ask=_scripted(answers), show=shown.append)
    first, typed = trajectories
    assert first.hypotheses == ["bad1", "g1"] and first.feedback == ["Use g1.", NO_HINT]
    assert [s["em"] for s in first.scores] == [0.0, 1.0]
    assert typed.hypotheses == ["3", "3?", "4"] and typed.feedback == ["hmm", "Use 4."]
    assert typed.scores == [{}, {}, {}]  # a typed problem has no gold
    text = "\n".join(shown)
    assert "Hypothesis: bad1\nSuggested:  Use g1." in text
    assert "Final hypothesis (1 revision(s), accepted): g1" in text and "em per turn: 0% -> 100%" in text
    assert "Final hypothesis (2 revision(s), turn limit reached): 4" in text


def test_interactive_no_hint_typed_and_bad_index():
    examples = [Example("0", "q0", "g0", "")]
    shown = []
    answers = ["7", "0", "no HINT", "q"]  # index out of range -> asked again; "no hint" (any case) accepts
    [traj] = critic_tool.interactive_loop(ScoreTask(), FixingGenerator({"q0": "x"}), examples, None, turns=3,
                                          ask=_scripted(answers), show=shown.append)
    assert traj.hypotheses == ["x"] and traj.feedback == [NO_HINT]
    assert "no problem 7: there are 1" in shown
    assert "Suggested" not in "\n".join(shown)  # no critic, no suggestion


def test_without_a_critic_enter_asks_again_and_ctrl_d_quits():
    examples = [Example("0", "q0", "g0", "")]
    prompts = []

    def ask(prompt, answers=iter(["0", "", "", "Use g0."])):
        prompts.append(prompt)
        try:
            return next(answers)
        except StopIteration:
            raise EOFError from None

    [traj] = critic_tool.interactive_loop(ScoreTask(), FixingGenerator({"q0": "x"}), examples, None, turns=1,
                                          ask=ask, show=lambda m: None)
    assert traj.hypotheses == ["x", "g0"] and traj.feedback == ["Use g0."]  # the empty lines were asked again
    assert prompts[1] == "Feedback: " and prompts[2].startswith("Feedback (there is no suggestion")


def test_interactive_session_loads_a_run_directory(tmp_path, monkeypatch):
    """A run directory as launch/train.py writes it (the base config's token budgets): the REFINER generator and
    the critic are loaded for one prompt at a time at the full budgets, and the session runs on the test split."""
    from refiner_jax.runs import run_config as config_lib

    config = config_lib.base_config()
    config.task.options = {"synthetic_sizes": {"train": 8, "val": 4, "test": 4}}
    (tmp_path / "config.json").write_text(config.to_json())
    for stage in ("warmup", "refiner", "critic"):
        (tmp_path / stage / "export").mkdir(parents=True)
    monkeypatch.setattr(run_info.RunInfo, "tokenizer", lambda self: None)
    test = get_task("mwp", **config.task.options).load("test")
    loaded = []

    def fake_load(stage_dir, tokenizer, max_input, max_output, bucket=16, batch_size=64, mesh=None):
        loaded.append((stage_dir.rsplit("/", 1)[-1], max_input, max_output, bucket, batch_size))
        if stage_dir.endswith("critic"):
            return type("Critic", (), {
                "generate_with_log_probs": lambda self, texts: ([[NO_HINT]] * len(texts), np.zeros((len(texts), 1))),
                "score": lambda self, texts, targets: [0.0] * len(texts)})()
        return FixingGenerator({ex.x: ex.z for ex in test})

    monkeypatch.setattr(text_model, "load_text_model", fake_load)
    shown = []
    [traj] = refiner_eval.interactive_session(str(tmp_path), turns=2, ask=_scripted(["2", "", "q"]),
                                              show=shown.append)
    lengths = config.lengths
    assert loaded == [("refiner", lengths.refine_input, lengths.target, lengths.refine_input, 1),
                      ("critic", lengths.critic_input, lengths.feedback, lengths.critic_input, 1)]
    assert traj.hypotheses == [test[2].z] and traj.feedback == [NO_HINT]  # Enter took the critic's suggestion
    assert "Suggested:  No hint" in "\n".join(shown)
    loaded.clear()
    refiner_eval.interactive_session(str(tmp_path), use_critic=False, ask=_scripted(["q"]), show=shown.append)
    assert [name for name, *_ in loaded] == ["refiner"]


def test_run_tool_skips_records_without_the_gold_field_and_writes_atomically(tmp_path):
    moral = get_task("moral_stories")
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [json.dumps({"question": "s", "hypothesis": "h", "y": "a"}),
                 json.dumps({"question": "s", "hypothesis": "h"})])
    dst.write_text("earlier results\n")
    result = critic_tool.run_tool(RecordingCritic(moral), moral, str(src), str(dst), warn=lambda m: None)
    assert result.written == 1 and ":2: task 'moral_stories'" in result.problems[0]
    judged, unread = (json.loads(x) for x in dst.read_text().splitlines())
    assert judged["y"] == "a" and "feedback" in judged
    assert unread == {"question": "s", "hypothesis": "h", "line": 2, "error": result.problems[0]}
    failing = critics.CallableCritic(lambda examples, hypotheses: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        critic_tool.run_tool(failing, moral, str(src), str(dst), warn=lambda m: None)
    # a failed run leaves the earlier output whole, and no temp file behind
    assert [json.loads(x).get("y") for x in dst.read_text().splitlines()] == ["a", None]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]
