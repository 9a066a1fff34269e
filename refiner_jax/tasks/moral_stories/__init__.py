"""Moral Stories norm generation as a REFINER task.

`norms`: the norm parser with its lexicons and judgment templates; `verb_phrases`: a rule-based verb-phrase
extractor for perturbations; `moral_stories_task`: `MoralStoriesTask` (data, oracle, perturbations, metrics).
"""
from refiner_jax.tasks.moral_stories.moral_stories_task import (CONTRADICTION, M_ACT, SPLIT_FILES, TAGS,
                                                                MoralStoriesTask, default_data_dir, parse_input,
                                                                read_actor_file, split_output)
from refiner_jax.tasks.moral_stories.norms import (BAD_WORDS, GOOD_WORDS, STOPWORDS, TEMPLATES, ParsedNorm,
                                                   action_overlap, content_stems, parse_norm, render_norm, stem,
                                                   word_polarity)
from refiner_jax.tasks.moral_stories.verb_phrases import story_verb_phrases

__all__ = [
    "BAD_WORDS", "CONTRADICTION", "GOOD_WORDS", "M_ACT", "SPLIT_FILES", "STOPWORDS", "TAGS", "TEMPLATES",
    "MoralStoriesTask", "ParsedNorm", "action_overlap", "content_stems", "default_data_dir", "parse_input",
    "parse_norm", "read_actor_file", "render_norm", "split_output", "stem", "story_verb_phrases", "word_polarity",
]
