"""sNLR task: generator vs REFINER's released files, chains, oracle, perturbations, labels and metrics.

References: the released `data/refiner/srn/srn_*.json` (HELM hard instances with REFINER's chains), the counts and
hand-rendered instances of `specs/snlr.md`, and examples worked by hand below.
"""
import collections
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refiner_jax.tasks import NO_HINT, DataError, Example, get_task
from refiner_jax.tasks.snlr import (
    CHAIN_STYLES,
    MISSING_IMPLICIT,
    MISSING_LINK,
    SNLRTask,
    build_chain,
    helm_attribute_set,
    read_conclusion,
    split_steps,
)
from refiner_jax.tasks.snlr.generator import ATTRIBUTE_GROUPS, CATEGORIES, GENERIC_NAMES, generate_records

SPLIT_SIZES = {"train": 1000, "val": 5000, "test": 5000}

# specs/snlr.md §9, rendered by hand (not from HELM's random stream).
EXAMPLE_A = {
    "rules": ["If a tiger is clean, then the tiger is purple.",
              "If an animal is cold or round, then the animal is good.",
              "If a tiger is young and fast, then the tiger is blue.",
              "If an animal is sad, then the animal is strong.",
              "If a tiger is smart or red, then the tiger is soft."],
    "fact": "The tiger is chill and huge.",
    "consequents": "The tiger is good",
}
EXAMPLE_B = {
    "rules": ["If a plant is old or round, then the plant is slow.",
              "If a rose is bad, then the rose is green.",
              "If a rose is weak, then the rose is clean.",
              "If a plant is big and hot, then the plant is young.",
              "If a rose is sad, then the rose is beautiful."],
    "fact": "The rose is frail and ancient.",
    "consequents": "The rose is slow and clean",
}
EXAMPLE_C = {
    "rules": ["If person is happy and strong, then person is cold.",
              "If Erin is blue, then Erin is smart.",
              "If Erin is red or small, then Erin is sad.",
              "If person is slow, then person is clean.",
              "If Erin is fast or young, then Erin is bad."],
    "fact": "Erin is crimson and sad.",
    "consequents": "Nothing",
}
# A half-satisfied `and` rule (cobalt is blue, but not fast), written after REFINER's train item with this fact.
EXAMPLE_D = {
    "rules": ["If a sunflower is round or cold, then the sunflower is hot.",
              "If a sunflower is old or sad, then the sunflower is beautiful.",
              "If a plant is strong, then the plant is small.",
              "If a sunflower is blue and fast, then the sunflower is good.",
              "If a sunflower is red or smart, then the sunflower is slow."],
    "fact": "The sunflower is red and cobalt.",
    "consequents": "The sunflower is slow",
}
GOLD_A = "#0: chill is cold #1: tiger is animal #2: tiger is cold #3: tiger is good"


@pytest.fixture(scope="module")
def task():
    return SNLRTask()


@pytest.fixture(scope="module")
def srn_dir(shared_data):
    path = shared_data / "refiner" / "srn"
    if not path.is_dir():
        pytest.skip(f"REFINER sNLR data not found at {path}")
    return path


@pytest.fixture(scope="module")
def released_raw(srn_dir):
    return {s: json.loads((srn_dir / f"srn_{s}.json").read_text()) for s in SPLIT_SIZES}


@pytest.fixture(scope="module")
def released(task, srn_dir):
    return {s: task.load(s, str(srn_dir)) for s in SPLIT_SIZES}


@pytest.fixture(scope="module")
def generated():
    return generate_records(seed=42, n=11000)


def ex(task, record, uid="hand"):
    return task.example_from_record(record, uid)


# ------------------------------------------------------------------------------------------- generator vs data


def test_generator_reproduces_all_released_instances(generated, released_raw):
    start = 0
    for split, size in SPLIT_SIZES.items():
        raw = released_raw[split]
        assert len(raw) == size
        for i, (ours, theirs) in enumerate(zip(generated[start:start + size], raw)):
            assert (ours["rules"], ours["fact"], ours["consequents"]) == \
                   (theirs["rules"], theirs["fact"], theirs["consequents"]), f"{split}[{i}]"
        start += size


def test_generated_train_matches_released_examples(released):
    ours = SNLRTask(val_size=0, test_size=0).load("train")  # seed 42, REFINER's 1000 train problems
    assert [(e.x, e.y, e.meta) for e in ours] == [(e.x, e.y, e.meta) for e in released["train"]]
    # generated z is our chain; it equals the released one wherever no `and` rule fires (checked below)
    assert sum(a.z == b.z for a, b in zip(ours, released["train"])) >= 984


def test_small_generated_splits_cut_one_stream(released_raw):
    task = SNLRTask(train_size=10, val_size=5, test_size=3)
    loaded = {s: task.load(s) for s in SPLIT_SIZES}
    assert [len(v) for v in loaded.values()] == [10, 5, 3]
    # one stream from seed 42, cut in order: val is records 10-14 of the stream, i.e. released train[10:15]
    assert [e.y for e in loaded["val"]] == [r["consequents"] for r in released_raw["train"][10:15]]
    assert [e.x.split("\nFact:\n")[1].split("\n")[0] for e in loaded["test"]] == \
           [r["fact"] for r in released_raw["train"][15:18]]


def test_generator_counts_match_spec(generated):
    # specs/snlr.md §4 and §5: counts over the 11,000 hard instances of seed 42.
    records = generated
    rules = [r for rec in records for r in rec["rules"]]
    assert sum(r.startswith(("If an animal ", "If a plant ", "If person ")) for r in rules) == 27308
    body = [r.split(" is ", 1)[1].split(", then")[0] for r in rules]
    assert sum(" and " not in b and " or " not in b for b in body) == 27525
    assert sum(" and " in b for b in body) == 13735
    assert sum(" or " in b for b in body) == 13740
    sizes = [0 if rec["consequents"] == "Nothing" else 1 + rec["consequents"].count(" and ") for rec in records]
    per_split = [collections.Counter(sizes[a:b]) for a, b in ((0, 1000), (1000, 6000), (6000, 11000))]
    assert [[c[0], c[1], c[2]] for c in per_split] == [[170, 755, 75], [904, 3731, 365], [836, 3812, 352]]


def test_vocabulary_matches_spec():
    assert len(ATTRIBUTE_GROUPS) == 25 and GENERIC_NAMES[:4] == ("young", "soft", "sad", "scary")
    forms = [f for g in ATTRIBUTE_GROUPS for f in g]
    assert len(forms) == len(set(forms))
    assert not {f for g in ATTRIBUTE_GROUPS for f in g[1:]} & set(GENERIC_NAMES)
    assert [c for c, _ in CATEGORIES] == ["person", "animal", "plant"]
    assert sum(len(e) for _, e in CATEGORIES) == 25


def test_other_seeds_and_difficulties_give_fresh_consistent_data(generated):
    released_rules = {"\n".join(r["rules"]) for r in generated}
    for difficulty in ("easy", "medium", "hard"):
        task = SNLRTask(seed=7, train_size=300, val_size=0, test_size=0, difficulty=difficulty)
        examples = task.load("train")
        assert [e.x for e in examples] == [e.x for e in SNLRTask(seed=7, train_size=300, val_size=0, test_size=0,
                                                                 difficulty=difficulty).load("train")]
        assert not {e.x.split("\nFact:")[0] for e in examples} & released_rules
        nothing = sum(e.y == "Nothing" for e in examples) / len(examples)
        assert 0.08 < nothing < 0.28  # about 17% (specs/snlr.md §5)
        for e in examples:
            assert task.oracle_feedback(e, e.z).text == NO_HINT
            if difficulty != "hard":
                assert e.meta["fact_forms"] == e.meta["fact_attributes"]
            if difficulty == "easy":
                assert not any(r["category_level"] for r in e.meta["rules"])


# ------------------------------------------------------------------------------------------- chains


def test_chain_builder_reproduces_released_explanations(released, released_raw):
    exact, mismatched = 0, []
    for split in SPLIT_SIZES:
        for e, raw in zip(released[split], released_raw[split]):
            if build_chain(e.meta) == raw["explanations"]:
                exact += 1
            else:
                mismatched.append(e)
    assert exact >= 10867  # of 11,000
    # every released chain we do not rebuild fires an `and` rule (those chains carry state leaked across items)
    for e in mismatched:
        fired = [r for r in e.meta["rules"] if r["consequent"] in e.meta["consequents"]]
        assert any(r["connective"] == "and" and len(r["conditions"]) == 2 for r in fired), e.z


def test_hand_rendered_chains(task):
    explicit = SNLRTask(chain_style="explicit")
    a, b, c = (ex(task, r) for r in (EXAMPLE_A, EXAMPLE_B, EXAMPLE_C))
    assert [a.y, b.y, c.y] == ["The tiger is good", "The rose is slow and clean", "Nothing"]
    # specs/snlr.md §9 (explicit style) and REFINER's convention (a lexical step stands in for the condition step
    # of a rule about the entity itself: rule 3 of B fires through "frail is weak").
    assert build_chain(a.meta, "explicit").strip() == GOLD_A
    assert build_chain(b.meta, "explicit").strip() == ("#0: ancient is old #1: rose is plant #2: rose is old "
                                                       "#3: frail is weak #4: rose is weak #5: rose is slow and clean")
    assert build_chain(a.meta).strip() == GOLD_A
    assert build_chain(b.meta).strip() == ("#0: ancient is old #1: rose is plant #2: rose is old "
                                           "#3: frail is weak #4: rose is slow and clean")
    assert build_chain(c.meta).strip() == "#0: The argument is invalid!!"
    assert a.x.split("\n")[-3:] == ["Fact:", "The tiger is chill and huge.",
                                    "The following can be determined about the tiger:"]
    assert c.x.endswith("The following can be determined about Erin:")
    assert explicit.oracle_feedback(b, build_chain(b.meta, "explicit")).text == NO_HINT


def test_split_steps():
    assert split_steps("#0: poppy is plant #1: poppy is beautiful #2: poppy is strong ") == \
        ["poppy is plant", "poppy is beautiful", "poppy is strong"]
    assert split_steps("poppy is strong") == ["poppy is strong"]
    assert split_steps("lead #0: a #1:  #2: b") == ["lead", "a", "b"]
    assert split_steps("") == [] and split_steps("  #0: ") == []


# ------------------------------------------------------------------------------------------- oracle


@pytest.mark.parametrize("hypothesis, expected", [
    (GOLD_A, NO_HINT),
    ("#0:  tiger is animal #1: chill is cold #2: tiger is cold. #3: The tiger is good.", NO_HINT),  # reordered
    ("#0: tiger is animal #1: tiger is cold #2: tiger is good", MISSING_IMPLICIT),
    ("#0: chill is cold #1: tiger is cold #2: tiger is good", MISSING_IMPLICIT),
    ("#0: chill is cold #1: huge is small #2: tiger is animal #3: tiger is cold #4: tiger is good", MISSING_IMPLICIT),
    ("#0: chill is cold #1: tiger is plant #2: tiger is cold #3: tiger is good", MISSING_IMPLICIT),
    ("#0: chill is cold #1: tiger is animal #2: tiger is good", MISSING_LINK),
    ("#0: The argument is invalid!!", MISSING_LINK),
    ("#0: chill is cold #1: tiger is animal #2: tiger is cold #3: tiger is purple", MISSING_LINK),
    ("#0: chill is cold #1: tiger is animal #2: tiger is cold", MISSING_LINK),
    ("complete nonsense", MISSING_LINK),
    ("", MISSING_LINK),
    # rule 3 (young and fast) holds in neither conjunct; rule 5 (smart or red) in neither disjunct
    ("#0: chill is cold #1: tiger is animal #2: tiger is cold #3: tiger is good and blue",
     "The and operator makes inference rule #3 invalid."),
    ("#0: chill is cold #1: tiger is animal #2: tiger is cold #3: tiger is smart #4: tiger is good and soft",
     "The or operator makes inference rule #4 invalid."),
    ("#0: tiger is animal #1: tiger is good",
     f"{MISSING_LINK} {MISSING_IMPLICIT}"),
])
def test_oracle_on_hand_worked_hypotheses(task, hypothesis, expected):
    assert task.oracle_feedback(ex(task, EXAMPLE_A), hypothesis).text == expected


def test_oracle_structured_errors(task):
    a, c, d = ex(task, EXAMPLE_A), ex(task, EXAMPLE_C), ex(task, EXAMPLE_D)
    fb = task.oracle_feedback(a, "#0: tiger is animal #1: tiger is good")
    assert [(e.kind, e.step, e.detail) for e in fb.errors] == [
        ("missing_link", None, "tiger is cold"), ("missing_implicit", None, "chill is cold")]
    assert fb.errors and not fb.ok
    # nothing follows for C: rule 3 fires through "crimson is red" but its consequent is already in the fact
    assert task.oracle_feedback(c, "#0: The argument is invalid!! ").ok
    assert task.oracle_feedback(c, "#0: crimson is red #1: Erin is red #2: Erin is sad").text == MISSING_LINK
    assert task.oracle_feedback(c, "#0: Erin is person #1: Erin is clean").text == MISSING_LINK
    # D: "cobalt is blue" satisfies one conjunct of rule 4 (blue and fast)
    assert task.oracle_feedback(d, "#0: sunflower is red #1: sunflower is slow ").ok
    fb = task.oracle_feedback(d, "#0: cobalt is blue #1: sunflower is red #2: sunflower is slow and good")
    assert fb.text == "The and operator makes inference rule #2 invalid."
    assert [(e.kind, e.step, e.detail) for e in fb.errors] == [("invalid_and", 2, "good")]
    fb = task.oracle_feedback(d, "#0: sunflower is plant #1: sunflower is red #2: sunflower is slow")
    assert fb.ok  # a true but unneeded category step is no error


def test_oracle_accepts_rebuilt_chains_and_flags_leaky_released_ones(task, released, released_raw):
    passed = 0
    for split in SPLIT_SIZES:
        for e, raw in zip(released[split], released_raw[split]):
            assert task.oracle_feedback(e, build_chain(e.meta)).text == NO_HINT
            passed += task.oracle_feedback(e, raw["explanations"]).ok
            # z is the released chain where the oracle accepts it, else the rebuilt one: never a target it rejects
            assert e.z == (raw["explanations"] if task.oracle_feedback(e, raw["explanations"]).ok
                           else build_chain(e.meta))
    assert passed == 10867
    # REFINER train item 3: an `and` rule whose chain states only one conjunct
    item, raw = released["train"][3], released_raw["train"][3]["explanations"]
    assert raw == "#0: giraffe is animal #1: giraffe is clean #2: giraffe is sad "
    errors = task.oracle_feedback(item, raw).errors
    assert [(e.kind, e.detail) for e in errors] == [("missing_link", "giraffe is strong")]
    assert item.z == build_chain(item.meta) != raw


# ------------------------------------------------------------------------------------------- perturbations


@pytest.mark.parametrize("style", CHAIN_STYLES)
def test_each_perturbation_yields_exactly_its_error_kind(released, style):
    task = SNLRTask(chain_style=style)
    rng = random.Random(0)
    made = collections.Counter()
    for e in released["train"]:
        gold = build_chain(e.meta, style)
        for kind in task.perturbation_kinds(e):
            hypothesis, fb = task.perturb(e, rng, kind)
            assert {err.kind for err in fb.errors} == {kind}, (e.z, hypothesis, fb)
            assert hypothesis != gold and fb.text != NO_HINT
            made[kind] += 1
    assert all(made[k] > 200 for k in task.error_kinds), made


def test_perturb_mixture_is_seeded_and_keeps_gold_at_the_configured_rate(released):
    examples = released["train"][:400]
    task = SNLRTask()
    draws = [task.perturb(e, random.Random(i)) for i, e in enumerate(examples * 3)]
    assert draws == [task.perturb(e, random.Random(i)) for i, e in enumerate(examples * 3)]
    unchanged = [h == build_chain(e.meta) and fb.text == NO_HINT for (h, fb), e in zip(draws, examples * 3)]
    assert abs(sum(unchanged) / len(draws) - 0.2) < 0.035
    kinds = collections.Counter(fb.errors[0].kind for _, fb in draws if fb.errors)
    assert set(kinds) == set(task.error_kinds)
    assert all(not task.oracle_feedback(e, h).ok for (h, fb), e in zip(draws, examples * 3) if fb.errors)
    rng = random.Random(3)
    assert all(not SNLRTask(no_change_rate=0.0).perturb(e, rng)[1].ok for e in examples[:100])
    assert all(SNLRTask(no_change_rate=1.0).perturb(e, rng)[1].ok for e in examples[:100])


def test_perturb_rejects_impossible_kind(task):
    c = ex(task, EXAMPLE_C)
    assert "missing_implicit" not in task.perturbation_kinds(c)
    with pytest.raises(ValueError, match="possible"):
        task.perturb(c, random.Random(0), "missing_implicit")


# ------------------------------------------------------------------------------------------- labels, metrics


def test_step_labels_hand_worked(task):
    a = ex(task, EXAMPLE_A)
    assert task.step_labels(a, GOLD_A) == [True] * 4
    wrong_synonym = "#0: chill is cold #1: huge is small #2: tiger is animal #3: tiger is cold #4: tiger is good"
    assert task.step_labels(a, wrong_synonym) == [True, False, False, False, False]
    assert task.step_labels(a, "#0: tiger is animal #1: tiger is cold #2: tiger is good") == [True, True, False]
    assert task.step_labels(a, "#0: tiger is animal #1: tiger is young #2: tiger is good") == [True, False, False]
    assert task.step_labels(a, "") == []
    assert len(task.step_labels(a, GOLD_A)) == len(task.split_steps(GOLD_A))


def test_score_hand_worked(task):
    a, b, c = (ex(task, r) for r in (EXAMPLE_A, EXAMPLE_B, EXAMPLE_C))
    predictions = [
        "#0: chill is cold  #1: tiger is animal #2: tiger is cold #3: tiger is good ",  # exact up to whitespace
        "#0: rose is slow",  # gold {slow, clean}: F1 = 2/3, IoU = 1/2
        "#0: Erin is bad",  # gold {}: F1 = IoU = 0
    ]
    scores = task.score(predictions, [a, b, c])
    assert scores["ir_em"] == pytest.approx(1 / 3)
    assert scores["ir_valid"] == pytest.approx(1 / 3)  # the two wrong chains miss "clean" / derive nothing
    assert scores["consequent_acc"] == pytest.approx(1 / 3)
    assert scores["consequent_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert scores["consequent_iou"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert task.score(["The argument is invalid!!"], [c]) == {
        "ir_em": 0.0, "ir_valid": 1.0, "consequent_acc": 1.0, "consequent_f1": 1.0, "consequent_iou": 1.0}
    assert helm_attribute_set("#0: x #1: The rose is clean and slow.") == {"clean", "slow"}
    with pytest.raises(ValueError):
        task.score(["a"], [a, b])


def test_score_released_gold_is_perfect(task, released):
    examples = released["val"]
    scores = task.score([e.z for e in examples], examples)
    assert scores == {"ir_em": 1.0, "ir_valid": 1.0, "consequent_acc": 1.0, "consequent_f1": 1.0,
                      "consequent_iou": 1.0}


def test_registry_and_critic_input(task):
    assert isinstance(get_task("snlr", no_change_rate=0.1), SNLRTask)
    a = ex(task, EXAMPLE_A)
    assert task.critic_input(a, GOLD_A) == a.x + " " + GOLD_A
    assert isinstance(a, Example) and json.loads(json.dumps(a.meta)) == a.meta


# ------------------------------------------------------------------------------------------- bad data


@pytest.mark.parametrize("content, message", [
    (None, "file not found"),
    ("{not json", "not valid JSON"),
    ("[]", "empty list"),
    ('{"rules": []}', "JSON list of records"),
    ('[{"rules": [], "consequents": "Nothing"}]', "missing key(s) ['fact']"),
    ('[{"rules": ["If a cat is big then."], "fact": "The cat is big and old.", "consequents": "Nothing"}]', "rule"),
    ('[{"rules": ["If a cat is big, then the cat is red."], "fact": "The cat is huge and slimy.", '
     '"consequents": "Nothing"}]', "slimy"),
    ('[{"rules": ["If a cat is big, then the cat is red."], "fact": "The cat is huge and old.", '
     '"consequents": "Nothing"}]', "disagree"),
])
def test_bad_data_files_raise_data_error(task, tmp_path, content, message):
    if content is not None:
        (tmp_path / "srn_val.json").write_text(content)
    with pytest.raises(DataError) as info:
        task.load("val", str(tmp_path))
    assert str(tmp_path / "srn_val.json") in str(info.value)
    assert message in str(info.value)


def test_bad_options(task):
    with pytest.raises(ValueError):
        task.load("dev")
    with pytest.raises(ValueError):
        SNLRTask(chain_style="fancy")
    with pytest.raises(ValueError):
        SNLRTask(train_size=-1)


# ------------------------------------------------------------------------------------------- properties

_WORDS = ["tiger", "animal", "plant", "Erin", "person", "cold", "chill", "huge", "big", "good", "blue", "soft",
          "is", "and", "or", "the", "The", "argument", "invalid!!", "#1:", "#0:", "Nothing", ".", "", "x"]


@st.composite
def mutated_hypothesis(draw):
    steps = split_steps(GOLD_A)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["drop", "dup", "swap", "word", "insert", "cut"]))
        if op == "drop" and steps:
            steps.pop(draw(st.integers(0, len(steps) - 1)))
        elif op == "dup" and steps:
            steps.insert(0, steps[draw(st.integers(0, len(steps) - 1))])
        elif op == "swap" and len(steps) > 1:
            i, j = draw(st.integers(0, len(steps) - 1)), draw(st.integers(0, len(steps) - 1))
            steps[i], steps[j] = steps[j], steps[i]
        elif op == "word" and steps and steps[-1].split():
            words = steps[-1].split() if draw(st.booleans()) else steps[0].split() or ["x"]
            words[draw(st.integers(0, len(words) - 1))] = draw(st.sampled_from(_WORDS))
            steps[draw(st.sampled_from([0, -1]))] = " ".join(words)
        elif op == "insert":
            words = draw(st.lists(st.sampled_from(_WORDS), max_size=6))
            steps.insert(draw(st.integers(0, len(steps))), " ".join(words))
    text = "".join(f"#{k}: {s} " for k, s in enumerate(steps))
    if draw(st.booleans()):
        text = text[:draw(st.integers(0, len(text)))]
    return text


def _check_consistent(task, example, hypothesis):
    fb = task.oracle_feedback(example, hypothesis)
    steps = task.split_steps(hypothesis)
    labels = task.step_labels(example, hypothesis)
    scores = task.score([hypothesis], [example])
    assert fb == task.oracle_feedback(example, hypothesis) and labels == task.step_labels(example, hypothesis)
    assert len(labels) == len(steps)
    assert {e.kind for e in fb.errors} <= set(task.error_kinds)
    assert fb.ok == (fb.text == NO_HINT)
    assert all(0.0 <= v <= 1.0 for v in scores.values())
    assert labels == sorted(labels, reverse=True)  # prefix labels: once wrong, wrong after
    assert (bool(labels) and labels[-1]) == fb.ok
    if fb.ok:  # soundness: an accepted hypothesis concludes exactly the gold consequents
        assert read_conclusion(steps[-1], example.meta) == set(example.meta["consequents"])
        assert scores["consequent_acc"] == 1.0
    task.critic_input(example, hypothesis)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hypothesis=mutated_hypothesis())
def test_property_mutated_hypotheses(task, hypothesis):
    _check_consistent(task, ex(task, EXAMPLE_A), hypothesis)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hypothesis=st.text(max_size=80), which=st.sampled_from([EXAMPLE_A, EXAMPLE_B, EXAMPLE_C, EXAMPLE_D]))
def test_property_random_text(task, hypothesis, which):
    _check_consistent(task, ex(task, which), hypothesis)


def test_ir_valid_counts_chains_the_oracle_accepts_ir_em_only_the_gold_string(task):
    example = task.example_from_record({
        "rules": ["If a plant is old or round, then the plant is slow.", "If a rose is bad, then the rose is green.",
                  "If a rose is weak, then the rose is clean.", "If a plant is big and hot, then the plant is young.",
                  "If a rose is sad, then the rose is beautiful."],
        "fact": "The rose is frail and ancient.", "consequents": "The rose is slow and clean"}, "b")
    # Worked by hand: ancient -> old, a rose is a plant, so slow (rule 1); frail -> weak, so clean (rule 3).
    valid_not_gold = [
        "#0: frail is weak #1: ancient is old #2: rose is plant #3: rose is old #4: rose is slow and clean",
        "#0: ancient is old #1: rose is plant #2: rose is old #3: frail is weak #4: rose is clean and slow",
    ]
    wrong = "#0: ancient is old #1: rose is plant #2: rose is old #3: rose is slow"  # never derives "clean"
    for chain in valid_not_gold:
        assert task.oracle_feedback(example, chain).text == "No hint"
        assert task.score([chain], [example])["ir_valid"] == 1.0 and task.score([chain], [example])["ir_em"] == 0.0
    assert task.score([wrong], [example])["ir_valid"] == 0.0
    assert task.score([example.z], [example])["ir_em"] == task.score([example.z], [example])["ir_valid"] == 1.0
