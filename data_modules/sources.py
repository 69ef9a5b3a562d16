"""Procedure sources: callables that return ``{split: [Procedure, ...]}``.

A data config names one with ``_target_`` and ``_partial_: true``; the data module calls it in
``prepare_data`` (rank 0 only: generation, conversion, caching) and again in ``setup`` (every rank:
reading the cached result). New datasets plug in by adding a source function and a config.
"""
from __future__ import annotations

import logging
from pathlib import Path

from seqaware.procedure import Procedure, read_procedures

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


def jsonl_source(train_path: str | None = None, val_path: str | None = None, test_path: str | None = None,
                 check_images: bool = True) -> dict[str, list[Procedure]]:
    """Procedures from prepared JSONL files (``scripts/prepare_data.py`` output), validated on read."""
    paths = {"train": train_path, "val": val_path, "test": test_path}
    out: dict[str, list[Procedure]] = {}
    for split, path in paths.items():
        if path is None:
            continue
        if not Path(path).is_file():
            raise FileNotFoundError(f"data.source.{split}_path: no such file: {path}")
        out[split] = read_procedures(path, check_images=check_images)
    return out


def synthetic_source(cache_dir: str, progress: bool = True, **config) -> dict[str, list[Procedure]]:
    """The embedded synthetic procedural world, generated on first use into ``cache_dir``."""
    from data_modules.synthetic import SyntheticConfig, ensure_synthetic

    folder = ensure_synthetic(SyntheticConfig(**config), cache_dir, progress=progress)
    return {split: read_procedures(Path(folder) / f"{split}.jsonl") for split in SPLITS}
