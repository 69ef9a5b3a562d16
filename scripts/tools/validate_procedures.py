#!/usr/bin/env python
"""Validate procedures JSONL files (or folders of them).

    python scripts/tools/validate_procedures.py data/prepared/train.jsonl data/prepared/val.jsonl
    python scripts/tools/validate_procedures.py data/prepared/          # every *.jsonl in the folder

Exits 0 when every record is valid; otherwise prints every problem as
``file:line: record id: field: reason`` on stderr and exits 1 (2 when a path does not exist).
Checked, besides each record's fields (docs/data_validation.md lists every rule):

* text is UTF-8; every image exists, lies inside the file's folder (``--allow-outside-images``
  relaxes this) and decodes completely (``--no-decode`` only checks that it exists,
  ``--no-images`` skips images);
* a file named like a split (``train.jsonl``, ``val.jsonl``, ``test-golden.jsonl``) holds only
  records of that split; no file is given twice; ids are unique across all the files given;
  an empty file is a problem.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from seqaware.procedure import (  # noqa: E402
    Problem,
    check_procedures_file,
    check_split_files,
    iter_procedure_files,
    split_of_file,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="JSONL files or folders holding them")
    parser.add_argument("--no-images", action="store_true", help="do not check image files at all")
    parser.add_argument("--no-decode", action="store_true", help="check that images exist, without decoding them")
    parser.add_argument("--allow-outside-images", action="store_true",
                        help="accept image paths that resolve outside the folder of their JSONL file")
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
    problems += check_split_files({f"argument {k + 1}": path for k, path in enumerate(files)})
    for path in files:
        procedures, found = check_procedures_file(
            path, check_images=not args.no_images, seen_ids=seen, expected_split=split_of_file(path),
            split_key=f"the file name {path.name!r}", allow_outside_images=args.allow_outside_images,
            decode_images=not (args.no_images or args.no_decode))
        if not procedures and not found:
            found.append(Problem(str(path), 0, "", "file", "holds no procedures (an empty split)"))
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
