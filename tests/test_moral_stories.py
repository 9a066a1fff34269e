"""Moral Stories task: loading, norm parsing, oracle, perturbations, metrics, data errors.

References: hand-worked cases and the released critic files (`critic_*_prep.json`), whose per-story annotations
(norm sentiment, norm action, paraphrased "other" norms, anti-norms and fake norms) were produced upstream with
other tools (spaCy, WordNet, a sentiment model) and are used here as an independent yardstick.
"""
import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refiner_jax.tasks import NO_HINT, DataError, Example, get_task
from refiner_jax.tasks.moral_stories import (
    TEMPLATES, MoralStoriesTask, action_overlap, content_stems, parse_norm, render_norm, split_output,
    story_verb_phrases, word_polarity,
)

GOLD = Example(
    uid="s1",
    x="<|SIT|> Brian notices his neighbor's house is on fire. <|INT|> Brian wants to keep the fire from spreading "
      "to his house. <|I_ACT|> Brian carefully protects his property by spraying any flames on his property with "
      "his hose. <|NRM|>",
    z="You should help others when they're in danger.",
    y="Brian drags his hose next door and starts putting out the fire at his neighbor's house.",
    meta={"situation": "Brian notices his neighbor's house is on fire.",
          "intention": "Brian wants to keep the fire from spreading to his house.",
          "immoral_action": "Brian carefully protects his property by spraying any flames on his property with his "
                            "hose."},
)


@pytest.fixture(scope="module")
def ms_dir(shared_data):
    return shared_data / "refiner" / "moral_stories"


@pytest.fixture(scope="module")
def critic_records(ms_dir):
    return json.load(open(ms_dir / "critic_dev_prep.json")) + json.load(open(ms_dir / "critic_test_prep.json"))


def _gold_example(rec):
    return Example(rec["id"], "", rec["norm"], rec["moral_action"])


# ------------------------------------------------------------------------------------------------------ data

def test_splits_train_on_dev_and_test_on_test(ms_dir):
    task = MoralStoriesTask(val_size=100, seed=0)
    train, val, test = (task.load(s, data_dir=ms_dir) for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (900, 100, 1000)
    dev = json.load(open(ms_dir / "actor_dev.json"))
    assert {e.uid for e in train} | {e.uid for e in val} == {r["id"] for r in dev}
    assert not {e.uid for e in train} & {e.uid for e in val}
    assert [e.uid for e in val] == [e.uid for e in MoralStoriesTask(val_size=100, seed=0).load("val", ms_dir)]
    assert [e.uid for e in val] != [e.uid for e in MoralStoriesTask(val_size=100, seed=1).load("val", ms_dir)]
    # every record round-trips: x is the actor input, target(example) is the actor output
    by_id = {e.uid: e for e in train + val}
    for rec in dev:
        e = by_id[rec["id"]]
        assert e.x == rec["actor_input"] and MoralStoriesTask.target(e) == rec["actor_output"]
        assert split_output(rec["actor_output"]) == (e.z, e.y)
    first = json.load(open(ms_dir / "actor_test.json"))[0]
    assert test[0].z == "Breastfeeding a five-year old child is unusual."
    assert test[0].meta["situation"] == ("Karen was spending the day at the pool with her 5yr old and 8yr old "
                                         "children.")
    assert MoralStoriesTask.target(test[0]) == first["actor_output"]
    with pytest.raises(ValueError, match="unknown split"):
        task.load("dev", data_dir=ms_dir)


@pytest.mark.parametrize("content, message", [
    (None, "file not found"),
    ("[]", "empty list"),
    ("{", "not valid JSON"),
    ('{"id": "a"}', "JSON list"),
    ('[{"id": "a", "actor_input": "x"}]', "'actor_output'"),
    ('[{"id": "a", "actor_input": "no tags", "actor_output": "n <|M_ACT|> a"}]', "<|SIT|>"),
    ('[{"id": "a", "actor_input": "<|SIT|> s <|INT|> i <|I_ACT|> a <|NRM|>", "actor_output": "norm only"}]',
     "norm <|M_ACT|> action"),
])
def test_bad_data_files_raise_data_error(tmp_path, content, message):
    if content is not None:
        (tmp_path / "actor_test.json").write_text(content)
    with pytest.raises(DataError, match=message.replace("|", r"\|")) as err:
        MoralStoriesTask().load("test", data_dir=str(tmp_path))
    assert "actor_test.json" in str(err.value)


# ----------------------------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("norm, polarity, action", [
    ("You should help others when they're in danger.", +1, "help others when they're in danger"),
    ("You shouldn't lie to your friends.", -1, "lie to your friends"),
    ("It's wrong to steal.", -1, "steal"),
    ("It is not okay to cheat on a test.", -1, "cheat on a test"),
    ("It's wrong not to help others.", +1, "help others"),        # double negation approves
    ("It's good that you call your mother.", +1, "call your mother"),
    ("It's rude for guests to arrive late.", -1, "arrive late"),
    ("Breastfeeding a five-year old child is unusual.", -1, "Breastfeeding a five-year old child"),
    ("Hitting a woman is never acceptable.", -1, "Hitting a woman"),
    ("People are expected to tip servers.", +1, "tip servers"),
    ("You're expected to pay your share.", +1, "pay your share"),
    ("Never leave a child alone.", -1, "leave a child alone"),
    ("It is dishonorable to betray friends.", -1, "betray friends"),  # dis- + a good word
    ("It's flibbertigibbet to dance.", None, "dance"),                # unknown judgment word
    ("Slow and steady wins the race.", None, "Slow and steady wins the race"),
    ("", None, ""),
])
def test_parse_norm(norm, polarity, action):
    parsed = parse_norm(norm)
    assert (parsed.polarity, parsed.action) == (polarity, action)


def test_word_polarity_and_stems():
    assert (word_polarity("Kind"), word_polarity("unkind"), word_polarity("impolite"), word_polarity("xyz")) == (
        1, -1, -1, None)
    assert content_stems("Helping others") == content_stems("help others") == {"help", "other"}
    assert content_stems("making gifts") == content_stems("make a gift")
    assert action_overlap("help others", "help others when they're in danger") == pytest.approx(0.8)
    assert action_overlap("", "") == 1.0 and action_overlap("run", "") == 0.0


def test_story_verb_phrases():
    assert story_verb_phrases(GOLD.y) == [("drag your hose next door", "base"),
                                          ("start putting out the fire at your neighbor's house", "base")]
    assert story_verb_phrases(GOLD.meta["intention"]) == [("keep the fire from spreading to your house", "base")]
    assert story_verb_phrases("Karen was spending the day at the pool.") == [
        ("spending the day at the pool", "gerund")]
    assert story_verb_phrases("Jack's kids are begging.") == []  # possessive subject: skipped
    assert story_verb_phrases("") == []


def test_parse_agrees_with_released_norm_annotations(critic_records):
    """Polarity vs the released norm sentiment, action vs the released norm action (2,000 stories)."""
    agree = disagree = unknown = 0
    for rec in critic_records:
        if not rec["norm_sentiment"]:
            continue
        polarity = parse_norm(rec["norm"]).polarity
        if polarity is None:
            unknown += 1
        elif polarity == math.copysign(1, rec["norm_sentiment"]):
            agree += 1
        else:
            disagree += 1
    assert agree + disagree + unknown == 1995
    assert agree >= 1900 and disagree <= 30  # measured: 1912 agree, 23 disagree, 60 unknown
    overlaps = [action_overlap(parse_norm(r["norm"]).action, r["norm_action"]) >= 0.5
                for r in critic_records if r["norm_action"]]
    assert sum(overlaps) / len(overlaps) > 0.99  # measured: 0.995 of 1995


def test_render_then_parse_round_trips():
    rng = random.Random(0)
    for template, polarity, form in TEMPLATES:
        for action in ("share your food with others", "call your mother every week"):
            text = template.format(action if form == "base" else "Sharing food")
            text = text[0].upper() + text[1:]
            parsed = parse_norm(text)
            assert parsed.polarity == polarity, text
            assert content_stems(parsed.action) == content_stems(action if form == "base" else "Sharing food")
    assert parse_norm(render_norm("help others", -1, "base", rng)).polarity == -1


# ------------------------------------------------------------------------------------------------- oracle

@pytest.mark.parametrize("hypothesis, text", [
    ("You should help others when they're in danger.", NO_HINT),
    ("you should help others when they're in danger", NO_HINT),
    ("It's good to help others in danger.", NO_HINT),
    ("It's wrong to help others when they're in danger.", "Contradiction."),
    ("You shouldn't help people in danger.", "Contradiction."),
    ("It's wrong not to help others in danger.", NO_HINT),
    ("You should put out the fire.", 'Semantically misaligned: "help others when they\'re in danger".'),
    ("", 'Semantically misaligned: "help others when they\'re in danger".'),
    ("It's good to help others in danger. <|M_ACT|> Brian runs.", NO_HINT),  # a full output: the norm is judged
])
def test_oracle_feedback(hypothesis, text):
    task = MoralStoriesTask()
    feedback = task.oracle_feedback(GOLD, hypothesis)
    assert feedback.text == text
    assert feedback.ok == (text == NO_HINT)
    assert task.step_labels(GOLD, hypothesis) == [feedback.ok]


def test_oracle_with_unknown_gold_polarity_only_checks_the_action():
    gold = Example("u", "", "Slow and steady wins the race.", "a")
    task = MoralStoriesTask()
    assert task.oracle_feedback(gold, "It's wrong to be slow and steady to win the race.").ok
    assert task.oracle_feedback(gold, "It's wrong to steal.").errors[0].kind == "misaligned"


def test_oracle_agrees_with_released_critic_variants(critic_records):
    """Released paraphrases should pass, anti-norms contradict, fake norms be misaligned (2,000 stories)."""
    task = MoralStoriesTask()
    other = [task.oracle_feedback(_gold_example(r), n).ok for r in critic_records for n in r["other_norms"]]
    fake = [task.oracle_feedback(_gold_example(r), n).errors[:1] for r in critic_records for n in r["fake_norms"]]
    anti = []
    for r in critic_records:
        if r["anti_norm"]:
            hyp, gold = parse_norm(r["anti_norm"]), parse_norm(r["norm"])
            if hyp.action == hyp.phrase and gold.action == gold.phrase:  # double negations mean the same norm
                anti.append(task.oracle_feedback(_gold_example(r), r["anti_norm"]).errors[:1])
    assert len(other) == 8718 and sum(other) / len(other) > 0.98  # measured 8618
    assert sum(e[0].kind == "misaligned" for e in fake if e) / len(fake) > 0.94  # measured 11369 / 11897
    assert sum(e[0].kind == "contradiction" for e in anti if e) / len(anti) > 0.88  # measured 1697 / 1879


# --------------------------------------------------------------------------------------------- perturbation

def test_perturbations_are_labelled_by_the_oracle(ms_dir):
    task = MoralStoriesTask()
    examples = task.load("train", data_dir=ms_dir)[:300]
    rng = random.Random(0)
    kinds = {"contradiction": 0, "misaligned": 0, None: 0}
    for example in examples:
        text, feedback = task.perturb(example, rng)
        assert feedback == task.oracle_feedback(example, text)
        kinds[feedback.errors[0].kind if feedback.errors else None] += 1
    assert kinds["contradiction"] > 90 and kinds["misaligned"] > 90 and 30 < kinds[None] < 90, kinds
    assert task.perturb(GOLD, random.Random(5)) == task.perturb(GOLD, random.Random(5))


def test_perturb_without_story_or_polarity_falls_back_to_gold():
    example = Example("e", "", "Slow and steady wins the race.", "")
    text, feedback = MoralStoriesTask(no_change_rate=0.0).perturb(example, random.Random(0))
    assert (text, feedback.text) == (example.z, NO_HINT)


# ------------------------------------------------------------------------------------------ texts, metrics

def test_critic_input_and_steps():
    task = MoralStoriesTask()
    assert task.critic_input(GOLD, "It's bad to lie. <|M_ACT|> ignored") == (
        GOLD.x + " It's bad to lie. <|M_ACT|> " + GOLD.y)
    assert task.split_steps("It's bad to lie. <|M_ACT|> Brian lies.") == ["It's bad to lie."]
    assert get_task("moral_stories").name == "moral_stories"


def test_score_hand_worked():
    gold = Example("g", "", "You should help others when they're in danger.", "Brian drags his hose next door.")
    s = MoralStoriesTask().score(["It's good to help others. <|M_ACT|> Brian drags his hose."], [gold])
    # norm: LCS "help others" = 2 of 6 / 9 tokens -> F = 4/15; action: LCS 4 of 4 / 6 -> F = 0.8
    assert s["norm_rougeL"] == pytest.approx(4 / 15) and s["action_rougeL"] == pytest.approx(0.8)
    # action BLEU: every n-gram matches, BP = exp(1 - 6/4); norm BLEU: 2/6, 1/5, then exp-smoothed 1/8, 1/12
    assert s["action_bleu"] == pytest.approx(math.exp(-0.5))
    assert s["norm_bleu"] == pytest.approx(math.exp(-0.5) * (2 / 6 * 1 / 5 * 1 / 8 * 1 / 12) ** 0.25)
    assert s["judgment_agreement"] == 1.0 and s["oracle_ok"] == 1.0
    s = MoralStoriesTask().score(["It's wrong to help others."], [gold])
    assert s["judgment_agreement"] == 0.0 and s["action_rougeL"] == 0.0 and s["oracle_ok"] == 0.0
    with pytest.raises(ValueError, match="predictions"):
        MoralStoriesTask().score(["a"], [])


# ------------------------------------------------------------------------------------------- property tests

@settings(max_examples=200, deadline=None)
@given(st.text(max_size=100), st.text(max_size=100))
def test_random_text_never_crashes_and_is_deterministic(norm, hypothesis):
    task = MoralStoriesTask()
    assert parse_norm(norm) == parse_norm(norm)
    example = Example("r", f"<|SIT|> {hypothesis} <|INT|> x <|I_ACT|> y <|NRM|>", norm, hypothesis)
    assert task.oracle_feedback(example, hypothesis) == task.oracle_feedback(example, hypothesis)
    assert task.perturb(example, random.Random(1)) == task.perturb(example, random.Random(1))
    story_verb_phrases(hypothesis)
    task.score([hypothesis], [example])


words = st.sampled_from("You should not never It's it is good wrong to help others lie the fire <|M_ACT|> "
                        "Brian drags his hose is unusual kind , . don't people".split())


@settings(max_examples=200, deadline=None)
@given(st.lists(words, max_size=14), st.lists(words, max_size=14))
def test_mutated_norms_through_the_oracle(gold_words, hyp_words):
    task = MoralStoriesTask()
    gold = Example("m", GOLD.x, " ".join(gold_words), GOLD.y, GOLD.meta)
    feedback = task.oracle_feedback(gold, " ".join(hyp_words))
    assert feedback.ok == (feedback.text == NO_HINT)
    assert all(e.kind in task.error_kinds for e in feedback.errors)
    text, fb = task.perturb(gold, random.Random(0))
    assert fb == task.oracle_feedback(gold, text)
