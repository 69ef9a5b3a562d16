"""Decoding an order from pairwise precedence scores.

``pair_logits[b, i, j]`` is the logit of "step i comes before step j" (only entries with both
steps valid are used); ``step_mask[b, i]`` marks real steps. Orders are returned as lists of input
positions in predicted execution order, one list per instance.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from decoders.registry import DECODERS, PAIRWISE_DECODERS


def _valid_pairs(step_mask: torch.Tensor) -> torch.Tensor:
    n = step_mask.shape[1]
    eye = torch.eye(n, dtype=torch.bool, device=step_mask.device)
    return step_mask[:, :, None] & step_mask[:, None, :] & ~eye


def pair_log_probs(pair_logits: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """``log P(i before j)`` from logits of both directions, made consistent: with
    ``s_ij = (l_ij - l_ji) / 2`` it is ``log sigmoid(s_ij)``, so P(i before j) + P(j before i) = 1.
    Invalid pairs (padding, i == j) get 0."""
    sym = (pair_logits.float() - pair_logits.float().transpose(1, 2)) / 2
    return F.logsigmoid(sym) * _valid_pairs(step_mask)


@DECODERS.register("borda", needs="pair_logits")
def borda_order(pair_logits: torch.Tensor, step_mask: torch.Tensor) -> list[list[int]]:
    """Sort steps by their expected number of wins, sum_j P(i before j) (ties: lower index first)."""
    wins = (torch.sigmoid(pair_logits) * _valid_pairs(step_mask)).sum(-1)
    wins = wins.masked_fill(~step_mask, float("-inf"))
    orders = []
    for b in range(wins.shape[0]):
        n = int(step_mask[b].sum())
        # stable sort on -wins keeps the lower index first on ties
        ranked = torch.sort(-wins[b], stable=True).indices[:n]
        orders.append([int(i) for i in ranked])
    return orders


@DECODERS.register("pairwise_greedy", needs="pair_logits")
def greedy_order(pair_logits: torch.Tensor, step_mask: torch.Tensor) -> list[list[int]]:
    """Repeatedly pick the remaining step with the highest sum_j log P(i before j) over remaining j."""
    log_before = F.logsigmoid(pair_logits.float())
    valid = _valid_pairs(step_mask)
    orders = []
    for b in range(pair_logits.shape[0]):
        remaining = step_mask[b].clone()
        order = []
        for _ in range(int(step_mask[b].sum())):
            mask = valid[b] & remaining[None, :] & remaining[:, None]
            score = (log_before[b] * mask).sum(-1).masked_fill(~remaining, float("-inf"))
            pick = int(torch.argmax(score))
            order.append(pick)
            remaining[pick] = False
        orders.append(order)
    return orders


def decode_pairwise(name: str, pair_logits: torch.Tensor, step_mask: torch.Tensor) -> list[list[int]]:
    """Decode with the pairwise decoder registered as ``name``; an unknown name raises
    :class:`registry.UnknownNameError` listing the pairwise decoders (:data:`decoders.PAIRWISE_DECODERS`)."""
    return PAIRWISE_DECODERS[name](pair_logits, step_mask)
