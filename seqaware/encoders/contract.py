"""The contract between single-stream sequence encoders and what runs on top of them (pretraining
objectives, order decoders, TEO heads).

Fusion input (a plain ``dict`` of tensors, the keys an encoder reads)::

    input_ids       (B, T)      long   token ids
    attention_mask  (B, T)      long/bool  1 = real token
    text_step       (B, T)      long   step index of each token, -1 for special tokens / padding
    token_type_ids  (B, T)      long   optional segment ids (BERT sentence pairs)
    visual_feats    (B, S, P, D) float P patch / region features of the image of each step
    visual_mask     (B, S)      bool   the step has an image
    patch_mask      (B, S, P)   bool   optional: the patch / region is real (region features)

A text-only batch has no visual keys and an image-only batch no text keys.  The encoder returns an
:class:`EncoderOutput`.  :func:`seqaware.encoders.base.fusion_input` builds the dict from a
collated batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

TEXT_KEYS = ("input_ids", "attention_mask", "text_step")
VISUAL_KEYS = ("visual_feats", "visual_mask", "patch_mask")
STEP_KEYS = ("visual_feats", "visual_mask", "patch_mask")
"""Keys indexed by (sample, step, ...) that move together when whole images are swapped."""

FUSION_LAYOUT: dict[str, tuple[str, Any]] = {
    "input_ids": ("text", None), "attention_mask": ("text", 0), "text_step": ("text", -1),
    "token_type_ids": ("text", 0), "visual_feats": ("step", 0.0), "visual_mask": ("step", False),
    "patch_mask": ("step", False),
}
"""Every fusion entry's layout -- ``text`` (B, T, ...) or ``step`` (B, S, ...) -- and padding value
(None: pad by copying the batch row), used to cut one sample to its own length and pad it back."""


@dataclass
class EncoderOutput:
    """What a single-stream encoder returns.

    ``cls``: (B, H) pooled [CLS] state.  ``text_states``: (B, T, H) (None for image-only encoders).
    ``patch_states``: (B, S, P, H) output states of the visual tokens; ``projected_visual``:
    (B, S, P, H) visual features after the encoder's input projection (Linear + LayerNorm), before
    the transformer (both None for text-only encoders).
    """

    cls: torch.Tensor
    text_states: Optional[torch.Tensor] = None
    patch_states: Optional[torch.Tensor] = None
    projected_visual: Optional[torch.Tensor] = None
