#!/usr/bin/env python
"""Lay our results out like the papers' tables, with the published numbers beside ours.

    # MATEO Table 3/4 layout: one row per (system, strategy), one column per modality
    python scripts/paper_tables.py --teo logs/eval_teo/*/teo_*.json --teo-metric consistency_accuracy
    # Wu et al. 2022 Tables 2-3 layout: one row per (model, modality), PMR and tau per dataset
    python scripts/paper_tables.py --sequencing "CLIP-ViL+BERSON@recipeqa/multimodal=logs/run1/train.log" \\
                                   --sequencing "RoBERTa+BERSON@recipeqa/text=metrics.json" --out tables.md

Inputs:
* ``--teo``: result JSONs written by ``scripts/eval_teo.py`` (``teo_<strategy>_<modality>.json``).
  The trivial baselines of each modality (always independent, majority, random) are shown once.
* ``--sequencing NAME@DATASET/MODALITY=PATH``: PATH is a JSON metrics dict (keys ``pmr``/``tau``,
  optionally prefixed ``test/``, or under ``"metrics"``) or a text log holding train.py's
  ``TEST_METRICS_JSON {...}`` line (the last one is used).

Published numbers come from ``configs/paper_results.yaml`` (``--published``); a value missing there
is shown as ``n/a``. Every published row is checked against the schema in that file's header
(allowed names, fractions in [0, 1], tau in [-1, 1]); an error names the file, table, row and field.
Tables are printed and, with ``--out``, written as markdown (+ a JSON beside it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seqaware.io import atomic_open, parse_test_metrics  # noqa: E402
from seqaware.metrics.teo import teo_report  # noqa: E402
from seqaware.teo.prompts import MODALITIES, STRATEGIES  # noqa: E402

DEFAULT_PUBLISHED = ROOT / "configs" / "paper_results.yaml"
NA = "n/a"
BASELINES = ("always independent", "majority", "random")
SEQ_MODALITIES = ("text", "image", "multimodal")
SEQ_DATASETS = ("recipeqa", "wikihow")
# metric fields a published MATEO row may carry: the fraction-valued keys of teo_report
TEO_METRICS = tuple(k for k in teo_report([], [], {}, {}) if not k.startswith("num_"))
# per paper: the fields naming a row (with their allowed values) and its metric fields (with their range)
ROW_SCHEMAS: dict[str, tuple[dict[str, tuple[str, ...]], dict[str, tuple[float, float]]]] = {
    "mateo": ({"strategy": STRATEGIES, "modality": MODALITIES}, {m: (0.0, 1.0) for m in TEO_METRICS}),
    "wu2022": ({"dataset": SEQ_DATASETS, "modality": SEQ_MODALITIES}, {"pmr": (0.0, 1.0), "tau": (-1.0, 1.0)}),
}


def load_published(path: str | Path) -> dict[str, Any]:
    """The published-results file, every row checked against its paper's schema (see the file's header).

    An error names the file, the paper, the table, the row (index and model) and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--published: no such file: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise SystemExit(f"{path}: not valid YAML ({err})") from None
    if not isinstance(data, Mapping):
        raise SystemExit(f"{path}: expected a mapping with the keys {', '.join(ROW_SCHEMAS)}")
    unknown = sorted(set(data) - set(ROW_SCHEMAS))
    if unknown:
        raise SystemExit(f"{path}: unknown paper key(s) {unknown}; expected {', '.join(ROW_SCHEMAS)}")
    for paper, entry in data.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("tables", []), list):
            raise SystemExit(f"{path}: {paper}: expected a mapping with 'citation' and a list 'tables'")
        for t, table in enumerate(entry.get("tables", [])):
            if not isinstance(table, Mapping) or not isinstance(table.get("rows") or [], list):
                raise SystemExit(f"{path}: {paper} table {t}: expected a mapping with 'name' and a list 'rows'")
            name = table.get("name", f"table {t}")
            seen: dict[tuple, int] = {}
            for i, row in enumerate(table.get("rows") or []):
                key = _check_row(f"{path}: {paper} {name}: row {i}", paper, row)
                if key in seen:
                    raise SystemExit(f"{path}: {paper} {name}: row {i} repeats row {seen[key]} {key}")
                seen[key] = i
    return data


def _check_row(where: str, paper: str, row: Any) -> tuple:
    """Validate one published row; returns the fields that identify it (model + naming fields)."""
    if not isinstance(row, Mapping):
        raise SystemExit(f"{where}: must be a mapping, got {row!r}")
    model = row.get("model")
    if not isinstance(model, str) or not model.strip():
        raise SystemExit(f"{where}: field 'model' must be a non-empty string (the name as printed in the paper)")
    where = f"{where} ({model})"
    naming, metrics = ROW_SCHEMAS[paper]
    unknown = sorted(set(row) - {"model", *naming, *metrics})
    if unknown:
        raise SystemExit(f"{where}: unknown field(s) {unknown}; allowed: model, {', '.join(naming)}, {', '.join(metrics)}")
    for field, allowed in naming.items():
        if row.get(field) not in allowed:
            raise SystemExit(f"{where}: field {field!r} is {row.get(field)!r}, expected one of {', '.join(allowed)}")
    if not any(field in row for field in metrics):
        raise SystemExit(f"{where}: no metric field; give at least one of {', '.join(metrics)} (a number or 'n/a')")
    for field, (low, high) in metrics.items():
        value = row.get(field, NA)
        if value == NA:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            number = _number(value)
            percent = low == 0.0 and number is not None and number > 1
            hint = " (the paper prints percentages: write 45.2 % as 0.452)" if percent else ""
            raise SystemExit(f"{where}: field {field!r} is {value!r}, expected a number in [{low:g}, {high:g}] or 'n/a'{hint}")
    return (model, *(row[field] for field in naming))


def _number(value: Any) -> float | None:
    """A float, or None for n/a / missing / non-numeric values."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _cell(value: Any, percent: bool = True, digits: int = 1) -> str:
    number = _number(value)
    if number is None:
        return NA
    return f"{100 * number:.{digits}f}" if percent else f"{number:.{digits}f}"


def _published_rows(published: Mapping[str, Any], paper: str) -> list[tuple[str, dict[str, Any]]]:
    """``(source label, row)`` of every published row of ``paper``."""
    out = []
    for table in published.get(paper, {}).get("tables", []):
        for row in table.get("rows") or []:
            out.append((f"{'MATEO' if paper == 'mateo' else 'Wu et al. 2022'} {table.get('name', '')}".strip(), dict(row)))
    return out


# ---------------------------------------------------------------- TEO (MATEO Tables 3-4)
def load_teo_results(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """eval_teo result JSONs; an unreadable file or a non-TEO result is an error naming the file."""
    results = []
    for path in paths:
        path = Path(path)
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise SystemExit(f"{path}: cannot read an eval_teo result ({err})") from None
        missing = [k for k in ("task", "model", "strategy", "modality", "rows") if k not in result]
        if missing or result.get("task") != "teo":
            raise SystemExit(f"{path}: not a TEO result of scripts/eval_teo.py (missing {missing or 'task=teo'})")
        results.append(result)
    return results


def teo_layout(results: Sequence[Mapping[str, Any]], published: Mapping[str, Any], metric: str) -> dict[str, Any]:
    """Rows ``{system, source, strategy, <modality>: value}`` in MATEO's layout (values as fractions).

    Baselines first (once per modality, from the first result that has them), then our systems
    ordered by name and strategy (in :data:`STRATEGIES` order), then the published rows.
    """
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}

    def row(system: str, source: str, strategy: str) -> dict[str, Any]:
        return rows.setdefault((system, source, strategy), {"system": system, "source": source, "strategy": strategy})

    for result in results:
        for name in BASELINES:
            report = result["rows"].get(name)
            if report is not None:
                row(name, "ours", "-").setdefault(result["modality"], report.get(metric))
    ours = sorted(
        ((name, r["strategy"], r["modality"], report.get(metric))
         for r in results for name, report in r["rows"].items() if name not in BASELINES),
        key=lambda t: (t[0], STRATEGIES.index(t[1]) if t[1] in STRATEGIES else len(STRATEGIES), t[1]),
    )
    for name, strategy, modality, value in ours:
        row(name, "ours", strategy)[modality] = value
    for source, prow in _published_rows(published, "mateo"):
        row(str(prow["model"]), source, str(prow.get("strategy", "-")))[str(prow.get("modality"))] = prow.get(metric, NA)
    return {"metric": metric, "columns": list(MODALITIES), "rows": list(rows.values())}


def teo_markdown(layout: Mapping[str, Any]) -> str:
    """Markdown of :func:`teo_layout` (percentages, one decimal)."""
    cols = layout["columns"]
    lines = [f"TEO {layout['metric']} (%) by modality (MATEO Tables 3-4 layout)", "",
             "| system | source | strategy | " + " | ".join(cols) + " |", "|---|---|---|" + "---:|" * len(cols)]
    for r in layout["rows"]:
        lines.append(f"| {r['system']} | {r['source']} | {r['strategy']} | " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- sequencing (Wu et al. 2022 Tables 2-3)
def parse_sequencing_spec(spec: str) -> tuple[str, str, str, Path]:
    """``NAME@DATASET/MODALITY=PATH`` -> (name, dataset, modality, path)."""
    try:
        left, path = spec.split("=", 1)
        name, where = left.rsplit("@", 1)
        dataset, modality = where.split("/", 1)
    except ValueError:
        raise SystemExit(f"--sequencing {spec!r}: expected NAME@DATASET/MODALITY=PATH") from None
    if not name or not dataset or not modality or not path:
        raise SystemExit(f"--sequencing {spec!r}: expected NAME@DATASET/MODALITY=PATH")
    return name, dataset.lower(), modality.lower(), Path(path)


def read_metrics(path: str | Path) -> dict[str, float]:
    """Test metrics from a JSON dict or from the last ``TEST_METRICS_JSON`` line of a log; ``test/`` removed."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"{path}: no such metrics file")
    text = path.read_text(encoding="utf-8", errors="replace")
    metrics: Any = None
    try:
        metrics = json.loads(text)
    except json.JSONDecodeError:
        try:
            metrics = parse_test_metrics(text)
        except json.JSONDecodeError as err:
            raise SystemExit(f"{path}: malformed TEST_METRICS_JSON line ({err})") from None
        if metrics is None:
            raise SystemExit(f"{path}: neither a JSON metrics dict nor a log with a TEST_METRICS_JSON line") from None
    if isinstance(metrics, Mapping) and isinstance(metrics.get("metrics"), Mapping):
        metrics = metrics["metrics"]
    if not isinstance(metrics, Mapping):
        raise SystemExit(f"{path}: expected a JSON object of metrics")
    return {k.removeprefix("test/"): float(v) for k, v in metrics.items() if _number(v) is not None}


def sequencing_layout(entries: Sequence[tuple[str, str, str, Mapping[str, float]]], published: Mapping[str, Any]) -> dict[str, Any]:
    """Rows ``{model, modality, source, <dataset>/pmr, <dataset>/tau}`` in Wu et al.'s layout.

    Datasets: recipeqa and wikihow first (the papers' order), then any other in order of appearance.
    Rows are grouped by modality (text, image, multimodal, then others), ours before published.
    """
    datasets: list[str] = list(SEQ_DATASETS)
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for name, dataset, modality, metrics in entries:
        if dataset not in datasets:
            datasets.append(dataset)
        r = rows.setdefault((modality, "ours", name), {"model": name, "modality": modality, "source": "ours"})
        r[f"{dataset}/pmr"], r[f"{dataset}/tau"] = metrics.get("pmr"), metrics.get("tau")
    for source, prow in _published_rows(published, "wu2022"):
        dataset, modality = str(prow.get("dataset", "")).lower(), str(prow.get("modality", "")).lower()
        if dataset and dataset not in datasets:
            datasets.append(dataset)
        r = rows.setdefault((modality, source, str(prow["model"])), {"model": str(prow["model"]), "modality": modality, "source": source})
        r[f"{dataset}/pmr"], r[f"{dataset}/tau"] = prow.get("pmr", NA), prow.get("tau", NA)
    order = {m: i for i, m in enumerate(SEQ_MODALITIES)}
    ordered = sorted(rows.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][0], kv[0][1] != "ours"))
    return {"datasets": datasets, "rows": [r for _, r in ordered]}


def sequencing_markdown(layout: Mapping[str, Any]) -> str:
    """Markdown of :func:`sequencing_layout`: PMR in % (2 decimals), Kendall tau (4 decimals)."""
    datasets = layout["datasets"]
    header = "| model | modality | source | " + " | ".join(f"{d} PMR | {d} tau" for d in datasets) + " |"
    lines = ["Sequencing (Wu et al. 2022 Tables 2-3 layout): PMR (%) and Kendall tau", "", header,
             "|---|---|---|" + "---:|---:|" * len(datasets)]
    for r in layout["rows"]:
        cells = []
        for d in datasets:
            cells += [_cell(r.get(f"{d}/pmr"), percent=True, digits=2), _cell(r.get(f"{d}/tau"), percent=False, digits=4)]
        lines.append(f"| {r['model']} | {r['modality']} | {r['source']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def citations(published: Mapping[str, Any]) -> str:
    return "\n".join(f"- {p['citation']}" for p in published.values() if isinstance(p, Mapping) and p.get("citation"))


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teo", nargs="+", default=[], metavar="JSON", help="eval_teo TEO result JSONs")
    parser.add_argument("--teo-metric", default="consistency_accuracy", help="teo_report key shown in the TEO table")
    parser.add_argument("--sequencing", action="append", default=[], metavar="NAME@DATASET/MODALITY=PATH")
    parser.add_argument("--published", default=str(DEFAULT_PUBLISHED), help="published results YAML")
    parser.add_argument("--out", type=Path, help="write the tables here (markdown) and <out>.json")
    args = parser.parse_args(argv)
    if not args.teo and not args.sequencing:
        parser.error("give --teo and/or --sequencing")
    published = load_published(args.published)
    sections, data = [], {}
    if args.teo:
        data["teo"] = teo_layout(load_teo_results(args.teo), published, args.teo_metric)
        sections.append(teo_markdown(data["teo"]))
    if args.sequencing:
        entries = [(n, d, m, read_metrics(p)) for n, d, m, p in map(parse_sequencing_spec, args.sequencing)]
        data["sequencing"] = sequencing_layout(entries, published)
        sections.append(sequencing_markdown(data["sequencing"]))
    text = "\n\n".join(sections) + "\n\nPublished numbers from:\n" + citations(published) + "\n"
    print(text)
    if args.out:
        with atomic_open(args.out) as handle:
            handle.write(text)
        with atomic_open(args.out.with_suffix(".json")) as handle:
            json.dump(data, handle, indent=1, default=str)
    return text


if __name__ == "__main__":
    main()
