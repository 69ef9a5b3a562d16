"""The closure head's plan-level cross-validation scores (:mod:`seqaware.modules.teo_closure_head` docstring,
model selection): each fold answered at the threshold chosen on the other folds, the mean and spread over
folds, and the CPU thread limit the cross-validation fits run under."""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import numpy as np
import torch

from seqaware.metrics.classification import binary_report, choose_threshold

CV_METRICS = ("f1", "macro_f1", "accuracy")


def fold_scores(folds: Sequence[tuple[list[str], np.ndarray]], metric: str = "macro_f1") -> list[dict[str, float]]:
    """Score each fold's ``(gold, probabilities)`` at the threshold chosen on the other folds' pooled
    probabilities (:func:`choose_threshold`, ``metric``); returns per fold the :data:`CV_METRICS` and the threshold."""
    out = []
    for i, (gold, probs) in enumerate(folds):
        other_gold = [g for j, (gs, _) in enumerate(folds) if j != i for g in gs]
        other = np.concatenate([p for j, (_, p) in enumerate(folds) if j != i]) if len(folds) > 1 else probs
        tau = choose_threshold(other_gold or gold, list(other), metric=metric)[0]
        report = binary_report(gold, ["yes" if p >= tau else "no" for p in probs])
        out.append({**{k: float(report[k]) for k in CV_METRICS}, "threshold": tau})
    return out


def summarise(scores: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean and (population) standard deviation over folds of each of :data:`CV_METRICS`."""
    out = {}
    for key in CV_METRICS:
        values = np.array([s[key] for s in scores])
        out[f"{key}_mean"], out[f"{key}_std"] = float(values.mean()), float(values.std())
    return out


@contextlib.contextmanager
def cpu_threads(threads: Optional[int]):
    """``torch.set_num_threads(threads)`` inside the block (nothing when None), the old number restored after."""
    if threads is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(old)
