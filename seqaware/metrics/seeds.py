"""Figures over seeds: mean +- sample std, and the seed-matched gap between two arms with its 95% interval.

A results page that says "Y beats N" names the seeds and this interval (``docs/results/``): the gap of each seed
``d_s = Y_s - N_s`` over the seeds both arms ran, its mean, the sample standard deviation, Student's t interval
``mean +- t(0.975, n - 1) * std / sqrt(n)`` (two-sided 95%; none for one seed) and the number of seeds where Y > N.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from scipy import stats


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; 0 for one value)."""
    if not values:
        raise ValueError("mean_std of no values")
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


@dataclass(frozen=True)
class Gap:
    """The seed-matched gap ``Y - N`` (see the module docstring)."""

    mean: float
    std: float
    low: float          # 95% interval; nan for one seed
    high: float
    n: int              # seeds both arms ran
    wins: int           # seeds where Y > N

    def text(self, digits: int = 2) -> str:
        """``+12.00 ± 9.87 (95% CI [-12.5, +36.5]; Y > N on 3 of 3 seeds)``."""
        f = f"{{:+.{digits}f}}"
        ci = (f"95% CI [{f.format(self.low)}, {f.format(self.high)}]; " if self.n > 1 else "one seed, no interval; ")
        return f"{f.format(self.mean)} ± {self.std:.{digits}f} ({ci}Y > N on {self.wins} of {self.n} seeds)"


def interval95(values: Sequence[float]) -> tuple[float, float]:
    """Student's t 95% interval of the mean of ``values`` (nan, nan for fewer than two)."""
    if len(values) < 2:
        return math.nan, math.nan
    mean, std = mean_std(values)
    half = float(stats.t.ppf(0.975, len(values) - 1)) * std / math.sqrt(len(values))
    return mean - half, mean + half


def std_interval95(values: Sequence[float]) -> tuple[float, float]:
    """The 95% interval of the standard deviation behind ``values`` (chi-square with n - 1 degrees of freedom,
    normal values assumed): ``s * sqrt((n - 1) / chi2(0.975, n - 1))`` to ``s * sqrt((n - 1) / chi2(0.025, n - 1))``.
    With 5 seeds it runs from 0.60 to 2.87 times the sample std: what a "std <= 5 over 5 seeds" target can decide."""
    if len(values) < 2:
        return math.nan, math.nan
    dof = len(values) - 1
    _, std = mean_std(values)
    return (std * math.sqrt(dof / float(stats.chi2.ppf(0.975, dof))),
            std * math.sqrt(dof / float(stats.chi2.ppf(0.025, dof))))


def seed_matched_gap(y: Mapping[int, float], n: Mapping[int, float]) -> Gap:
    """``Y - N`` over the seeds both ``y`` and ``n`` (seed -> value) hold."""
    seeds = sorted(set(y) & set(n))
    if not seeds:
        raise ValueError(f"no seed in common: Y has {sorted(y)}, N has {sorted(n)}")
    diffs = [float(y[s]) - float(n[s]) for s in seeds]
    mean, std = mean_std(diffs)
    low, high = interval95(diffs)
    return Gap(mean, std, low, high, len(diffs), sum(d > 0 for d in diffs))
