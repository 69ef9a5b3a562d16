"""Markdown of one published table in its paper's layout (scripts/studies/paper_tables.py): cells, row names,
our rows merged into the paper's row groups, notes under the table."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from scripts.studies.paper_tables_schema import DASH, NA, PAPER_NAMES, REPAIRED_MARK, Label, Metric, TableSpec


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
