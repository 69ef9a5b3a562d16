#!/usr/bin/env python
"""Score a predictions JSONL file (written by train.py) and compare with random orders.

    python scripts/score_predictions.py logs/order_baseline/runs/<run>/predictions_test.jsonl --random 5
    python scripts/score_predictions.py PREDICTIONS --reference-selection wu2022   # Wu et al.'s multi-reference rule

Prints the corpus ordering metrics of the predictions (multi-reference, single-reference, subsets)
and, with ``--random K``, the mean of the same metrics over K seeded random orders of the same
instances -- the chance row of a results table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seqaware.metrics.ordering import REFERENCE_SELECTIONS, corpus_order_metrics  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("predictions", type=Path)
    parser.add_argument("--random", type=int, default=0, metavar="K", help="also score K random orders per instance")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference-selection", choices=REFERENCE_SELECTIONS, default="joint",
                        help="which reference of a multi-reference instance is scored (see select_reference)")
    args = parser.parse_args()

    records = []
    for line_no, line in enumerate(args.predictions.read_text().splitlines(), start=1):
        try:
            rec = json.loads(line)
            records.append((rec["pred"], rec["references"]))
        except (json.JSONDecodeError, KeyError) as err:
            sys.exit(f"{args.predictions}:{line_no}: not a prediction record ({err})")
    preds = [p for p, _ in records]
    refs = [r for _, r in records]
    rule = args.reference_selection
    rows = {"predictions": corpus_order_metrics(preds, refs, reference_selection=rule)}
    if args.random:
        rng = np.random.default_rng(args.seed)
        runs = [corpus_order_metrics([list(rng.permutation(p)) for p in preds], refs, reference_selection=rule)
                for _ in range(args.random)]
        rows[f"random (mean of {args.random})"] = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    keys = ["acc", "pmr", "dist", "lcs", "lcstr", "tau", "single/pmr", "single/tau"]
    print("| system | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, m in rows.items():
        print(f"| {name} | " + " | ".join(f"{m[k]:.4f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
