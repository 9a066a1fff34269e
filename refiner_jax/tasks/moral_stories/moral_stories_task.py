"""Moral Stories norm generation as a REFINER task.

Data: `actor_{dev,test}.json` (1,000 stories each), lists of `{"id", "actor_input", "actor_output"}` with
`actor_input = "<|SIT|> situation <|INT|> intention <|I_ACT|> immoral action <|NRM|>"` and
`actor_output = "norm <|M_ACT|> moral action"`. The training file of the original release is not available, so
this task **trains on dev and tests on test**: `load("train")` is dev minus a seeded held-out slice of
`val_size` stories, `load("val")` is that slice, `load("test")` is the test file.

- Example: `x` = actor input, `z` = the norm (the hypothesis the critic judges), `y` = the moral action.
  The generator's full target is `target(example)` = `"{norm} <|M_ACT|> {moral action}"`; `split_output`
  cuts a generated text back into (norm, action).
- A norm is parsed (`parse_norm`) into a judgment, its polarity (+1 approves, -1 disapproves, None unknown) and
  the action judged. Three shapes are recognised: "it is/it's [not] ADJ to ACTION", "[SUBJECT] MODAL ACTION"
  ("you should", "people shouldn't", "never", ...) and "ACTION is [not] ADJ" ("Lying to friends is wrong.").
  Adjective polarity comes from `GOOD_WORDS`/`BAD_WORDS`; an un-/in-/im-/ir-/il-/dis- prefix on a good word makes
  it bad; "not"/"never" before the adjective or at the start of the action flips the polarity (so "It's wrong
  not to help" approves of helping). Anything else parses to polarity None with the whole norm as its action.
- Oracle (`oracle_feedback`): the hypothesis norm's action must overlap the gold action (F1 of content-word
  stems >= `align_threshold`), else `Semantically misaligned: "<gold action>".`; when both polarities are known
  and differ, "Contradiction."; otherwise "No hint". The upstream critic data adds "not " to the misaligned
  phrase when polarities also differ; this task keeps the phrase as written in the gold norm.
- Perturbations (`perturb`), without any downloaded model: the gold norm or a same-polarity rewording ("No
  hint"), a rewording with the opposite judgment ("Contradiction."), or a verb phrase from the story
  (`story_verb_phrases`, a small rule-based extractor) under a random judgment (semantic misalignment).
- `score`: ROUGE-L and BLEU of the norm and of the moral action against the gold ones, and the agreement of
  judgment polarities (over examples whose gold polarity is known).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import random
import re
from typing import Sequence

from refiner_jax.tasks import text_metrics
from refiner_jax.tasks.base import NO_HINT, DataError, Example, Feedback, StepError, shared_data_dir

TAGS = ("<|SIT|>", "<|INT|>", "<|I_ACT|>", "<|NRM|>", "<|M_ACT|>")  # special tokens for the tokenizer
M_ACT = "<|M_ACT|>"
SPLIT_FILES = {"train": "actor_dev.json", "val": "actor_dev.json", "test": "actor_test.json"}
CONTRADICTION = "Contradiction."
_INPUT = re.compile(r"^\s*<\|SIT\|>(.*?)<\|INT\|>(.*?)<\|I_ACT\|>(.*?)<\|NRM\|>\s*$", re.S)

GOOD_WORDS = frozenset("""
good great nice kind right important expected okay ok fine fun encouraged considerate normal wise responsible
polite helpful admirable acceptable appropriate proper usual commendable thoughtful generous courteous honorable
noble healthy smart loving caring brave reasonable sensible ideal best better mature respectful decent fair
understandable common customary typical natural courageous beneficial supportive compassionate loyal honest
ethical moral legal safe necessary allowed romantic sweet gracious selfless valuable worthwhile essential crucial
vital praiseworthy charitable productive prudent intelligent insightful patient appreciated welcome permissible
rational virtuous humble just cool wonderful lovely desirable practical advisable friendly hospitable heroic
altruistic alright required obligatory dutiful tolerant forgiving thoughtful neighborly reliable trustworthy
dependable clean hygienic careful cautious considered acceptable correct proper cordial mannerly diligent
hardworking caring empathetic wholesome classy gentle peaceful calm grateful thankful merciful faithful
sincere truthful decent honourable respectable healthy attentive conscientious fine polite sportsmanlike
accommodating scholarly sanitary recommended accepting encouraging comforting beautiful scrupulous observant
benevolent keen couth appropriate
""".split())

BAD_WORDS = frozenset("""
bad wrong rude mean cruel illegal unusual harmful inconsiderate irresponsible disrespectful impolite unkind
selfish dangerous unsafe gross annoying inappropriate unacceptable immoral unethical hurtful dishonest uncommon
weird strange shameful disgusting reckless foolish stupid lazy improper unfair abusive creepy unhealthy unseemly
profane unwise offensive insensitive greedy petty careless risky hateful racist sexist discouraged wasteful
unreasonable irrational childish immature pathetic cheap misleading dramatic sneaky excessive seedy cold clingy
frowned terrible awful horrible evil sinful nasty toxic manipulative deceptive deceitful cowardly disloyal
unprofessional ungrateful negligent unhygienic unsanitary vulgar crude obscene tacky boorish arrogant
condescending judgmental intrusive invasive controlling possessive jealous vindictive spiteful bossy pushy nosy
odd bizarre embarrassing awkward unnecessary pointless silly ridiculous dumb idiotic hypocritical insulting
demeaning degrading humiliating bullying aggressive violent threatening scary frightening upsetting wrongful
criminal unlawful forbidden prohibited taboo unexpected unnatural unpleasant unwelcome unfriendly unhelpful
unproductive damaging destructive hazardous problematic sketchy shady suspicious dirty filthy messy sloppy
disruptive distracting bothersome irritating inconvenient impatient obnoxious entitled spoiled harsh unjust
insane crazy sad tasteless thoughtless heartless callous shallow gullible naive vain snobby snobbish hostile
irresponsible unloving uncaring mischievous malicious petty lewd inhumane dangerous risky disgraceful
conceited juvenile alarming homophobic transphobic bigoted weak delinquent overwhelming difficult execrable
malevolent delusional deplorable vengeful
""".split())

_NEGATABLE_PREFIXES = ("un", "in", "im", "ir", "il", "dis")

# Modal judgments "[SUBJECT] MODAL ACTION", longest first so "should not" wins over "should".
_MODALS = [(m, +1) for m in (
    "should always", "should definitely", "should", "must always", "must", "ought to", "need to", "needs to",
    "have to", "has to", "are expected to", "is expected to", "'re expected to", "are supposed to",
    "is supposed to", "'re supposed to", "are encouraged to", "is encouraged to", "are obligated to",
    "are required to", "'re encouraged to", "are allowed to", "'re allowed to", "is allowed to",
    "have the right to", "has the right to", "expect you to", "expects you to", "expect people to", "shall",
    "always",
)] + [(m, -1) for m in (
    "should never", "shouldn't ever", "shouldn't", "should not", "must not", "mustn't", "must never",
    "ought not to", "ought not", "are expected not to", "is expected not to", "'re expected not to",
    "are not expected to", "aren't expected to", "is not expected to", "isn't expected to",
    "are not supposed to", "aren't supposed to", "'re not supposed to", "is not supposed to",
    "isn't supposed to", "are not allowed to", "aren't allowed to", "can't", "cannot", "can not", "shall not",
    "will never", "won't", "never", "don't", "do not", "should refrain from", "should avoid",
    "are discouraged from",
)]
_MODALS.sort(key=lambda mp: -len(mp[0]))
_MODAL_POLARITY = dict(_MODALS)
_MODAL_RE = "|".join(re.escape(m) for m, _ in _MODALS)
_SUBJECT = r"(?:(?!(?:is|are|was|were|be|it|it's)\b)[a-z'-]+ ){0,3}?"
_MODS = (r"(?:(?:always|usually|very|really|generally|considered|seen as|viewed as|thought to be|often|so|quite|"
         r"pretty|extremely|a|an|the|kind of|sometimes|typically|super|incredibly|highly|somewhat|rather|too|"
         r"definitely|certainly|morally|socially|totally|completely|just|also|perfectly|most|more|less|"
         r"considered to be|seen to be|absolutely|especially|truly|entirely|deeply|fairly|usually)\s+)*")
_OPENER = r"(?:(?:sometimes|usually|generally|often|always|in general|typically),?\s+)?"
_IT_ADJ = re.compile(
    _OPENER + r"(?:it's is|it is|it's|its|it was|it can be|it could be|it would be|it will be|it might be|"
    r"it may be|is|that's|that is|this is)\s+(?P<neg>(?:not|never|rarely)\s+)?" + _MODS +
    r"(?P<adj>[a-z'-]+)(?:\s+(?:upon|on|idea|thing|practice|habit|way|choice|move|sign|trait|behavior|manners))?"
    r"\s+(?:(?:for|of)\s+(?:[a-z'-]+\s+){1,3}?)?(?P<link>not to|to|that|when|if|(?=you\s))\s*(?P<action>.+)$")
_MODAL = re.compile(r"(?P<subj>" + _SUBJECT + r"(?:[a-z]+(?='re\b))?)(?P<modal>" + _MODAL_RE + r")\s+(?P<action>.+)$")
_COPULA = re.compile(
    r"(?P<action>.+?)\s+(?P<cop>is|are|can be|could be|would be|may be|might be|will be|was|seems|seem|"
    r"isn't|aren't|can seem)\s+(?P<neg>(?:not|never|rarely)\s+)?" + _MODS + r"(?P<tail>[a-z' -]+)$")
_LEADING_SUBJECT = re.compile(r"^(?:you|people|someone|somebody|one|we|they|others)\s+")
_NEGATED_ACTION = re.compile(r"^(?:not|never|do not|don't|does not|doesn't)\s+")

# (template, polarity, form): "base" takes a bare verb phrase, "subject" a gerund/noun phrase as subject.
TEMPLATES = (
    ("It is good to {}.", +1, "base"), ("It's good to {}.", +1, "base"), ("You should {}.", +1, "base"),
    ("It is right to {}.", +1, "base"), ("It's kind to {}.", +1, "base"), ("It is important to {}.", +1, "base"),
    ("People are expected to {}.", +1, "base"), ("It's considerate to {}.", +1, "base"),
    ("It is responsible to {}.", +1, "base"), ("It's nice to {}.", +1, "base"),
    ("It is wrong to {}.", -1, "base"), ("It's bad to {}.", -1, "base"), ("You shouldn't {}.", -1, "base"),
    ("You should not {}.", -1, "base"), ("It's rude to {}.", -1, "base"), ("It is mean to {}.", -1, "base"),
    ("It's irresponsible to {}.", -1, "base"), ("It is unkind to {}.", -1, "base"),
    ("People shouldn't {}.", -1, "base"), ("It's inconsiderate to {}.", -1, "base"),
    ("{} is good.", +1, "subject"), ("{} is kind.", +1, "subject"), ("{} is important.", +1, "subject"),
    ("{} is considerate.", +1, "subject"), ("{} is expected.", +1, "subject"),
    ("{} is wrong.", -1, "subject"), ("{} is rude.", -1, "subject"), ("{} is bad.", -1, "subject"),
    ("{} is inconsiderate.", -1, "subject"), ("{} is unkind.", -1, "subject"),
)

STOPWORDS = frozenset("""
a an the to of and or for in on at with by from as about into onto your you yours yourself yourselves their they
them themselves someone somebody something it its is are be being been was were when if that this these those
not do does did doing s re t ll ve d m always never should can will just his her him he she my me i we our us
one ones so very really also too than then there here what which who whom while
""".split())


@dataclasses.dataclass(frozen=True)
class ParsedNorm:
    """A norm's judgment phrase (None when no known shape matched), polarity (+1/-1/None), the action judged
    (a leading "not"/"never" folded into the polarity), the action's form ("base" verb phrase or "subject"
    phrase) and the action as written (`phrase`, negation kept)."""

    judgment: str | None
    polarity: int | None
    action: str
    form: str
    phrase: str


def _clean(text: str) -> str:
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace('""', '"')
    return " ".join(text.strip().strip('"').split())


def _strip_end(text: str) -> str:
    return text.strip().rstrip(".!?;,\"' ").strip()


def word_polarity(word: str) -> int | None:
    """+1 for an approving judgment word, -1 for a disapproving one, None when unknown."""
    word = word.lower().strip(".,!?'\"")
    if word in GOOD_WORDS:
        return +1
    if word in BAD_WORDS:
        return -1
    for prefix in _NEGATABLE_PREFIXES:
        if word.startswith(prefix) and word[len(prefix):] in GOOD_WORDS:
            return -1
    return None


def _fold_negation(action: str, polarity: int | None) -> tuple[str, int | None]:
    m = _NEGATED_ACTION.match(action.lower())
    if m:
        return action[m.end():], (-polarity if polarity is not None else None)
    return action, polarity


def _parsed(judgment: str | None, polarity: int | None, phrase: str, form: str) -> ParsedNorm:
    action, polarity = _fold_negation(phrase, polarity)
    return ParsedNorm(judgment, polarity, action, form, phrase)


def parse_norm(norm: str) -> ParsedNorm:
    """Judgment, polarity and action of a norm (see the module docstring). Never raises."""
    text = _strip_end(_clean(norm))
    low = text.lower()
    m = _IT_ADJ.fullmatch(low)
    if m:
        polarity = word_polarity(m.group("adj"))
        if polarity is not None and (m.group("neg") or m.group("link") == "not to"):
            polarity = -polarity
        phrase = text[m.start("action"):]
        subject = _LEADING_SUBJECT.match(phrase.lower())
        if m.group("link") not in ("to", "not to") and subject:
            phrase = phrase[subject.end():]  # "it's good that you ..." judges "...", not "you ..."
        return _parsed(text[:m.start("action")].strip(), polarity, phrase, "base")
    m = _MODAL.fullmatch(low)
    if m:
        modal = m.group("modal")
        form = "subject" if modal in ("should refrain from", "should avoid", "are discouraged from") else "base"
        return _parsed(text[:m.start("action")].strip(), _MODAL_POLARITY[modal], text[m.start("action"):], form)
    m = _COPULA.fullmatch(low)
    if m:
        words = m.group("tail").split()
        known = [p for p in (word_polarity(w) for w in words) if p is not None]
        if known and len(words) <= 4:
            negated = m.group("neg") or m.group("cop") in ("isn't", "aren't")
            return _parsed(text[m.start("cop"):].strip(), -known[0] if negated else known[0],
                           text[:m.end("action")], "subject")
    return ParsedNorm(None, None, text, "subject", text)


def render_norm(action: str, polarity: int, form: str, rng: random.Random) -> str:
    """The action under a random judgment template of the given polarity that takes this form of action."""
    options = [t for t, p, f in TEMPLATES if p == polarity and f == form]
    template = rng.choice(options)
    text = template.format(_strip_end(action))
    return text[0].upper() + text[1:]


def stem(word: str) -> str:
    """A crude stem that makes "help"/"helps"/"helping"/"helped" and "make"/"making" meet."""
    w = word.lower()
    if w.endswith("ing") and len(w) > 5:
        w = w[:-3]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "lsz":
            w = w[:-1]
    elif w.endswith(("ied", "ies")) and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("ed") and len(w) > 4:
        w = w[:-2]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "lsz":
            w = w[:-1]
    elif w.endswith(("sses", "shes", "ches", "xes", "zes")) and len(w) > 4:
        w = w[:-2]
    elif w.endswith("s") and not w.endswith("ss") and len(w) > 3:
        w = w[:-1]
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]
    return w


def content_stems(text: str) -> frozenset[str]:
    """Stems of the content words of `text` (stopwords dropped)."""
    return frozenset(stem(t) for t in text_metrics.tokenize(text) if t not in STOPWORDS)


def action_overlap(hypothesis_action: str, gold_action: str) -> float:
    """F1 between the content-word stem sets of two actions (1.0 when both have none)."""
    h, g = content_stems(hypothesis_action), content_stems(gold_action)
    if not h and not g:
        return 1.0
    common = len(h & g)
    return 2.0 * common / (len(h) + len(g)) if common else 0.0


# ------------------------------------------------------------------------------------ verb phrase extractor

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


# ----------------------------------------------------------------------------------------------- the task


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
    if not isinstance(records, list) or not records:
        got = "an empty list" if records == [] else type(records).__name__
        raise DataError(f"{path}: expected {expected}, got {got}")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str)
                                                for k in ("id", "actor_input", "actor_output")):
            raise DataError(f"{path}: record {i}: expected string fields 'id', 'actor_input', 'actor_output'")
        if parse_input(rec["actor_input"]) is None:
            raise DataError(f"{path}: record {i} ({rec['id']}): 'actor_input' must read "
                            "'<|SIT|> ... <|INT|> ... <|I_ACT|> ... <|NRM|>'")
        if rec["actor_output"].count(M_ACT) != 1 or not all(split_output(rec["actor_output"])):
            raise DataError(f"{path}: record {i} ({rec['id']}): 'actor_output' must read 'norm <|M_ACT|> action'")
    return records


class MoralStoriesTask:
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
        path = pathlib.Path(data_dir or self.data_dir or default_data_dir()) / SPLIT_FILES[split]
        records = read_actor_file(path)
        indices = list(range(len(records)))
        if split in ("train", "val"):
            if self.val_size >= len(records):
                raise DataError(f"{path}: {len(records)} stories cannot spare val_size={self.val_size}")
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
