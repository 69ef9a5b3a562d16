"""ISO-Bench metrics: DEP/NONDEP dependency questions (ISO-Bench App. H, Table 1).

A prediction that is not ``DEP`` / ``NONDEP`` (``None``, an unparsable answer, ``"other"``) is
*unparsable*: :func:`iso_report` by default leaves such predictions out, as ISO-Bench does (App. H),
and reports how many there were. The per-class scores, baselines and table formatting come from
:mod:`seqaware.metrics.classification`.

:func:`iso_rows` returns the trivial baselines first and then the systems, so a reported table
always carries them.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from seqaware.metrics.classification import align_labels, classification_report, format_table, majority_label, random_labels

ISO_LABELS = ("DEP", "NONDEP")


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
    gold, pred = align_labels(gold, pred)
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


def implied_nondep_recall(precision_dep: float, recall_dep: float, precision_nondep: float) -> float:
    """NONDEP recall implied by DEP precision / recall and NONDEP precision when every scored reply is DEP
    or NONDEP (``unparsable="exclude"``): with TP = 1 the 2x2 table is FP = (1 - P_DEP) / P_DEP,
    FN = (1 - R_DEP) / R_DEP, TN = FN P_NONDEP / (1 - P_NONDEP), and R_NONDEP = TN / (TN + FP).
    Values are clipped to (0, 1) so the limits 0 and 1 are approached, not divided by."""
    pd, rd, pn = (min(max(float(v), 1e-9), 1 - 1e-9) for v in (precision_dep, recall_dep, precision_nondep))
    fp, fn = (1 - pd) / pd, (1 - rd) / rd
    tn = fn * pn / (1 - pn)
    return tn / (tn + fp)


def unparsable_consistency(dep: Mapping[str, float], nondep: Mapping[str, float], decimals: int = 2) -> dict[str, Any]:
    """Which treatment of unparsable replies a published ISO-Bench row (``{p, r}`` per class, rounded
    to ``decimals``) can come from.

    Excluding them (App. H) leaves a complete 2x2 table, so three of the four per-class precisions and
    recalls fix the fourth (:func:`implied_nondep_recall`). Counting them wrong keeps both precisions and
    lowers the recalls (an unparsable reply is a miss of its gold class), so the published NONDEP recall
    can only be at or below the value exclusion implies. Over every input within its rounding, the
    implied recall spans ``[lo, hi]``: the row is consistent with ``exclude`` when its NONDEP recall lies
    in ``[lo, hi]`` (within rounding), with ``wrong`` when it is at most ``hi`` (exclusion is ``wrong``
    with no unparsable reply, so ``exclude`` implies ``wrong``). Returns ``{"exclude": bool, "wrong":
    bool, "implied_recall_NONDEP": (lo, hi)}``.
    """
    tol = 0.5 * 10 ** -decimals
    pd, rd, pn, rn = float(dep["p"]), float(dep["r"]), float(nondep["p"]), float(nondep["r"])
    # the implied recall rises with P_DEP and P_NONDEP and falls with R_DEP: its extremes are two corners
    lo = implied_nondep_recall(pd - tol, rd + tol, pn - tol)
    hi = implied_nondep_recall(pd + tol, rd - tol, pn + tol)
    return {"exclude": lo - tol <= rn <= hi + tol, "wrong": rn <= hi + tol, "implied_recall_NONDEP": (lo, hi)}


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
