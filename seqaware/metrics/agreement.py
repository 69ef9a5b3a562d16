"""Annotation agreement and dataset statistics for orders and dependency DAGs.

* Orders: Cohen's kappa on pairwise-relation encodings (:func:`seqaware.metrics.ordering.order_kappa`,
  Wu et al. 2022, appendix B.3.1), averaged over annotator pairs (:func:`mean_pairwise_kappa`),
  and the agreement of annotators who each mark several alternative orders valid
  (:func:`alternative_order_agreement`).
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
from seqaware.metrics.ordering import binary_kappa, order_kappa, pairwise_relations


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


def majority_relations(alternatives: Sequence[Sequence[Hashable]], items: Sequence[Hashable] | None = None) -> np.ndarray:
    """An annotator's pairwise-relation encoding: the majority over the orders they marked valid.

    For each pair (in the pair order of :func:`pairwise_relations`), 1 if more than half of the
    annotator's alternatives put the first item before the second, 0 if fewer than half; on an
    exact tie the relation of the annotator's *first* alternative is kept (annotators usually list
    the order they started from first).
    """
    if not alternatives:
        raise ValueError("an annotator needs at least one order")
    canonical = list(items) if items is not None else sorted(alternatives[0])
    encodings = np.stack([pairwise_relations(order, canonical) for order in alternatives])
    votes = 2 * encodings.sum(axis=0) - len(alternatives)  # > 0: majority says "before"
    return np.where(votes > 0, 1, np.where(votes < 0, 0, encodings[0])).astype(np.int64)


def alternative_order_agreement(alternatives_by_annotator: Mapping[Any, Sequence[Sequence[Hashable]]] | Sequence[Sequence[Sequence[Hashable]]],
                                items: Sequence[Hashable] | None = None) -> float:
    """Agreement of annotators who each marked one or more orders of an instance valid.

    Our reading of Wu et al. (2022), Algorithm 1 (alternative-order annotation agreement): the
    paper measures agreement with Cohen's kappa on the pairwise-relation encoding of orders
    (appendix B.3.1), and an annotator who proposes several alternatives expresses, for each pair
    of steps, the relation that most of those alternatives share. So:

    1. each annotator's set of valid orders is reduced to one encoding by a per-pair majority
       vote (:func:`majority_relations`; ties keep the annotator's first order);
    2. Cohen's kappa (:func:`binary_kappa`, the same formula and edge cases as ``order_kappa``)
       is computed between every pair of annotators' encodings;
    3. the agreement is the mean over annotator pairs.

    With one order per annotator this is exactly :func:`mean_pairwise_kappa`. We chose the
    majority encoding (rather than, e.g., a per-pair "either order allowed" third class) because
    it keeps kappa binary and comparable with the single-order agreement.
    """
    annotators = _annotator_values(alternatives_by_annotator)
    if any(not alternatives for alternatives in annotators):
        raise ValueError("every annotator needs at least one order")
    canonical = list(items) if items is not None else sorted(annotators[0][0])
    encodings = [majority_relations(alternatives, canonical) for alternatives in annotators]
    return float(np.mean([binary_kappa(a, b) for a, b in itertools.combinations(encodings, 2)]))


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
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
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
