"""OmegaConf resolvers used by the Hydra configs (registered on import; idempotent)."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MODALITIES = ("text", "image", "multimodal")


def _check_modality(modality: str) -> str:
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    return modality


def register_resolvers() -> None:
    resolvers = {
        # the checkout (or installed package) root; configs resolve relative paths against it
        "project_root": lambda: str(PROJECT_ROOT),
        "uses_text": lambda m: _check_modality(m) in ("text", "multimodal"),
        "uses_images": lambda m: _check_modality(m) in ("image", "multimodal"),
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_resolvers()
