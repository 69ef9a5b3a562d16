#!/usr/bin/env python
"""Validate procedures JSONL files (or folders of them).

    python scripts/validate_procedures.py data/prepared/train.jsonl data/prepared/val.jsonl
    python scripts/validate_procedures.py data/prepared/          # every *.jsonl in the folder

Exits 0 when every record is valid; otherwise prints every problem as
``file:line: record id: field: reason`` on stderr and exits 1. Ids must be unique across all the
files given.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seqaware.procedure import check_procedures_file, iter_procedure_files  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="JSONL files or folders holding them")
    parser.add_argument("--no-images", action="store_true", help="do not check that image files exist")
    args = parser.parse_args(argv)
    seen: dict[str, str] = {}
    total, problems = 0, []
    files = list(iter_procedure_files(args.paths))
    if not files:
        print(f"no procedures files found in {args.paths}", file=sys.stderr)
        return 2
    for path in files:
        if not path.is_file():
            print(f"{path}: no such file", file=sys.stderr)
            return 2
        procedures, found = check_procedures_file(path, check_images=not args.no_images, seen_ids=seen)
        total += len(procedures)
        problems += found
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s); {total} valid procedure(s) in {len(files)} file(s)", file=sys.stderr)
        return 1
    print(f"OK: {total} procedure(s) in {len(files)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
