#!/usr/bin/env python
"""The published tables of our papers in their own layout, with our results beside them.

    # every published table (markdown), nothing else
    python scripts/paper_tables.py --out tables.md
    # MATEO Tables 3-4 with our eval_teo results (+ a LoRA run of train.py, shown as fine-tuned)
    python scripts/paper_tables.py --teo logs/eval_teo/*/teo_*.json "lora@instructions/image_text=logs/run/train.log"
    # Wu et al. Tables 2, 3, 4 and 10 with our sequencing runs
    python scripts/paper_tables.py --sequencing "CLIP-ViL+BERSON@recipeqa/multimodal=logs/run1/test_metrics.json"
    # ISO-Bench Table 1, COHERENCE Tables 1-2 with our eval_teo results
    python scripts/paper_tables.py --iso logs/eval_teo/*/iso_*.json --coherence logs/eval_teo/*/coherence_*.json
    # CaT-Bench Table 2 with a CaT-Bench run of train.py (experiment=teo_plan_head_catbench)
    python scripts/paper_tables.py --catbench "closure head=logs/teo_plan_head_catbench/runs/RUN/test_metrics.json"

Published numbers come from ``configs/paper_results.yaml`` (``--published``), checked row by row
against :data:`SPECS` (an error names the file, paper, table, row and field). Without result files
every published table is printed; with them, the tables of those tasks, our rows added to the
matching row group with ``(ours)`` after the name. Numbers keep each paper's scale (Wu et al. and
COHERENCE print percentages, MATEO and ISO-Bench fractions); ours (fractions) are converted to it.

Our inputs and the paper columns they fill:

* ``--teo``: result JSONs of ``scripts/eval_teo.py`` (``teo_<strategy>_<modality>.json``): every row
  (trivial baselines included) fills MATEO Table 3 with ``consistency_accuracy`` in the column of the
  result's strategy; image_text results fill Table 4 with ``mateo_f1_before``,
  ``mateo_f1_independent``, ``mateo_f1_after`` (before/after fall back to ``f1_before``/``f1_after``,
  which are defined the same way). ``NAME@STRATEGY/MODALITY=PATH`` reads a train.py run (``PATH`` as
  for ``--sequencing``; keys ``teo_consistency_accuracy``, ``teo_mateo_f1_*``) as a fine-tuned row.
* ``--sequencing NAME@DATASET/MODALITY=PATH`` (dataset wikihow|recipeqa, modality
  text|image|multimodal): ``PATH`` is a JSON metrics dict (``test_metrics.json``; keys optionally
  prefixed ``test/`` or nested under ``"metrics"``), a log holding train.py's ``TEST_METRICS_JSON``
  line (the last one is used) or the table printed by ``scripts/score_predictions.py``.
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
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seqaware.io import atomic_open, parse_test_metrics  # noqa: E402
from seqaware.metrics.iso import unparsable_consistency  # noqa: E402
from seqaware.vlm.prompts import ISO_STRATEGIES, MODALITIES, STRATEGIES  # noqa: E402

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)     # libyaml when PyYAML has it: 10x faster
DEFAULT_PUBLISHED = ROOT / "configs" / "paper_results.yaml"
NA = "n/a"      # a value not known
DASH = "-"      # a cell the paper prints as a dash or leaves empty: no value exists
REPAIRED_MARK = "°"
ROW_EXTRAS = ("repaired", "flags", "note")


# ---------------------------------------------------------------- schema
@dataclass(frozen=True)
class Label:
    """A field naming a row. ``kind``: str (``allowed`` or any non-empty string), bool, objectives
    (a non-empty list of distinct ``allowed`` names), fraction (a number in (0, 1])."""
    key: str
    header: str = ""                      # column header; "" = not a column of its own
    allowed: tuple | None = None
    kind: str = "str"
    default: Any = None                   # value of an absent field; None = the field is required
    show: Mapping[str, str] = field(default_factory=dict)   # printed text of a value


@dataclass(frozen=True)
class Metric:
    key: str
    header: str
    low: float
    high: float
    decimals: int = 2
    percent: bool = False                 # the paper prints a percentage; ours (a fraction) x 100
    optional: bool = False
    own_line: bool = False                # printed on a line of its own below the row (Wu's "% benefit")


@dataclass(frozen=True)
class TableSpec:
    paper: str
    name: str
    title: str
    kind: str | None                      # the result flag that adds our rows (None: none does)
    labels: tuple[Label, ...]
    metrics: tuple[Metric, ...]
    groups: tuple[tuple[str, str], ...] = ()   # (key, header) column groups; () = metrics on the row itself
    heading: Callable[[Mapping[str, Any]], str] | None = None   # row-group heading of a row
    dagger: str | None = None             # label printed with a dagger on human rows
    plus_minus: bool = False              # groups hold {value, std}, printed "value ± std"
    summary: Callable[[Sequence[Mapping[str, Any]]], list[str]] | None = None   # extra notes from the published rows

    def cell_paths(self) -> list[str]:
        if not self.groups:
            return [m.key for m in self.metrics]
        return [f"{g}.{m.key}" for g, _ in self.groups for m in self.metrics]


PAPER_NAMES = {"wu2022": "Wu et al. 2022", "mateo": "MATEO", "iso_bench": "ISO-Bench", "coherence": "COHERENCE",
               "catbench": "CaT-Bench"}
SEQ_DATASETS = (("wikihow", "WikiHow"), ("recipeqa", "RecipeQA"))
SEQ_MODALITIES = {"image": "Image-Only", "text": "Text-Only", "multimodal": "Multimodal"}
OBJECTIVES = ("MLM", "ISP", "PISP", "SMRM")
TEO_MODALITY_SHOW = {"image": "Image-only", "text": "Text-only", "image_text": "Image+Text"}
TEO_STRATEGY_HEADERS = {"baseline": "Baseline", "instructions": "Instructions", "icl": "ICL", "cot": "CoT",
                        "self_reflection": "Self-Reflect."}
TEO_CLASSES = ("before", "independent", "after")
ISO_SETTINGS = {"answer_only": "A", "explain": "E->A"}
COHERENCE_GROUPS = {"open": "Open-Source Models", "closed": "Closed-Source Models", "ours": "Ours"}

_ORDER = (Metric("acc", "Acc↑", 0, 100, percent=True), Metric("pmr", "PMR↑", 0, 100, percent=True),
          Metric("lq", "Lq↑", 0, 5), Metric("lr", "Lr↑", 0, 5), Metric("tau", "τ↑", -1, 1), Metric("dist", "Dist↓", 0, 12))
_MULTI_REF = (Metric("acc_single", "Acc↑ single", 0, 100, percent=True), Metric("acc_multi", "Acc↑ multi", 0, 100, percent=True),
              Metric("pmr_single", "PMR↑ single", 0, 100, percent=True), Metric("pmr_multi", "PMR↑ multi", 0, 100, percent=True),
              Metric("lr_single", "Lr↑ single", 0, 5), Metric("lr_multi", "Lr↑ multi", 0, 5),
              Metric("benefit", "% of instances benefit w. multi-reference", 0, 100, decimals=1, percent=True,
                     optional=True, own_line=True))
_SUBSET = Label("subset", "Subset", ("single", "multi", "all"), show={"single": "Single", "multi": "Multi.", "all": "All"})
_HUMAN = Label("human", kind="bool", default=False)
_TEST_FRACTION = Label("test_fraction", kind="fraction", default=1.0)
_TEO_COLUMNS = tuple(Metric(s, TEO_STRATEGY_HEADERS[s], 0, 1) for s in STRATEGIES)
CATBENCH_SETTINGS = ("A", "A+E", DASH)        # DASH: not prompted (a trained model, a trivial row)
_CATBENCH_COLUMNS = (Metric("p", "P", 0, 1), Metric("r", "R", 0, 1), Metric("f1", "F1", 0, 1),
                     Metric("acc", "Acc", 0, 1), Metric("macro_f1", "macro F1", 0, 1))


def _seq_heading(row: Mapping[str, Any]) -> str:
    return SEQ_MODALITIES.get(row["modality"], row["modality"])


def _model_heading(row: Mapping[str, Any]) -> str:
    return f"{row['model']} (fine-tuned)" if row.get("finetuned") else str(row["model"])


def iso_unparsable_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Which rule for unparsable replies each published ISO-Bench Table 1 row is consistent with
    (:func:`seqaware.metrics.iso.unparsable_consistency`): App. H excludes them, but a row whose NONDEP
    recall is below what its other three per-class figures imply under exclusion can only come from
    counting them wrong."""
    groups: dict[str, list[str]] = {"exclude": [], "wrong": [], "neither": []}
    for row in rows:
        dep, nondep = row.get("dep") or {}, row.get("nondep") or {}
        if not all(isinstance(_number(v.get(k)), float) for v in (dep, nondep) for k in ("p", "r")):
            continue
        check = unparsable_consistency(dep, nondep)
        name = _row_name(SPECS[("iso_bench", "Table 1")], row)
        if check["exclude"]:
            groups["exclude"].append(name)
        else:
            lo, hi = check["implied_recall_NONDEP"]
            groups["wrong" if check["wrong"] else "neither"].append(
                f"{name} (R NONDEP {nondep['r']:.2f}; excluding them implies {lo:.2f}-{hi:.2f})")
    notes = ["Unparsable replies (App. H: excluded from the scores). From each row's DEP P, DEP R and NONDEP P, "
             "excluding them fixes NONDEP R; counting them wrong can only lower it "
             "(seqaware.metrics.iso.unparsable_consistency, within the printed rounding):"]
    notes.append("consistent with excluding them (App. H): " + (", ".join(groups["exclude"]) or "none"))
    notes.append("only with counting them wrong (unparsable=wrong): " + (", ".join(groups["wrong"]) or "none"))
    if groups["neither"]:
        notes.append("with neither: " + ", ".join(groups["neither"]))
    return notes


SPECS: dict[tuple[str, str], TableSpec] = {(s.paper, s.name): s for s in (
    TableSpec("wu2022", "Table 2", "Golden-test-set performance (original ground-truth order)", "sequencing",
              (Label("modality", allowed=tuple(SEQ_MODALITIES)), Label("model", "Encoders"),
               Label("pretraining", "Sequence-aware Pretraining", ("Y", "N", DASH), show={DASH: ""}), _HUMAN),
              _ORDER, SEQ_DATASETS, _seq_heading),
    TableSpec("wu2022", "Table 3", "Pretraining-objective ablation (CLIP image-only, CLIP-ViL multimodal)", "sequencing",
              (Label("modality", allowed=("image", "multimodal")), Label("model"),
               Label("objectives", "Pretrain", OBJECTIVES, kind="objectives")),
              _ORDER, SEQ_DATASETS, _seq_heading),
    TableSpec("wu2022", "Table 4", "Multi-reference performance, text-only and multimodal († human)", "sequencing",
              (Label("modality", allowed=("text", "multimodal")), Label("model"), _SUBSET, _HUMAN),
              _MULTI_REF, SEQ_DATASETS, _seq_heading, dagger="subset"),
    TableSpec("wu2022", "Table 10", "Multi-reference performance, image-only († human)", "sequencing",
              (Label("modality", allowed=("image",)), Label("model"), _SUBSET, _HUMAN),
              _MULTI_REF, SEQ_DATASETS, _seq_heading, dagger="subset"),
    TableSpec("mateo", "Table 2", "Splits of the annotated corpus", None,
              (Label("statistic", " "),),
              (Metric("value", "", 0, math.inf, decimals=0), Metric("std", "±", 0, math.inf, decimals=0, optional=True)),
              (("train", "Train"), ("valid", "Valid"), ("test", "Test")), plus_minus=True),
    TableSpec("mateo", "Table 3", "TEO consistency accuracy per prompt strategy, and fine-tuned", "teo",
              (Label("model"), Label("modality", "Modality", tuple(MODALITIES), show=TEO_MODALITY_SHOW),
               Label("finetuned", kind="bool", default=False), _TEST_FRACTION),
              _TEO_COLUMNS, (), _model_heading),
    TableSpec("mateo", "Table 4", "Per-class TEO F1, image+text (before, independent: original order; after: swapped)", "teo",
              (Label("model"), Label("class", "Class", TEO_CLASSES, show={c: c.capitalize() for c in TEO_CLASSES}),
               _TEST_FRACTION),
              _TEO_COLUMNS, (), _model_heading),
    TableSpec("iso_bench", "Table 1", "DEP / NONDEP / weighted macro-average P, R, F1 (A: answer; E->A: explain, then answer)", "iso",
              (Label("model", "Model"), Label("setting", "Setting", ("E->A", "A", DASH))),
              (Metric("p", "P", 0, 1), Metric("r", "R", 0, 1), Metric("f", "F", 0, 1)),
              (("dep", "DEP"), ("nondep", "NONDEP"), ("macro", "MACRO AVG")), summary=iso_unparsable_notes),
    TableSpec("coherence", "Table 1", "Exact match and Kendall-based partial score per domain (%)", "coherence",
              (Label("group", allowed=("open", "closed")), Label("model", "Model")),
              (Metric("exact", "Exact", 0, 100, percent=True), Metric("partial", "Partial", 0, 100, percent=True)),
              (("wikihow", "WikiHow"), ("storybird", "StoryBird"), ("cooking", "Cooking"), ("science", "Science"),
               ("overall", "Overall")),
              lambda row: COHERENCE_GROUPS.get(row["group"], row["group"])),
    TableSpec("coherence", "Table 2", "Exact match and Kendall-based partial score per difficulty (%)", "coherence",
              (Label("group", allowed=("open", "closed")), Label("model", "Model")),
              (Metric("exact", "Exact", 0, 100, percent=True), Metric("kendall", "Kendall", 0, 100, percent=True)),
              (("easy", "Easy"), ("medium", "Medium"), ("hard", "Hard"), ("overall", "Overall")),
              lambda row: COHERENCE_GROUPS.get(row["group"], row["group"])),
    # CaT-Bench (Lal et al., EMNLP 2024): its own section (catbench_rows, --catbench)
    TableSpec("catbench", "Table 2", "Step Order Prediction on the test questions: P / R / F1 of 'dependent' (yes); "
              "accuracy and macro F1 beside them (A: answer only; A+E: answer, then explain)", "catbench",
              (Label("model", "Model"), Label("setting", "Setting", CATBENCH_SETTINGS)),
              _CATBENCH_COLUMNS),
)}


# ---------------------------------------------------------------- loading and checking the published file
def load_published(path: str | Path) -> dict[str, Any]:
    """The published-results file, every table and row checked against :data:`SPECS`."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--published: no such file: {path}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER) or {}
    except yaml.YAMLError as err:
        raise SystemExit(f"{path}: not valid YAML ({err})") from None
    papers = sorted({p for p, _ in SPECS})
    if not isinstance(data, Mapping):
        raise SystemExit(f"{path}: expected a mapping with the keys {', '.join(papers)}")
    unknown = sorted(set(data) - set(papers))
    if unknown:
        raise SystemExit(f"{path}: unknown paper key(s) {unknown}; expected {', '.join(papers)}")
    for paper, entry in data.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("tables"), list) or not entry.get("citation"):
            raise SystemExit(f"{path}: {paper}: expected a mapping with a 'citation' and a list 'tables'")
        extra = sorted(set(entry) - {"citation", "tables"})
        if extra:
            raise SystemExit(f"{path}: {paper}: unknown field(s) {extra}; allowed: citation, tables")
        seen_tables: set[str] = set()
        for t, table in enumerate(entry["tables"]):
            name = table.get("name") if isinstance(table, Mapping) else None
            where = f"{path}: {paper} {name or f'table {t}'}"
            if (paper, name) not in SPECS:
                known = ", ".join(n for p, n in SPECS if p == paper)
                raise SystemExit(f"{where}: no such table in the schema; {paper} has: {known}")
            if name in seen_tables:
                raise SystemExit(f"{where}: listed twice")
            seen_tables.add(name)
            extra = sorted(set(table) - {"name", "notes", "rows"})
            if extra:
                raise SystemExit(f"{where}: unknown field(s) {extra}; allowed: name, notes, rows")
            notes = table.get("notes", [])
            if not isinstance(notes, list) or not all(isinstance(n, str) and n.strip() for n in notes):
                raise SystemExit(f"{where}: 'notes' must be a list of non-empty strings")
            if not isinstance(table.get("rows"), list) or not table["rows"]:
                raise SystemExit(f"{where}: expected a non-empty list 'rows'")
            spec = SPECS[(paper, name)]
            seen: dict[tuple, int] = {}
            for i, row in enumerate(table["rows"]):
                key = check_row(spec, row, f"{where}: row {i}")
                if key in seen:
                    raise SystemExit(f"{where}: row {i} repeats row {seen[key]} {key}")
                seen[key] = i
    return data


def check_row(spec: TableSpec, row: Any, where: str) -> tuple:
    """Validate one published row (see the module docstring); returns its label values."""
    if not isinstance(row, Mapping):
        raise SystemExit(f"{where}: must be a mapping, got {row!r}")
    named = row.get("model", row.get("statistic"))
    if isinstance(named, str) and named.strip():
        where = f"{where} ({named})"
    labels = {label.key for label in spec.labels}
    values = {g for g, _ in spec.groups} if spec.groups else {m.key for m in spec.metrics}
    unknown = sorted(set(row) - labels - values - set(ROW_EXTRAS))
    if unknown:
        allowed = ", ".join([*(label.key for label in spec.labels), *sorted(values), *ROW_EXTRAS])  # a stable order
        raise SystemExit(f"{where}: unknown field(s) {unknown}; allowed: {allowed}")
    key = []
    for label in spec.labels:
        value = row.get(label.key, label.default)
        key.append(tuple(value) if isinstance(value, list) else value)
        _check_label(label, value, f"{where}: field {label.key!r}")
    if spec.groups:
        for group, _ in spec.groups:
            cells = row.get(group)
            if not isinstance(cells, Mapping):
                raise SystemExit(f"{where}: field {group!r} must be a mapping of {', '.join(m.key for m in spec.metrics)}")
            _check_cells(spec.metrics, cells, where, group)
    else:
        _check_cells(spec.metrics, row, where)
    _check_extras(spec, row, where)
    return tuple(key)


def _check_label(label: Label, value: Any, where: str) -> None:
    if label.kind == "bool":
        if not isinstance(value, bool):
            raise SystemExit(f"{where} is {value!r}, expected true or false")
    elif label.kind == "fraction":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise SystemExit(f"{where} is {value!r}, expected a number in (0, 1]")
    elif label.kind == "objectives":
        if (not isinstance(value, list) or not value or len(set(value)) != len(value)
                or any(v not in label.allowed for v in value)):
            raise SystemExit(f"{where} is {value!r}, expected a non-empty list of distinct names from {', '.join(label.allowed)}")
    elif label.allowed is not None:
        if value not in label.allowed:
            raise SystemExit(f"{where} is {value!r}, expected one of {', '.join(map(str, label.allowed))}")
    elif not isinstance(value, str) or not value.strip():
        raise SystemExit(f"{where} is {value!r}, expected a non-empty string")


def _check_cells(metrics: Sequence[Metric], cells: Mapping[str, Any], where: str, group: str | None = None) -> None:
    """The metric cells of a row (``group`` None) or of one column group of it."""
    if group is not None:
        unknown = sorted(set(cells) - {m.key for m in metrics})
        if unknown:
            raise SystemExit(f"{where}: field {group!r} has unknown metric(s) {unknown}; "
                             f"allowed: {', '.join(m.key for m in metrics)}")
    for metric in metrics:
        field_where = f"{where}: field '{group}.{metric.key}'" if group else f"{where}: field {metric.key!r}"
        if metric.key not in cells:
            if metric.optional:
                continue
            raise SystemExit(f"{field_where} is missing (give the number, '{DASH}' for a dash in the paper or '{NA}')")
        value = cells[metric.key]
        if value in (NA, DASH):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not metric.low <= value <= metric.high:
            scale = " (the paper prints a percentage: 45.2 % is 45.2)" if metric.percent else ""
            raise SystemExit(f"{field_where} is {value!r}, expected a number in [{metric.low:g}, {metric.high:g}],"
                             f" '{DASH}' or '{NA}'{scale}")


def _check_extras(spec: TableSpec, row: Mapping[str, Any], where: str) -> None:
    repaired = row.get("repaired", {})
    paths = {label.key for label in spec.labels} | set(spec.cell_paths())
    if not isinstance(repaired, Mapping):
        raise SystemExit(f"{where}: field 'repaired' must map a field or group.metric to what was done")
    for cell, text in repaired.items():
        if cell not in paths:
            raise SystemExit(f"{where}: field 'repaired' names {cell!r}, which is not a field or group.metric of this table")
        if not isinstance(text, str) or not text.strip():
            raise SystemExit(f"{where}: field 'repaired.{cell}' must say what was done")
    flags = row.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) and f.strip() for f in flags):
        raise SystemExit(f"{where}: field 'flags' must be a list of non-empty strings")
    if "note" in row and (not isinstance(row["note"], str) or not row["note"].strip()):
        raise SystemExit(f"{where}: field 'note' must be a non-empty string")


# ---------------------------------------------------------------- rendering
def _decimals(value: float) -> int:
    text = repr(float(value))
    return 0 if "e" in text or text.endswith(".0") else len(text.split(".")[1])


def format_value(value: Any, metric: Metric, ours: bool = False) -> str:
    """A cell: the column's decimals; a published number keeps every digit it was printed with."""
    if value is None or value == NA:
        return NA
    if value == DASH:
        return DASH
    digits = metric.decimals if ours else max(metric.decimals, _decimals(value))
    return f"{value:.{digits}f}"


def _label_text(spec: TableSpec, label: Label, row: Mapping[str, Any]) -> str:
    if label.key in row.get("_label", {}):
        return row["_label"][label.key]
    value = row.get(label.key, label.default)
    if label.kind == "objectives":
        text = " + ".join(value)
    else:
        text = label.show.get(value, str(value))
    if spec.dagger == label.key and row.get("human"):
        text += "†"
    if label.key in row.get("repaired", {}):
        text += REPAIRED_MARK
    return text


def _row_name(spec: TableSpec, row: Mapping[str, Any]) -> str:
    parts = [spec.heading(row)] if spec.heading else []
    parts += [_label_text(spec, label, row).rstrip(REPAIRED_MARK) for label in spec.labels if label.header.strip()]
    return " ".join(p for p in parts if p)


def merge_rows(spec: TableSpec, published: Sequence[Mapping[str, Any]], ours: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Published rows in the paper's order; each of ours after the last row of its row group (or at the end)."""
    rows = [dict(r) for r in published]
    for row in ours:
        heading = spec.heading(row) if spec.heading else None
        at = max((i for i, r in enumerate(rows) if spec.heading and spec.heading(r) == heading), default=len(rows) - 1)
        rows.insert(at + 1, dict(row, _ours=True))
    return rows


def render_table(spec: TableSpec, table: Mapping[str, Any], citation: str, ours: Sequence[Mapping[str, Any]] = ()) -> str:
    """Markdown of one table in the paper's layout: row groups as heading rows, column groups x metrics."""
    rows = merge_rows(spec, table["rows"], ours)
    labels = [label for label in spec.labels if label.header]
    columns = [m for m in spec.metrics if not m.own_line]
    if spec.plus_minus:
        headers = [title for _, title in spec.groups]
    elif spec.groups:
        headers = [f"{title} {m.header}" for _, title in spec.groups for m in columns]
    else:
        headers = [m.header for m in columns]
    label_headers = [label.header.strip() for label in labels] or [""]
    width = len(label_headers) + len(headers)
    lines = [f"### {PAPER_NAMES[spec.paper]}, {spec.name}: {spec.title}", "",
             "| " + " | ".join(label_headers + headers) + " |",
             "|" + "---|" * len(label_headers) + "---:|" * len(headers)]
    heading = None
    starred = False
    for row in rows:
        ours_row = bool(row.get("_ours"))
        if spec.heading and spec.heading(row) != heading:
            heading = spec.heading(row)
            lines.append("| " + " | ".join([f"**{heading}**"] + [""] * (width - 1)) + " |")
        star = "*" if row.get("test_fraction", 1.0) < 1 else ""
        starred = starred or bool(star)
        repaired = row.get("repaired", {})
        cells = [_label_text(spec, label, row) for label in labels] or [""]
        groups = spec.groups or ((None, ""),)
        for group, _ in groups:
            values = row.get(group, {}) if group else row
            if spec.plus_minus:
                text = format_value(values.get("value"), spec.metrics[0])
                if "std" in values:
                    text += " ± " + format_value(values["std"], spec.metrics[1])
                cells.append(text)
                continue
            for metric in columns:
                path = f"{group}.{metric.key}" if group else metric.key
                text = format_value(values.get(metric.key, NA), metric, ours_row)
                if text not in (NA, DASH):
                    text += star
                cells.append(text + (REPAIRED_MARK if path in repaired else ""))
        lines.append("| " + " | ".join(cells) + " |")
        for metric in (m for m in spec.metrics if m.own_line):
            own = [(row.get(g, {}) or {}).get(metric.key) for g, _ in spec.groups]
            if any(v is not None for v in own):
                filler = [""] * len(columns)
                extra = []
                for v in own:
                    extra += [f"{format_value(v, metric, ours_row)}%" if v not in (None, NA) else NA] + filler[1:]
                lines.append("| " + " | ".join([f"({metric.header})"] + [""] * (len(label_headers) - 1) + extra) + " |")
    notes = [f"- {n}" for n in table.get("notes", [])]
    if starred:
        fractions = sorted({r["test_fraction"] for r in rows if r.get("test_fraction", 1.0) < 1})
        notes.append("- \\* Results achieved on " + ", ".join(f"{100 * f:g}%" for f in fractions) + " of the test set only.")
    for row in rows:
        for cell, text in row.get("repaired", {}).items():
            notes.append(f"- {REPAIRED_MARK} {_row_name(spec, row)}, {cell}: repaired, {text}")
    for row in rows:
        notes += [f"- flag, {_row_name(spec, row)}: {flag}" for flag in row.get("flags", [])]
        if row.get("note"):
            notes.append(f"- {_row_name(spec, row)}: {row['note']}")
    if spec.summary:
        notes += [f"- {n}" for n in spec.summary([r for r in rows if not r.get("_ours")])]
    if any(r.get("_ours") for r in rows):
        notes.append("- Rows marked (ours) are our results, on the paper's scale.")
    lines += ["", f"Source: {citation.rstrip('.')}, {spec.name}."] + ([""] + notes if notes else [])
    return "\n".join(lines)


# ---------------------------------------------------------------- reading our result files
def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _score_predictions_table(text: str) -> dict[str, float] | None:
    """The ``predictions`` row of the table ``scripts/score_predictions.py`` prints, or None."""
    header = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "system":
            header = cells
        elif header and cells[0] == "predictions" and len(cells) == len(header):
            return {k: float(v) for k, v in zip(header[1:], cells[1:]) if _number(v) is not None}
    return None


def read_metrics(path: str | Path) -> dict[str, float]:
    """Test metrics of a run: a JSON dict (``test_metrics.json``), the last ``TEST_METRICS_JSON`` line
    of a log, or score_predictions.py's table; ``test/`` prefixes removed."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"{path}: no such metrics file")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        metrics: Any = json.loads(text)
    except json.JSONDecodeError:
        try:
            metrics = parse_test_metrics(text)
        except json.JSONDecodeError as err:
            raise SystemExit(f"{path}: malformed TEST_METRICS_JSON line ({err})") from None
        if metrics is None:
            metrics = _score_predictions_table(text)
        if metrics is None:
            raise SystemExit(f"{path}: neither a JSON metrics dict, a log with a TEST_METRICS_JSON line "
                             "nor the table of scripts/score_predictions.py")
    if isinstance(metrics, Mapping) and isinstance(metrics.get("metrics"), Mapping):
        metrics = metrics["metrics"]
    if not isinstance(metrics, Mapping):
        raise SystemExit(f"{path}: expected a JSON object of metrics")
    return {k.removeprefix("test/"): float(v) for k, v in metrics.items() if _number(v) is not None}


def load_results(paths: Iterable[str | Path], task: str) -> list[dict[str, Any]]:
    """eval_teo result JSONs of ``task``; an unreadable file or another task's result is an error naming the file."""
    results = []
    for path in paths:
        path = Path(path)
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise SystemExit(f"{path}: cannot read an eval_teo result ({err})") from None
        if not isinstance(result, Mapping):
            raise SystemExit(f"{path}: not a result of scripts/eval_teo.py (expected a JSON object)")
        missing = [k for k in ("task", "model", "strategy", "modality", "rows") if k not in result]
        if missing:
            raise SystemExit(f"{path}: not a result of scripts/eval_teo.py (missing {', '.join(missing)})")
        if result["task"] != task:
            raise SystemExit(f"{path}: a {result['task']!r} result, not {task!r}; pass it to --{result['task']}")
        if not isinstance(result["rows"], Mapping):
            raise SystemExit(f"{path}: field 'rows' must map a system name to its metrics")
        results.append(dict(result, _path=str(path)))
    return results


def _spec_parts(spec: str, flag: str, what: str) -> tuple[str, str, str, Path]:
    """``NAME@A/B=PATH`` -> (name, a, b, path)."""
    try:
        left, path = spec.split("=", 1)
        name, where = left.rsplit("@", 1)
        first, second = where.split("/", 1)
    except ValueError:
        raise SystemExit(f"{flag} {spec!r}: expected NAME@{what}=PATH") from None
    if not name or not first or not second or not path:
        raise SystemExit(f"{flag} {spec!r}: expected NAME@{what}=PATH")
    return name, first.lower(), second.lower(), Path(path)


def parse_sequencing_spec(spec: str) -> tuple[str, str, str, Path]:
    """``NAME@DATASET/MODALITY=PATH`` -> (name, dataset, modality, path), checked against Wu et al.'s tables."""
    name, dataset, modality, path = _spec_parts(spec, "--sequencing", "DATASET/MODALITY")
    if dataset not in dict(SEQ_DATASETS):
        raise SystemExit(f"--sequencing {spec!r}: dataset {dataset!r} is not a column of Wu et al.'s tables "
                         f"({', '.join(dict(SEQ_DATASETS))})")
    if modality not in SEQ_MODALITIES:
        raise SystemExit(f"--sequencing {spec!r}: modality {modality!r}, expected one of {', '.join(SEQ_MODALITIES)}")
    return name, dataset, modality, path


def parse_teo_spec(spec: str) -> tuple[str, str, str, Path]:
    """``NAME@STRATEGY/MODALITY=PATH`` (a train.py run) -> (name, strategy, modality, path)."""
    if "@" not in spec:
        raise SystemExit(f"--teo {spec!r}: no such result file (or give a train.py run as NAME@STRATEGY/MODALITY=PATH)")
    name, strategy, modality, path = _spec_parts(spec, "--teo", "STRATEGY/MODALITY")
    if strategy not in STRATEGIES:
        raise SystemExit(f"--teo {spec!r}: strategy {strategy!r}, expected one of {', '.join(STRATEGIES)}")
    if modality not in MODALITIES:
        raise SystemExit(f"--teo {spec!r}: modality {modality!r}, expected one of {', '.join(MODALITIES)}")
    return name, strategy, modality, path


# ---------------------------------------------------------------- our rows in each paper's columns
def _percent(value: float | None) -> float | str:
    return NA if value is None else 100 * value


def _raw(value: float | None) -> float | str:
    return NA if value is None else value


def _multi_subset_single(metrics: Mapping[str, float], key: str) -> float | None:
    """Single-reference mean over the multi-reference instances: n * single/<key> minus the
    single-reference instances' share (on them single- and multi-reference scores are equal)."""
    n, n_single, n_multi = (metrics.get(k) for k in ("n", "n_single", "n_multi"))
    total = metrics.get(f"single/{key}")
    if not n or not n_multi or total is None or n_single is None:
        return None
    single_part = metrics.get(f"subset_single/{key}", 0.0) * n_single if n_single else 0.0
    return (n * total - single_part) / n_multi


def sequencing_rows(entries: Sequence[tuple[str, str, str, Mapping[str, float]]]) -> dict[tuple[str, str], list[dict]]:
    """Our rows of Wu et al. Tables 2, 3, 4 and 10 from ``(name, dataset, modality, metrics)``."""
    out: dict[tuple[str, str], list[dict]] = {("wu2022", t): [] for t in ("Table 2", "Table 3", "Table 4", "Table 10")}
    blank = {k: NA for k in ("acc", "pmr", "lq", "lr", "tau", "dist")}
    by_model: dict[tuple[str, str], dict] = {}
    for name, dataset, modality, metrics in entries:
        row = by_model.setdefault((name, modality), {"modality": modality, "model": name,
                                                     **{d: dict(blank) for d, _ in SEQ_DATASETS}})
        row[dataset] = {
            "acc": _percent(metrics.get("single/acc")), "pmr": _percent(metrics.get("single/pmr")),
            "lq": _raw(metrics.get("single/lcs")), "lr": _raw(metrics.get("single/lcstr")),
            "tau": _raw(metrics.get("single/tau")), "dist": _raw(metrics.get("single/dist")),
        }
    for (name, modality), row in by_model.items():
        out[("wu2022", "Table 2")].append(dict(row, pretraining=DASH, _label={"model": f"{name} (ours)", "pretraining": ""}))
        if modality in ("image", "multimodal"):
            out[("wu2022", "Table 3")].append(dict(row, objectives=[], _label={"objectives": f"{name} (ours)"}))
    multi_ref: dict[tuple[str, str, str], dict] = {}
    for name, dataset, modality, metrics in entries:
        table = ("wu2022", "Table 10" if modality == "image" else "Table 4")
        for subset in ("single", "multi", "all"):
            row = multi_ref.setdefault((name, modality, subset), {
                "_table": table, "modality": modality, "model": name, "subset": subset, "human": False,
                "_label": {"subset": f"{_SUBSET.show[subset]} ({name}, ours)"},
                **{d: {m.key: NA for m in _MULTI_REF if not m.optional} for d, _ in SEQ_DATASETS}})
            cells = row[dataset]
            for short, key in (("acc", "acc"), ("pmr", "pmr"), ("lr", "lcstr")):
                scale = _raw if short == "lr" else _percent
                if subset == "single":
                    cells[f"{short}_single"], cells[f"{short}_multi"] = scale(metrics.get(f"subset_single/{key}")), DASH
                elif subset == "multi":
                    cells[f"{short}_single"] = scale(_multi_subset_single(metrics, key))
                    cells[f"{short}_multi"] = scale(metrics.get(f"subset_multi/{key}"))
                else:
                    cells[f"{short}_single"], cells[f"{short}_multi"] = scale(metrics.get(f"single/{key}")), scale(metrics.get(key))
    for row in multi_ref.values():
        out[row.pop("_table")].append(row)
    return out


def _teo_value(report: Mapping[str, Any], *keys: str) -> float | str:
    for key in keys:
        if _number(report.get(key)) is not None:
            return float(report[key])
    return NA


def teo_rows(results: Sequence[Mapping[str, Any]], runs: Sequence[tuple[str, str, str, Mapping[str, float]]] = ()
             ) -> dict[tuple[str, str], list[dict]]:
    """Our rows of MATEO Tables 3 (consistency accuracy) and 4 (per-class F1, image_text only).

    ``results``: eval_teo TEO results (every row, baselines included); ``runs``: train.py runs
    ``(name, strategy, modality, metrics)`` whose keys carry the ``teo_`` prefix, shown as fine-tuned.
    """
    table3: dict[tuple[str, str, bool], dict] = {}
    table4: dict[tuple[str, str, bool], dict] = {}
    reports = [(r["_path"], name, r["strategy"], r["modality"], report, False)
               for r in results for name, report in r["rows"].items()]
    reports += [(name, name, strategy, modality, {k.removeprefix("teo_"): v for k, v in metrics.items()}, True)
                for name, strategy, modality, metrics in runs]
    for source, name, strategy, modality, report, finetuned in reports:
        if strategy not in STRATEGIES or modality not in MODALITIES:
            raise SystemExit(f"{source}: strategy {strategy!r} / modality {modality!r} is not a MATEO column "
                             f"(strategies {', '.join(STRATEGIES)}; modalities {', '.join(MODALITIES)})")
        row = table3.setdefault((name, modality, finetuned), {
            "model": name, "modality": modality, "finetuned": finetuned, **{s: DASH for s in STRATEGIES}})
        row[strategy] = _teo_value(report, "consistency_accuracy")
        if modality == "image_text":
            for cls, keys in (("before", ("mateo_f1_before", "f1_before")), ("independent", ("mateo_f1_independent",)),
                              ("after", ("mateo_f1_after", "f1_after"))):
                row4 = table4.setdefault((name, cls, finetuned), {"model": name, "class": cls, "finetuned": finetuned,
                                                                  **{s: DASH for s in STRATEGIES}})
                row4[strategy] = _teo_value(report, *keys)
    return {("mateo", "Table 3"): [dict(r, model=f"{r['model']} (ours)") for r in table3.values()],
            ("mateo", "Table 4"): [dict(r, model=f"{r['model']} (ours)") for r in table4.values()]}


def iso_rows(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[dict]]:
    """Our rows of ISO-Bench Table 1: each result's system under both rules for unparsable replies
    (``exclude``, App. H, and ``wrong``; setting from its strategy), then the trivial baselines once
    (setting '-'; they always parse, so the rule does not change them)."""
    systems, baselines = [], {}
    for result in results:
        strategy = result["strategy"]
        if strategy not in ISO_SETTINGS:
            raise SystemExit(f"{result['_path']}: ISO strategy {strategy!r}, expected one of {', '.join(ISO_STRATEGIES)}")
        by_rule = result.get("rows_by_unparsable") or {result.get("unparsable", "exclude"): result["rows"]}
        for rule, rows in by_rule.items():
            _iso_system_rows(result, rule, rows, systems, baselines)
    return {("iso_bench", "Table 1"): systems + list(baselines.values())}


def _iso_system_rows(result: Mapping[str, Any], rule: str, rows: Mapping[str, Mapping[str, Any]],
                     systems: list[dict], baselines: dict[str, dict]) -> None:
    """Table 1 rows of one result under one rule: its model's row to ``systems``, the baselines' to
    ``baselines`` (each name once)."""
    for name, report in rows.items():
        own = name == result["model"]
        row = {"model": f"{name} (ours, unparsable={rule})" if own else f"{name} (ours)",
               "setting": ISO_SETTINGS[result["strategy"]] if own else DASH}
        for group, suffix in (("dep", "_DEP"), ("nondep", "_NONDEP")):
            row[group] = {m: _teo_value(report, f"{full}{suffix}") for m, full in
                          (("p", "precision"), ("r", "recall"), ("f", "f1"))}
        row["macro"] = {m: _teo_value(report, f"macro_{full}") for m, full in
                        (("p", "precision"), ("r", "recall"), ("f", "f1"))}
        if own:
            systems.append(row)
        else:
            baselines.setdefault(name, row)


def coherence_rows(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[dict]]:
    """Our rows of COHERENCE Tables 1 (per domain: ``by_source``) and 2 (per difficulty: ``by_difficulty``)."""
    out: dict[tuple[str, str], dict[str, dict]] = {("coherence", "Table 1"): {}, ("coherence", "Table 2"): {}}
    for result in results:
        for name, report in result["rows"].items():
            for table, breakdown, partial in (("Table 1", "by_source", "partial"), ("Table 2", "by_difficulty", "kendall")):
                spec = SPECS[("coherence", table)]
                parts = {str(k).lower(): v for k, v in (report.get(breakdown) or {}).items() if isinstance(v, Mapping)}
                row = {"group": "ours", "model": f"{name} (ours)"}
                for group, _ in spec.groups:
                    source = report if group == "overall" else parts.get(group, {})
                    row[group] = {"exact": _percent(_number(source.get("exact_match"))),
                                  partial: _percent(_number(source.get("partial_score")))}
                out[("coherence", table)].setdefault(name, row)
    return {key: list(rows.values()) for key, rows in out.items()}


# ---------------------------------------------------------------- CaT-Bench
CATBENCH_SYSTEMS = (("catbench", "{name} (ours)"), ("lr_baseline", "logistic regression, frozen MiniLM (ours)"),
                    ("always_yes", "always yes (ours)"), ("always_no", "always no (ours)"))
"""Metric-key prefix of each row a CaT-Bench run logs (``test/<prefix>_<metric>``) and its row name."""
_CATBENCH_KEYS = {"p": "precision_yes", "r": "recall_yes", "f1": "f1_yes", "acc": "accuracy", "macro_f1": "macro_f1"}


def parse_catbench_spec(spec: str) -> tuple[str, Path]:
    """``NAME=PATH`` (a CaT-Bench run's test metrics) -> (name, path)."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"--catbench {spec!r}: expected NAME=PATH (PATH: a run's test_metrics.json or log)")
    return name, Path(path)


def catbench_rows(runs: Sequence[tuple[str, Mapping[str, float]]]) -> dict[tuple[str, str], list[dict]]:
    """Our rows of CaT-Bench Table 2 from runs' test metrics (``catbench_*`` = the run's model, then the
    logistic-regression baseline and the trivial rows when the run logged them, each once); setting '-'."""
    rows: dict[str, dict] = {}
    for name, metrics in runs:
        found = False
        for prefix, title in CATBENCH_SYSTEMS:
            if f"{prefix}_f1_yes" not in metrics:
                continue
            found = True
            model = title.format(name=name)
            rows.setdefault(model, {"model": model, "setting": DASH,
                                    **{col: _raw(_number(metrics.get(f"{prefix}_{key}"))) for col, key in _CATBENCH_KEYS.items()}})
        if not found:
            raise SystemExit(f"--catbench {name}: the metrics hold no CaT-Bench scores (no 'catbench_f1_yes')")
    return {("catbench", "Table 2"): list(rows.values())}


# ---------------------------------------------------------------- command line
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
