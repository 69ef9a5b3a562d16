"""Agreement tools: kappa reuse, alternative-order agreement, MASI, procedure statistics."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from seqaware.metrics.agreement import (
    alternative_order_agreement, binary_kappa, dag_masi_agreement, majority_relations, masi_distance,
    mean_pairwise_kappa, procedure_statistics,
)
from seqaware.metrics.ordering import order_kappa, pairwise_relations
from seqaware.procedure import Procedure, Step


def test_mean_pairwise_kappa_reuses_order_kappa():
    orders = {"ann1": [0, 1, 2, 3, 4], "ann2": [1, 0, 2, 4, 3], "ann3": [4, 3, 2, 1, 0]}
    expected = np.mean([order_kappa(a, b) for a, b in itertools.combinations(orders.values(), 2)])
    assert mean_pairwise_kappa(orders) == pytest.approx(expected)
    assert mean_pairwise_kappa(list(orders.values())) == pytest.approx(expected)
    assert mean_pairwise_kappa([[0, 1, 2], [0, 1, 2]]) == 1.0
    with pytest.raises(ValueError):
        mean_pairwise_kappa([[0, 1, 2]])


def test_binary_kappa_matches_order_kappa_and_sklearn():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = list(rng.permutation(6)), list(rng.permutation(6))
        x, y = pairwise_relations(a), pairwise_relations(b)
        assert binary_kappa(x, y) == pytest.approx(order_kappa(a, b))
        if len(set(x)) > 1 or len(set(y)) > 1:
            assert binary_kappa(x, y) == pytest.approx(cohen_kappa_score(x, y))


def test_majority_relations_and_ties():
    # pairs (0,1), (0,2), (1,2)
    assert majority_relations([[0, 1, 2], [1, 0, 2], [0, 1, 2]]).tolist() == [1, 1, 1]
    assert majority_relations([[1, 0, 2], [0, 1, 2]]).tolist() == [0, 1, 1]  # tie: first order wins
    assert majority_relations([[2, 1, 0]]).tolist() == pairwise_relations([2, 1, 0]).tolist()


def test_alternative_order_agreement_hand_example():
    a = [[0, 2, 1, 3]]                                  # encoding 1 1 1 0 1 1
    b = [[1, 0, 2, 3], [0, 1, 2, 3], [1, 0, 2, 3]]      # majority 0 1 1 1 1 1
    c = [[0, 1, 2, 3]]                                  # encoding 1 1 1 1 1 1 (constant)
    # a vs b: p_o = 4/6, q = 5/6 each, p_e = 26/36 -> kappa = -0.2; a vs c and b vs c: p_e = p_o -> 0
    assert alternative_order_agreement({"a": a, "b": b}) == pytest.approx(-0.2)
    assert alternative_order_agreement([a, b, c]) == pytest.approx(-0.2 / 3)
    single = [[[0, 1, 2, 3, 4]], [[1, 0, 2, 3, 4]], [[0, 1, 3, 2, 4]]]
    assert alternative_order_agreement(single) == pytest.approx(mean_pairwise_kappa([s[0] for s in single]))


def test_masi_hand_values():
    assert masi_distance({1, 2}, {2, 1}) == 0.0
    assert masi_distance(set(), set()) == 0.0
    assert masi_distance({1}, {1, 2}) == pytest.approx(1 - 0.5 * 0.67)
    assert masi_distance({1, 2}, {2, 3}) == pytest.approx(1 - (1 / 3) * 0.33)
    assert masi_distance({1}, {2}) == 1.0
    assert masi_distance(set(), {1}) == 1.0
    try:
        from nltk.metrics.distance import masi_distance as nltk_masi
    except ImportError:
        return
    for a, b in [({1}, {1, 2}), ({1, 2}, {2, 3}), ({1}, {2}), ({1, 2, 3}, {1, 2, 3})]:
        assert masi_distance(a, b) == pytest.approx(nltk_masi(a, b))


def test_dag_masi_agreement_hand_value():
    a = {"0": [1, 2], "1": [3], "2": [3], "3": []}
    b = {0: [1], 1: [3], 2: [3, 4], 3: [], 4: None}
    # node 0: 0.665, node 1: 0, node 2: 0.665, node 3: 0, node 4 (absent from a): 0
    assert dag_masi_agreement(a, b) == pytest.approx(1 - 2 * (1 - 0.5 * 0.67) / 5)
    assert dag_masi_agreement(a, a) == 1.0
    assert dag_masi_agreement({}, {}) == 1.0


def _proc(pid, n, dag):
    return Procedure(id=pid, steps=[Step(text=f"{pid} {i}") for i in range(n)], dag=dag)


def test_procedure_statistics_hand_set():
    procs = [_proc("p1", 4, [(0, 1), (0, 2), (1, 3), (2, 3), (0, 1)]), _proc("p2", 3, []), _proc("p3", 2, None)]
    stats = procedure_statistics(procs)
    assert stats["num_procedures"] == 3 and stats["num_with_dag"] == 2 and stats["total_steps"] == 9
    assert stats["steps_per_procedure"] == {"mean": 3.0, "median": 3.0, "min": 2.0, "max": 4.0}
    assert stats["total_edges"] == 4
    assert stats["edges_per_procedure"] == {"mean": 2.0, "median": 2.0, "min": 0.0, "max": 4.0}
    assert stats["mean_out_degree_branching"] == pytest.approx(4 / 3)   # out-degrees 2, 1, 1
    assert stats["mean_out_degree_all"] == pytest.approx(4 / 7)
    assert stats["independent_pair_share"] == pytest.approx(4 / 9)      # (1,2) of p1 + all 3 of p2
    assert stats["linear_extensions"] == {"mean": 4.0, "median": 4.0, "min": 2.0, "max": 6.0, "limit": 1000, "num_capped": 0}
    capped = procedure_statistics(procs, limit=5)["linear_extensions"]
    assert capped["max"] == 5.0 and capped["num_capped"] == 1 and capped["mean"] == 3.5
    empty = procedure_statistics([_proc("x", 2, None)])
    assert empty["total_edges"] is None and empty["linear_extensions"] is None
