"""`MoralStoriesTask`: Moral Stories norm generation as a REFINER task.

Data: `actor_{dev,test}.json`, lists of `{"id", "actor_input", "actor_output"}` with `actor_input = "<|SIT|>
situation <|INT|> intention <|I_ACT|> immoral action <|NRM|>"` and `actor_output = "norm <|M_ACT|> moral action"`.
The training file of the original release is not available, so this task **trains on dev and tests on test**:
`load("train")` is dev minus a seeded held-out slice of `val_size` stories, `load("val")` is that slice. Any other
source (`data_sources`: data files named by split, `train=PATH,test=PATH`, a hub name such as
`demelin/moral_stories:full`) gives its train split (less the same slice) and its test split, in REFINER's actor
fields or the dataset's own story fields (`dataset_rows.moral_record`).

- Example: `x` = actor input, `z` = the norm (the hypothesis the critic judges), `y` = the moral action. The
  generator's full target is `target(example)` = `"{norm} <|M_ACT|> {moral action}"`; `split_output` cuts a
  generated text back into (norm, action).
- Oracle (`oracle_feedback`): the hypothesis norm's action (`norms.parse_norm`) must overlap the gold action (F1 of
  content-word stems >= `align_threshold`), else `Semantically misaligned: "<gold action>".`; when both
  polarities are known and differ, "Contradiction."; otherwise "No hint". The upstream critic data adds "not " to
  the misaligned phrase when polarities also differ; this task keeps the phrase as written in the gold norm.
- Perturbations (`perturb`), without any downloaded model: the gold norm or a same-polarity rewording ("No
  hint"), a rewording with the opposite judgment ("Contradiction."), or a verb phrase from the story
  (`verb_phrases`) under a random judgment (semantic misalignment).
"""
from __future__ import annotations

import json
import pathlib
import random
import re
from typing import Sequence

from refiner_jax.tasks import data_sources, dataset_rows, text_metrics
from refiner_jax.tasks.base import (NO_HINT, DataError, Example, Feedback, StepError, Task, raise_problems,
                                    shared_data_dir)
from refiner_jax.tasks.moral_stories.norms import (ParsedNorm, _clean, _strip_end, action_overlap, content_stems,
                                                   parse_norm, render_norm)
from refiner_jax.tasks.moral_stories.verb_phrases import story_verb_phrases

TAGS = ("<|SIT|>", "<|INT|>", "<|I_ACT|>", "<|NRM|>", "<|M_ACT|>")  # special tokens for the tokenizer
M_ACT = "<|M_ACT|>"
SPLIT_FILES = {"train": "actor_dev.json", "val": "actor_dev.json", "test": "actor_test.json"}
CONTRADICTION = "Contradiction."
_INPUT = re.compile(r"^\s*<\|SIT\|>(.*?)<\|INT\|>(.*?)<\|I_ACT\|>(.*?)<\|NRM\|>\s*$", re.S)


def default_data_dir() -> pathlib.Path:
    """`$REFINER_DATA/refiner/moral_stories`, else the shared datasets beside the checkout."""
    return pathlib.Path(shared_data_dir("refiner", "moral_stories"))


def split_output(text: str) -> tuple[str, str]:
    """(norm, moral action) of a generator output `"{norm} <|M_ACT|> {action}"`; action "" without the tag."""
    norm, _, action = text.partition(M_ACT)
    return norm.strip(), action.strip()


def parse_input(actor_input: str) -> dict[str, str] | None:
    """The situation, intention and immoral action of an actor input, or None when the tags are not there."""
    m = _INPUT.match(actor_input)
    if not m:
        return None
    return {"situation": m.group(1).strip(), "intention": m.group(2).strip(), "immoral_action": m.group(3).strip()}


def read_actor_file(path: pathlib.Path) -> list[dict]:
    """Validated records of an `actor_*.json` file; `DataError` names the file, record and what was expected."""
    expected = "a JSON list of {\"id\", \"actor_input\", \"actor_output\"} records"
    if not path.is_file():
        raise DataError(f"{path}: file not found; expected {expected} (pass data_dir= or set REFINER_DATA)")
    try:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); expected {expected}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start + 1}); save it as UTF-8; expected {expected}") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply; expected {expected}") from None
    if not isinstance(records, list) or not records:
        got = "an empty list" if records == [] else type(records).__name__
        raise DataError(f"{path}: expected {expected}, got {got}")
    problems = [p for p in (_record_problem(path, i, rec) for i, rec in enumerate(records)) if p]
    raise_problems(problems, str(path))
    return records


def _record_problem(path, i: int | None, rec) -> str | None:
    """What is wrong with record `i` of an actor file (`i` None: `path` names the record), or None."""
    where = f"{path}" if i is None else f"{path}: record {i}"
    if not isinstance(rec, dict):
        return (f"{where}: a JSON {type(rec).__name__}; expected an object with 'id', 'actor_input', "
                "'actor_output'")
    wrong = [k for k in ("id", "actor_input", "actor_output") if not isinstance(rec.get(k), str)]
    if wrong:
        return (f"{where}: field '{wrong[0]}' is not a string; expected string fields 'id', "
                "'actor_input', 'actor_output'")
    if parse_input(rec["actor_input"]) is None:
        return (f"{where} ({rec['id']!r}): 'actor_input' must read "
                "'<|SIT|> ... <|INT|> ... <|I_ACT|> ... <|NRM|>'")
    if rec["actor_output"].count(M_ACT) != 1 or not all(split_output(rec["actor_output"])):
        return f"{where} ({rec['id']!r}): 'actor_output' must read 'norm <|M_ACT|> action'"
    return None


def _dataset_records(source: str, split: str) -> tuple[str, list[dict]]:
    """(where, actor records) of `split` of data files or a hub dataset (`data_sources`), each row checked like a
    record of REFINER's files."""
    where, rows = data_sources.split_rows(source, split)
    records, problems = [], []
    for i, row in enumerate(rows):
        try:
            record = dataset_rows.moral_record(row, f"{where}: row {i + 1}")
        except DataError as e:
            problems.append(str(e))
            continue
        problem = _record_problem(f"{where}: row {i + 1}", None, record)
        if problem:
            problems.append(problem)
        records.append(record)
    raise_problems(problems, where)
    if not records:
        raise DataError(f"{where}: no records; expected Moral Stories rows")
    return where, records

class MoralStoriesTask(Task):
    """Moral Stories norms with the parser, oracle and perturbations described in the module docstring."""

    name = "moral_stories"
    error_kinds = ("contradiction", "misaligned")
    primary_metric = "norm_rougeL"
    special_tokens = TAGS

    def __init__(self, no_change_rate: float = 0.2, val_size: int = 100, seed: int = 0,
                 align_threshold: float = 0.5, data_dir: str | None = None):
        if not 0.0 <= no_change_rate <= 1.0:
            raise ValueError(f"no_change_rate must be in [0, 1], got {no_change_rate}")
        if not 0.0 < align_threshold <= 1.0:
            raise ValueError(f"align_threshold must be in (0, 1], got {align_threshold}")
        if val_size < 0:
            raise ValueError(f"val_size must be >= 0, got {val_size}")
        self.no_change_rate, self.val_size, self.seed = no_change_rate, val_size, seed
        self.align_threshold, self.data_dir = align_threshold, data_dir

    # -- data

    def load(self, split: str, data_dir: str | None = None, **kwargs) -> list[Example]:
        if split not in SPLIT_FILES:
            raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLIT_FILES)}")
        if kwargs:
            raise TypeError(f"unexpected options {sorted(kwargs)}; set val_size/seed on the task")
        root = str(data_dir or self.data_dir or default_data_dir())
        if data_sources.reads_own_files(root, set(SPLIT_FILES.values())):
            where = pathlib.Path(root) / SPLIT_FILES[split]
            records = read_actor_file(where)
        else:
            where, records = _dataset_records(root, "test" if split == "test" else "train")
        indices = list(range(len(records)))
        if split in ("train", "val"):
            if self.val_size >= len(records):
                raise DataError(f"{where}: {len(records)} stories cannot spare val_size={self.val_size}")
            held_out = set(random.Random(self.seed).sample(indices, self.val_size))
            indices = sorted(held_out) if split == "val" else [i for i in indices if i not in held_out]
        return [self._example(records[i]) for i in indices]

    @staticmethod
    def _example(rec: dict) -> Example:
        norm, action = split_output(rec["actor_output"])
        return Example(uid=rec["id"], x=rec["actor_input"].strip(), z=norm, y=action,
                       meta=parse_input(rec["actor_input"]))

    # -- texts

    @staticmethod
    def target(example: Example) -> str:
        """The generator's full target: `"{norm} <|M_ACT|> {moral action}"`."""
        return f"{example.z} {M_ACT} {example.y}"

    def critic_input(self, example: Example, hypothesis: str) -> str:
        """Story, candidate norm and the gold moral action: `"<|SIT|> ... <|NRM|> {norm} <|M_ACT|> {action}"`."""
        return f"{example.x} {split_output(hypothesis)[0]} {M_ACT} {example.y}"

    def split_steps(self, hypothesis: str) -> list[str]:
        """One step, the norm (the moral action after `<|M_ACT|>` is not a reasoning step)."""
        return [split_output(hypothesis)[0]]

    def step_labels(self, example: Example, hypothesis: str) -> list[bool]:
        return [self.outcome_label(example, hypothesis)]

    def outcome_label(self, example: Example, hypothesis: str) -> bool:
        """The norm is the gold one's in substance: the oracle finds it aligned and of the same judgment."""
        return self.oracle_feedback(example, hypothesis).ok

    def answer_key(self, example: Example, hypothesis: str) -> tuple[str, int | None] | None:
        """The norm's judged action (lower-cased, end punctuation dropped) and judgment (+1/-1, None when the
        norm states none); None for an empty norm. Rewordings of one judgment on one action vote together."""
        parsed = parse_norm(split_output(hypothesis)[0]) if isinstance(hypothesis, str) else None
        if parsed is None or not parsed.action.strip():
            return None
        return _strip_end(parsed.action.strip()).lower(), parsed.polarity

    # -- oracle

    def oracle_feedback(self, example: Example, hypothesis: str) -> Feedback:
        norm = split_output(hypothesis)[0]
        if _strip_end(_clean(norm)).lower() == _strip_end(_clean(example.z)).lower():
            return Feedback((), NO_HINT)
        gold, hyp = parse_norm(example.z), parse_norm(norm)
        if not content_stems(norm) or action_overlap(hyp.action, gold.action) < self.align_threshold:
            phrase = _strip_end(gold.phrase).lower()
            return Feedback((StepError("misaligned", 0, phrase),), f'Semantically misaligned: "{phrase}".')
        if gold.polarity is not None and hyp.polarity is not None and gold.polarity != hyp.polarity:
            return Feedback((StepError("contradiction", 0),), CONTRADICTION)
        return Feedback((), NO_HINT)

    # -- perturbation

    def perturb(self, example: Example, rng: random.Random) -> tuple[str, Feedback]:
        """At rate `no_change_rate` the gold norm or a same-judgment rewording; otherwise, with equal chance, a
        contradiction (opposite judgment on the gold action) or a misaligned norm (a story verb phrase under a
        random judgment). Feedback is the oracle's verdict; a candidate the oracle accepts is not returned as
        a mistake."""
        gold = parse_norm(example.z)
        if rng.random() < self.no_change_rate:
            if gold.polarity is not None and rng.random() < 0.5:
                candidate = render_norm(gold.action, gold.polarity, gold.form, rng)
                if self.oracle_feedback(example, candidate).ok:
                    return candidate, Feedback((), NO_HINT)
            return example.z, Feedback((), NO_HINT)
        kinds = ["contradiction", "misaligned"]
        if rng.random() < 0.5:
            kinds.reverse()
        for kind in kinds:
            for candidate in self._candidates(example, gold, kind, rng):
                feedback = self.oracle_feedback(example, candidate)
                if feedback.errors and feedback.errors[0].kind == kind:
                    return candidate, feedback
        return example.z, Feedback((), NO_HINT)

    def _candidates(self, example: Example, gold: ParsedNorm, kind: str, rng: random.Random) -> list[str]:
        if kind == "contradiction":
            if gold.polarity is None:
                return []
            return [render_norm(gold.action, -gold.polarity, gold.form, rng) for _ in range(2)]
        meta = example.meta or parse_input(example.x) or {}
        sentences = [meta.get(k, "") for k in ("situation", "intention", "immoral_action")] + [example.y]
        phrases = [p for s in sentences for p in story_verb_phrases(s)]
        rng.shuffle(phrases)
        return [render_norm(text, rng.choice((+1, -1)), "base" if form == "base" else "subject", rng)
                for text, form in phrases]

    # -- metrics

    def score(self, predictions: Sequence[str], examples: Sequence[Example]) -> dict[str, float]:
        """Means over examples of sentence ROUGE-L F1 and smoothed sentence BLEU of the norm and the action
        (predictions without `<|M_ACT|>` have an empty action), corpus BLEU of both, the polarity agreement
        over examples whose gold polarity is known, and the rate of norms the oracle accepts."""
        if len(predictions) != len(examples):
            raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples")
        if not examples:
            return {}
        norms, actions = zip(*(split_output(p) for p in predictions))
        n = len(examples)
        agree = [parse_norm(h).polarity == parse_norm(e.z).polarity
                 for h, e in zip(norms, examples) if parse_norm(e.z).polarity is not None]
        return {
            "norm_rougeL": sum(text_metrics.rouge_l(h, e.z).f1 for h, e in zip(norms, examples)) / n,
            "norm_bleu": sum(text_metrics.sentence_bleu(h, [e.z]) for h, e in zip(norms, examples)) / n,
            "norm_corpus_bleu": text_metrics.corpus_bleu(list(norms), [[e.z] for e in examples]),
            "action_rougeL": sum(text_metrics.rouge_l(a, e.y).f1 for a, e in zip(actions, examples)) / n,
            "action_bleu": sum(text_metrics.sentence_bleu(a, [e.y]) for a, e in zip(actions, examples)) / n,
            "action_corpus_bleu": text_metrics.corpus_bleu(list(actions), [[e.y] for e in examples]),
            "judgment_agreement": sum(agree) / len(agree) if agree else 0.0,
            "oracle_ok": sum(self.oracle_feedback(e, h).ok for h, e in zip(norms, examples)) / n,
        }
