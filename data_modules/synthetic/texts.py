"""Text descriptions of the synthetic world's steps and titles: every action's templates with the
disambiguating detail ("full") and without ("short"), the hard world's texts (what a step needs), and
the small word helpers (articles, counts, listings) the scenes and procedures use."""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

_TEXTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # stacking
    "block_first": (
        ("Put a {color} block on the floor {side}.",
         "Place a {color} block on the floor {side}.",
         "Start the {loc} stack with a {color} block.",
         "Set a {color} block down on the floor {side}."),
        ("Add a {color} block.", "Place a {color} block.", "Put a {color} block in place.",
         "Take a {color} block and put it down."),
    ),
    "block_on": (
        ("Put a {color} block on top of the {below} block {side}.",
         "Stack a {color} block on the {below} block in the {loc} stack.",
         "Place a {color} block onto the {below} one in the {loc} tower.",
         "Add a {color} block to the {loc} stack, on top of the {below} block."),
        ("Add a {color} block.", "Place a {color} block.", "Put a {color} block in place.",
         "Take a {color} block and put it down."),
    ),
    "plank": (
        ("Lay a {color} plank across {span}.",
         "Bridge {span} with a {color} plank.",
         "Put a {color} plank on top of {span}."),
        ("Lay a {color} plank on top.", "Add a {color} plank."),
    ),
    # filling
    "layer_first": (
        ("Pour {color} liquid into the empty {container} {side}.",
         "Fill the bottom of the {loc} {container} with {color} liquid.",
         "Pour a {color} layer into the {loc} {container} while it is still empty."),
        ("Pour in some {color} liquid.", "Add a {color} layer.", "Pour a {color} layer.",
         "Add some {color} liquid."),
    ),
    "layer_on": (
        ("Pour a {color} layer into the {loc} {container}, on top of the {below} one.",
         "Add {color} liquid to the {loc} {container}, above the {below} layer.",
         "Float a {color} layer on the {below} layer in the {loc} {container}."),
        ("Pour in some {color} liquid.", "Add a {color} layer.", "Pour a {color} layer.",
         "Add some {color} liquid."),
    ),
    "lid": (
        ("Close the {loc} {container} with a {color} lid.",
         "Put a {color} lid on the {loc} {container}.",
         "Seal the {container} {side} with a {color} lid."),
        ("Put a {color} lid on.", "Add a {color} lid."),
    ),
    "tray": (
        ("Set a {color} tray over {span}.",
         "Cover {span} with a {color} board.",
         "Lay a {color} tray across the tops of {span}."),
        ("Put a {color} tray on top.", "Cover them with a {color} board.", "Add a {color} tray."),
    ),
    # garden
    "ground": (
        ("Draw a strip of {color} ground along the bottom.",
         "Paint {color} ground across the bottom of the picture."),
        ("Draw the ground.", "Add some {color} ground."),
    ),
    "trunk": (
        ("Draw a {color} tree trunk {side}.", "Paint a {color} trunk standing on the ground {side}."),
        ("Draw a tree trunk.", "Add a {color} trunk."),
    ),
    "crown": (
        ("Give the tree {side} a {color} crown.", "Paint a round {color} crown on top of the trunk {side}."),
        ("Add a {color} crown.", "Draw some {color} leaves."),
    ),
    "fruit": (
        ("Hang {color} fruit in the tree {side}.", "Dot the crown of the tree {side} with {color} fruit."),
        ("Add some {color} fruit.", "Draw {color} fruit."),
    ),
    "walls": (
        ("Draw {color} house walls {side}.", "Build the {color} walls of a house {side}."),
        ("Draw {color} walls.", "Build {color} walls."),
    ),
    "roof": (
        ("Put a {color} roof on the house {side}.", "Add a {color} roof on top of the walls {side}."),
        ("Add a {color} roof.", "Draw a {color} roof."),
    ),
    "door": (
        ("Add a {color} door to the house {side}.", "Draw a {color} door in the house {side}."),
        ("Draw a {color} door.", "Add a {color} door."),
    ),
    "window": (
        ("Put a {color} window in the house {side}.", "Draw a {color} window on the wall of the house {side}."),
        ("Add a {color} window.", "Draw a small {color} window."),
    ),
    "stem": (
        ("Draw a {color} flower stem {side}.", "Grow a {color} stem out of the ground {side}."),
        ("Draw a {color} stem.", "Add a {color} stem."),
    ),
    "blossom": (
        ("Put a {color} blossom on the stem {side}.", "Open a {color} flower on top of the stem {side}."),
        ("Add a {color} blossom.", "Draw a {color} flower head."),
    ),
    "sun": (
        ("Draw a {color} sun in the sky {side}.", "Paint a {color} sun high up {side}."),
        ("Draw a {color} sun.", "Add a {color} sun."),
    ),
    "cloud": (
        ("Draw a {color} cloud in the sky {side}.", "Paint a {color} cloud high up {side}."),
        ("Add a {color} cloud.", "Draw a {color} cloud."),
    ),
    "rain": (
        ("Let {color} rain fall from the cloud {side}.", "Draw {color} raindrops under the cloud {side}."),
        ("Add {color} raindrops.", "Draw some {color} rain."),
    ),
    "fence": (
        ("Build a {color} fence from the {a} to the {b}.", "Put up a {color} fence between the {a} and the {b}."),
        ("Put up a {color} fence.", "Add a {color} fence."),
    ),
}

_NUMBERS = {1: "one", 2: "two", 3: "three"}

# The hard world (``difficulty: hard``): a step's text names what the step needs (the color of the
# block / layer it goes on, the tops a plank or tray covers) and never the color of what it adds
# nor where the chain stands; that color is only visible in the step's own image.
_HARD_TEXTS: dict[str, tuple[str, ...]] = {
    "block_first": ("Put a block on the floor.", "Start a new stack with a block.", "Set a block down on the floor."),
    "block_on": ("Put a block on top of the {below} block.", "Stack a block onto the {below} one.",
                 "Place a block on the {below} block."),
    "plank": ("Lay a plank across the {tops} blocks.", "Bridge the {tops} blocks with a plank."),
    "layer_first": ("Pour some liquid into an empty {container}.", "Start filling an empty {container}."),
    "layer_on": ("Pour a layer on top of the {below} layer.", "Add liquid above the {below} layer.",
                 "Float a layer on the {below} one."),
    "lid": ("Close the {container} whose top layer is {below} with a lid.", "Put a lid on the {container} that ends in {below}."),
    "tray": ("Set a tray over the {containers} topped with {tops}.", "Cover the {tops} tops with a tray."),
}


def _pick(rng: np.random.Generator, options: Sequence):
    """A uniformly chosen element of ``options`` (keeps Python types, unlike ``rng.choice``)."""
    return options[int(rng.integers(len(options)))]


_VOWEL_ARTICLE = re.compile(r"\b([Aa]) (?=[aeiou])")


def _articles(text: str) -> str:
    """'a orange block' -> 'an orange block'."""
    return _VOWEL_ARTICLE.sub(r"\1n ", text)


def _texts(rng: np.random.Generator, action: str, **fields) -> tuple[str, str]:
    """(full text, ambiguous text) for ``action``, each from a randomly chosen template."""
    full, short = _TEXTS[action]
    return _articles(_pick(rng, full).format(**fields)), _articles(_pick(rng, short).format(**fields))


def _count(k: int, singular: str, plural: str) -> str:
    """'a tower', 'two towers', 'three towers'."""
    return f"a {singular}" if k == 1 else f"{_NUMBERS[k]} {plural}"


def _listing(words: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
