"""Order decoders.

Pairwise decoders share one interface, ``decode(pair_logits (B, n, n), step_mask (B, n)) -> orders``
(each order a list of input positions, first step first), registered in :data:`PAIRWISE_DECODERS`:

* ``borda`` -- sort by expected wins;
* ``greedy`` -- repeatedly take the step that most confidently precedes the remaining ones;
* ``topological`` -- B-TSort: topological sort of the predicted precedence graph, cycles broken
  deterministically (:mod:`decoders.topological`);
* ``exact`` -- the order maximising the summed pairwise log-probabilities, n <= 10 (:mod:`decoders.exact`).

The BERSON pointer network (:mod:`decoders.berson`) decodes with its own greedy and beam search
and also exposes pairwise logits, so every decoder above applies to it too.
"""
from __future__ import annotations

from typing import Callable

import torch

from decoders.exact import exact_order
from decoders.pairwise import borda_order, decode_pairwise, greedy_order
from decoders.topological import topological_order

PairwiseDecoder = Callable[[torch.Tensor, torch.Tensor], list[list[int]]]

PAIRWISE_DECODERS: dict[str, PairwiseDecoder] = {
    "borda": borda_order,
    "greedy": greedy_order,
    "topological": topological_order,
    "exact": exact_order,
}

__all__ = ["PAIRWISE_DECODERS", "decode_pairwise", "borda_order", "greedy_order", "topological_order", "exact_order"]
