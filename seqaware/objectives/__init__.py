"""Sequence-aware pretraining objectives (Wu et al., ACL 2022, sec. 4.1-4.2).

``OBJECTIVES`` maps a name to its class: each objective module registers its class with
``@register_objective`` and the registry finds every module of this package
(:mod:`seqaware.objectives.registry`); :func:`build_objective` instantiates one.  What an objective
is and knows is described in :mod:`seqaware.objectives.base`; seeded per-sample corruption in
:mod:`seqaware.objectives.corruption`; turn-taking and the objective sets of Table 3 live in
:mod:`seqaware.objectives.turns`.
"""
from __future__ import annotations

from seqaware.objectives.base import EncoderOutput, Objective, Outcomes
from seqaware.objectives.registry import OBJECTIVES, build_objective, register_objective
from seqaware.objectives.turns import OBJECTIVE_SETS, ObjectiveSchedule, check_objectives
# the built-in classes, importable from here too (their modules register them, not these imports)
from seqaware.objectives.isp import ImageSwapPrediction
from seqaware.objectives.mlm import MaskedLanguageModeling
from seqaware.objectives.pisp import PatchSwapPrediction
from seqaware.objectives.smrm import SequentialMaskedRegionModeling
from seqaware.objectives.sop import StepOrderPrediction

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
