#!/usr/bin/env python
"""The published tables of our papers in their own layout, with our results beside them.

    # every published table (markdown), nothing else
    python scripts/studies/paper_tables.py --out tables.md
    # MATEO Tables 3-4 with our eval_teo results (+ a LoRA run of train.py, shown as fine-tuned)
    python scripts/studies/paper_tables.py --teo logs/eval_teo/*/teo_*.json "lora@instructions/image_text=logs/run/train.log"
    # Wu et al. Tables 2, 3, 4 and 10 with our sequencing runs
    python scripts/studies/paper_tables.py --sequencing "CLIP-ViL+BERSON@recipeqa/multimodal=logs/run1/test_metrics.json"
    # ISO-Bench Table 1, COHERENCE Tables 1-2 with our eval_teo results
    python scripts/studies/paper_tables.py --iso logs/eval_teo/*/iso_*.json --coherence logs/eval_teo/*/coherence_*.json
    # CaT-Bench Table 2 with a CaT-Bench run of train.py (experiment=teo_plan_head_catbench)
    python scripts/studies/paper_tables.py --catbench "closure head=logs/teo_plan_head_catbench/runs/RUN/test_metrics.json"

Published numbers come from ``configs/paper_results.yaml`` (``--published``), checked row by row
against :data:`SPECS` (an error names the file, paper, table, row and field). Without result files
every published table is printed; with them, the tables of those tasks, our rows added to the
matching row group with ``(ours)`` after the name. Numbers keep each paper's scale (Wu et al. and
COHERENCE print percentages, MATEO and ISO-Bench fractions); ours (fractions) are converted to it.

Our inputs and the paper columns they fill:

* ``--teo``: result JSONs of ``scripts/tools/eval_teo.py`` (``teo_<strategy>_<modality>.json``): every row
  (trivial baselines included) fills MATEO Table 3 with ``consistency_accuracy`` in the column of the
  result's strategy; image_text results fill Table 4 with ``mateo_f1_before``,
  ``mateo_f1_independent``, ``mateo_f1_after`` (before/after fall back to ``f1_before``/``f1_after``,
  which are defined the same way). ``NAME@STRATEGY/MODALITY=PATH`` reads a train.py run (``PATH`` as
  for ``--sequencing``; keys ``teo_consistency_accuracy``, ``teo_mateo_f1_*``) as a fine-tuned row.
* ``--sequencing NAME@DATASET/MODALITY=PATH`` (dataset wikihow|recipeqa, modality
  text|image|multimodal): ``PATH`` is a JSON metrics dict (``test_metrics.json``; keys optionally
  prefixed ``test/`` or nested under ``"metrics"``), a log holding train.py's ``TEST_METRICS_JSON``
  line (the last one is used) or the table printed by ``scripts/tools/score_predictions.py``.
  Tables 2 and 3 (original order): Acc, PMR, Lq, Lr, tau, Dist = ``single/acc`` x100,
  ``single/pmr`` x100, ``single/lcs``, ``single/lcstr``, ``single/tau``, ``single/dist``.
  Tables 4 and 10: All = ``single/<m>`` (single) and ``<m>`` (multi); Single = ``subset_single/<m>``;
  Multi. = ``subset_multi/<m>`` (multi) and, for single, the single-reference mean over the
  multi-reference instances derived from ``n``, ``n_single``, ``n_multi`` (on single-reference
  instances both scores are equal). A key a file lacks is shown as n/a.
* ``--iso``: eval_teo ISO results: answer_only -> setting A, explain -> E->A; P/R/F of DEP, NONDEP and
  MACRO AVG = ``precision_DEP`` ... ``macro_precision``, ``macro_recall``, ``macro_f1``.
* ``--coherence``: eval_teo COHERENCE results: Exact/Partial (Kendall) = ``exact_match``,
  ``partial_score`` x100, overall and per key of ``by_difficulty`` (Table 2) and ``by_source``
  (Table 1; domain names matched case-insensitively).

* ``--catbench NAME=PATH``: a CaT-Bench run's test metrics (``PATH`` as for ``--sequencing``): P, R,
  F1 of "yes", Acc and macro F1 = ``catbench_precision_yes``, ``catbench_recall_yes``,
  ``catbench_f1_yes``, ``catbench_accuracy``, ``catbench_macro_f1`` (row "NAME (ours)"), and the same
  keys with the prefixes ``lr_baseline``, ``always_yes``, ``always_no`` for the logistic-regression
  baseline and the trivial rows the run logs. The published rows print only F1 (see the table's notes).

With ``--out`` the markdown is written there and every table's rows (ours included) to
``<out>.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# By concern: the tables' vocabulary (paper_tables_schema.py), the published tables and their file
# (paper_tables_published.py), markdown (paper_tables_render.py), our rows (paper_tables_ours.py); this file is
# the command line and hands their names on.
from scripts.studies.paper_tables_ours import (CATBENCH_SYSTEMS, catbench_rows, coherence_rows, iso_rows,  # noqa: E402
                                       load_results, parse_catbench_spec, parse_sequencing_spec, parse_teo_spec,
                                       read_metrics, sequencing_rows, teo_rows)
from scripts.studies.paper_tables_published import SPECS, check_row, iso_unparsable_notes, load_published  # noqa: E402
from scripts.studies.paper_tables_render import format_value, merge_rows, render_table  # noqa: E402
from scripts.studies.paper_tables_schema import (CATBENCH_SETTINGS, COHERENCE_GROUPS, DASH, ISO_SETTINGS, NA,  # noqa: E402
                                         OBJECTIVES, PAPER_NAMES, REPAIRED_MARK, ROW_EXTRAS, SEQ_DATASETS,
                                         SEQ_MODALITIES, TEO_CLASSES, TEO_MODALITY_SHOW, TEO_STRATEGY_HEADERS, Label,
                                         Metric, TableSpec)
from seqaware.io import atomic_open  # noqa: E402
from seqaware.vlm.prompts import ISO_STRATEGIES, MODALITIES, STRATEGIES  # noqa: E402

__all__ = ["CATBENCH_SETTINGS", "CATBENCH_SYSTEMS", "COHERENCE_GROUPS", "DASH", "DEFAULT_PUBLISHED", "ISO_SETTINGS",
           "ISO_STRATEGIES", "MODALITIES", "NA", "OBJECTIVES", "PAPER_NAMES", "REPAIRED_MARK", "ROW_EXTRAS",
           "SEQ_DATASETS", "SEQ_MODALITIES", "SPECS", "STRATEGIES", "TEO_CLASSES", "TEO_MODALITY_SHOW",
           "TEO_STRATEGY_HEADERS", "Label", "Metric", "TableSpec", "build", "catbench_rows", "check_row", "coherence_rows",
           "format_value", "iso_rows", "iso_unparsable_notes", "load_published", "load_results", "main", "merge_rows",
           "parse_catbench_spec", "parse_sequencing_spec", "parse_teo_spec", "read_metrics", "render_table",
           "sequencing_rows", "teo_rows"]

DEFAULT_PUBLISHED = ROOT / "configs" / "paper_results.yaml"


def build(published: Mapping[str, Any], ours: Mapping[tuple[str, str], Sequence[dict]], kinds: set[str] | None
          ) -> tuple[str, dict[str, Any]]:
    """Markdown of the published tables (all, or those whose kind is in ``kinds``) with our rows, and their JSON."""
    sections, data = [], []
    for paper, entry in published.items():
        for table in entry["tables"]:
            spec = SPECS[(paper, table["name"])]
            if kinds is not None and spec.kind not in kinds:
                continue
            rows = list(ours.get((paper, table["name"]), []))
            sections.append(render_table(spec, table, entry["citation"], rows))
            data.append({"paper": paper, "name": table["name"], "title": spec.title,
                         "rows": merge_rows(spec, table["rows"], rows)})
    return "\n\n".join(sections) + "\n", {"tables": data}


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teo", nargs="+", action="extend", default=[], metavar="JSON|NAME@STRATEGY/MODALITY=PATH",
                        help="eval_teo TEO result JSONs, or a train.py run (fine-tuned row)")
    parser.add_argument("--sequencing", nargs="+", action="extend", default=[], metavar="NAME@DATASET/MODALITY=PATH")
    parser.add_argument("--iso", nargs="+", action="extend", default=[], metavar="JSON", help="eval_teo ISO result JSONs")
    parser.add_argument("--coherence", nargs="+", action="extend", default=[], metavar="JSON",
                        help="eval_teo COHERENCE result JSONs")
    parser.add_argument("--catbench", nargs="+", action="extend", default=[], metavar="NAME=PATH",
                        help="a CaT-Bench run's test metrics (test_metrics.json or its log)")
    parser.add_argument("--published", default=str(DEFAULT_PUBLISHED), help="published results YAML")
    parser.add_argument("--out", type=Path, help="write the tables here (markdown) and <out>.json")
    args = parser.parse_args(argv)
    ours: dict[tuple[str, str], list[dict]] = {}
    kinds: set[str] = set()
    if args.teo:
        files = [item for item in args.teo if Path(item).is_file()]
        runs = [parse_teo_spec(item) for item in args.teo if not Path(item).is_file()]
        ours.update(teo_rows(load_results(files, "teo"), [(n, s, m, read_metrics(p)) for n, s, m, p in runs]))
        kinds.add("teo")
    if args.sequencing:
        entries = [(n, d, m, read_metrics(p)) for n, d, m, p in map(parse_sequencing_spec, args.sequencing)]
        ours.update(sequencing_rows(entries))
        kinds.add("sequencing")
    if args.iso:
        ours.update(iso_rows(load_results(args.iso, "iso")))
        kinds.add("iso")
    if args.coherence:
        ours.update(coherence_rows(load_results(args.coherence, "coherence")))
        kinds.add("coherence")
    if args.catbench:
        ours.update(catbench_rows([(n, read_metrics(p)) for n, p in map(parse_catbench_spec, args.catbench)]))
        kinds.add("catbench")
    text, data = build(load_published(args.published), ours, kinds or None)
    print(text)
    if args.out:
        with atomic_open(args.out) as handle:
            handle.write(text)
        with atomic_open(args.out.with_suffix(".json")) as handle:
            json.dump(data, handle, indent=1, ensure_ascii=False, default=str)
    return text


if __name__ == "__main__":
    main()
