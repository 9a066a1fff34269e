"""Moral norms read, written and compared. `parse_norm` finds a norm's judgment, its polarity (+1 approves, -1
disapproves, None unknown) and the action judged, in three shapes: "it is/it's [not] ADJ to ACTION", "[SUBJECT]
MODAL ACTION" ("you should", "people shouldn't", "never", ...) and "ACTION is [not] ADJ" ("Lying to friends is
wrong."). Adjective polarity comes from `GOOD_WORDS`/`BAD_WORDS`; an un-/in-/im-/ir-/il-/dis- prefix on a good
word makes it bad; "not"/"never" before the adjective or at the start of the action flips the polarity (so "It's
wrong not to help" approves of helping). Anything else parses to polarity None with the whole norm as its action.
`render_norm` puts an action under a judgment template; `action_overlap` compares two actions by content words.
"""
from __future__ import annotations

import dataclasses
import random
import re

from refiner_jax.tasks import text_metrics

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
