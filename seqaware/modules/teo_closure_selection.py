"""The closure head's plan-level cross-validation scores (:mod:`seqaware.modules.teo_closure_head` docstring,
model selection): each fold answered at the threshold chosen on the other folds, the mean and spread over
folds, the CPU thread limit the cross-validation fits run under, and their progress in the log."""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Optional, Sequence

import numpy as np
import torch

from seqaware.metrics.classification import binary_report, choose_threshold

CV_METRICS = ("f1", "macro_f1", "accuracy")

log = logging.getLogger(__name__)


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


class CVProgress:
    """The cross-validation's fits, one log line each as it ends: which fold of which setting, how long it took,
    and a forecast for the fits left (the mean time of those done so far); a first line says how many there are.

    ``folds``: the folds of each repetition; ``fits_per_fold``: the head fits of one fold (settings that differ
    only in ``blend`` share one)."""

    clock = staticmethod(time.monotonic)

    def __init__(self, settings: int, folds: Sequence[int], fits_per_fold: int, steps: int):
        self.settings, self.folds = settings, list(folds)
        self.total, self.done, self.spent = fits_per_fold * sum(self.folds), 0, 0.0
        self._start = self.clock()
        log.info(f"cross-validation: {settings} setting(s) x {sum(self.folds)} fold(s)"
                 + (f" over {len(self.folds)} repetitions" if len(self.folds) > 1 else "")
                 + f": {self.total} fits of {steps} steps" + (" (settings that differ only in blend share theirs)"
                                                               if fits_per_fold < settings else ""))

    def start(self) -> None:
        self._start = self.clock()

    def fitted(self, setting: int, fold: int, repeat: int = 0) -> str:
        """Log (and return) the line of the fit that just ended: ``setting``, ``fold`` (of its repetition) and
        ``repeat`` counted from 0."""
        took = self.clock() - self._start
        self.done, self.spent = self.done + 1, self.spent + took
        left = self.total - self.done
        where = f"fold {fold + 1}/{self.folds[repeat]}" + (
            f" of repetition {repeat + 1}/{len(self.folds)}" if len(self.folds) > 1 else "")
        rest = (f"forecast {self.spent / self.done * left / 60:.1f} min for the rest ({left} fit{'s' * (left > 1)})"
                if left else "cross-validation fits done")
        line = f"{where} of setting {setting + 1}/{self.settings} took {took:.1f} s; {rest}"
        log.info(line)
        return line
