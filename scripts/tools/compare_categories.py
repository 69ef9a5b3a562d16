#!/usr/bin/env python
"""Per-category comparison of runs (e.g. text-only vs multimodal BERSON) as a table and a PNG chart.

    python scripts/tools/compare_categories.py --run text=logs/berson_finetune/runs/A/predictions_test.jsonl \
        --run multimodal=logs/berson_finetune/runs/B/predictions_test.jsonl --out pmr_by_category.png

Prints one markdown table per run and writes a grouped bar chart of ``--metric`` (default PMR).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from seqaware.reports import bar_chart, markdown_table, per_category  # noqa: E402


def read_predictions(path: Path) -> list[dict]:
    records = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            rec = json.loads(line)
            _ = rec["pred"], rec["references"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            sys.exit(f"{path}:{line_no}: not a prediction record ({err})")
        records.append(rec)
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=PREDICTIONS.jsonl")
    parser.add_argument("--out", type=Path, default=Path("category_comparison.png"))
    parser.add_argument("--metric", default="pmr")
    parser.add_argument("--level", type=int, default=1, help="category path depth to group by")
    args = parser.parse_args(argv)
    series = {}
    for spec in args.run:
        label, sep, path = spec.partition("=")
        if not sep:
            parser.error(f"--run {spec!r}: expected LABEL=PATH")
        series[label] = per_category(read_predictions(Path(path)), args.level)
        print(f"## {label}\n\n{markdown_table(series[label])}")
    bar_chart(series, args.out, args.metric)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
