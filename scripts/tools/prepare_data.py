#!/usr/bin/env python
"""Convert a raw dataset release into procedures JSONL (+ images, + task instances) and summarise it.

    python scripts/tools/prepare_data.py rfg --src ../shared/data/rfg/r-100 --out data/rfg --tasks teo
    python scripts/tools/prepare_data.py catbench --src ../shared/data/catbench/test_questions_sample.jsonl --out data/catbench
    python scripts/tools/prepare_data.py wikihow --src /data/wikihow --out data/wikihow --option unreadable_image=skip
    python scripts/tools/prepare_data.py rfg --src R --out O --option split=random --option "fractions=[0.8,0.1,0.1]"
    python scripts/tools/prepare_data.py mateo --src M --out O --tasks teo,iso --task-option iso.label_by=dag

Writes ``OUT/<split>.jsonl``, ``OUT/images/``, ``OUT/tasks/<task>.jsonl`` and ``OUT/conversion.json``
(see data_modules/adapters/prepare.py), then prints the summary table: input records read,
procedures and steps per split, steps per procedure, edges, branching factor, dropped items and
why, and with tasks the class counts per task. Option values are parsed as YAML (``true``, ``3``,
``[a, b]``). Bad input exits 1 with every problem as ``file:line: record id: field: reason``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data_modules.adapters import ADAPTERS  # noqa: E402
from data_modules.adapters.common import AdapterOptionError  # noqa: E402
from seqaware.procedure import ProcedureFormatError  # noqa: E402


def parse_options(items: list[str], flag: str) -> dict[str, Any]:
    """``["key=value", ...]`` -> dict with YAML-parsed values; a malformed item raises ValueError."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} {item!r}: expected key=value")
        out[key.strip()] = yaml.safe_load(value)
    return out


def parse_task_options(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["iso.ks=[2,3]", ...]`` -> ``{"iso": {"ks": [2, 3]}}``."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in parse_options(items, "--task-option").items():
        task, dot, name = key.partition(".")
        if not dot or not name:
            raise ValueError(f"--task-option {key}=...: expected task.key=value (e.g. iso.ks=[2,3])")
        out.setdefault(task, {})[name] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=sorted(ADAPTERS), help="adapter name")
    parser.add_argument("--src", required=True, help="the raw release: folder or file")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--tasks", default="", help="comma-separated task views to build: teo,iso,coherence")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="adapter option (repeatable)")
    parser.add_argument("--task-option", action="append", default=[], metavar="TASK.KEY=VALUE",
                        help="keyword argument of a task builder (repeatable)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    from data_modules.adapters.prepare import prepare_dataset
    from data_modules.adapters.report import summary_table

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    try:
        options = parse_options(args.option, "--option")
        task_options = parse_task_options(args.task_option)
        result, instances = prepare_dataset(args.dataset, args.src, args.out, tasks=tasks, options=options,
                                            task_options=task_options, progress=not args.no_progress)
    except (ProcedureFormatError, AdapterOptionError, FileNotFoundError, ImportError, KeyError, ValueError,
            TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(summary_table(result.splits, result.records_read, result.dropped, instances,
                        title=f"{args.dataset}: {args.src} -> {args.out}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
