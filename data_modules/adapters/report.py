"""The summary table printed by ``scripts/tools/prepare_data.py`` and ``scripts/tools/dataset_stats.py``.

One row per split: procedures, steps, steps per procedure (mean), steps with an image, procedures
with a DAG, DAG edges and the branching factor (mean out-degree of the steps that have at least
one out-edge; :func:`seqaware.metrics.agreement.procedure_statistics`), then the input records
read, what was dropped and why, and the class counts of every task file.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

from data_modules.tasks.teo import teo_class_counts
from seqaware.metrics.agreement import procedure_statistics
from seqaware.metrics.teo import TEO_LABELS
from seqaware.procedure import Procedure

CONVERSION_FILE = "conversion.json"
"""Written by ``prepare_dataset`` beside the split files: records read, dropped items, options."""

SPLIT_ORDER = ("train", "val", "test")


def _split_key(name: str) -> tuple[int, str]:
    base = name.split("-")[0].split("_")[0]
    return (SPLIT_ORDER.index(base) if base in SPLIT_ORDER else len(SPLIT_ORDER), name)


def split_row(procedures: Sequence[Procedure]) -> dict[str, Any]:
    """The numbers of one table row for ``procedures``."""
    stats = procedure_statistics(procedures)
    steps = stats["steps_per_procedure"]
    return {
        "procedures": stats["num_procedures"],
        "steps": stats["total_steps"],
        "steps/proc": None if steps is None else steps["mean"],
        "image steps": sum(1 for p in procedures for s in p.steps if s.images),
        "with DAG": stats["num_with_dag"],
        "edges": stats["total_edges"],
        "branching": stats["mean_out_degree_branching"],
    }


def task_class_counts(name: str, instances: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """``{split: {class: count}}`` of a task's instances (plus an ``all`` entry).

    The class is the ``label`` field (TEO pairs use :func:`teo_class_counts`, so the three TEO labels
    always appear); COHERENCE instances, which have no label, are counted by ``difficulty``.
    """
    by_split: dict[str, list[Mapping[str, Any]]] = {}
    for inst in instances:
        by_split.setdefault(str(inst.get("split", "?")), []).append(inst)
    by_split = dict(sorted(by_split.items(), key=lambda kv: _split_key(kv[0])))
    by_split["all"] = list(instances)

    def count(group: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        if name == "teo" or (group and all(i.get("label") in TEO_LABELS for i in group)):
            return teo_class_counts(group)
        key = "label" if any("label" in i for i in group) else "difficulty"
        return dict(sorted(Counter(str(i.get(key)) for i in group).items()))

    return {split: count(group) for split, group in by_split.items()}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(header)] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary_table(splits: Mapping[str, Sequence[Procedure]], records_read: Mapping[str, int] | None = None,
                  dropped: Mapping[str, int] | None = None,
                  tasks: Mapping[str, Sequence[Mapping[str, Any]]] | None = None, title: str = "") -> str:
    """The full text summary (see the module docstring)."""
    names = sorted(splits, key=_split_key)
    header = ["split", "procedures", "steps", "steps/proc", "image steps", "with DAG", "edges", "branching"]
    rows = [[name, *split_row(splits[name]).values()] for name in names]
    if len(names) > 1:
        rows.append(["all", *split_row([p for n in names for p in splits[n]]).values()])
    out = [title] if title else []
    out.append(_table(header, rows))
    if records_read:
        out.append("input records read: " + ", ".join(f"{k}: {v}" for k, v in records_read.items())
                   + f" (total {sum(records_read.values())})")
    if dropped:
        out.append("dropped: " + ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items())))
    else:
        out.append("dropped: nothing")
    for task, instances in (tasks or {}).items():
        note = " (original + swapped presentations)" if task == "teo" else ""
        out.append(f"task {task}: {len(instances)} instances{note}")
        if not instances:
            continue
        counts = task_class_counts(task, instances)
        rank = {label: i for i, label in enumerate(TEO_LABELS)}
        classes = sorted({c for per in counts.values() for c in per}, key=lambda c: (rank.get(c, len(rank)), c))
        out.append(_table(["split", *classes], [[s, *(per.get(c, 0) for c in classes)] for s, per in counts.items()]))
    return "\n".join(out)


def read_prepared(folder: str | Path, tasks: Sequence[str] | None = None,
                  check_images: bool = True) -> tuple[dict[str, list[Procedure]], dict[str, Any], dict[str, list[dict]]]:
    """Procedures, conversion record and task instances of a prepared folder.

    ``tasks=None`` reads every ``tasks/*.jsonl``; a named task without a file raises
    FileNotFoundError naming the file.
    """
    from seqaware.procedure import read_procedures

    folder = Path(folder)
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no <split>.jsonl files in {folder}")
    splits = {p.stem: read_procedures(p, check_images=check_images) for p in files}
    conversion_path = folder / CONVERSION_FILE
    conversion = json.loads(conversion_path.read_text()) if conversion_path.is_file() else {}
    task_dir = folder / "tasks"
    names = sorted(p.stem for p in task_dir.glob("*.jsonl")) if tasks is None else list(tasks)
    instances: dict[str, list[dict]] = {}
    for name in names:
        path = task_dir / f"{name}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"task file not found: {path}")
        rows = []
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{line_no}: ?: json: not valid JSON: {err.msg}") from None
        instances[name] = rows
    return splits, conversion, instances
