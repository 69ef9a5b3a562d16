"""The task view registry: ``data.task`` names -> :class:`~data_modules.views.base.TaskView` subclasses.

A view is registered where it is defined, with ``@register_view`` above its class (under its ``task``);
the registry imports every module of :mod:`data_modules.views` when first read, so a new task view is one
new file there (plus, when it needs its own settings, a ``configs/data/`` file or an experiment setting
``data.task``).
"""
from __future__ import annotations

from typing import Any

from data_modules.views.base import TaskView
from registry import Registry


def _check_view(name: str, cls: Any, tags: dict) -> None:
    if not (isinstance(cls, type) and issubclass(cls, TaskView)) or not cls.task:
        raise TypeError(f"register_view takes a TaskView subclass with its own task name, got {cls!r}")
    fields = cls.fields
    if not isinstance(fields, tuple) or not all(isinstance(f, str) and f for f in fields):
        raise TypeError(f"task view {name!r} ({cls.__module__}:{cls.__qualname__}): fields must be a tuple of "
                        f"ViewItem.meta keys, got {fields!r}")


VIEWS: Registry = Registry("task view", package="data_modules.views", name_of=lambda cls: getattr(cls, "task", ""),
                           check=_check_view)


def register_view(cls: type[TaskView]) -> type[TaskView]:
    """Register a :class:`TaskView` subclass under its ``task`` (a class decorator); ``data.task`` can then
    name it and ``data.view`` gives its arguments."""
    return VIEWS.register()(cls)
