"""The families of the embedded MWP generator: situations (change, comparison, groups, sharing, prices, rates,
savings, multi-step groups) with their own equation shapes. A family offers several questions about the same body
(SVAMP's "question sensitivity": asking for a different quantity changes the equation), several phrasings,
reorderable facts and inverse wordings ("gave away ... now has ... how many at first" is an addition);
`_distractors` adds irrelevant sentences with their own numbers (SVAMP's "irrelevant information")."""
from __future__ import annotations

import dataclasses
import random
from typing import Callable

from refiner_jax.tasks.mwp.synthetic_domains import Domain


@dataclasses.dataclass
class _Draft:
    """A problem before masking: sentences with `@name` quantity markers, their values and the equation tree
    (nested (op, left, right) tuples over quantity names)."""

    body: list[str]
    question: str
    values: dict[str, float]
    tree: object
    people: set[str]
    item: tuple[str, str]


class _Pick:
    """Random vocabulary of one problem (distinct people, one item kind, ...)."""

    def __init__(self, rng: random.Random, domain: Domain):
        self.rng, self.d = rng, domain
        self.people = rng.sample(domain.names, 4)
        self.item = rng.choice(domain.items)
        self.gain = rng.choice(domain.gain)
        self.loss = rng.choice(domain.loss)
        self.cont = rng.choice(domain.containers)
        self.rate = rng.choice(domain.rate)
        self.period = rng.choice(domain.periods)

    def one(self, *options):
        return self.rng.choice(options)

    def n(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


Family = Callable[[_Pick], _Draft]


def _draft(p: _Pick, body, question, values, tree, n_people=1) -> _Draft:
    return _Draft(list(body), question, values, tree, set(p.people[:n_people]), p.item)


def _change_gain(p: _Pick) -> _Draft:
    A, (_, items), (g, _) = p.people[0], p.item, p.gain
    body = [p.one(f"{A} had @a {items} .", f"{A} has @a {items} .", f"There were @a {items} with {A} ."),
            p.one(f"{A} {g} @b more {items} .", f"Then {A} {g} @b more {items} .", f"Later , {A} {g} @b {items} .")]
    q = p.one(f"How many {items} does {A} have now ?", f"How many {items} does {A} have in all ?",
              f"How many {items} does {A} have altogether ?")
    return _draft(p, body, q, {"a": p.n(2, 60), "b": p.n(2, 60)}, ("+", "a", "b"))


def _change_loss(p: _Pick) -> _Draft:
    A, (_, items), (l, _) = p.people[0], p.item, p.loss
    b = p.n(2, 40)
    body = [p.one(f"{A} had @a {items} .", f"{A} has @a {items} .", f"There were @a {items} with {A} ."),
            p.one(f"{A} {l} @b of them .", f"{A} {l} @b {items} .", f"Then {A} {l} @b {items} .")]
    q = p.one(f"How many {items} does {A} have left ?", f"How many {items} does {A} have now ?",
              f"How many {items} remain with {A} ?")
    return _draft(p, body, q, {"a": b + p.n(1, 50), "b": b}, ("-", "a", "b"))


def _gain_and_loss(p: _Pick) -> _Draft:
    A, (_, items), (g, gb), (l, lb) = p.people[0], p.item, p.gain, p.loss
    a, b, c = p.n(10, 60), p.n(2, 40), p.n(2, 40)
    if b == c:
        b += 1
    if p.rng.random() < 0.5:  # gain first
        body = [f"{A} had @a {items} .", f"{A} {g} @b more {items} .", p.one(f"Then {A} {l} @c {items} .",
                                                                             f"After that , {A} {l} @c {items} .")]
        now = ("-", ("+", "a", "b"), "c")
        values = {"a": a, "b": b, "c": min(c, a + b - 1)}
    else:
        body = [f"{A} had @a {items} .", f"{A} {l} @c {items} .", p.one(f"Then {A} {g} @b more {items} .",
                                                                        f"After that , {A} {g} @b {items} .")]
        now = ("+", ("-", "a", "c"), "b")
        values = {"a": a + c, "b": b, "c": c}
    questions = [(f"How many {items} does {A} have now ?", now),
                 (f"How many {items} does {A} have in the end ?", now),
                 (f"How many {items} did {A} {gb} and {lb} in total ?", ("+", "b", "c"))]
    big, small = ("b", "c") if values["b"] > values["c"] else ("c", "b")
    more = {"b": gb, "c": lb}
    questions.append((f"How many more {items} did {A} {more[big]} than {more[small]} ?", ("-", big, small)))
    q, tree = p.one(*questions)
    return _draft(p, body, q, values, tree)


def _start_unknown(p: _Pick) -> _Draft:
    A, (_, items), (g, _), (l, _) = p.people[0], p.item, p.gain, p.loss
    b, c = p.n(2, 50), p.n(2, 50)
    if p.rng.random() < 0.5:
        body = [p.one(f"{A} {l} @b {items} .", f"Yesterday {A} {l} @b {items} ."),
                p.one(f"Now {A} has @c {items} left .", f"{A} still has @c {items} .")]
        tree = ("+", "b", "c")
    else:
        c += b
        body = [p.one(f"{A} {g} @b {items} .", f"Yesterday {A} {g} @b more {items} ."),
                p.one(f"Now {A} has @c {items} .", f"{A} now has @c {items} in all .")]
        tree = ("-", "c", "b")
    q = p.one(f"How many {items} did {A} have at first ?", f"How many {items} did {A} have in the beginning ?",
              f"How many {items} did {A} start with ?")
    return _draft(p, body, q, {"b": b, "c": c}, tree)


def _change_unknown(p: _Pick) -> _Draft:
    A, (_, items), (g, gb), (l, lb) = p.people[0], p.item, p.gain, p.loss
    a, d = p.n(5, 60), p.n(2, 50)
    if p.rng.random() < 0.5:
        body = [f"{A} had @a {items} .", p.one(f"{A} {g} some more {items} and now has @c {items} .",
                                               f"After {A} {g} some more , {A} has @c {items} .")]
        return _draft(p, body, f"How many {items} did {A} {gb} ?", {"a": a, "c": a + d}, ("-", "c", "a"))
    body = [f"{A} had @a {items} .", p.one(f"{A} {l} some of them and now has @c {items} .",
                                           f"After {A} {l} some , {A} has @c {items} left .")]
    return _draft(p, body, f"How many {items} did {A} {lb} ?", {"a": a + d, "c": a}, ("-", "a", "c"))


def _compare_two(p: _Pick) -> _Draft:
    A, B, (_, items) = p.people[0], p.people[1], p.item
    a, b = p.rng.sample(range(3, 90), 2)
    verb = "has" if p.d.countable else p.gain[0]
    body = [f"{A} {verb} @a {items} .", f"{B} {verb} @b {items} ."]
    p.rng.shuffle(body)
    big, small = ("a", "b") if a > b else ("b", "a")
    who = {"a": A, "b": B}
    if p.d.countable:
        questions = [(f"How many {items} do {A} and {B} have together ?", ("+", "a", "b")),
                     (f"How many more {items} does {who[big]} have than {who[small]} ?", ("-", big, small)),
                     (f"How many fewer {items} does {who[small]} have than {who[big]} ?", ("-", big, small))]
    else:
        base = p.gain[1]
        questions = [(f"How many {items} did {A} and {B} {base} in all ?", ("+", "a", "b")),
                     (f"How many more {items} did {who[big]} {base} than {who[small]} ?", ("-", big, small)),
                     (f"How many fewer {items} did {who[small]} {base} than {who[big]} ?", ("-", big, small))]
    q, tree = p.one(*questions)
    return _draft(p, body, q, {"a": a, "b": b}, tree, n_people=2)


def _compare_more(p: _Pick) -> _Draft:
    A, B, (_, items) = p.people[0], p.people[1], p.item
    a, b = p.n(10, 80), p.n(2, 9)
    has = "has" if p.d.countable else p.gain[0]
    verb = "have" if p.d.countable else p.gain[1]
    aux = "does" if p.d.countable else "did"
    aux_pl = "do" if p.d.countable else "did"
    kind = p.one("more", "fewer", "reverse")
    if kind == "more":
        body = [f"{A} {has} @a {items} .", f"{B} {has} @b more {items} than {A} ."]
        b_tree = ("+", "a", "b")
    elif kind == "fewer":
        body = [f"{A} {has} @a {items} .", f"{B} {has} @b fewer {items} than {A} ."]
        b_tree = ("-", "a", "b")
    else:  # "A has b more than B": B has a - b
        body = [f"{A} {has} @a {items} .", f"{A} {has} @b more {items} than {B} ."]
        b_tree = ("-", "a", "b")
    questions = [(f"How many {items} {aux} {B} {verb} ?", b_tree),
                 (f"How many {items} {aux_pl} {A} and {B} {verb} together ?", ("+", "a", b_tree))]
    q, tree = p.one(*questions)
    return _draft(p, body, q, {"a": a, "b": b}, tree, n_people=2)


def _three_people(p: _Pick) -> _Draft:
    A, B, C, (_, items) = p.people[0], p.people[1], p.people[2], p.item
    b, c = p.n(2, 30), p.n(2, 30)
    a = b + c + p.n(1, 30)
    has = "has" if p.d.countable else p.gain[0]
    verb = "have" if p.d.countable else p.gain[1]
    aux = "do" if p.d.countable else "did"
    body = [f"{A} {has} @a {items} .", f"{B} {has} @b {items} .", f"{C} {has} @c {items} ."]
    p.rng.shuffle(body)
    questions = [(f"How many {items} {aux} {A} , {B} and {C} {verb} in all ?", ("+", ("+", "a", "b"), "c")),
                 (f"How many {items} {aux} {A} and {C} {verb} together ?", ("+", "a", "c")),
                 (f"How many {items} {aux} {B} and {C} {verb} together ?", ("+", "b", "c")),
                 (f"How many more {items} {'does' if p.d.countable else 'did'} {A} {verb} than {B} and {C} "
                  f"combined ?", ("-", "a", ("+", "b", "c")))]
    q, tree = p.one(*questions)
    return _draft(p, body, q, {"a": a, "b": b, "c": c}, tree, n_people=3)


def _groups(p: _Pick) -> _Draft:
    A, (_, items), (cont, conts), (l, _) = p.people[0], p.item, p.cont, p.loss
    a, b = p.n(2, 12), p.n(2, 15)
    body = [p.one(f"{A} has @a {conts} of {items} .", f"{A} bought @a {conts} of {items} .",
                  f"There are @a {conts} in {A} 's room ."),
            p.one(f"Each {cont} has @b {items} .", f"There are @b {items} in each {cont} .",
                  f"Every {cont} holds @b {items} .")]
    extra = p.one(None, "loose", "loss")
    values = {"a": a, "b": b}
    if extra is None:
        q = p.one(f"How many {items} does {A} have in all ?", f"How many {items} are there in {A} 's {conts} ?")
        return _draft(p, body, q, values, ("*", "a", "b"))
    values["c"] = p.n(1, min(30, a * b - 1))
    if extra == "loose":
        body.append(f"{A} also has @c loose {items} .")
        questions = [(f"How many {items} does {A} have in all ?", ("+", ("*", "a", "b"), "c")),
                     (f"How many {items} are in {A} 's {conts} ?", ("*", "a", "b"))]
    else:
        body.append(f"{A} {l} @c of the {items} .")
        questions = [(f"How many {items} does {A} have left ?", ("-", ("*", "a", "b"), "c"))]
    q, tree = p.one(*questions)
    return _draft(p, body, q, values, tree)


def _share(p: _Pick) -> _Draft:
    A, (_, items), (cont, conts), (l, _), (g, _) = p.people[0], p.item, p.cont, p.loss, p.gain
    b, each = p.n(2, 12), p.n(2, 15)
    kind = p.one("friends", "pack", "loss", "gain")
    if kind == "friends":
        body = [p.one(f"{A} has @a {items} .", f"{A} {g} @a {items} ."),
                p.one(f"{A} shares them equally among @b friends .", f"{A} splits them evenly between @b friends .")]
        q = p.one(f"How many {items} does each friend get ?", f"How many {items} will each friend receive ?")
        return _draft(p, body, q, {"a": b * each, "b": b}, ("/", "a", "b"))
    if kind == "pack":
        body = [f"{A} has @a {items} .", p.one(f"{A} puts @b {items} in each {cont} .",
                                              f"Each {cont} can hold @b {items} .")]
        q = f"How many {conts} does {A} need for all the {items} ?"
        return _draft(p, body, q, {"a": b * each, "b": b}, ("/", "a", "b"))
    total = b * each  # what ends up in the containers
    c = p.n(1, min(30, total - 1))
    if kind == "loss":
        body = [f"{A} had @a {items} .", f"{A} {l} @c of them .",
                f"{A} put the rest into @b {conts} with the same number in each ."]
        values, tree = {"a": total + c, "b": b, "c": c}, ("/", ("-", "a", "c"), "b")
    else:
        body = [f"{A} had @a {items} .", f"{A} {g} @c more {items} .",
                f"{A} put all of them into @b {conts} with the same number in each ."]
        values, tree = {"a": total - c, "b": b, "c": c}, ("/", ("+", "a", "c"), "b")
    return _draft(p, body, f"How many {items} are in each {cont} ?", values, tree)


def _price(p: _Pick) -> _Draft:
    A, (item, items) = p.people[0], p.item
    price = p.n(2, 15)
    n = p.n(2, 12)
    kind = p.one("spend", "change", "budget", "left", "two")
    if kind == "spend":
        body = [p.one(f"Each {item} costs @p dollars .", f"One {item} costs @p dollars ."),
                p.one(f"{A} buys @n {items} .", f"{A} wants to buy @n {items} .")]
        p.rng.shuffle(body)
        q = p.one(f"How much does {A} spend ?", f"How many dollars does {A} pay for the {items} ?")
        return _draft(p, body, q, {"p": price, "n": n}, ("*", "p", "n"))
    if kind == "change":
        body = [f"{A} buys @n {items} for @p dollars each .", f"{A} pays with @m dollars ."]
        q = f"How much change does {A} get back ?"
        return _draft(p, body, q, {"p": price, "n": n, "m": price * n + p.n(1, 20)}, ("-", "m", ("*", "n", "p")))
    if kind == "budget":
        body = [f"{A} has @m dollars .", p.one(f"Each {item} costs @p dollars .", f"A {item} costs @p dollars .")]
        p.rng.shuffle(body)
        q = f"How many {items} can {A} buy with all the money ?"
        return _draft(p, body, q, {"m": price * n, "p": price}, ("/", "m", "p"))
    if kind == "left":
        body = [f"{A} had @m dollars .", f"{A} bought @n {items} that cost @p dollars each ."]
        q = f"How much money does {A} have left ?"
        return _draft(p, body, q, {"m": price * n + p.n(1, 40), "n": n, "p": price}, ("-", "m", ("*", "n", "p")))
    other = next(x for x in p.d.items if x != p.item)
    body = [f"{A} bought @n {items} at @p dollars each and @k {other[1]} at @r dollars each ."]
    questions = [(f"How much did {A} spend in all ?", ("+", ("*", "n", "p"), ("*", "k", "r"))),
                 (f"How much did {A} spend on {other[1]} ?", ("*", "k", "r"))]
    q, tree = p.one(*questions)
    return _draft(p, body, q, {"n": n, "p": price, "k": p.n(2, 9), "r": p.n(2, 15)}, tree)


def _rate(p: _Pick) -> _Draft:
    A, B, (_, items), (r3, rb), (per, pers) = p.people[0], p.people[1], p.item, p.rate, p.period
    r, d = p.n(2, 25), p.n(2, 12)
    kind = p.one("one", "two", "goal", "goal_have")
    if kind == "one":
        body = [f"{A} {r3} @r {items} every {per} ."]
        q = p.one(f"How many {items} does {A} {rb} in @d {pers} ?", f"How many {items} will {A} {rb} in @d {pers} ?")
        return _draft(p, body, q, {"r": r, "d": d}, ("*", "r", "d"))
    if kind == "two":
        s = p.n(2, 25)
        if s == r:
            s += 1
        body = [f"{A} {r3} @r {items} every {per} .", f"{B} {r3} @s {items} every {per} ."]
        big, small = ("r", "s") if r > s else ("s", "r")
        who = {"r": A, "s": B}
        questions = [(f"How many {items} do {A} and {B} {rb} together in @d {pers} ?", ("*", ("+", "r", "s"), "d")),
                     (f"How many more {items} does {who[big]} {rb} than {who[small]} in @d {pers} ?",
                      ("*", ("-", big, small), "d")),
                     (f"How many {items} do {A} and {B} {rb} together every {per} ?", ("+", "r", "s"))]
        q, tree = p.one(*questions)
        return _draft(p, body, q, {"r": r, "s": s, "d": d}, tree, n_people=2)
    if kind == "goal":
        body = [f"{A} wants to {rb} @t {items} .", f"{A} {r3} @r {items} every {per} ."]
        return _draft(p, body, f"How many {pers} will it take {A} ?", {"t": r * d, "r": r}, ("/", "t", "r"))
    h = p.n(1, 30)
    body = [f"{A} wants to {rb} @t {items} .", f"{A} has already done @h {items} .",
            f"{A} {r3} @r {items} every {per} ."]
    return _draft(p, body, f"How many more {pers} will it take {A} to finish ?", {"t": r * d + h, "h": h, "r": r},
                  ("/", ("-", "t", "h"), "r"))


def _savings(p: _Pick) -> _Draft:
    A, (per, pers) = p.people[0], p.one(("week", "weeks"), ("month", "months"), ("day", "days"))
    s, w, n = p.n(10, 200), p.n(2, 30), p.n(2, 12)
    if p.rng.random() < 0.5:
        body = [f"{A} has @s dollars in a piggy bank .", f"{A} saves @w dollars every {per} ."]
        q = f"How much money will {A} have after @n {pers} ?"
        return _draft(p, body, q, {"s": s, "w": w, "n": n}, ("+", "s", ("*", "w", "n")))
    body = [f"{A} has @s dollars .", f"{A} spends @w dollars every {per} ."]
    q = f"How much money will {A} have left after @n {pers} ?"
    return _draft(p, body, q, {"s": s + w * n, "w": w, "n": n}, ("-", "s", ("*", "w", "n")))


def _two_kinds_of_groups(p: _Pick) -> _Draft:
    A, (_, items), (cont, conts), (l, _) = p.people[0], p.item, p.cont, p.loss
    a, b = p.n(2, 9), p.n(2, 9)
    if a == b:
        a += 1
    c, e = p.n(2, 12), p.n(2, 12)
    if p.rng.random() < 0.5:  # same size: (a + b) * c
        body = [f"{A} bought @a small {conts} and @b large {conts} of {items} .",
                f"Each {cont} has @c {items} ."]
        big, small = ("a", "b") if a > b else ("b", "a")
        size = {"a": "small", "b": "large"}
        questions = [(f"How many {items} did {A} buy ?", ("*", ("+", "a", "b"), "c")),
                     (f"How many more {items} are in the {size[big]} {conts} than in the {size[small]} {conts} ?",
                      ("*", ("-", big, small), "c"))]
        values = {"a": a, "b": b, "c": c}
        if p.rng.random() < 0.4:
            body.append(f"{A} {l} @e {items} .")
            values["e"] = p.n(1, (a + b) * c - 1)
            questions = [(f"How many {items} does {A} have left ?", ("-", ("*", ("+", "a", "b"), "c"), "e"))]
    else:  # different sizes: a * c + b * e
        body = [f"{A} bought @a small {conts} and @b large {conts} of {items} .",
                f"Each small {cont} has @c {items} and each large {cont} has @e {items} ."]
        questions = [(f"How many {items} did {A} buy in all ?", ("+", ("*", "a", "c"), ("*", "b", "e"))),
                     (f"How many {items} are in the large {conts} ?", ("*", "b", "e"))]
        values = {"a": a, "b": b, "c": c, "e": e}
    q, tree = p.one(*questions)
    return _draft(p, body, q, values, tree)


# family -> (function, usable in non-countable domains)
FAMILIES: dict[str, tuple[Family, bool]] = {
    "change_gain": (_change_gain, False), "change_loss": (_change_loss, False),
    "gain_and_loss": (_gain_and_loss, False), "start_unknown": (_start_unknown, False),
    "change_unknown": (_change_unknown, False), "compare_two": (_compare_two, True),
    "compare_more": (_compare_more, True), "three_people": (_three_people, True), "groups": (_groups, False),
    "share": (_share, False), "price": (_price, False), "rate": (_rate, True), "savings": (_savings, False),
    "two_kinds_of_groups": (_two_kinds_of_groups, False),
}


def _distractors(p: _Pick, draft: _Draft, count: int) -> list[str]:
    """`count` different sentences, each with one irrelevant number (`@x0`, `@x1`, ...) about someone or
    something the question does not ask about."""
    outsider = next(x for x in p.people if x not in draft.people)
    A = p.people[0]
    others = [x for x in p.d.items if x != draft.item] or [draft.item]
    other = p.rng.choice(others)[1]
    options = [f"{A} is @x years old .", f"It took {A} @x minutes .",
               f"{outsider} {p.d.gain[0][0]} @x {draft.item[1]} last year ."]
    if p.d.countable:
        options += [f"{outsider} has @x {draft.item[1]} .", f"{A} also has @x {other} ."]
    return [s.replace("@x", f"@x{i}") for i, s in enumerate(p.rng.sample(options, count))]
