"""The generator <-> critic turn shared by inference, the REFINER stage's training inputs and the joint loop, and
the optional hooks every task inherits from `tasks.base.Task`: each expected value is worked out by hand."""
import pytest

from refiner_jax.refiner import feedback_loop
from refiner_jax.tasks import get_task
from refiner_jax.tasks.base import NO_HINT, Example, Task, as_task_question

EXAMPLES = [Example("0", "q0", "g0", ""), Example("1", "q1", "g1", ""), Example("2", "q2", "g2", "")]


def test_a_turn_asks_the_critic_once_and_revises_only_what_it_faults():
    asked, revised = [], []

    def critique(examples, hypotheses):
        asked.append(list(hypotheses))
        return [NO_HINT if h == ex.z else f"Use {ex.z}." for ex, h in zip(examples, hypotheses)]

    def revise(prompts, going):
        revised.append((list(prompts), list(going)))
        return [p.split("Use ")[1].rstrip(".") for p in prompts]

    turn = feedback_loop.take_turn(EXAMPLES, ["w0", "g1", "w2"], critique, revise)
    assert asked == [["w0", "g1", "w2"]]
    assert turn.feedback == ["Use g0.", NO_HINT, "Use g2."] and turn.going == [0, 2]
    assert turn.prompts == ["q0 Previous Answer: w0 Feedback: Use g0.", "q2 Previous Answer: w2 Feedback: Use g2."]
    assert revised == [(turn.prompts, [0, 2])] and turn.revised == ["g0", "g2"]


def test_a_turn_without_work_calls_no_model_and_a_short_critic_is_an_error():
    def fail(*args):
        raise AssertionError("no model call expected")

    assert feedback_loop.take_turn([], [], fail, fail) == feedback_loop.Turn([], [], [], [])
    everyone_right = feedback_loop.take_turn(EXAMPLES[:1], ["g0"], lambda exs, hs: [NO_HINT], fail)
    assert everyone_right.going == [] and everyone_right.revised == []
    with pytest.raises(ValueError, match="returned 1 feedback texts for 2 hypotheses"):
        feedback_loop.take_turn(EXAMPLES[:2], ["a", "b"], lambda exs, hs: ["Use g0."])


def test_revision_turn_with_its_own_stop_rule_and_template():
    # The REFINER stage's inputs: every problem goes on, "No hint" included, through the configured template.
    turn = feedback_loop.revision_turn(EXAMPLES[:2], ["w0", "g1"], ["Use g0.", NO_HINT], template="{f} | {z} | {x}",
                                       stops=lambda f: False)
    assert turn.going == [0, 1] and turn.prompts == ["Use g0. | w0 | q0", "No hint | g1 | q1"]
    assert turn.revised == []


def test_refine_without_a_task_leaves_every_turn_unscored():
    class Generator:
        def greedy(self, texts):
            return [t.split("Use ")[1].rstrip(".") if "Use " in t else "w" + t[1:] for t in texts]

    class Critic:
        def feedback(self, examples, hypotheses):
            return [NO_HINT if h == ex.z else f"Use {ex.z}." for ex, h in zip(examples, hypotheses)]

    [trajectory] = feedback_loop.refine(Generator(), Critic(), None, EXAMPLES[:1], turns=3)
    assert trajectory.hypotheses == ["w0", "g0"] and trajectory.feedback == ["Use g0.", NO_HINT]
    assert trajectory.scores == [{}, {}]


def test_a_task_gets_the_declared_hooks_defaults():
    class Plain(Task):
        name = "plain"

    task = Plain()
    assert (task.error_kinds, task.primary_metric, task.lowercase, task.special_tokens) == ((), "", False, ())
    assert task.fresh_problems(5) == [] and task.step_sentences(2) == []
    assert task.location_feedback(2) == "Step #2 is incorrect."
    assert as_task_question(task, "Ann Has 3") == "Ann Has 3" and as_task_question(None, "Ann Has 3") == "Ann Has 3"


def test_tasks_override_the_hooks_they_have():
    mwp = get_task("mwp", lowercase=True)
    assert as_task_question(mwp, "Ann Has 3") == "ann has 3"
    assert mwp.step_sentences(1) == ["The operator in #1 is incorrect.", "The first number in #1 is incorrect.",
                                     "The second number in #1 is incorrect."]
    assert mwp.location_feedback(1) == " ".join(mwp.step_sentences(1))
    assert len(mwp.fresh_problems(3)) == 3 and mwp.fresh_problems(3, data_dir="/any/folder") == []
    moral = get_task("moral_stories")
    assert "<|M_ACT|>" in moral.special_tokens and moral.step_sentences(0) == []
    for name in ("mwp", "gsm8k", "moral_stories", "snlr"):
        assert Task in type(get_task(name)).__mro__, name  # every task subclasses the base, hooks included
