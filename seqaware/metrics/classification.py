"""Classification metrics shared by the task metrics: per-class and binary (yes/no) scores.

* per-class precision, recall and F1 that agree with ``sklearn.metrics.precision_recall_fscore_support``
  (with ``labels=...`` and ``zero_division=0``), and :func:`classification_report` (accuracy,
  invalid rate, per-class, macro and weighted averages);
* the trivial baselines (:func:`majority_label`, seeded :func:`random_labels`) and a plain-text
  table (:func:`format_table`), used by every task's ``*_rows`` / ``*_table``;
* yes/no questions (CaT-Bench style): :func:`binary_report`, :func:`binary_rows` (always-yes,
  always-no and majority rows first), :func:`twin_consistency` (the two questions asked about one
  step pair answered alike) and :func:`choose_threshold` (a decision threshold chosen on validation).

Predictions may contain anything: in :func:`classification_report` a prediction that is not one of
the task's labels (``None``, an unparsable answer, ``"other"``) is simply wrong: it lowers recall of
the gold class and accuracy, and counts towards no class's precision. Its share is reported as
``invalid_rate``.

The task-specific scoring lives beside this module: :mod:`seqaware.metrics.iso` (ISO-Bench
DEP/NONDEP), :mod:`seqaware.metrics.teo` (TEO consistency and per-class F1),
:mod:`seqaware.metrics.coherence` (COHERENCE assignments).
"""
from __future__ import annotations

from collections import Counter
from typing import Optional, Any, Hashable, Mapping, Sequence

import numpy as np


# ---------------------------------------------------------------- per-class scores, baselines, tables
def per_class_prf(gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Sequence[Hashable],
                  weights: Optional[Sequence[float]] = None) -> dict[Hashable, dict[str, float]]:
    """Precision, recall, F1 and support of each label (0.0 where a ratio is undefined); ``weights``: one per
    item, counts become weighted sums (sklearn's ``sample_weight``)."""
    if len(gold) != len(pred):
        raise ValueError(f"gold and pred differ in length: {len(gold)} vs {len(pred)}")
    w = [1] * len(gold) if weights is None else list(weights)
    if len(w) != len(gold):
        raise ValueError(f"weights and gold differ in length: {len(w)} vs {len(gold)}")
    out = {}
    for label in labels:
        tp = sum(x for g, p, x in zip(gold, pred, w) if g == label and p == label)
        predicted = sum(x for p, x in zip(pred, w) if p == label)
        support = sum(x for g, x in zip(gold, w) if g == label)
        precision = tp / predicted if predicted else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * tp / (predicted + support) if predicted + support else 0.0
        out[label] = {"precision": precision, "recall": recall, "f1": f1, "support": support}
    return out


def classification_report(gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Sequence[Hashable],
                          weights: Optional[Sequence[float]] = None) -> dict[str, Any]:
    """Accuracy, invalid rate, per-class and macro precision/recall/F1 over ``labels``.

    Keys: ``accuracy``, ``invalid_rate``, ``n``, ``precision_<label>``, ``recall_<label>``,
    ``f1_<label>``, ``support_<label>``, ``macro_precision``, ``macro_recall``, ``macro_f1``
    (unweighted means over ``labels``, sklearn ``average="macro"``) and ``weighted_precision``,
    ``weighted_recall``, ``weighted_f1`` (means weighted by gold support, sklearn
    ``average="weighted"``; 0.0 when no gold label is in ``labels``).  ``weights`` (one per item): every
    count is a weighted sum (``n`` stays the number of items).
    """
    prf = per_class_prf(gold, pred, labels, weights)
    n = len(gold)
    w = [1] * n if weights is None else list(weights)
    total_w = sum(w)
    report: dict[str, Any] = {
        "n": n,
        "accuracy": sum(x for g, p, x in zip(gold, pred, w) if g == p) / total_w if total_w else 0.0,
        "invalid_rate": sum(x for p, x in zip(pred, w) if p not in labels) / total_w if total_w else 0.0,
    }
    for label, scores in prf.items():
        for name, value in scores.items():
            report[f"{name}_{label}"] = value
    total = sum(prf[label]["support"] for label in labels)
    for name in ("precision", "recall", "f1"):
        report[f"macro_{name}"] = float(np.mean([prf[label][name] for label in labels])) if labels else 0.0
        report[f"weighted_{name}"] = (sum(prf[label][name] * prf[label]["support"] for label in labels) / total
                                      if total else 0.0)
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


def align_labels(gold: Sequence[Any] | Mapping[str, Any], pred: Sequence[Any] | Mapping[str, Any]) -> tuple[list, list]:
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


# ---------------------------------------------------------------- yes/no questions (CaT-Bench)
BINARY_COLUMNS = (("accuracy", "Acc"), ("precision", "P"), ("recall", "R"), ("f1", "F1"),
                  ("macro_f1", "macro F1"), ("invalid_rate", "invalid"))


def binary_report(gold, pred, positive: str = "yes", negative: str = "no",
                  weights: Optional[Sequence[float]] = None) -> dict[str, Any]:
    """Accuracy and F1 for yes/no questions (CaT-Bench style).

    Besides the per-class keys of :func:`classification_report` (for ``positive`` and
    ``negative``), ``precision``, ``recall`` and ``f1`` are those of the positive class.
    Answers are compared as given (normalise case/whitespace before calling).
    """
    gold, pred = align_labels(gold, pred)
    report = classification_report(gold, pred, (positive, negative), weights)
    for name in ("precision", "recall", "f1"):
        report[name] = report[f"{name}_{positive}"]
    return report


def share_weights(gold: Sequence[Hashable], share: float, positive: str = "yes") -> list[float]:
    """Per-item weights that make ``positive`` a ``share`` of the weighted gold labels (the rest keep their
    proportions): ``share / p`` for positives and ``(1 - share) / (1 - p)`` for the others, ``p`` the actual
    share; weighted counts still sum to ``len(gold)``.  To forecast scores on a set with another label mix."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"the share of {positive!r} must be in (0, 1), got {share!r}")
    p = sum(g == positive for g in gold) / len(gold) if gold else 0.0
    if not 0.0 < p < 1.0:
        raise ValueError(f"re-weighting needs both {positive!r} and other gold labels, got a {positive!r} share of {p}")
    return [share / p if g == positive else (1 - share) / (1 - p) for g in gold]


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


def twin_consistency(keys: Sequence[Hashable], answers: Sequence[Any]) -> dict[str, Any]:
    """How often the two questions asked about the same step pair get the same answer.

    CaT-Bench (Lal et al., EMNLP 2024) asks every step pair twice, "Must step i happen before step
    j?" and "Must step j happen after step i?", with the same gold answer; ``keys`` names each
    question's pair (e.g. ``(plan, i, j)``) and ``answers`` are the answers as given.  Returns
    ``twin_consistency`` (share of pairs asked exactly twice whose two answers are equal and not
    None -- two missing answers do not agree; 0.0 when there is no such pair) and ``n_twins`` (how many such pairs).  Pairs asked once or more than twice are
    left out.
    """
    if len(keys) != len(answers):
        raise ValueError(f"keys and answers differ in length: {len(keys)} vs {len(answers)}")
    groups: dict[Hashable, list[Any]] = {}
    for key, answer in zip(keys, answers):
        groups.setdefault(key, []).append(answer)
    twins = [g for g in groups.values() if len(g) == 2]
    same = sum(1 for first, second in twins if first is not None and first == second)
    return {"twin_consistency": same / len(twins) if twins else 0.0, "n_twins": len(twins)}


def initial_threshold(threshold: Any, chosen: str, key: str = "model.threshold") -> float:
    """The decision threshold a head starts from: 0.5 when ``threshold`` is the word ``chosen`` (the
    head picks it later, e.g. ``val`` or ``cv``), else ``threshold`` itself, a number in (0, 1).
    Anything else is a ValueError naming ``key``."""
    if threshold == chosen:
        return 0.5
    if isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and 0.0 < float(threshold) < 1.0:
        return float(threshold)
    raise ValueError(f"{key} must be {chosen!r} or a number in (0, 1), got {threshold!r}")


def choose_threshold(gold: Sequence[Hashable], scores: Sequence[float], metric: str = "macro_f1",
                     positive: str = "yes", negative: str = "no",
                     grid: Sequence[float] | None = None) -> tuple[float, float]:
    """The decision threshold on ``scores`` (answer ``positive`` when ``score >= t``) that maximises
    ``metric`` of :func:`binary_report` (e.g. ``macro_f1``, ``f1``, ``accuracy``) on ``gold``.

    ``grid`` defaults to 0.05, 0.06, ..., 0.95.  Ties go to the threshold closest to 0.5, then to
    the smaller one.  Returns ``(threshold, metric value)``.  Meant for validation data only.
    """
    if len(gold) != len(scores):
        raise ValueError(f"gold and scores differ in length: {len(gold)} vs {len(scores)}")
    if not len(gold):
        raise ValueError("choose_threshold needs at least one scored question")
    grid = [round(0.05 + 0.01 * k, 2) for k in range(91)] if grid is None else list(grid)
    best: tuple[float, float] | None = None
    for t in sorted(grid, key=lambda t: (abs(t - 0.5), t)):
        value = binary_report(gold, [positive if s >= t else negative for s in scores], positive, negative)[metric]
        if best is None or value > best[1]:
            best = (float(t), float(value))
    return best  # type: ignore[return-value]
