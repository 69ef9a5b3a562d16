"""OmegaConf resolvers used by the Hydra configs (registered on import; idempotent)."""
from __future__ import annotations

import os
from pathlib import Path

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MODALITIES = ("text", "image", "multimodal")


def to_plain(value: Any) -> Any:
    """An OmegaConf container (interpolations resolved) as plain dicts / lists; anything else as it is.
    Used wherever configs become hyper-parameters, options or cache keys."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _check_modality(modality: str) -> str:
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    return modality


CPU_BF16_ENV = "SEQAWARE_CPU_BF16"
"""``SEQAWARE_CPU_BF16=0`` makes :func:`cpu_has_fast_bf16` answer False (``1``: True) whatever the CPU: a bf16
machine then picks the fp32 defaults an fp32-only CPU would (e.g. to run the test suite as such a CPU does)."""


def cpu_has_fast_bf16() -> bool:
    """True when the CPU has bf16 matrix instructions (AMX or AVX512-BF16): bf16 autocast is then
    about 2x faster than fp32 for transformer encoders; without them it is slower.
    ``SEQAWARE_CPU_BF16=0|1`` overrides the answer (:data:`CPU_BF16_ENV`)."""
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ValueError(f"{CPU_BF16_ENV} must be 0 or 1, got {forced!r}")
    try:
        import torch

        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except (OSError, RuntimeError, AttributeError):
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def auto_precision(accelerator: str = "cpu") -> str:
    """Lightning precision for ``trainer.precision: ${auto_precision:${trainer.accelerator}}``:
    ``bf16-mixed`` on GPUs and on CPUs with fast bf16, ``32-true`` otherwise."""
    if accelerator in ("gpu", "cuda"):
        return "bf16-mixed"
    if accelerator == "auto":
        import torch

        if torch.cuda.is_available():
            return "bf16-mixed"
    return "bf16-mixed" if cpu_has_fast_bf16() else "32-true"


def register_resolvers() -> None:
    resolvers = {
        # the checkout (or installed package) root; configs resolve relative paths against it
        "project_root": lambda: str(PROJECT_ROOT),
        "uses_text": lambda m: _check_modality(m) in ("text", "multimodal"),
        "uses_images": lambda m: _check_modality(m) in ("image", "multimodal"),
        "auto_precision": auto_precision,
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    if not OmegaConf.has_resolver("run_dir"):
        from seqaware.runs import new_run_dir

        # cached: every read of hydra.run.dir in a process gives the one folder reserved for the run
        OmegaConf.register_new_resolver("run_dir", new_run_dir, use_cache=True)


register_resolvers()
