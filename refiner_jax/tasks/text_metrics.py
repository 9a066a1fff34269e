"""ROUGE-L and BLEU in pure Python, for scoring generated text (norms, actions) against references.

Conventions follow the widely used implementations so numbers are comparable with published ones:

- `tokenize` lower-cases and splits on every non-alphanumeric character (the ROUGE tokenizer convention;
  "they're" -> ["they", "re"]). Both metrics accept a string (tokenized this way) or a ready token sequence.
- ROUGE-L is the longest-common-subsequence F1 (precision = LCS/|hyp|, recall = LCS/|ref|); with several
  references the best-scoring one counts.
- BLEU (Papineni et al. 2002) clips n-gram counts by the maximum count in any reference and uses the closest
  reference length (ties to the shorter) for the brevity penalty. Corpus BLEU sums statistics over sentences.
  Sentence BLEU offers the smoothing methods of Chen & Cherry (2014): "none", "floor" (method 1), "add-k"
  (method 2) and "exp" (method 3, the NIST geometric decay), and the "effective order" rule (average only over
  the n-gram orders the hypothesis is long enough to have).

All scores are in [0, 1] (not percentages).
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Iterable, Sequence

_NON_ALNUM = re.compile(r"[^a-z0-9]+")
SMOOTHING = ("none", "floor", "add-k", "exp")


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric tokens of `text`."""
    return [t for t in _NON_ALNUM.split(text.lower()) if t]


def _tokens(text: str | Sequence[str]) -> list[str]:
    return tokenize(text) if isinstance(text, str) else list(text)


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token sequences (O(|a|·|b|) time, O(|b|) memory)."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            cur[j] = prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1])
        prev = cur
    return prev[-1]


@dataclasses.dataclass(frozen=True)
class PRF:
    precision: float
    recall: float
    f1: float


def rouge_l(hypothesis: str | Sequence[str], reference: str | Sequence[str]) -> PRF:
    """Sentence-level ROUGE-L of `hypothesis` against one reference; all zeros when either is empty."""
    hyp, ref = _tokens(hypothesis), _tokens(reference)
    lcs = lcs_length(hyp, ref)
    if lcs == 0:
        return PRF(0.0, 0.0, 0.0)
    p, r = lcs / len(hyp), lcs / len(ref)
    return PRF(p, r, 2 * p * r / (p + r))


def rouge_l_multi(hypothesis: str | Sequence[str], references: Iterable[str | Sequence[str]]) -> PRF:
    """ROUGE-L against the reference giving the highest F1 (zeros when there is none)."""
    best = PRF(0.0, 0.0, 0.0)
    for ref in references:
        s = rouge_l(hypothesis, ref)
        if s.f1 > best.f1:
            best = s
    return best


def ngram_counts(tokens: Sequence[str], n: int) -> collections.Counter:
    """Multiset of the n-grams (as tuples) of `tokens`."""
    return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


@dataclasses.dataclass(frozen=True)
class BleuStats:
    """Sufficient statistics of BLEU: clipped matches and totals per order, hypothesis and reference length."""

    matches: tuple[int, ...]
    totals: tuple[int, ...]
    hyp_len: int
    ref_len: int

    def __add__(self, other: "BleuStats") -> "BleuStats":
        return BleuStats(
            tuple(a + b for a, b in zip(self.matches, other.matches)),
            tuple(a + b for a, b in zip(self.totals, other.totals)),
            self.hyp_len + other.hyp_len,
            self.ref_len + other.ref_len,
        )


def _closest_ref_len(hyp_len: int, ref_lens: Sequence[int]) -> int:
    return min(ref_lens, key=lambda r: (abs(r - hyp_len), r))


def bleu_stats(hypothesis: str | Sequence[str], references: Sequence[str | Sequence[str]],
               max_order: int = 4) -> BleuStats:
    """BLEU statistics of one hypothesis against its references (at least one)."""
    if not references:
        raise ValueError("bleu_stats needs at least one reference")
    hyp = _tokens(hypothesis)
    refs = [_tokens(r) for r in references]
    matches, totals = [], []
    for n in range(1, max_order + 1):
        h = ngram_counts(hyp, n)
        max_ref: collections.Counter = collections.Counter()
        for r in refs:
            max_ref |= ngram_counts(r, n)  # element-wise max over references
        matches.append(sum(min(c, max_ref[g]) for g, c in h.items()))
        totals.append(max(len(hyp) - n + 1, 0))
    return BleuStats(tuple(matches), tuple(totals), len(hyp), _closest_ref_len(len(hyp), [len(r) for r in refs]))


def bleu_from_stats(stats: BleuStats, smooth: str = "none", smooth_value: float | None = None,
                    effective_order: bool = False) -> float:
    """BLEU in [0, 1] from statistics. `smooth_value` defaults to 0.1 for "floor" and 1 for "add-k"."""
    if smooth not in SMOOTHING:
        raise ValueError(f"unknown smoothing {smooth!r}; choose one of {SMOOTHING}")
    if stats.hyp_len == 0 or not any(stats.matches):
        return 0.0
    if smooth_value is None:
        smooth_value = 0.1 if smooth == "floor" else 1.0
    log_sum, orders, exp_denominator = 0.0, 0, 1.0
    for n, (m, t) in enumerate(zip(stats.matches, stats.totals), start=1):
        m, t = float(m), float(t)
        if smooth == "add-k" and n > 1:
            m, t = m + smooth_value, t + smooth_value
        if t == 0:
            if effective_order:
                break
            return 0.0
        if m == 0:
            if smooth == "floor":
                m = smooth_value
            elif smooth == "exp":
                exp_denominator *= 2
                m = 1.0 / exp_denominator
            else:
                return 0.0
        log_sum += math.log(m / t)
        orders += 1
    bp = 1.0 if stats.hyp_len >= stats.ref_len else math.exp(1.0 - stats.ref_len / stats.hyp_len)
    return bp * math.exp(log_sum / orders)


def sentence_bleu(hypothesis: str | Sequence[str], references: Sequence[str | Sequence[str]],
                  max_order: int = 4, smooth: str = "exp", smooth_value: float | None = None,
                  effective_order: bool = True) -> float:
    """Smoothed BLEU of one sentence (defaults: "exp" smoothing with effective order, the usual sentence-level
    setting); pass `smooth="none", effective_order=False` for the unsmoothed definition."""
    return bleu_from_stats(bleu_stats(hypothesis, references, max_order), smooth, smooth_value, effective_order)


def corpus_bleu(hypotheses: Sequence[str | Sequence[str]], references: Sequence[Sequence[str | Sequence[str]]],
                max_order: int = 4, smooth: str = "none", smooth_value: float | None = None) -> float:
    """Corpus BLEU: statistics summed over sentence pairs; `references[i]` lists the references of hypothesis i."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    if not hypotheses:
        return 0.0
    total = BleuStats((0,) * max_order, (0,) * max_order, 0, 0)
    for h, refs in zip(hypotheses, references):
        total = total + bleu_stats(h, refs, max_order)
    return bleu_from_stats(total, smooth, smooth_value, effective_order=False)
