"""The published tables (scripts/studies/paper_tables.py): their layouts (:data:`SPECS`), and the published-results
file (``configs/paper_results.yaml``) loaded and checked row by row against them."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from scripts.studies.paper_tables_render import _row_name
from scripts.studies.paper_tables_schema import (_CATBENCH_COLUMNS, _HUMAN, _MULTI_REF, _ORDER, _SUBSET, _TEO_COLUMNS,
                                         _TEST_FRACTION, CATBENCH_SETTINGS, COHERENCE_GROUPS, DASH, NA, OBJECTIVES,
                                         ROW_EXTRAS, SEQ_DATASETS, SEQ_MODALITIES, TEO_CLASSES, TEO_MODALITY_SHOW,
                                         Label, Metric, TableSpec, _number)
from seqaware.metrics.iso import unparsable_consistency
from seqaware.vlm.prompts import MODALITIES

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)     # libyaml when PyYAML has it: 10x faster


def _seq_heading(row: Mapping[str, Any]) -> str:
    return SEQ_MODALITIES.get(row["modality"], row["modality"])


def _model_heading(row: Mapping[str, Any]) -> str:
    return f"{row['model']} (fine-tuned)" if row.get("finetuned") else str(row["model"])


def iso_unparsable_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Which rule for unparsable replies each published ISO-Bench Table 1 row is consistent with
    (:func:`seqaware.metrics.iso.unparsable_consistency`): App. H excludes them, but a row whose NONDEP
    recall is below what its other three per-class figures imply under exclusion can only come from
    counting them wrong -- unless one of those four figures is flagged as a likely misprint
    (``flags`` in configs/paper_results.yaml): such a row is listed apart, not counted for either rule."""
    groups: dict[str, list[str]] = {"exclude": [], "wrong": [], "neither": [], "flagged": []}
    read = ("dep.p", "dep.r", "nondep.p", "nondep.r")
    for row in rows:
        dep, nondep = row.get("dep") or {}, row.get("nondep") or {}
        if not all(isinstance(_number(v.get(k)), float) for v in (dep, nondep) for k in ("p", "r")):
            continue
        check = unparsable_consistency(dep, nondep)
        name = _row_name(SPECS[("iso_bench", "Table 1")], row)
        if check["exclude"]:
            groups["exclude"].append(name)
            continue
        lo, hi = check["implied_recall_NONDEP"]
        detail = f"R NONDEP {nondep['r']:.2f}; excluding them implies {lo:.2f}-{hi:.2f}"
        doubted = [cell for cell in read if any(str(f).split()[0] == cell for f in row.get("flags") or ())]
        if doubted:
            groups["flagged"].append(f"{name} ({detail}; {', '.join(doubted)} flagged)")
        else:
            groups["wrong" if check["wrong"] else "neither"].append(f"{name} ({detail})")
    notes = ["Unparsable replies (App. H: excluded from the scores). From each row's DEP P, DEP R and NONDEP P, "
             "excluding them fixes NONDEP R; counting them wrong can only lower it "
             "(seqaware.metrics.iso.unparsable_consistency, within the printed rounding):"]
    notes.append("consistent with excluding them (App. H): " + (", ".join(groups["exclude"]) or "none"))
    notes.append("only with counting them wrong (unparsable=wrong): " + (", ".join(groups["wrong"]) or "none"))
    if groups["neither"]:
        notes.append("with neither: " + ", ".join(groups["neither"]))
    if groups["flagged"]:
        notes.append("misfit through a figure flagged as misprinted (neither rule counted): " + ", ".join(groups["flagged"]))
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
