"""Temporal Execution Order (TEO) metrics: per-class F1 and consistency over swapped presentations.

Inputs are the pairs built by ``data_modules.tasks.teo`` (dicts with at least ``pair_id``,
``procedure_id``, ``a``, ``b``, ``label``) and predictions given as mappings ``pair_id -> label``
with labels in ``before | after | independent | other``. A missing prediction, ``None`` or any
other string counts as ``other`` (a non-answer).

Definitions (MATEO):

* MATEO's per-class F1 (MATEO Table 4 and section 6: "Because the ground-truth labels for the *after*
  class are defined on the swapped step order, we compute F1 scores for this class on the swapped
  dataset. In contrast, scores for the *before* and *independent* classes are computed using the
  original step order."): ``mateo_f1_before`` -- F1 of ``before`` on the original set;
  ``mateo_f1_independent`` -- F1 of ``independent`` on the original set; ``mateo_f1_after`` -- F1
  of ``after`` on the swapped set.
* seqaware's pooled variant (kept): ``f1_before`` / ``f1_after`` as above (equal to the MATEO
  ones); ``f1_independent`` -- F1 of ``independent`` over both sets together (every independent
  pair is asked twice); ``macro_f1`` -- the mean of ``f1_before``, ``f1_after``, ``f1_independent``.
  Every F1 is the usual one-vs-rest F1 of a multi-class prediction (as
  ``sklearn.metrics.f1_score(labels=[c], average=None, zero_division=0)``): ``other`` predictions
  count as errors of the gold class.
* ``consistency_accuracy`` -- share of pairs answered right in *both* presentations: a dependent
  pair counts only if predicted ``before`` in the original and ``after`` in the swapped
  presentation, an independent pair only if predicted ``independent`` in both.
  ``consistency_dependent`` / ``consistency_independent`` are the same share within each class.
* ``other_rate`` -- share of all predictions (both sets) that are ``other``.
* ``accuracy_original`` / ``accuracy_swapped`` -- plain accuracy on each set.

An original pair and its swapped version are matched by ``(procedure_id, {a, b})``.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from seqaware.metrics.classification import format_table, majority_label, per_class_prf, random_labels

TEO_LABELS = ("before", "after", "independent")
"""The three TEO classes, in the order every TEO model and head uses for its class ids (the one definition)."""
TEO_LABEL_ID = {label: i for i, label in enumerate(TEO_LABELS)}
SWAPPED_LABEL = {"before": "after", "after": "before", "independent": "independent"}
"""The label of a pair presented the other way round (step B first)."""
OTHER = "other"
TEO_COLUMNS = (
    ("consistency_accuracy", "Cons. Acc"), ("consistency_dependent", "Cons. dep"),
    ("consistency_independent", "Cons. indep"), ("f1_before", "F1 before"), ("f1_after", "F1 after"),
    ("f1_independent", "F1 indep"), ("mateo_f1_independent", "F1 indep (orig.)"), ("macro_f1", "macro F1"),
    ("other_rate", "Other"),
)


def normalize_label(label: Any) -> str:
    """``before``/``after``/``independent`` (case and surrounding spaces ignored), else ``other``."""
    if isinstance(label, str) and label.strip().lower() in TEO_LABELS:
        return label.strip().lower()
    return OTHER


def pair_key(pair: Mapping[str, Any]) -> tuple[str, int, int]:
    """``(procedure_id, min(a, b), max(a, b))``: the key an original pair shares with its swapped twin."""
    a, b = int(pair["a"]), int(pair["b"])
    return str(pair["procedure_id"]), min(a, b), max(a, b)


def complete_pairs(original: Sequence[Any], swapped: Sequence[Any],
                   pair: Callable[[Any], Mapping[str, Any]] = lambda entry: entry) -> tuple[list[Any], list[Any]]:
    """The entries of ``original`` and ``swapped`` whose twin (same :func:`pair_key`) is in the other set.

    Consistency needs both presentations of a pair, but an evaluation may see only part of a split
    (``limit_val_batches``, ``fast_dev_run``): TEO scores are computed on complete pairs only. The
    data modules put each original pair directly before its swapped twin
    (:func:`data_modules.tasks.teo.twin_presentations`), so any prefix of a loader loses at most one
    pair. ``pair`` gets the pair dict out of an entry (e.g. ``lambda e: e[0]`` for ``(pair,
    prediction)`` tuples); both lists keep their order.
    """
    both = {pair_key(pair(e)) for e in original} & {pair_key(pair(e)) for e in swapped}
    return [e for e in original if pair_key(pair(e)) in both], [e for e in swapped if pair_key(pair(e)) in both]


def _predictions(pairs: Sequence[Mapping[str, Any]], preds: Mapping[str, Any]) -> list[str]:
    return [normalize_label(preds.get(p["pair_id"])) for p in pairs]


def _f1(gold: Sequence[str], pred: Sequence[str], label: str) -> float:
    return per_class_prf(gold, pred, [label])[label]["f1"]


def teo_report(
    original_pairs: Sequence[Mapping[str, Any]],
    swapped_pairs: Sequence[Mapping[str, Any]],
    original_preds: Mapping[str, Any],
    swapped_preds: Mapping[str, Any],
) -> dict[str, Any]:
    """All TEO metrics of one system (see the module docstring); fractions in [0, 1].

    Raises ValueError when the two sets do not hold the same pairs (each original pair must have
    exactly one swapped counterpart).
    """
    swapped_by_key = {pair_key(p): i for i, p in enumerate(swapped_pairs)}
    if len(swapped_by_key) != len(swapped_pairs) or len(original_pairs) != len(swapped_pairs):
        raise ValueError("original and swapped sets must hold the same pairs, each once")
    try:
        partner = [swapped_by_key[pair_key(p)] for p in original_pairs]
    except KeyError as err:
        raise ValueError(f"original pair {err.args[0]} has no swapped counterpart") from None

    gold_o = [p["label"] for p in original_pairs]
    gold_s = [p["label"] for p in swapped_pairs]
    pred_o = _predictions(original_pairs, original_preds)
    pred_s = _predictions(swapped_pairs, swapped_preds)

    consistent = {"dependent": [], "independent": []}
    for i, j in enumerate(partner):
        if gold_o[i] == "independent":
            consistent["independent"].append(pred_o[i] == "independent" and pred_s[j] == "independent")
        else:  # an original dependent pair is "before"; its swapped version is "after"
            consistent["dependent"].append(pred_o[i] == gold_o[i] and pred_s[j] == gold_s[j])
    all_consistent = consistent["dependent"] + consistent["independent"]

    def share(values: list[bool]) -> float:
        return sum(values) / len(values) if values else 0.0

    f1 = {
        "before": _f1(gold_o, pred_o, "before"),
        "after": _f1(gold_s, pred_s, "after"),
        "independent": _f1(gold_o + gold_s, pred_o + pred_s, "independent"),
    }
    preds_all = pred_o + pred_s
    return {
        "num_pairs": len(original_pairs),
        "num_dependent": len(consistent["dependent"]),
        "num_independent": len(consistent["independent"]),
        "consistency_accuracy": share(all_consistent),
        "consistency_dependent": share(consistent["dependent"]),
        "consistency_independent": share(consistent["independent"]),
        "f1_before": f1["before"],
        "f1_after": f1["after"],
        "f1_independent": f1["independent"],
        "macro_f1": sum(f1.values()) / 3,
        # MATEO Table 4 / section 6: before and independent on the original order, after on the swapped
        "mateo_f1_before": _f1(gold_o, pred_o, "before"),
        "mateo_f1_independent": _f1(gold_o, pred_o, "independent"),
        "mateo_f1_after": _f1(gold_s, pred_s, "after"),
        "other_rate": share([p == OTHER for p in preds_all]),
        "accuracy_original": share([g == p for g, p in zip(gold_o, pred_o)]),
        "accuracy_swapped": share([g == p for g, p in zip(gold_s, pred_s)]),
    }


def teo_baselines(
    original_pairs: Sequence[Mapping[str, Any]], swapped_pairs: Sequence[Mapping[str, Any]], seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Reports of the trivial predictors.

    * ``always independent``;
    * ``majority`` -- the most frequent gold label of each set, chosen per set (ties: before,
      after, independent order);
    * ``random`` -- uniform over the three labels, drawn independently for every prediction of
      both sets with a generator seeded by ``seed``.
    """
    def constant(pairs, label):
        return {p["pair_id"]: label for p in pairs}

    maj_o = majority_label([p["label"] for p in original_pairs], TEO_LABELS)
    maj_s = majority_label([p["label"] for p in swapped_pairs], TEO_LABELS)
    draws = random_labels(len(original_pairs) + len(swapped_pairs), TEO_LABELS, seed)
    rand_o = {p["pair_id"]: draws[i] for i, p in enumerate(original_pairs)}
    rand_s = {p["pair_id"]: draws[len(original_pairs) + i] for i, p in enumerate(swapped_pairs)}
    return {
        "always independent": teo_report(original_pairs, swapped_pairs,
                                         constant(original_pairs, "independent"), constant(swapped_pairs, "independent")),
        "majority": teo_report(original_pairs, swapped_pairs, constant(original_pairs, maj_o), constant(swapped_pairs, maj_s)),
        "random": teo_report(original_pairs, swapped_pairs, rand_o, rand_s),
    }


def teo_rows(
    original_pairs: Sequence[Mapping[str, Any]],
    swapped_pairs: Sequence[Mapping[str, Any]],
    systems: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]],
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Baseline rows, then one row per system: ``name -> (original_preds, swapped_preds)``."""
    rows = teo_baselines(original_pairs, swapped_pairs, seed)
    rows.update({name: teo_report(original_pairs, swapped_pairs, o, s) for name, (o, s) in systems.items()})
    return rows


def predicted_pair_rows(original: Sequence[tuple[Mapping[str, Any], Any]], swapped: Sequence[tuple[Mapping[str, Any], Any]],
                        system: str) -> tuple[dict[str, dict[str, Any]], list, list]:
    """TEO rows (baselines, then ``system``) of ``(pair, predicted label)`` presentations, scored on the
    pairs seen in both presentations (:func:`complete_pairs`); also the kept entries of each set.
    The rows are empty when no pair is complete."""
    original, swapped = complete_pairs(original, swapped, pair=lambda entry: entry[0])
    if not original:
        return {}, original, swapped
    rows = teo_rows([p for p, _ in original], [p for p, _ in swapped],
                    {system: ({p["pair_id"]: y for p, y in original}, {p["pair_id"]: y for p, y in swapped})})
    return rows, original, swapped


def teo_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table of TEO reports (percentages), one row per system."""
    return format_table(rows, TEO_COLUMNS)
