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

The package by concern: :mod:`~data_modules.synthetic.config` (the settings, the generator versions),
:mod:`~data_modules.synthetic.render` (primitives, the canvas), :mod:`~data_modules.synthetic.texts` (step
texts), :mod:`~data_modules.synthetic.scenes` (structure and the categories' scene plans),
:mod:`~data_modules.synthetic.assemble` (one procedure end to end); this file writes a world and caches it.
Names with a leading underscore are internal to the package.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from data_modules.synthetic.assemble import (DISTRACTOR_COLORS, OPENER_PROB, make_procedure, procedure_id,
                                             random_linear_extension)
from data_modules.synthetic.config import (CATEGORIES, GENERATOR, HARD_CATEGORIES, HARD_GENERATOR, SPLITS,
                                           SyntheticConfig)
from data_modules.synthetic.render import COLORS, OUTLINE, PALETTE, Canvas, Prim, Thing, oval, polygon, rect
from data_modules.synthetic.scenes import Structure
from seqaware.io import DONE_MARKER, build_folder_once
from seqaware.procedure import write_procedures

__all__ = ["CATEGORIES", "COLORS", "DISTRACTOR_COLORS", "DONE_MARKER", "GENERATOR", "HARD_CATEGORIES", "HARD_GENERATOR",
           "OPENER_PROB", "OUTLINE", "PALETTE", "SPLITS", "Canvas", "Prim", "Structure", "SyntheticConfig", "Thing",
           "config_key", "ensure_synthetic", "generate", "make_procedure", "oval", "polygon", "procedure_id",
           "random_linear_extension", "rect"]

log = logging.getLogger(__name__)


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
