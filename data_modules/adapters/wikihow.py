"""WikiHow, Wu et al. 2022 release -> procedures (one per article section).

Input: ``wikihow-acl22-{train,dev,test}.json`` (JSON lines; a folder of them or one file). Each line
is an article::

    {"url": ..., "title": ..., "summary": ..., "category path": [...],
     "sections": [{"steps": [{"step_headline": ..., "step_text": {"text": ..., "bullet_points": [...]},
                              "step_assets": {"image-large" | "image-src-1": "relative/image.jpg"}}]}],
     "multiref_gt": [[...], ...]}          # optional: alternative orders

Conversion:

* one procedure per section, id ``<url>#<section index>``; title = article title; category = the
  category path (a list, or a string split on ``>`` / ``/``);
* step text = headline + text + bullet points joined by spaces (whole; the collator caps length);
* step image = the first of ``image-large`` / ``image-src-1`` (path relative to the JSON file's
  folder, or absolute), copied into ``out_images``; a step without image assets stays text-only;
  an unreadable or missing image file -> ``unreadable_image`` (``error`` names file, line, record
  and field; ``skip`` drops the procedure, counted);
* split from the file name: train -> ``train``, dev/val -> ``val``, test -> ``test``, and a test
  file whose name contains ``human`` -> ``test-human`` (the golden set);
* ``multiref_gt`` -> ``alternatives`` (0- or 1-based orders; they must be permutations of the
  section's steps, else the record is reported);
* sections with fewer than ``min_steps`` steps are dropped (``too few steps``);
* ``resplit_by_category: true`` re-assigns the train/val/test procedures so that no level-
  ``category_level`` category (the third by default) is shared between splits: categories are
  shuffled with ``seed`` and given to test, then val, until each holds at least its fraction of
  ``resplit_fractions``; golden sets (``test-human``) are left as they are.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from data_modules.adapters.common import (
    IMAGE_POLICIES,
    AdapterOptionError,
    AdapterResult,
    ImageStore,
    ProblemLog,
    check_choice,
    check_procedure,
    iter_files,
    iter_json_records,
    normalize_orders,
    split_from_name,
    store_images,
)
from data_modules.adapters.registry import ADAPTERS
from seqaware.procedure import Procedure, Step

IMAGE_FIELDS = ("image-large", "image-src-1")
CATEGORY_FIELDS = ("category path", "category_path", "categories", "category")


def _category(record: dict[str, Any]) -> list[str]:
    for name in CATEGORY_FIELDS:
        value = record.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            return [part.strip() for part in re.split(r"\s*(?:>|/|\|)\s*", value) if part.strip()]
        return [str(v) for v in value]
    return []


def _step_text(step: dict[str, Any]) -> str:
    body = step.get("step_text") or {}
    if isinstance(body, str):
        body = {"text": body}
    parts = [step.get("step_headline"), body.get("text"), *(body.get("bullet_points") or [])]
    return " ".join(p.strip() for p in parts if isinstance(p, str) and p.strip())


def _step_image(step: dict[str, Any]) -> str | None:
    assets = step.get("step_assets") or {}
    for name in IMAGE_FIELDS:
        value = assets.get(name) if isinstance(assets, dict) else None
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _resplit(procedures: list[Procedure], level: int, fractions: Sequence[float], seed: int) -> None:
    """Re-assign train/val/test in place so no level-``level`` category spans two splits."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not np.isclose(sum(fractions), 1.0):
        raise AdapterOptionError(f"option resplit_fractions={list(fractions)}: 3 non-negative numbers summing to 1")
    groups: dict[tuple[str, ...], list[Procedure]] = {}
    for proc in procedures:
        groups.setdefault(tuple(proc.category[:level]), []).append(proc)
    keys = sorted(groups)
    order = [keys[i] for i in np.random.default_rng(seed).permutation(len(keys))]
    total = len(procedures)
    targets = {"test": fractions[2] * total, "val": fractions[1] * total}
    filled = {"test": 0, "val": 0}
    for key in order:
        name = next((s for s in ("test", "val") if filled[s] < targets[s]), "train")
        if name != "train":
            filled[name] += len(groups[key])
        for proc in groups[key]:
            proc.split = name


@ADAPTERS.register("wikihow")
def convert(src: Path, out_images: Path | None = None, unreadable_image: str = "error", min_steps: int = 2,
            resplit_by_category: bool = False, category_level: int = 3,
            resplit_fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0) -> AdapterResult:
    """Convert the WikiHow release (see the module docstring)."""
    check_choice("unreadable_image", unreadable_image, IMAGE_POLICIES)
    log = ProblemLog()
    result = AdapterResult()
    store = ImageStore(out_images)
    files = iter_files(src, (".json", ".jsonl"))
    if not files:
        raise FileNotFoundError(f"wikihow: no .json files in {src}")
    for path in files:
        split = split_from_name(path.stem)
        if split is None:
            raise AdapterOptionError(f"wikihow: cannot tell the split of {path} from its name (needs train, dev or test)")
        for line, record in iter_json_records(path, log):
            result.records_read[split] += 1
            _convert_article(record, path, line, split, store, unreadable_image, min_steps, log, result)
    log.raise_if_any()
    if resplit_by_category:
        pool = [p for name in ("train", "val", "test") for p in result.splits.pop(name, [])]
        _resplit(pool, category_level, resplit_fractions, seed)
        for proc in pool:
            result.add(proc)
    return result


def _convert_article(record: Any, path: Path, line: int, split: str, store: ImageStore, policy: str,
                     min_steps: int, log: ProblemLog, result: AdapterResult) -> None:
    if not isinstance(record, dict):
        log.add(path, line, "?", "record", f"expected a JSON object, got {type(record).__name__}")
        return
    url = record.get("url")
    if not isinstance(url, str) or not url:
        log.add(path, line, "?", "url", "missing field")
        return
    sections = record.get("sections")
    if not isinstance(sections, list):
        log.add(path, line, url, "sections", "missing field" if sections is None else "must be a list")
        return
    for s_idx, section in enumerate(sections):
        steps = section.get("steps") if isinstance(section, dict) else None
        if not isinstance(steps, list) or not all(isinstance(st, dict) for st in steps):
            log.add(path, line, url, f"sections[{s_idx}].steps", "must be a list of step objects")
            continue
        pid = f"{url}#{s_idx}"
        if len(steps) < max(min_steps, 2):
            result.dropped["too few steps"] += 1
            continue
        texts = [_step_text(st) for st in steps]
        rels = [_step_image(st) for st in steps]
        sources = [None if r is None else (Path(r) if Path(r).is_absolute() else path.parent / r) for r in rels]
        fields = [f"sections[{s_idx}].steps[{i}].step_assets" for i in range(len(steps))]
        images = store_images(store, sources, pid, policy, log, (path, line), fields, result.dropped)
        if images is None:
            continue
        alternatives = None
        if record.get("multiref_gt") is not None:
            try:
                alternatives = normalize_orders(record["multiref_gt"], len(steps))
            except ValueError as err:
                log.add(path, line, pid, "multiref_gt", str(err))
                continue
        procedure = Procedure(
            id=pid, steps=[Step(text=t, images=im) for t, im in zip(texts, images)], split=split,
            title=str(record.get("title") or ""), category=_category(record), alternatives=alternatives,
            meta={"source": "wikihow", "url": url, "section": s_idx}, root=store.root,
        )
        if check_procedure(procedure, path, line, log):
            result.add(procedure)
