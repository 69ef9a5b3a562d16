"""Tests of seqaware.dag against brute force on small random DAGs and hand-made cases."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from seqaware import dag as D


def random_dag(rng: random.Random, n: int, p: float) -> list[tuple[int, int]]:
    """Edges of a random DAG: each forward pair of a random permutation kept with probability p."""
    perm = list(range(n))
    rng.shuffle(perm)
    return [(perm[a], perm[b]) for a in range(n) for b in range(a + 1, n) if rng.random() < p]


def floyd_warshall_reach(n: int, edges) -> np.ndarray:
    reach = np.zeros((n, n), dtype=bool)
    for a, b in edges:
        reach[a, b] = True
    for k in range(n):
        for i in range(n):
            for j in range(n):
                if reach[i, k] and reach[k, j]:
                    reach[i, j] = True
    return reach


def brute_force_orders(n: int, edges) -> list[list[int]]:
    return [list(p) for p in itertools.permutations(range(n))
            if all(p.index(a) < p.index(b) for a, b in edges)]


# a hand-made DAG: 0 -> 1 -> 3 -> 4, 2 -> 3, 5 on its own
HAND_EDGES = [(0, 1), (1, 3), (3, 4), (2, 3)]


# ---------------------------------------------------------------- validation and cycles
def test_validate_edges_reports_problems():
    assert D.validate_edges(3, [(0, 1), (1, 2)]) == []
    problems = D.validate_edges(3, [(0, 0), (0, 3), (-1, 1), (0.5, 1), (1,), "ab"])
    assert len(problems) == 6
    assert "self loop" in problems[0]
    assert "out of range" in problems[1] and "out of range" in problems[2]
    assert "integer" in problems[3]
    assert "pair" in problems[4]
    assert D.validate_edges(-1, []) != []
    assert D.validate_edges(2, [(np.int64(0), np.int64(1))]) == []
    assert D.validate_edges(2, [(True, 1)]) != []


def test_invalid_edges_raise_value_error():
    with pytest.raises(ValueError, match="self loop"):
        D.topological_sort(3, [(1, 1)])
    with pytest.raises(ValueError, match="out of range"):
        D.transitive_closure(3, [(0, 3)])


def test_find_cycle_finds_a_real_cycle():
    edges = [(0, 2), (2, 5), (5, 3), (3, 2), (1, 4)]
    cycle = D.find_cycle(6, edges)
    assert cycle is not None and len(cycle) == len(set(cycle)) == 3
    assert set(cycle) == {2, 3, 5}
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        assert (a, b) in edges
    assert not D.is_acyclic(6, edges)
    assert D.find_cycle(2, [(0, 1), (1, 0)]) in ([0, 1], [1, 0])


def test_find_cycle_none_on_dags():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 9)
        edges = random_dag(rng, n, rng.random())
        assert D.find_cycle(n, edges) is None
        assert D.is_acyclic(n, edges)


def test_find_cycle_on_long_chain_is_iterative():
    n = 5000  # far beyond the recursion limit
    edges = [(i, i + 1) for i in range(n - 1)]
    assert D.find_cycle(n, edges) is None
    cycle = D.find_cycle(n, edges + [(n - 1, 0)])
    assert cycle == list(range(n))


def test_cycle_error_names_the_cycle():
    with pytest.raises(D.CycleError, match="0 -> 1 -> 2 -> 0") as info:
        D.topological_sort(3, [(0, 1), (1, 2), (2, 0)])
    assert isinstance(info.value, ValueError)
    assert info.value.cycle == [0, 1, 2]
    for fn in (D.transitive_closure, D.transitive_reduction, D.linear_extensions, D.count_linear_extensions):
        with pytest.raises(D.CycleError):
            fn(3, [(0, 1), (1, 2), (2, 0)])


# ---------------------------------------------------------------- sorting, closure, reduction
def test_topological_sort_deterministic_smallest_first():
    assert D.topological_sort(4, [(3, 0), (2, 1)]) == [2, 1, 3, 0]
    assert D.topological_sort(4, []) == [0, 1, 2, 3]
    assert D.topological_sort(0, []) == []
    rng = random.Random(1)
    for _ in range(30):
        n = rng.randint(1, 7)
        edges = random_dag(rng, n, 0.4)
        order = D.topological_sort(n, edges)
        assert order == D.topological_sort(n, list(reversed(edges)))
        assert order == min(brute_force_orders(n, edges))  # lexicographically smallest


def test_transitive_closure_matches_floyd_warshall():
    rng = random.Random(2)
    for _ in range(60):
        n = rng.randint(1, 12)
        edges = random_dag(rng, n, rng.choice([0.1, 0.3, 0.6]))
        reach = D.transitive_closure(n, edges)
        assert reach.dtype == bool and reach.shape == (n, n)
        np.testing.assert_array_equal(reach, floyd_warshall_reach(n, edges))
        assert not reach.diagonal().any()


def test_transitive_reduction_keeps_closure_and_is_minimal():
    assert D.transitive_reduction(4, [(0, 1), (1, 2), (0, 2), (2, 3), (0, 3)]) == [(0, 1), (1, 2), (2, 3)]
    rng = random.Random(3)
    for _ in range(40):
        n = rng.randint(1, 9)
        edges = random_dag(rng, n, 0.5)
        reduced = D.transitive_reduction(n, edges)
        assert reduced == sorted(reduced)
        assert set(reduced) <= set(edges)
        np.testing.assert_array_equal(D.transitive_closure(n, reduced), D.transitive_closure(n, edges))
        for k in range(len(reduced)):  # dropping any edge changes the closure
            rest = reduced[:k] + reduced[k + 1:]
            assert not np.array_equal(D.transitive_closure(n, rest), D.transitive_closure(n, edges))


# ---------------------------------------------------------------- linear extensions
def test_linear_extensions_match_brute_force():
    rng = random.Random(4)
    for _ in range(60):
        n = rng.randint(1, 7)
        edges = random_dag(rng, n, rng.choice([0.0, 0.2, 0.4, 0.7]))
        orders = D.linear_extensions(n, edges)
        assert orders == brute_force_orders(n, edges)  # permutations() is lexicographic
        assert D.count_linear_extensions(n, edges) == len(orders)
        assert all(D.is_linear_extension(o, n, edges) for o in orders)


def test_linear_extensions_small_cases():
    assert D.linear_extensions(0, []) == [[]]
    assert D.linear_extensions(1, []) == [[0]]
    assert D.linear_extensions(4, [(0, 1), (2, 3)]) == [
        [0, 1, 2, 3], [0, 2, 1, 3], [0, 2, 3, 1], [2, 0, 1, 3], [2, 0, 3, 1], [2, 3, 0, 1]]
    assert D.linear_extensions(3, [(0, 1), (1, 2)]) == [[0, 1, 2]]


def test_linear_extensions_limit():
    with pytest.raises(D.TooManyOrdersError, match="DAG over 8 steps has more than 100 linear extensions"):
        D.linear_extensions(8, [], limit=100)
    assert len(D.linear_extensions(4, [], limit=24)) == 24  # exactly at the limit is fine
    with pytest.raises(D.TooManyOrdersError):
        D.linear_extensions(4, [], limit=23)
    assert issubclass(D.TooManyOrdersError, ValueError)


def test_linear_extensions_limit_stops_early():
    # 30 independent steps have 30! orders: only an early stop can make this return quickly
    with pytest.raises(D.TooManyOrdersError):
        D.linear_extensions(30, [], limit=1000)
    with pytest.raises(D.TooManyOrdersError):
        D.count_linear_extensions(30, [], limit=1000)


def test_count_linear_extensions():
    assert D.count_linear_extensions(20, []) == 2432902008176640000  # 20!
    assert D.count_linear_extensions(0, []) == 1
    assert D.count_linear_extensions(20, [(i, i + 1) for i in range(19)]) == 1
    # two independent chains of lengths 3 and 4: C(7, 3) interleavings
    chains = [(0, 1), (1, 2), (3, 4), (4, 5), (5, 6)]
    assert D.count_linear_extensions(7, chains) == 35
    # beyond the bitmask DP: enumeration (a chain of 25 plus 2 free steps: 26 * 27 orders)
    edges = [(i, i + 1) for i in range(24)]
    assert D.count_linear_extensions(27, edges) == 26 * 27
    with pytest.raises(D.TooManyOrdersError):
        D.count_linear_extensions(8, [], limit=100)
    assert D.count_linear_extensions(5, [], limit=120) == 120


def test_is_linear_extension():
    assert D.is_linear_extension([2, 0, 1, 3, 4, 5], 6, HAND_EDGES)
    assert not D.is_linear_extension([0, 1, 3, 2, 4, 5], 6, HAND_EDGES)  # 3 before 2
    assert not D.is_linear_extension([0, 1, 2, 3, 4], 6, HAND_EDGES)      # missing a step
    assert not D.is_linear_extension([0, 1, 2, 3, 4, 4], 6, HAND_EDGES)   # duplicate
    assert not D.is_linear_extension([0, 1, 2, 3, 4, 6], 6, HAND_EDGES)   # unknown step


# ---------------------------------------------------------------- pair relations, helpers
def test_pair_relation():
    assert D.pair_relation(6, HAND_EDGES, 0, 1) == "before"
    assert D.pair_relation(6, HAND_EDGES, 1, 0) == "after"
    assert D.pair_relation(6, HAND_EDGES, 0, 4) == "before"   # only through 0 -> 1 -> 3 -> 4
    assert D.pair_relation(6, HAND_EDGES, 4, 2) == "after"    # through 2 -> 3 -> 4
    assert D.pair_relation(6, HAND_EDGES, 0, 2) == "independent"
    assert D.pair_relation(6, HAND_EDGES, 5, 3) == "independent"
    with pytest.raises(ValueError):
        D.pair_relation(6, HAND_EDGES, 2, 2)
    with pytest.raises(ValueError):
        D.pair_relation(6, HAND_EDGES, 0, 6)


def test_pair_relation_agrees_with_all_orders():
    rng = random.Random(5)
    for _ in range(20):
        n = rng.randint(2, 6)
        edges = random_dag(rng, n, 0.4)
        orders = D.linear_extensions(n, edges)
        for a, b in itertools.permutations(range(n), 2):
            before = {o.index(a) < o.index(b) for o in orders}
            expected = "before" if before == {True} else "after" if before == {False} else "independent"
            assert D.pair_relation(n, edges, a, b) == expected


def test_edges_from_out_nodes():
    assert D.edges_from_out_nodes({"0": ["2", 3], 1: [2], "2": [], "3": None}) == [(0, 2), (0, 3), (1, 2)]
    assert D.edges_from_out_nodes({}) == []
    assert D.edges_from_out_nodes({0: [1, 1]}) == [(0, 1)]
    with pytest.raises(ValueError):
        D.edges_from_out_nodes({"a": [1]})
