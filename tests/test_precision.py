"""Gradient clipping with fused optimizers under mixed precision (SeqawareModule.configure_gradient_clipping).

Lightning refuses to clip for an optimizer that unscales inside ``step()`` (``fused=True`` AdamW, the
BERSON / pretraining default) under any mixed precision, bf16 included, so ``hparams=wu2022`` (clipping
1.0) crashed on every GPU and bf16 CPU.  These tests pin the fix: the fused optimizer takes exactly the
step the unfused one takes, clipped, under bf16-mixed and under a scaled 16-bit plugin.
"""
from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.plugins.precision import MixedPrecision
from torch import nn

from seqaware.modules.base import SeqawareModule


class _Regression(SeqawareModule):
    def __init__(self, fused: bool):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.fused = fused

    def training_step(self, batch, batch_idx):
        x, y = batch
        return ((self.layer(x) - y) ** 2).mean() * 50  # gradients far above the clip norm

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.1, fused=self.fused)


def _fit(fused: bool, clip: float | None, **precision) -> torch.Tensor:
    torch.manual_seed(0)
    model = _Regression(fused)
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, gradient_clip_val=clip, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **precision)
    grads = []
    # after the step the gradients are still those the optimizer stepped with (clipped, unscaled)
    model.on_train_batch_end = lambda *args: grads.append(
        float(torch.cat([p.grad.float().flatten() for p in model.parameters()]).norm()))
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
    return torch.cat([p.detach().float().flatten() for p in model.parameters()]), grads


FP16 = lambda: {"plugins": [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=4.0))]}  # noqa: E731


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed (scaled)"])
def test_fused_adamw_clips_like_the_unfused_one_under_mixed_precision(precision):
    kwargs = (lambda: {"precision": "bf16-mixed"}) if precision == "bf16-mixed" else FP16
    fused, fused_grads = _fit(True, 1.0, **kwargs())
    unfused, unfused_grads = _fit(False, 1.0, **kwargs())
    unclipped, unclipped_grads = _fit(False, None, **kwargs())
    # the optimizer stepped with the true gradients clipped to norm 1 (a scaled 16-bit gradient is 4x larger)
    assert all(abs(g - 1.0) < 1e-3 for g in fused_grads + unfused_grads), (fused_grads, unfused_grads)
    assert all(g > 10 for g in unclipped_grads), unclipped_grads
    torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(fused, unclipped)  # clipping took place


def test_fused_adamw_clips_in_fp32_as_before():
    fused, grads = _fit(True, 1.0, precision="32-true")
    unfused, _ = _fit(False, 1.0, precision="32-true")
    torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-6)
    assert all(abs(g - 1.0) < 1e-4 for g in grads)
