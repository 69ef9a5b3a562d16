"""One synthetic procedure end to end (:func:`make_procedure`): its structure and scene planned, an
authored order drawn from the DAG, each step's image rendered (cumulative, or the hard world's one
object among distractors) and its text chosen."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from data_modules.synthetic.config import GENERATOR, SyntheticConfig
from data_modules.synthetic.render import Canvas, Prim, Thing, oval, rect
from data_modules.synthetic.scenes import _CATEGORY_SPECS, _Node, _plan_structure
from data_modules.synthetic.texts import _articles, _HARD_TEXTS, _pick
from seqaware.procedure import Procedure, Step

_SPLIT_CODES = {"train": 0, "val": 1, "test": 2}

OPENER_PROB = 0.15
"""Share of procedures whose first step starts with "First, " (the only order word used)."""
DISTRACTOR_COLORS = ("white", "floor")
"""Colors of the hard world's distractor shapes (white, charcoal): far from every palette color and never
named in a text."""


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
