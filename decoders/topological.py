"""Pairwise precedence classifier + topological sort (B-TSort style, Prabhumoye et al. 2020).

Each unordered pair {i, j} becomes one directed edge, i -> j when P(i before j) > 0.5 (the pair's
two logits are combined antisymmetrically, see :func:`decoders.pairwise.pair_log_probs`).  The
order is a topological sort of that tournament graph.  Tournaments usually contain cycles; they are
broken deterministically: when no remaining step is free of incoming edges, the step whose incoming
edges are *least* confident (smallest summed P(k before it) over remaining k) is taken next, ties
by the lower index.  Without cycles this is an ordinary topological sort that, among free steps,
takes the one with the most confident outgoing edges first.
"""
from __future__ import annotations

import torch

from decoders.pairwise import pair_log_probs
from decoders.registry import DECODERS


@DECODERS.register("topological", needs="pair_logits")
def topological_order(pair_logits: torch.Tensor, step_mask: torch.Tensor) -> list[list[int]]:
    """A topological sort of the predicted precedence tournament, cycles broken as the module says."""
    probs = pair_log_probs(pair_logits, step_mask).exp().cpu()
    orders = []
    for b in range(probs.shape[0]):
        p = probs[b]
        remaining = [int(i) for i in step_mask[b].nonzero().flatten()]
        order = []
        while remaining:
            incoming = {v: sum(float(p[u, v]) for u in remaining if u != v) for v in remaining}
            free = [v for v in remaining if all(float(p[u, v]) <= 0.5 for u in remaining if u != v)]
            if free:
                outgoing = {v: sum(float(p[v, u]) for u in remaining if u != v) for v in free}
                pick = min(free, key=lambda v: (-outgoing[v], v))
            else:  # a cycle: break it at the step with the weakest incoming edges
                pick = min(remaining, key=lambda v: (incoming[v], v))
            order.append(pick)
            remaining.remove(pick)
        orders.append(order)
    return orders
