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


def _algorithm1_reference(orders_i, orders_j, gold):
    """Algorithm 1, lines 4-14 (Wu et al. 2022, B.3.2), written out with plain loops and sklearn's kappa."""
    def f(a, b):
        ra, rb = (np.abs(pairwise_relations(gold) - pairwise_relations(o)) for o in (a, b))
        union = (ra == 1) | (rb == 1)
        x, y = ra[union].tolist(), rb[union].tolist()
        if not x:
            return 1.0
        if len(set(x)) == 1 and len(set(y)) == 1:   # both constant: sklearn's kappa is undefined there
            return 1.0 if x == y else 0.0
        return float(cohen_kappa_score(x, y))
    short, long_ = (list(orders_i), list(orders_j)) if len(orders_i) <= len(orders_j) else (list(orders_j), list(orders_i))
    scores = []
    while short:
        best = None
        for m, a in enumerate(short):
            for n, b in enumerate(long_):
                if best is None or f(a, b) > best[0]:
                    best = (f(a, b), m, n)
        scores.append(best[0])
        del short[best[1]], long_[best[2]]
    return scores + [f(gold, o) for o in long_]


def test_algorithm1_matches_a_plain_loop_implementation_on_random_series():
    """Random series of alternative orders (equal and unequal lengths, with repeats that tie):
    the greedy best-pair matching, each order used once, ties to the first row then column, and
    the penalty for what is left, all as in the written-out algorithm."""
    rng = np.random.default_rng(3)
    gold = [0, 1, 2, 3]
    perms = [list(p) for p in itertools.permutations(gold)]
    for _ in range(150):
        k_i, k_j = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        series_i = [perms[int(r)] for r in rng.integers(0, len(perms), k_i)]
        series_j = [perms[int(r)] for r in rng.integers(0, len(perms), k_j)]
        expected = _algorithm1_reference(series_i, series_j, gold)
        assert alternative_order_pair_scores(series_i, series_j, gold) == pytest.approx(expected)


def test_relation_difference_follows_the_given_item_order():
    """``items`` fixes the enumeration of the ordered pairs: with items (3, 1, 2) the pairs are
    31, 32, 13, 12, 23, 21. Gold 123 vs order 132 flips 32 and 23 only."""
    assert relation_difference([1, 3, 2], [1, 2, 3], items=[3, 1, 2]).tolist() == [0, 1, 0, 0, 1, 0]
    assert relation_difference([1, 3, 2], [1, 2, 3]).tolist() == [0, 0, 0, 1, 0, 1]   # sorted items: 12 13 21 23 31 32


def test_items_that_do_not_match_the_orders_are_an_error_everywhere():
    """``items`` is checked against the orders, not ignored, by every agreement function."""
    gold, other = [1, 2, 3], [1, 3, 2]
    for call in (lambda: mean_pairwise_kappa([gold, other], items=[1, 2, 4]),
                 lambda: relation_difference(other, gold, items=[1, 2, 4]),
                 lambda: difference_kappa(other, other, gold, items=[1, 2, 4]),
                 lambda: alternative_order_pair_scores([other], [gold, other], gold, items=[1, 2, 4]),
                 lambda: alternative_order_agreement([[other], [gold, other]], gold, items=[1, 2, 4])):
        with pytest.raises(ValueError):
            call()
    # the same calls with a valid item order give the values of the default (sorted) one
    assert mean_pairwise_kappa([gold, other], items=[3, 2, 1]) == pytest.approx(mean_pairwise_kappa([gold, other]))
    assert alternative_order_agreement([[other], [gold, other]], gold, items=[2, 3, 1]) == pytest.approx(
        alternative_order_agreement([[other], [gold, other]], gold))


def test_alternative_order_agreement_errors_name_the_argument_and_the_annotator():
    with pytest.raises(ValueError, match=r"^gold must be a sequence of step ids, got 'abc'$"):
        alternative_order_agreement([[[1, 2, 3]], [[1, 2, 3]]], "abc")
    # annotators given as a list are named by their index
    with pytest.raises(ValueError, match=r"^annotator 1: needs a non-empty list of orders, got \[\]$"):
        alternative_order_agreement([[[1, 3, 2]], []], GOLD)
    # a string is not a list of orders (it would otherwise be read as orders of characters)
    with pytest.raises(ValueError, match=r"^annotator 'w2': needs a non-empty list of orders, got '132'$"):
        alternative_order_agreement({"w1": [[1, 3, 2]], "w2": "132"}, GOLD)
    # an order that is not a sequence: the message names the annotator and order once, in full
    with pytest.raises(ValueError) as err:
        alternative_order_agreement({"w1": [[1, 3, 2]], "w2": ["132"]}, GOLD)
    assert str(err.value) == ("annotator 'w2', order 0: '132' is not an order of the gold order's items [1, 2, 3] "
                              "(annotator 'w2', order 0 must be a sequence of step ids, got '132')")


def test_dag_masi_agreement_node_ids():
    """Nodes missing from one annotation have an empty out-set there; node ids that are not
    integers (names) are kept as they are; digit strings and ints are the same node."""
    a = {"mix": ["cook"], "cook": []}
    b = {"mix": ["cook"]}
    assert dag_masi_agreement(a, b) == 1.0
    assert dag_masi_agreement(b, a) == 1.0
    assert dag_masi_agreement({"a": ["b"], "b": []}, {"a": ["c"], "c": []}) == pytest.approx(1 - 1 / 3)
    assert dag_masi_agreement({" 7": ["8"]}, {7: [8]}) == 1.0
    assert dag_masi_agreement({(0, 1): [(1, 2)]}, {(0, 1): [(1, 2)]}) == 1.0   # any hashable node id


def test_procedure_statistics_degrees_without_edges_or_dags_and_several_capped():
    no_edges = procedure_statistics([_proc("e", 3, [])])
    assert no_edges["mean_out_degree_branching"] == 0.0 and no_edges["mean_out_degree_all"] == 0.0
    assert no_edges["independent_pair_share"] == 1.0
    no_dag = procedure_statistics([_proc("x", 2, None)])
    assert no_dag["mean_out_degree_branching"] is None and no_dag["mean_out_degree_all"] is None
    assert no_dag["independent_pair_share"] is None and no_dag["edges_per_procedure"] is None
    capped = procedure_statistics([_proc("a", 4, []), _proc("b", 4, []), _proc("c", 2, [])], limit=3)
    assert capped["linear_extensions"] == {"mean": 8 / 3, "median": 3.0, "min": 2.0, "max": 3.0, "limit": 3, "num_capped": 2}


@pytest.mark.parametrize("alternatives, gold, message", [
    ({"w1": [[1, 3, 2]], "w2": [[1, 3, 2], [1, 2, 4]]}, GOLD,
     "annotator 'w2', order 1: [1, 2, 4] is not an order of the gold order's items [1, 2, 3] "
     "(annotator 'w2', order 1 and gold are not permutations of each other: annotator 'w2', order 1=[1, 2, 4], "
     "gold=[1, 2, 3])"),
    ([[[1, 3, 2]], [[3, 3, 1]]], GOLD,
     "annotator 1, order 0: [3, 3, 1] is not an order of the gold order's items [1, 2, 3] "
     "(annotator 1, order 0 has duplicate items: [3, 3, 1])"),
    ([[[1, 3, 2]], [[1, 3, 2]]], [1, 1, 2], "gold has duplicate items: [1, 1, 2]"),
])
def test_alternative_order_agreement_error_messages_in_full(alternatives, gold, message):
    """The full message: which annotator's which order, the gold items, and why (as the ordering checks say it)."""
    with pytest.raises(ValueError) as err:
        alternative_order_agreement(alternatives, gold)
    assert str(err.value) == message


def test_alternative_order_pair_scores_check_items_without_unmatched_orders():
    """Series of equal length leave nothing to penalise: the item order is still checked (and named)."""
    with pytest.raises(ValueError) as err:
        alternative_order_pair_scores([[1, 3, 2]], [[1, 2, 3]], GOLD, items=[1, 2, 4])
    assert str(err.value) == "items and order are not permutations of each other: items=[1, 2, 4], order=[1, 2, 3]"
