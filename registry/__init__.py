"""Named choices: the one registry class behind everything a config picks by name.

Objectives (:data:`seqaware.objectives.OBJECTIVES`), order decoders (:data:`decoders.DECODERS`),
dataset adapters (:data:`data_modules.adapters.ADAPTERS`), sequence encoders and visual backbones
(:data:`seqaware.encoders.ENCODERS`, :data:`seqaware.encoders.visual.VISUAL_BACKBONES`) are each a
:class:`Registry`.  An entry is registered where it is defined, with the registry's decorator::

    @ADAPTERS.register("howto")
    def convert(src, out_images, **options): ...

and a registry imports every module of its package the first time it is read
(:meth:`Registry.discover`), so a new file in that package with its decorator is the only Python
change.  A name registered twice is an error naming both places (``module:qualname``); an unknown
name is an error listing the registered ones.  A registry is a mapping ``name -> entry``; tags given
at registration (``needs="pointer"``) say what an entry needs, and :meth:`Registry.names` /
:meth:`Registry.view` select by them.  This package imports nothing of the project.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, Optional, TypeVar

T = TypeVar("T")

__all__ = ["DuplicateNameError", "Registry", "RegistryView", "UnknownNameError", "place"]


class DuplicateNameError(ValueError):
    """Two different entries of one registry claim the same name."""


class UnknownNameError(KeyError, ValueError):
    """A name no entry of the registry has: a ``KeyError`` (the registry is a mapping) and a
    ``ValueError`` (the name came from a config); its text is the message itself, unquoted."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def place(obj: Any) -> str:
    """Where ``obj`` is defined, as ``module:qualname``."""
    module = getattr(obj, "__module__", None) or type(obj).__module__
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}:{qualname}"


def _matches(value: Any, wanted: Any) -> bool:
    """A tag value matches ``wanted``, or one of ``wanted`` when it is a set, tuple or list."""
    if isinstance(wanted, (set, frozenset, tuple, list)):
        return value in wanted
    return value == wanted


class Registry(MutableMapping[str, T]):
    """``name -> entry`` for one kind of choice, filled by decorators in the modules of ``package``.

    Args:
        kind: what an entry is, in messages (``"objective"``, ``"dataset adapter"``).
        package: the dotted package whose modules :meth:`discover` imports (None: no discovery).
        name_of: the name of an entry registered without one (default: its ``__name__``).
        check: ``check(name, entry, tags)`` raises ``TypeError`` for an entry the registry refuses.
    """

    def __init__(self, kind: str, package: Optional[str] = None, name_of: Optional[Callable[[Any], str]] = None,
                 check: Optional[Callable[[str, Any, dict], None]] = None):
        self.kind = kind
        self.package = package
        self._name_of = name_of or (lambda obj: obj.__name__)
        self._check = check
        self._entries: dict[str, T] = {}
        self._tags: dict[str, dict[str, Any]] = {}
        self._discovered = package is None

    # ------------------------------------------------------------------------------ registering
    def register(self, name: Any = None, **tags: Any) -> Callable[[T], T]:
        """Decorator registering an entry under ``name`` (default: ``name_of(entry)``) with ``tags``;
        ``@registry.register`` without parentheses works too."""
        if name is not None and not isinstance(name, str):
            return self.register()(name)

        def decorate(obj: T) -> T:
            self.add(self._name_of(obj) if name is None else name, obj, **tags)
            return obj

        return decorate

    def add(self, name: str, obj: T, **tags: Any) -> None:
        """Register ``obj`` as ``name``.  The same definition registered again (a module reloaded)
        replaces itself; another one under a taken name raises :class:`DuplicateNameError`."""
        if self._check is not None:
            self._check(name, obj, tags)
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {self.kind} is registered under a non-empty name, got {name!r} for {place(obj)}")
        old = self._entries.get(name)
        if old is not None and old is not obj and place(old) != place(obj):
            raise DuplicateNameError(f"{self.kind} {name!r} is registered twice: by {place(old)} and by {place(obj)}")
        self._entries[name] = obj
        self._tags[name] = dict(tags)

    def discover(self, again: bool = False) -> None:
        """Import every module of the registry's package, so their decorators run: once, at the first
        read (``again``: also the modules added since).  A module that fails to import raises here,
        and the next read tries again."""
        if self._discovered and not again:
            return
        self._discovered = True  # before importing: a module may read the registry while it loads
        try:
            package = importlib.import_module(self.package)
            for info in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self.package}.{info.name}")
        except BaseException:
            self._discovered = False
            raise

    # ------------------------------------------------------------------------------ reading
    def __getitem__(self, name: str) -> T:
        self.discover()
        try:
            return self._entries[name]
        except KeyError:
            raise self.unknown(name) from None

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self.discover()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self.discover()
        return len(self._entries)

    def __setitem__(self, name: str, obj: T) -> None:
        self.add(name, obj)

    def __delitem__(self, name: str) -> None:
        self[name]  # an unknown name raises, listing the registered ones
        del self._entries[name], self._tags[name]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

    def lookup(self, name: str, key: Optional[str] = None) -> T:
        """The entry ``name``; an unknown name raises :class:`UnknownNameError` naming the config
        ``key`` it came from (if given) and listing the registered names."""
        if name not in self:
            raise self.unknown(name, key)
        return self._entries[name]

    def unknown(self, name: Any, key: Optional[str] = None, names: Optional[list[str]] = None) -> UnknownNameError:
        """The error for a name that is not registered (``names``: the ones to list; default all)."""
        listed = self.names() if names is None else names
        source = f" ({key})" if key else ""
        return UnknownNameError(f"unknown {self.kind} {name!r}{source}; registered: {', '.join(listed)}")

    def tags(self, name: str) -> dict[str, Any]:
        """The tags ``name`` was registered with."""
        self[name]
        return dict(self._tags[name])

    def where(self, name: str) -> str:
        """``module:qualname`` of the entry ``name``."""
        return place(self[name])

    def names(self, **tags: Any) -> list[str]:
        """The registered names, sorted; with ``tags``, those whose tags match every one given (a
        set, tuple or list matches any of its values)."""
        self.discover()
        return sorted(n for n, t in self._tags.items()
                      if all(k in t and _matches(t[k], wanted) for k, wanted in tags.items()))

    def view(self, kind: str, **tags: Any) -> "RegistryView[T]":
        """A read-only mapping of the entries whose tags match (see :meth:`names`), always current."""
        return RegistryView(self, kind, tags)


class RegistryView(Mapping[str, T]):
    """The entries of a :class:`Registry` with given tags (``PAIRWISE_DECODERS``); read-only."""

    def __init__(self, registry: Registry[T], kind: str, tags: dict[str, Any]):
        self.registry, self.kind, self.tags = registry, kind, dict(tags)

    def __getitem__(self, name: str) -> T:
        names = self.registry.names(**self.tags)
        if name not in names:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; registered: {', '.join(names)}")
        return self.registry[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.registry.names(**self.tags))

    def __len__(self) -> int:
        return len(self.registry.names(**self.tags))

    def __repr__(self) -> str:
        return f"RegistryView({self.kind!r}: {', '.join(self)})"
