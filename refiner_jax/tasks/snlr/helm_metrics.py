"""HELM's answer metrics for sNLR: the attribute set a chain's last step concludes (`helm_attribute_set`) and
the set F1 and IoU of two such sets."""
from __future__ import annotations

from refiner_jax.tasks.snlr.chains import _NOTHING_TEXTS, split_steps


def helm_attribute_set(text: str) -> frozenset:
    """HELM's reading of an answer, applied to a chain's last step: no-conclusion sentences give the empty set;
    otherwise drop periods, keep the text after the last " is " and split on " and " (first line only)."""
    steps = split_steps(text)
    if not steps:
        return frozenset()
    line = steps[-1].split("\n")[0].strip().lower()
    if line.rstrip(".!").strip() in _NOTHING_TEXTS:
        return frozenset()
    tail = line.replace(".", "").split(" is ")[-1]
    return frozenset(a.strip() for a in tail.split(" and ") if a.strip())


def set_f1(gold: frozenset, predicted: frozenset) -> float:
    """HELM's F1 = 2|G∩P| / (|G|+|P|); 1 when both are empty."""
    if not gold and not predicted:
        return 1.0
    return 2 * len(gold & predicted) / (len(gold) + len(predicted))


def set_iou(gold: frozenset, predicted: frozenset) -> float:
    """HELM's IoU = |G∩P| / |G∪P|; 1 when both are empty."""
    if not gold and not predicted:
        return 1.0
    return len(gold & predicted) / len(gold | predicted)


def _normalise_ws(text: str) -> str:
    return " ".join(text.split())
