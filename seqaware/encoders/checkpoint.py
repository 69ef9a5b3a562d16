"""Loading encoder weights saved by an earlier stage (pretraining -> fine-tuning).

Accepted files: a Lightning checkpoint (``{"state_dict": {"encoder.<name>": ...}}``, the encoder
being the module's ``encoder`` attribute) or a bare encoder state dict (``encoder.pt``, written by
the pretraining module at fit end).  ``model.encoder.ckpt=PATH`` loads the whole encoder;
``model.encoder.visual_ckpt=PATH`` only its visual backbone (``visual.*``), e.g. CLIP-ViL's tower
from an image-only pretraining run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

import torch
from torch import nn

from seqaware.checkpoint_io import load_checkpoint


def read_state(path: str | Path, prefix: str = "encoder.") -> dict[str, torch.Tensor]:
    """The tensors of ``path`` below ``prefix`` (prefix stripped); a bare state dict without any
    key under ``prefix`` is returned unchanged."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"encoder checkpoint not found: {path} (model.encoder.ckpt / visual_ckpt)")
    obj = load_checkpoint(path, check_hparams=False)  # weights_only=True: tensors and plain containers only
    state = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(state, dict) or not state:
        raise ValueError(f"{path}: expected a Lightning checkpoint or a state dict, got {type(obj).__name__}")
    if any(k.startswith(prefix) for k in state):
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def load_encoder_checkpoint(encoder: nn.Module, path: str | Path, prefix: str = "encoder.",
                            submodule: Optional[str] = None, fresh: Iterable[str] = ()) -> nn.Module:
    """Load the encoder (or its ``submodule``, e.g. ``visual``) weights from ``path`` strictly.

    A mismatch raises naming the file and the first missing / unexpected keys -- loading the wrong
    stage's checkpoint must not silently leave half the model random.  ``fresh``: state-dict keys of the
    whole encoder that keep the values the encoder was built with (the file must still hold them).
    """
    state = read_state(path, prefix)
    fresh = set(fresh)
    if fresh:
        lost = sorted(fresh - set(state))
        if lost:
            raise ValueError(f"{path} does not match the configured {type(encoder).__name__}: missing {lost[:5]}")
        state = {k: v for k, v in state.items() if k not in fresh}
    target: nn.Module = encoder
    if submodule:
        sub_prefix = submodule + "."
        if not any(k.startswith(sub_prefix) for k in state):
            raise ValueError(f"{path}: no '{prefix}{sub_prefix}*' tensors to initialise the {submodule} module from")
        state = {k[len(sub_prefix):]: v for k, v in state.items() if k.startswith(sub_prefix)}
        target = encoder.get_submodule(submodule)
    missing, unexpected = target.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in fresh]
    if missing or unexpected:
        raise ValueError(f"{path} does not match the configured {type(target).__name__}"
                         f"{' (' + submodule + ')' if submodule else ''}: missing {list(missing)[:5]}, "
                         f"unexpected {list(unexpected)[:5]}")
    return encoder
