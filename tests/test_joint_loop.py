"""The joint locate / explain / revise / rerank round on stub models: the gate, the located step, the feedback each
variant uses, the forced prefix, the reranking and the compute counts, all worked out by hand."""
import numpy as np

from refiner_jax.joint import locate_explain_revise as joint
from refiner_jax.joint.revision_stats import revision_stats
from refiner_jax.tasks import Example, mwp

GOLD = "#0: multiply ( number1, number2 ) | #1: subtract ( number0, #0 )"
WRONG = "#0: multiply ( number1, number2 ) | #1: add ( number0, #0 )"


def _example(uid):
    return Example(uid, f"problem {uid}", GOLD, "4.0", {"numbers": [10.0, 2.0, 3.0], "answer": 4.0})


class _Critic:
    def __init__(self):
        self.calls = []

    def feedback(self, examples, solutions):
        self.calls.append(list(solutions))
        return ["The first number in #0 is incorrect. The operator in #1 is incorrect." for _ in solutions]


def _run(variant, calls, critic=None):
    examples = [_example("a"), _example("b")]
    samples = [[GOLD, WRONG], [WRONG, GOLD]]
    # Problem a: its best sample (GOLD, min 0.9) passes the gate 0.5. Problem b: both samples score low; the best
    # is WRONG (min 0.3 > 0.2), whose step 1 is the first below the step threshold 0.4.
    steps = [[np.array([0.95, 0.9]), np.array([0.9, 0.1])], [np.array([0.8, 0.3]), np.array([0.2, 0.9])]]

    def generate(inputs, prefixes):
        calls.append((list(inputs), list(prefixes)))
        return [(p + " | " if p else "") + "#1: subtract ( number0, #0 )" if p else GOLD for p in prefixes]

    def score(prompts, solutions):
        return [np.array([0.9, 0.85]) for _ in solutions]

    return joint.joint_refine(examples, samples, steps, task=mwp.MWPTask(), generate=generate,
                              critic=critic or _Critic(), score_steps=score, count_tokens=lambda t: len(t.split()),
                              location_feedback=lambda k: f"The operator in #{k} is incorrect.", gate=0.5,
                              step_threshold=0.4, variant=variant)


def test_locate_explain_revise_rerank_by_hand():
    calls, critic = [], _Critic()
    out = _run(joint.Variant(), calls, critic)
    assert critic.calls == [[WRONG]]  # the gate left problem a alone
    assert out.located[1] == 1 and out.revisions == [None, GOLD]
    assert out.feedback[1] == "The operator in #1 is incorrect."  # the critic's sentence about the located step
    (inputs, prefixes), = calls
    assert prefixes == ["#0: multiply ( number1, number2 )"]  # step 0 kept, forced
    assert inputs == [f"problem b Previous Answer: {WRONG} Feedback: The operator in #1 is incorrect."]
    assert out.chosen == [GOLD, GOLD] and out.confidence.tolist() == [0.9, 0.85]  # the revision outranks 0.3
    # Problem b (tokens = words here): the critic wrote 13 (14 passes with its prefill); the generator wrote the 7
    # after the 6-word prefix (8 passes); the revision was scored once. Problem a: nothing.
    assert out.compute.tokens.tolist() == [0, 13 + 7] and out.compute.passes.tolist() == [0, 14 + 8 + 1]


def test_variants_switch_each_part():
    calls = []
    out = _run(joint.Variant(gate=False), calls)
    assert out.revisions[0] is not None and len(calls[0][1]) == 2  # both problems revised without the gate
    calls, critic = [], _Critic()
    out = _run(joint.Variant(explain=False), calls, critic)
    assert critic.calls == [] and out.feedback[1] == "The operator in #1 is incorrect."  # location only
    assert calls[0][1] == ["#0: multiply ( number1, number2 )"]
    calls = []
    out = _run(joint.Variant(locate=False), calls)
    assert out.feedback[1] == "The first number in #0 is incorrect. The operator in #1 is incorrect."
    assert calls[0][1] == [""]  # explanation only: the critic's whole feedback, nothing forced


class _AskedCritic(_Critic):
    """A critic that, asked about a step, names its second number (and is silent unprompted)."""

    def __init__(self):
        super().__init__()
        self.asked = []

    def feedback(self, examples, solutions):
        self.calls.append(list(solutions))
        return ["No hint" for _ in solutions]

    def explain(self, examples, solutions, steps):
        self.asked.append((list(solutions), list(steps)))
        return [f"The second number in #{k} is incorrect." for k in steps]


def test_the_critic_is_asked_about_the_located_step():
    """A critic with `explain` is asked about the located step (#1 of problem b's best sample) instead of giving its
    unprompted feedback; its answer is the feedback, charged by `explain_cost`. Unasked (or without the location),
    the same critic's "No hint" leaves the location sentence, or nothing to revise."""
    calls, critic = [], _AskedCritic()
    examples, samples = [_example("a"), _example("b")], [[GOLD, WRONG], [WRONG, GOLD]]
    steps = [[np.array([0.95, 0.9]), np.array([0.9, 0.1])], [np.array([0.8, 0.3]), np.array([0.2, 0.9])]]

    def generate(inputs, prefixes):
        calls.append((list(inputs), list(prefixes)))
        return [GOLD for _ in inputs]

    kwargs = dict(task=mwp.MWPTask(), generate=generate, critic=critic,
                  score_steps=lambda prompts, solutions: [np.array([0.9, 0.85]) for _ in solutions],
                  count_tokens=lambda t: len(t.split()), location_feedback=lambda k: f"Look at #{k}.", gate=0.5,
                  step_threshold=0.4, explain_cost=lambda example, solution, said, first: (0, 3))
    out = joint.joint_refine(examples, samples, steps, variant=joint.Variant(), **kwargs)
    assert critic.asked == [([WRONG], [1])] and critic.calls == []
    assert out.critic_said == ["", "The second number in #1 is incorrect."] and out.feedback == out.critic_said
    assert calls[0] == ([f"problem b Previous Answer: {WRONG} Feedback: The second number in #1 is incorrect."],
                        ["#0: multiply ( number1, number2 )"])
    # Problem b (tokens = words): 3 scoring passes to ask; the revision (GOLD, 13 words) wrote the 7 after the 6-word
    # prefix (8 passes with its prefill); one pass to score it.
    assert out.compute.tokens.tolist() == [0, 7] and out.compute.passes.tolist() == [0, 3 + 8 + 1]
    unasked = joint.joint_refine(examples, samples, steps, variant=joint.Variant(ask=False), **kwargs)
    assert critic.calls == [[WRONG]] and unasked.feedback == ["", "Look at #1."]
    silent = joint.joint_refine(examples, samples, steps, variant=joint.Variant(locate=False), **kwargs)
    assert silent.revisions == [None, None] and len(critic.asked) == 1  # "No hint" without a location: no revision


def test_revision_replaces_the_sample_without_rerank():
    """Without reranking a revision is the answer even when the verifier scores it below the sample it replaces;
    problems the gate kept are untouched, and the revision is still scored (its score is the confidence)."""
    examples = [_example("a"), _example("b")]
    samples = [[GOLD, WRONG], [WRONG, GOLD]]
    steps = [[np.array([0.95, 0.9]), np.array([0.9, 0.1])], [np.array([0.8, 0.3]), np.array([0.2, 0.9])]]
    kwargs = dict(task=mwp.MWPTask(), generate=lambda inputs, prefixes: [WRONG.replace("add", "divide")] * len(inputs),
                  critic=_Critic(), score_steps=lambda prompts, solutions: [np.array([0.25, 0.2]) for _ in solutions],
                  count_tokens=lambda t: len(t.split()), location_feedback=lambda k: f"The operator in #{k} is wrong.",
                  gate=0.5, step_threshold=0.4)
    kept = joint.joint_refine(examples, samples, steps, variant=joint.Variant(), **kwargs)
    assert kept.chosen == [GOLD, WRONG] and kept.confidence.tolist() == [0.9, 0.3]  # 0.2 < 0.3: the sample stays
    replaced = joint.joint_refine(examples, samples, steps, variant=joint.Variant(rerank=False), **kwargs)
    assert replaced.chosen == [GOLD, WRONG.replace("add", "divide")] and replaced.confidence.tolist() == [0.9, 0.2]
    assert replaced.compute.passes.tolist() == kept.compute.passes.tolist()  # the same work, another choice


def test_later_rounds_revise_the_previous_revision_while_it_is_doubted():
    """T = 2. Problem b's first revision (10 / 6, scored 0.25) is still below the gate 0.5, so round 2 locates its
    step 1 and revises it (GOLD, 0.85); the rerank keeps the best of the sample and both revisions. Tokens = words:
    two critic calls of 13 words (14 passes each), two revisions writing the 7 words after the 6-word prefix (8 passes
    each), two scoring passes. Had the first revision passed the gate, there would be no second round."""
    divided = WRONG.replace("add", "divide")
    examples, samples = [_example("a"), _example("b")], [[GOLD, WRONG], [WRONG, GOLD]]
    steps = [[np.array([0.95, 0.9]), np.array([0.9, 0.1])], [np.array([0.8, 0.3]), np.array([0.2, 0.9])]]
    calls = []

    def generate(inputs, prefixes):
        calls.append((list(inputs), list(prefixes)))
        return [GOLD if "divide" in x else divided for x in inputs]

    def score(prompts, solutions, first=np.array([0.8, 0.25])):
        return [np.array([0.9, 0.85]) if z == GOLD else first for z in solutions]

    kwargs = dict(task=mwp.MWPTask(), generate=generate, critic=_Critic(), count_tokens=lambda t: len(t.split()),
                  location_feedback=lambda k: f"Look at #{k}.", gate=0.5, step_threshold=0.4, turns=2)
    out = joint.joint_refine(examples, samples, steps, score_steps=score, **kwargs)
    assert [len(inputs) for inputs, _ in calls] == [1, 1]
    assert calls[1] == ([f"problem b Previous Answer: {divided} Feedback: The operator in #1 is incorrect."],
                        ["#0: multiply ( number1, number2 )"])
    assert out.revisions == [None, GOLD] and out.chosen == [GOLD, GOLD] and out.kept.tolist() == [False, True]
    assert out.compute.tokens.tolist() == [0, 2 * 13 + 2 * 7] and out.compute.passes.tolist() == [0, 2 * 14 + 2 * 8 + 2]
    replaced = joint.joint_refine(examples, samples, steps, score_steps=score, variant=joint.Variant(rerank=False),
                                  **kwargs)
    assert replaced.chosen == [GOLD, GOLD] and replaced.confidence.tolist() == [0.9, 0.85]  # the last revision
    calls.clear()
    passed = joint.joint_refine(examples, samples, steps, **kwargs,
                                score_steps=lambda prompts, solutions: score(prompts, solutions, np.array([0.8, 0.6])))
    assert len(calls) == 1 and passed.revisions == [None, divided] and passed.chosen == [GOLD, divided]


def test_weighted_vote_over_samples_and_revision_by_hand():
    """`vote`: every problem's answer is the PRM-weighted vote over its samples and its revision. Numbers 10, 2, 3:
    GOLD answers 4, WRONG 16. Problem a (not revised): 4 weighs 0.9, 16 0.1. Problem b: the revision (GOLD, 0.85)
    joins the sample GOLD (0.2) against WRONG (0.3): 4 wins with 1.05 of 1.35, and its highest-scoring candidate is
    the revision, kept. When the revision answers something else (10 / 6) and scores 0.2, 16 wins with 0.3 of 0.7."""
    out = _run(joint.Variant(vote=True), [])
    assert out.chosen == [GOLD, GOLD] and out.kept.tolist() == [False, True]
    np.testing.assert_allclose(out.confidence, [0.9 / 1.0, 1.05 / 1.35])
    examples = [_example("a"), _example("b")]
    steps = [[np.array([0.95, 0.9]), np.array([0.9, 0.1])], [np.array([0.8, 0.3]), np.array([0.2, 0.9])]]
    other = joint.joint_refine(
        examples, [[GOLD, WRONG], [WRONG, GOLD]], steps, task=mwp.MWPTask(), critic=_Critic(),
        generate=lambda inputs, prefixes: [WRONG.replace("add", "divide")] * len(inputs),
        score_steps=lambda prompts, solutions: [np.array([0.25, 0.2]) for _ in solutions],
        count_tokens=lambda t: len(t.split()), location_feedback=lambda k: f"Look at #{k}.", gate=0.5,
        step_threshold=0.4, variant=joint.Variant(vote=True))
    assert other.chosen == [GOLD, WRONG] and other.kept.tolist() == [False, False]
    np.testing.assert_allclose(other.confidence, [0.9, 0.3 / 0.7])
    # Candidates without an answer carry no vote; a problem where none has one gets None.
    chosen, confidence, index = joint.weighted_vote(mwp.MWPTask(), examples[:1], [["#0: add ( number0"]],
                                                    [[np.array([0.9])]])
    assert chosen == [None] and index.tolist() == [-1] and confidence[0] == -np.inf


def test_helpers_by_hand():
    assert joint.locate(np.array([0.9, 0.2, 0.1]), 0.5) == 1
    assert joint.locate(np.array([0.9, 0.7]), 0.5) == 1  # none below: the lowest
    assert joint.sentences_about("The operator in #1 is incorrect. The first number in #10 is incorrect.", 1) == \
        "The operator in #1 is incorrect."
    task = mwp.MWPTask()
    assert joint.prefix_before(task, GOLD, 0) == "" and joint.prefix_before(task, GOLD, 1) == \
        "#0: multiply ( number1, number2 )"


def test_revision_stats_by_hand():
    """What the revisions did, counted by hand. Full system: only problem b is revised; its best sample WRONG is
    wrong first at step 1, the located step (so the forced step 0 is right); the critic has a hint with a sentence
    about #1; the revision (GOLD) is right and kept, fixing b."""
    task, examples = mwp.MWPTask(), [_example("a"), _example("b")]
    full = _run(joint.Variant(), [])
    assert full.best == [GOLD, WRONG] and full.kept.tolist() == [False, True]
    assert revision_stats(examples, full, task) == dict(
        revised=1, critic_hint=1, critic_names_located_step=1, critic_right_about_located=1, best_has_wrong_step=1,
        located_first_error=1, prefix_all_right=1, best_right=0, revision_right=1, revision_right_best_wrong=1, kept=1,
        kept_right=1, fixed=1, broken=0)
    # Without gate or rerank and with a generator that always writes a wrong answer, both problems are revised and
    # every revision replaces its sample: a's right best sample (no wrong step; located at its lowest step, 1) is
    # broken, b's wrong one stays wrong. Location only: the critic is not asked.
    samples = [[GOLD, WRONG], [WRONG, GOLD]]
    steps = [[np.array([0.95, 0.9]), np.array([0.9, 0.1])], [np.array([0.8, 0.3]), np.array([0.2, 0.9])]]
    out = joint.joint_refine(
        examples, samples, steps, task=task, critic=_Critic(),
        generate=lambda inputs, prefixes: [WRONG.replace("add", "divide")] * len(inputs),
        score_steps=lambda prompts, solutions: [np.array([0.25, 0.2]) for _ in solutions],
        count_tokens=lambda t: len(t.split()), location_feedback=lambda k: f"The operator in #{k} is wrong.",
        gate=0.5, step_threshold=0.4, variant=joint.Variant(explain=False, gate=False, rerank=False))
    assert out.located == [1, 1] and out.critic_said == ["", ""]
    assert revision_stats(examples, out, task) == dict(
        revised=2, critic_hint=0, critic_names_located_step=0, critic_right_about_located=0, best_has_wrong_step=1,
        located_first_error=1, prefix_all_right=1, best_right=1, revision_right=0, revision_right_best_wrong=0, kept=2,
        kept_right=0, fixed=0, broken=1)
    # A located step after the first wrong one: the forced prefix keeps the wrong step 0, the revision cannot fix it;
    # the critic's sentence about #1 is not the oracle's (step 1 is right given step 0).
    early = "#0: add ( number1, number2 ) | #1: subtract ( number0, #0 )"
    out = joint.joint_refine(
        examples[:1], [[early]], [[np.array([0.9, 0.3])]], task=task, critic=_Critic(),
        generate=lambda inputs, prefixes: [p + " | #1: add ( number0, #0 )" for p in prefixes],
        score_steps=lambda prompts, solutions: [np.array([0.9, 0.2]) for _ in solutions],
        count_tokens=lambda t: len(t.split()), location_feedback=lambda k: f"The operator in #{k} is wrong.",
        gate=0.5, step_threshold=0.4)
    assert out.located == [1] and out.revisions == ["#0: add ( number1, number2 ) | #1: add ( number0, #0 )"]
    assert revision_stats(examples[:1], out, task) == dict(
        revised=1, critic_hint=1, critic_names_located_step=1, critic_right_about_located=0, best_has_wrong_step=1,
        located_first_error=0, prefix_all_right=0, best_right=0, revision_right=0, revision_right_best_wrong=0, kept=0,
        kept_right=0, fixed=0, broken=0)
