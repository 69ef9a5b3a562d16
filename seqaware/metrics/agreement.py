"""Annotation agreement and dataset statistics for orders and dependency DAGs.

* Orders: Cohen's kappa on pairwise-relation encodings (:func:`seqaware.metrics.ordering.order_kappa`,
  Wu et al. 2022, appendix B.3.1), averaged over annotator pairs (:func:`mean_pairwise_kappa`),
  and the agreement of annotators who each mark several alternative orders valid: Algorithm 1 of
  appendix B.3.2 (:func:`alternative_order_agreement`, built from :func:`relation_difference`,
  :func:`difference_kappa` and :func:`alternative_order_pair_scores`).
* DAGs: MASI distance (Passonneau 2006) between the out-node sets of each node, as used by MATEO
  to compare dependency annotations (:func:`masi_distance`, :func:`dag_masi_agreement`).
* :func:`procedure_statistics`: size and structure of a set of procedures.
"""
from __future__ import annotations

import itertools
import numbers
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

from seqaware import dag as dag_utils
from seqaware.metrics.ordering import _as_order, _gold_positions, binary_kappa, order_kappa, pairwise_relations


# ---------------------------------------------------------------- orders
def _annotator_values(by_annotator: Mapping[Any, Any] | Sequence[Any]) -> list[Any]:
    values = list(by_annotator.values()) if isinstance(by_annotator, Mapping) else list(by_annotator)
    if len(values) < 2:
        raise ValueError(f"agreement needs at least 2 annotators, got {len(values)}")
    return values


def mean_pairwise_kappa(orders_by_annotator: Mapping[Any, Sequence[Hashable]] | Sequence[Sequence[Hashable]],
                        items: Sequence[Hashable] | None = None) -> float:
    """Mean of :func:`order_kappa` over all pairs of annotators (one order per annotator).

    ``orders_by_annotator`` is a mapping ``annotator -> order`` or a list of orders (>= 2), all
    orders of the same items.
    """
    orders = _annotator_values(orders_by_annotator)
    return float(np.mean([order_kappa(a, b, items) for a, b in itertools.combinations(orders, 2)]))


def _check_order(order: Any, gold: list, where: str) -> list:
    """``order`` as a list, after checking it orders exactly the items of ``gold`` (``where`` names it)."""
    try:
        order = _as_order(order, where)
        _gold_positions(order, gold, (where, "gold"))
    except ValueError as err:
        raise ValueError(f"{where}: {order!r} is not an order of the gold order's items {gold!r} ({err})") from None
    return order


def relation_difference(order: Sequence[Hashable], gold: Sequence[Hashable],
                        items: Sequence[Hashable] | None = None) -> np.ndarray:
    """``R^diff_{og,o} = |R(og) - R(o)|`` (Wu et al. 2022, appendix B.3.2): 1 on the ordered pairs
    whose relation ``order`` flips with respect to ``gold`` (:func:`pairwise_relations` encoding).

    Example (B.3.2): gold 123, order 132 -> ``|110100 - 110001| = 000101``.
    """
    canonical = list(items) if items is not None else None
    return np.abs(pairwise_relations(gold, canonical) - pairwise_relations(order, canonical))


def difference_kappa(order_a: Sequence[Hashable], order_b: Sequence[Hashable], gold: Sequence[Hashable],
                     items: Sequence[Hashable] | None = None) -> float:
    """The scoring function ``f`` of Algorithm 1 (Wu et al. 2022, appendix B.3.2).

    Cohen's kappa (:func:`seqaware.metrics.ordering.binary_kappa`) between ``R^diff_{og,a}`` and
    ``R^diff_{og,b}`` retaining only the union of the positions where either order differs from
    the gold order. Example (B.3.2): gold 123, a = 132 (``000101``), b = 213 (``101000``): the
    union is positions {1, 3, 4, 6} (1-based), the lists are ``0011`` and ``1100`` and kappa is -1.

    Conventions (those of ``binary_kappa``): an empty union (both orders equal the gold order)
    gives 1.0; identical differences give 1.0. The unmatched-order penalty of Algorithm 1,
    ``f(og, o)``, is ``difference_kappa(gold, o, gold)``: the gold order has no differences, so
    the lists are all 0 vs all 1 and the penalty is 0.0 (1.0 if ``o`` is the gold order itself).
    """
    diff_a = relation_difference(order_a, gold, items)
    diff_b = relation_difference(order_b, gold, items)
    union = (diff_a == 1) | (diff_b == 1)
    return binary_kappa(diff_a[union], diff_b[union])


def alternative_order_pair_scores(orders_i: Sequence[Sequence[Hashable]], orders_j: Sequence[Sequence[Hashable]],
                                  gold: Sequence[Hashable], items: Sequence[Hashable] | None = None) -> list[float]:
    """The scores Algorithm 1 (Wu et al. 2022, appendix B.3.2, lines 4-14) adds for one pair of annotators.

    ``orders_i`` / ``orders_j``: the (non-empty) lists of alternative orders two annotators marked
    for one instance. The shorter series plays ``{a_i}`` (line 5; on equal lengths the first
    argument does). While it is not empty (lines 6-11), the best-matching pair ``(m, n)``
    maximising :func:`difference_kappa` over the remaining orders of both series is scored and
    both orders are removed (each order is matched at most once; on equal scores the first ``m``,
    then the first ``n`` wins). Each order left in the longer series scores the penalty
    ``f(og, o)`` against the gold order (lines 12-14). Returns the scores in the order they were
    added: ``max(K_i, K_j)`` of them.
    """
    series_i, series_j = list(orders_i), list(orders_j)
    if len(series_i) > len(series_j):  # line 5: assume K_i < K_j, otherwise swap
        series_i, series_j = series_j, series_i
    scores = np.array([[difference_kappa(a, b, gold, items) for b in series_j] for a in series_i], dtype=float)
    free_i = np.ones(len(series_i), dtype=bool)
    free_j = np.ones(len(series_j), dtype=bool)
    out: list[float] = []
    while free_i.any():  # lines 6-11: best matching pairs
        masked = np.where(free_i[:, None] & free_j[None, :], scores, -np.inf)
        m, n = np.unravel_index(int(np.argmax(masked)), masked.shape)  # first maximum in row-major order
        out.append(float(scores[m, n]))
        free_i[m] = free_j[n] = False
    for n in np.flatnonzero(free_j):  # lines 12-14: unmatched orders against the gold order (penalty)
        out.append(difference_kappa(gold, series_j[n], gold, items))
    return out


def alternative_order_agreement(alternatives_by_annotator: Mapping[Any, Sequence[Sequence[Hashable]]] | Sequence[Sequence[Sequence[Hashable]]],
                                gold: Sequence[Hashable], items: Sequence[Hashable] | None = None) -> float:
    """Agreement of annotators who each marked one or more alternative orders of one instance valid.

    Algorithm 1 of Wu et al. (2022), appendix B.3.2, as written: for every pair of annotators
    ``i < j`` the scores of :func:`alternative_order_pair_scores` (best-matching pairs scored
    with :func:`difference_kappa` on the relation differences to ``gold``, plus a penalty for each
    unmatched order) are collected into one list ``S``, and the result is ``mean(S)`` (line 17:
    pooled over all annotator pairs, so a pair with more orders weighs more). The corpus IAA is
    the mean of this value over instances (B.3.1).

    ``alternatives_by_annotator``: ``annotator -> list of orders`` or a list of such lists
    (>= 2 annotators, each with >= 1 order of the items of ``gold``).
    """
    annotators = _annotator_values(alternatives_by_annotator)
    names = list(alternatives_by_annotator) if isinstance(alternatives_by_annotator, Mapping) else list(range(len(annotators)))
    gold = _as_order(gold, "gold")
    _gold_positions(gold, gold, ("gold", "gold"))  # no duplicates
    checked = []
    for name, orders in zip(names, annotators):
        if isinstance(orders, (str, bytes)) or not isinstance(orders, Sequence) or not len(orders):
            raise ValueError(f"annotator {name!r}: needs a non-empty list of orders, got {orders!r}")
        checked.append([_check_order(o, gold, f"annotator {name!r}, order {k}") for k, o in enumerate(orders)])
    scores: list[float] = []
    for series_i, series_j in itertools.combinations(checked, 2):
        scores.extend(alternative_order_pair_scores(series_i, series_j, gold, items))
    return float(np.mean(scores))


# ---------------------------------------------------------------- DAGs: MASI
def masi_distance(set_a: Iterable[Hashable], set_b: Iterable[Hashable]) -> float:
    """MASI distance (Passonneau 2006): ``1 - jaccard * m``.

    ``m`` = 1 if the sets are equal, 0.67 if one is a proper subset of the other, 0.33 if they
    intersect with neither containing the other, 0 if they are disjoint. Two empty sets are
    identical: distance 0. (An empty and a non-empty set have Jaccard 0: distance 1.)
    """
    a, b = set(set_a), set(set_b)
    if a == b:
        return 0.0
    common = len(a & b)
    jaccard = common / len(a | b)
    if a <= b or b <= a:
        monotonicity = 0.67
    elif common:
        monotonicity = 0.33
    else:
        monotonicity = 0.0
    return 1.0 - jaccard * monotonicity


def _node(value: Any) -> Any:
    """Node ids as ints when they hold an integer (JSON object keys are strings), else unchanged."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def _out_sets(annotation: Mapping[Any, Iterable[Any] | None]) -> dict[Any, set]:
    return {_node(node): {_node(out) for out in (outs or ())} for node, outs in annotation.items()}


def dag_masi_agreement(annotation_a: Mapping[Any, Iterable[Any] | None], annotation_b: Mapping[Any, Iterable[Any] | None]) -> float:
    """``1 - mean MASI distance`` between the out-node sets of each node of two DAG annotations.

    Each annotation maps ``node -> out-nodes`` (the steps that need it; MATEO's ``graph``). The
    mean runs over the union of the nodes (keys) of both annotations; a node missing from one
    annotation has an empty out-set there. Node ids that hold integers are compared as integers
    (``"3"`` and ``3`` are the same node). Two empty annotations agree fully (1.0).
    """
    a, b = _out_sets(annotation_a), _out_sets(annotation_b)
    nodes = set(a) | set(b)
    if not nodes:
        return 1.0
    return 1.0 - float(np.mean([masi_distance(a.get(n, set()), b.get(n, set())) for n in nodes]))


# ---------------------------------------------------------------- dataset statistics
def _summary(values: Sequence[float]) -> dict[str, float] | None:
    if not len(values):
        return None
    return {"mean": float(np.mean(values)), "median": float(np.median(values)),
            "min": float(np.min(values)), "max": float(np.max(values))}


def procedure_statistics(procedures: Sequence[Any], limit: int = 1000) -> dict[str, Any]:
    """Size and DAG structure of a set of procedures (objects with ``steps`` and ``dag``).

    Keys (DAG keys are computed over the procedures that have a DAG; ``None`` if none has one):

    * ``num_procedures``, ``num_with_dag``, ``total_steps``;
    * ``steps_per_procedure``: mean/median/min/max;
    * ``total_edges`` and ``edges_per_procedure`` (mean/median/min/max): the DAG edges as
      annotated, duplicates counted once (redundant transitive edges are kept);
    * ``mean_out_degree_branching``: mean out-degree over the nodes with at least one out-edge
      (the branching factor of the nodes that branch at all), pooled over all procedures;
    * ``mean_out_degree_all``: mean out-degree over all nodes (= edges / steps), pooled;
    * ``independent_pair_share``: share of unordered step pairs with no directed path either way,
      pooled over all procedures;
    * ``linear_extensions``: mean/median/min/max number of valid execution orders per procedure,
      each count capped at ``limit``; ``num_capped`` = how many procedures reached the cap.
    """
    steps = [len(p.steps) for p in procedures]
    with_dag = [p for p in procedures if p.dag is not None]
    stats: dict[str, Any] = {
        "num_procedures": len(procedures),
        "num_with_dag": len(with_dag),
        "total_steps": int(sum(steps)),
        "steps_per_procedure": _summary(steps),
    }
    edge_counts, out_degrees, extension_counts = [], [], []
    independent_pairs = total_pairs = capped = 0
    for proc in with_dag:
        n = len(proc.steps)
        edges = sorted({(int(a), int(b)) for a, b in proc.dag})
        edge_counts.append(len(edges))
        out_degree = np.bincount([a for a, _ in edges], minlength=n)
        out_degrees.extend(out_degree.tolist())
        reach = dag_utils.transitive_closure(n, edges)
        linked = reach | reach.T
        independent_pairs += int((~linked[np.triu_indices(n, 1)]).sum())
        total_pairs += n * (n - 1) // 2
        try:
            extension_counts.append(dag_utils.count_linear_extensions(n, edges, limit=limit))
        except dag_utils.TooManyOrdersError:
            extension_counts.append(limit)
            capped += 1
    branching = [d for d in out_degrees if d > 0]
    stats.update({
        "total_edges": int(sum(edge_counts)) if with_dag else None,
        "edges_per_procedure": _summary(edge_counts),
        "mean_out_degree_branching": float(np.mean(branching)) if branching else (0.0 if with_dag else None),
        "mean_out_degree_all": float(np.mean(out_degrees)) if out_degrees else None,
        "independent_pair_share": independent_pairs / total_pairs if total_pairs else None,
        "linear_extensions": None if not with_dag else {**_summary(extension_counts), "limit": limit, "num_capped": capped},
    })
    return stats
