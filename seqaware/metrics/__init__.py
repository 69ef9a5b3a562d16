"""Evaluation metrics: step ordering (:mod:`.ordering`), classification (:mod:`.classification`:
per-class and yes/no scores, baselines, tables), and the ISO/TEO/COHERENCE task metrics.

The ordering metrics are re-exported here; the other modules are imported by name
(``seqaware.metrics.classification``, ``seqaware.metrics.iso`` etc.).
"""
from seqaware.metrics.ordering import (
    DAG_KEYS,
    ORDER_KEYS,
    REFERENCE_SELECTIONS,
    corpus_order_metrics,
    dag_order_metrics,
    order_kappa,
    order_metrics,
    pairwise_relations,
    select_reference,
)


def __getattr__(name: str):
    """``OrderingMetrics`` is imported on first use (torchmetrics is slow to import)."""
    if name == "OrderingMetrics":
        from seqaware.metrics.torch_metrics import OrderingMetrics

        return OrderingMetrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DAG_KEYS",
    "ORDER_KEYS",
    "OrderingMetrics",
    "REFERENCE_SELECTIONS",
    "corpus_order_metrics",
    "dag_order_metrics",
    "order_kappa",
    "order_metrics",
    "pairwise_relations",
    "select_reference",
]
