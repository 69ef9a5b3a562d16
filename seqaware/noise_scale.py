"""The gradient noise scale: how many instances a step can hold before a larger batch costs more epochs.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training" (2018).  With ``G`` the true
gradient and ``Sigma`` the per-instance gradient covariance, a batch of ``B`` instances gives a gradient whose
squared norm has expectation ``|G|^2 + tr(Sigma) / B`` (their section 2 and appendix A.1).  The simple noise
scale ``B_simple = tr(Sigma) / |G|^2`` estimates the critical batch size: to reach a given loss a run of batch
``B`` needs about ``S_min (1 + B_noise / B)`` steps and ``E_min (1 + B / B_noise)`` epochs (their section 2.3,
with their critical batch ``B_crit ~ B_noise``), so batches well under ``B_noise`` cost no extra epochs and
batches well over it cost epochs in proportion.

:func:`unbiased_terms` turns the squared norms of a small and a big batch's gradients into unbiased estimates
of ``|G|^2`` and ``tr(Sigma)`` (their appendix A.1); :func:`simple_noise_scale` is the ratio of their means over
many batches (the ratio of averages, as they recommend: each estimate alone is noisy and can be negative),
with a bootstrap interval over the batches; :func:`epoch_factor` is what section 2.3 predicts for the epochs a
batch of ``b_new`` needs against one of ``b_ref``.  ``scripts/studies/noise_scale.py`` measures a BERSON run's.
The model was derived for SGD; they report it to hold for Adam in practice, as a prediction to be checked.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence


def unbiased_terms(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """``(|G|^2, tr(Sigma))`` from ``small_sq = |G_small|^2`` and ``big_sq = |G_big|^2``, the squared norms of
    the gradients of a batch of ``b_small`` and of ``b_big`` instances (mean losses over their instances)."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small} and {b_big}")
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


@dataclass(frozen=True)
class NoiseScale:
    """``b_simple = trace / g2`` (instances) over ``batches`` big batches, with its bootstrap 95% interval
    (``low``, ``high``; ``inf`` where resampled ``g2`` means were not positive)."""
    b_simple: float
    g2: float
    trace: float
    low: float
    high: float
    batches: int


def _ratio(g2s: Sequence[float], traces: Sequence[float]) -> float:
    g2 = sum(g2s) / len(g2s)
    return math.inf if g2 <= 0 else sum(traces) / len(traces) / g2


def simple_noise_scale(terms: Sequence[tuple[float, float]], resamples: int = 2000, seed: int = 0) -> NoiseScale:
    """The ratio of the mean ``tr(Sigma)`` to the mean ``|G|^2`` over ``terms`` (one :func:`unbiased_terms` pair
    per big batch), and a percentile bootstrap over the big batches."""
    if len(terms) < 2:
        raise ValueError(f"the noise scale needs at least 2 big batches, got {len(terms)}")
    g2s, traces = [t[0] for t in terms], [t[1] for t in terms]
    rng = random.Random(seed)
    boot = []
    for _ in range(resamples):
        pick = [rng.randrange(len(terms)) for _ in terms]
        boot.append(_ratio([g2s[i] for i in pick], [traces[i] for i in pick]))
    boot.sort()
    low, high = boot[int(0.025 * (resamples - 1))], boot[int(math.ceil(0.975 * (resamples - 1)))]
    return NoiseScale(b_simple=_ratio(g2s, traces), g2=sum(g2s) / len(g2s), trace=sum(traces) / len(traces),
                      low=low, high=high, batches=len(terms))


def epoch_factor(b_new: float, b_ref: float, b_noise: float) -> float:
    """The epochs a batch of ``b_new`` instances needs for the loss a batch of ``b_ref`` reaches, relative to
    ``b_ref``'s: ``(1 + b_new / b_noise) / (1 + b_ref / b_noise)`` (McCandlish et al., section 2.3)."""
    if b_new <= 0 or b_ref <= 0 or b_noise <= 0:
        raise ValueError(f"batch sizes and the noise scale must be positive, got {b_new}, {b_ref}, {b_noise}")
    return (1.0 + b_new / b_noise) / (1.0 + b_ref / b_noise)


def run_epoch_factor(b_new: float, b_ref: float, noise_scales: Sequence[float],
                     steps: Optional[Sequence[float]] = None) -> float:
    """The epochs a batch of ``b_new`` needs for a whole run of ``b_ref``'s, relative to its: :func:`epoch_factor`
    at the noise scale of each stretch of the run, weighted by the stretch's share of the data (the trapezoid
    rule over ``noise_scales`` measured at ``steps`` of the ``b_ref`` run, its start and its end included;
    evenly spaced points without ``steps``).  The noise scale grows as the loss falls (McCandlish et al.,
    section 3), so early stretches, where it is small, cost a large batch the most."""
    if len(noise_scales) < 2:
        raise ValueError(f"need the noise scale at 2 or more points of the run, got {len(noise_scales)}")
    steps = list(range(len(noise_scales))) if steps is None else [float(x) for x in steps]
    if len(steps) != len(noise_scales) or any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"steps must rise and match the noise scales one to one, got {steps}")
    factors = [epoch_factor(b_new, b_ref, b) for b in noise_scales]
    area = sum((x1 - x0) * (f0 + f1) / 2 for x0, x1, f0, f1 in zip(steps, steps[1:], factors, factors[1:]))
    return area / (steps[-1] - steps[0])
