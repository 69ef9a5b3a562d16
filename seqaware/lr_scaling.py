"""The learning rate for another batch size than a recipe's own (``model.lr_scaling``).

A recipe's learning rates were chosen for its batch (``reference_batch`` instances per optimizer step); a run
whose steps hold ``b`` instances on average multiplies every learning rate (every parameter group's, the
encoder's and the head's alike) by ``(b / reference_batch) ** power``:

``sqrt`` (power 1/2)
    for Adam-type optimizers: Malladi et al., "On the SDEs and Scaling Rules for Adaptive Gradient
    Algorithms" (NeurIPS 2022), the square-root scaling rule (after Krizhevsky 2014, "One weird trick ...",
    and Hoffer et al. 2017, "Train longer, generalize better", for SGD).  The rule the ROC presets use.
    Its learning-rate part only: Malladi et al.'s whole rule also sets ``1 - beta`` to ``k (1 - beta)`` and
    ``eps`` to ``eps / sqrt(k)`` for ``k`` times the batch, which for MiniLM at ``k`` = 8.6 (beta1 0.14) gave
    test PMR 0.154 and 0.009 against 0.293 and 0.275 (docs/results/large_batch.md).
``linear`` (power 1)
    for SGD: Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour".

Goyal et al.'s warm-up goes with either: it lasts a share of the data seen (their 5 of 90 epochs), which
``model.scheduler.warmup_ratio`` keeps at any batch size, as it is a fraction of the run's optimizer steps.
``b`` is counted from the run's own training loader (:func:`instances_per_step`): its batch size, or the mean
of a token-budget batch sampler (``data.batch_tokens``), times processes and accumulated batches.  The loss is
a mean over the global batch (per step or per story: ``model.decoder.loss_norm``), so a gradient's scale does
not grow with the batch; only the noise falls, which is what the rules compensate.

No lr rule makes a batch well above the gradient noise scale as good at the same epochs: it needs more epochs
(McCandlish et al. 2018, section 2.3), and :mod:`seqaware.noise_scale` says how many from a run of the recipe's batch
(``scripts/studies/noise_scale.py``; docs/results/large_batch.md).
"""
from __future__ import annotations

import logging
from typing import Any, Optional

log = logging.getLogger(__name__)

RULES = {"sqrt": 0.5, "linear": 1.0}


def check_scaling(scaling: Optional[dict]) -> Optional[dict]:
    """``model.lr_scaling`` as a plain dict, or None; an unknown rule or a non-positive reference is an error."""
    if not scaling:
        return None
    scaling = dict(scaling)
    unknown = sorted(set(scaling) - {"rule", "reference_batch"})
    if unknown:
        raise ValueError(f"model.lr_scaling takes rule and reference_batch, not {unknown}")
    if scaling.get("rule") not in RULES:
        raise ValueError(f"model.lr_scaling.rule must be one of {list(RULES)}, got {scaling.get('rule')!r}")
    reference = scaling.get("reference_batch")
    if isinstance(reference, bool) or not isinstance(reference, (int, float)) or reference <= 0:
        raise ValueError(f"model.lr_scaling.reference_batch must be a positive number of instances per optimizer step "
                         f"(the recipe's batch), got {reference!r}")
    return scaling


def lr_factor(scaling: Optional[dict], per_step: float) -> float:
    """The factor on every learning rate for ``per_step`` instances per optimizer step (1 without scaling)."""
    scaling = check_scaling(scaling)
    if scaling is None:
        return 1.0
    return (float(per_step) / float(scaling["reference_batch"])) ** RULES[scaling["rule"]]


def instances_per_step(trainer: Any) -> float:
    """Mean training instances per optimizer step of the trainer's fit: the training loader's batch size (or its
    batch sampler's ``mean_batch_size`` / ``batch_size``) x processes x ``accumulate_grad_batches``."""
    if trainer.train_dataloader is None:   # configure_optimizers runs before the fit loop builds it
        trainer.fit_loop.setup_data()
    loader = trainer.train_dataloader
    sampler = getattr(loader, "batch_sampler", None)
    per_batch = getattr(sampler, "mean_batch_size", None) or getattr(loader, "batch_size", None) \
        or getattr(sampler, "batch_size", None)
    if not per_batch:
        raise ValueError("model.lr_scaling: the training loader has no batch size to scale by")
    return float(per_batch) * int(trainer.world_size) * int(trainer.accumulate_grad_batches)


def scale_learning_rates(scaling: Optional[dict], trainer: Any, opt_cfg: dict, groups: list[dict]) -> float:
    """Multiply ``opt_cfg["lr"]`` and every group's own ``lr`` in place by :func:`lr_factor` for this fit; returns
    the factor (1.0, nothing touched, without ``scaling``).  ``trainer``: the fit's trainer, or a function that
    returns it, called only with ``scaling`` (a module stepped by hand outside a fit has no trainer)."""
    if check_scaling(scaling) is None:
        return 1.0
    per_step = instances_per_step(trainer() if callable(trainer) else trainer)
    factor = lr_factor(scaling, per_step)
    opt_cfg["lr"] = float(opt_cfg["lr"]) * factor
    for group in groups:
        if "lr" in group:
            group["lr"] = float(group["lr"]) * factor
    log.info("model.lr_scaling: %.1f instances per optimizer step against the recipe's %s: every learning rate "
             "x %.3f (%s rule; the encoder's %.3g)", per_step, scaling["reference_batch"], factor, scaling["rule"],
             opt_cfg["lr"])
    return factor
