"""ISO-Bench export (JSON / JSONL) -> ISO instances, through a field mapping given in config.

The public field names are not known offline, so ``fields`` maps each instance key to a (dotted)
field of the export record; the defaults are the keys themselves:

==============  ========  =====================================================================
key             required  meaning
==============  ========  =====================================================================
snippet         yes       the text snippet: a list of step texts, or one string
image           yes       the image of the other step: path (relative to the export file), URL
                          (used only via ``url_root``) or embedded bytes (``{"bytes": ...}``)
label           yes       gold answer, mapped to DEP / NONDEP by ``labels``
goal            no        the plan's goal (the ``GOAL:`` line of the App. H prompt; the prompt
                          refuses an instance without one)
id              no        instance id (default ``<file stem>-<line>``)
question        no        the question text
task            no        ``before`` / ``after`` (default: read from the question, else None)
k               no        snippet length (default: number of snippet steps)
split           no        split (default: option ``split``)
procedure_id    no        the plan the instance comes from
==============  ========  =====================================================================

Output: ``tasks["iso"]``, instances in the format of :mod:`data_modules.tasks.iso` (so
:func:`seqaware.metrics.iso.iso_report` scores them), images copied into ``out_images``.
Unreadable images follow ``unreadable_image`` (error | skip the instance, counted).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

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
from data_modules.tasks.iso import ISO_LABELS
from seqaware.procedure import SPLIT_PATTERN

ISO_FIELDS = ("id", "snippet", "image", "question", "label", "task", "k", "split", "procedure_id", "goal")
REQUIRED = ("snippet", "image", "label")
DEFAULT_LABELS = {"yes": "DEP", "no": "NONDEP", "dep": "DEP", "nondep": "NONDEP", "true": "DEP", "false": "NONDEP",
                  "1": "DEP", "0": "NONDEP"}


@ADAPTERS.register("iso")
def convert(src: Path, out_images: Path | None = None, fields: Mapping[str, str] | None = None,
            labels: Mapping[str, str] | None = None, split: str = "test", unreadable_image: str = "error",
            url_root: str | None = None) -> AdapterResult:
    """Read an ISO-Bench export into ISO instances (see the module docstring)."""
    check_choice("unreadable_image", unreadable_image, IMAGE_POLICIES)
    check_split(split)
    fmap = resolve_fields(fields, ISO_FIELDS)
    label_map = {str(k).lower(): v for k, v in {**DEFAULT_LABELS, **dict(labels or {})}.items()}
    bad = sorted({v for v in label_map.values() if v not in ISO_LABELS})
    if bad:
        raise AdapterOptionError(f"option labels: values {bad} are not ISO labels {list(ISO_LABELS)}")
    store = ImageStore(out_images)
    seen: dict[str, str] = {}
    return read_instances("iso", src, lambda record, path, line, log, result: _instance(
        record, path, line, fmap, label_map, split, store, unreadable_image, url_root, seen, log, result))


def _positive_int(value: Any) -> int | None:
    """``value`` as a positive integer (an int, an integral float or a string of digits), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if isinstance(value, int) and value > 0 else None


def _instance(record: Any, path: Path, line: int, fmap: dict[str, str], label_map: dict[str, str], split: str,
              store: ImageStore, policy: str, url_root: str | None, seen: dict[str, str], log: ProblemLog,
              result: AdapterResult) -> dict[str, Any] | None:
    read = mapped_record(record, path, line, fmap, ISO_FIELDS, REQUIRED, log)
    if read is None:
        return None
    iid, value = read
    before = len(log)
    snippet = value["snippet"]
    snippet = [snippet] if isinstance(snippet, str) else snippet
    if not isinstance(snippet, list) or not snippet or not all(isinstance(s, str) and s.strip() for s in snippet):
        log.add(path, line, iid, fmap["snippet"], "must be a non-empty string or list of non-empty strings")
    label = label_map.get(str(value["label"]).strip().lower())
    if label is None:
        log.add(path, line, iid, fmap["label"], f"label {value['label']!r} is not mapped to DEP/NONDEP (option labels)")
    inst_split = str(value["split"]) if value["split"] is not None else split
    inst_split = "val" if inst_split == "validation" else inst_split
    if not SPLIT_PATTERN.match(inst_split):
        log.add(path, line, iid, fmap["split"], f"unknown split {inst_split!r}")
    if value["task"] is not None and str(value["task"]).strip().lower() not in ("before", "after"):
        log.add(path, line, iid, fmap["task"], f"task {value['task']!r} is not 'before' or 'after'")
    goal = value["goal"]
    if goal is not None and (not isinstance(goal, str) or not goal.strip()):
        log.add(path, line, iid, fmap["goal"], "must be a non-empty string")
    k = _positive_int(value["k"])   # None for a missing k too
    if value["k"] is not None and k is None:
        log.add(path, line, iid, fmap["k"], f"k {value['k']!r} is not a positive integer")
    if iid in seen:
        log.add(path, line, iid, fmap["id"], f"duplicate id (first seen at {seen[iid]})")
    seen.setdefault(iid, f"{path}:{line}")
    if len(log) > before:
        return None
    source = image_source(value["image"], path.parent, url_root)
    images = store_images(store, [source], iid, policy, log, (path, line), [fmap["image"]], result.dropped)
    if images is None:
        return None
    question = value["question"]
    task = value["task"]
    task = None if task is None else str(task).strip().lower()
    if task is None and isinstance(question, str):
        found = re.findall(r"\b(before|after)\b", question.lower())
        task = found[0] if len(set(found)) == 1 else None
    return {
        "instance_id": iid,
        "procedure_id": None if value["procedure_id"] is None else str(value["procedure_id"]),
        "split": inst_split,
        "goal": None if goal is None else goal.strip(),
        "task": task,
        "k": len(snippet) if value["k"] is None else k,
        "snippet_steps": None,
        "snippet": list(snippet),
        "candidate_step": None,
        "image": images[0][0],
        "label": label,
        "question": question,
    }
