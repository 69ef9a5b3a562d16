"""Convert a raw release into a prepared folder (shared by ``scripts/tools/prepare_data.py`` and the cached source).

Layout of a prepared folder ``OUT``::

    OUT/<split>.jsonl          procedures (seqaware.procedure.write_procedures), one file per split
    OUT/images/                step images copied / converted by the adapter (paths relative to OUT)
    OUT/tasks/<task>.jsonl     task instances: from the adapter (catbench, iso, coherence exports)
                               and/or built from the procedures with ``tasks`` (teo, iso, coherence)
    OUT/conversion.json        dataset, source, options, input records read, dropped items and why

Task instances built here (each carries its ``split``):

* ``teo``: per split, :func:`data_modules.tasks.teo.teo_eval_sets` -- the original pairs followed by
  the swapped ones (procedures without a DAG give none);
* ``iso``: :func:`data_modules.tasks.iso.iso_instances` per procedure (steps with images only);
* ``coherence``: :func:`data_modules.tasks.coherence.coherence_instances` per split (distractors
  are drawn from the same split).

``task_options[task]`` holds keyword arguments of the builder (e.g. ``{"iso": {"ks": [2, 3]}}``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from data_modules.adapters.registry import run_adapter
from data_modules.adapters.common import AdapterOptionError, AdapterResult, conversion_progress
from data_modules.adapters.report import CONVERSION_FILE
from data_modules.tasks.coherence import coherence_instances
from data_modules.tasks.iso import iso_instances
from data_modules.tasks.teo import teo_eval_sets
from seqaware.io import atomic_open, write_jsonl
from seqaware.procedure import Problem, Procedure, ProcedureFormatError, write_procedures

TASK_BUILDERS = ("teo", "iso", "coherence")


def build_task(task: str, splits: dict[str, list[Procedure]], **options: Any) -> list[dict[str, Any]]:
    """Instances of ``task`` built from the procedures of every split (see the module docstring)."""
    if task not in TASK_BUILDERS:
        raise AdapterOptionError(f"unknown task {task!r}; tasks built from procedures: {list(TASK_BUILDERS)}")
    out: list[dict[str, Any]] = []
    for procedures in splits.values():
        if task == "teo":
            sets = teo_eval_sets(procedures, **options)
            out += sets["original"] + sets["swapped"]
        elif task == "iso":
            out += [inst for proc in procedures for inst in iso_instances(proc, **options)]
        else:
            out += coherence_instances(procedures, **options)
    return out


def check_ids_across_splits(result: AdapterResult, src: str | os.PathLike) -> None:
    """Raise when one procedure id lands in two splits (a test procedure would also be trained on)."""
    first: dict[str, str] = {}
    problems = []
    for split, procedures in result.splits.items():
        for proc in procedures:
            if proc.id in first and first[proc.id] != split:
                problems.append(Problem(str(src), 0, proc.id, "id", f"in both the {first[proc.id]} and the {split} split"))
            first.setdefault(proc.id, split)
    if problems:
        raise ProcedureFormatError(problems)


def prepare_dataset(dataset: str, src: str | os.PathLike, out: str | os.PathLike, tasks: Sequence[str] = (),
                    options: dict[str, Any] | None = None,
                    task_options: dict[str, dict[str, Any]] | None = None,
                    progress: bool | None = None) -> tuple[AdapterResult, dict[str, list[dict]]]:
    """Run the adapter, write the prepared folder ``out``; returns the result and all task instances.

    ``progress``: tqdm bars for the records read and the tasks built (None: only on a terminal)."""
    out = Path(out)
    options = dict(options or {})
    task_options = dict(task_options or {})
    unknown = sorted(set(task_options) - set(tasks))
    if unknown:
        raise AdapterOptionError(f"task options given for task(s) {unknown} that were not requested (tasks: {list(tasks)})")
    with conversion_progress(f"{dataset}: reading {Path(src).name}", progress):
        result = run_adapter(dataset, src, out / "images", **options)
    check_ids_across_splits(result, src)
    instances: dict[str, list[dict]] = dict(result.tasks)
    for task in tqdm(tasks, desc="building tasks", unit="task", disable=None if progress is None else not progress):
        if task in instances:
            raise AdapterOptionError(f"task {task!r} is already provided by the {dataset} adapter; do not request it again")
        instances[task] = build_task(task, result.splits, **task_options.get(task, {}))
    out.mkdir(parents=True, exist_ok=True)
    for split, procedures in result.splits.items():
        write_procedures(out / f"{split}.jsonl", procedures)
    for task, rows in instances.items():
        write_jsonl(out / "tasks" / f"{task}.jsonl", rows)
    images = out / "images"
    if images.is_dir() and not any(images.iterdir()):
        images.rmdir()
    record = {
        "dataset": dataset,
        "src": str(Path(src).resolve()),
        "options": options,
        "tasks": {task: len(rows) for task, rows in instances.items()},
        "task_options": task_options,
        "records_read": dict(result.records_read),
        "dropped": dict(result.dropped),
        "splits": {split: len(procs) for split, procs in result.splits.items()},
    }
    with atomic_open(out / CONVERSION_FILE) as handle:
        json.dump(record, handle, indent=2, default=str)
    return result, instances
