"""Dataset adapters: raw releases -> procedures (+ task instances), and a cached Hydra source.

Each adapter is a function ``convert(src, out_images, **options) -> AdapterResult`` (see
:mod:`data_modules.adapters.common`). ``ADAPTERS`` maps dataset names to them:

=============  ==========================================================================
name           source
=============  ==========================================================================
wikihow        Wu et al. 2022 WikiHow JSON lines (one section = one procedure)
recipeqa       Wu et al. 2022 RecipeQA splits ``{train,val,test}-acl22.json`` + images
mateo          MATEO JSON / JSONL export or parquet (step DAG from out-nodes)
rfg            English Recipe Flow Graph ``.list`` + ``.flow`` (step DAG from flow edges)
catbench       CaT-Bench questions (plans + gold yes/no TEO-style pairs)
roc            ROCStories / SIND tsv (one story per line, `` <eos> `` between sentences)
iso            ISO-Bench export read through a field mapping -> ISO instances
coherence      COHERENCE export read through a field mapping -> COHERENCE instances
=============  ==========================================================================

``adapter_source`` is the Hydra data source used by ``configs/data/{wikihow,recipeqa,mateo,rfg}.yaml``:
it converts the raw release once into ``cache_dir/<hash of dataset, src and options>`` and reads
the prepared JSON lines back.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable

from data_modules.adapters import catbench, coherence, iso, mateo, recipeqa, rfg, roc, wikihow
from data_modules.adapters.common import AdapterOptionError, AdapterResult
from seqaware.config import to_plain
from seqaware.procedure import Procedure, read_procedures

log = logging.getLogger(__name__)

ADAPTERS: dict[str, Callable[..., AdapterResult]] = {
    "wikihow": wikihow.convert,
    "recipeqa": recipeqa.convert,
    "mateo": mateo.convert,
    "rfg": rfg.convert,
    "catbench": catbench.convert,
    "roc": roc.convert,
    "iso": iso.convert,
    "coherence": coherence.convert,
}

ADAPTER_VERSION = "1"
"""Bumped when an adapter's output changes, so cached conversions are redone."""

DONE_MARKER = "DONE"

__all__ = ["ADAPTERS", "AdapterOptionError", "AdapterResult", "adapter_options", "adapter_source", "get_adapter",
           "run_adapter"]


def get_adapter(name: str) -> Callable[..., AdapterResult]:
    """The adapter registered under ``name``; an unknown name raises, listing the known ones."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise KeyError(f"unknown dataset adapter {name!r}; known adapters: {', '.join(sorted(ADAPTERS))}") from None


def adapter_options(name: str) -> dict[str, Any]:
    """Option names of an adapter with their defaults (everything after ``src, out_images``)."""
    params = list(inspect.signature(get_adapter(name)).parameters.values())[2:]
    return {p.name: p.default for p in params}


def run_adapter(name: str, src: str | os.PathLike, out_images: str | os.PathLike | None = None,
                **options: Any) -> AdapterResult:
    """Run adapter ``name``; an unknown option raises :class:`AdapterOptionError` listing the valid ones."""
    adapter = get_adapter(name)
    known = adapter_options(name)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise AdapterOptionError(f"{name}: unknown option(s) {unknown}; valid options: {sorted(known)}")
    if not Path(src).exists():
        raise FileNotFoundError(f"{name}: no such file or folder: {src}")
    return adapter(Path(src), None if out_images is None else Path(out_images), **options)


def cache_key(dataset: str, src: str | os.PathLike, options: dict[str, Any], tasks: list[str]) -> str:
    """Short stable hash of what a conversion depends on: adapter, source path (+ its mtime/size), options."""
    src_path = Path(src).resolve()
    stat = src_path.stat()
    payload = json.dumps({"adapter": dataset, "version": ADAPTER_VERSION, "src": str(src_path),
                          "src_stat": [stat.st_size, stat.st_mtime_ns], "options": options, "tasks": tasks},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


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

    options = {k: to_plain(v) for k, v in options.items()}
    tasks = list(to_plain(tasks) or [])
    task_options = to_plain(task_options) or {}
    if not src or not Path(src).exists():
        raise FileNotFoundError(f"data.source.src: no such file or folder: {src!r} (set data.source.src=PATH)")
    cache_dir = Path(cache_dir)
    key = cache_key(dataset, src, {**options, "task_options": task_options}, tasks)
    folder = cache_dir / key
    if not (folder / DONE_MARKER).is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=cache_dir))
        tmp.chmod(0o755)
        try:
            log.info("converting %s from %s into %s", dataset, src, folder)
            prepare_dataset(dataset, src, tmp, tasks=tasks, options=options, task_options=task_options)
            (tmp / DONE_MARKER).write_text(key + "\n")
            if not (folder / DONE_MARKER).is_file():
                if folder.exists():  # an incomplete folder not written by this function: set it aside
                    stale = cache_dir / f".{key}.stale-{uuid.uuid4().hex}"
                    os.rename(folder, stale)
                    shutil.rmtree(stale, ignore_errors=True)
                try:
                    os.rename(tmp, folder)
                except OSError:
                    if not (folder / DONE_MARKER).is_file():  # a concurrent run did not finish it either
                        raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    splits = sorted(p.stem for p in folder.glob("*.jsonl"))
    return {split: read_procedures(folder / f"{split}.jsonl") for split in splits}
