"""scripts/studies/isp_probe.py: the order probe reads order from features that carry it and not from noise;
the whole script runs on the synthetic default."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("isp_probe", ROOT / "scripts" / "studies" / "isp_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def batches(ordered: bool, count: int, seed: int) -> list[dict]:
    """Sequences of 4 images x 3 patches x 8 dims; with ``ordered`` each image adds a fixed vector to
    the one before (cumulative scenes), else every image is independent noise."""
    grow = torch.randn(8, generator=torch.Generator().manual_seed(123))  # the same world in every call
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        base = torch.randn(6, 1, 1, 8, generator=g)
        steps = torch.arange(4, dtype=torch.float)[None, :, None, None] * grow if ordered else 0
        feats = base + steps + 0.1 * torch.randn(6, 4, 3, 8, generator=g)
        mask = torch.ones(6, 4, dtype=torch.bool)
        mask[0, 3] = False  # a sequence with 3 images: its padding slot makes no pair
        out.append({"visual_feats": feats, "image_mask": mask})
    return out


def test_order_pairs_cover_every_ordered_pair_of_shown_images():
    x, y = probe.order_pairs(batches(True, 1, 0))
    assert x.shape == (5 * 12 + 6, 24)  # 4 images: 12 ordered pairs; 3 images: 6
    assert y.sum() == x.shape[0] / 2


def test_order_probe_reads_order_only_where_the_features_carry_it():
    assert probe.order_probe(batches(True, 8, 1), batches(True, 4, 2)) > 0.95
    assert abs(probe.order_probe(batches(False, 8, 1), batches(False, 4, 2)) - 0.5) < 0.15


@pytest.mark.slow
def test_script_runs_on_the_synthetic_default(capsys):
    probe.main(["--train-batches", "3", "--val-batches", "1", "--batch-size", "4", "--steps", "2",
                "--eval-every", "1", "--step-init-std", "0.02", "0.1"])
    out = capsys.readouterr().out
    assert "order probe" in out and "validation pair accuracy" in out
    assert "| 0.02 | ISP" in out and "| 0.1 | ISP" in out
