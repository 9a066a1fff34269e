"""Every task's outcome label and answer key (the voting key among K samples), on hand-worked hypotheses."""
from fractions import Fraction

import pytest

from refiner_jax.tasks import Example, get_task
from refiner_jax.tasks.gsm8k import extract_answer


@pytest.mark.parametrize("name", ["mwp", "gsm8k", "snlr", "moral_stories"])
def test_every_task_has_the_reward_model_views(name):
    task = get_task(name)
    for method in ("split_steps", "step_labels", "outcome_label", "answer_key"):
        assert callable(getattr(task, method)), f"{name} lacks {method}"


def test_mwp_answer_key_votes_formulas_with_the_same_value_together():
    task = get_task("mwp")
    ex = Example("p", "q", "#0: divide ( number0, number1 )", "", {"numbers": [20.0, 7.0], "answer": 20 / 7})
    # 20 / 7 = 2.857142857..., to 6 significant digits 2.85714, however the formula is written.
    assert task.answer_key(ex, "#0: divide ( number0, number1 )") == 2.85714
    assert task.answer_key(ex, "#0: divide ( 1.0, number1 ) | #1: multiply ( number0, #0 )") == 2.85714
    assert task.outcome_label(ex, "#0: divide ( 1.0, number1 ) | #1: multiply ( number0, #0 )")
    # 7 - 20 = -13; number2 does not exist; division by zero: no answer.
    assert task.answer_key(ex, "#0: subtract ( number1, number0 )") == -13.0
    assert not task.outcome_label(ex, "#0: subtract ( number1, number0 )")
    assert task.answer_key(ex, "#0: add ( number0, number2 )") is None
    assert task.answer_key(ex, "#0: divide ( number0, #1 ) | #1: subtract ( number1, number1 )") is None
    assert str(task.answer_key(ex, "#0: subtract ( number1, number1 )")) == "0.0"  # never -0.0


def test_gsm8k_answer_key_is_the_number_or_the_upstream_string():
    gold = "5*6=<<5*6=30>>30\n#### 30"
    ex = Example("g", "How many?", gold, extract_answer(gold), {"answer_strict": "30"})
    task, strict = get_task("gsm8k"), get_task("gsm8k", strict=True)
    assert task.answer_key(ex, "#### 30.00") == task.answer_key(ex, "#### 30") == Fraction(30)
    assert task.answer_key(ex, "#### 1,080") == Fraction(1080)
    assert strict.answer_key(ex, "#### 30.00") == "30.00" and strict.answer_key(ex, "#### 30") == "30"
    assert task.answer_key(ex, "no answer here") is None
    assert task.outcome_label(ex, "#### 30.0") and not strict.outcome_label(ex, "#### 30.0")


def test_snlr_answer_key_is_the_concluded_attribute_set():
    task = get_task("snlr")
    ex = Example("s", "x", "#0: Dan is small #1: Dan is big and strong", "Dan is big and strong",
                 {"consequents": ["big", "strong"]})
    assert task.answer_key(ex, "#0: Dan is small #1: Dan is strong and big") == frozenset({"big", "strong"})
    assert task.outcome_label(ex, "#0: Dan is strong and big")
    assert not task.outcome_label(ex, "#0: Dan is big")
    assert task.answer_key(ex, "") is None


def test_moral_answer_key_is_the_judged_action():
    task = get_task("moral_stories")
    # Two wordings of one judgment on one action vote together; the opposite judgment does not.
    assert task.answer_key(None, "It's good to help your friends.") == ("help your friends", 1)
    assert task.answer_key(None, "You should help your friends <|M_ACT|> Tom helps.") == ("help your friends", 1)
    assert task.answer_key(None, "It's wrong to help your friends.") == ("help your friends", -1)
    assert task.answer_key(None, "") is None
