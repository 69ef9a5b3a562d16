"""COHERENCE export (JSON / JSONL) -> COHERENCE instances, through a field mapping given in config.

``fields`` maps each key to a (dotted) field of the export record (defaults: the keys themselves):

============  ========  ======================================================================
key           required  meaning
============  ========  ======================================================================
text          yes       text with image placeholders matched by ``placeholder_pattern`` (default:
                        the paper's ``[IMAGE_PLACEHOLDER]`` or this project's ``<image_i>``)
title         no        the article title (the ``{title}`` of the App. D.1 prompt; the prompt
                        refuses an instance without one)
candidates    yes       list of candidate images (paths relative to the export file, URLs via
                        ``url_root``, or embedded bytes)
gold          no        ``gold[i]`` = candidate index (``gold_base``-based; the paper's answers are
                        0-based, App. D.1) of the image of the
                        i-th placeholder in reading order. Absent: the first ``n`` candidates
                        are the images of the ``n`` placeholders in order, and the candidates
                        are shuffled with a generator seeded by ``(seed, id)``, as the builder does
id            no        instance id (default ``<file stem>-<line>``)
difficulty    no        easy / medium / hard (default: from the number of placeholders and
                        ``difficulty_bins``, as in :mod:`data_modules.tasks.coherence`)
split         no        split (default: option ``split``)
source        no        sub-corpus name (WikiHow, StoryBird, ...), kept as ``source``
============  ========  ======================================================================

Placeholders are rewritten to this project's ``<image_i>`` (1-based, reading order). Output:
``tasks["coherence"]`` in the format of :mod:`data_modules.tasks.coherence` (``candidates``, ``gold``,
``distractors``, ``num_images``, ``difficulty``), so :func:`seqaware.metrics.coherence.coherence_report`
scores it. Unreadable candidate images follow ``unreadable_image`` (error | skip the instance).
"""
from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from data_modules.adapters.common import (
    AdapterOptionError,
    AdapterResult,
    IMAGE_POLICIES,
    ImageStore,
    ProblemLog,
    check_choice,
    check_split,
    image_source,
    mapped_record,
    read_instances,
    resolve_fields,
    store_images,
)
from data_modules.adapters.registry import ADAPTERS
from data_modules.tasks.coherence import DIFFICULTY_NAMES, difficulty_of, placeholder
from seqaware.procedure import SPLIT_PATTERN

COHERENCE_FIELDS = ("id", "text", "candidates", "gold", "difficulty", "split", "source", "title")
DEFAULT_PLACEHOLDER_PATTERN = r"\[IMAGE_PLACEHOLDER\]|<image_\d+>"
REQUIRED = ("text", "candidates")


@ADAPTERS.register("coherence")
def convert(src: Path, out_images: Path | None = None, fields: Mapping[str, str] | None = None,
            placeholder_pattern: str = DEFAULT_PLACEHOLDER_PATTERN, gold_base: int = 0, split: str = "test",
            difficulty_bins: Sequence[Sequence[int | None]] = ((2, 3), (4, 5), (6, None)), seed: int = 0,
            unreadable_image: str = "error", url_root: str | None = None) -> AdapterResult:
    """Read a COHERENCE export into COHERENCE instances (see the module docstring)."""
    check_choice("unreadable_image", unreadable_image, IMAGE_POLICIES)
    check_split(split)
    try:
        pattern = re.compile(placeholder_pattern)
    except re.error as err:
        raise AdapterOptionError(f"option placeholder_pattern={placeholder_pattern!r}: not a regular expression ({err})") from None
    bins = [(int(low), None if high is None else int(high)) for low, high in difficulty_bins]
    fmap = resolve_fields(fields, COHERENCE_FIELDS)
    store = ImageStore(out_images)
    seen: dict[str, str] = {}
    return read_instances("coherence", src, lambda record, path, line, log, result: _instance(
        record, path, line, fmap, pattern, gold_base, split, bins, seed, store, unreadable_image, url_root, seen,
        log, result))


def _instance(record: Any, path: Path, line: int, fmap: dict[str, str], pattern: re.Pattern, gold_base: int,
              split: str, bins, seed: int, store: ImageStore, policy: str, url_root: str | None,
              seen: dict[str, str], log: ProblemLog, result: AdapterResult) -> dict[str, Any] | None:
    read = mapped_record(record, path, line, fmap, COHERENCE_FIELDS, REQUIRED, log)
    if read is None:
        return None
    iid, value = read
    before = len(log)
    text, candidates = value["text"], value["candidates"]
    if not isinstance(text, str):
        log.add(path, line, iid, fmap["text"], "must be a string")
        return None
    n = len(pattern.findall(text))
    if n == 0:
        log.add(path, line, iid, fmap["text"], f"no image placeholder matching {pattern.pattern!r}")
    if not isinstance(candidates, list) or len(candidates) < n:
        log.add(path, line, iid, fmap["candidates"], f"must be a list of at least {n} images (one per placeholder)")
    if len(log) > before:
        return None
    if value["gold"] is None:
        order = [int(i) for i in np.random.default_rng([seed, zlib.crc32(iid.encode())]).permutation(len(candidates))]
        candidates = [candidates[src] for src in order]
        position = {src: j for j, src in enumerate(order)}
        gold = [position[i] for i in range(n)]
    else:
        raw = value["gold"]
        try:
            gold = [int(g) - gold_base for g in raw]
        except (TypeError, ValueError):
            gold = None
        if gold is None or len(gold) != n or len(set(gold)) != n or not all(0 <= g < len(candidates) for g in gold):
            log.add(path, line, iid, fmap["gold"],
                    f"{raw!r} must give {n} distinct candidate indices ({gold_base}-based, {len(candidates)} candidates)")
            return None
    difficulty = value["difficulty"]
    if difficulty is not None and str(difficulty).lower() not in DIFFICULTY_NAMES:
        log.add(path, line, iid, fmap["difficulty"], f"{difficulty!r} is not one of {list(DIFFICULTY_NAMES)}")
    inst_split = str(value["split"]) if value["split"] is not None else split
    inst_split = "val" if inst_split == "validation" else inst_split
    if not SPLIT_PATTERN.match(inst_split):
        log.add(path, line, iid, fmap["split"], f"unknown split {inst_split!r}")
    title = value["title"]
    if title is not None and (not isinstance(title, str) or not title.strip()):
        log.add(path, line, iid, fmap["title"], "must be a non-empty string")
    if iid in seen:
        log.add(path, line, iid, fmap["id"], f"duplicate id (first seen at {seen[iid]})")
    seen.setdefault(iid, f"{path}:{line}")
    if len(log) > before:
        return None
    sources = [image_source(c, path.parent, url_root) for c in candidates]
    fields = [f"{fmap['candidates']}[{j}]" for j in range(len(candidates))]
    if any(s is None for s in sources):
        j = sources.index(None)
        log.add(path, line, iid, fields[j], "empty candidate image")
        return None
    images = store_images(store, sources, iid, policy, log, (path, line), fields, result.dropped)
    if images is None:
        return None
    counter = iter(range(1, n + 1))
    rewritten = pattern.sub(lambda _: placeholder(next(counter)), text)
    inst = {
        "instance_id": iid,
        "procedure_id": iid,
        "split": inst_split,
        "text": rewritten,
        "num_images": n,
        "candidates": [im[0] for im in images],
        "gold": gold,
        "distractors": sorted(set(range(len(candidates))) - set(gold)),
        "difficulty": str(difficulty).lower() if difficulty is not None else difficulty_of(n, bins),
    }
    inst["title"] = None if title is None else title.strip()
    if value["source"] is not None:
        inst["source"] = str(value["source"])
    return inst
