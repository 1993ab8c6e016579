"""What the scenes world holds: object categories, their image variants, places, and the words for them.

The one source of vocabulary for ``layout`` and ``captions`` (drawing and describing) and ``grounding``
(reading captions back). Object images are Microsoft's Fluent Emoji (3D style), vendored under
``sat_core/worlds/scenes/assets/fluent_emoji`` by ``python -m sat_core.worlds.scenes.sprites``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One look of a category: an emoji code point, its colour word (None: none fits), and
    colours it may be recoloured to by a hue shift (only where that stays believable)."""

    code: str
    colour: str | None
    recolour: tuple[str, ...] = ()


@dataclass(frozen=True)
class Category:
    """An object kind. ``height`` is its size in px (longest side) at the front of a 224-px
    scene; ``air`` things fly (drawn in the sky, no shadow); ``say_colour`` is how often a
    reference caption states the colour (high where colour tells variants apart)."""

    name: str
    plural: str
    variants: tuple[Variant, ...]
    height: float
    places: tuple[str, ...]
    air: bool = False
    say_colour: float = 0.0


V = Variant
CATEGORIES: dict[str, Category] = {c.name: c for c in (
    # animals
    Category("dog", "dogs", (V("1f415", "brown"), V("1f429", "grey")), 70, ("grass", "sand", "road", "snow", "floor"), say_colour=0.7),
    Category("cat", "cats", (V("1f408", "orange"), V("1f408-200d-2b1b", "black")), 60, ("grass", "floor", "road"), say_colour=0.7),
    Category("horse", "horses", (V("1f40e", "brown"),), 110, ("grass", "sand", "snow"), say_colour=0.3),
    Category("cow", "cows", (V("1f404", None),), 105, ("grass",)),
    Category("pig", "pigs", (V("1f416", "pink"),), 70, ("grass",), say_colour=0.2),
    Category("sheep", "sheep", (V("1f411", "white"),), 75, ("grass", "snow"), say_colour=0.3),
    Category("duck", "ducks", (V("1f986", None),), 55, ("water", "grass")),
    Category("elephant", "elephants", (V("1f418", "grey"),), 130, ("grass", "sand"), say_colour=0.2),
    Category("penguin", "penguins", (V("1f427", None),), 60, ("snow", "water")),
    Category("bird", "birds", (V("1f426", "red"),), 40, ("grass", "sand", "road", "snow", "water", "sky"), air=True, say_colour=0.4),
    # vehicles
    Category("car", "cars", (V("1f697", "red"), V("1f699", "blue"), V("1f695", "yellow")), 105, ("road", "snow"), say_colour=0.8),
    Category("bus", "buses", (V("1f68c", "yellow"),), 140, ("road",), say_colour=0.3),
    Category("truck", "trucks", (V("1f69a", None), V("1f6fb", None)), 120, ("road",)),
    Category("bicycle", "bicycles", (V("1f6b2", "red"),), 80, ("road", "grass"), say_colour=0.2),
    Category("motorcycle", "motorcycles", (V("1f3cd-fe0f", "red"),), 85, ("road",), say_colour=0.2),
    Category("boat", "boats", (V("26f5", None), V("1f6a4", None)), 110, ("water",)),
    Category("airplane", "airplanes", (V("2708-fe0f", None),), 90, ("sky",), air=True),
    Category("rocket", "rockets", (V("1f680", None),), 80, ("sky",), air=True),
    # people
    Category("person", "people", (V("1f9cd", None), V("1f9cd-200d-2642-fe0f", None),
                                  V("1f9cd-200d-2640-fe0f", None)), 125,
             ("grass", "sand", "road", "snow", "floor")),
    # food and tableware
    Category("apple", "apples", (V("1f34e", "red"), V("1f34f", "green")), 55, ("table",), say_colour=0.9),
    Category("banana", "bananas", (V("1f34c", "yellow"),), 65, ("table",), say_colour=0.3),
    Category("pizza", "pizzas", (V("1f355", None),), 70, ("table",)),
    Category("cake", "cakes", (V("1f382", None),), 80, ("table",)),
    Category("cup", "cups", (V("2615", None),), 60, ("table",)),
    # toys and things
    Category("ball", "balls", (V("26bd", "white"), V("1f3c0", "orange"), V("1f3d0", "white")), 40,
             ("grass", "sand", "floor"), say_colour=0.7),
    Category("balloon", "balloons", (V("1f388", "red", ("blue", "green", "yellow", "purple")),), 55,
             ("grass", "sand", "sky", "floor"), air=True, say_colour=0.9),
    Category("kite", "kites", (V("1fa81", None),), 60, ("grass", "sand", "sky"), air=True),
    Category("umbrella", "umbrellas", (V("2602-fe0f", "purple", ("red", "blue", "green", "yellow")),), 90,
             ("sand", "grass", "road"), say_colour=0.9),
    # plants
    Category("tree", "trees", (V("1f333", None), V("1f332", None), V("1f334", None)), 150, ("grass", "snow", "sand")),
    Category("cactus", "cacti", (V("1f335", "green"),), 100, ("sand",), say_colour=0.2),
    Category("flower", "flowers", (V("1f337", "pink"), V("1f339", "red"), V("1f33b", "yellow")), 55,
             ("grass", "table"), say_colour=0.9),
    # furniture and buildings
    Category("chair", "chairs", (V("1fa91", "brown"),), 85, ("floor",), say_colour=0.3),
    Category("couch", "couches", (V("1f6cb-fe0f", "blue"),), 130, ("floor",), say_colour=0.3),
    Category("bed", "beds", (V("1f6cf-fe0f", None),), 140, ("floor",)),
    Category("house", "houses", (V("1f3e0", None),), 150, ("grass", "snow")),
    Category("tent", "tents", (V("26fa", "green"),), 110, ("grass", "sand", "snow"), say_colour=0.3),
    Category("snowman", "snowmen", (V("26c4", None),), 85, ("snow",)),
)}

# Hue (PIL HSV scale 0–255) a recolourable variant is shifted to.
HUES = {"red": 0, "orange": 18, "yellow": 38, "green": 80, "blue": 155, "purple": 195, "pink": 225}
COLOURS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "white", "grey", "black", "brown")

# Places: the words captions use for each and how often a place is drawn.
PLACES: dict[str, tuple[str, ...]] = {
    "grass": ("on the grass", "in a field", "in a park"),
    "sand": ("on the beach", "on the sand"),
    "road": ("on the road", "on the street"),
    "snow": ("in the snow", "on the snow"),
    "water": ("on the water", "on a lake"),
    "floor": ("in a room", "on the floor"),
    "table": ("on a table", "on the table"),
    "sky": ("in the sky",),
}
PLACE_P = {"grass": 0.22, "sand": 0.12, "road": 0.16, "snow": 0.1, "water": 0.08, "floor": 0.12,
           "table": 0.1, "sky": 0.1}
PLACE_WORDS = {"grass": "grass", "field": "grass", "park": "grass", "beach": "sand", "sand": "sand",
               "road": "road", "street": "road", "snow": "snow", "water": "water", "lake": "water",
               "room": "floor", "floor": "floor", "table": "table", "sky": "sky"}

NOUNS: dict[str, tuple[str, bool]] = {}  # word -> (category, plural); "sheep" is both: count decides
for _c in CATEGORIES.values():
    NOUNS[_c.plural] = (_c.name, True)
    NOUNS[_c.name] = (_c.name, False)

COUNT_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4}
NUMBER_WORDS = {2: "two", 3: "three", 4: "four"}

RELATIONS = ("left_of", "right_of", "in_front_of", "behind", "above", "below", "next_to")
CONVERSE = {"left_of": "right_of", "right_of": "left_of", "in_front_of": "behind",
            "behind": "in_front_of", "above": "below", "below": "above", "next_to": "next_to"}
RELATION_PHRASES: dict[tuple[str, ...], str] = {
    ("to", "the", "left", "of"): "left_of", ("on", "the", "left", "of"): "left_of", ("left", "of"): "left_of",
    ("to", "the", "right", "of"): "right_of", ("on", "the", "right", "of"): "right_of",
    ("right", "of"): "right_of",
    ("in", "front", "of"): "in_front_of", ("behind",): "behind",
    ("above",): "above", ("over",): "above", ("below",): "below", ("under",): "below",
    ("next", "to"): "next_to", ("beside",): "next_to", ("near",): "next_to",
}
RELATION_WORDS = frozenset({"left", "right", "front", "behind", "above", "over", "below", "under",
                            "next", "beside", "near"})
# Words a caption may put after a mention ("a dog standing next to ..."): transparent to relations.
PARTICIPLES = {"standing", "sitting", "walking", "parked", "driving", "flying", "floating", "lying",
               "playing", "waiting"}
ACTIONS: dict[str, tuple[str, ...]] = {
    "dog": ("standing", "sitting", "playing"), "cat": ("sitting", "standing"),
    "horse": ("standing",), "cow": ("standing",), "sheep": ("standing",),
    "person": ("standing", "walking", "waiting"), "car": ("parked", "driving"),
    "bus": ("parked", "driving"), "truck": ("parked", "driving"), "bicycle": ("parked",),
    "motorcycle": ("parked",), "boat": ("floating",), "duck": ("floating", "standing"),
    "bird": ("flying",), "airplane": ("flying",), "balloon": ("flying", "floating"),
    "kite": ("flying",), "rocket": ("flying",),
}


def all_codes() -> list[str]:
    """Every emoji code point the world draws, sorted (what ``sprites`` vendors)."""
    return sorted({v.code for c in CATEGORIES.values() for v in c.variants})
