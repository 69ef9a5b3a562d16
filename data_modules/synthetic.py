"""The embedded synthetic procedural world: deterministic procedures with images, DAGs and boxes.

Every procedure builds a small scene out of 1-3 independent *chains* of objects, optionally after a
common *root* step and optionally followed by a *join* step that needs the last steps of several
chains. Three visually distinct categories share one renderer:

* ``stacking``: colored blocks stacked into towers on a floor line; a plank may bridge towers;
* ``filling``: jars / glasses / vases filled with colored liquid layers; a chain may end with a
  lid, and a tray may cover several containers;
* ``garden``: trees (trunk, crown, fruit), houses (walls, roof, door, window), flowers (stem,
  blossom), a sun and clouds (cloud, rain); the ground may be drawn first, and a fence may run
  from one object to another.

Design points:

* Each step's image shows the cumulative scene *after* the step, so the order is recoverable from
  the images (every step adds one object).
* With probability ``ambiguous_text_prob`` a step's text leaves out the detail that places it
  ("Add a red block." instead of "Put a red block on top of the blue block on the left.").
* The true dependency DAG (direct edges only) is stored as ``dag``; the authored order is a random
  linear extension of it. ``meta.chains`` lists the step indices of every chain.
* Every object's pixel box and label is recorded for each step's image (``boxes`` /
  ``box_labels``), and ``step.meta.new_object`` points at the object the step added.

Generation is seeded per procedure from ``(seed, split, index)``, so it is byte-for-byte
deterministic and changing one split's size leaves the other procedures unchanged.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from seqaware.io import DONE_MARKER, build_folder_once
from seqaware.procedure import Procedure, Step, write_procedures

log = logging.getLogger(__name__)

GENERATOR = "synthetic-v1"
HARD_GENERATOR = "hard-v2"
"""Bumped when the hard world's procedures change (v2: at most two chains), so cached copies are redone."""
SPLITS = ("train", "val", "test")
CATEGORIES = ("stacking", "filling", "garden")
_SPLIT_CODES = {"train": 0, "val": 1, "test": 2}

OPENER_PROB = 0.15
"""Share of procedures whose first step starts with "First, " (the only order word used)."""


@dataclass
class SyntheticConfig:
    """Size and look of the synthetic dataset; every field takes part in the cache key."""

    num_train: int = 800
    num_val: int = 100
    num_test: int = 100
    min_steps: int = 3
    max_steps: int = 5
    image_size: int = 128
    """Rendered square PNG size in pixels."""
    ambiguous_text_prob: float = 0.4
    """Share of steps whose text omits the disambiguating detail."""
    seed: int = 0
    categories: tuple[str, ...] = CATEGORIES
    difficulty: str = "easy"
    """``easy``: each image shows the cumulative scene, so the order is readable from the images.
    ``hard``: each image shows only the object its step adds (moved to a random place, beside
    neutral distractor shapes) and each text names what the step needs, not what it adds; neither
    modality alone gives the order, the two together determine the DAG (see :func:`make_procedure`);
    a procedure has one or two chains, so long chains with a single valid order are common."""

    def __post_init__(self) -> None:
        # Normalize types (Hydra passes ListConfig, YAML may give 0 for 0.0) so equal configs hash alike.
        for name in ("num_train", "num_val", "num_test", "min_steps", "max_steps", "image_size", "seed"):
            setattr(self, name, int(getattr(self, name)))
        self.ambiguous_text_prob = float(self.ambiguous_text_prob)
        self.categories = tuple(str(c) for c in self.categories)
        unknown = [c for c in self.categories if c not in _CATEGORY_SPECS]
        if unknown or not self.categories:
            raise ValueError(f"categories must be a non-empty subset of {CATEGORIES}, got {self.categories}")
        for name in ("num_train", "num_val", "num_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 2 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 2 <= min_steps <= max_steps, got {self.min_steps} and {self.max_steps}")
        limit = min(_CATEGORY_SPECS[c].capacity for c in self.categories)
        if self.max_steps > limit:
            raise ValueError(f"max_steps={self.max_steps} is more than the categories {self.categories} "
                             f"can build (at most {limit} steps)")
        if self.image_size < 32:
            raise ValueError(f"image_size must be >= 32 pixels, got {self.image_size}")
        if not 0.0 <= self.ambiguous_text_prob <= 1.0:
            raise ValueError(f"ambiguous_text_prob must be in [0, 1], got {self.ambiguous_text_prob}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        self.difficulty = str(self.difficulty)
        if self.difficulty not in ("easy", "hard"):
            raise ValueError(f"difficulty must be 'easy' or 'hard', got {self.difficulty!r}")
        if self.difficulty == "hard" and set(self.categories) - set(HARD_CATEGORIES):
            raise ValueError(f"difficulty=hard builds the categories {list(HARD_CATEGORIES)} only (in the garden the "
                             f"part names give the order away); got categories={list(self.categories)}")

    def split_sizes(self) -> dict[str, int]:
        return {"train": self.num_train, "val": self.num_val, "test": self.num_test}


# --------------------------------------------------------------------------------------------------
# Rendering: primitives in normalized coordinates, one canvas that draws objects and records boxes.
# --------------------------------------------------------------------------------------------------

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "blue": (40, 90, 225),
    "green": (40, 165, 60),
    "yellow": (245, 215, 40),
    "orange": (245, 135, 25),
    "purple": (140, 60, 190),
    "pink": (245, 130, 195),
    "cyan": (40, 205, 225),
    "brown": (135, 85, 45),
    "gray": (140, 140, 140),
    "white": (250, 250, 250),
    # scenery tones, never named in texts
    "floor": (85, 85, 85),
    "table": (160, 125, 90),
    "glass": (238, 242, 248),
}
PALETTE = ("red", "blue", "green", "yellow", "orange", "purple", "pink", "cyan", "brown", "gray")
"""Colors of blocks, liquid layers, lids, planks and trays (distinct within a procedure while possible)."""
OUTLINE = (35, 35, 35)


@dataclass(frozen=True)
class Prim:
    """One drawing primitive in normalized coordinates (0..1, y pointing down).

    ``rect`` and ``ellipse`` take two corner points, ``polygon`` any number of points.
    """

    kind: str
    points: tuple[tuple[float, float], ...]
    color: str
    outline: bool = True


def rect(x0: float, y0: float, x1: float, y1: float, color: str, outline: bool = True) -> Prim:
    return Prim("rect", ((x0, y0), (x1, y1)), color, outline)


def oval(cx: float, cy: float, rx: float, ry: float, color: str, outline: bool = True) -> Prim:
    return Prim("ellipse", ((cx - rx, cy - ry), (cx + rx, cy + ry)), color, outline)


def polygon(points: Sequence[tuple[float, float]], color: str, outline: bool = True) -> Prim:
    return Prim("polygon", tuple(points), color, outline)


@dataclass(frozen=True)
class Thing:
    """An object of a scene (what a step adds, or scenery) and the label of its box."""

    label: str
    prims: tuple[Prim, ...]


class Canvas:
    """A cumulative scene: draws objects one after the other and records each object's pixel box."""

    def __init__(self, size: int, background: tuple[int, int, int]):
        self.size = size
        self.image = Image.new("RGB", (size, size), background)
        self._draw = ImageDraw.Draw(self.image)
        self._line_width = max(1, round(size / 100))
        self.boxes: list[list[int]] = []
        self.labels: list[str] = []

    def add(self, thing: Thing) -> int:
        """Draw ``thing`` over the current scene; returns the index of its box."""
        xs: list[int] = []
        ys: list[int] = []
        for prim in thing.prims:
            points = [(round(x * self.size), round(y * self.size)) for x, y in prim.points]
            fill = COLORS[prim.color]
            outline = OUTLINE if prim.outline else None
            if prim.kind == "rect":
                self._draw.rectangle(points, fill=fill, outline=outline, width=self._line_width)
            elif prim.kind == "ellipse":
                self._draw.ellipse(points, fill=fill, outline=outline, width=self._line_width)
            elif prim.kind == "polygon":
                self._draw.polygon(points, fill=fill, outline=outline, width=self._line_width)
            else:
                raise ValueError(f"unknown primitive {prim.kind!r}")
            xs.extend(p[0] for p in points)
            ys.extend(p[1] for p in points)
        last = self.size - 1
        self.boxes.append([max(0, min(xs)), max(0, min(ys)), min(last, max(xs)), min(last, max(ys))])
        self.labels.append(thing.label)
        return len(self.boxes) - 1


# --------------------------------------------------------------------------------------------------
# Texts: every action has templates with the disambiguating detail ("full") and without ("short").
# --------------------------------------------------------------------------------------------------

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
HARD_CATEGORIES = ("stacking", "filling")
"""Categories the hard world can build: in the garden the part names alone (trunk, crown, fruit)
give the order away."""
DISTRACTOR_COLORS = ("white", "floor")
"""Colors of the hard world's distractor shapes (white, charcoal): far from every palette color and never
named in a text."""


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


# --------------------------------------------------------------------------------------------------
# Scene plans: the structure of a procedure (root, chains, join) and the objects of its steps.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Structure:
    """Shape of a procedure's DAG before any object is chosen."""

    root: bool
    """Whether a common first step precedes the chains (garden: the ground)."""
    lengths: tuple[int, ...]
    """Number of steps of every chain, chains ordered left to right in the picture."""
    span: tuple[int, ...] | None
    """Adjacent chains whose last steps the join step needs; None without a join step."""


@dataclass
class _Node:
    """One planned step: the object it adds, its (full, ambiguous) texts, and the action and fields
    the hard world's text is written from (:data:`_HARD_TEXTS`)."""

    thing: Thing
    texts: tuple[str, str]
    action: str = ""
    fields: dict = field(default_factory=dict)


@dataclass
class _Scene:
    """Everything a category decides for one procedure; the authored order is chosen afterwards."""

    title: str
    subtype: str
    background: tuple[int, int, int]
    scenery: list[Thing]
    chains: list[list[_Node]]
    root: _Node | None = None
    join: _Node | None = None
    join_span: tuple[int, ...] = ()
    rooted: list[bool] = field(default_factory=list)
    """Per chain: whether its first step depends on the root step."""


@dataclass(frozen=True)
class _Column:
    """Horizontal slot of one chain and the words that name it."""

    x: float
    loc: str  # adjective: "left stack"
    side: str  # phrase: "on the left"


_LAYOUT = {1: (0.5,), 2: (0.3, 0.7), 3: (0.2, 0.5, 0.8)}
_LOCATIONS = {1: ("middle",), 2: ("left", "right"), 3: ("left", "middle", "right")}


def _columns(rng: np.random.Generator, k: int) -> list[_Column]:
    """Slots of ``k`` chains, left to right, with a little jitter."""
    return [
        _Column(x + rng.uniform(-0.02, 0.02), loc, "in the middle" if loc == "middle" else f"on the {loc}")
        for x, loc in zip(_LAYOUT[k], _LOCATIONS[k])
    ]


def _span_phrase(columns: list[_Column], span: tuple[int, ...], plural: str) -> str:
    """'both stacks', 'all three jars', 'the left and middle stacks'."""
    if len(span) == len(columns):
        return f"both {plural}" if len(span) == 2 else f"all three {plural}"
    return f"the {columns[span[0]].loc} and {columns[span[-1]].loc} {plural}"


def _tint(rng: np.random.Generator, base: tuple[int, int, int], spread: int = 10) -> tuple[int, int, int]:
    """``base`` shifted by a small random amount per channel (per-procedure background variation)."""
    return tuple(int(np.clip(c + rng.integers(-spread, spread + 1), 0, 255)) for c in base)


class _ColorDraw:
    """Palette colors without repetition until the palette is used up, then a fresh round."""

    def __init__(self, rng: np.random.Generator, palette: Sequence[str] = PALETTE):
        self._rng = rng
        self._palette = list(palette)
        self._left: list[str] = []

    def __call__(self) -> str:
        if not self._left:
            self._left = [self._palette[i] for i in self._rng.permutation(len(self._palette))]
        return self._left.pop()


# ---- stacking ------------------------------------------------------------------------------------

_MAX_BLOCKS = 5


def _build_stacking(rng: np.random.Generator, structure: Structure) -> _Scene:
    """Towers of distinctly colored blocks on a floor line; a plank may bridge adjacent towers."""
    k = len(structure.lengths)
    columns = _columns(rng, k)
    colors = _ColorDraw(rng)
    floor_y = rng.uniform(0.86, 0.9)
    width = rng.uniform(0.16, 0.19) if k == 3 else rng.uniform(0.18, 0.24)
    height = rng.uniform(0.1, 0.115)
    scenery = [Thing("floor", (rect(0.02, floor_y, 0.98, floor_y + 0.025, "floor", outline=False),))]

    chains, tops, top_colors = [], [], []
    for column, length in zip(columns, structure.lengths):
        nodes, below = [], None
        for level in range(length):
            color = colors()
            x = column.x + rng.uniform(-0.012, 0.012)
            bottom = floor_y - level * height
            thing = Thing(f"{color} block", (rect(x - width / 2, bottom - height, x + width / 2, bottom, color),))
            action = "block_first" if below is None else "block_on"
            texts = _texts(rng, action, color=color, below=below, loc=column.loc, side=column.side)
            nodes.append(_Node(thing, texts, action, {"below": below}))
            below = color
        chains.append(nodes)
        tops.append(floor_y - length * height)
        top_colors.append(below)

    join = None
    if structure.span:
        color = colors()
        left = columns[structure.span[0]].x - width / 2 - 0.03
        right = columns[structure.span[-1]].x + width / 2 + 0.03
        top = min(tops[c] for c in structure.span)
        plank = Thing(f"{color} plank", (rect(left, top - 0.035, right, top, color),))
        join = _Node(plank, _texts(rng, "plank", color=color, span=_span_phrase(columns, structure.span, "stacks")),
                     "plank", {"tops": _listing([top_colors[c] for c in structure.span])})

    towers = _count(k, "tower", "towers")
    title = _pick(rng, ("Build {t} of blocks", "Stack colored blocks into {t}", "Make {t} of colored blocks"))
    title = title.format(t=towers) + (" and bridge them" if join else "")
    return _Scene(title, f"{_NUMBERS[k]} {'stack' if k == 1 else 'stacks'}", _tint(rng, (236, 236, 230)),
                  scenery, chains, join=join, join_span=structure.span or ())


# ---- filling -------------------------------------------------------------------------------------

_MAX_LAYERS = 4
_LID_PROB = 0.3
_CONTAINERS = {
    # name: (half width at the bottom, half width at the top) as factors, plural
    "jar": (1.0, 1.0, "jars"),
    "glass": (0.72, 1.0, "glasses"),
    "vase": (1.0, 0.72, "vases"),
}


def _build_filling(rng: np.random.Generator, structure: Structure) -> _Scene:
    """Containers on a table, filled layer by layer; lids close some, a tray may cover several."""
    k = len(structure.lengths)
    columns = _columns(rng, k)
    colors = _ColorDraw(rng)
    kind = _pick(rng, list(_CONTAINERS))
    bottom_factor, top_factor, plural = _CONTAINERS[kind]
    table_y = rng.uniform(0.86, 0.9)
    height = rng.uniform(0.5, 0.56)
    top_y = table_y - height
    half_width = {1: 0.15, 2: 0.13, 3: 0.1}[k]
    layer_height = height * 0.8 / _MAX_LAYERS
    inset = 0.012  # keeps the liquid inside the container outline
    lid_height = 0.035

    def half(y: float) -> float:
        """Half width of the container at height ``y``."""
        t = (table_y - y) / height
        return half_width * (bottom_factor + (top_factor - bottom_factor) * t)

    scenery = [Thing("table", (rect(0.0, table_y, 1.0, table_y + 0.04, "table", outline=False),))]
    for column in columns:
        x = column.x
        outline = [(x - half(table_y), table_y), (x - half(top_y), top_y), (x + half(top_y), top_y),
                   (x + half(table_y), table_y)]
        scenery.append(Thing(kind, (polygon(outline, "glass"),)))

    chains, lidded, top_colors = [], [], []
    for column, length in zip(columns, structure.lengths):
        x = column.x
        has_lid = length > _MAX_LAYERS or (length >= 2 and rng.random() < _LID_PROB)
        nodes, below = [], None
        for level in range(length - has_lid):
            color = colors()
            y0 = table_y - inset - level * layer_height
            y1 = y0 - layer_height
            points = [(x - half(y0) + inset, y0), (x - half(y1) + inset, y1),
                      (x + half(y1) - inset, y1), (x + half(y0) - inset, y0)]
            action = "layer_first" if below is None else "layer_on"
            texts = _texts(rng, action, color=color, below=below, loc=column.loc, side=column.side, container=kind)
            nodes.append(_Node(Thing(f"{color} layer", (polygon(points, color),)), texts, action,
                               {"below": below, "container": kind}))
            below = color
        if has_lid:
            color = colors()
            lid = rect(x - half(top_y) - 0.015, top_y - lid_height, x + half(top_y) + 0.015, top_y, color)
            texts = _texts(rng, "lid", color=color, loc=column.loc, side=column.side, container=kind)
            nodes.append(_Node(Thing(f"{color} lid", (lid,)), texts, "lid", {"below": below, "container": kind}))
            below = color
        chains.append(nodes)
        lidded.append(has_lid)
        top_colors.append(below)

    join = None
    if structure.span:
        color = colors()
        left = columns[structure.span[0]].x - half(top_y) - 0.035
        right = columns[structure.span[-1]].x + half(top_y) + 0.035
        top = top_y - (lid_height if any(lidded[c] for c in structure.span) else 0.0)
        tray = Thing(f"{color} tray", (rect(left, top - 0.035, right, top, color),))
        join = _Node(tray, _texts(rng, "tray", color=color, span=_span_phrase(columns, structure.span, plural)), "tray",
                     {"tops": _listing([top_colors[c] for c in structure.span]), "containers": plural})

    containers = _count(k, kind, plural)
    title = _pick(rng, ("Layer colored liquids in {c}", "Fill {c} with colored layers", "Make layered drinks in {c}"))
    title = title.format(c=containers) + (" and cover them" if join else "")
    return _Scene(title, f"{_NUMBERS[k]} {kind if k == 1 else plural}", _tint(rng, (240, 236, 228)),
                  scenery, chains, join=join, join_span=structure.span or ())


# ---- garden --------------------------------------------------------------------------------------

_SKY_Y = 0.15
_GARDEN_SCALE = {1: 1.35, 2: 1.3, 3: 1.1}
"""Size of the garden objects by number of columns (fewer columns leave room for bigger objects)."""


@dataclass(frozen=True)
class _Part:
    """One drawable part of a garden object: its colors, and its shape for a color.

    Shapes are in local units around the object's anchor: the foot of a ground object (on the
    ground line), the center of a sky object; :func:`_placed` moves and scales them into the picture.
    """

    colors: tuple[str, ...]
    shape: Callable[[str], tuple[Prim, ...]]


def _placed(prims: Sequence[Prim], x: float, y: float, scale: float) -> tuple[Prim, ...]:
    """``prims`` in local units, moved to the anchor ``(x, y)`` and scaled by ``scale``."""
    return tuple(Prim(p.kind, tuple((x + scale * px, y + scale * py) for px, py in p.points), p.color, p.outline)
                 for p in prims)


def _blossom(c: str) -> tuple[Prim, ...]:
    """Four petals around a contrasting center, on top of a stem."""
    offsets = ((-0.035, 0), (0.035, 0), (0, -0.035), (0, 0.035))
    petals = tuple(oval(dx, -0.22 + dy, 0.035, 0.035, c) for dx, dy in offsets)
    return petals + (oval(0, -0.22, 0.022, 0.022, "orange" if c == "yellow" else "yellow"),)


def _fence(x0: float, x1: float, c: str) -> tuple[Prim, ...]:
    """A fence from ``x0`` to ``x1`` in local vertical units (in front of the ground line)."""
    posts = np.linspace(x0, x1, max(2, int((x1 - x0) / 0.06) + 1))
    rails = (rect(x0, 0.035, x1, 0.05, c), rect(x0, 0.075, x1, 0.09, c))
    return rails + tuple(rect(float(px) - 0.01, 0.015, float(px) + 0.01, 0.11, c) for px in posts)


_GARDEN_PARTS: dict[str, _Part] = {
    "trunk": _Part(("brown",), lambda c: (rect(-0.025, -0.24, 0.025, 0, c),)),
    "crown": _Part(("green", "orange", "yellow"), lambda c: (oval(0, -0.27, 0.11, 0.1, c),)),
    "fruit": _Part(("red", "orange", "yellow", "purple"), lambda c: tuple(
        oval(dx, dy, 0.02, 0.02, c) for dx, dy in ((-0.05, -0.25), (0.045, -0.29), (0.0, -0.33), (0.02, -0.21)))),
    "walls": _Part(("red", "blue", "yellow", "orange", "white", "pink"), lambda c: (rect(-0.1, -0.18, 0.1, 0, c),)),
    "roof": _Part(("red", "brown", "blue", "purple", "gray"),
                  lambda c: (polygon([(-0.115, -0.18), (0, -0.31), (0.115, -0.18)], c),)),
    "door": _Part(("brown", "blue", "green", "red"), lambda c: (rect(-0.03, -0.11, 0.03, 0, c),)),
    "window": _Part(("cyan", "yellow", "white"), lambda c: (rect(0.045, -0.145, 0.085, -0.095, c),)),
    "stem": _Part(("green",), lambda c: (rect(-0.01, -0.2, 0.01, 0, c),)),
    "blossom": _Part(("red", "pink", "yellow", "purple", "orange", "blue", "white"), _blossom),
    "sun": _Part(("yellow", "orange"), lambda c: (oval(0, 0, 0.075, 0.075, c),)),
    "cloud": _Part(("white", "gray"), lambda c: (
        oval(-0.06, 0, 0.06, 0.04, c, outline=False), oval(0.05, 0, 0.06, 0.04, c, outline=False),
        oval(0, -0.03, 0.07, 0.05, c, outline=False))),
    "rain": _Part(("blue", "cyan"), lambda c: tuple(
        oval(dx, dy, 0.008, 0.018, c) for dx, dy in ((-0.07, 0.1), (-0.035, 0.16), (0.0, 0.1), (0.035, 0.16),
                                                     (0.07, 0.1)))),
}
_GARDEN_KINDS: dict[str, tuple[bool, tuple[str, ...]]] = {
    # kind: (stands on the ground, parts in building order)
    "tree": (True, ("trunk", "crown", "fruit")),
    "house": (True, ("walls", "roof", "door", "window")),
    "flower": (True, ("stem", "blossom")),
    "sun": (False, ("sun",)),
    "cloud": (False, ("cloud", "rain")),
}


def _garden_kinds(rng: np.random.Generator, structure: Structure) -> list[str]:
    """Object kind of every chain: long enough for its chain, grounded where the root or fence needs it."""
    k = len(structure.lengths)
    grounded = set()
    if structure.span:
        grounded |= {structure.span[0], structure.span[-1]}  # the fence runs between two ground objects
    if structure.root and not grounded:
        grounded.add(int(rng.integers(k)))  # at least one chain builds on the ground step
    kinds: list[str] = []
    for c, length in enumerate(structure.lengths):
        options = [name for name, (on_ground, parts) in _GARDEN_KINDS.items()
                   if len(parts) >= length and (on_ground or c not in grounded)
                   and not (name == "sun" and "sun" in kinds)]
        kinds.append(_pick(rng, options))
    return kinds


def _listing(words: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _build_garden(rng: np.random.Generator, structure: Structure) -> _Scene:
    """Garden objects built part by part in their columns; the ground may come first, a fence last."""
    k = len(structure.lengths)
    columns = _columns(rng, k)
    ground_y = rng.uniform(0.79, 0.83)
    scale = _GARDEN_SCALE[k]
    kinds = _garden_kinds(rng, structure)

    ground_color = _pick(rng, ("green", "brown"))
    ground = Thing(f"{ground_color} ground", (rect(0.0, ground_y, 1.0, 1.0, ground_color, outline=False),))
    root = _Node(ground, _texts(rng, "ground", color=ground_color)) if structure.root else None

    chains = []
    for column, kind, length in zip(columns, kinds, structure.lengths):
        on_ground, parts = _GARDEN_KINDS[kind]
        anchor_y = ground_y if on_ground else _SKY_Y
        nodes, previous = [], None
        for name in parts[:length]:
            part = _GARDEN_PARTS[name]
            color = _pick(rng, [c for c in part.colors if c != previous] or list(part.colors))
            thing = Thing(f"{color} {name}", _placed(part.shape(color), column.x, anchor_y, scale))
            nodes.append(_Node(thing, _texts(rng, name, color=color, side=column.side)))
            previous = color
        chains.append(nodes)

    join = None
    if structure.span:
        first, last = columns[structure.span[0]], columns[structure.span[-1]]
        color = _pick(rng, ("brown", "white", "gray"))
        fence = _placed(_fence((first.x - 0.5) / scale, (last.x - 0.5) / scale, color), 0.5, ground_y, scale)
        texts = _texts(rng, "fence", color=color, a=f"{kinds[structure.span[0]]} {first.side}",
                       b=f"{kinds[structure.span[-1]]} {last.side}")
        join = _Node(Thing(f"{color} fence", fence), texts)

    things = [_count(n, kind, kind + "s") for kind, n in Counter(kinds).items()] + (["a fence"] if join else [])
    title = _pick(rng, ("Draw a garden with {t}", "Paint a scene with {t}", "Make a picture of {t}"))
    return _Scene(title.format(t=_listing(things)), _listing(sorted(set(kinds))), _tint(rng, (185, 215, 240)),
                  [] if root else [ground], chains, root=root, join=join, join_span=structure.span or (),
                  rooted=[_GARDEN_KINDS[kind][0] for kind in kinds])


# ---- category table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _CategorySpec:
    build: Callable[[np.random.Generator, Structure], _Scene]
    max_chain: int
    """Most steps one chain can have."""
    root_prob: float
    join_prob: float
    max_chains: int = 3

    @property
    def capacity(self) -> int:
        """Most steps a procedure of this category can have."""
        return self.max_chains * self.max_chain + (self.root_prob > 0) + (self.join_prob > 0)


_CATEGORY_SPECS: dict[str, _CategorySpec] = {
    "stacking": _CategorySpec(_build_stacking, max_chain=_MAX_BLOCKS, root_prob=0.0, join_prob=0.35),
    "filling": _CategorySpec(_build_filling, max_chain=_MAX_LAYERS + 1, root_prob=0.0, join_prob=0.35),
    "garden": _CategorySpec(_build_garden, max_chain=max(len(p) for _, p in _GARDEN_KINDS.values()),
                            root_prob=0.3, join_prob=0.35),
}


# --------------------------------------------------------------------------------------------------
# Structure, authored order, and one procedure end to end.
# --------------------------------------------------------------------------------------------------


def _composition(rng: np.random.Generator, total: int, parts: int, most: int) -> tuple[int, ...]:
    """Random split of ``total`` into ``parts`` chain lengths, each in ``[1, most]``."""
    lengths = [1] * parts
    for _ in range(total - parts):
        lengths[_pick(rng, [i for i in range(parts) if lengths[i] < most])] += 1
    return tuple(lengths)


def _plan_structure(rng: np.random.Generator, num_steps: int, spec: _CategorySpec, min_chains: int = 2,
                    max_chains: int | None = None) -> Structure:
    """Root / chains / join layout of a procedure with ``num_steps`` steps.

    ``min_chains`` (2, or 1 in the hard world) to ``max_chains`` chains (the category's three, or 2
    in the hard world; one chain only for two-step procedures); the DAG always has at least one
    edge, so a procedure made only of one-step chains gets a root or a join step.
    """
    most_chains = spec.max_chains if max_chains is None else min(max_chains, spec.max_chains)
    if num_steps == 2:
        return Structure(root=False, lengths=(2,), span=None)
    want_root = bool(rng.random() < spec.root_prob)
    want_join = bool(rng.random() < spec.join_prob)
    choices = [(want_root, want_join), (want_root, False), (False, want_join), (False, False), (True, True),
               (True, False), (False, True)]
    for root, join in choices:
        if (root and spec.root_prob == 0) or (join and spec.join_prob == 0):
            continue
        rest = num_steps - root - join
        counts = [k for k in range(min_chains, most_chains + 1)
                  if k <= rest <= k * spec.max_chain and (root or join or rest > k) and (k >= 2 or not join)]
        if not counts:
            continue
        k = _pick(rng, counts)
        span = None
        if join:
            span = (0, 1) if k == 2 else _pick(rng, [(0, 1), (1, 2), (0, 1, 2)])
        return Structure(root=root, lengths=_composition(rng, rest, k, spec.max_chain), span=span)
    raise ValueError(f"cannot lay out a procedure of {num_steps} steps")


def random_linear_extension(rng: np.random.Generator, parents: list[list[int]]) -> list[int]:
    """A random topological order of the nodes: each next node is drawn among those now ready."""
    done: set[int] = set()
    order: list[int] = []
    while len(order) < len(parents):
        ready = [n for n in range(len(parents)) if n not in done and all(p in done for p in parents[n])]
        node = _pick(rng, ready)
        order.append(node)
        done.add(node)
    return order


def _seed_rng(cfg: SyntheticConfig, split: str, index: int) -> np.random.Generator:
    return np.random.default_rng([cfg.seed, _SPLIT_CODES[split], index])


def procedure_id(split: str, index: int) -> str:
    return f"synth-{split}-{index + 1:06d}"


def _moved(thing: Thing, rng: np.random.Generator, margin: float = 0.04) -> Thing:
    """``thing`` shifted so that its box sits at a random place of the picture (same size)."""
    xs = [x for prim in thing.prims for x, _ in prim.points]
    ys = [y for prim in thing.prims for _, y in prim.points]
    shift = []
    for lo, hi in ((min(xs), max(xs)), (min(ys), max(ys))):
        half = (hi - lo) / 2
        room = (margin + half, 1 - margin - half)
        centre = rng.uniform(*room) if room[0] < room[1] else 0.5
        shift.append(centre - (lo + hi) / 2)
    dx, dy = shift
    prims = tuple(Prim(p.kind, tuple((x + dx, y + dy) for x, y in p.points), p.color, p.outline) for p in thing.prims)
    return Thing(thing.label, prims)


def _hard_canvas(thing: Thing, rng: np.random.Generator, size: int, background: tuple[int, int, int]) -> Canvas:
    """The hard world's step image: one or two neutral distractor shapes, then the step's object
    alone at a random place (no scenery, nothing added by earlier steps)."""
    canvas = Canvas(size, background)
    for _ in range(int(rng.integers(1, 3))):
        cx, cy, r = rng.uniform(0.12, 0.88), rng.uniform(0.12, 0.88), rng.uniform(0.04, 0.08)
        color = _pick(rng, DISTRACTOR_COLORS)
        shape = oval(cx, cy, r, r, color) if rng.random() < 0.5 else rect(cx - r, cy - r, cx + r, cy + r, color)
        canvas.add(Thing("distractor", (shape,)))
    canvas.add(_moved(thing, rng))
    return canvas


def make_procedure(cfg: SyntheticConfig, split: str, index: int, out_dir: str | os.PathLike) -> Procedure:
    """Plan, order, render and describe procedure ``index`` of ``split``; writes its images.

    ``difficulty: hard``: step k's image is drawn by :func:`_hard_canvas` (its own object only) and
    its text from :data:`_HARD_TEXTS` (what it needs). Each dependency edge p -> k is then stated
    across modalities -- k's text names a color that only p's image shows -- so text and images
    together determine the DAG, while the texts alone only tell chain starts from later steps and
    the images alone are unordered objects.
    """
    rng = _seed_rng(cfg, split, index)
    hard = cfg.difficulty == "hard"
    category = cfg.categories[index % len(cfg.categories)]
    spec = _CATEGORY_SPECS[category]
    num_steps = int(rng.integers(cfg.min_steps, cfg.max_steps + 1))
    # hard: one or two chains, so more procedures have long chains (one valid order) than branching DAGs
    structure = _plan_structure(rng, num_steps, spec, min_chains=1, max_chains=2) if hard else \
        _plan_structure(rng, num_steps, spec)
    scene = spec.build(rng, structure)

    # Flatten the plan into nodes with direct dependencies: root -> chain heads, chain links, tails -> join.
    nodes: list[_Node] = []
    parents: list[list[int]] = []
    chain_nodes: list[list[int]] = []
    root_id = join_id = None
    if scene.root is not None:
        root_id = len(nodes)
        nodes.append(scene.root)
        parents.append([])
    for c, chain in enumerate(scene.chains):
        ids = []
        for position, node in enumerate(chain):
            if position > 0:
                parents.append([ids[-1]])
            else:
                parents.append([root_id] if root_id is not None and scene.rooted[c] else [])
            ids.append(len(nodes))
            nodes.append(node)
        chain_nodes.append(ids)
    if scene.join is not None:
        join_id = len(nodes)
        nodes.append(scene.join)
        parents.append([chain_nodes[c][-1] for c in scene.join_span])

    order = random_linear_extension(rng, parents)
    step_of = {node: k for k, node in enumerate(order)}
    edges = sorted((step_of[p], step_of[n]) for n in range(len(nodes)) for p in parents[n])
    chain_of = {node: c for c, ids in enumerate(chain_nodes) for node in ids}

    pid = procedure_id(split, index)
    image_dir = Path(out_dir) / "images"
    canvas = Canvas(cfg.image_size, scene.background)
    for thing in scene.scenery:
        canvas.add(thing)
    opener = not hard and bool(rng.random() < OPENER_PROB)
    steps = []
    for k, node in enumerate(order):
        if hard:
            canvas = _hard_canvas(nodes[node].thing, rng, cfg.image_size, scene.background)
            new_object = len(canvas.boxes) - 1
        else:
            new_object = canvas.add(nodes[node].thing)
        name = f"{pid}_{k}.png"
        canvas.image.save(image_dir / name, format="PNG")
        if hard:  # the hard texts are partial by design: ambiguous_text_prob does not apply
            ambiguous = False
            text = _articles(_pick(rng, _HARD_TEXTS[nodes[node].action]).format(**nodes[node].fields))
        else:
            ambiguous = bool(rng.random() < cfg.ambiguous_text_prob)
            text = nodes[node].texts[1] if ambiguous else nodes[node].texts[0]
        if k == 0 and opener:
            text = "First, " + text[0].lower() + text[1:]
        steps.append(Step(text=text, images=[f"images/{name}"], boxes=[list(b) for b in canvas.boxes],
                          box_labels=list(canvas.labels),
                          meta={"new_object": new_object, "chain": chain_of.get(node), "ambiguous": ambiguous}))
    meta = {
        "generator": GENERATOR,
        "chains": [[step_of[n] for n in ids] for ids in chain_nodes],
        "root": None if root_id is None else step_of[root_id],
        "join": None if join_id is None else step_of[join_id],
        **({"difficulty": "hard"} if hard else {}),  # easy procedures stay byte-identical to earlier caches
    }
    return Procedure(id=pid, steps=steps, split=split, title=scene.title, category=[category, scene.subtype],
                     dag=edges, meta=meta)


# --------------------------------------------------------------------------------------------------
# Public entry points.
# --------------------------------------------------------------------------------------------------


def generate(cfg: SyntheticConfig, out_dir: str | os.PathLike, progress: bool = True) -> dict[str, Path]:
    """Write ``out_dir/{train,val,test}.jsonl`` and ``out_dir/images/*.png``; returns split -> JSONL path."""
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    sizes = cfg.split_sizes()
    start = time.perf_counter()
    paths: dict[str, Path] = {}
    with tqdm(total=sum(sizes.values()), desc="synthetic procedures", unit="proc", disable=not progress) as bar:
        for split in SPLITS:
            procedures = []
            for index in range(sizes[split]):
                procedures.append(make_procedure(cfg, split, index, out_dir))
                bar.update(1)
            paths[split] = out_dir / f"{split}.jsonl"
            write_procedures(paths[split], procedures)
    log.info("generated %d synthetic procedures in %s (%.1fs)", sum(sizes.values()), out_dir,
             time.perf_counter() - start)
    return paths


def config_key(cfg: SyntheticConfig) -> str:
    """Short stable hash of the config and generator version: the cache folder name."""
    fields = asdict(cfg)
    if fields["difficulty"] == "easy":  # the field came later: easy worlds keep their cache folders
        del fields["difficulty"]
    else:
        fields["hard_generator"] = HARD_GENERATOR
    payload = json.dumps({"generator": GENERATOR, **fields}, sort_keys=True, default=list)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def ensure_synthetic(cfg: SyntheticConfig, cache_dir: str | os.PathLike, progress: bool = True) -> Path:
    """The folder ``cache_dir/<config key>`` holding the generated dataset, generating it once
    (atomically, safe under concurrent runs: :func:`seqaware.io.build_folder_once`)."""

    def build(out: Path) -> None:
        log.info("generating the synthetic dataset into %s", Path(cache_dir) / config_key(cfg))
        generate(cfg, out, progress=progress)
        (out / "config.json").write_text(json.dumps({"generator": GENERATOR, **asdict(cfg)}, indent=2, default=list))

    return build_folder_once(cache_dir, config_key(cfg), build)
