"""Rendering of the synthetic world's images: drawing primitives in normalized coordinates, and one
canvas that draws objects and records each object's pixel box."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from PIL import Image, ImageDraw

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
