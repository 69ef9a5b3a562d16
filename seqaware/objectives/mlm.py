"""Masked language modelling balanced across steps (Wu et al. 2022, sec. 4.1).

Instead of masking every token independently with probability p, each step's text gets exactly
``round(p * n)`` masked positions (at least 1 when it has any maskable token), where ``n`` is the
number of maskable tokens of that step, so short steps are not left unmasked and long steps do not
dominate.  A token is maskable when it is a real token (``attention_mask``), belongs to a step
(``text_step >= 0``) and is not one of ``special_token_ids``.

Selected positions are replaced by [MASK] (80%), a uniformly random token (10%) or left unchanged
(10%); labels are the original ids there and -100 elsewhere.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from seqaware.objectives.base import EncoderOutput, Objective, Outcomes, randint, shallow_copy, uniform
from seqaware.objectives.registry import register_objective

IGNORE_INDEX = -100


def balanced_step_mask(maskable: torch.Tensor, text_step: torch.Tensor, prob: float,
                       generator: torch.Generator) -> torch.Tensor:
    """Choose ``max(1, round(prob * n_s))`` random maskable tokens of every step ``s`` with n_s > 0.

    Vectorised: tokens are sorted by the composite key ``(step, noise)`` (non-maskable tokens get
    noise 2 so they sort after the maskable ones of their step; tokens without a step form a last
    group), the rank of a token inside its step group is its sorted position minus the start of the
    group, and a token is selected when that rank is below the group's quota.
    """
    B, T = text_step.shape
    device = text_step.device
    n_groups = int(text_step.max().item()) + 2 if text_step.numel() else 1
    group = torch.where(text_step >= 0, text_step, torch.full_like(text_step, n_groups - 1))
    noise = uniform((B, T), generator, device).masked_fill(~maskable, 2.0)
    order = (group.double() * 4.0 + noise.double()).argsort(dim=1)  # float64: no ties across groups

    group_sorted = group.gather(1, order)
    maskable_sorted = maskable.gather(1, order)
    sizes = torch.zeros(B, n_groups, dtype=torch.long, device=device).scatter_add_(1, group, torch.ones_like(group))
    n_maskable = torch.zeros(B, n_groups, dtype=torch.long, device=device).scatter_add_(1, group, maskable.long())
    quota = torch.round(n_maskable.to(torch.float64) * prob).long()
    quota = torch.where(n_maskable > 0, quota.clamp(min=1), quota)
    starts = sizes.cumsum(1) - sizes
    rank_sorted = torch.arange(T, device=device).expand(B, T) - starts.gather(1, group_sorted)
    selected_sorted = maskable_sorted & (rank_sorted < quota.gather(1, group_sorted))
    return torch.zeros_like(maskable).scatter(1, order, selected_sorted)


class TiedLMHead(nn.Module):
    """BERT-style MLM head whose output projection is the encoder's input embedding matrix.

    ``Linear(H, H) -> GELU -> LayerNorm -> x @ E^T + b``.  The embedding is referenced, not
    registered, so it appears once in the state dict (under the encoder).
    """

    def __init__(self, embedding: nn.Embedding, hidden_size: int, eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=eps)
        self.bias = nn.Parameter(torch.zeros(embedding.num_embeddings))
        self.__dict__["_embedding"] = embedding  # not a submodule: no duplicate in state_dict / optimiser

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(F.gelu(self.dense(states)))
        return F.linear(hidden, self._embedding.weight, self.bias)


@register_objective
class MaskedLanguageModeling(Objective):
    """Step-balanced MLM.

    Args:
        hidden_size: encoder width H (used when no ``lm_head`` is given).
        vocab_size: size of the vocabulary (random replacements are drawn from it).
        mask_token_id: id of [MASK].
        mask_prob: p, the fraction of each step's maskable tokens that is masked.
        special_token_ids: ids never masked, on top of ``text_step == -1`` and padding.
        lm_head: the encoder's LM head (H -> vocab); a fresh ``Linear`` when None.
        mask_token_frac / random_token_frac: the 80 / 10 (/ 10 unchanged) split.

    Targets: ``mlm_labels (B, T)`` (-100 where not masked).
    """

    name = "mlm"
    corrupts = frozenset({"tokens"})
    modalities = frozenset({"text"})
    target_layout = {"mlm_labels": ("text", IGNORE_INDEX)}
    always_on = True  # Wu et al. sec. 4.2: MLM at every step, the other objectives take turns

    @classmethod
    def from_encoder(cls, encoder: nn.Module, tie_lm_head: bool = True, **kwargs) -> "MaskedLanguageModeling":
        """MLM over ``encoder``'s tokenizer (vocabulary, [MASK], special tokens); ``tie_lm_head``: the
        head projects onto the encoder's word embeddings (BERT-style, :class:`TiedLMHead`) when the
        encoder exposes ``word_embeddings``, else a separate ``Linear``."""
        for attr in ("vocab_size", "mask_token_id", "special_token_ids"):
            if not hasattr(encoder, attr):
                raise ValueError(f"objective 'mlm' needs the encoder's {attr}; {type(encoder).__name__} has none")
        if encoder.mask_token_id < 0:
            raise ValueError(f"objective 'mlm': the tokenizer of {type(encoder).__name__} has no mask token")
        kwargs.setdefault("hidden_size", encoder.hidden_size)
        kwargs.setdefault("vocab_size", encoder.vocab_size)
        kwargs.setdefault("mask_token_id", encoder.mask_token_id)
        kwargs.setdefault("special_token_ids", list(encoder.special_token_ids))
        embeddings = getattr(encoder, "word_embeddings", None)
        if tie_lm_head and isinstance(embeddings, nn.Embedding):
            kwargs.setdefault("lm_head", TiedLMHead(embeddings, encoder.hidden_size))
        return cls(**kwargs)

    def __init__(self, hidden_size: int, vocab_size: int, mask_token_id: int, mask_prob: float = 0.15,
                 special_token_ids: Sequence[int] = (), lm_head: Optional[nn.Module] = None,
                 mask_token_frac: float = 0.8, random_token_frac: float = 0.1):
        super().__init__()
        if not 0.0 < mask_prob <= 1.0:
            raise ValueError(f"mlm: mask_prob must be in (0, 1], got {mask_prob}")
        if mask_token_frac < 0 or random_token_frac < 0 or mask_token_frac + random_token_frac > 1:
            raise ValueError("mlm: mask_token_frac and random_token_frac must be >= 0 and sum to <= 1")
        self.vocab_size = int(vocab_size)
        self.mask_token_id = int(mask_token_id)
        self.mask_prob = float(mask_prob)
        self.mask_token_frac = float(mask_token_frac)
        self.random_token_frac = float(random_token_frac)
        self.register_buffer("special_token_ids", torch.as_tensor(list(special_token_ids), dtype=torch.long),
                             persistent=False)
        self.lm_head = lm_head if lm_head is not None else nn.Linear(hidden_size, vocab_size)

    def maskable(self, batch: dict) -> torch.Tensor:
        """(B, T) bool: real tokens of a step that are not special tokens."""
        ids = batch["input_ids"]
        ok = batch["attention_mask"].bool() & (batch["text_step"] >= 0)
        if self.special_token_ids.numel():
            ok &= ~torch.isin(ids, self.special_token_ids.to(ids.device))
        return ok

    def corrupt(self, batch: dict, generator: torch.Generator) -> tuple[dict, dict]:
        ids = batch["input_ids"]
        selected = balanced_step_mask(self.maskable(batch), batch["text_step"], self.mask_prob, generator)
        action = uniform(tuple(ids.shape), generator, ids.device)
        to_mask = selected & (action < self.mask_token_frac)
        to_random = selected & (action >= self.mask_token_frac) & (action < self.mask_token_frac + self.random_token_frac)
        random_ids = randint(0, self.vocab_size, tuple(ids.shape), generator, ids.device)
        new_ids = torch.where(to_mask, torch.full_like(ids, self.mask_token_id), ids)
        new_ids = torch.where(to_random, random_ids, new_ids)

        corrupted = shallow_copy(batch)
        corrupted["input_ids"] = new_ids
        labels = torch.where(selected, ids, torch.full_like(ids, IGNORE_INDEX))
        return corrupted, {"mlm_labels": labels}

    def loss_count(self, targets: dict) -> torch.Tensor:
        return (targets["mlm_labels"] != IGNORE_INDEX).sum()

    @torch.no_grad()
    def show(self, outputs: EncoderOutput, targets: dict, rows: int, decode) -> tuple[list[str], list[str]]:
        """The masked tokens and the predicted ones, per sequence."""
        labels = targets["mlm_labels"][:rows]
        where = labels != IGNORE_INDEX
        pred = torch.full_like(labels, IGNORE_INDEX)
        if where.any():
            pred[where] = self.lm_head(outputs.text_states[:rows][where]).argmax(-1)
        words = lambda ids: " ".join(map(str, decode(ids)))  # noqa: E731
        return ([words(labels[b][where[b]].tolist()) for b in range(len(labels))],
                [words(pred[b][where[b]].tolist()) for b in range(len(labels))])

    def chance(self, stats: dict[str, float]) -> float:
        """A uniform guess over the vocabulary."""
        return 1.0 / self.vocab_size

    def outcomes(self, outputs: EncoderOutput, targets: dict, **extra) -> Outcomes:
        labels = targets["mlm_labels"]
        where = labels != IGNORE_INDEX
        logits = self.lm_head(outputs.text_states[where])  # only the masked positions (maybe none)
        gold = labels[where]
        return Outcomes(loss=F.cross_entropy(logits.float(), gold, reduction="none"), correct=logits.argmax(-1) == gold,
                        sample=where.nonzero()[:, 0])
