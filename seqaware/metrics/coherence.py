"""COHERENCE metrics: scoring placeholder-to-image assignments.

An instance (built by ``data_modules.tasks.coherence``) has ``candidates`` (image paths), ``gold``
(``gold[i]`` = candidate index of the image of placeholder ``i + 1``) and ``distractors`` (candidate
indices that belong to no placeholder). A prediction is a list with one candidate index per
placeholder.

**Valid prediction**: a list/tuple of ``len(gold)`` integers, each in ``[0, len(candidates))``,
with no candidate used twice. Anything else (``None``, wrong length, a repeated or out-of-range
index, a non-integer) is *invalid* and scores 0 on every metric below.

Per instance:

* ``exact`` -- 1 if every placeholder gets its gold image.
* ``partial`` -- ``(tau + 1) / 2`` where ``tau`` is Kendall's tau between the gold and the
  predicted *rankings of the images*: the gold ranking puts the image of placeholder ``i`` at
  rank ``i``; the predicted ranking puts the image the prediction assigns to placeholder ``i`` at
  rank ``i``. Tau is computed over the gold images that the prediction placed (a placeholder
  filled with a distractor drops that image from the comparison). Equivalently, with ``r_i`` =
  the gold placeholder of the image predicted for placeholder ``i``, ``tau = kendalltau(i, r_i)``.
  It is 1 for the gold assignment and 0 for the reversed one; fewer than two comparable images
  give ``partial = 0``.
* ``reject`` -- for instances with distractors only: the share of distractor candidates the
  prediction does not use.

The report averages each over instances (``reject_accuracy`` over instances with distractors,
``None`` when there are none) and adds ``invalid_rate`` and a per-difficulty breakdown.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from seqaware.metrics.iso import format_table

COHERENCE_COLUMNS = (("exact_match", "Exact"), ("partial_score", "Partial"),
                     ("reject_accuracy", "Reject acc"), ("invalid_rate", "invalid"))


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-a of two equally long sequences without ties (NaN for fewer than 2 items).

    Agrees with ``scipy.stats.kendalltau`` (tau-b) whenever there are no ties.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    if n < 2:
        return float("nan")
    sx = np.sign(x[:, None] - x[None, :])
    sy = np.sign(y[:, None] - y[None, :])
    return float((sx * sy)[np.triu_indices(n, 1)].sum() / (n * (n - 1) / 2))


def is_valid_prediction(pred: Any, num_placeholders: int, num_candidates: int) -> bool:
    """True for a list of ``num_placeholders`` distinct integer candidate indices."""
    if not isinstance(pred, (list, tuple)) or len(pred) != num_placeholders:
        return False
    if not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in pred):
        return False
    return all(0 <= p < num_candidates for p in pred) and len(set(pred)) == len(pred)


def coherence_scores(instance: Mapping[str, Any], pred: Any) -> dict[str, Any]:
    """``valid``, ``exact``, ``partial`` and ``reject`` (None without distractors) of one prediction."""
    gold = [int(g) for g in instance["gold"]]
    distractors = list(instance.get("distractors") or [])
    valid = is_valid_prediction(pred, len(gold), len(instance["candidates"]))
    if not valid:
        return {"valid": False, "exact": 0.0, "partial": 0.0, "reject": 0.0 if distractors else None}
    pred = [int(p) for p in pred]
    gold_rank = {c: i for i, c in enumerate(gold)}
    placed = [(i, gold_rank[c]) for i, c in enumerate(pred) if c in gold_rank]
    tau = kendall_tau([i for i, _ in placed], [r for _, r in placed]) if len(placed) >= 2 else float("nan")
    reject = None
    if distractors:
        used = set(pred)
        reject = sum(d not in used for d in distractors) / len(distractors)
    return {
        "valid": True,
        "exact": float(pred == gold),
        "partial": 0.0 if np.isnan(tau) else (tau + 1) / 2,
        "reject": reject,
    }


def _aggregate(scores: list[dict[str, Any]]) -> dict[str, Any]:
    rejects = [s["reject"] for s in scores if s["reject"] is not None]
    n = len(scores)
    return {
        "n": n,
        "exact_match": float(np.mean([s["exact"] for s in scores])) if n else 0.0,
        "partial_score": float(np.mean([s["partial"] for s in scores])) if n else 0.0,
        "reject_accuracy": float(np.mean(rejects)) if rejects else None,
        "num_with_distractors": len(rejects),
        "invalid_rate": float(np.mean([not s["valid"] for s in scores])) if n else 0.0,
    }


def coherence_report(instances: Sequence[Mapping[str, Any]], preds: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
    """Mean exact match, partial score, reject accuracy and invalid rate over the instances.

    ``preds`` maps ``instance_id`` to a prediction (a missing id is invalid), or is a sequence
    aligned with ``instances``. ``by_difficulty`` holds the same numbers per difficulty.
    """
    if isinstance(preds, Mapping):
        aligned = [preds.get(inst["instance_id"]) for inst in instances]
    else:
        aligned = list(preds)
        if len(aligned) != len(instances):
            raise ValueError(f"{len(aligned)} predictions for {len(instances)} instances")
    scores = [coherence_scores(inst, pred) for inst, pred in zip(instances, aligned)]
    report = _aggregate(scores)
    by_difficulty: dict[str, list[dict[str, Any]]] = {}
    for inst, score in zip(instances, scores):
        by_difficulty.setdefault(str(inst.get("difficulty")), []).append(score)
    report["by_difficulty"] = {name: _aggregate(group) for name, group in sorted(by_difficulty.items())}
    return report


def coherence_baselines(instances: Sequence[Mapping[str, Any]], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Reports of the trivial predictors.

    * ``random`` -- each placeholder gets a distinct candidate drawn uniformly from all candidates
      (distractors included), with a generator seeded by ``seed``;
    * ``identity`` -- placeholder ``i`` gets candidate ``i`` (the candidates in the given order).
    """
    rng = np.random.default_rng(seed)
    random_preds = [
        [int(c) for c in rng.choice(len(inst["candidates"]), size=len(inst["gold"]), replace=False)]
        for inst in instances
    ]
    identity = [list(range(len(inst["gold"]))) for inst in instances]
    return {"random": coherence_report(instances, random_preds), "identity": coherence_report(instances, identity)}


def coherence_rows(instances: Sequence[Mapping[str, Any]], systems: Mapping[str, Any], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Baseline rows, then one row per system (``name -> predictions``)."""
    rows = coherence_baselines(instances, seed)
    rows.update({name: coherence_report(instances, preds) for name, preds in systems.items()})
    return rows


def coherence_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table of COHERENCE reports (percentages)."""
    return format_table(rows, COHERENCE_COLUMNS)
