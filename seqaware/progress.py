"""Training progress bar that also moves on slow steps.

Lightning's ``TQDMProgressBar`` redraws every ``refresh_rate`` batches: with ``refresh_rate=10`` and
a 20-second CPU step the bar sits still for over three minutes, and a first epoch looks hung.
:class:`TimedProgressBar` redraws at a batch end when ``refresh_rate`` batches have passed *or*
``refresh_seconds`` of wall time have passed since its last redraw, whichever comes first. A redraw
can only happen at a batch boundary (the counter cannot move inside a step).
"""
from __future__ import annotations

import time

from pytorch_lightning.callbacks import TQDMProgressBar


class TimedProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` that redraws at least every ``refresh_seconds`` of wall time (None: never by time).

    ``refresh_rate=0`` turns the bars off, as for Lightning's bar.
    """

    def __init__(self, refresh_rate: int = 10, refresh_seconds: float | None = 5.0, process_position: int = 0,
                 leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        if refresh_seconds is not None and refresh_seconds < 0:
            raise ValueError(f"refresh_seconds must be >= 0 or null, got {refresh_seconds}")
        self.refresh_seconds = refresh_seconds
        self._last_redraw = time.monotonic()

    def _should_update(self, current: int, total: int) -> bool:
        if not self.is_enabled:
            return False
        now = time.monotonic()
        due = super()._should_update(current, total) or (
            self.refresh_seconds is not None and now - self._last_redraw >= self.refresh_seconds)
        if due:
            self._last_redraw = now
        return due
