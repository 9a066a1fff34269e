"""What a joint round's revisions did, counted against the task's step checker: why revising from the located step
helps or does not on top of reranking.

For the problems it revised: how often the critic had a hint at all and a sentence about the located step, and how
often that sentence was the oracle's (the task's check against the gold) about the same step; how often the
verifier's best sample (what the revision competes with) had a wrong step, the located step was that first wrong
step, and the forced prefix (the steps before the located one) held only right steps, so that a revision could still
reach the right derivation; how often a revision's answer was right (any round's), and right where the best
sample's was wrong (what a perfect judge among them could fix), how often the verifier kept a revision, and what
keeping it fixed and broke against the best sample. The location and the critic's words are the first round's.
"""
from __future__ import annotations

from typing import Sequence

from refiner_jax.joint.locate_explain_revise import JointResult
from refiner_jax.reward.first_error import gold_first_error
from refiner_jax.tasks.base import Example, Task, feedback_sentences, is_no_hint, sentences_about


def revision_stats(examples: Sequence[Example], result: JointResult, task: Task) -> dict[str, int]:
    """Counts over the problems `result` revised (a revision was written): see the module docstring. Keys:
    `revised`, `critic_hint`, `critic_names_located_step`, `critic_right_about_located` (among the previous),
    `best_has_wrong_step`, `located_first_error`, `prefix_all_right` (the last two among `best_has_wrong_step`),
    `best_right`, `revision_right`, `revision_right_best_wrong`, `kept`, `kept_right`, `fixed`, `broken` (the last
    two against the best sample)."""
    counts = dict.fromkeys(("revised", "critic_hint", "critic_names_located_step", "critic_right_about_located",
                            "best_has_wrong_step", "located_first_error", "prefix_all_right", "best_right",
                            "revision_right", "revision_right_best_wrong", "kept", "kept_right", "fixed", "broken"),
                           0)
    for i, (ex, revision) in enumerate(zip(examples, result.revisions)):
        if revision is None:
            continue
        best, located, said = result.best[i], result.located[i], result.critic_said[i]
        best_right = task.outcome_label(ex, best)
        revision_right = any(task.outcome_label(ex, z) for z in result.rounds[i])
        kept = bool(result.kept[i])
        chosen_right = task.outcome_label(ex, result.chosen[i]) if kept else best_right
        first_wrong = gold_first_error(task.step_labels(ex, best), best_right)
        counts["revised"] += 1
        counts["critic_hint"] += bool(said) and not is_no_hint(said)
        about = sentences_about(said, located) if said else ""
        counts["critic_names_located_step"] += bool(about)
        counts["critic_right_about_located"] += bool(about) and feedback_sentences(about) == feedback_sentences(
            sentences_about(task.oracle_feedback(ex, best).text, located))
        counts["best_has_wrong_step"] += first_wrong >= 0
        counts["located_first_error"] += first_wrong >= 0 and located == first_wrong
        counts["prefix_all_right"] += first_wrong >= 0 and located <= first_wrong
        counts["best_right"] += best_right
        counts["revision_right"] += revision_right
        counts["revision_right_best_wrong"] += revision_right and not best_right
        counts["kept"] += kept
        counts["kept_right"] += kept and chosen_right
        counts["fixed"] += chosen_right and not best_right
        counts["broken"] += best_right and not chosen_right
    return counts
