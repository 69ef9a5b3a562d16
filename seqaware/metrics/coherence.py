"""COHERENCE metrics: scoring placeholder-to-image assignments (COHERENCE §4.1, App. E, Table 1).

An instance (built by ``data_modules.tasks.coherence``) has ``candidates`` (image paths), ``gold``
(``gold[i]`` = candidate index of the image of placeholder ``i + 1``), ``distractors`` (candidate
indices that belong to no placeholder), optionally ``source`` (the domain: WikiHow, StoryBird,
Cooking, Science) and ``difficulty``. A prediction is a list with one candidate index per
placeholder (0-based, as the App. D.1 prompt asks), e.g. from
:func:`seqaware.vlm.parser.parse_coherence_answer`.

**Valid prediction**: a list/tuple of ``len(gold)`` integers, each in ``[0, len(candidates))``,
with no candidate used twice (App. D.1: "The same image index can only be used once", "exactly
{num_placeholders} integers, each between 0 and {len(image_sequence) - 1}"). Anything else is
*invalid* (the paper's "Instruction Violation", §4.4) and scores 0 on every metric below; None
(no list on the reply's last line) is also *unparsable*.

Per instance (paper-exact unless marked):

* ``exact`` -- §4.1 Exact Match: 1 if the predicted list equals the gold list.
* ``partial`` -- §4.1 Partial Match: ``(tau + 1) / 2`` with
  ``tau = (#concordant - #discordant) / C(n, 2)`` between the predicted and the gold *lists*
  (placeholder ``i`` -> image index), the pairs running over placeholder positions ``i < j``:
  exactly ``scipy.stats.kendalltau(pred, gold)`` (no ties in valid lists). A placeholder filled
  with a distractor keeps its (distractor) index in the comparison. With a single placeholder
  ``C(1, 2) = 0``; seqaware then sets ``partial = exact``.
* ``partial_placement`` -- seqaware extension: the same rescaled tau over the *order in which the
  gold images are placed*: with ``r_i`` the gold placeholder of the image predicted for
  placeholder ``i``, ``tau = kendalltau(i, r_i)`` over the placeholders holding a gold image. It
  does not depend on the arbitrary numbering of the candidates (the paper's ``partial`` does).
* ``reject`` -- App. E Reject, for instances with distractors only: 1 if the prediction uses none
  of the distractor images ("correctly identifies all extra candidate images as irrelevant").
* ``reject_fraction`` -- seqaware extension: the share of distractor images left unused.

The report averages each over instances (``reject_accuracy`` / ``reject_fraction`` over instances
with distractors, None when there are none), adds ``invalid_rate`` / ``unparsable_rate``, and
breaks the numbers down by source domain (``by_source``, Table 1) and difficulty
(``by_difficulty``, Table 2). Table 1's "Overall" is the mean over all instances, not over domains
(e.g. Qwen3-VL-4B Exact: (58.57*2076 + 22.46*1398 + 26.24*1326 + 17.19*1361) / 6161 = 34.28).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from seqaware.metrics.classification import format_table

COHERENCE_COLUMNS = (("exact_match", "Exact"), ("partial_score", "Partial"),
                     ("reject_accuracy", "Reject"), ("unparsable_rate", "unparsable"), ("invalid_rate", "invalid"))
COHERENCE_SOURCES = ("WikiHow", "StoryBird", "Cooking", "Science")
"""The source domains of COHERENCE Table 1, in its column order (§3.1.2)."""


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


def _rescaled_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """``(tau + 1) / 2`` (§4.1); NaN for fewer than two items (the NaN of :func:`kendall_tau` carries through)."""
    return (kendall_tau(x, y) + 1) / 2


def coherence_scores(instance: Mapping[str, Any], pred: Any) -> dict[str, Any]:
    """``valid``, ``parsed``, ``exact``, ``partial``, ``partial_placement``, ``reject`` and
    ``reject_fraction`` (both None without distractors) of one prediction (see the module docstring)."""
    gold = [int(g) for g in instance["gold"]]
    distractors = list(instance.get("distractors") or [])
    valid = is_valid_prediction(pred, len(gold), len(instance["candidates"]))
    if not valid:
        zero_reject = 0.0 if distractors else None
        return {"valid": False, "parsed": pred is not None, "exact": 0.0, "partial": 0.0, "partial_placement": 0.0,
                "reject": zero_reject, "reject_fraction": zero_reject}
    pred = [int(p) for p in pred]
    exact = float(pred == gold)
    partial = _rescaled_tau(pred, gold) if len(gold) >= 2 else exact
    gold_rank = {c: i for i, c in enumerate(gold)}
    placed = [(i, gold_rank[c]) for i, c in enumerate(pred) if c in gold_rank]
    placement = _rescaled_tau([i for i, _ in placed], [r for _, r in placed])
    if np.isnan(placement):  # fewer than two gold images placed: no pair to order
        placement = exact
    reject = reject_fraction = None
    if distractors:
        used = set(pred)
        unused = sum(d not in used for d in distractors)
        reject = float(unused == len(distractors))
        reject_fraction = unused / len(distractors)
    return {"valid": True, "parsed": True, "exact": exact, "partial": partial, "partial_placement": placement,
            "reject": reject, "reject_fraction": reject_fraction}


def _aggregate(scores: list[dict[str, Any]]) -> dict[str, Any]:
    rejects = [s["reject"] for s in scores if s["reject"] is not None]
    fractions = [s["reject_fraction"] for s in scores if s["reject_fraction"] is not None]
    n = len(scores)

    def mean(key: str) -> float:
        return float(np.mean([s[key] for s in scores])) if n else 0.0

    return {
        "n": n,
        "exact_match": mean("exact"),
        "partial_score": mean("partial"),
        "partial_score_placement": mean("partial_placement"),
        "reject_accuracy": float(np.mean(rejects)) if rejects else None,
        "reject_fraction": float(np.mean(fractions)) if fractions else None,
        "num_with_distractors": len(rejects),
        "invalid_rate": float(np.mean([not s["valid"] for s in scores])) if n else 0.0,
        "unparsable_rate": float(np.mean([not s["parsed"] for s in scores])) if n else 0.0,
    }


def _source_order(names) -> list[str]:
    """Table 1's domains first (in its order), then any other source names sorted."""
    names = set(names)
    return [s for s in COHERENCE_SOURCES if s in names] + sorted(names - set(COHERENCE_SOURCES))


def coherence_report(instances: Sequence[Mapping[str, Any]], preds: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
    """Mean exact match, partial score, reject accuracy, invalid/unparsable rates over the instances.

    ``preds`` maps ``instance_id`` to a prediction (a missing id is unparsable), or is a sequence
    aligned with ``instances``. The top level is Table 1's "Overall" (mean over instances);
    ``by_source`` holds the same numbers per source domain (instances without ``source`` are only
    in the overall numbers), ``by_difficulty`` per difficulty.
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
    by_source: dict[str, list[dict[str, Any]]] = {}
    for inst, score in zip(instances, scores):
        by_difficulty.setdefault(str(inst.get("difficulty")), []).append(score)
        if inst.get("source") is not None:
            by_source.setdefault(str(inst["source"]), []).append(score)
    report["by_source"] = {name: _aggregate(by_source[name]) for name in _source_order(by_source)}
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


def coherence_source_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table in the layout of COHERENCE Table 1: Exact and Partial per source domain, then Overall.

    Domains are those found in any row's ``by_source`` (Table 1's four first); a row without a domain
    shows ``-``. Empty string when no row has a source.
    """
    names = _source_order({name for r in rows.values() for name in (r.get("by_source") or {})})
    if not names:
        return ""
    flat: dict[str, dict[str, Any]] = {}
    columns: list[tuple[str, str]] = []
    for name in names:
        columns += [(f"{name}/exact_match", f"{name} Exact"), (f"{name}/partial_score", f"{name} Partial")]
    columns += [("exact_match", "Overall Exact"), ("partial_score", "Overall Partial")]
    for system, report in rows.items():
        cells = {"exact_match": report.get("exact_match"), "partial_score": report.get("partial_score")}
        for name, sub in (report.get("by_source") or {}).items():
            cells[f"{name}/exact_match"], cells[f"{name}/partial_score"] = sub["exact_match"], sub["partial_score"]
        flat[system] = cells
    return format_table(flat, columns)
