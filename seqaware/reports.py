"""Per-category result tables and bar charts from test prediction records.

A prediction record is what ``train.py`` writes to ``predictions_test.jsonl``: ``id``, ``category``
(a category path), ``pred`` and ``references``.  Used by :class:`seqaware.callbacks.CategoryReport`
at the end of testing and by ``scripts/tools/compare_categories.py`` (text-only vs multimodal charts).  The columns
are the sequencing metrics (:data:`seqaware.metrics.ordering.SEQUENCING_METRICS`, :func:`columns`).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from seqaware.io import atomic_open
from seqaware.metrics.ordering import corpus_order_metrics, order_keys


def columns() -> tuple[str, ...]:
    """The metric columns of a per-category table: every sequencing metric, in the list's order."""
    return order_keys()


def category_of(record: Mapping, level: int = 1) -> str:
    """The category label of a record: its path cut to ``level`` entries, joined by '/'."""
    path = record.get("category") or []
    if isinstance(path, str):
        path = [path]
    return "/".join(path[:level]) if path else "(none)"


def per_category(records: Iterable[Mapping], level: int = 1) -> dict[str, dict[str, float]]:
    """``{category: metrics}`` (multi-reference corpus metrics + ``n``), plus an ``all`` row."""
    groups: dict[str, list[Mapping]] = defaultdict(list)
    records = list(records)
    for rec in records:
        groups[category_of(rec, level)].append(rec)
    table = {}
    for name in sorted(groups) + ["all"]:
        recs = records if name == "all" else groups[name]
        scores = corpus_order_metrics([r["pred"] for r in recs], [r["references"] for r in recs])
        table[name] = {k: float(scores[k]) for k in columns()} | {"n": len(recs)}
    return table


def markdown_table(table: Mapping[str, Mapping[str, float]], metrics: Sequence[str] | None = None) -> str:
    """The table as markdown, one row per category; ``metrics``: the columns (default :func:`columns`)."""
    metrics = columns() if metrics is None else metrics
    lines = ["| category | n | " + " | ".join(metrics) + " |", "|---|---:|" + "---:|" * len(metrics)]
    for name, row in table.items():
        lines.append(f"| {name} | {int(row['n'])} | " + " | ".join(f"{row[c]:.3f}" for c in metrics) + " |")
    return "\n".join(lines) + "\n"


def bar_chart(series: Mapping[str, Mapping[str, Mapping[str, float]]], path: str | Path, metric: str = "pmr",
              title: str | None = None) -> Path:
    """Grouped bars of ``metric`` per category, one bar per series (e.g. text-only vs multimodal).

    ``series``: ``{label: per_category table}``.  Written atomically as PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = sorted({c for table in series.values() for c in table if c != "all"}) + ["all"]
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(categories) * max(1, len(series)) / 2 + 2), 3.2))
    for k, (label, table) in enumerate(series.items()):
        xs = [c + (k - (len(series) - 1) / 2) * width for c in range(len(categories))]
        ax.bar(xs, [table.get(c, {}).get(metric, 0.0) for c in categories], width=width, label=label)
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories, rotation=30, ha="right")
    ax.set_ylabel(metric.upper())
    ax.set_ylim(0, 1 if metric in ("pmr", "acc") else None)
    ax.set_title(title or f"test {metric.upper()} per category")
    if len(series) > 1:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    path = Path(path)
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=120)
    plt.close(fig)
    return path
