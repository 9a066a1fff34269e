"""The ten domains of the embedded MWP generator (fruit, bakery, school, toys, farm, garden, library, aquarium,
sports, travel): the people, items, verbs of getting and losing, containers, rates and periods a problem is told
with."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Domain:
    name: str
    names: tuple[str, ...]
    items: tuple[tuple[str, str], ...]  # (singular, plural)
    gain: tuple[tuple[str, str], ...]  # (past, base) of getting more
    loss: tuple[tuple[str, str], ...]  # (past, base) of having fewer
    containers: tuple[tuple[str, str], ...]
    rate: tuple[tuple[str, str], ...]  # (3rd person present, base) of producing items over time
    periods: tuple[tuple[str, str], ...]
    countable: bool = True  # items can be owned, bought, packed and shared


_PEOPLE = ("Tom", "Ann", "Maria", "Jake", "Lily", "Omar", "Sara", "Ben", "Nina", "Carlos", "Mei", "David", "Priya",
           "Lucas", "Emma", "Kofi", "Hana", "Ivan", "Zoe", "Raj", "Fatima", "Leo", "Grace", "Sam")

DOMAINS = (
    Domain("fruit", _PEOPLE, (("apple", "apples"), ("orange", "oranges"), ("banana", "bananas"), ("pear", "pears"),
                              ("peach", "peaches"), ("lemon", "lemons"), ("plum", "plums")),
           (("picked", "pick"), ("bought", "buy"), ("got", "get")),
           (("ate", "eat"), ("sold", "sell"), ("gave away", "give away")),
           (("basket", "baskets"), ("bag", "bags"), ("crate", "crates"), ("box", "boxes")),
           (("picks", "pick"), ("sells", "sell")), (("day", "days"), ("hour", "hours"))),
    Domain("bakery", _PEOPLE, (("cookie", "cookies"), ("muffin", "muffins"), ("cupcake", "cupcakes"),
                               ("pie", "pies"), ("roll", "rolls"), ("brownie", "brownies")),
           (("baked", "bake"), ("made", "make"), ("bought", "buy")),
           (("ate", "eat"), ("sold", "sell"), ("gave away", "give away")),
           (("tray", "trays"), ("box", "boxes"), ("plate", "plates"), ("bag", "bags")),
           (("bakes", "bake"), ("makes", "make"), ("sells", "sell")), (("day", "days"), ("hour", "hours"))),
    Domain("school", _PEOPLE, (("pencil", "pencils"), ("crayon", "crayons"), ("notebook", "notebooks"),
                               ("eraser", "erasers"), ("marker", "markers")),
           (("bought", "buy"), ("found", "find"), ("received", "receive")),
           (("lost", "lose"), ("gave away", "give away"), ("used up", "use up")),
           (("pack", "packs"), ("box", "boxes"), ("case", "cases"), ("drawer", "drawers")),
           (("collects", "collect"), ("buys", "buy")), (("week", "weeks"), ("month", "months"))),
    Domain("toys", _PEOPLE, (("marble", "marbles"), ("sticker", "stickers"), ("card", "cards"),
                             ("toy car", "toy cars"), ("balloon", "balloons"), ("puzzle", "puzzles")),
           (("won", "win"), ("found", "find"), ("got", "get"), ("bought", "buy")),
           (("lost", "lose"), ("gave away", "give away"), ("traded away", "trade away")),
           (("jar", "jars"), ("bag", "bags"), ("box", "boxes"), ("album", "albums")),
           (("collects", "collect"), ("wins", "win")), (("week", "weeks"), ("day", "days"))),
    Domain("farm", _PEOPLE, (("egg", "eggs"), ("potato", "potatoes"), ("carrot", "carrots"), ("pumpkin", "pumpkins"),
                             ("ear of corn", "ears of corn")),
           (("collected", "collect"), ("harvested", "harvest"), ("bought", "buy")),
           (("sold", "sell"), ("used", "use"), ("gave away", "give away")),
           (("carton", "cartons"), ("sack", "sacks"), ("crate", "crates"), ("cart", "carts")),
           (("collects", "collect"), ("harvests", "harvest"), ("sells", "sell")), (("day", "days"), ("week", "weeks"))),
    Domain("garden", _PEOPLE, (("rose", "roses"), ("tulip", "tulips"), ("seed", "seeds"), ("tomato", "tomatoes"),
                               ("daisy", "daisies")),
           (("planted", "plant"), ("picked", "pick"), ("bought", "buy")),
           (("gave away", "give away"), ("sold", "sell"), ("lost", "lose")),
           (("pot", "pots"), ("row", "rows"), ("bed", "beds"), ("vase", "vases")),
           (("plants", "plant"), ("picks", "pick")), (("day", "days"), ("week", "weeks"))),
    Domain("library", _PEOPLE, (("book", "books"), ("magazine", "magazines"), ("comic", "comics"),
                                ("map", "maps")),
           (("bought", "buy"), ("borrowed", "borrow"), ("received", "receive")),
           (("returned", "return"), ("donated", "donate"), ("lost", "lose")),
           (("shelf", "shelves"), ("box", "boxes"), ("cart", "carts"), ("bookcase", "bookcases")),
           (("reads", "read"), ("sorts", "sort")), (("week", "weeks"), ("month", "months"))),
    Domain("aquarium", _PEOPLE, (("fish", "fish"), ("shell", "shells"), ("snail", "snails"), ("plant", "plants")),
           (("bought", "buy"), ("got", "get"), ("found", "find")),
           (("gave away", "give away"), ("sold", "sell"), ("lost", "lose")),
           (("tank", "tanks"), ("bowl", "bowls"), ("bucket", "buckets")),
           (("feeds", "feed"), ("buys", "buy")), (("week", "weeks"), ("day", "days"))),
    Domain("sports", _PEOPLE, (("point", "points"), ("goal", "goals"), ("basket", "baskets"), ("run", "runs")),
           (("scored", "score"), ("made", "make")), (("lost", "lose"),), (("game", "games"), ("match", "matches")),
           (("scores", "score"), ("makes", "make")), (("game", "games"), ("match", "matches")), countable=False),
    Domain("travel", _PEOPLE, (("mile", "miles"), ("kilometer", "kilometers")),
           (("drove", "drive"), ("walked", "walk"), ("cycled", "cycle")), (("drove back", "drive back"),),
           (("trip", "trips"), ("day", "days")),
           (("drives", "drive"), ("walks", "walk"), ("cycles", "cycle"), ("rides", "ride")),
           (("hour", "hours"), ("day", "days")), countable=False),
)
