"""Patch-swap prediction (PISP, Wu et al. 2022, sec. 4.2).

With probability ``delta`` per sample, two distinct steps with images are chosen, ``M`` is drawn
uniformly from ``[1, w]`` and ``M`` patches of EACH image are selected independently (the two index
sets may differ; each is the first ``M`` of an argsort of noise).  The k-th selected patch of the
first image is exchanged with the k-th selected patch of the second.  A binary head on [CLS]
predicts whether a swap happened.

``w`` is the image's number of patches (Wu et al. 2022, sec. 4.2.2 "Patch-Based": "each image I_i is
cropped into w patches ... we randomly select M (ranging from 1 to w) number of patches"), the
default (``max_patches=None``).  With a ``patch_mask`` only real patches are selected and ``w`` is
the smaller number of real patches of the two images, so padding never moves.  ``max_patches=K``
(seqaware's earlier default, K = 7) is a named deviation: ``M`` is drawn from ``[1, K]`` and then
clipped to the real patches of both images.  Everything is vectorised over the batch.
"""
from __future__ import annotations

from typing import Optional

import torch

from seqaware.objectives.base import SwapClassificationObjective, choose_image_pair, randint, shallow_copy, uniform
from seqaware.objectives.registry import register_objective


@register_objective
class PatchSwapPrediction(SwapClassificationObjective):
    """PISP objective.

    Targets: ``pisp_labels (B,)`` long, ``pisp_steps (B, 2)`` (-1 where not swapped),
    ``pisp_num_patches (B,)`` = M (0 where not swapped) and ``pisp_swapped (B, S, P)`` bool, the
    positions whose features were replaced.
    """

    name = "pisp"
    corrupts = frozenset({"patches"})
    target_layout = {"pisp_labels": ("sample", None), "pisp_steps": ("sample", None),
                     "pisp_num_patches": ("sample", None), "pisp_swapped": ("step", False)}

    def __init__(self, hidden_size: int, delta: float = 0.5, max_patches: Optional[int] = None,
                 head_hidden: Optional[int] = None):
        super().__init__(hidden_size, delta=delta, head_hidden=head_hidden)
        if max_patches is not None and (isinstance(max_patches, bool) or int(max_patches) != max_patches
                                        or max_patches < 1):
            raise ValueError(f"pisp: max_patches must be null (M ~ U[1, w], w = the image's patches, "
                             f"Wu et al. 2022) or an integer >= 1, got {max_patches!r}")
        self.max_patches = None if max_patches is None else int(max_patches)

    def corrupt(self, batch: dict, generator: torch.Generator) -> tuple[dict, dict]:
        feats = batch["visual_feats"]
        B, S, P, D = feats.shape
        device = feats.device
        swap, first, second = choose_image_pair(batch["visual_mask"], self.delta, generator)
        rows = torch.arange(B, device=device)
        patch_mask = batch.get("patch_mask")
        if patch_mask is None:
            valid_a = valid_b = torch.ones(B, P, dtype=torch.bool, device=device)
        else:
            valid_a, valid_b = patch_mask[rows, first].bool(), patch_mask[rows, second].bool()

        w = torch.minimum(valid_a.sum(1), valid_b.sum(1))  # (B,) patches both images can give
        if self.max_patches is None:  # paper: M ~ U[1, w] per sample
            u = uniform((B,), generator, device).double()
            m = torch.minimum((u * w).floor().long() + 1, w)  # floor(u w) in [0, w - 1]; 0 where w == 0
        else:  # named deviation: M ~ U[1, max_patches], clipped to w
            m = torch.minimum(randint(1, self.max_patches + 1, (B,), generator, device), w)
        swap = swap & (m > 0)  # an image without real patches cannot take part in a swap
        m = torch.where(swap, m, torch.zeros_like(m))

        # order_x[:, k] = k-th selected patch of image x; rank_x[:, p] = where patch p sits in it
        order_a = uniform((B, P), generator, device).masked_fill(~valid_a, 2.0).argsort(dim=1)
        order_b = uniform((B, P), generator, device).masked_fill(~valid_b, 2.0).argsort(dim=1)
        rank_a, rank_b = order_a.argsort(dim=1), order_b.argsort(dim=1)
        take_a = rank_a < m[:, None]  # (B, P) patches of image a that receive a patch of b
        take_b = rank_b < m[:, None]

        feats_a, feats_b = feats[rows, first], feats[rows, second]  # (B, P, D)
        src_for_a = order_b.gather(1, rank_a)  # patch of b paired with each patch of a
        src_for_b = order_a.gather(1, rank_b)
        new_a = torch.where(take_a[..., None], feats_b.gather(1, src_for_a[..., None].expand(B, P, D)), feats_a)
        new_b = torch.where(take_b[..., None], feats_a.gather(1, src_for_b[..., None].expand(B, P, D)), feats_b)

        new_feats = feats.clone()
        swapped = torch.zeros(B, S, P, dtype=torch.bool, device=device)
        if S >= 2:  # first != second, so the two writes never collide
            new_feats[rows, first] = new_a
            new_feats[rows, second] = new_b
            swapped[rows, first] = take_a
            swapped[rows, second] = take_b

        corrupted = shallow_copy(batch)
        corrupted["visual_feats"] = new_feats
        steps = torch.stack([first, second], dim=1).masked_fill(~swap[:, None], -1)
        targets = {"pisp_labels": swap.long(), "pisp_steps": steps, "pisp_num_patches": m, "pisp_swapped": swapped}
        return corrupted, targets
