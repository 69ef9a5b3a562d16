"""Checkpoints: written atomically, read safely.

Writing: an interrupted save never corrupts an existing checkpoint (temporary file + ``os.replace``).

Reading: every checkpoint is unpickled with ``torch.load(..., weights_only=True)`` (tensors and plain
containers only: a crafted file cannot run code on load), and every ``_target_`` in a checkpoint's
hyper-parameters -- which ``load_from_checkpoint`` hands to Hydra's ``instantiate`` -- is checked by
:func:`check_targets` before anything is built (see its doc for the rule).
"""
from __future__ import annotations

import inspect
import os
import pickle
from pathlib import Path
from typing import Any, Iterator

import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from seqaware.io import atomic_open

OWN_PACKAGES: tuple[str, ...] = ("seqaware", "decoders", "data_modules")
"""Packages whose *classes* a checkpoint may build, when they are ``torch.nn.Module`` subclasses: the project's
Lightning modules, models, encoders, heads, objectives and decoders -- what a module's hyper-parameters hold.
A class that acts on files when built (``seqaware.vlm.runner.OutputCache`` truncates its file,
``data_modules.adapters.common.ImageStore`` creates its folder) is no module and is refused."""

LIBRARY_CLASS_PACKAGES: tuple[str, ...] = ("torch.optim",)
"""Library packages whose classes a checkpoint may build: torch's optimisers and ``torch.optim.lr_scheduler``
(what ``model.optimizer`` / ``model.scheduler`` name), subclasses of :data:`LIBRARY_CLASS_BASES` only."""


def _library_class_bases() -> tuple[type, ...]:
    return (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)

ALLOWED_FUNCTIONS: frozenset[str] = frozenset({
    # the encoder factory every module's ``encoder`` / ``net.encoder`` config names (builds a registered
    # encoder; its ``ckpt`` files are read with weights_only=True)
    "seqaware.encoders.create_encoder",
    # transformers' learning-rate schedules (``model.scheduler``; hparams=wu2022 uses the linear one):
    # they only wrap an optimiser in a LambdaLR
    *(f"transformers.optimization.{name}" for name in (
        "get_constant_schedule", "get_constant_schedule_with_warmup", "get_cosine_schedule_with_warmup",
        "get_cosine_with_hard_restarts_schedule_with_warmup", "get_cosine_with_min_lr_schedule_with_warmup",
        "get_linear_schedule_with_warmup", "get_polynomial_decay_schedule_with_warmup",
        "get_inverse_sqrt_schedule", "get_wsd_schedule")),
})
"""Functions (factories) a checkpoint may call, by the module that *defines* them and their name: an
exact list, because a function of the project's own packages may write files (``seqaware.io.write_jsonl``)."""

_IMPORTABLE_ROOTS: tuple[str, ...] = (*OWN_PACKAGES, "torch", "transformers")
"""Top-level packages :func:`resolve_target` imports to look a target up (no other module is imported)."""


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds something that is not loaded on purpose (code, or a target outside the rule)."""


def _in_package(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


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


def resolve_target(target: str) -> Any:
    """The object ``target`` names, looked up the way Hydra's ``instantiate`` does (``_locate``: import
    the first component, then attribute by attribute, importing submodules on the way), so the check
    sees exactly what would be called. Nothing is called; only modules of :data:`_IMPORTABLE_ROOTS` are
    imported. Raises :class:`LookupError` when the name does not resolve or its package is not importable here."""
    from hydra._internal.utils import _locate

    root = target.split(".", 1)[0]
    if root not in _IMPORTABLE_ROOTS:
        raise LookupError(f"package {root!r} is not one a checkpoint may build from")
    try:
        return _locate(target)
    except Exception as err:  # noqa: BLE001  (ImportError, ValueError of a malformed name)
        raise LookupError(f"{target!r} does not resolve ({type(err).__name__})") from err


def _defined_name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None) or '?'}.{getattr(obj, '__qualname__', None) or getattr(obj, '__name__', '?')}"


def target_refusal(target: Any) -> str | None:
    """Why ``target`` may not be built from a checkpoint, or None when it may (see :func:`check_targets`)."""
    if not isinstance(target, str):
        return f"a _target_ must be a dotted name, got {type(target).__name__}"
    try:
        obj = resolve_target(target)
    except LookupError as err:
        return str(err)
    module = getattr(obj, "__module__", None) or ""
    if inspect.isclass(obj):
        if _in_package(module, OWN_PACKAGES):
            if issubclass(obj, torch.nn.Module):
                return None
            return (f"it names the class {_defined_name(obj)}, which is not a torch.nn.Module (a checkpoint builds the "
                    "project's modules, models, encoders, heads, objectives and decoders only)")
        if _in_package(module, LIBRARY_CLASS_PACKAGES):
            if issubclass(obj, _library_class_bases()):
                return None
            return f"it names the class {_defined_name(obj)}, which is neither a torch optimiser nor a learning-rate scheduler"
        return f"it names the class {_defined_name(obj)}, which is not defined in {', '.join(OWN_PACKAGES + LIBRARY_CLASS_PACKAGES)}"
    if callable(obj) and _defined_name(obj) in ALLOWED_FUNCTIONS:
        return None
    kind = "function" if inspect.isroutine(obj) else type(obj).__name__
    return f"it names the {kind} {_defined_name(obj)}, which is not a class and not in ALLOWED_FUNCTIONS"


def check_targets(hparams: Any, source: str | os.PathLike = "<hyper-parameters>") -> None:
    """Raise :class:`UnsafeCheckpointError` naming the key path unless every ``_target_`` in ``hparams`` may be built.

    Each target is resolved to the object it names (:func:`resolve_target`, nothing called) and allowed when it is

    * a ``torch.nn.Module`` class defined in the project's packages (:data:`OWN_PACKAGES`), or an optimiser or
      learning-rate scheduler class of :data:`LIBRARY_CLASS_PACKAGES`, judged by the class's own
      ``__module__``: a name reached through another module (``seqaware.checkpoint_io.torch.load``) is judged
      by what it is;
    * or one of the factory functions of :data:`ALLOWED_FUNCTIONS`, by their defining module and name.

    Everything else -- any other function (``seqaware.io.write_jsonl``, ``torch.load``), a method, a
    class of another library, a name that does not resolve -- is refused before anything is built.
    """
    for where, target, _node in _targets(hparams):
        reason = target_refusal(target)
        if reason is not None:
            name = target if isinstance(target, str) else repr(target)
            raise UnsafeCheckpointError(
                f"{source}: refusing to build {name} (hyper-parameter '{where}._target_'): {reason}. A checkpoint may "
                f"only build torch.nn.Module classes of {', '.join(OWN_PACKAGES)}, optimisers and schedulers of "
                f"{', '.join(LIBRARY_CLASS_PACKAGES)}, and the "
                f"factories listed in seqaware.checkpoint_io.ALLOWED_FUNCTIONS; nothing was built. If you trust this "
                f"file, build the module from your config and load its state_dict instead of load_from_checkpoint.")


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
