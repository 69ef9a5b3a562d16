"""Classification metrics for dependency questions: ISO-Bench (DEP/NONDEP) and yes/no questions.

Also holds the small helpers shared by the task metrics (TEO, COHERENCE): per-class precision,
recall and F1 that agree with ``sklearn.metrics.precision_recall_fscore_support`` (with
``labels=...`` and ``zero_division=0``), seeded constant/random baselines and a plain-text table.

Predictions may contain anything: in :func:`classification_report` (yes/no questions) a prediction
that is not one of the task's labels (``None``, an unparsable answer, ``"other"``) is simply wrong:
it lowers recall of the gold class and accuracy, and counts towards no class's precision. Its share
is reported as ``invalid_rate``. :func:`iso_report` by default leaves such predictions out, as
ISO-Bench does (App. H), and reports how many there were.

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
    ``f1_<label>``, ``support_<label>``, ``macro_precision``, ``macro_recall``, ``macro_f1``
    (unweighted means over ``labels``, sklearn ``average="macro"``) and ``weighted_precision``,
    ``weighted_recall``, ``weighted_f1`` (means weighted by gold support, sklearn
    ``average="weighted"``; 0.0 when no gold label is in ``labels``).
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
# ISO-Bench Table 1 layout: DEP P/R/F, NONDEP P/R/F, MACRO AVG P/R/F (+ accuracy, App. H "Metric").
ISO_COLUMNS = (("accuracy", "Acc"), ("precision_DEP", "P DEP"), ("recall_DEP", "R DEP"), ("f1_DEP", "F1 DEP"),
               ("precision_NONDEP", "P NONDEP"), ("recall_NONDEP", "R NONDEP"), ("f1_NONDEP", "F1 NONDEP"),
               ("macro_precision", "macro P"), ("macro_recall", "macro R"), ("macro_f1", "macro F1"),
               ("invalid_rate", "unparsable"))
ISO_UNPARSABLE = ("exclude", "wrong")
"""How :func:`iso_report` treats a prediction that is not DEP/NONDEP: ``exclude`` (ISO-Bench App. H) or
``wrong`` (seqaware's stricter alternative)."""


def iso_report(gold: Sequence[str] | Mapping[str, str], pred: Sequence[Any] | Mapping[str, Any],
               unparsable: str = "exclude") -> dict[str, Any]:
    """DEP/NONDEP per-class, macro and weighted precision/recall/F1, accuracy, unparsable counts.

    ``gold`` and ``pred`` are aligned label sequences, or mappings ``instance_id -> label`` (an id
    without prediction is unparsable). A prediction that is not ``DEP``/``NONDEP`` (``other``,
    None, ...) is *unparsable*:

    * ``unparsable="exclude"`` (default, ISO-Bench App. H "Metric": "we report accuracy, precision,
      recall, and F1 on the subset of responses containing an unambiguous YES or NO", footnote: "We
      discard outputs lacking either token"): every score is computed on the parsed instances only;
    * ``unparsable="wrong"``: scored over all instances, an unparsable reply being wrong (it lowers
      the gold class's recall and counts towards no class's precision).

    Keys: those of :func:`classification_report` (``precision_DEP`` ... ``macro_f1``,
    ``weighted_f1``), where ``n`` = all gold instances and ``invalid_rate`` = unparsable share of
    them, plus ``num_unparsable`` and ``n_scored`` (instances the scores are computed on). Table 1
    reports per-label and "macro average" P/R/F; its macro F is the unweighted mean of the two
    per-class F1 (e.g. 4o A: (0.63 + 0.50) / 2 = 0.57), i.e. ``macro_f1`` (sklearn ``macro``).
    """
    if unparsable not in ISO_UNPARSABLE:
        raise ValueError(f"unparsable must be one of {', '.join(ISO_UNPARSABLE)}, got {unparsable!r}")
    gold, pred = _labels_of(gold, pred)
    bad = [g for g in gold if g not in ISO_LABELS]
    if bad:
        raise ValueError(f"gold labels must be DEP or NONDEP, got {sorted(set(map(str, bad)))}")
    parsed = [p in ISO_LABELS for p in pred]
    if unparsable == "exclude":
        scored_gold = [g for g, ok in zip(gold, parsed) if ok]
        scored_pred = [p for p, ok in zip(pred, parsed) if ok]
    else:
        scored_gold, scored_pred = gold, pred
    report = classification_report(scored_gold, scored_pred, ISO_LABELS)
    n = len(gold)
    report["n"] = n
    report["n_scored"] = len(scored_gold)
    report["num_unparsable"] = n - sum(parsed)
    report["invalid_rate"] = (n - sum(parsed)) / n if n else 0.0
    return report


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


def iso_rows(gold, systems: Mapping[str, Any], seed: int = 0, unparsable: str = "exclude") -> dict[str, dict[str, Any]]:
    """Baseline rows, then one row per system (``name -> predictions``); ``unparsable`` as in :func:`iso_report`."""
    rows = iso_baselines(gold, seed)
    rows.update({name: iso_report(gold, pred, unparsable) for name, pred in systems.items()})
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
