"""Procedure sources: callables that return ``{split: [Procedure, ...]}``.

A data config names one with ``_target_`` and ``_partial_: true``; the data module calls it in
``prepare_data`` (rank 0 only: generation, conversion, caching) and again in ``setup`` (every rank:
reading the cached result). New datasets plug in by adding a source function and a config.

* :func:`jsonl_source` -- prepared JSON lines (``data=jsonl``);
* :func:`synthetic_source` -- the embedded synthetic world, generated once into the cache;
* :func:`adapter_source` -- a raw release converted once by a dataset adapter into the cache.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from seqaware.config import to_plain
from seqaware.io import build_folder_once
from seqaware.procedure import (
    Problem,
    Procedure,
    ProcedureFormatError,
    check_procedures_file,
    check_split_files,
    read_procedures,
)

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


def jsonl_source(train_path: str | None = None, val_path: str | None = None, test_path: str | None = None,
                 check_images: bool = True, check_splits: bool = True) -> dict[str, list[Procedure]]:
    """Procedures from prepared JSONL files (``scripts/tools/prepare_data.py`` output), validated on read.

    Every problem of every file is reported at once as ``file:line: record id: field: reason``:
    a missing file or an empty one (``data.<split>_path`` named), records whose ``split`` is not
    the split of the option that names the file, one file given for two splits, and ids shared
    between the files. ``check_splits=False`` (``data.source.check_splits=false``) allows the
    last three, e.g. to evaluate on the training file on purpose.
    """
    paths = {split: path for split, path in (("train", train_path), ("val", val_path), ("test", test_path))
             if path is not None}
    for split, path in paths.items():
        if not Path(path).is_file():
            raise FileNotFoundError(f"data.{split}_path: no such file: {path}")
    problems: list[Problem] = []
    if check_splits:
        problems += check_split_files({f"data.{split}_path": path for split, path in paths.items()})
    seen: dict[str, str] = {}
    out: dict[str, list[Procedure]] = {}
    for split, path in paths.items():
        key = f"data.{split}_path"
        procedures, found = check_procedures_file(
            path, check_images=check_images, seen_ids=seen if check_splits else None,
            expected_split=split if check_splits else None, split_key=key)
        problems += found
        if not procedures and not found:
            problems.append(Problem(str(path), 0, "", key, f"the file holds no procedures: the {split} split is empty"))
        out[split] = procedures
    if problems:
        raise ProcedureFormatError(problems)
    return out


def synthetic_source(cache_dir: str, progress: bool = True, **config) -> dict[str, list[Procedure]]:
    """The embedded synthetic procedural world, generated on first use into ``cache_dir``."""
    from data_modules.synthetic import SyntheticConfig, ensure_synthetic

    folder = ensure_synthetic(SyntheticConfig(**config), cache_dir, progress=progress)
    return {split: read_procedures(Path(folder) / f"{split}.jsonl") for split in SPLITS}


def adapter_source(dataset: str, src: str, cache_dir: str, tasks: list[str] | None = None,
                   task_options: dict[str, dict[str, Any]] | None = None, **options: Any) -> dict[str, list[Procedure]]:
    """Hydra data source: convert ``src`` with adapter ``dataset`` once, then read the cached JSONL.

    The prepared dataset lives in ``cache_dir/<key>`` where ``key`` hashes the adapter name and
    version, the resolved ``src`` (with its size and mtime), ``options`` and ``tasks``; change any of
    them and the data is converted again. Conversion goes into a temporary folder that receives a
    ``DONE`` marker last and is then renamed into place, so an interrupted run never leaves a
    folder that looks complete. Returns ``{split: [Procedure]}`` for every prepared split.
    """
    from data_modules.adapters.prepare import prepare_dataset
    from data_modules.adapters.registry import cache_key

    options = {k: to_plain(v) for k, v in options.items()}
    tasks = list(to_plain(tasks) or [])
    task_options = to_plain(task_options) or {}
    if not src or not Path(src).exists():
        raise FileNotFoundError(f"data.source.src: no such file or folder: {src!r} (set data.source.src=PATH)")
    key = cache_key(dataset, src, {**options, "task_options": task_options}, tasks)

    def build(out: Path) -> None:
        log.info("converting %s from %s into %s", dataset, src, Path(cache_dir) / key)
        prepare_dataset(dataset, src, out, tasks=tasks, options=options, task_options=task_options)

    folder = build_folder_once(cache_dir, key, build)
    splits = sorted(p.stem for p in folder.glob("*.jsonl"))
    return {split: read_procedures(folder / f"{split}.jsonl") for split in splits}
