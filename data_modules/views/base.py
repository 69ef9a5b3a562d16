"""Task views: datasets built on procedures.

* :class:`SequencingView` -- the steps of a procedure in a seeded shuffled order; the target is the
  authored order; references are the explicit alternatives or all linear extensions of the DAG.
* :class:`PretrainingView` -- ordered (sub-)sequences of at least ``min_steps`` steps.

Both are map-style datasets whose items may be indexed by ``(index, epoch)`` (see
:class:`data_modules.sampling.EpochSampler`), so the randomness of an epoch is a pure function of (seed, epoch, index):
a run resumed from a checkpoint sees exactly the data the uninterrupted run would have seen.

Length policy (``too_long``) for procedures with more steps than ``max_steps``:
``truncate`` (default) keeps the first ``max_steps`` steps (the DAG restricted to them keeps every
dependency between kept steps, because the authored order is a linear extension); ``skip`` drops
the procedure. Procedures with fewer than 2 steps are always dropped. Both counts are logged and
kept in :attr:`dropped`.
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


class _ProcedureView(Dataset):
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


class SequencingView(_ProcedureView):
    """Shuffled steps of each procedure; target = authored order.

    ``reshuffle=False`` (evaluation) gives every procedure one fixed permutation derived from
    ``(seed, procedure id)``; ``reshuffle=True`` (training) draws a new one per epoch.
    """

    def __init__(self, procedures: Sequence[Procedure], max_steps: int = 5, too_long: str = "truncate", seed: int = 0,
                 reshuffle: bool = False, reference_limit: int = 10000, name: str = "sequencing"):
        super().__init__(procedures, max_steps, too_long, seed, name)
        self.reshuffle = reshuffle
        self.reference_limit = reference_limit
        self.over_limit = 0
        self._cache: dict[int, tuple] = {}

    def _structure(self, idx: int):
        if idx not in self._cache:
            proc = self.procedures[idx]
            keep = list(range(min(proc.num_steps, self.max_steps)))
            steps, edges, alternatives = restrict_procedure(proc, keep)
            refs, over = reference_orders(len(steps), edges, alternatives, self.reference_limit)
            self.over_limit += over
            self._cache[idx] = (steps, edges, refs)
        return self._cache[idx]

    def __getitem__(self, key) -> ViewItem:
        idx, epoch = self._key(key)
        proc = self.procedures[idx]
        steps, edges, refs = self._structure(idx)
        n = len(steps)
        rng = _rng(self.seed, proc.id, epoch if self.reshuffle else "eval")
        perm = [int(i) for i in rng.permutation(n)]  # perm[p] = original index at input position p
        position = {orig: p for p, orig in enumerate(perm)}
        return ViewItem(
            procedure_id=proc.id,
            steps=[steps[i] for i in perm],
            step_index=perm,
            gold=[position[k] for k in range(n)],
            references=refs,
            dag=None if edges is None else (n, edges),
            category=proc.category,
            root=proc.root,
        )


class PretrainingView(_ProcedureView):
    """Ordered sub-sequences of ``min_steps..max_steps`` steps, in authored order.

    Each epoch draws, per procedure, a length and the steps from ``(seed, epoch, index)``:
    ``contiguous=True`` a window (consecutive steps), ``contiguous=False`` any ``length`` steps kept in
    their authored order (a sub-sampled sequence, Wu et al. sec. 4.2), so two kept steps may lie
    several steps apart, as the two steps that ISP swaps in a whole 5-step sequence do.
    ``subsequences=False`` always uses the first ``max_steps`` steps.
    """

    def __init__(self, procedures: Sequence[Procedure], max_steps: int = 5, min_steps: int = 2, subsequences: bool = True,
                 contiguous: bool = True, seed: int = 0, name: str = "pretraining"):
        super().__init__(procedures, max_steps, "truncate", seed, name)
        if not 2 <= min_steps <= max_steps:
            raise ValueError(f"need 2 <= data.view.min_steps <= data.view.max_steps, got {min_steps}, {max_steps}")
        self.min_steps = int(min_steps)
        self.subsequences = subsequences
        self.contiguous = bool(contiguous)

    def __getitem__(self, key) -> ViewItem:
        idx, epoch = self._key(key)
        proc = self.procedures[idx]
        n = proc.num_steps
        if self.subsequences:
            rng = _rng(self.seed, proc.id, epoch, "window")
            length = int(rng.integers(min(self.min_steps, n), min(self.max_steps, n) + 1))
            if self.contiguous:
                start = int(rng.integers(0, n - length + 1))
                keep = list(range(start, start + length))
            else:
                keep = sorted(int(i) for i in rng.choice(n, size=length, replace=False))
        else:
            keep = list(range(min(n, self.max_steps)))
            length = len(keep)
        steps, edges, _ = restrict_procedure(proc, keep)
        return ViewItem(
            procedure_id=proc.id,
            steps=steps,
            step_index=keep,
            gold=list(range(length)),
            references=[list(range(length))],
            dag=None if edges is None else (length, edges),
            category=proc.category,
            root=proc.root,
        )
