"""Packed (unpadded) transformer passes: padding never reaches a linear layer (``model.packed``).

MosaicBERT's / ModernBERT's unpadding (``bert_padding.py``), for the Hugging Face text models the encoders wrap.
A batch reaches the transformer as a padded (B, T) layout -- the encoders' fusion input: BERSON's joint windows,
its chunks of step pairs, pretraining's step sequences -- and its real tokens are a small share of the B x T
slots when the sequences differ in length (ROCStories, joint, batches of 16: 23% padding).  Packed:

* the N real tokens are gathered (:class:`Layout`, row-major, so each sequence's tokens stay together) and every
  per-token part of the model runs on those N tokens only: the embeddings (each token with its own position id and
  token type, so positions restart per sequence exactly as they run in the padded row), the query / key / value
  projections (one matmul of the three weights) and the output projection, the feed-forward layers, the
  LayerNorms, dropout;
* attention, the one part that mixes tokens, is kept per sequence: each layer scatters its N query / key / value
  vectors back to the (B, T) layout and runs ``scaled_dot_product_attention`` with the padded keys masked out,
  then gathers the N real rows again (MosaicBERT's PyTorch fallback for attention, used with attention dropout
  or without its Triton kernel).  Attention's own matmuls (~4 L^2 H FLOPs a sequence a layer, against
  ~24 L H^2 for the rest: 2-4% at L ~ 60 and H = 384-768) thus still see padding; everything else does not;
* MPNet's relative position bias is the model's own (``MPNetEncoder.compute_position_bias``) over the (B, T)
  layout's columns, so every sequence gets the buckets of its own token distances, as in the padded pass.

The result is scattered back to (B, T, H), zeros at the padding, so the decoders, losses and metrics (which
read real tokens only) are untouched; the logits and gradients equal the padded pass's within float rounding
(``tests/test_packing.py``: MiniLM's real weights and a tiny MPNet, BERSON joint and pairwise, fp32 and bf16
autocast; a pretraining step).

Models: BERT (MiniLM), RoBERTa (and XLM-R) and MPNet, running their own modules (the layers' ``query`` / ``key`` /
``value``, ``attention.output``, ``intermediate``, ``output``; MPNet's ``attn.q`` / ``k`` / ``v`` / ``o``): no new
parameters, the same state dict, so checkpoints load either way.  Another model type is refused when the switch
is set.  ``torch.nn.attention.varlen`` and nested-tensor attention are not used: on this torch the nested-tensor
SDPA ran 3x slower than the re-padded one on a CPU, and the flash ``varlen_attn`` has neither a CPU kernel nor
attention dropout (BERT's fine-tuning recipe uses 0.1).  The pass runs under ``torch.compile`` (``dynamic: true``:
one graph for every token count, checked on a CPU).  Speed (docs/results/performance.md): faster on a 2-core CPU
(BERSON 1.14-1.29x a step, pretraining 1.06-1.15x); on a GPU it adds ~4 small kernels a layer and is not measured.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

PACKED_MODELS = ("bert", "roberta", "xlm-roberta", "mpnet")


class _Gather(torch.autograd.Function):
    """``x.index_select(0, index)`` for an ``index`` without repeats, whose backward writes the gradient rows back
    with ``index_copy`` (the plain backward, ``index_add``, is a scatter-add: 10x slower on a CPU here)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        return grad.new_zeros(ctx.rows, *grad.shape[1:]).index_copy_(0, index, grad), None


class Layout:
    """Where the real tokens of a padded (B, T) batch are: ``mask`` (B, T) bool, ``index`` (N,) their flat
    positions in B * T, row-major.  :meth:`unpad` / :meth:`pad` move tensors between the two layouts with
    ``index_select`` / ``index_copy`` (each index once, so both backwards are the other move: deterministic)."""

    def __init__(self, mask: torch.Tensor):
        self.mask = mask.bool()
        self.shape = tuple(mask.shape)
        self.index = self.mask.flatten().nonzero().squeeze(1)

    @property
    def tokens(self) -> int:
        return int(self.index.numel())

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)."""
        return _Gather.apply(x.flatten(0, 1), self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at the padding."""
        B, T = self.shape
        return x.new_zeros(B * T, *x.shape[1:]).index_copy(0, self.index, x).view(B, T, *x.shape[1:])


def packing_family(backbone: nn.Module) -> Optional[str]:
    """``bert`` (BERT, MiniLM, RoBERTa, XLM-R), ``mpnet`` or None (a model the packed pass does not cover)."""
    config = getattr(backbone, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in PACKED_MODELS or getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return None
    if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
        return None
    return "mpnet" if kind == "mpnet" else "bert"


def check_packable(encoder: nn.Module, key: str = "model.packed") -> None:
    """Raise a ValueError naming ``key`` when ``encoder``'s transformer has no packed pass."""
    backbone = getattr(encoder, "backbone", None)
    if backbone is None or packing_family(backbone) is None:
        kind = getattr(getattr(backbone, "config", None), "model_type", None)
        raise ValueError(f"{key}=true: the packed pass covers the text models {list(PACKED_MODELS)} "
                         f"(absolute positions, encoder only); {type(encoder).__name__} wraps {kind!r}: set {key}=false")


def default_position_ids(backbone: nn.Module, input_ids: Optional[torch.Tensor], shape: tuple[int, int]) -> torch.Tensor:
    """The (B, T) position ids the model makes itself when given none: BERT ``0..T-1``; RoBERTa and MPNet
    (embeddings with a ``padding_idx``) count the non-padding tokens after the padding index, padding keeps it."""
    B, T = shape
    device = backbone.embeddings.word_embeddings.weight.device
    pad = getattr(backbone.embeddings, "padding_idx", None)
    if pad is None:
        return torch.arange(T, device=device).expand(B, T)
    if input_ids is None:
        return (torch.arange(T, device=device) + pad + 1).expand(B, T)
    real = input_ids.ne(pad).long()
    return torch.cumsum(real, dim=1) * real + pad


def _attend(h: torch.Tensor, projections: tuple[nn.Linear, nn.Linear, nn.Linear], layout: Layout, mask: torch.Tensor,
            heads: int, dropout: float) -> torch.Tensor:
    """Attention of N packed tokens (h: (N, H)) within their own sequences.  The query, key and value
    ``projections`` (the model's own Linear layers) run as one matmul on the N tokens; the result is re-padded to
    (B, heads, T, d) for ``scaled_dot_product_attention`` (``mask``: the padded keys, and MPNet's position bias)
    and its N real rows come back: (N, H)."""
    B, T = layout.shape
    H = h.shape[-1]
    weight = torch.cat([p.weight for p in projections])
    bias = torch.cat([p.bias for p in projections]) if all(p.bias is not None for p in projections) else None
    qkv = layout.pad(F.linear(h, weight, bias)).view(B, T, 3, heads, H // heads).permute(2, 0, 3, 1, 4)
    if mask.dtype != torch.bool:
        mask = mask.to(qkv.dtype)
    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask, dropout_p=dropout)
    return layout.unpad(out.transpose(1, 2).reshape(B, T, H))


def _bert_layer(layer: nn.Module, h: torch.Tensor, layout: Layout, mask: torch.Tensor) -> torch.Tensor:
    attn = layer.attention.self
    p = attn.dropout.p if attn.training else 0.0
    context = _attend(h, (attn.query, attn.key, attn.value), layout, mask, attn.num_attention_heads, p)
    h = layer.attention.output(context, h)                           # dense, dropout, LayerNorm(+ residual)
    return layer.output(layer.intermediate(h), h)


def _mpnet_layer(layer: nn.Module, h: torch.Tensor, layout: Layout, mask: torch.Tensor) -> torch.Tensor:
    block, attn = layer.attention, layer.attention.attn
    p = attn.dropout.p if attn.training else 0.0
    context = _attend(h, (attn.q, attn.k, attn.v), layout, mask, attn.num_attention_heads, p)
    h = block.LayerNorm(block.dropout(attn.o(context)) + h)
    return layer.output(layer.intermediate(h), h)


def packed_forward(backbone: nn.Module, mask: torch.Tensor, input_ids: Optional[torch.Tensor] = None,
                   inputs_embeds: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                   token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The last hidden states (B, T, H) of ``backbone`` (a Hugging Face BERT / RoBERTa / MPNet model) on a padded
    batch, computed on its real tokens only (see the module docstring); zeros at the padding.

    ``mask`` (B, T): the real tokens (the padded pass's ``attention_mask``).  ``input_ids`` or ``inputs_embeds``
    (B, T[, H]), ``position_ids`` (default: the model's own, :func:`default_position_ids`) and ``token_type_ids``
    are read at the real tokens and go to the model's embeddings as one row of N tokens."""
    family = packing_family(backbone)
    if family is None:
        raise ValueError(f"no packed pass for model type {getattr(backbone.config, 'model_type', None)!r}")
    layout = Layout(mask)
    B, T = layout.shape
    if position_ids is None:
        position_ids = default_position_ids(backbone, input_ids, (B, T))
    row = {"position_ids": layout.unpad(position_ids.expand(B, T))[None]}
    if input_ids is not None:
        row["input_ids"] = layout.unpad(input_ids)[None]
    else:
        row["inputs_embeds"] = layout.unpad(inputs_embeds)[None]
    if token_type_ids is not None and family == "bert":
        row["token_type_ids"] = layout.unpad(token_type_ids.expand(B, T))[None]
    h = backbone.embeddings(**row)[0]                                           # (N, H)
    keys = layout.mask[:, None, None, :]                                        # (B, 1, 1, T)
    if family == "mpnet":
        # the model's own relative-position buckets over the layout's columns: (1, heads, T, T), per sequence
        bias = backbone.encoder.compute_position_bias(torch.empty(1, T, device=mask.device))
        attn_mask = bias.masked_fill(~keys, float("-inf"))
        run = _mpnet_layer
    else:
        attn_mask, run = keys, _bert_layer
    # gradient_checkpointing: true (transformers' switch): each layer recomputed in backward, as the padded pass does
    recompute = getattr(backbone, "is_activation_checkpointing", False) and backbone.training and torch.is_grad_enabled()
    for layer in backbone.encoder.layer:
        if recompute:
            h = checkpoint(run, layer, h, layout, attn_mask, use_reentrant=False)
        else:
            h = run(layer, h, layout, attn_mask)
    return layout.pad(h)


def run_transformer(encoder: nn.Module, mask: torch.Tensor, **inputs: torch.Tensor) -> torch.Tensor:
    """``encoder.backbone``'s last hidden states (B, T, H) on a padded batch: packed when ``encoder.packed``
    (:func:`packed_forward`), else the model's own padded forward with ``mask`` as its attention mask.  The
    encoder's ``work_meter`` (:class:`seqaware.profiling.WorkMeter`, when one is attached) counts the real
    tokens either way."""
    meter = getattr(encoder, "work_meter", None)
    if meter is not None:
        meter.add(mask)
    if getattr(encoder, "packed", False):
        return packed_forward(encoder.backbone, mask, **inputs)
    return encoder.backbone(attention_mask=mask.long(), **inputs).last_hidden_state
