"""Evaluation metrics: step ordering (:mod:`.ordering`), classification (:mod:`.classification`:
per-class and yes/no scores, baselines, tables), and the ISO/TEO/COHERENCE task metrics.

The sequencing task's metrics are one declared list, :data:`~seqaware.metrics.ordering.SEQUENCING_METRICS`,
that the logged metrics, the per-category reports, ``scripts/tools/score_predictions.py`` and the ``joint``
reference-selection rule (each entry says whether it ranks on it) read; the prompted tasks' tables have their
columns in ``TEO_COLUMNS``, ``ISO_COLUMNS`` and ``COHERENCE_COLUMNS``.  The ordering metrics are re-exported
here; the other modules are imported by name (``seqaware.metrics.classification``, ``seqaware.metrics.iso`` etc.).
"""
from seqaware.metrics.ordering import (
    DAG_KEYS,
    REFERENCE_SELECTIONS,
    SEQUENCING_METRICS,
    OrderMetric,
    corpus_order_metrics,
    dag_order_metrics,
    order_kappa,
    order_keys,
    order_metrics,
    pairwise_relations,
    ranked_metrics,
    select_reference,
)


def __getattr__(name: str):
    """``OrderingMetrics`` is imported on first use (torchmetrics is slow to import); ``ORDER_KEYS`` is
    :func:`order_keys`, read when asked."""
    if name == "OrderingMetrics":
        from seqaware.metrics.torch_metrics import OrderingMetrics

        return OrderingMetrics
    if name == "ORDER_KEYS":
        return order_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DAG_KEYS",
    "ORDER_KEYS",
    "OrderMetric",
    "OrderingMetrics",
    "REFERENCE_SELECTIONS",
    "SEQUENCING_METRICS",
    "corpus_order_metrics",
    "dag_order_metrics",
    "order_kappa",
    "order_keys",
    "order_metrics",
    "pairwise_relations",
    "ranked_metrics",
    "select_reference",
]
