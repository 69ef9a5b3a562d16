"""A small sequencing baseline: per-step encoder + pairwise precedence scorer.

Each step is encoded from its text (mean of token embeddings) and/or its image (a small CNN), the
steps exchange information through a light transformer without positions (the input order is a
shuffle and must not leak), and an antisymmetric scorer gives, for every pair (i, j), the logit
that step i comes before step j. It trains from scratch in a few CPU minutes.
"""
from __future__ import annotations

import torch
from torch import nn


class MeanTokenEncoder(nn.Module):
    """Masked mean of token embeddings, then an MLP."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if int(input_ids.max()) >= self.embed.num_embeddings:
            raise ValueError(f"token id {int(input_ids.max())} >= vocab_size={self.embed.num_embeddings}: "
                             "set model.net.vocab_size to the tokenizer's vocabulary size")
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(-2) / mask.sum(-2).clamp(min=1.0)
        return self.mlp(pooled)


class SmallCNN(nn.Module):
    """Four strided conv blocks + global average pooling; input (N, 3, H, W) -> (N, dim)."""

    def __init__(self, dim: int, width: int = 32):
        super().__init__()
        chans = [3, width // 2, width, width * 2, width * 2]
        layers = []
        for c_in, c_out in zip(chans[:-1], chans[1:]):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.proj = nn.Linear(chans[-1] * 2, dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.features(pixels)
        # mean and max pooling: "how much is there" and "is there anything at all" (cumulative scenes)
        return self.proj(torch.cat([x.mean((-2, -1)), x.amax((-2, -1))], dim=-1))


class PairwiseOrderModel(nn.Module):
    """Step encoder + set context + antisymmetric pairwise precedence scorer.

    ``modality`` is ``text``, ``image`` or ``multimodal``.
    """

    def __init__(self, vocab_size: int = 30522, dim: int = 128, modality: str = "multimodal", context_layers: int = 1,
                 heads: int = 4, dropout: float = 0.1, cnn_width: int = 32):
        super().__init__()
        if modality not in ("text", "image", "multimodal"):
            raise ValueError(f"modality must be text, image or multimodal, got {modality!r}")
        self.modality = modality
        self.text = MeanTokenEncoder(vocab_size, dim) if modality != "image" else None
        self.image = SmallCNN(dim, cnn_width) if modality != "text" else None
        self.norm = nn.LayerNorm(dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 2, dropout, batch_first=True, norm_first=True)
        self.context = nn.TransformerEncoder(layer, context_layers, enable_nested_tensor=False) if context_layers else None
        self.scorer = nn.Sequential(nn.Linear(3 * dim, dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(dim, 1))

    def encode_steps(self, batch: dict) -> torch.Tensor:
        step_mask = batch["step_mask"]
        b, s = step_mask.shape
        h = 0
        if self.text is not None:
            h = h + self.text(batch["input_ids"].flatten(0, 1), batch["attention_mask"].flatten(0, 1)).view(b, s, -1)
        if self.image is not None:
            pixels = batch["pixel_values"].flatten(0, 1)
            img = self.image(pixels).view(b, s, -1) * batch["image_mask"].unsqueeze(-1)
            h = h + img
        h = self.norm(h)
        if self.context is not None:
            h = self.context(h, src_key_padding_mask=~step_mask)
        return h

    def forward(self, batch: dict) -> torch.Tensor:
        """Pair logits (B, S, S): entry (i, j) = logit of "i before j"; antisymmetric by construction."""
        h = self.encode_steps(batch)
        s = h.shape[1]
        hi = h[:, :, None, :].expand(-1, -1, s, -1)
        hj = h[:, None, :, :].expand(-1, s, -1, -1)
        f = self.scorer(torch.cat([hi, hj, hi * hj], dim=-1)).squeeze(-1)
        return f - f.transpose(1, 2)
