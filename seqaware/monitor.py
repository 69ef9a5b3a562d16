"""The metric a best checkpoint is chosen on.

Every Lightning module of the project declares it as class attributes (:class:`seqaware.modules.base.SeqawareModule`):
``monitor`` (a validation metric it logs, or None when it validates nothing) and ``monitor_mode`` (``max`` or
``min``), and lists what a validation may log (``validation_metrics()``).

* ``callbacks.model_checkpoint`` takes the model's own by default: ``monitor: ${checkpoint_monitor:${model._target_}}``
  and ``mode: ${checkpoint_mode:${model._target_}}`` (configs/callbacks/default.yaml; the resolvers are registered
  in :mod:`seqaware.config` and read :func:`declared_monitor`); an experiment that sets its own keeps it.
* :class:`MonitorCheck` (``callbacks.monitor_check``) refuses, when a fit is set up (before the module's own
  ``setup`` and any training step), a ``ModelCheckpoint`` monitoring a metric the module does not log, naming
  the configured key and the metrics the module logs, instead of Lightning's error at the end of the first
  validation.
"""
from __future__ import annotations

from typing import Optional

import pytorch_lightning as pl
from hydra.utils import get_class
from pytorch_lightning.callbacks import ModelCheckpoint

MODES = ("max", "min")


def declared_monitor(target: str) -> tuple[Optional[str], str]:
    """``(monitor, mode)`` the module class ``target`` (a ``_target_``) declares; a class without ``monitor``, or
    with a mode other than ``max`` / ``min``, is an error naming what to set."""
    cls = get_class(target)
    if not hasattr(cls, "monitor"):
        raise ValueError(f"{target} declares no checkpoint metric: give the class `monitor` (a validation metric it "
                         "logs, or None) and `monitor_mode` (max | min), or set callbacks.model_checkpoint.monitor "
                         "and callbacks.model_checkpoint.mode")
    mode = getattr(cls, "monitor_mode", "max")
    if mode not in MODES:
        raise ValueError(f"{target}.monitor_mode must be one of {MODES}, got {mode!r}")
    return cls.monitor, mode


class MonitorCheck(pl.Callback):
    """At the set-up of a fit, refuse every ``ModelCheckpoint`` whose ``monitor`` the module does not log.

    The module says what its validations log (``validation_metrics()``); a module without that method is not
    checked, nor is a ``train/...`` monitor (logged at every step).  ``key`` names the configured value in the
    message.
    """

    def __init__(self, key: str = "callbacks.model_checkpoint.monitor"):
        self.key = key

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not callable(getattr(pl_module, "validation_metrics", None)):
            return
        logged = list(pl_module.validation_metrics())
        for callback in trainer.callbacks:
            monitor = getattr(callback, "monitor", None) if isinstance(callback, ModelCheckpoint) else None
            if monitor is None or monitor.startswith("train/") or monitor in logged:
                continue
            own = getattr(type(pl_module), "monitor", None)
            raise ValueError(
                f"{self.key}={monitor}: {type(pl_module).__name__} does not log it, so no best checkpoint could be "
                f"chosen; it logs {', '.join(logged) if logged else 'no validation metric'}. Set {self.key} to one "
                f"of them, or drop the setting: the default is the model's own ({own})")
