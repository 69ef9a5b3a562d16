"""Checkpoints: written atomically, read safely.

Writing: an interrupted save never corrupts an existing checkpoint (temporary file + ``os.replace``).

Reading: every checkpoint is unpickled with ``torch.load(..., weights_only=True)`` (tensors and plain
containers only: a crafted file cannot run code on load), and the ``_target_`` entries of a
checkpoint's hyper-parameters -- which ``load_from_checkpoint`` turns into objects -- must name a
class or function of an allow-listed package (:data:`ALLOWED_TARGETS`): seqaware's own packages and
the library entry points the configs in ``configs/`` use.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Iterator

import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from seqaware.io import atomic_open

ALLOWED_TARGETS: tuple[str, ...] = (
    # the project's own packages
    "seqaware", "decoders", "data_modules",
    # what configs/ targets (and the neighbours a user picks on the command line)
    "torch.optim",                      # optimisers and torch.optim.lr_scheduler
    "torch.distributed.fsdp.wrap",      # trainer=fsdp auto-wrap policy
    "transformers.optimization",
    *(f"transformers.{name}" for name in (
        "get_constant_schedule", "get_constant_schedule_with_warmup", "get_cosine_schedule_with_warmup",
        "get_cosine_with_hard_restarts_schedule_with_warmup", "get_linear_schedule_with_warmup",
        "get_polynomial_decay_schedule_with_warmup", "get_inverse_sqrt_schedule", "get_wsd_schedule")),
    "pytorch_lightning.Trainer", "pytorch_lightning.callbacks", "pytorch_lightning.loggers",
    "pytorch_lightning.strategies",
    "hydra.utils.get_class",            # returns a class without calling it; its ``path`` is checked too
    "optuna.samplers",                  # hparams_search=optuna_tpe (the sweeper's sampler)
    # Hydra launcher / sweeper plugins of hydra/launcher=slurm|local and hparams_search=optuna_tpe
    "hydra_plugins.seqaware_submitit", "hydra_plugins.seqaware_optuna_sweeper", "hydra_plugins.hydra_submitit_launcher",
)
"""Dotted prefixes a ``_target_`` may start with (a whole name component: ``torch.optim`` allows
``torch.optim.AdamW``, not ``torch.optimizer_hack``)."""

# classes that hydra.utils.get_class may resolve in configs (FSDP wrap units); never called by it
_GET_CLASS_PATHS: tuple[str, ...] = ALLOWED_TARGETS + ("transformers.models", "torch.nn")


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds something that is not loaded on purpose (code, or a non-allow-listed target)."""


def _allowed(target: str, prefixes: tuple[str, ...]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def _targets(obj: Any, where: str = "") -> Iterator[tuple[str, Any, dict]]:
    """(key path, target, node) of every ``_target_`` in nested dicts / lists."""
    if isinstance(obj, dict):
        if "_target_" in obj:
            yield where or "<root>", obj["_target_"], obj
        for key, value in obj.items():
            yield from _targets(value, f"{where}.{key}" if where else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _targets(value, f"{where}[{i}]")


def check_targets(hparams: Any, source: str | os.PathLike = "<hyper-parameters>") -> None:
    """Raise :class:`UnsafeCheckpointError` if any ``_target_`` in ``hparams`` is not allow-listed."""
    for where, target, node in _targets(hparams):
        name = target if isinstance(target, str) else repr(target)
        ok = isinstance(target, str) and _allowed(target, ALLOWED_TARGETS)
        if ok and target == "hydra.utils.get_class":
            path = node.get("path")
            ok, name = isinstance(path, str) and _allowed(path, _GET_CLASS_PATHS), f"get_class({path!r})"
        if not ok:
            raise UnsafeCheckpointError(
                f"{source}: refusing to build {name} (hyper-parameter '{where}._target_'): only classes of "
                f"{', '.join(ALLOWED_TARGETS[:3])} and the libraries the configs use are built from a checkpoint "
                f"(seqaware.checkpoint_io.ALLOWED_TARGETS). If you trust this file and need that class, build the "
                f"module from your config instead of load_from_checkpoint.")


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", check_hparams: bool = True) -> Any:
    """``torch.load(path, weights_only=True)`` with a message naming the file when it holds code or
    non-tensor objects; with ``check_hparams`` also :func:`check_targets` on its hyper-parameters."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(
            f"{path}: refusing to load: it holds Python objects other than tensors and plain containers, which "
            f"torch.load(weights_only=True) does not execute (a crafted file can run code when unpickled). "
            f"Re-save it as a plain state dict (torch.save(model.state_dict(), ...)). Details: {err}") from err
    if check_hparams and isinstance(obj, dict):
        for key in ("hyper_parameters", "datamodule_hyper_parameters"):
            check_targets(obj.get(key), f"{path} ({key})")
    return obj


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a temporary file beside the target, then ``os.replace`` it into place;
    reading goes through :func:`load_checkpoint` (``weights_only=True``, allow-listed targets)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not support storage_options, got {storage_options}")
        with atomic_open(Path(path), "wb") as handle:
            torch.save(checkpoint, handle)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if weights_only is False:
            raise UnsafeCheckpointError(f"{path}: seqaware loads checkpoints with weights_only=True only")
        return load_checkpoint(path, map_location=map_location or (lambda storage, loc: storage))
