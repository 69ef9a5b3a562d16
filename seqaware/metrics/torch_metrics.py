"""torchmetrics wrapper of the ordering metrics, for logging from Lightning modules (DDP-synchronised).

Kept apart from :mod:`seqaware.metrics.ordering` so that importing the pure metric functions does
not import torchmetrics.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torchmetrics import Metric

from seqaware.metrics.ordering import _ORDER_GROUPS, _accumulate, _check_reference_selection, _empty_totals, _finalize


class OrderingMetrics(Metric):
    """torchmetrics wrapper around :func:`corpus_order_metrics`.

    ``update(preds, references, dags=None)`` takes Python lists exactly like
    :func:`corpus_order_metrics`; the metric keeps only sums and counts (float64 tensor states
    with ``dist_reduce_fx="sum"``, a fixed set of states, so it synchronises under DDP), and
    ``compute()`` returns the same dict as :func:`corpus_order_metrics` over every instance seen
    since the last ``reset()``, each value a 0-dim float64 tensor (ready for ``log_dict``).
    Keys of empty subsets are absent. ``reference_selection`` (``joint`` | ``wu2022``) picks the
    reference each instance is scored against, as in :func:`corpus_order_metrics`.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    #: state name -> accumulation group of :func:`_empty_totals`
    _STATES = {f"sum_{group}": group for group in (*_ORDER_GROUPS, "dag")} | {"counts": "counts"}

    def __init__(self, reference_selection: str = "joint", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reference_selection = _check_reference_selection(reference_selection)
        for state, group in self._STATES.items():
            size = len(_empty_totals()[group])
            self.add_state(state, default=torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Sequence, references: Sequence, dags: Sequence | None = None) -> None:
        """Score a batch of instances and add their scores to the running sums."""
        totals = _accumulate(preds, references, dags, self.reference_selection)
        for state, group in self._STATES.items():
            value = getattr(self, state)
            value += torch.as_tensor(totals[group], dtype=value.dtype, device=value.device)

    def compute(self) -> dict[str, torch.Tensor]:
        """The corpus metrics over everything seen, as 0-dim float64 tensors."""
        totals = {group: getattr(self, state).detach().cpu().numpy() for state, group in self._STATES.items()}
        device = self.counts.device
        return {k: torch.tensor(v, dtype=torch.float64, device=device) for k, v in _finalize(totals).items()}
