"""Dependency DAGs over the steps of a procedure.

Conventions used by every function here:

* Steps are the integers ``0 .. num_steps - 1``.
* ``edges`` is an iterable of pairs ``(i, j)`` meaning "step ``j`` needs the outcome of step ``i``",
  i.e. ``i`` must be executed before ``j``. Duplicate edges are allowed and counted once.
* An *order* is a list of step indices in execution order. A *linear extension* (topological
  order) of the DAG is an order of all steps that puts ``i`` before ``j`` for every edge.
* ``reach[i, j]`` (the transitive closure) is True iff there is a directed path of length >= 1
  from ``i`` to ``j``; such a pair is *constrained*: every valid order puts ``i`` before ``j``.

Invalid edges (not a pair, a non-integer or out-of-range index, a self loop) make every function
except :func:`validate_edges` raise ``ValueError``; a cycle makes the functions that need a DAG
raise :class:`CycleError` (also a ``ValueError``). Everything is iterative, so large graphs never
hit Python's recursion limit.
"""
from __future__ import annotations

import heapq
import numbers
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

__all__ = [
    "CycleError",
    "TooManyOrdersError",
    "validate_edges",
    "find_cycle",
    "is_acyclic",
    "topological_sort",
    "transitive_closure",
    "transitive_reduction",
    "linear_extensions",
    "count_linear_extensions",
    "is_linear_extension",
    "pair_relation",
    "edges_from_out_nodes",
]

#: Largest number of steps for which :func:`count_linear_extensions` uses the subset DP.
BITMASK_DP_MAX_STEPS = 20


class CycleError(ValueError):
    """The edges contain a directed cycle; ``cycle`` holds its steps (``[2, 5, 3]`` = 2->5->3->2)."""

    def __init__(self, cycle: list[int]):
        self.cycle = list(cycle)
        path = " -> ".join(str(s) for s in self.cycle + self.cycle[:1])
        super().__init__(f"the dependency graph has a cycle: {path}")


class TooManyOrdersError(ValueError):
    """A DAG has more linear extensions than the caller's ``limit``."""

    def __init__(self, num_steps: int, limit: int):
        self.num_steps = num_steps
        self.limit = limit
        super().__init__(
            f"DAG over {num_steps} steps has more than {limit} linear extensions; "
            "raise limit= or use DAG metrics"
        )


# ---------------------------------------------------------------- validation and adjacency
def _is_index(value: Any) -> bool:
    """True for Python/NumPy integers (booleans are not step indices)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def validate_edges(num_steps: int, edges: Iterable) -> list[str]:
    """Problems with ``edges`` over ``num_steps`` steps, as short reason strings (empty if fine).

    Reported problems: ``num_steps`` not a non-negative integer, an edge that is not a pair, an
    endpoint that is not an integer, an endpoint outside ``0 .. num_steps - 1`` and a self loop.
    Cycles are *not* reported here (see :func:`find_cycle`).
    """
    if not _is_index(num_steps) or num_steps < 0:
        return [f"num_steps must be a non-negative integer, got {num_steps!r}"]
    if edges is None:
        return ["edges must be an iterable of (i, j) pairs, got None"]
    problems = []
    for k, edge in enumerate(edges):
        try:
            a, b = edge
        except (TypeError, ValueError):
            problems.append(f"edge {k}: expected a pair (i, j), got {edge!r}")
            continue
        if not (_is_index(a) and _is_index(b)):
            problems.append(f"edge {k} {(a, b)!r}: step indices must be integers")
        elif not (0 <= a < num_steps and 0 <= b < num_steps):
            problems.append(f"edge {k} {(int(a), int(b))}: index out of range (num_steps={num_steps})")
        elif a == b:
            problems.append(f"edge {k} {(int(a), int(b))}: self loop")
    return problems


def _successors(num_steps: int, edges: Iterable) -> list[list[int]]:
    """Validated, de-duplicated adjacency: ``succ[i]`` = sorted steps that need ``i``."""
    edges = list(edges) if edges is not None else None
    problems = validate_edges(num_steps, edges)
    if problems:
        raise ValueError("invalid DAG edges: " + "; ".join(problems))
    succ: list[set[int]] = [set() for _ in range(num_steps)]
    for a, b in edges:
        succ[int(a)].add(int(b))
    return [sorted(s) for s in succ]


def _in_degrees(succ: list[list[int]]) -> list[int]:
    indeg = [0] * len(succ)
    for targets in succ:
        for b in targets:
            indeg[b] += 1
    return indeg


def _find_cycle(succ: list[list[int]]) -> list[int] | None:
    """Iterative three-colour depth-first search; returns the first cycle met, else None."""
    n = len(succ)
    WHITE, GREY, BLACK = 0, 1, 2
    colour = [WHITE] * n
    for root in range(n):
        if colour[root] != WHITE:
            continue
        # stack of (node, index of the next successor to visit); `path` mirrors the grey nodes
        stack = [(root, 0)]
        path = [root]
        colour[root] = GREY
        while stack:
            node, k = stack[-1]
            if k < len(succ[node]):
                stack[-1] = (node, k + 1)
                nxt = succ[node][k]
                if colour[nxt] == GREY:
                    return path[path.index(nxt):]
                if colour[nxt] == WHITE:
                    colour[nxt] = GREY
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                colour[node] = BLACK
                stack.pop()
                path.pop()
    return None


def _topological_order(succ: list[list[int]]) -> list[int]:
    """Kahn's algorithm taking the smallest available step first; CycleError on a cycle."""
    indeg = _in_degrees(succ)
    heap = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        node = heapq.heappop(heap)
        order.append(node)
        for b in succ[node]:
            indeg[b] -= 1
            if indeg[b] == 0:
                heapq.heappush(heap, b)
    if len(order) < len(succ):
        raise CycleError(_find_cycle(succ) or [])
    return order


def _closure(succ: list[list[int]]) -> np.ndarray:
    """Boolean reachability matrix, filled in reverse topological order."""
    n = len(succ)
    reach = np.zeros((n, n), dtype=bool)
    for node in reversed(_topological_order(succ)):
        for b in succ[node]:
            reach[node, b] = True
            reach[node] |= reach[b]
    return reach


# ---------------------------------------------------------------- public API
def find_cycle(num_steps: int, edges: Iterable) -> list[int] | None:
    """One directed cycle as a list of steps (``[2, 5, 3]`` means 2->5->3->2), or None if acyclic.

    The search is an iterative depth-first search from the smallest step upwards, visiting
    successors in increasing order, so the answer is deterministic.
    """
    return _find_cycle(_successors(num_steps, edges))


def is_acyclic(num_steps: int, edges: Iterable) -> bool:
    """True iff the edges form a DAG (no directed cycle)."""
    return find_cycle(num_steps, edges) is None


def topological_sort(num_steps: int, edges: Iterable) -> list[int]:
    """The lexicographically smallest linear extension (Kahn's algorithm, smallest step first).

    Raises :class:`CycleError` (naming the cycle) if the edges have a cycle.
    """
    return _topological_order(_successors(num_steps, edges))


def transitive_closure(num_steps: int, edges: Iterable) -> np.ndarray:
    """Boolean ``(n, n)`` matrix: ``reach[i, j]`` iff there is a path of length >= 1 from i to j.

    The diagonal is False (a DAG has no path from a step to itself). Raises :class:`CycleError`
    on a cycle.
    """
    return _closure(_successors(num_steps, edges))


def transitive_reduction(num_steps: int, edges: Iterable) -> list[tuple[int, int]]:
    """The fewest edges with the same transitive closure, as a sorted list of pairs.

    An edge ``(i, j)`` of the closure is kept iff no step ``k`` lies on a path ``i -> k -> j``.
    For a DAG this reduction is unique and a subset of the given edges. Raises
    :class:`CycleError` on a cycle.
    """
    reach = transitive_closure(num_steps, edges)
    as_int = reach.astype(np.int64)
    implied = (as_int @ as_int) > 0  # reachable through at least one intermediate step
    keep = reach & ~implied
    return [(int(a), int(b)) for a, b in zip(*np.nonzero(keep))]


def _iter_linear_extensions(succ: list[list[int]]) -> Iterator[list[int]]:
    """Yield every linear extension in lexicographic order (the DAG must be acyclic).

    Backtracking with an explicit stack of frames (depth <= n). A frame holds the sorted steps
    available at that depth (all predecessors placed) and the index of the one being tried;
    the available steps of the next depth are those of the current one minus the chosen step,
    plus the successors whose last predecessor it was.
    """
    n = len(succ)
    if n == 0:
        yield []
        return
    indeg = _in_degrees(succ)
    order: list[int] = []
    frames: list[list] = [[[i for i in range(n) if indeg[i] == 0], -1]]
    while frames:
        frame = frames[-1]
        candidates = frame[0]
        if frame[1] >= 0:  # undo the step tried last at this depth
            undone = order.pop()
            for b in succ[undone]:
                indeg[b] += 1
        frame[1] += 1
        if frame[1] >= len(candidates):
            frames.pop()
            continue
        step = candidates[frame[1]]
        order.append(step)
        freed = []
        for b in succ[step]:
            indeg[b] -= 1
            if indeg[b] == 0:
                freed.append(b)
        if len(order) == n:
            yield list(order)
            continue
        nxt = [c for c in candidates if c != step] + freed
        nxt.sort()
        frames.append([nxt, -1])


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not _is_index(limit) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")


def linear_extensions(num_steps: int, edges: Iterable, limit: int | None = 10000) -> list[list[int]]:
    """All linear extensions (topological orders) of the DAG, in lexicographic order.

    Each order is a list of step indices in execution order. If the DAG has more than ``limit``
    orders, :class:`TooManyOrdersError` is raised as soon as the ``limit + 1``-th order is found
    (nothing beyond it is enumerated). ``limit=None`` enumerates everything. Raises
    :class:`CycleError` on a cycle.
    """
    _check_limit(limit)
    succ = _successors(num_steps, edges)
    _topological_order(succ)  # raises CycleError on a cycle
    orders = []
    for order in _iter_linear_extensions(succ):
        if limit is not None and len(orders) >= limit:
            raise TooManyOrdersError(num_steps, limit)
        orders.append(order)
    return orders


def _count_by_subset_dp(succ: list[list[int]]) -> int:
    """Number of linear extensions by dynamic programming over subsets of steps.

    ``ways[S]`` = number of orders of the steps in the bitmask ``S`` in which every step comes
    after all its predecessors (these all lie in ``S``; ``ways[S] = 0`` otherwise). The last step
    ``v`` of such an order has all its predecessors in ``S - {v}``, so
    ``ways[S] = sum(ways[S - {v}] for v in S if preds(v) <= S - {v})`` with ``ways[{}] = 1``.
    Subsets are processed layer by layer (by size), vectorised with NumPy: O(n 2^n) work.
    ``ways`` never exceeds ``20! < 2**63`` for n <= 20, so int64 is exact.
    """
    n = len(succ)
    if n == 0:
        return 1
    pred_mask = [0] * n
    for a, targets in enumerate(succ):
        for b in targets:
            pred_mask[b] |= 1 << a
    masks = np.arange(1 << n, dtype=np.int64)
    sizes = np.zeros(1 << n, dtype=np.int64)
    for v in range(n):
        sizes += (masks >> v) & 1
    ways = np.zeros(1 << n, dtype=np.int64)
    ways[0] = 1
    for size in range(1, n + 1):
        layer = masks[sizes == size]
        for v in range(n):
            bit = np.int64(1 << v)
            ok = ((layer & bit) != 0) & ((layer & np.int64(pred_mask[v])) == pred_mask[v])
            chosen = layer[ok]
            ways[chosen] += ways[chosen ^ bit]
    return int(ways[-1])


def count_linear_extensions(num_steps: int, edges: Iterable, limit: int | None = None) -> int:
    """Exact number of linear extensions of the DAG.

    * ``num_steps <= 20``: dynamic programming over subsets of steps (bitmask DP, vectorised
      with NumPy; at most 2**20 subsets), fast whatever the number of orders.
    * ``num_steps > 20``: enumeration of the orders (without storing them), which is only
      practical when the DAG is constrained enough; pass ``limit`` to stop early.

    If ``limit`` is given and the count exceeds it, :class:`TooManyOrdersError` is raised (for
    both methods; the enumeration stops at the ``limit + 1``-th order). Raises
    :class:`CycleError` on a cycle.
    """
    _check_limit(limit)
    succ = _successors(num_steps, edges)
    _topological_order(succ)  # raises CycleError on a cycle
    if num_steps <= BITMASK_DP_MAX_STEPS:
        count = _count_by_subset_dp(succ)
        if limit is not None and count > limit:
            raise TooManyOrdersError(num_steps, limit)
        return count
    count = 0
    for _ in _iter_linear_extensions(succ):
        count += 1
        if limit is not None and count > limit:
            raise TooManyOrdersError(num_steps, limit)
    return count


def is_linear_extension(order: Iterable, num_steps: int, edges: Iterable) -> bool:
    """True iff ``order`` is a permutation of ``0 .. num_steps - 1`` that respects every edge.

    Returns False (never raises) for an order that is not such a permutation; invalid edges
    raise ``ValueError``. With a cyclic graph no order qualifies, so the answer is False.
    """
    succ = _successors(num_steps, edges)
    order = list(order)
    if len(order) != num_steps or not all(_is_index(s) for s in order):
        return False
    if sorted(int(s) for s in order) != list(range(num_steps)):
        return False
    position = {int(s): k for k, s in enumerate(order)}
    return all(position[a] < position[b] for a, targets in enumerate(succ) for b in targets)


def pair_relation(num_steps: int, edges: Iterable, a: int, b: int) -> str:
    """Relation between steps ``a`` and ``b`` implied by the DAG.

    ``"before"`` if there is a directed path ``a -> ... -> b`` (of any length >= 1), ``"after"``
    if there is one ``b -> ... -> a``, else ``"independent"`` (either order is valid). Raises
    ``ValueError`` if ``a == b`` or either is not a step index, and :class:`CycleError` on a
    cycle.
    """
    for name, value in (("a", a), ("b", b)):
        if not _is_index(value) or not 0 <= value < num_steps:
            raise ValueError(f"{name}={value!r} is not a step index in 0..{num_steps - 1}")
    if a == b:
        raise ValueError(f"a and b must be different steps, got {a} twice")
    reach = transitive_closure(num_steps, edges)
    if reach[a, b]:
        return "before"
    if reach[b, a]:
        return "after"
    return "independent"


def edges_from_out_nodes(mapping: Mapping[Any, Iterable[Any]]) -> list[tuple[int, int]]:
    """Edges from an out-node mapping ``{node: [nodes that need it], ...}``.

    Keys and out nodes may be integers or strings holding integers (as in JSON objects, whose
    keys are always strings). ``None`` or an empty list means no out edges. Returns the sorted,
    de-duplicated list of ``(node, out_node)`` pairs; a value that is not an integer raises
    ``ValueError``.
    """

    def as_index(value: Any) -> int:
        if _is_index(value):
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value)
        raise ValueError(f"node {value!r} is not an integer step index")

    edges = set()
    for node, outs in mapping.items():
        src = as_index(node)
        for out in outs or ():
            edges.add((src, as_index(out)))
    return sorted(edges)
