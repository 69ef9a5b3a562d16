"""A callback that sends a real signal to its own process at a given training step, once: what a
cluster scheduler does before a time limit, at a reproducible point (tests/test_resume.py)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytorch_lightning as pl


class SignalAtStep(pl.Callback):
    """``os.kill(own pid, signum)`` after training step ``step``, unless ``marker`` exists (then the
    same command, run again, is not interrupted a second time)."""

    def __init__(self, step: int, marker: str, signum: str = "SIGTERM"):
        self.step, self.marker, self.signum = int(step), Path(marker), getattr(signal, signum)

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if trainer.global_step == self.step and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), self.signum)


class FailAtStep(pl.Callback):
    """Raise ``RuntimeError(message)`` after training step ``step``: a run that fails mid-fit."""

    def __init__(self, step: int, message: str = "a bug at this step"):
        self.step, self.message = int(step), message

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(self.message)
