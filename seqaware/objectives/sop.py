"""Step-order prediction (SOP): a sequence signal for text, after ALBERT's sentence-order prediction.

ALBERT (Lan et al., ICLR 2020, sec. 3.1) asks whether two consecutive segments are in order or
swapped.  Here, with probability ``delta`` per sequence, two neighbouring steps that both have text
trade places -- whole steps: their tokens, the step index of each token (``text_step``) and every
per-step entry (the step's image, its mask, its patch mask) -- and a binary head on [CLS] predicts
whether a swap happened.  The separators and [CLS] stay where the packing put them, so a swapped
sequence is exactly the packing of the steps in the swapped order.  Wu et al. (2022) have no
text-side sequence objective (their text-only rows pretrain with MLM alone); this one gives the
text-only encoder one, and composes with every other objective: it declares ``corrupts =
{"step_order"}``, so the module applies it before MLM masks tokens (MLM's labels are the tokens at
their new places) and before any image objective.

Targets: ``sop_labels (B,)`` long (1 = swapped) and ``sop_steps (B, 2)``: the two step indices that
traded places, in their original order (-1 where nothing was swapped).

The label is not 1 with probability ``delta``: a sequence with fewer than two steps that have text is
never swapped (label 0), whatever the draw.  So ``P(label = 1) = delta x`` the share of sequences with
at least two text steps, and the chance level (the better constant answer, ``max(p, 1 - p)``, logged
from each split's own share of swapped sequences) is not ``max(delta, 1 - delta)`` wherever some
sequences have fewer: at ``delta = 0.5`` it is above 0.5.
"""
from __future__ import annotations

from typing import Optional

import torch

from seqaware.objectives.base import STEP_KEYS, SwapClassificationObjective, shallow_copy, uniform
from seqaware.objectives.registry import register_objective


def text_segments(attention_mask: torch.Tensor, text_step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's text as a segment: ``(segment (B, T), starts (B, T))``.

    A segment is a maximal run of real tokens with one ``text_step >= 0``; ``segment`` numbers them
    from 0 in packing order (-1 on separators and padding), ``starts`` marks each segment's first token.
    """
    content = attention_mask.bool() & (text_step >= 0)
    previous = torch.nn.functional.pad(text_step, (1, 0), value=-1)[:, :-1]
    prev_content = torch.nn.functional.pad(content, (1, 0), value=False)[:, :-1]
    starts = content & ~(prev_content & (previous == text_step))
    segment = torch.where(content, starts.long().cumsum(1) - 1, torch.full_like(text_step, -1))
    return segment, starts


@register_objective
class StepOrderPrediction(SwapClassificationObjective):
    """SOP (see the module docstring): ``delta`` the probability of a swap per sequence with at least two
    text steps (the others are never swapped, so the swapped share is ``delta`` x their share); the head
    is ``Linear(H, 2)`` on [CLS] or, with ``head_hidden``, a 2-layer MLP."""

    name = "sop"
    modalities = frozenset({"text"})
    corrupts = frozenset({"step_order"})
    target_layout = {"sop_labels": ("sample", None), "sop_steps": ("sample", None)}

    def __init__(self, hidden_size: int, delta: float = 0.5, head_hidden: Optional[int] = None):
        super().__init__(hidden_size, delta=delta, head_hidden=head_hidden)

    def corrupt(self, batch: dict, generator: torch.Generator) -> tuple[dict, dict]:
        ids, mask, text_step = batch["input_ids"], batch["attention_mask"], batch["text_step"]
        B, T = ids.shape
        device = ids.device
        segment, starts = text_segments(mask, text_step)
        n_seg = starts.sum(1)                                               # (B,) steps with text
        G = max(int(n_seg.max().item()) if B else 0, 1)
        # the step index of every segment (B, G); -1 past the sample's last one
        seg_step = torch.full((B, G), -1, dtype=torch.long, device=device)
        rows, cols = starts.nonzero(as_tuple=True)
        seg_step[rows, segment[rows, cols]] = text_step[rows, cols]

        # draw: swap or not, then one pair of neighbouring segments (j, j + 1) uniformly
        swap = (uniform((B,), generator, device) < self.delta) & (n_seg >= 2)
        pair_noise = uniform((B, G), generator, device)
        eligible = torch.arange(G, device=device)[None, :] < (n_seg - 1)[:, None]
        j = pair_noise.masked_fill(~eligible, -1.0).argmax(1)               # (B,) first segment of the pair
        j = torch.where(swap, j, torch.zeros_like(j))
        first = seg_step.gather(1, j[:, None])[:, 0]
        second = seg_step.gather(1, (j + 1).clamp(max=G - 1)[:, None])[:, 0]

        # new place of each segment: j <-> j + 1 where swapped
        seg_ids = torch.arange(G, device=device).expand(B, G)
        new_seg = torch.where(swap[:, None] & (seg_ids == j[:, None]), seg_ids + 1, seg_ids)
        new_seg = torch.where(swap[:, None] & (seg_ids == (j + 1)[:, None]), seg_ids - 1, new_seg)

        # order the tokens: the separators before segment g keep key 2g, segment g's tokens go to
        # 2 * (its new place) + 1, padding last; a stable sort keeps each segment's tokens in order
        content = segment >= 0
        before = starts.long().cumsum(1) - starts.long()                   # segments started before t
        key = torch.where(content, 2 * new_seg.gather(1, segment.clamp(min=0)) + 1, 2 * before)
        key = torch.where(mask.bool(), key, torch.full_like(key, 2 * G + 2))
        order = key.argsort(dim=1, stable=True)

        # the two steps trade step indices too: the text and the step entries of `first` go to `second`
        step_map = lambda s: torch.where(swap[:, None] & (s == first[:, None]), second[:, None],  # noqa: E731
                                         torch.where(swap[:, None] & (s == second[:, None]), first[:, None], s))
        corrupted = shallow_copy(batch)
        new_step = torch.where(content, step_map(text_step), text_step)
        for key_name, value in (("input_ids", ids), ("attention_mask", mask), ("text_step", new_step),
                                ("token_type_ids", batch.get("token_type_ids"))):
            if value is not None:
                corrupted[key_name] = value.gather(1, order)
        S = next((batch[k].shape[1] for k in STEP_KEYS if batch.get(k) is not None), 0)
        if S:
            perm = step_map(torch.arange(S, device=device).expand(B, S))   # slot s takes step perm[s]
            for key_name in STEP_KEYS:
                value = batch.get(key_name)
                if value is not None:
                    index = perm.view(B, S, *([1] * (value.dim() - 2))).expand_as(value)
                    corrupted[key_name] = value.gather(1, index)
        steps = torch.stack([first, second], dim=1).masked_fill(~swap[:, None], -1)
        return corrupted, {"sop_labels": swap.long(), "sop_steps": steps}
