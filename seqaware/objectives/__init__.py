"""Sequence-aware pretraining objectives (Wu et al., ACL 2022, sec. 4.1-4.2).

``OBJECTIVES`` maps a name to its class; :func:`build_objective` instantiates one.  The
encoder/objective contract is described in :mod:`seqaware.objectives.base`; turn-taking and the
objective sets of Table 3 live in :mod:`seqaware.objectives.turns`.
"""
from __future__ import annotations

from torch import nn

from seqaware.objectives.base import EncoderOutput, Objective
from seqaware.objectives.isp import ImageSwapPrediction
from seqaware.objectives.mlm import MaskedLanguageModeling
from seqaware.objectives.pisp import PatchSwapPrediction
from seqaware.objectives.smrm import SequentialMaskedRegionModeling

OBJECTIVES: dict[str, type[Objective]] = {
    "mlm": MaskedLanguageModeling,
    "isp": ImageSwapPrediction,
    "pisp": PatchSwapPrediction,
    "smrm": SequentialMaskedRegionModeling,
}


def build_objective(name: str, **kwargs) -> nn.Module:
    """Instantiate the objective registered as ``name`` with its keyword arguments."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; registered: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name](**kwargs)


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
    "build_objective",
    "check_objectives",
]
