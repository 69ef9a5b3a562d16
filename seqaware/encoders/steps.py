"""Encode a whole procedure once and give its step states and pair features.

One home for what the plan-aware TEO head (:mod:`seqaware.modules.teo_plan_head`) and BERSON's joint
pair encoding (``model.pair_encoding=joint``, :mod:`seqaware.modules.berson`) share:

* :func:`step_windows` -- a procedure longer than the encoder's token budget is cut into windows of
  *whole* steps, each step *owned* by exactly one window (the one that gives it the most context);
* :func:`step_means` / :func:`scatter_steps` -- a step's state is the mean of the output states of
  its tokens (text tokens, and for multimodal / image-only encoders its image's patch / region
  tokens) in the window that owns it;
* :func:`encode_steps` -- a collated batch (``data_modules.collate``: steps as presented, (B, S, L)
  tokens, images) -> (B, S, H) step states in one encoder pass per window, for every encoder kind
  (text, VisualBERT regions, CLIP-ViL grid / patch tokens, image-only);
* :func:`pair_features` and :class:`PairStates` -- ordered pairs (i, j) built from two step states,
  ``[h_i, h_j, h_i * h_j, h_i - h_j]``, and from them the per-pair vectors BERSON's decoder reads.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from seqaware.encoders.base import SequenceEncoder, pack_steps, step_visual_features


SEGMENTS = ("none", "alternating")


def step_windows(lengths: Sequence[int], budget: int, max_steps: Optional[int] = None
                 ) -> list[tuple[int, int, int, int]]:
    """Windows of whole steps over a procedure whose steps take ``lengths`` tokens each.

    Returns ``(start, end, own_start, own_end)`` per window: the window holds steps
    ``start..end-1`` (their token lengths sum to at most ``budget``, and they are at most
    ``max_steps`` steps when it is given) and *owns* steps ``own_start..own_end-1``.  Every step is
    owned by exactly one window, windows are in procedure order.  A procedure that fits is one window
    owning every step.  Otherwise each window's owned core is grown from its first step up to
    ``budget // 2`` tokens (and ``max_steps // 2`` steps; at least one step), then context steps are
    added alternately after and before the core while they fit.

    Raises ``ValueError`` when one step alone is longer than ``budget`` (callers name their config key).
    """
    n = len(lengths)
    if any(length > budget for length in lengths):
        raise ValueError(f"a step of {max(lengths)} tokens does not fit a window of {budget} tokens")
    cap = n if max_steps is None else max(1, int(max_steps))
    if sum(lengths) <= budget and n <= cap:
        return [(0, n, 0, n)]
    windows = []
    own_start = 0
    while own_start < n:
        own_end, used = own_start + 1, lengths[own_start]
        while (own_end < n and used + lengths[own_end] <= budget // 2
               and (max_steps is None or own_end - own_start < max(1, cap // 2))):
            used += lengths[own_end]
            own_end += 1
        start, end = own_start, own_end
        grown = True
        while grown:
            grown = False
            if end < n and end - start < cap and used + lengths[end] <= budget:
                used += lengths[end]
                end += 1
                grown = True
            if start > 0 and end - start < cap and used + lengths[start - 1] <= budget:
                start -= 1
                used += lengths[start]
                grown = True
        windows.append((start, end, own_start, own_end))
        own_start = own_end
    return windows


def step_means(states: torch.Tensor, index: torch.Tensor, keep: torch.Tensor, total: int,
               empty: str = "error") -> torch.Tensor:
    """Mean output state per step: (total, H).

    ``states`` (..., H) token states, ``index`` (...) long: the (batch-wide) step each token belongs
    to, ``keep`` (...) bool: the tokens that count (the step's own tokens in the window owning it).
    ``empty``: ``error`` (a step without any token is a bug upstream, e.g. an empty step text) or
    ``zero`` (its state is 0: padding slots, or a step without an image under an image-only encoder).
    """
    index, src = index[keep], states[keep]
    sums = states.new_zeros(total, states.shape[-1]).index_add_(0, index, src)
    counts = states.new_zeros(total).index_add_(0, index, states.new_ones(int(keep.sum())))
    if empty == "error" and bool((counts == 0).any()):
        raise RuntimeError("a step has no token in the window that owns it (empty step text?)")
    return sums / counts.clamp(min=1)[:, None]


def scatter_steps(flat: torch.Tensor, num_steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps of all procedures one after another (sum(num_steps), H) -> (B, S, H) and the step mask (B, S)."""
    device = flat.device
    total = int(num_steps.sum())
    B, S = len(num_steps), int(num_steps.max())
    plan = torch.repeat_interleave(torch.arange(B, device=device), num_steps)
    offsets = torch.cumsum(num_steps, 0) - num_steps
    pos = torch.arange(total, device=device) - offsets[plan]
    out = flat.new_zeros(B, S, flat.shape[-1])
    out[plan, pos] = flat
    mask = torch.arange(S, device=device)[None, :] < num_steps[:, None]
    return out, mask


def pair_features(h_i: torch.Tensor, h_j: torch.Tensor) -> torch.Tensor:
    """``[h_i, h_j, h_i * h_j, h_i - h_j]`` of ordered pairs: two (..., H) state tensors -> (..., 4H)."""
    return torch.cat([h_i, h_j, h_i * h_j, h_i - h_j], -1)


# ---------------------------------------------------------------------------- windows of a collated batch
def position_limit(encoder: SequenceEncoder) -> int:
    """How many tokens one pass of ``encoder`` may take by its position table (``[CLS]`` included):
    the text positions, which with ``visual_positions: sequence`` also number the visual tokens."""
    if hasattr(encoder, "max_positions"):          # SingleStreamEncoder
        return int(encoder.max_positions) - int(getattr(encoder, "position_offset", 0))
    # TextEncoder: RoBERTa's and MPNet's positions start after the padding index (their embeddings keep it)
    embeddings = encoder.backbone.embeddings
    offset = int(embeddings.padding_idx) + 1 if hasattr(embeddings, "padding_idx") else 0
    return int(encoder.backbone.config.max_position_embeddings) - offset


def step_lengths(encoder: SequenceEncoder, text: Optional[torch.Tensor], visual: Optional[torch.Tensor],
                 slot: int) -> torch.Tensor:
    """Tokens each step takes in a joint window (what :func:`step_windows` packs), for ``encoder``.

    ``text``: each step's tokenised length, its own special tokens included (0 for a padding slot); packed,
    a step drops its [CLS] and keeps its [SEP].  ``visual``: the real visual tokens of each step's image (0
    without a usable image, :func:`image_tokens`); with ``visual_positions: sequence`` every slot takes its
    ``slot`` tokens (P, :func:`visual_slot_tokens`) instead, image or not, as its positions run over all slots.
    Tensors of any (matching) shape; ``text`` is ignored by an image-only encoder, ``visual`` by a text one.
    """
    lengths = (text - 1).clamp(min=0) if encoder.uses_text else None
    if encoder.uses_images:
        seen = torch.full_like(visual, slot) if getattr(encoder, "visual_positions", "image") == "sequence" else visual
        lengths = seen if lengths is None else lengths + seen
    return lengths


def region_tokens(encoder: SequenceEncoder) -> bool:
    """Whether ``encoder``'s visual tokens of an image are the whole image + object regions (VisualBERT:
    RoIAlign of its boxes, or cached detector regions), as opposed to a backbone's token grid (CLIP-ViL)."""
    return getattr(encoder, "regions", None) is not None or getattr(encoder, "visual", None) is None


def visual_slot_tokens(encoder: SequenceEncoder, collator) -> int:
    """P: the visual tokens of one step's image slot in the batches ``collator``
    (:class:`data_modules.collate.StepCollator`) makes for ``encoder`` -- what :func:`encode_steps` reads as
    ``visual_feats.shape[2]``: the whole image + ``data.collator.max_boxes`` regions for region encoders
    (:func:`region_tokens`), else the visual backbone's tokens at ``data.collator.image_size`` (CLIP ViT:
    CLS + patches; a CNN: its grid cells, e.g. 2 x 2 for EfficientNet at 64 px)."""
    if region_tokens(encoder):
        return 1 + int(collator.max_boxes)
    return encoder.visual.num_tokens(collator.transform.size)


def image_tokens(encoder: SequenceEncoder, collator, step, root: Optional[str], slot: int, read: bool = True) -> int:
    """The real visual tokens ``step``'s image gives ``encoder`` in ``collator``'s batches (0 without an image):
    all ``slot`` tokens of a backbone's grid; for regions the whole image + its boxes (at most
    ``data.collator.max_boxes``), for cached detector regions the whole image + the regions of its cache file
    (at most ``max_boxes``; the file is read only with ``read``, else the most it may give, ``slot``)."""
    if not step.images or not collator.use_images:
        return 0
    if not region_tokens(encoder):
        return slot
    if getattr(encoder, "visual", None) is not None:                   # RoIAlign in the step's own object boxes
        return 1 + min(len(step.boxes or ()), int(collator.max_boxes))
    if not read or collator.region_cache is None:
        return slot
    from seqaware.procedure import resolve_path

    record = collator.region_cache.load(resolve_path(step.images[0], root))
    return 1 + min(int(record["features"].shape[0]), int(collator.max_boxes))


def alternating_segments(text_step: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """BERT4SO's interval segments for a packed ``[CLS] s_0 [SEP] s_1 [SEP] ...``: token type 0 for the
    tokens of even steps, 1 for odd steps, each step's closing [SEP] with its step; [CLS] and padding 0.
    ``text_step`` (B, T): :func:`seqaware.encoders.base.pack_steps`' step of each token (-1: CLS / SEP / pad)."""
    owner = torch.cummax(text_step, dim=1).values.clamp(min=0)   # a [SEP] takes the step before it; [CLS] 0
    return (owner % 2) * attention_mask.long()


def encode_steps(encoder: SequenceEncoder, batch: dict, max_tokens: int, key: str = "model.joint_max_tokens",
                 segments: str = "none") -> torch.Tensor:
    """Encode every procedure of a collated batch in one pass (per window) and pool its step states.

    ``batch``: ``input_ids`` / ``attention_mask`` (B, S, L) (each step tokenised with its own
    special tokens), ``step_mask`` (B, S) (real steps first, as the collator pads), and for
    encoders with images ``pixel_values`` / ``image_mask`` (or cached ``visual_feats``), as :func:`seqaware.encoders.base.fusion_input` reads them.  The steps
    are encoded in the order the batch presents them: text ``[CLS] s_0 [SEP] s_1 [SEP] ...`` and the
    step images' tokens after it, exactly as pretraining encodes a step sequence.

    A procedure whose tokens (text without each step's own ``[CLS]``, plus its images' real visual
    tokens; every slot's P tokens with ``visual_positions: sequence``) exceed ``max_tokens - 1`` (or the
    encoder's positions, :func:`position_limit`), or whose steps exceed the step embedding's
    ``max_steps``, is encoded in windows of whole steps (:func:`step_windows`); a
    window's slots are re-numbered 0.. for the step embedding.  The visual backbone runs once per step
    image whatever the windows.

    ``segments``: ``none`` (token type 0 throughout, as pretraining packs steps) or ``alternating``
    (text-only encoders with two token types: :func:`alternating_segments`, BERT4SO's interval segments;
    a window's first step is type 0).

    Returns (B, S, H) step states: the mean of the step's text and image token states in the window
    that owns it (0 for padding slots and for steps without any token).
    """
    if segments not in SEGMENTS:
        raise ValueError(f"segments must be one of {list(SEGMENTS)}, got {segments!r}")
    if segments == "alternating" and (encoder.uses_images or getattr(encoder, "type_vocab_size", 1) < 2):
        raise ValueError("alternating segments need a text-only encoder with two token types (BERT, MiniLM; "
                         f"not {type(encoder).__name__} with modality {encoder.modality!r})")
    step_mask = batch["step_mask"].bool()
    B, S = step_mask.shape
    device = step_mask.device
    feats = patch_mask = visual_mask = visual = None
    text = batch["attention_mask"].sum(-1) if encoder.uses_text else None
    if encoder.uses_images:
        feats, patch_mask, visual_mask = step_visual_features(encoder, batch)
        visual_mask = visual_mask.bool()
        real = patch_mask.sum(-1) if patch_mask is not None else torch.full((B, S), feats.shape[2], device=device)
        visual = real.long() * visual_mask
    lengths = step_lengths(encoder, text, visual, feats.shape[2] if feats is not None else 0)
    budget = min(int(max_tokens), position_limit(encoder))
    max_steps = getattr(encoder, "max_steps", None) if getattr(encoder, "step_embedding", None) is not None else None

    # windows: (instance, slots) on the host; procedures are short lists of steps
    lengths = (lengths * step_mask).tolist()
    counts = step_mask.sum(1).tolist()
    rows, slots, owners = [], [], []
    for b, n in enumerate(counts):
        try:
            windows = step_windows(lengths[b][:n], budget - 1, max_steps)  # the window's [CLS] takes one
        except ValueError as err:
            raise ValueError(f"{err}: raise {key} (now {max_tokens}) or shorten the steps") from None
        for start, end, own_start, own_end in windows:
            rows.append(b)
            slots.append(list(range(start, end)))
            owners.append([own_start <= i < own_end for i in range(start, end)])
    W, Sw = len(rows), max(len(s) for s in slots)
    slot = torch.full((W, Sw), -1, dtype=torch.long)
    owner = torch.zeros(W, Sw, dtype=torch.bool)
    for w, (s, o) in enumerate(zip(slots, owners)):
        slot[w, :len(s)] = torch.tensor(s)
        owner[w, :len(o)] = torch.tensor(o)
    row = torch.tensor(rows)[:, None].expand(W, Sw).to(device)
    slot, owner = slot.to(device), owner.to(device)
    used, safe = slot >= 0, slot.clamp(min=0)
    step_id = torch.where(used, row * S + safe, torch.full_like(safe, -1))   # batch-wide step index

    fusion: dict[str, torch.Tensor] = {}
    if encoder.uses_text:
        fusion.update(pack_steps(batch["input_ids"][row, safe], batch["attention_mask"][row, safe] * used[..., None],
                                 used, encoder.cls_token_id, encoder.pad_token_id))
        if segments == "alternating":
            fusion["token_type_ids"] = alternating_segments(fusion["text_step"], fusion["attention_mask"])
    if encoder.uses_images:
        # index_select (take_steps' rule): a deterministic backward when a step sits in several windows
        flat = row * S + safe
        fusion["visual_feats"] = feats.flatten(0, 1).index_select(0, flat.reshape(-1)).view(W, Sw, *feats.shape[2:])
        fusion["visual_mask"] = visual_mask[row, safe] & used
        if patch_mask is not None:
            fusion["patch_mask"] = patch_mask[row, safe]
    out = encoder(fusion)

    states, index, keep = [], [], []
    if out.text_states is not None:
        local = fusion["text_step"]                                            # window slot of each token, -1: CLS/SEP/pad
        states.append(out.text_states)
        index.append(step_id.gather(1, local.clamp(min=0)))
        keep.append(owner.gather(1, local.clamp(min=0)) & (local >= 0))
    if out.patch_states is not None:
        P = out.patch_states.shape[2]
        real = fusion["visual_mask"][:, :, None].expand(W, Sw, P)
        if patch_mask is not None:
            real = real & fusion["patch_mask"].bool()
        states.append(out.patch_states.flatten(1, 2))
        index.append(step_id[:, :, None].expand(W, Sw, P).flatten(1, 2))
        keep.append((real & owner[:, :, None]).flatten(1, 2))
    pooled = step_means(torch.cat(states, 1), torch.cat(index, 1), torch.cat(keep, 1), B * S, empty="zero")
    return pooled.view(B, S, -1)


class PairStates(nn.Module):
    """BERSON's per-pair vectors from two step states (``model.pair_encoding=joint``).

    The pairwise encoding reads, per ordered pair (i, j), the pair-specific vector of step i and of
    step j (token attention inside each segment of the jointly encoded pair) and the pair's [CLS]
    state.  From step states ``h`` encoded once per procedure they are built as::

        u_ij   = GELU(W_u [h_i, h_j, h_i * h_j, h_i - h_j] + b_u)      (pair_features, hidden H)
        first  = LayerNorm(h_i + W_f u_ij)    step i as seen with step j
        second = LayerNorm(h_j + W_s u_ij)    step j as seen with step i
        cls    = LayerNorm(W_c u_ij + b_c)    the pair's [CLS]: relation vector and "i before j" logit

    so the decoder's hierarchical pooling still sees 2(n-1) pair-specific vectors per step (the
    residual keeps the step's own state), and the pair's relation is a function of both states,
    asymmetric in (i, j).
    """

    def __init__(self, hidden_size: int, dropout: float = 0.1):
        super().__init__()
        H = hidden_size
        self.pair = nn.Sequential(nn.Linear(4 * H, H), nn.GELU(), nn.Dropout(dropout))
        self.first = nn.Linear(H, H, bias=False)
        self.second = nn.Linear(H, H, bias=False)
        self.cls = nn.Linear(H, H)
        self.norm_first = nn.LayerNorm(H)
        self.norm_second = nn.LayerNorm(H)
        self.norm_cls = nn.LayerNorm(H)

    def forward(self, steps: torch.Tensor, index: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``steps`` (B, S, H), ``index`` = (b, i, j) of the N pairs -> ``first``, ``second``, ``cls`` (N, H)."""
        b, i, j = index
        flat = steps.flatten(0, 1)
        # index_select, not steps[b, i]: every step is in 2(n-1) pairs, its gradient summed in a fixed order
        hi = flat.index_select(0, b * steps.shape[1] + i)
        hj = flat.index_select(0, b * steps.shape[1] + j)
        u = self.pair(pair_features(hi, hj))
        return (self.norm_first(hi + self.first(u)), self.norm_second(hj + self.second(u)),
                self.norm_cls(self.cls(u)))
