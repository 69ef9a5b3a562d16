"""Agreement tools: kappa reuse, alternative-order agreement, MASI, procedure statistics."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from seqaware.metrics.agreement import (
    alternative_order_agreement, alternative_order_pair_scores, binary_kappa, dag_masi_agreement,
    difference_kappa, masi_distance, mean_pairwise_kappa, procedure_statistics, relation_difference,
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


def test_mean_pairwise_kappa_paper_encoding_values():
    # B.3.1 kappas: 123 vs 132 = 1/3, 123 vs 321 = -1, 132 vs 321: 110001 vs 001011 agree on 2 of 6 -> -1/3
    assert mean_pairwise_kappa([[1, 2, 3], [1, 3, 2], [3, 2, 1]]) == pytest.approx((1 / 3 - 1 - 1 / 3) / 3)


GOLD = [1, 2, 3]


def test_relation_difference_paper_examples():
    # B.3.2: R_diff(123, 132) = |110100 - 110001| = 000101; R_diff(123, 213) = |110100 - 011100| = 101000
    assert relation_difference([1, 3, 2], GOLD).tolist() == [0, 0, 0, 1, 0, 1]
    assert relation_difference([2, 1, 3], GOLD).tolist() == [1, 0, 1, 0, 0, 0]
    assert relation_difference(GOLD, GOLD).tolist() == [0] * 6
    assert relation_difference([3, 2, 1], GOLD).tolist() == [1] * 6


def test_difference_kappa_step_by_step():
    # B.3.2: differences at positions 4, 6 (o1 = 132) and 1, 3 (o2 = 213): union {1, 3, 4, 6};
    # R_diff restricted to it: 0011 and 1100 (the paper prints the second list as 0110, which is
    # R(213), not R_diff, at those positions; Algorithm 1 line 8 scores R_diff) -> p_o = 0, p_e = 1/2
    assert difference_kappa([1, 3, 2], [2, 1, 3], GOLD) == pytest.approx(-1.0)
    assert binary_kappa([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(-1.0)
    # 132 vs 231: R_diff 000101 vs 111010, union = all six positions, complementary lists:
    # p_o = 0, q = 1/3 and 2/3, p_e = 4/9 -> kappa = -(4/9) / (5/9) = -0.8
    assert difference_kappa([1, 3, 2], [2, 3, 1], GOLD) == pytest.approx(-0.8)
    # 213 vs 231: 101000 vs 111010, union {1, 2, 3, 5}: 1010 vs 1111 -> p_o = p_e = 1/2 -> 0
    assert difference_kappa([2, 1, 3], [2, 3, 1], GOLD) == pytest.approx(0.0)
    # the same differences: both lists all ones -> 1 (binary_kappa's convention); both equal gold: empty union -> 1
    assert difference_kappa([1, 3, 2], [1, 3, 2], GOLD) == 1.0
    assert difference_kappa(GOLD, GOLD, GOLD) == 1.0
    # the penalty f(og, o): gold has no differences -> 0...0 vs 1...1 -> p_o = p_e = 0 -> 0
    assert difference_kappa(GOLD, [3, 2, 1], GOLD) == 0.0
    assert difference_kappa(GOLD, [2, 1, 3], GOLD) == 0.0
    # symmetric in its two orders
    assert difference_kappa([2, 1, 3], [1, 3, 2], GOLD) == difference_kappa([1, 3, 2], [2, 1, 3], GOLD)


def test_difference_kappa_sign_property_brute_force():
    # every retained position has a 1 in at least one list, so there are no 0-0 agreements:
    # kappa = 1 for identical differences, 0 when one difference set contains the other, < 0 otherwise
    gold = [0, 1, 2, 3]
    for a in itertools.permutations(gold):
        for b in itertools.permutations(gold):
            da, db = relation_difference(a, gold) == 1, relation_difference(b, gold) == 1
            k = difference_kappa(a, b, gold)
            union = da | db
            if union.any() and not (da == db).all():  # sklearn is undefined (NaN) on identical constant lists
                assert k == pytest.approx(cohen_kappa_score(da[union], db[union]))
            if (da == db).all():
                assert k == 1.0
            elif (da <= db).all() or (db <= da).all():
                assert k == pytest.approx(0.0)
            else:
                assert k < 0


def test_algorithm1_best_matching_pairs_and_penalty():
    a = [[1, 3, 2], [2, 1, 3]]
    b = [[2, 1, 3], [1, 3, 2], [2, 3, 1]]
    # f matrix (rows a, columns b): 132: [-1, 1, -0.8]; 213: [1, -1, 0]
    # match 1: (132, 132) = 1, pop both; match 2: (213, 213) = 1; 231 unmatched: penalty f(og, 231) = 0
    assert alternative_order_pair_scores(a, b, GOLD) == pytest.approx([1.0, 1.0, 0.0])
    assert alternative_order_pair_scores(b, a, GOLD) == pytest.approx([1.0, 1.0, 0.0])  # line 5: swap
    assert alternative_order_agreement({"w1": a, "w2": b}, GOLD) == pytest.approx(2 / 3)
    # one order each: only the best match, no penalty
    assert alternative_order_pair_scores([[2, 3, 1]], [[2, 1, 3]], GOLD) == pytest.approx([0.0])
    # each order is matched once: 231 takes 213 (0 > -0.8), 132 is left over and penalised (0)
    assert alternative_order_pair_scores([[2, 3, 1]], [[1, 3, 2], [2, 1, 3]], GOLD) == pytest.approx([0.0, 0.0])
    # the best pair is found over all remaining orders: 132 matches the second order of b (1, not -1)
    assert alternative_order_pair_scores([[1, 3, 2]], [[2, 1, 3], [1, 3, 2]], GOLD) == pytest.approx([1.0, 0.0])
    # an unmatched gold order scores f(og, og) = 1
    assert alternative_order_pair_scores([[1, 3, 2]], [[1, 3, 2], GOLD], GOLD) == pytest.approx([1.0, 1.0])


def test_algorithm1_pools_scores_over_annotator_pairs():
    anns = [[[1, 3, 2]], [[1, 3, 2]], [[2, 1, 3], [1, 3, 2], [2, 3, 1]]]
    # pairs: (0, 1): [1]; (0, 2): [1, 0, 0]; (1, 2): [1, 0, 0] -> S has 7 scores, mean(S) = 3/7
    # (the mean of per-pair means would be 5/9: line 17 returns mean(S))
    assert alternative_order_agreement(anns, GOLD) == pytest.approx(3 / 7)
    assert alternative_order_agreement([[GOLD], [GOLD]], GOLD) == 1.0


def test_alternative_order_agreement_single_orders():
    # one order per annotator: the kappa of the two orders' differences to gold
    assert alternative_order_agreement([[[1, 3, 2]], [[2, 1, 3]]], GOLD) == pytest.approx(-1.0)
    assert alternative_order_agreement([[[1, 3, 2]], [[1, 3, 2]]], GOLD) == 1.0
    assert alternative_order_agreement([[["b", "a", "c"]], [["b", "a", "c"]]], ["a", "b", "c"]) == 1.0


def test_alternative_order_agreement_bad_input_names_annotator_and_order():
    with pytest.raises(ValueError, match="at least 2 annotators"):
        alternative_order_agreement({"w1": [[1, 3, 2]]}, GOLD)
    with pytest.raises(ValueError, match=r"annotator .w2., order 1: \[1, 2, 4\] is not an order of the gold order.s items \[1, 2, 3\]"):
        alternative_order_agreement({"w1": [[1, 3, 2]], "w2": [[1, 3, 2], [1, 2, 4]]}, GOLD)
    with pytest.raises(ValueError, match="annotator 'w2': needs a non-empty list"):
        alternative_order_agreement({"w1": [[1, 3, 2]], "w2": []}, GOLD)
    with pytest.raises(ValueError, match="not an order"):
        alternative_order_agreement([[[1, 3, 2]], [[1, 1, 3]]], GOLD)
    with pytest.raises(ValueError, match="duplicate"):
        alternative_order_agreement([[[1, 3, 2]], [[1, 3, 2]]], [1, 1, 2])


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


def test_procedure_statistics_a_pair_linked_only_backwards_is_not_independent():
    """Edges may point from a later step to an earlier one (2 -> 0: step 0 needs step 2): the pair
    (0, 2) is then linked only in reverse and is not independent; (0, 1) and (1, 2) are. A chain
    3 -> 1 -> 0 links (0, 3) only through two reversed edges."""
    stats = procedure_statistics([_proc("r", 3, [(2, 0)])])
    assert stats["independent_pair_share"] == pytest.approx(2 / 3)
    assert stats["linear_extensions"]["max"] == 3.0  # 2 before 0, 1 anywhere
    chain = procedure_statistics([_proc("c", 4, [(3, 1), (1, 0)])])
    # pairs: 0-1, 1-3, 0-3 linked (0-3 through 1); 0-2, 1-2, 2-3 independent
    assert chain["independent_pair_share"] == pytest.approx(3 / 6)
