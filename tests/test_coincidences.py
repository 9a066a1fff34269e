"""The trace-error variant of the embedded MWP generator: hand-worked rewrites in which a wrong step reaches the
right answer and the step checker still flags it, and the variant's problems against the plain generator's."""
import random

import pytest

from refiner_jax.tasks import Example
from refiner_jax.tasks.mwp import MWPTask, coincidences, compile_prefix, execute, format_formula


def _example(prefix_equation: str, numbers) -> Example:
    z = format_formula(compile_prefix(prefix_equation))
    answer = execute(z, numbers)
    return Example("u", "a problem", z, repr(answer), {"numbers": list(numbers), "answer": answer})


def _rewrite(equation, numbers, kind):
    made = coincidences.with_coincidence(equation, numbers, random.Random(0), kinds=(kind,))
    assert made is not None and made[1] == kind
    return made[0]


def _right_answer_wrong_step(task, example, hypothesis):
    return task.outcome_label(example, hypothesis) and not all(task.step_labels(example, hypothesis))


def test_distractor_takes_a_needed_value_so_using_it_is_a_hidden_wrong_step():
    task = MWPTask()
    numbers = _rewrite("+ number0 number2", (5.0, 9.0, 7.0), "distractor")  # number1 is irrelevant
    assert numbers[0] == 5.0 and numbers[2] == 7.0 and numbers[1] in (5.0, 7.0)
    example = _example("+ number0 number2", numbers)
    assert example.meta["answer"] == 12.0  # the gold answer is unchanged
    replaced = "number0" if numbers[1] == 5.0 else "number2"
    other = "number2" if replaced == "number0" else "number0"
    wrong = f"#0: add ( number1, {other} )"
    assert _right_answer_wrong_step(task, example, wrong)
    assert task.step_labels(example, wrong) == [False]
    assert task.oracle_feedback(example, wrong).errors  # the critic's oracle names the wrong number too


def test_intermediate_result_equals_a_distractor():
    task = MWPTask()
    # (n0 + n1) - n3 with n2 irrelevant: n2 becomes 10 + 5 = 15, so "15 - 2" skips the addition and is right.
    numbers = _rewrite("- + number0 number1 number3", (10.0, 5.0, 99.0, 2.0), "intermediate")
    assert numbers == [10.0, 5.0, 15.0, 2.0]
    example = _example("- + number0 number1 number3", numbers)
    wrong = "#0: subtract ( number2, number3 )"
    assert task.outcome_label(example, wrong) and task.step_labels(example, wrong) == [False]


def test_unit_makes_multiply_and_divide_agree():
    task = MWPTask()
    numbers = _rewrite("* number0 number1", (6.0, 3.0), "unit")
    assert numbers == [6.0, 1.0]
    example = _example("* number0 number1", numbers)
    assert _right_answer_wrong_step(task, example, "#0: divide ( number0, number1 )")


def test_two_two_makes_add_and_multiply_agree():
    task = MWPTask()
    numbers = _rewrite("* + number0 number1 number2", (3.0, 4.0, 5.0), "two_two")
    assert numbers == [2.0, 2.0, 5.0]
    example = _example("* + number0 number1 number2", numbers)
    wrong = "#0: multiply ( number0, number1 ) | #1: multiply ( #0, number2 )"
    assert example.meta["answer"] == 20.0
    assert task.outcome_label(example, wrong) and task.step_labels(example, wrong) == [False, False]


def test_a_rewrite_that_breaks_positive_integer_steps_is_refused():
    # A lone subtraction without irrelevant numbers offers no coincidence; "two_two" on (2 + 2) - 5 would go
    # negative.
    assert coincidences.with_coincidence("- number0 number1", (9.0, 4.0), random.Random(0)) is None
    assert coincidences.with_coincidence("- + number0 number1 number2", (9.0, 4.0, 5.0), random.Random(0),
                                         kinds=("two_two",)) is None


def test_variant_keeps_texts_and_equations_and_rewrites_a_nested_share():
    plain = MWPTask().load("test")
    full = MWPTask(trace_rate=1.0).load("test")
    half = MWPTask(trace_rate=0.5).load("test")
    assert [(e.uid, e.x, e.z) for e in full] == [(e.uid, e.x, e.z) for e in plain] == [(e.uid, e.x, e.z)
                                                                                        for e in half]
    kinds = [e.meta.get("coincidence") for e in full]
    assert set(kinds) - {None} == set(coincidences.KINDS)
    rewritten = sum(k is not None for k in kinds)
    assert rewritten > len(full) // 2  # most problems have a distractor or an add / multiply / divide step
    for f, h, p in zip(full, half, plain):
        if h.meta.get("coincidence"):  # a problem the lower rate rewrites is rewritten alike at rate 1
            assert h.meta["numbers"] == f.meta["numbers"] and h.meta["coincidence"] == f.meta["coincidence"]
        elif not f.meta.get("coincidence"):
            assert f.meta["numbers"] == p.meta["numbers"]
        value = execute(f.z, f.meta["numbers"])
        assert value == f.meta["answer"] and value > 0 and float(value).is_integer()
    assert 0.3 < sum(bool(e.meta.get("coincidence")) for e in half) / rewritten < 0.7


def test_a_larger_test_split_keeps_the_first_problems_and_the_training_data():
    options = {"trace_rate": 1.0, "trace_kinds": ("distractor", "intermediate", "two_two")}
    base = MWPTask(**options)
    more = MWPTask(**options, synthetic_sizes={"test": 1300})
    assert len(more.load("test")) == 1300

    def rows(examples):
        return [(e.uid, e.x, e.z, e.meta["numbers"], e.meta.get("coincidence")) for e in examples]

    assert rows(more.load("test")[:1000]) == rows(base.load("test"))
    for split in ("train", "val"):
        assert rows(more.load(split)) == rows(base.load(split))


@pytest.mark.parametrize("options, message", [({"trace_rate": 1.5}, "trace_rate"),
                                              ({"trace_kinds": ("sevens",)}, "trace_kinds")])
def test_bad_options_name_the_field(options, message):
    with pytest.raises(ValueError, match=message):
        MWPTask(**options)
