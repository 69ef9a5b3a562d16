"""Temporal Execution Order (TEO) pairs, built from procedures with a dependency DAG.

Follows the MATEO construction (Roccabruna et al., section 5.2). For two steps A and B of a
procedure, presented in that order, the label says how A must be executed relative to B:

* ``before``      -- ``A -> B`` is an annotated edge of the DAG (sec. 5.2: "step A must be executed
  *before* step B if there is a directed edge from A to B"), with ``pairs="edges"`` (the default);
  with ``pairs="reduction"`` (seqaware's earlier rule, ``data.teo.pairs=reduction``) only the edges of
  the DAG's transitive reduction, so an annotated edge implied by a longer path (``0 -> 2`` beside
  ``0 -> 1 -> 2``) gives no pair;
* ``after``       -- the same pair presented the other way round (B first): the *swapped* set;
* ``independent`` -- no directed path joins the two steps in either direction.

Pairs joined only through a longer path and no edge of their own (A reaches B, but ``A -> B`` is not
a used edge) are not used: they are neither direct dependencies nor independent.

A pair is a plain JSON-serialisable dict::

    {"pair_id": "proc-7:0-2", "procedure_id": "proc-7", "split": "test", "num_steps": 5,
     "a": 0, "b": 2,                       # step indices, A is presented first
     "label": "before",                    # before | after | independent
     "step_a": {"text": "...", "images": ["images/proc-7_0.jpg"]},
     "step_b": {"text": "...", "images": [...]},
     "category": ["Main dishes"]}

Image paths are kept as stored in the step (relative to the procedures folder).
"""
from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from seqaware import dag as dag_utils
from seqaware.metrics.teo import SWAPPED_LABEL, TEO_LABELS
from seqaware.procedure import Procedure, Step

SPLIT_NAMES = ("train", "val", "test")
PAIR_RULES = ("edges", "reduction")
"""Which DAG edges give ``before`` pairs: ``edges`` (every annotated edge, MATEO sec. 5.2) or
``reduction`` (the edges of the transitive reduction only)."""


def check_pair_rule(pairs: str) -> str:
    if pairs not in PAIR_RULES:
        raise ValueError(f"data.teo.pairs must be one of {', '.join(PAIR_RULES)}, got {pairs!r}")
    return pairs


def teo_options(teo: Mapping[str, Any] | None) -> str:
    """The pair rule of a data module's ``teo`` option block (``data.teo: {pairs: edges}``), checked."""
    teo = dict(teo or {})
    unknown = sorted(set(teo) - {"pairs"})
    if unknown:
        raise ValueError(f"data.teo: unknown key(s) {unknown}; known: pairs")
    return check_pair_rule(teo.get("pairs", "edges"))


def _step_payload(step: Step) -> dict[str, Any]:
    return {"text": step.text, "images": list(step.images)}


def _make_pair(procedure: Procedure, a: int, b: int, label: str) -> dict[str, Any]:
    return {
        "pair_id": f"{procedure.id}:{a}-{b}",
        "procedure_id": procedure.id,
        "split": procedure.split,
        "num_steps": procedure.num_steps,
        "a": a,
        "b": b,
        "label": label,
        "step_a": _step_payload(procedure.steps[a]),
        "step_b": _step_payload(procedure.steps[b]),
        "category": list(procedure.category),
    }


def teo_pairs(procedure: Procedure, pairs: str = "edges") -> list[dict[str, Any]]:
    """The original-presentation pairs of one procedure: direct dependencies and independent pairs.

    * one ``before`` pair ``(a, b)`` per annotated edge ``a -> b`` of the DAG (``pairs="edges"``,
      MATEO sec. 5.2; repeated edges count once) or per edge of its transitive reduction
      (``pairs="reduction"``);
    * one ``independent`` pair ``(a, b)``, ``a < b`` in the authored order, per pair of steps with
      no directed path either way.

    Pairs are sorted by ``(min(a, b), max(a, b))``. A procedure without a DAG gives no pairs.
    """
    if procedure.dag is None:
        return []
    n = procedure.num_steps
    check_pair_rule(pairs)
    edges = [(int(a), int(b)) for a, b in procedure.dag]
    if pairs == "edges":
        direct = set(edges)
    else:
        direct = {(int(a), int(b)) for a, b in dag_utils.transitive_reduction(n, edges)}
    reach = np.asarray(dag_utils.transitive_closure(n, edges), dtype=bool)
    out = [_make_pair(procedure, a, b, "before") for a, b in direct]
    out += [
        _make_pair(procedure, a, b, "independent")
        for a in range(n)
        for b in range(a + 1, n)
        if not reach[a, b] and not reach[b, a]
    ]
    out.sort(key=lambda p: (min(p["a"], p["b"]), max(p["a"], p["b"])))
    return out


def swap_pair(pair: dict[str, Any]) -> dict[str, Any]:
    """The same pair with B presented first: ``before`` becomes ``after``; ``independent`` stays."""
    swapped = dict(pair)
    swapped["a"], swapped["b"] = pair["b"], pair["a"]
    swapped["step_a"], swapped["step_b"] = pair["step_b"], pair["step_a"]
    swapped["label"] = SWAPPED_LABEL[pair["label"]]
    swapped["pair_id"] = f"{pair['pair_id']}:swapped"
    return swapped


def teo_eval_sets(procedures: Iterable[Procedure], pairs: str = "edges") -> dict[str, list[dict[str, Any]]]:
    """Evaluation sets: ``original`` (before + independent) and ``swapped`` (after + independent);
    ``pairs`` as in :func:`teo_pairs`.

    Every original pair appears swapped in ``swapped``, in the same order, so consistency can be
    measured pair by pair (see :func:`seqaware.metrics.teo.teo_report`).
    """
    original = [pair for proc in procedures for pair in teo_pairs(proc, pairs)]
    return {"original": original, "swapped": [swap_pair(p) for p in original]}


def twin_presentations(eval_sets: dict[str, list[dict[str, Any]]], limit: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``(set name, pair)`` of the first ``limit`` original pairs (None: all), each directly followed
    by its swapped twin: ``("original", p0), ("swapped", p0'), ("original", p1), ...``.

    The order the data modules evaluate in: any prefix of it (``limit_val_batches``,
    ``fast_dev_run``) holds complete pairs but at most one, which
    :func:`seqaware.metrics.teo.complete_pairs` leaves out of the scores.
    """
    return [(name, p) for o, s in zip(eval_sets["original"][:limit], eval_sets["swapped"][:limit])
            for name, p in (("original", o), ("swapped", s))]


def teo_training_pairs(procedures: Iterable[Procedure], seed: int = 0, pairs: str = "edges") -> list[dict[str, Any]]:
    """Fine-tuning pairs: every dependent pair in both presentations, independent pairs once (MATEO
    sec. 5.4); ``pairs`` as in :func:`teo_pairs`.

    So ``before`` and ``after`` are exactly balanced; independent pairs keep their original
    presentation. The list is shuffled with ``seed`` (the same seed gives the same list).
    """
    out: list[dict[str, Any]] = []
    for proc in procedures:
        for pair in teo_pairs(proc, pairs):
            out.append(pair)
            if pair["label"] == "before":
                out.append(swap_pair(pair))
    order = np.random.default_rng(seed).permutation(len(out))
    return [out[i] for i in order]


def teo_class_counts(pairs: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Number of pairs per label; the three TEO labels are always present (possibly 0)."""
    counts = Counter(p["label"] for p in pairs)
    out = {label: counts.pop(label, 0) for label in TEO_LABELS}
    out.update(sorted(counts.items()))
    return out


def _quota(fraction: float, size: int) -> float:
    """``fraction * size``, rounded to 9 decimals so that 0.29 * 100 counts as 29, not 28.99..."""
    return round(fraction * size, 9)


def _largest_remainder(total: int, fractions: Sequence[float]) -> list[int]:
    """Integer counts summing to ``total``, proportional to ``fractions`` (Hamilton's method).

    Ties between equal remainders go to the earlier fraction.
    """
    quotas = [_quota(f, total) for f in fractions]
    counts = [int(np.floor(q)) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def stratified_split(
    procedures: Sequence[Procedure], fractions: Sequence[float] = (0.7, 0.1, 0.2), seed: int = 0
) -> dict[str, list[Procedure]]:
    """Split procedures into train/val/test, stratified by number of steps.

    1. Procedures are grouped by ``num_steps``; each group is sorted by id (so the input order
       does not matter) and shuffled with a generator seeded by ``seed``.
    2. The split totals are the largest-remainder rounding of ``fractions * N``: they sum to N
       exactly.
    3. Each group of size ``m`` first receives ``floor(fraction * m)`` procedures per split. The
       few seats left over are handed out by largest remainder ``fraction * m - floor(...)``
       across all groups, as long as the split still needs seats to reach its total (ties between
       groups are broken by a seeded random rank, so small groups do not always land in the same
       split). A group therefore gets ``floor(fraction * m)`` or one more per split, and the split
       totals are exact. In the rare case where the greedy pass cannot place a seat, it goes to
       the first split that still needs one.
    4. Each shuffled group is cut in train, val, test order by its counts.

    Returns copies of the procedures with ``split`` set to the split they were assigned to
    (steps and other fields are shared with the inputs, not copied).
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not np.isclose(sum(fractions), 1.0):
        raise ValueError(f"fractions must be 3 non-negative numbers summing to 1, got {tuple(fractions)}")
    rng = np.random.default_rng(seed)
    groups: dict[int, list[Procedure]] = defaultdict(list)
    for proc in procedures:
        groups[proc.num_steps].append(proc)
    sizes = sorted(groups)
    shuffled = {}
    for size in sizes:
        members = sorted(groups[size], key=lambda p: p.id)
        shuffled[size] = [members[i] for i in rng.permutation(len(members))]
    tie_rank = {size: r for size, r in zip(sizes, rng.permutation(len(sizes)))}

    need = _largest_remainder(len(procedures), fractions)
    counts = {size: [int(np.floor(_quota(f, len(shuffled[size])))) for f in fractions] for size in sizes}
    left = {size: len(shuffled[size]) - sum(counts[size]) for size in sizes}
    need = [need[s] - sum(counts[size][s] for size in sizes) for s in range(3)]
    seats = sorted(
        ((_quota(fractions[s], len(shuffled[size])) - counts[size][s], size, s) for size in sizes for s in range(3)),
        key=lambda t: (-t[0], tie_rank[t[1]], t[2]),
    )
    for remainder, size, s in seats:
        if remainder > 0 and left[size] > 0 and need[s] > 0:
            counts[size][s] += 1
            left[size] -= 1
            need[s] -= 1
    for size in sizes:  # fallback, rarely used: place what the greedy pass could not
        while left[size] > 0:
            s = next(i for i in range(3) if need[i] > 0)
            counts[size][s] += 1
            left[size] -= 1
            need[s] -= 1

    out: dict[str, list[Procedure]] = {name: [] for name in SPLIT_NAMES}
    for size in sizes:
        start = 0
        for name, count in zip(SPLIT_NAMES, counts[size]):
            out[name] += [dataclasses.replace(p, split=name) for p in shuffled[size][start:start + count]]
            start += count
    return out
