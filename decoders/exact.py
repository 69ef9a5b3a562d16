"""Exact order search for small n: the permutation maximising the summed pairwise log-probabilities.

``score(order) = sum over i placed before j of log P(i before j)``.  Dynamic programming over
subsets (Held-Karp style): ``best[S] = max_{v in S} best[S - v] + sum_{u in S - v} lp[u, v]`` with
``S`` the set of steps placed first, so the cost is O(2^n * n^2) -- exact and fast up to n = 10
(``max_steps``), and refused beyond it.
"""
from __future__ import annotations

import numpy as np
import torch

from decoders.pairwise import pair_log_probs
from decoders.registry import DECODERS

MAX_EXACT_STEPS = 10


def check_exact_steps(max_steps: int | None, decoder_key: str, steps_key: str = "data.view.max_steps") -> None:
    """Refuse, before any training, data whose instances can hold more steps than the exact decoder
    handles (``max_steps`` None: unbounded)."""
    if max_steps is None or int(max_steps) > MAX_EXACT_STEPS:
        raise ValueError(f"{decoder_key}=exact handles at most {MAX_EXACT_STEPS} steps but {steps_key}={max_steps} "
                         f"lets instances hold more: lower {steps_key} or use another decoder")


def exact_order_single(lp: np.ndarray) -> list[int]:
    """The best order for one instance given ``lp[i, j] = log P(i before j)`` (n x n)."""
    n = lp.shape[0]
    if n > MAX_EXACT_STEPS:
        raise ValueError(f"the exact decoder handles at most {MAX_EXACT_STEPS} steps, got {n}: "
                         "use another decoder")
    if n <= 1:
        return list(range(n))
    full = 1 << n
    best = np.full(full, -np.inf)
    choice = np.full(full, -1, dtype=np.int64)
    best[0] = 0.0
    bits = [1 << v for v in range(n)]
    for subset in range(1, full):
        members = [u for u in range(n) if subset & bits[u]]
        for v in members:
            rest = subset ^ bits[v]
            # v placed last among `subset`: every other member precedes it
            value = best[rest] + sum(lp[u, v] for u in members if u != v)
            if value > best[subset]:  # strict: ties keep the smaller v (deterministic)
                best[subset], choice[subset] = value, v
    order, subset = [], full - 1
    while subset:
        v = int(choice[subset])
        order.append(v)
        subset ^= bits[v]
    return order[::-1]


@DECODERS.register("exact", needs="pair_logits")
def exact_order(pair_logits: torch.Tensor, step_mask: torch.Tensor) -> list[list[int]]:
    """Per instance, the order maximising the summed pairwise log-probabilities over its real steps."""
    lp = pair_log_probs(pair_logits, step_mask).cpu().numpy()
    orders = []
    for b in range(lp.shape[0]):
        real = step_mask[b].nonzero().flatten().tolist()
        sub = lp[b][np.ix_(real, real)]
        orders.append([real[k] for k in exact_order_single(sub)])
    return orders
