#!/usr/bin/env python
"""Print the summary table of a prepared dataset folder (the one scripts/tools/prepare_data.py prints).

    python scripts/tools/dataset_stats.py data/rfg
    python scripts/tools/dataset_stats.py data/rfg --tasks teo
    python scripts/tools/dataset_stats.py data/rfg --no-images

Reads ``DIR/<split>.jsonl`` (validated), ``DIR/conversion.json`` when present (records read,
dropped items) and ``DIR/tasks/*.jsonl`` (all of them, or only ``--tasks``). Bad input exits 1
with the problems as ``file:line: record id: field: reason``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data_modules.adapters.report import read_prepared, summary_table  # noqa: E402
from seqaware.procedure import ProcedureFormatError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", help="prepared folder (output of scripts/tools/prepare_data.py)")
    parser.add_argument("--tasks", default=None, help="comma-separated task files to count (default: every tasks/*.jsonl)")
    parser.add_argument("--no-images", action="store_true", help="do not check that image files exist")
    args = parser.parse_args(argv)
    tasks = None if args.tasks is None else [t.strip() for t in args.tasks.split(",") if t.strip()]
    try:
        splits, conversion, instances = read_prepared(args.dir, tasks=tasks, check_images=not args.no_images)
    except (ProcedureFormatError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    title = f"{conversion.get('dataset', 'dataset')}: {args.dir}"
    print(summary_table(splits, conversion.get("records_read"), conversion.get("dropped"), instances, title=title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
