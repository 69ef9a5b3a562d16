"""The adapter registry: dataset name -> ``convert(src, out_images, **options) -> AdapterResult``,
with option checking (:func:`run_adapter`) and the cache key of a conversion (:func:`cache_key`).

An adapter module registers its ``convert`` with ``@ADAPTERS.register("NAME")``; the registry imports
every module of :mod:`data_modules.adapters` when first read, so a new adapter is one new file there
(plus its ``configs/data/`` entry)."""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path
from typing import Any, Callable

from data_modules.adapters.common import AdapterOptionError, AdapterResult
from registry import Registry, place


def _check_adapter(name: str, convert: Any, tags: dict) -> None:
    params = list(inspect.signature(convert).parameters) if callable(convert) else []
    if params[:2] != ["src", "out_images"]:
        raise TypeError(f"dataset adapter {name!r} ({place(convert)}) must be convert(src, out_images, **options), "
                        f"got the parameters {params}")


ADAPTERS: Registry = Registry("dataset adapter", package="data_modules.adapters", check=_check_adapter)

ADAPTER_VERSION = "1"
"""Bumped when an adapter's output changes, so cached conversions are redone."""


def get_adapter(name: str) -> Callable[..., AdapterResult]:
    """The adapter registered under ``name``; an unknown name raises :class:`registry.UnknownNameError`
    (a ``KeyError``), listing the registered ones."""
    return ADAPTERS[name]


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
