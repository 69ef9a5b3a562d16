"""The decoder registry: every order decoder under one unique name, with what it needs.

A decoder is registered where it is defined, with ``@DECODERS.register(NAME, needs=...)``:

``needs="pair_logits"``
    ``decode(pair_logits (B, n, n), step_mask (B, n)) -> orders``: any model with a pairwise head.
``needs="pointer"``
    ``decode(network, state, beam_size) -> orders``: BERSON's pointer network
    (:class:`decoders.berson.BersonDecoder` and its :class:`~decoders.berson.BersonState`).

Orders are lists of input positions, first step first.  A model says what it provides and takes
any registered decoder that fits (:func:`fitting_decoder`); the registry imports every module of
:mod:`decoders` when first read, so a new decoder is one new file there.
"""
from __future__ import annotations

from typing import Any, Iterable

from registry import Registry

NEEDS = {"pair_logits": "pairwise logits", "pointer": "a pointer network"}
"""What a decoder can need, and how a message says it."""


def _check_needs(name: str, obj: Any, tags: dict) -> None:
    if tags.get("needs") not in NEEDS:
        raise TypeError(f"decoder {name!r} ({obj!r}) must say what it needs: needs= one of {sorted(NEEDS)}, "
                        f"got {tags.get('needs')!r}")


DECODERS: Registry = Registry("decoder", package="decoders", check=_check_needs)
PAIRWISE_DECODERS = DECODERS.view("pairwise decoder", needs="pair_logits")
"""The decoders of pairwise logits: ``PAIRWISE_DECODERS[name](pair_logits, step_mask) -> orders``."""


def fitting_decoder(name: str, provides: Iterable[str], key: str) -> str:
    """What decoder ``name`` needs, when a model providing ``provides`` (``pair_logits``,
    ``pointer``) can run it; otherwise a ``ValueError`` naming the config ``key`` and listing every
    registered decoder that fits the model."""
    provides = set(provides)
    fitting = DECODERS.names(needs=provides)
    if name in fitting:
        return DECODERS.tags(name)["needs"]
    if name in DECODERS:
        needs = DECODERS.tags(name)["needs"]
        reason = f"{key}={name} needs {NEEDS[needs]}, which this model does not have"
    else:
        reason = f"{key}={name} is not a registered decoder"
    raise ValueError(f"{reason}; decoders that fit this model: {', '.join(fitting)}")
