"""What every task view shares: the item it yields (:class:`ViewItem`), the base class (:class:`TaskView`:
length policy, ``(index, epoch)`` keys, the per-split construction) and the procedure helpers
(:func:`restrict_procedure`, :func:`reference_orders`, the seeded :func:`_rng`).

A view is a map-style dataset whose items may be indexed by ``(index, epoch)`` (see
:class:`data_modules.sampling.EpochSampler`), so the randomness of an epoch is a pure function of (seed, epoch, index):
a run resumed from a checkpoint sees exactly the data the uninterrupted run would have seen.

Length policy (``too_long``) for procedures with more steps than ``max_steps``:
``truncate`` (default) keeps the first ``max_steps`` steps (the DAG restricted to them keeps every
dependency between kept steps, because the authored order is a linear extension); ``skip`` drops
the procedure. Procedures with fewer than 2 steps are always dropped. Both counts are logged and
kept in :attr:`TaskView.dropped`.
"""
from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from torch.utils.data import Dataset

from seqaware import dag as dag_utils
from seqaware.procedure import Procedure, Step

log = logging.getLogger(__name__)


def _rng(*keys: Any) -> np.random.Generator:
    """A generator seeded by a stable hash of ``keys`` (stable across processes and runs)."""
    data = "\x1f".join(str(k) for k in keys).encode()
    return np.random.default_rng([zlib.crc32(data), zlib.adler32(data)])


@dataclass
class ViewItem:
    """One instance of a view: steps in input order plus targets and bookkeeping."""

    procedure_id: str
    steps: list[Step]
    step_index: list[int]          # original (authored) index of each input step
    gold: list[int]                # gold[k] = input position of the k-th step in the authored order
    references: list[list[int]]    # reference orders, as original step indices in execution order
    dag: tuple[int, list[tuple[int, int]]] | None
    category: list[str]
    root: str | None
    meta: dict[str, Any] = field(default_factory=dict)


def restrict_procedure(proc: Procedure, keep: Sequence[int]) -> tuple[list[Step], list[tuple[int, int]] | None, list[list[int]] | None]:
    """Steps, DAG edges and alternatives of ``proc`` restricted to the steps ``keep`` (renumbered)."""
    where = {old: new for new, old in enumerate(keep)}
    steps = [proc.steps[i] for i in keep]
    edges = None
    if proc.dag is not None:
        n = proc.num_steps
        reach = dag_utils.transitive_closure(n, proc.dag)
        edges = [(where[a], where[b]) for a in keep for b in keep if reach[a, b]]
        edges = dag_utils.transitive_reduction(len(keep), edges)
    alternatives = None
    if proc.alternatives:
        alternatives = [[where[i] for i in alt if i in where] for alt in proc.alternatives]
    return steps, edges, alternatives


def reference_orders(num_steps: int, edges, alternatives, limit: int) -> tuple[list[list[int]], bool]:
    """Gold order first, then explicit alternatives, else all other linear extensions of the DAG.

    Returns ``(references, over_limit)``; when the DAG has more than ``limit`` orders only the gold
    order is returned (DAG metrics still score such instances without enumerating).
    """
    gold = list(range(num_steps))
    refs = [gold]
    if alternatives:
        refs += [list(a) for a in alternatives if list(a) != gold and list(a) not in refs]
        return refs, False
    if edges is None:
        return refs, False
    try:
        orders = dag_utils.linear_extensions(num_steps, edges, limit=limit)
    except dag_utils.TooManyOrdersError:
        return refs, True
    refs += [o for o in orders if o != gold]
    return refs, False


class TaskView(Dataset):
    """Base class of the task views: a registered view (:func:`data_modules.views.registry.register_view`)
    sets ``task`` (the name ``data.task`` picks) and returns a :class:`ViewItem` from ``__getitem__(key)``
    (``key``: an index or ``(index, epoch)``, read with :meth:`_key`).

    ``fields``: keys of :attr:`ViewItem.meta` that the collator carries into the batch under the same name
    (:class:`data_modules.collate.StepCollator`), for a view whose targets are not the step order;
    ``ignores``: ``data.view`` options shared by other views that this one does not take (dropped, not refused).
    """

    task: str = ""
    fields: tuple[str, ...] = ()
    ignores: tuple[str, ...] = ()

    @classmethod
    def build(cls, procedures: Sequence[Procedure], split: str, seed: int = 0, reshuffle_train: bool = True,
              **options: Any) -> "TaskView":
        """The view of one split (``options``: ``data.view``); ``reshuffle_train`` is
        ``data.reshuffle_train``, for views that draw a new instance each training epoch."""
        options = {k: v for k, v in options.items() if k not in cls.ignores}
        return cls(procedures, seed=seed, name=f"{split} {cls.task}", **options)

    def __init__(self, procedures: Sequence[Procedure], max_steps: int = 5, too_long: str = "truncate", seed: int = 0, name: str = "view"):
        if too_long not in ("truncate", "skip"):
            raise ValueError(f"data.view.too_long must be 'truncate' or 'skip', got {too_long!r}")
        if max_steps < 2:
            raise ValueError(f"data.view.max_steps must be >= 2, got {max_steps}")
        self.max_steps = int(max_steps)
        self.too_long = too_long
        self.seed = int(seed)
        self.name = name
        self.dropped = {"fewer_than_2_steps": 0, "too_long": 0}
        self.truncated = 0
        kept = []
        for proc in procedures:
            if proc.num_steps < 2:
                self.dropped["fewer_than_2_steps"] += 1
            elif proc.num_steps > self.max_steps and too_long == "skip":
                self.dropped["too_long"] += 1
            else:
                self.truncated += proc.num_steps > self.max_steps
                kept.append(proc)
        self.procedures = kept
        if any(self.dropped.values()) or self.truncated:
            log.warning("%s: kept %d procedures; dropped %s; truncated to %d steps: %d",
                        name, len(kept), self.dropped, self.max_steps, self.truncated)

    def __len__(self) -> int:
        return len(self.procedures)

    @staticmethod
    def _key(key) -> tuple[int, int]:
        if isinstance(key, tuple):
            return int(key[0]), int(key[1])
        return int(key), 0


