"""A small rule-based verb-phrase extractor for story sentences (`story_verb_phrases`), the source of the
misaligned norms among Moral Stories perturbations: the subject is dropped, the verb put in its base form and
possessives made second person, without any downloaded model."""
from __future__ import annotations

import re

from refiner_jax.tasks.moral_stories.norms import STOPWORDS, _clean

_IRREGULAR = {
    "went": "go", "goes": "go", "took": "take", "made": "make", "gave": "give", "told": "tell", "said": "say",
    "says": "say", "got": "get", "bought": "buy", "brought": "bring", "left": "leave", "found": "find",
    "thought": "think", "ate": "eat", "saw": "see", "ran": "run", "sat": "sit", "put": "put", "let": "let",
    "kept": "keep", "felt": "feel", "began": "begin", "came": "come", "drove": "drive", "wrote": "write",
    "spent": "spend", "sent": "send", "stole": "steal", "threw": "throw", "broke": "break", "chose": "choose",
    "hid": "hide", "paid": "pay", "sold": "sell", "held": "hold", "won": "win", "lost": "lose", "met": "meet",
    "knew": "know", "became": "become", "has": "have", "had": "have", "is": "be", "was": "be", "are": "be",
    "were": "be", "does": "do", "did": "do", "lied": "lie", "lies": "lie", "dies": "die", "died": "die",
    "heard": "hear", "stood": "stand", "understood": "understand", "taught": "teach", "caught": "catch",
    "fought": "fight", "fed": "feed", "led": "lead", "read": "read", "set": "set", "cut": "cut", "hit": "hit",
    "hurt": "hurt", "shut": "shut", "quit": "quit", "slept": "sleep", "swam": "swim", "sang": "sing",
    "drank": "drink", "forgot": "forget", "forgave": "forgive", "wore": "wear", "tore": "tear", "woke": "wake",
    "rode": "ride", "grew": "grow", "flew": "fly", "blew": "blow", "drew": "draw", "fell": "fall",
    "built": "build", "lent": "lend", "meant": "mean", "dealt": "deal", "shot": "shoot", "spoke": "speak",
    "bit": "bite", "hung": "hang", "lit": "light", "sought": "seek", "swore": "swear",
}
_E_VERBS = frozenset("""
use decide hope like love live save make take give move leave arrive believe care close complete continue create
dance declare die escape excuse force hate ignore improve include invite joke manage notice owe place prepare
promise provide race receive refuse realize remove replace retire serve share shave smile smoke store surprise
tie trade type vote wave welcome argue bake blame change charge choose compare dine encourage examine
exercise hide judge lie measure name note operate pause plate praise produce purchase raise recycle reduce
release rescue require rinse scare score scrape secure shake skate slice solve sponsor squeeze stare state
struggle suppose taste tease tire tolerate trace trouble volunteer waste wipe write bathe breathe chase
""".split())
_CATENATIVES = frozenset("""
want decide try plan need have hope wish start begin agree refuse choose offer attempt intend prepare promise
aim like love hate prefer continue forget remember learn manage arrange expect tend struggle
""".split())
_BOUNDARIES = frozenset("and but so because while when since after before until though although or then as if "
                        "which who whom where he she they it we i".split())
_TRAILING = STOPWORDS | frozenset("about after around before by down during from into like off onto out over "
                                  "through toward towards under up upon without her".split())
_DETERMINER_STARTS = frozenset("the a an his her their my our its this that these those some".split())
_PRONOUN_SUBJECTS = frozenset("he she they i we it".split())


def _base_form(verb: str) -> tuple[str, str] | None:
    """(base form, "base") or (verb, "gerund") for a finite verb/gerund; None when it does not look like one."""
    v = verb.lower()
    if v in _IRREGULAR:
        return _IRREGULAR[v], "base"
    if v.endswith("ing") and len(v) > 4:
        return v, "gerund"
    if v.endswith("ied") and len(v) > 4:
        return v[:-3] + "y", "base"
    if v.endswith("ed") and len(v) > 3:
        stem_ = v[:-2]
        if stem_ + "e" in _E_VERBS or stem_.endswith(("v", "z", "u", "c")):
            return stem_ + "e", "base"
        if len(stem_) > 2 and stem_[-1] == stem_[-2] and stem_[-1] not in "lsz":
            return stem_[:-1], "base"
        return stem_, "base"
    if v.endswith("ies") and len(v) > 4:
        return v[:-3] + "y", "base"
    if v.endswith(("sses", "shes", "ches", "xes", "zzes", "oes")):
        return v[:-2], "base"
    if v.endswith("s") and not v.endswith(("ss", "us", "is", "'s")) and len(v) > 2:
        return v[:-1], "base"
    return None


def _second_person(tokens: list[str]) -> list[str]:
    """"his"/"their" -> "your", reflexives -> "yourself" ("her" is left alone: it may be an object)."""
    out = []
    for tok in tokens:
        low = tok.lower()
        if low in ("his", "their"):
            out.append("your")
        elif low in ("himself", "herself", "themselves"):
            out.append("yourself")
        else:
            out.append(tok)
    return out


def _phrase_from(tokens: list[str], start: int, max_words: int) -> tuple[str, str] | None:
    """The verb phrase starting at `tokens[start]` (a finite verb), cut at a clause boundary."""
    i = start
    while i < len(tokens) and tokens[i].lower().endswith("ly") and len(tokens[i]) > 4:
        i += 1  # adverbs before the verb ("carefully protects")
    if i >= len(tokens):
        return None
    base = _base_form(tokens[i].strip(",.;:!?"))
    if base is None:
        return None
    verb, form = base
    i += 1
    # catenatives ("wants to keep", "decides to go") hand over to the infinitive
    while form == "base" and verb in _CATENATIVES and i + 1 < len(tokens) and tokens[i].lower() == "to":
        verb, i = tokens[i + 1].strip(",.;:!?").lower(), i + 2
    # "is/was + -ing" is the -ing verb
    if form == "base" and verb == "be" and i < len(tokens) and tokens[i].lower().endswith("ing"):
        verb, form, i = tokens[i].strip(",.;:!?").lower(), "gerund", i + 1
    words = [verb]
    while i < len(tokens) and len(words) < max_words:
        tok = tokens[i]
        if tok.lower() in _BOUNDARIES:
            break
        words.append(tok.strip(",.;:!?\""))
        if tok.endswith((",", ";", ":", ".", "!", "?")):
            break
        i += 1
    words = [w for w in _second_person(words) if w]
    while len(words) > 1 and words[-1].lower() in _TRAILING:
        words.pop()  # a phrase cut short should not end on "the", "about", ...
    if len(words) < 2:
        return None
    return " ".join(words), form


def story_verb_phrases(sentence: str, max_words: int = 10) -> list[tuple[str, str]]:
    """Verb phrases (text, form) of a story sentence, with the subject dropped and possessives made second
    person: "Brian drags his hose next door and starts putting out the fire." -> [("drag your hose next door",
    "base"), ("start putting out the fire", "base")]. Form "base" is a bare verb phrase, "gerund" an -ing one."""
    out: list[tuple[str, str]] = []
    for part in re.split(r"(?<=[.!?])\s+", _clean(sentence)):
        tokens = part.split()
        if not tokens:
            continue
        # subject: a name (capitalised words, possibly possessive) or a pronoun; the verb follows it
        i = 0
        if tokens[0].lower() in _PRONOUN_SUBJECTS:
            i = 1
        elif tokens[0][:1].isupper() and tokens[0].lower() not in _DETERMINER_STARTS:
            while i < len(tokens) and tokens[i][:1].isupper() and i < 3:
                i += 1
            if tokens[i - 1].endswith("'s"):
                continue  # "Jack's kids are ...": the subject is a longer noun phrase; skip the sentence
        else:
            continue
        first = _phrase_from(tokens, i, max_words)
        if first:
            out.append(first)
        # later coordinated verbs: "... and starts putting out the fire"
        for j in range(i + 1, len(tokens) - 1):
            if tokens[j].lower() == "and" and _base_form(tokens[j + 1].strip(",.;:!?")) is not None:
                nxt = _phrase_from(tokens, j + 1, max_words)
                if nxt and nxt not in out:
                    out.append(nxt)
    return out
