"""Task views: datasets built on procedures, one registered class per ``data.task``.

* :class:`SequencingView` (``sequencing``) -- the steps of a procedure in a seeded shuffled order; the target is
  the authored order; references are the explicit alternatives or all linear extensions of the DAG.
* :class:`PretrainingView` (``pretraining``) -- ordered (sub-)sequences of at least ``min_steps`` steps.

:data:`VIEWS` holds every view under its ``task``; a new view is a :class:`TaskView` subclass with
``@register_view`` in a new module of this package (the registry imports them all when first read).  What a
view shares (item, length policy, epoch keys) is in :mod:`.base`.
"""
from data_modules.views.base import TaskView, ViewItem, reference_orders, restrict_procedure
from data_modules.views.pretraining import PretrainingView
from data_modules.views.registry import VIEWS, register_view
from data_modules.views.sequencing import SequencingView

__all__ = ["VIEWS", "PretrainingView", "SequencingView", "TaskView", "ViewItem", "reference_orders", "register_view",
           "restrict_procedure"]
