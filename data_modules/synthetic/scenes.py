"""Scene plans of the synthetic world: the structure of a procedure (root, chains, join), and what each
category (stacking, filling, garden) builds for it: the objects of its steps, their texts, the scenery."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from data_modules.synthetic.render import PALETTE, Prim, Thing, oval, polygon, rect
from data_modules.synthetic.texts import _count, _listing, _NUMBERS, _pick, _texts


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


# ---- structure -----------------------------------------------------------------------------------


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
