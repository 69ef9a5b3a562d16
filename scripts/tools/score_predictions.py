#!/usr/bin/env python
"""Score a predictions JSONL file (written by train.py) and compare with random orders.

    python scripts/tools/score_predictions.py logs/order_baseline/runs/<run>/predictions_test.jsonl --random 5
    python scripts/tools/score_predictions.py PREDICTIONS --reference-selection wu2022   # Wu et al.'s multi-reference rule

Prints the corpus ordering metrics of the predictions (every sequencing metric against the selected reference,
then PMR and tau against the authored one) and, with ``--random K``, the mean of the same metrics over K seeded
random orders of the same instances -- the chance row of a results table.  The metrics are the sequencing task's
list (``seqaware.metrics.ordering.SEQUENCING_METRICS``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from seqaware.metrics.ordering import (  # noqa: E402
    REFERENCE_SELECTIONS, corpus_order_metrics, order_keys, ranked_metrics)

SINGLE_REFERENCE = ("pmr", "tau")
"""The metrics also shown against the authored order alone (``single/...``)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("predictions", type=Path)
    parser.add_argument("--random", type=int, default=0, metavar="K", help="also score K random orders per instance")
    parser.add_argument("--seed", type=int, default=0)
    rules = "; ".join(f"{rule} ranks on {', '.join(ranked_metrics(rule))}" for rule in REFERENCE_SELECTIONS)
    parser.add_argument("--reference-selection", choices=REFERENCE_SELECTIONS, default="joint",
                        help=f"which reference of a multi-reference instance is scored (select_reference): {rules}")
    args = parser.parse_args(argv)

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
    keys = [*order_keys(), *(f"single/{k}" for k in SINGLE_REFERENCE)]
    print("| system | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, m in rows.items():
        print(f"| {name} | " + " | ".join(f"{m[k]:.4f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
