"""The interface every sequence encoder implements, and packing per-step texts into one sequence.

A *sequence encoder* is one single-stream transformer over all steps of an instance (Wu et al.
2022, sec. 4): the text tokens of every step, then the visual tokens (patches / regions) of every
step's image.  Pretraining objectives (:mod:`seqaware.objectives`) and order decoders (BERSON runs
it on pairs of steps, S = 2) use it through two calls:

``encoder.visual_features(pixel_values, boxes=None, box_mask=None) -> (feats (N, P, Dv), patch_mask (N, P) | None)``
    runs the visual backbone once per image (N images); region encoders also take boxes.
``encoder(fusion_input) -> EncoderOutput``
    ``fusion_input`` is the dict described in :mod:`seqaware.encoders.contract` (``input_ids``,
    ``attention_mask``, ``text_step`` of shape (B, T) from :func:`pack_steps`; ``visual_feats``
    (B, S, P, Dv), ``visual_mask`` (B, S), optional ``patch_mask`` (B, S, P)).

:func:`fusion_input` builds that dict from a collated batch (``data_modules.collate``).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import nn

from seqaware.config import to_plain
from seqaware.encoders.contract import EncoderOutput


def plain_config(cfg: Optional[Mapping]) -> dict[str, Any]:
    """A config mapping (dict or OmegaConf DictConfig, lists included) as plain Python containers."""
    return {} if cfg is None else dict(to_plain(cfg))


def pack_steps(input_ids: torch.Tensor, attention_mask: torch.Tensor, step_mask: Optional[torch.Tensor],
               cls_id: int, pad_id: int, pair_sep_id: Optional[int] = None) -> dict[str, torch.Tensor]:
    """Concatenate per-step tokenisations into one sequence ``[CLS] s_0 [SEP] s_1 [SEP] ...``.

    Args:
        input_ids, attention_mask: (B, S, L), every step tokenised on its own *with* special tokens
            (``[CLS] text [SEP]`` / ``<s> text </s>``), right-padded.
        step_mask: (B, S) bool, which step slots are real (None: all).
        cls_id, pad_id: the tokenizer's CLS (or BOS) and PAD ids.

    Each step contributes its tokens without its leading CLS; its closing SEP is kept as the
    separator.  ``pair_sep_id`` (RoBERTa / MPNet pairs, ``<s> a </s></s> b </s>``): every step after the
    first opens with that separator instead of dropping its CLS.  Returns ``input_ids``,
    ``attention_mask`` (B, T) long and ``text_step`` (B, T): the step index of each text token, -1 for
    CLS, separators and padding.  T = 1 + the longest packed instance.  Vectorised: one scatter, no
    Python loop over samples or steps.
    """
    B, S, L = input_ids.shape
    device = input_ids.device
    real = attention_mask.bool()
    if step_mask is not None:
        real = real & step_mask.bool()[:, :, None]
    pos = torch.arange(L, device=device)
    keep = real & (pos > 0)                                   # drop each step's own CLS
    opener = None
    if pair_sep_id is not None:                               # ... or turn it into the pair's second separator
        later = (torch.arange(S, device=device) > 0)[None, :, None]
        opener = real & (pos == 0) & later
        keep = keep | opener
        input_ids = torch.where(opener, torch.full_like(input_ids, pair_sep_id), input_ids)
    lengths = real.sum(-1)                                    # (B, S)
    is_sep = pos[None, None, :] == (lengths - 1)[:, :, None]  # the last real token of each step
    flat_keep = keep.reshape(B, S * L)
    dest = flat_keep.long().cumsum(1)                         # 1-based destinations after CLS
    T = 1 + int(dest[:, -1].max().item()) if B else 1
    out_ids = torch.full((B, T), pad_id, dtype=input_ids.dtype, device=device)
    out_mask = torch.zeros(B, T, dtype=torch.long, device=device)
    out_step = torch.full((B, T), -1, dtype=torch.long, device=device)
    out_ids[:, 0] = cls_id
    out_mask[:, 0] = 1
    steps = torch.arange(S, device=device)[None, :, None].expand(B, S, L)
    separator = is_sep if opener is None else is_sep | opener
    token_step = torch.where(separator, torch.full_like(steps, -1), steps).reshape(B, S * L)
    dest = torch.where(flat_keep, dest, torch.zeros_like(dest))  # dropped tokens go to slot 0 ...
    rows = torch.arange(B, device=device)[:, None].expand(B, S * L)
    sel = flat_keep
    out_ids[rows[sel], dest[sel]] = input_ids.reshape(B, S * L)[sel]
    out_mask[rows[sel], dest[sel]] = 1
    out_step[rows[sel], dest[sel]] = token_step[sel]          # ... and are never written there
    return {"input_ids": out_ids, "attention_mask": out_mask, "text_step": out_step}


def pair_segment_ids(fusion: dict[str, torch.Tensor]) -> torch.Tensor:
    """BERT sentence-pair token types for a packed pair ``[CLS] a [SEP] b [SEP]``: 0 up to the first
    [SEP], 1 for the tokens of step 1 and its [SEP], 0 on padding."""
    second = (fusion["text_step"] == 1).long().cumsum(1) > 0
    return (second & fusion["attention_mask"].bool()).long()


class SequenceEncoder(nn.Module):
    """Base class of single-stream sequence encoders (see the module docstring).

    Attributes every encoder sets: ``modality`` (``text`` | ``image`` | ``multimodal``),
    ``hidden_size``; text encoders also ``vocab_size``, ``cls_token_id``, ``pad_token_id``,
    ``mask_token_id``, ``special_token_ids`` (what MLM must never mask).
    """

    modality: str = "multimodal"
    hidden_size: int = 0
    #: run the transformer on the real tokens only (``model.packed``, :mod:`seqaware.encoders.packing`)
    packed: bool = False
    #: counts the tokens entering the transformer (:class:`seqaware.profiling.WorkMeter`), when attached
    work_meter = None

    @property
    def uses_text(self) -> bool:
        return self.modality in ("text", "multimodal")

    @property
    def uses_images(self) -> bool:
        return self.modality in ("image", "multimodal")

    def visual_features(self, pixel_values: torch.Tensor, boxes: Optional[torch.Tensor] = None,
                        box_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        raise NotImplementedError(f"{type(self).__name__} has no visual backbone")

    def new_parameters(self) -> list[nn.Parameter]:
        """The parameters seqaware initialises at random (input projections, step embedding, ...),
        as opposed to those of the pretrained text / visual models it wraps: what a separate
        learning rate for new layers (``model.head_lr`` of the pretraining module) applies to."""
        return []

    def forward(self, fusion_input: dict) -> EncoderOutput:  # pragma: no cover - interface
        raise NotImplementedError


def step_visual_features(encoder: SequenceEncoder, batch: dict
                         ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Run the visual backbone once per step image of a collated batch.

    Returns ``visual_feats`` (B, S, P, D), ``patch_mask`` (B, S, P) or None, ``visual_mask`` (B, S).
    A batch that already carries ``visual_feats`` (cached detector regions attached by the collator,
    ``data.collator.region_features``) is passed through: the encoder must then have no visual
    backbone (``visual: null``).
    """
    visual_mask = batch["image_mask"] & batch["step_mask"]
    if "visual_feats" in batch:
        if getattr(encoder, "visual", None) is not None:
            raise ValueError(f"the batch carries precomputed visual features (data.collator.region_features) but the "
                             f"encoder has a visual backbone ({type(encoder.visual).__name__}); use an encoder "
                             f"without one (encoder@model.encoder=visualbert_detector) or drop "
                             f"data.collator.region_features")
        return batch["visual_feats"], batch.get("patch_mask"), visual_mask
    pixels = batch["pixel_values"]
    B, S = pixels.shape[:2]
    boxes, box_mask = batch.get("boxes"), batch.get("box_mask")
    feats, patch_mask = encoder.visual_features(
        pixels.flatten(0, 1),
        None if boxes is None else boxes.flatten(0, 1),
        None if box_mask is None else box_mask.flatten(0, 1))
    patch_mask = None if patch_mask is None else patch_mask.view(B, S, -1)
    return feats.view(B, S, *feats.shape[1:]), patch_mask, visual_mask


def fusion_input(encoder: SequenceEncoder, batch: dict) -> dict[str, torch.Tensor]:
    """A collated batch (``input_ids`` (B, S, L), ``pixel_values`` (B, S, 3, H, W), masks, boxes)
    -> the encoder's fusion input, running the visual backbone once per step image."""
    out: dict[str, torch.Tensor] = {}
    if encoder.uses_text:
        out.update(pack_steps(batch["input_ids"], batch["attention_mask"], batch["step_mask"],
                              encoder.cls_token_id, encoder.pad_token_id))
    if encoder.uses_images:
        out["visual_feats"], patch_mask, out["visual_mask"] = step_visual_features(encoder, batch)
        if patch_mask is not None:
            out["patch_mask"] = patch_mask
    return out
