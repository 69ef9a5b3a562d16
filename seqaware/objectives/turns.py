"""Turn-taking between objectives (Wu et al. 2022, sec. 4.2) and the objective sets of their Table 3.

Every training step optimises ``L = L_MLM + L_obj`` where ``obj`` is drawn uniformly from the
enabled non-MLM objectives.  The draw depends only on ``(seed, global_step)``, so every DDP rank
picks the same objective for the same step without communicating (and a resumed run repeats it).
Image-only encoders have no MLM; text-only encoders have no visual objectives.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

from seqaware.objectives.registry import OBJECTIVES


MODALITIES = ("text", "image", "multimodal")

# Wu et al. 2022, Table 3
OBJECTIVE_SETS: dict[str, tuple[str, ...]] = {
    "mlm": ("mlm",),
    "mlm_isp": ("mlm", "isp"),
    "mlm_smrm": ("mlm", "smrm"),
    "mlm_isp_pisp": ("mlm", "isp", "pisp"),
    "mlm_isp_smrm": ("mlm", "isp", "smrm"),
    "all": ("mlm", "isp", "pisp", "smrm"),
    "isp": ("isp",),
    "isp_pisp": ("isp", "pisp"),
    "isp_pisp_smrm": ("isp", "pisp", "smrm"),
}


def resolve_objectives(names: str | Iterable[str]) -> tuple[str, ...]:
    """A set name from :data:`OBJECTIVE_SETS` or a list of objective names -> a tuple of names."""
    if isinstance(names, str):
        if names not in OBJECTIVE_SETS:
            raise ValueError(f"unknown objective set {names!r}; known sets: {sorted(OBJECTIVE_SETS)}")
        return OBJECTIVE_SETS[names]
    return tuple(names)


def check_objectives(names: str | Iterable[str], modality: str) -> tuple[str, ...]:
    """Validate an objective set against the encoder's modality; returns the resolved names.

    Raises ``ValueError`` for unknown or duplicate objectives, an empty set, MLM with an image-only
    encoder and visual objectives (ISP/PISP/SMRM) with a text-only encoder.
    """
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    resolved = resolve_objectives(names)
    if not resolved:
        raise ValueError("the objective set is empty")
    unknown = [n for n in resolved if n not in OBJECTIVES]
    if unknown:
        raise ValueError(f"unknown objectives {unknown}; registered: {sorted(OBJECTIVES)}")
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"duplicate objectives in {list(resolved)}")
    available = {"text": {"text"}, "image": {"image"}, "multimodal": {"text", "image"}}[modality]
    for name in resolved:
        missing = OBJECTIVES[name].modalities - available
        if missing:
            hint = " (image-only encoders have no text: drop 'mlm', e.g. use the 'isp' or 'isp_pisp_smrm' sets)" \
                if name == "mlm" else " (text-only encoders have no images: use the 'mlm' set)"
            raise ValueError(f"objective {name!r} needs {sorted(missing)} input, but the encoder modality is "
                             f"{modality!r}{hint}")
    return resolved


class ObjectiveSchedule:
    """Which objectives run at a given global step.

    ``always`` objectives (default: the registered classes with ``always_on``, i.e. MLM) run every
    step when enabled (names that are not enabled are ignored); one of the remaining enabled objectives
    is drawn uniformly per step from a generator seeded by ``(seed, global_step)`` only.
    """

    def __init__(self, enabled: str | Sequence[str], seed: int = 0, always: Optional[Sequence[str]] = None):
        names = resolve_objectives(enabled)
        if not names:
            raise ValueError("ObjectiveSchedule needs at least one objective")
        self.seed = int(seed)
        if always is None:  # the registered classes say which objectives run at every step
            always = [n for n in names if n in OBJECTIVES and OBJECTIVES[n].always_on]
        always = [always] if isinstance(always, str) else list(always)
        unknown = [n for n in always if n not in OBJECTIVES]
        if unknown:
            raise ValueError(f"model.objectives.always names unknown objectives {unknown}; "
                             f"registered: {sorted(OBJECTIVES)}")
        self.always = tuple(n for n in names if n in always)
        self.rotating = tuple(n for n in names if n not in always)

    def draw(self, global_step: int) -> tuple[str, ...]:
        """The objectives of step ``global_step``: the always-on ones plus one drawn objective."""
        if not self.rotating:
            return self.always
        rng = np.random.default_rng([self.seed, int(global_step)])
        return self.always + (self.rotating[int(rng.integers(len(self.rotating)))],)

    __call__ = draw
