"""Seeded corruption: stable seeds, CPU generators, corrupting samples one by one, and the order
in which the objectives of a step corrupt (:func:`corruption_order`, :func:`check_corruption`).

``generator_scope: sample`` (and every evaluation) corrupts each sample with its own generator,
seeded by the sample's id, after cutting it to its own length, so the draw does not depend on the
batch it falls in, on the number of processes or on the device
(:class:`seqaware.modules.pretraining.PretrainingModule`).
"""
from __future__ import annotations

import hashlib
from typing import Any, Optional

import torch

from seqaware.encoders.contract import FUSION_LAYOUT
from seqaware.objectives.base import CORRUPTIONS, MOVES, Objective


def stable_seed(*keys: Any) -> int:
    """A 63-bit seed from any printable keys, identical across processes and Python runs
    (``hash()`` of a string is salted per process, so it cannot be used)."""
    digest = hashlib.blake2b("\x1f".join(map(str, keys)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def cpu_generator(seed: int) -> torch.Generator:
    """A CPU generator: the same numbers on every device (objectives move their noise to the data)."""
    return torch.Generator().manual_seed(int(seed))


def _slice_sample(tensors: dict, b: int, length: int, steps: int, layout: dict) -> dict:
    """Sample ``b`` of every entry, cut to its own ``length`` tokens and ``steps`` steps."""
    out = {}
    for key, value in tensors.items():
        kind = layout.get(key, ("sample", None))[0]
        row = value[b:b + 1]
        if kind == "text":
            row = row[:, :length]
        elif kind == "step":
            row = row[:, :steps]
        out[key] = row
    return out


def _pad_like(value: torch.Tensor, kind: str, fill: Any, template: Optional[torch.Tensor],
              T: int, S: int) -> torch.Tensor:
    """Pad a (1, t, ...) / (1, s, ...) sample back to the batch's T / S (template row or ``fill``)."""
    if kind == "sample":
        return value
    full = T if kind == "text" else S
    if value.shape[1] == full:
        return value
    if template is not None:
        out = template.clone()
    else:
        out = value.new_full((1, full, *value.shape[2:]), fill)
    out[:, :value.shape[1]] = value
    return out


def corrupt_per_sample(objective: Objective, fusion: dict, lengths: torch.Tensor, steps: torch.Tensor,
                       seeds: list[int]) -> tuple[dict, dict]:
    """Corrupt every sample on its own, cut to its real length, with the generator of its seed.

    ``lengths`` (B,) real tokens per sample (0 without text), ``steps`` (B,) real steps.  The
    pieces are padded back to the batch shape (fusion entries by :data:`FUSION_LAYOUT`, targets by
    the objective's ``target_layout``) and concatenated; untouched entries are shared.
    """
    B = len(seeds)
    T = fusion["input_ids"].shape[1] if "input_ids" in fusion else 0
    S = fusion["visual_mask"].shape[1] if "visual_mask" in fusion else 0
    lengths_l, steps_l = lengths.tolist(), steps.tolist()
    parts_in: list[dict] = []
    parts_tgt: list[dict] = []
    changed: dict[str, None] = {}
    for b in range(B):  # the corruption only: a few small ops per sample
        sample = _slice_sample(fusion, b, lengths_l[b], steps_l[b], FUSION_LAYOUT)
        corrupted, targets = objective.corrupt(sample, cpu_generator(seeds[b]))
        changed.update({k: None for k, v in corrupted.items() if v is not sample.get(k)})
        parts_in.append(corrupted)
        parts_tgt.append(targets)
    out = dict(fusion)
    for key in changed:
        kind, fill = FUSION_LAYOUT.get(key, ("sample", None))
        out[key] = torch.cat([_pad_like(p[key], kind, fill, fusion[key][b:b + 1] if key in fusion else None, T, S)
                              for b, p in enumerate(parts_in)])
    targets = {}
    for key in parts_tgt[0]:
        if key not in objective.target_layout:
            raise ValueError(f"{objective.name}: target {key!r} has no entry in {type(objective).__name__}."
                             "target_layout (text / step / sample layout and padding); add it or use "
                             "model.generator_scope=rank")
        kind, fill = objective.target_layout[key]
        targets[key] = torch.cat([_pad_like(p[key], kind, fill, None, T, S) for p in parts_tgt])
    return out, targets


def corruption_kinds(objective: Objective) -> frozenset[str]:
    """The kinds of :data:`~seqaware.objectives.base.CORRUPTIONS` ``objective`` declares; an objective
    that declares none, or an unknown kind, is refused (the order of corruptions depends on it)."""
    kinds = type(objective).corrupts
    if kinds is None:
        raise ValueError(f"objective {objective.name!r} ({type(objective).__module__}.{type(objective).__qualname__}) "
                         f"does not declare what it corrupts: set its class attribute `corrupts` to a set of "
                         f"{list(CORRUPTIONS)} (an empty set if it corrupts nothing)")
    unknown = sorted(set(kinds) - set(CORRUPTIONS))
    if unknown:
        raise ValueError(f"objective {objective.name!r}: unknown corruption kinds {unknown} in `corrupts`; "
                         f"known kinds, in the order they are applied: {list(CORRUPTIONS)}")
    return frozenset(kinds)


def corruption_order(objectives: dict[str, Objective], names: tuple[str, ...] | list[str]) -> list[str]:
    """``names`` in the order their objectives corrupt: by the latest of their kinds in
    :data:`~seqaware.objectives.base.CORRUPTIONS` (moves before masks), ties kept in the given order."""
    rank = {kind: i for i, kind in enumerate(CORRUPTIONS)}

    def position(name: str) -> int:
        kinds = corruption_kinds(objectives[name])
        return max((rank[k] for k in kinds), default=-1)

    return sorted(names, key=position)


def moves(objective: Objective) -> bool:
    """Whether ``objective`` moves content (a clean pass sees the input after it)."""
    return bool(corruption_kinds(objective) & set(MOVES))


def check_corruption(objective: Objective, before: dict, after: dict) -> None:
    """Raise when ``objective.corrupt`` changed a fusion entry outside the kinds it declares."""
    allowed = {key for kind in corruption_kinds(objective) for key in CORRUPTIONS[kind]}
    changed = sorted(k for k, v in after.items() if v is not before.get(k) and k not in allowed)
    if changed:
        raise ValueError(f"objective {objective.name!r} changed the fusion entries {changed}, which its declared "
                         f"corruptions {sorted(corruption_kinds(objective))} do not cover; declare the kinds that "
                         f"change them in `corrupts` ({ {k: list(v) for k, v in CORRUPTIONS.items()} })")
