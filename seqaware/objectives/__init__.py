"""Sequence-aware pretraining objectives (Wu et al., ACL 2022, sec. 4.1-4.2).

``OBJECTIVES`` maps a name to its class (:func:`register_objective` adds one);
:func:`build_objective` instantiates one.  What an objective is and knows is described in
:mod:`seqaware.objectives.base`; seeded per-sample corruption in
:mod:`seqaware.objectives.corruption`; turn-taking and the
objective sets of Table 3 live in :mod:`seqaware.objectives.turns`.
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from seqaware.objectives.base import EncoderOutput, Objective, Outcomes
from seqaware.objectives.isp import ImageSwapPrediction
from seqaware.objectives.mlm import MaskedLanguageModeling
from seqaware.objectives.pisp import PatchSwapPrediction
from seqaware.objectives.smrm import SequentialMaskedRegionModeling
from seqaware.objectives.sop import StepOrderPrediction

OBJECTIVES: dict[str, type[Objective]] = {
    "mlm": MaskedLanguageModeling,
    "isp": ImageSwapPrediction,
    "pisp": PatchSwapPrediction,
    "smrm": SequentialMaskedRegionModeling,
    "sop": StepOrderPrediction,
}


def register_objective(cls: type[Objective]) -> type[Objective]:
    """Register an :class:`Objective` subclass under its ``name`` (usable as a class decorator);
    ``model.objectives.enabled`` can then name it and ``model.objectives.<name>`` configures it."""
    if not (isinstance(cls, type) and issubclass(cls, Objective)) or cls.name == Objective.name:
        raise TypeError(f"register_objective takes an Objective subclass with its own name, got {cls!r}")
    OBJECTIVES[cls.name] = cls
    return cls


def build_objective(name: str, encoder: Optional[nn.Module] = None, **kwargs) -> Objective:
    """Instantiate the objective registered as ``name``: from ``encoder`` when given
    (:meth:`Objective.from_encoder`), else from the keyword arguments alone."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; registered: {sorted(OBJECTIVES)}")
    cls = OBJECTIVES[name]
    return cls.from_encoder(encoder, **kwargs) if encoder is not None else cls(**kwargs)


# imported after OBJECTIVES exists: turns validates objective sets against this registry
from seqaware.objectives.turns import OBJECTIVE_SETS, ObjectiveSchedule, check_objectives  # noqa: E402

__all__ = [
    "OBJECTIVES",
    "OBJECTIVE_SETS",
    "EncoderOutput",
    "ImageSwapPrediction",
    "MaskedLanguageModeling",
    "Objective",
    "ObjectiveSchedule",
    "PatchSwapPrediction",
    "SequentialMaskedRegionModeling",
    "StepOrderPrediction",
    "Outcomes",
    "build_objective",
    "check_objectives",
    "register_objective",
]
