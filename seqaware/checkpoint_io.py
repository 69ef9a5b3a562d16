"""Checkpoints written atomically: an interrupted save never corrupts an existing checkpoint."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from seqaware.io import atomic_open


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a temporary file beside the target, then ``os.replace`` it into place."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not support storage_options, got {storage_options}")
        with atomic_open(Path(path), "wb") as handle:
            torch.save(checkpoint, handle)
