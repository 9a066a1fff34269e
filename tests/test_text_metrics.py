"""ROUGE-L and BLEU against hand-worked values (and, when installed, the reference packages)."""
import functools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refiner_jax.tasks import text_metrics as tm

REF = "the cat is on the mat"
HYP = "the cat sat on the mat"


def test_tokenize_lowercases_and_splits_on_punctuation():
    assert tm.tokenize("You should help others when they're in DANGER.") == [
        "you", "should", "help", "others", "when", "they", "re", "in", "danger"]
    assert tm.tokenize("  ,;  ") == []


def test_rouge_l_hand_worked():
    # LCS(the cat sat on the mat, the cat is on the mat) = "the cat on the mat" = 5 of 6 tokens each way.
    s = tm.rouge_l(HYP, REF)
    assert s.precision == pytest.approx(5 / 6) and s.recall == pytest.approx(5 / 6) and s.f1 == pytest.approx(5 / 6)
    # Lin (2004)'s example: reference "police killed the gunman".
    assert tm.rouge_l("police kill the gunman", "police killed the gunman").f1 == pytest.approx(3 / 4)
    assert tm.rouge_l("the gunman kill police", "police killed the gunman").f1 == pytest.approx(2 / 4)
    # unequal lengths: LCS 2, P = 2/4, R = 2/2, F = 2PR/(P+R) = 2/3
    s = tm.rouge_l("a b c d", "a c")
    assert (s.precision, s.recall, s.f1) == pytest.approx((0.5, 1.0, 2 / 3))
    assert tm.rouge_l("", REF).f1 == 0.0 and tm.rouge_l("dog", REF).f1 == 0.0
    assert tm.rouge_l(["The", "cat"], ["The", "cat"]).f1 == 1.0  # token lists are used as given
    assert tm.rouge_l_multi("police kill the gunman", ["a b", "police killed the gunman"]).f1 == pytest.approx(0.75)
    assert tm.rouge_l_multi("x", []).f1 == 0.0


def test_bleu_hand_worked():
    # clipped n-gram matches of HYP against REF: 1-grams 5/6, 2-grams 3/5, 3-grams 1/4, 4-grams 0/3; BP = 1
    stats = tm.bleu_stats(HYP, [REF])
    assert stats.matches == (5, 3, 1, 0) and stats.totals == (6, 5, 4, 3)
    assert tm.sentence_bleu(HYP, [REF], smooth="none", effective_order=False) == 0.0
    assert tm.sentence_bleu(HYP, [REF], max_order=2, smooth="none") == pytest.approx(math.sqrt(5 / 6 * 3 / 5))
    # floor: p4 = 0.1/3 -> (5/6 * 3/5 * 1/4 * 1/30) ** (1/4) = 240 ** -0.25
    assert tm.sentence_bleu(HYP, [REF], smooth="floor") == pytest.approx(240 ** -0.25)
    # exp: the first zero order gets 1/(2 * total) = 1/6 -> (1/8 * 1/6) ** (1/4)
    assert tm.sentence_bleu(HYP, [REF], smooth="exp") == pytest.approx(48 ** -0.25)
    # add-k (k=1) on orders >= 2: 5/6, 4/6, 2/5, 1/4 -> product 1/18
    assert tm.sentence_bleu(HYP, [REF], smooth="add-k") == pytest.approx(18 ** -0.25)


def test_bleu_brevity_clipping_and_reference_length():
    # c = 2 < r = 6: BP = exp(1 - 6/2); both precisions are 1
    assert tm.sentence_bleu("the cat", [REF], max_order=2, smooth="none") == pytest.approx(math.exp(-2))
    # Papineni's clipping example: "the" x7 against a reference with two "the"
    assert tm.sentence_bleu("the " * 7, [REF], max_order=1, smooth="none") == pytest.approx(2 / 7)
    # reference lengths 3 and 7 are equally close to 5: the shorter one counts, so no brevity penalty
    assert tm.sentence_bleu("a b c d e", ["a b c", "a b c d e f g"], max_order=1, smooth="none") == 1.0
    # effective order: a 2-token hypothesis is scored on orders 1-2 only
    assert tm.sentence_bleu("the cat", ["the cat"]) == 1.0
    assert tm.sentence_bleu("the cat", ["the cat"], smooth="none", effective_order=False) == 0.0
    assert tm.sentence_bleu("", [REF]) == 0.0


def test_corpus_bleu_sums_statistics():
    # unigram matches 2 + 2 of 4, c = 4, r = 2 + 3 = 5: BLEU-1 = exp(1 - 5/4)
    assert tm.corpus_bleu(["the cat", "a dog"], [["the cat"], ["a dog barks"]], max_order=1) == pytest.approx(
        math.exp(-0.25))
    assert tm.corpus_bleu([], []) == 0.0
    with pytest.raises(ValueError, match="reference lists"):
        tm.corpus_bleu(["a"], [])
    with pytest.raises(ValueError, match="at least one reference"):
        tm.bleu_stats("a", [])
    with pytest.raises(ValueError, match="unknown smoothing"):
        tm.sentence_bleu("a", ["a"], smooth="laplace")


@functools.lru_cache(maxsize=None)
def _lcs_reference(a: tuple, b: tuple) -> int:
    if not a or not b:
        return 0
    if a[0] == b[0]:
        return 1 + _lcs_reference(a[1:], b[1:])
    return max(_lcs_reference(a[1:], b), _lcs_reference(a, b[1:]))


tokens = st.lists(st.sampled_from("a b c d the cat".split()), max_size=9)
texts = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=60)


@settings(max_examples=200, deadline=None)
@given(tokens, tokens)
def test_lcs_matches_a_recursive_reference(a, b):
    assert tm.lcs_length(a, b) == _lcs_reference(tuple(a), tuple(b))


@settings(max_examples=200, deadline=None)
@given(texts, texts, st.sampled_from(tm.SMOOTHING), st.booleans())
def test_metrics_are_bounded_symmetric_and_deterministic(h, r, smooth, eff):
    s = tm.rouge_l(h, r)
    assert 0.0 <= s.f1 <= 1.0 and s == tm.rouge_l(h, r)
    assert s.f1 == pytest.approx(tm.rouge_l(r, h).f1)
    b = tm.sentence_bleu(h, [r], smooth=smooth, effective_order=eff)
    assert 0.0 <= b <= 1.0 + 1e-12 and b == tm.sentence_bleu(h, [r], smooth=smooth, effective_order=eff)
    if tm.tokenize(h):
        assert tm.rouge_l(h, h).f1 == 1.0
        assert tm.sentence_bleu(h, [h]) == pytest.approx(1.0)


def _random_sentences(seed, n):
    rng = random.Random(seed)
    words = "the a cat dog sat on mat you should help others when they're in danger it's good to".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(n)]


def test_rouge_l_matches_rouge_score_package():
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    hyps, refs = _random_sentences(0, 300), _random_sentences(1, 300)
    for h, r in zip(hyps, refs):
        ref = scorer.score(r, h)["rougeL"]
        mine = tm.rouge_l(h, r)
        assert (mine.precision, mine.recall, mine.f1) == pytest.approx((ref.precision, ref.recall, ref.fmeasure))


def test_bleu_matches_sacrebleu_package():
    import sacrebleu

    hyps, refs, refs2 = _random_sentences(2, 200), _random_sentences(3, 200), _random_sentences(4, 200)
    join = lambda s: " ".join(tm.tokenize(s))  # noqa: E731  (sacrebleu with tokenize="none" on our tokens)
    for smooth in tm.SMOOTHING:
        for eff in (True, False):
            metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method=smooth, effective_order=eff)
            for h, r, r2 in zip(hyps, refs, refs2):
                ref = metric.sentence_score(join(h), [join(r), join(r2) or "x"]).score / 100
                assert tm.sentence_bleu(h, [r, r2 or "x"], smooth=smooth, effective_order=eff) == pytest.approx(
                    ref, abs=1e-9)
    for smooth in ("none", "exp"):
        corpus = sacrebleu.corpus_bleu([join(h) for h in hyps], [[join(r) for r in refs]], tokenize="none",
                                       smooth_method=smooth).score
        assert tm.corpus_bleu(hyps, [[r] for r in refs], smooth=smooth) == pytest.approx(corpus / 100, abs=1e-9)
    assert tm.corpus_bleu(hyps, [[r] for r in refs], smooth="exp") > 0
