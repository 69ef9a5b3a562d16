"""Order decoders, each registered by name in :data:`DECODERS` (:mod:`decoders.registry`).

A decoder is a function in a module of this package, registered with
``@DECODERS.register(NAME, needs="pair_logits" | "pointer")``: the pairwise ones take
``(pair_logits (B, n, n), step_mask (B, n))`` (:data:`PAIRWISE_DECODERS`), the pointer ones BERSON's
pointer network and its state (:mod:`decoders.berson`).  Each function's docstring says how it
decodes.  A model takes every registered decoder that fits it (``model.decoding`` of BERSON: the
pointer and the pairwise ones, since BERSON also exposes pairwise logits; ``model.decoder`` of the
order baseline: the pairwise ones), and a name that does not fit is an error listing those that do.
"""
from __future__ import annotations

from decoders.exact import exact_order
from decoders.pairwise import borda_order, decode_pairwise, greedy_order
from decoders.registry import DECODERS, PAIRWISE_DECODERS, fitting_decoder
from decoders.topological import topological_order

__all__ = ["DECODERS", "PAIRWISE_DECODERS", "decode_pairwise", "fitting_decoder", "borda_order", "greedy_order",
           "topological_order", "exact_order"]
