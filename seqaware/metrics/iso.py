"""Classification metrics for dependency questions: ISO-Bench (DEP/NONDEP) and yes/no questions.

Also holds the small helpers shared by the task metrics (TEO, COHERENCE): per-class precision,
recall and F1 that agree with ``sklearn.metrics.precision_recall_fscore_support`` (with
``labels=...`` and ``zero_division=0``), seeded constant/random baselines and a plain-text table.

Predictions may contain anything: a prediction that is not one of the task's labels (``None``, an
unparsable answer, ``"other"``) is simply wrong: it lowers recall of the gold class and accuracy,
and counts towards no class's precision. Its share is reported as ``invalid_rate``.

Every ``*_rows`` function returns the trivial baselines first and then the systems, so a reported
table always carries them.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

ISO_LABELS = ("DEP", "NONDEP")


# ---------------------------------------------------------------- shared helpers
def per_class_prf(gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Sequence[Hashable]) -> dict[Hashable, dict[str, float]]:
    """Precision, recall, F1 and support of each label (0.0 where a ratio is undefined)."""
    if len(gold) != len(pred):
        raise ValueError(f"gold and pred differ in length: {len(gold)} vs {len(pred)}")
    out = {}
    for label in labels:
        tp = sum(1 for g, p in zip(gold, pred) if g == label and p == label)
        predicted = sum(1 for p in pred if p == label)
        support = sum(1 for g in gold if g == label)
        precision = tp / predicted if predicted else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * tp / (predicted + support) if predicted + support else 0.0
        out[label] = {"precision": precision, "recall": recall, "f1": f1, "support": support}
    return out


def classification_report(gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Sequence[Hashable]) -> dict[str, Any]:
    """Accuracy, invalid rate, per-class and macro precision/recall/F1 over ``labels``.

    Keys: ``accuracy``, ``invalid_rate``, ``n``, ``precision_<label>``, ``recall_<label>``,
    ``f1_<label>``, ``support_<label>``, ``macro_precision``, ``macro_recall``, ``macro_f1``.
    """
    prf = per_class_prf(gold, pred, labels)
    n = len(gold)
    report: dict[str, Any] = {
        "n": n,
        "accuracy": sum(g == p for g, p in zip(gold, pred)) / n if n else 0.0,
        "invalid_rate": sum(p not in labels for p in pred) / n if n else 0.0,
    }
    for label, scores in prf.items():
        for name, value in scores.items():
            report[f"{name}_{label}"] = value
    for name in ("precision", "recall", "f1"):
        report[f"macro_{name}"] = float(np.mean([prf[label][name] for label in labels])) if labels else 0.0
    return report


def majority_label(gold: Sequence[Hashable], labels: Sequence[Hashable]) -> Hashable:
    """The most frequent gold label; ties go to the label listed first in ``labels``."""
    counts = Counter(gold)
    return max(labels, key=lambda label: (counts[label], -list(labels).index(label)))


def random_labels(n: int, labels: Sequence[Hashable], seed: int = 0) -> list[Hashable]:
    """``n`` labels drawn uniformly from ``labels`` with a generator seeded by ``seed``."""
    draws = np.random.default_rng(seed).integers(len(labels), size=n)
    return [labels[i] for i in draws]


def format_table(rows: Mapping[str, Mapping[str, Any]], columns: Sequence[tuple[str, str]], percent: bool = True) -> str:
    """A markdown table: one row per entry of ``rows``, ``columns`` = ``(report key, header)``.

    Numbers are shown as percentages with one decimal when ``percent`` (else 3 decimals);
    a missing or ``None`` value is shown as ``-``.
    """
    header = ["system"] + [title for _, title in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * len(columns)) + "|"]
    for name, report in rows.items():
        cells = [str(name)]
        for key, _ in columns:
            value = report.get(key)
            if value is None:
                cells.append("-")
            elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
                cells.append(str(int(value)))
            else:
                cells.append(f"{100 * value:.1f}" if percent else f"{value:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _labels_of(gold: Sequence[Any] | Mapping[str, Any], pred: Sequence[Any] | Mapping[str, Any]) -> tuple[list, list]:
    """Align gold and predictions: two sequences, or two mappings keyed by instance id.

    With mappings every gold id is scored; an id without prediction counts as ``None`` (wrong).
    """
    if isinstance(gold, Mapping):
        if not isinstance(pred, Mapping):
            raise TypeError("gold is a mapping, so pred must be a mapping keyed by the same ids")
        keys = list(gold)
        return [gold[k] for k in keys], [pred.get(k) for k in keys]
    gold, pred = list(gold), list(pred)
    if len(gold) != len(pred):
        raise ValueError(f"gold and pred differ in length: {len(gold)} vs {len(pred)}")
    return gold, pred


# ---------------------------------------------------------------- ISO-Bench
ISO_COLUMNS = (("accuracy", "Acc"), ("precision_DEP", "P DEP"), ("recall_DEP", "R DEP"), ("f1_DEP", "F1 DEP"),
               ("precision_NONDEP", "P NONDEP"), ("recall_NONDEP", "R NONDEP"), ("f1_NONDEP", "F1 NONDEP"),
               ("macro_f1", "macro F1"), ("invalid_rate", "invalid"))


def iso_report(gold: Sequence[str] | Mapping[str, str], pred: Sequence[Any] | Mapping[str, Any]) -> dict[str, Any]:
    """DEP/NONDEP per-class and macro precision/recall/F1, accuracy and invalid rate.

    ``gold`` and ``pred`` are aligned label sequences, or mappings ``instance_id -> label``.
    """
    gold, pred = _labels_of(gold, pred)
    return classification_report(gold, pred, ISO_LABELS)


def iso_baselines(gold: Sequence[str] | Mapping[str, str], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Reports of the trivial predictors: always DEP, always NONDEP, majority class, uniform random."""
    gold = list(gold.values()) if isinstance(gold, Mapping) else list(gold)
    n = len(gold)
    majority = majority_label(gold, ISO_LABELS)
    return {
        "always DEP": iso_report(gold, ["DEP"] * n),
        "always NONDEP": iso_report(gold, ["NONDEP"] * n),
        f"majority ({majority})": iso_report(gold, [majority] * n),
        "random": iso_report(gold, random_labels(n, ISO_LABELS, seed)),
    }


def iso_rows(gold, systems: Mapping[str, Any], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Baseline rows, then one row per system (``name -> predictions``)."""
    rows = iso_baselines(gold, seed)
    rows.update({name: iso_report(gold, pred) for name, pred in systems.items()})
    return rows


def iso_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table of ISO reports (percentages)."""
    return format_table(rows, ISO_COLUMNS)


# ---------------------------------------------------------------- yes/no questions (CaT-Bench)
BINARY_COLUMNS = (("accuracy", "Acc"), ("precision", "P"), ("recall", "R"), ("f1", "F1"),
                  ("macro_f1", "macro F1"), ("invalid_rate", "invalid"))


def binary_report(gold, pred, positive: str = "yes", negative: str = "no") -> dict[str, Any]:
    """Accuracy and F1 for yes/no questions (CaT-Bench style).

    Besides the per-class keys of :func:`classification_report` (for ``positive`` and
    ``negative``), ``precision``, ``recall`` and ``f1`` are those of the positive class.
    Answers are compared as given (normalise case/whitespace before calling).
    """
    gold, pred = _labels_of(gold, pred)
    report = classification_report(gold, pred, (positive, negative))
    for name in ("precision", "recall", "f1"):
        report[name] = report[f"{name}_{positive}"]
    return report


def binary_baselines(gold, positive: str = "yes", negative: str = "no") -> dict[str, dict[str, Any]]:
    """Reports of always-positive, always-negative and majority-class predictors."""
    gold = list(gold.values()) if isinstance(gold, Mapping) else list(gold)
    n = len(gold)
    majority = majority_label(gold, (positive, negative))
    return {
        f"always {positive}": binary_report(gold, [positive] * n, positive, negative),
        f"always {negative}": binary_report(gold, [negative] * n, positive, negative),
        f"majority ({majority})": binary_report(gold, [majority] * n, positive, negative),
    }


def binary_rows(gold, systems: Mapping[str, Any], positive: str = "yes", negative: str = "no") -> dict[str, dict[str, Any]]:
    """Baseline rows, then one row per system (``name -> predictions``)."""
    rows = binary_baselines(gold, positive, negative)
    rows.update({name: binary_report(gold, pred, positive, negative) for name, pred in systems.items()})
    return rows


def binary_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table of yes/no reports (percentages)."""
    return format_table(rows, BINARY_COLUMNS)
