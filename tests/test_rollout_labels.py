"""Process labels from rollouts (Math-Shepherd) on a stub policy whose continuations are written by hand, against
the labels worked out by hand and the task's exact step checker."""
import pytest

from refiner_jax.reward import rollout_labels
from refiner_jax.tasks import Example, mwp

# (n1 * n2) then n0 - #0 with numbers 10, 2, 3: the gold answer is 4.
GOLD = "#0: multiply ( number1, number2 ) | #1: subtract ( number0, #0 )"
WRONG_FIRST = "#0: add ( number1, number2 ) | #1: subtract ( number0, #0 )"  # 10 - 5 = 5
EXAMPLE = Example("p", "a problem", GOLD, "4.0", {"numbers": [10.0, 2.0, 3.0], "answer": 4.0})


def _stub(calls):
    """Continuations by hand: after a right first step, one of two continuations reaches 4; after a wrong one, none
    does."""
    def generate(prompts, prefixes, n):
        calls.append(list(prefixes))
        out = []
        for prefix in prefixes:
            if prefix.startswith("#0: multiply"):
                out.append([prefix + " | #1: subtract ( number0, #0 )", prefix + " | #1: add ( number0, #0 )"])
            else:
                out.append([prefix + " | #1: subtract ( number0, #0 )", prefix + " | #1: multiply ( number0, #0 )"])
        return [o[:n] for o in out]
    return generate


def test_hard_and_soft_labels_by_hand_and_each_prefix_rolled_out_once():
    task = mwp.MWPTask()
    calls = []
    solutions = [GOLD, WRONG_FIRST, GOLD]  # the repeated solution shares its rollouts
    labels, speed = rollout_labels.rollout_labels(_stub(calls), task, [EXAMPLE] * 3, solutions, completions=2)
    assert calls == [["#0: multiply ( number1, number2 )", "#0: add ( number1, number2 )"]]
    assert labels[0].soft == (0.5, 1.0) and labels[0].hard == (True, True)  # last step: the solution's own outcome
    assert labels[1].soft == (0.0, 0.0) and labels[1].prefix == (False, False)
    assert labels[2] == labels[0]
    assert speed["rollouts"] == 4
    agree = rollout_labels.agreement(task, [EXAMPLE] * 3, solutions, labels)
    # The checker calls both steps of WRONG_FIRST wrong, as the rollouts do: precision and recall 1 everywhere.
    assert agree["all"] == {"precision_wrong": 1.0, "recall_wrong": 1.0, "steps": 6, "checker_wrong": 2,
                            "rollouts_wrong": 2}
    assert agree["by_step"]["0"]["steps"] == 3


def test_a_wrong_step_that_can_still_reach_the_answer_is_labelled_good():
    """With numbers 10, 2, 2 the wrong first step 2 + 2 equals the right 2 x 2, so the rollouts call it good while
    the exact checker flags it: the blind spot of rollout labels that `agreement` measures."""
    task = mwp.MWPTask()
    example = Example("q", "a problem", GOLD, "6.0", {"numbers": [10.0, 2.0, 2.0], "answer": 6.0})
    labels, _ = rollout_labels.rollout_labels(_stub([]), task, [example], [WRONG_FIRST], completions=2)
    assert labels[0].hard == (True, True) and task.step_labels(example, WRONG_FIRST) == [False, False]
    agree = rollout_labels.agreement(task, [example], [WRONG_FIRST], labels)
    assert agree["all"]["recall_wrong"] == 0.0 and agree["all"]["checker_wrong"] == 2
    with pytest.raises(ValueError, match="completions"):
        rollout_labels.rollout_labels(_stub([]), task, [example], [GOLD], completions=0)
