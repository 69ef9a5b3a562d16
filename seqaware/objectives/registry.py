"""The objective registry: ``model.objectives.enabled`` names -> :class:`Objective` subclasses.

An objective is registered where it is defined, with ``@register_objective`` above its class (under
its ``name``); the registry imports every module of :mod:`seqaware.objectives` when first read, so a
new objective is one new file there (plus its entry of ``configs/objectives/``).
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from registry import Registry
from seqaware.objectives.base import Objective


def _check_objective(name: str, cls: Any, tags: dict) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Objective)) or cls.name == Objective.name:
        raise TypeError(f"register_objective takes an Objective subclass with its own name, got {cls!r}")


OBJECTIVES: Registry = Registry("objective", package="seqaware.objectives", name_of=lambda cls: getattr(cls, "name", ""),
                                check=_check_objective)


def register_objective(cls: type[Objective]) -> type[Objective]:
    """Register an :class:`Objective` subclass under its ``name`` (a class decorator);
    ``model.objectives.enabled`` can then name it and ``model.objectives.<name>`` configures it."""
    return OBJECTIVES.register()(cls)


def build_objective(name: str, encoder: Optional[nn.Module] = None, **kwargs) -> Objective:
    """Instantiate the objective registered as ``name``: from ``encoder`` when given
    (:meth:`Objective.from_encoder`), else from the keyword arguments alone."""
    cls = OBJECTIVES.lookup(name)
    return cls.from_encoder(encoder, **kwargs) if encoder is not None else cls(**kwargs)
