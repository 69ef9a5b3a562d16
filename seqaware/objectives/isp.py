"""Image-swap prediction (ISP, Wu et al. 2022, sec. 4.2).

With probability ``delta`` per sample, the images of two distinct steps that both have an image
are swapped (all P feature vectors of each, together with every per-step visual entry such as
``visual_mask`` and ``patch_mask``); a binary head on [CLS] predicts whether a swap happened.
"""
from __future__ import annotations

from typing import Optional

import torch

from seqaware.objectives.base import STEP_KEYS, SwapClassificationObjective, choose_image_pair, shallow_copy
from seqaware.objectives.registry import register_objective


@register_objective
class ImageSwapPrediction(SwapClassificationObjective):
    """ISP objective.

    Targets: ``isp_labels (B,)`` long (1 = swapped) and ``isp_steps (B, 2)`` the swapped step
    indices (-1 for samples that were not swapped).
    """

    name = "isp"
    corrupts = frozenset({"images"})
    target_layout = {"isp_labels": ("sample", None), "isp_steps": ("sample", None)}

    def __init__(self, hidden_size: int, delta: float = 0.5, head_hidden: Optional[int] = None):
        super().__init__(hidden_size, delta=delta, head_hidden=head_hidden)

    def corrupt(self, batch: dict, generator: torch.Generator) -> tuple[dict, dict]:
        visual_mask = batch["visual_mask"]
        B, S = visual_mask.shape
        swap, first, second = choose_image_pair(visual_mask, self.delta, generator)
        # step permutation per sample: identity, with first <-> second where swap
        perm = torch.arange(S, device=visual_mask.device).expand(B, S).clone()
        perm.scatter_(1, first[:, None], torch.where(swap, second, first)[:, None])
        perm.scatter_(1, second[:, None], torch.where(swap, first, second)[:, None])

        corrupted = shallow_copy(batch)
        for key in STEP_KEYS:
            value = batch.get(key)
            if value is None:
                continue
            index = perm.view(B, S, *([1] * (value.dim() - 2))).expand_as(value)
            corrupted[key] = value.gather(1, index)
        steps = torch.stack([first, second], dim=1).masked_fill(~swap[:, None], -1)
        return corrupted, {"isp_labels": swap.long(), "isp_steps": steps}
