#!/usr/bin/env python
"""How far pretraining moved an encoder from the backbones it started from, part by part.

    python scripts/studies/encoder_drift.py logs/label_efficiency/hard/pretrain-mlm_sop_smrm [RUN ...]

For each pretraining run folder (``encoder.pt`` + ``.hydra/config.yaml``), the encoder is built again from the
run's own config without its checkpoints (the raw backbones, exactly as N starts), and every floating-point
weight is compared with ``encoder.pt``: the relative change ``||W_Y - W_N|| / ||W_N||`` per part -- each
embedding matrix on its own (the word embeddings are the MLM decoder when ``tie_lm_head``), each transformer
layer, the visual tower, the rest. One markdown table per run and one ``ENCODER_DRIFT_JSON {...}`` line.
A diagnostic of issue #52 (why Y <= N): a part that moved far more than the others is where pretraining
rewrote what the backbone knew (docs/results/archive/label_efficiency.md, "Why Y <= N").
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Mapping, Optional

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MARKER = "ENCODER_DRIFT_JSON"


def part_of(key: str) -> str:
    """The part a weight belongs to: an embedding matrix by name, ``layer N``, ``visual`` or ``other``."""
    pieces = key.split(".")
    if "visual" in pieces[0]:
        return "visual"
    if "embeddings" in pieces:
        return ".".join(pieces[pieces.index("embeddings"):-1])
    if "layer" in pieces:
        index = pieces.index("layer") + 1
        if index < len(pieces) and pieces[index].isdigit():
            return f"layer {pieces[index]}"
    return "other"


def relative_drift(raw: Mapping[str, torch.Tensor], trained: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """``{part: ||W_trained - W_raw|| / ||W_raw||}`` over the floating-point weights both hold (norms over the
    whole part, not averaged per tensor)."""
    sums: dict[str, list[float]] = {}
    for key, weight in raw.items():
        if key not in trained or not weight.is_floating_point():
            continue
        delta = (trained[key].double() - weight.double()).pow(2).sum().item()
        total = weight.double().pow(2).sum().item()
        acc = sums.setdefault(part_of(key), [0.0, 0.0])
        acc[0] += delta
        acc[1] += total
    return {part: (d / n) ** 0.5 for part, (d, n) in sums.items() if n > 0}


def raw_encoder_state(run_dir: Path) -> dict[str, torch.Tensor]:
    """The pretrained-start weights of ``run_dir``'s encoder before any checkpoint: the raw backbones. The layers
    seqaware adds (``SequenceEncoder.new_parameters``: visual projection, step embedding) start random, so they
    have no start to drift from and are left out."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    import seqaware.config  # noqa: F401  (resolvers)

    cfg = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml").model.encoder, resolve=True)
    cfg.pop("ckpt", None)
    cfg.pop("visual_ckpt", None)
    encoder = instantiate(cfg, _recursive_=False)
    new = {id(p) for p in encoder.new_parameters()}
    skip = {name for name, p in encoder.named_parameters() if id(p) in new}
    return {k: v for k, v in encoder.state_dict().items() if k not in skip}


def table(run: str, drift: dict[str, float]) -> str:
    lines = [f"{run}", "", "| part | relative change |", "|---|---:|"]
    lines += [f"| {part} | {value:.4f} |" for part, value in sorted(drift.items())]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    runs = list(sys.argv[1:] if argv is None else argv)
    if not runs or any(r in ("-h", "--help") for r in runs):
        print(__doc__)
        return 0 if runs else 2
    out = {}
    for run in runs:
        run_dir = Path(run)
        if not (run_dir / "encoder.pt").is_file():
            raise SystemExit(f"{run_dir}: no encoder.pt (a finished pretraining run folder?)")
        trained = torch.load(run_dir / "encoder.pt", map_location="cpu", weights_only=True)
        out[run] = relative_drift(raw_encoder_state(run_dir), trained)
        print(table(run, out[run]) + "\n")
    print(MARKER, json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
