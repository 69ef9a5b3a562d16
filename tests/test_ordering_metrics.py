"""Tests of seqaware.metrics.ordering: brute-force checks, hand-computed examples, statistics."""
from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau
from sklearn.metrics import cohen_kappa_score

from seqaware.metrics import OrderingMetrics
from seqaware.metrics.ordering import (
    SEQUENCING_METRICS,
    binary_kappa,
    corpus_order_metrics,
    dag_order_metrics,
    order_kappa,
    order_metrics,
    order_keys,
    pairwise_relations,
    select_reference,
)


def hand(scores: dict, **expected: float) -> bool:
    """``scores`` has one value per sequencing metric, in the list's order (however many the list holds), and the
    hand-computed ``expected`` ones (``approx``: the floats of 2/3 and the like)."""
    return list(scores) == list(order_keys()) and {k: scores[k] for k in expected} == pytest.approx(expected)


def random_perm(rng: random.Random, n: int) -> list[int]:
    perm = list(range(n))
    rng.shuffle(perm)
    return perm


def brute_lcs(a: list, b: list) -> int:
    """Longest subsequence of ``a`` (tried from the longest) that is also a subsequence of ``b``."""
    def is_subsequence(sub, seq):
        it = iter(seq)
        return all(x in it for x in sub)

    for size in range(len(a), 0, -1):
        if any(is_subsequence(sub, b) for sub in itertools.combinations(a, size)):
            return size
    return 0


def brute_lcstr(a: list, b: list) -> int:
    best = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a) + 1):
            sub = a[i:j]
            if any(b[k:k + len(sub)] == sub for k in range(len(b) - len(sub) + 1)):
                best = max(best, len(sub))
    return best


# ---------------------------------------------------------------- per-instance metrics
def test_hand_computed_example():
    m = order_metrics([2, 0, 1, 3], [0, 1, 2, 3])
    assert hand(m,
                acc=0.25,      # only position 3 agrees
                pmr=0.0,
                dist=4.0,      # |0-2| + |1-0| + |2-1| + |3-3|
                lcs=3.0,       # 0 1 3
                lcstr=2.0,     # 0 1
                tau=1 / 3)     # 2 inversions of 6 pairs: 1 - 4/6
    assert {"acc", "pmr", "dist", "lcs", "lcstr", "tau"} <= set(order_keys())   # the built-ins, whatever else is added
    assert all(isinstance(v, float) for v in m.values())


def test_identical_and_reversed():
    assert hand(order_metrics([3, 1, 2], [3, 1, 2]), acc=1.0, pmr=1.0, dist=0.0, lcs=3.0, lcstr=3.0, tau=1.0)
    m = order_metrics([4, 3, 2, 1, 0], [0, 1, 2, 3, 4])
    assert m["tau"] == -1.0 and m["lcs"] == 1.0 and m["lcstr"] == 1.0
    assert m["acc"] == pytest.approx(0.2) and m["dist"] == 12.0
    assert hand(order_metrics(["x"], ["x"]), acc=1.0, pmr=1.0, dist=0.0, lcs=1.0, lcstr=1.0, tau=1.0)


def test_any_hashable_items_and_arrays():
    assert order_metrics(["b", "a", "c"], ["a", "b", "c"])["lcstr"] == 1.0
    assert order_metrics(np.array([1, 0, 2]), torch.tensor([0, 1, 2])) == order_metrics([1, 0, 2], [0, 1, 2])


@pytest.mark.parametrize("pred, gold", [
    ([0, 1, 2], [0, 1, 3]),     # different items
    ([0, 1, 1], [0, 1, 2]),     # duplicate in pred
    ([0, 1, 2], [0, 1, 1]),     # duplicate in gold
    ([0, 1], [0, 1, 2]),        # different length
    ([], []),                   # empty
])
def test_bad_input_raises(pred, gold):
    with pytest.raises(ValueError):
        order_metrics(pred, gold)


def test_tau_matches_scipy():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 10)
        pred, gold = random_perm(rng, n), random_perm(rng, n)
        pos_pred = [pred.index(i) for i in range(n)]
        pos_gold = [gold.index(i) for i in range(n)]
        expected = kendalltau(pos_pred, pos_gold).statistic
        assert order_metrics(pred, gold)["tau"] == pytest.approx(expected)


def test_lcs_and_lcstr_match_brute_force():
    rng = random.Random(1)
    for _ in range(150):
        n = rng.randint(1, 8)
        pred, gold = random_perm(rng, n), random_perm(rng, n)
        m = order_metrics(pred, gold)
        assert m["lcs"] == brute_lcs(pred, gold)
        assert m["lcstr"] == brute_lcstr(pred, gold)


def test_random_five_step_statistics():
    rng = np.random.default_rng(2)
    gold = list(range(5))
    samples = [order_metrics(rng.permutation(5).tolist(), gold) for _ in range(20000)]
    mean = {k: np.mean([s[k] for s in samples]) for k in order_keys()}
    assert abs(mean["dist"] - 8.0) < 0.3        # exact expectation (n^2 - 1) / 3 = 8
    assert abs(mean["tau"]) < 0.03
    assert abs(mean["pmr"] - 1 / 120) < 0.004
    assert abs(mean["acc"] - 0.2) < 0.02        # one fixed point in expectation


def test_dist_exact_expectation_for_five_steps():
    gold = list(range(5))
    dists = [order_metrics(list(p), gold)["dist"] for p in itertools.permutations(gold)]
    assert sum(dists) / len(dists) == pytest.approx(8.0)


# ---------------------------------------------------------------- multiple references
def test_select_reference_jointly_best_and_first_on_ties():
    pred = [0, 2, 1, 3]
    refs = [[0, 1, 2, 3], [2, 0, 1, 3], [0, 2, 1, 3]]
    index, scores = select_reference(pred, refs)
    assert index == 2 and scores["pmr"] == 1.0
    # no perfect match: ref 1 has the higher acc, ref 0 the higher tau -> acc wins (comes first)
    pred = [0, 1, 2, 3, 4]
    refs = [[1, 2, 3, 4, 0], [0, 4, 3, 2, 1]]
    assert order_metrics(pred, refs[0])["tau"] > order_metrics(pred, refs[1])["tau"]
    assert order_metrics(pred, refs[1])["acc"] > order_metrics(pred, refs[0])["acc"]
    assert select_reference(pred, refs)[0] == 1
    # equal acc: the higher tau wins, wherever it is listed
    refs = [[0, 4, 3, 2, 1], [1, 0, 2, 4, 3]]
    assert order_metrics(pred, refs[0])["acc"] == order_metrics(pred, refs[1])["acc"]
    assert select_reference(pred, refs)[0] == 1
    # full tie: the first listed
    assert select_reference([0, 1, 2], [[1, 0, 2], [0, 2, 1]])[0] == 0
    assert select_reference([0, 1, 2], [[0, 2, 1], [1, 0, 2]])[0] == 0


def test_select_reference_wu2022_differs_from_joint():
    pred = [0, 1, 2, 3]
    refs = [[0, 2, 1, 3], [3, 1, 2, 0]]
    # vs ref 0: acc 2/4 (0, 3 in place), pmr 0, lcstr 1, lcs 3 (0 1 3), tau 1 - 2*1/6 = 2/3, dist 2
    # vs ref 1: acc 2/4 (1, 2 in place), pmr 0, lcstr 2 ("1 2"), lcs 2, tau 1 - 2*5/6 = -2/3, dist 6
    assert select_reference(pred, refs)[0] == 0                         # joint: (pmr, acc, tau ...)
    index, scores = select_reference(pred, refs, reference_selection="wu2022")   # (acc, pmr, lcstr ...)
    assert index == 1
    assert hand(scores, acc=0.5, pmr=0.0, dist=6.0, lcs=2.0, lcstr=2.0, tau=-2 / 3)
    # a perfect match always wins under both rules (acc 1 is the maximum too)
    assert select_reference(pred, [[1, 0, 2, 3], pred], reference_selection="wu2022")[0] == 1
    # acc before pmr-free lcstr: higher acc wins even with a shorter common substring
    refs = [[1, 2, 3, 0], [0, 3, 2, 1]]   # ref 0: acc 0, lcstr 3; ref 1: acc 2/4, lcstr 1
    assert select_reference(pred, refs, "wu2022")[0] == 1


def test_select_reference_wu2022_ties():
    pred = [0, 1, 2, 3]
    # full tie (identical references): the first listed wins under both rules
    assert select_reference(pred, [[1, 0, 2, 3], [1, 0, 2, 3]], "wu2022")[0] == 0
    assert select_reference([0, 1, 2], [[1, 0, 2], [0, 2, 1]], "wu2022")[0] == 0  # same six metrics, ms 1 = 1, wms 1 = 1
    assert select_reference([0, 1, 2], [[0, 2, 1], [1, 0, 2]], "wu2022")[0] == 0
    # all six metrics tie and the minimum swaps tie (one 3-cycle each, ms = 2); the authors' weighted
    # swaps break it: cycle 1->2->3 weighs |2 - 1| = 1 (wms 2), cycle 1->3->2 weighs |3 - 1| = 2 (wms 4),
    # and the code keeps the larger
    refs = [[0, 2, 3, 1], [0, 3, 1, 2]]
    assert order_metrics(pred, refs[0]) == order_metrics(pred, refs[1])
    assert select_reference(pred, refs)[0] == 0
    assert select_reference(pred, refs, "wu2022")[0] == 1
    # acc, pmr, lcstr, lcs, tau tie (0.2, 0, 1, 2, -0.2), Dist differs (8 vs 10): the authors' code
    # maximises the trailing entries, so wu2022 reports Dist 10 where joint reports 8
    pred = [0, 1, 2, 3, 4]
    refs = [[0, 4, 3, 2, 1], [3, 1, 4, 0, 2]]
    a, b = order_metrics(pred, refs[0]), order_metrics(pred, refs[1])
    assert (a["acc"], a["lcstr"], a["lcs"], a["dist"]) == (0.2, 1.0, 2.0, 8.0)
    assert (b["acc"], b["lcstr"], b["lcs"], b["dist"]) == (0.2, 1.0, 2.0, 10.0)
    assert a["tau"] == pytest.approx(-0.2) and b["tau"] == pytest.approx(-0.2)
    assert corpus_order_metrics([pred], [refs])["dist"] == 8.0
    assert corpus_order_metrics([pred], [refs], reference_selection="wu2022")["dist"] == 10.0


def test_wu2022_tie_breakers_minimum_swaps_hand_values():
    from seqaware.metrics.ordering import _minimum_swaps

    # p[k] = gold position of the k-th predicted item; the authors' MS walks k -> position in pred of gold[k]
    assert _minimum_swaps([0, 1, 2]) == 0 and _minimum_swaps([0, 1, 2], weighted=True) == 0
    assert _minimum_swaps([1, 0, 3, 2]) == 2                   # two 2-cycles
    assert _minimum_swaps([1, 0, 3, 2], weighted=True) == 2    # (2 - 1) * |1 - 0| + (2 - 1) * |3 - 2|
    # pred 0 1 2 vs gold 2 0 1: p = [1, 2, 0]; one 3-cycle 0 -> 2 -> 1 -> 0 from position 0 (weight |2 - 0|)
    assert _minimum_swaps([1, 2, 0]) == 2 and _minimum_swaps([1, 2, 0], weighted=True) == 4
    assert _minimum_swaps([0]) == 0


def test_select_reference_boundaries():
    for rule in ("joint", "wu2022"):
        index, scores = select_reference([7], [[7], [7]], rule)       # one item: everything perfect, first wins
        assert index == 0 and hand(scores, acc=1.0, pmr=1.0, dist=0.0, lcs=1.0, lcstr=1.0, tau=1.0)
        assert select_reference([0, 1], [[1, 0], [0, 1]], rule)[0] == 1
        assert select_reference(np.array([0, 1, 2]), torch.tensor([[0, 2, 1], [0, 1, 2]]), rule)[0] == 1
        with pytest.raises(ValueError, match="at least one order"):
            select_reference([0, 1], [], rule)


def test_select_reference_rejects_unknown_rule():
    with pytest.raises(ValueError, match="reference_selection must be one of"):
        select_reference([0, 1], [[0, 1]], reference_selection="max")
    with pytest.raises(ValueError, match="reference_selection"):
        corpus_order_metrics([[0, 1]], [[[0, 1]]], reference_selection="best")
    with pytest.raises(ValueError, match="reference_selection"):
        OrderingMetrics(reference_selection="Wu2022")


def test_corpus_wu2022_selection_hand_computed():
    preds = [[0, 1, 2, 3], [0, 1, 2]]
    refs = [[[0, 2, 1, 3], [3, 1, 2, 0]], [[0, 1, 2]]]
    joint = corpus_order_metrics(preds, refs)
    wu = corpus_order_metrics(preds, refs, reference_selection="wu2022")
    # instance 0: joint scores ref 0 (lcstr 1, tau 2/3), wu2022 ref 1 (lcstr 2, tau -2/3); instance 1 is exact
    assert joint["lcstr"] == pytest.approx((1 + 3) / 2) and wu["lcstr"] == pytest.approx((2 + 3) / 2)
    assert joint["tau"] == pytest.approx((2 / 3 + 1) / 2) and wu["tau"] == pytest.approx((-2 / 3 + 1) / 2)
    assert wu["dist"] == pytest.approx(3.0) and joint["dist"] == pytest.approx(1.0)
    assert wu["subset_multi/lcs"] == 2.0 and joint["subset_multi/lcs"] == 3.0
    for k in order_keys():  # single-reference scores do not depend on the rule
        assert wu[f"single/{k}"] == joint[f"single/{k}"]


def test_ordering_metric_threads_reference_selection():
    preds, refs, dags = _random_corpus(8, 40)
    for rule in ("joint", "wu2022"):
        metric = OrderingMetrics(reference_selection=rule)
        metric.update(preds[:20], refs[:20], dags[:20])
        metric.update(preds[20:], refs[20:], dags[20:])
        expected = corpus_order_metrics(preds, refs, dags, reference_selection=rule)
        assert {k: float(v) for k, v in metric.compute().items()} == pytest.approx(expected)
    assert OrderingMetrics().reference_selection == "joint"


def test_corpus_scores_one_reference_for_all_metrics():
    pred = [0, 1, 2, 3, 4]
    refs = [[1, 2, 3, 4, 0], [0, 4, 3, 2, 1]]   # ref 1 is selected (acc 0.2 vs 0.0)
    out = corpus_order_metrics([pred], [refs])
    chosen = order_metrics(pred, refs[1])
    for k in order_keys():
        assert out[k] == pytest.approx(chosen[k])
    # the metrics are not cherry-picked per key: ref 0 has a better lcstr (4) but is not used
    assert order_metrics(pred, refs[0])["lcstr"] == 4.0 and out["lcstr"] == 1.0
    for k in order_keys():
        assert out[f"single/{k}"] == pytest.approx(order_metrics(pred, refs[0])[k])


def test_corpus_subsets_and_counts():
    preds = [[0, 1, 2], [1, 0, 2], [2, 1, 0]]
    refs = [[[0, 1, 2]], [[0, 1, 2], [1, 0, 2]], [[0, 1, 2]]]
    out = corpus_order_metrics(preds, refs)
    assert (out["n"], out["n_single"], out["n_multi"]) == (3, 2, 1)
    assert out["pmr"] == pytest.approx(2 / 3)
    assert out["single/pmr"] == pytest.approx(1 / 3)
    assert out["subset_single/pmr"] == pytest.approx(0.5)
    assert out["subset_single/tau"] == pytest.approx(0.0)  # (1 + -1) / 2
    assert out["subset_multi/pmr"] == 1.0
    assert not any(k.startswith("dag/") for k in out)
    # no multi-reference instance -> no subset_multi keys, never NaN
    out = corpus_order_metrics([[0, 1, 2]], [[[0, 2, 1]]])
    assert out["n_multi"] == 0 and not any(k.startswith("subset_multi/") for k in out)
    assert all(not math.isnan(v) for v in out.values())
    assert corpus_order_metrics([], []) == {"n": 0.0, "n_single": 0.0, "n_multi": 0.0}


def test_corpus_bad_input():
    with pytest.raises(ValueError):
        corpus_order_metrics([[0, 1]], [[[0, 1]], [[1, 0]]])       # length mismatch
    with pytest.raises(ValueError, match="instance 0"):
        corpus_order_metrics([[0, 0]], [[[0, 1]]])                 # not a permutation
    with pytest.raises(ValueError, match="list of orders"):
        corpus_order_metrics([[0, 1]], [[0, 1]])                   # flat order instead of a list
    with pytest.raises(ValueError):
        corpus_order_metrics([[0, 1]], [[]])                       # no reference


# ---------------------------------------------------------------- DAG metrics
def test_dag_metrics_hand_made():
    edges = [(0, 1), (1, 3), (2, 3)]  # closure: (0,1) (0,3) (1,3) (2,3)
    assert dag_order_metrics([2, 0, 1, 3], 4, edges) == {"valid": 1.0, "violated": 0.0, "tau": 1.0}
    m = dag_order_metrics([1, 0, 2, 3], 4, edges)  # only (0, 1) reversed
    assert m == pytest.approx({"valid": 0.0, "violated": 0.25, "tau": 0.5})
    chain = [(0, 1), (1, 2), (2, 3)]
    assert dag_order_metrics([3, 2, 1, 0], 4, chain) == {"valid": 0.0, "violated": 1.0, "tau": -1.0}
    with pytest.raises(ValueError):
        dag_order_metrics([0, 1, 2], 4, chain)


def test_dag_metrics_agree_with_enumeration():
    from seqaware import dag as D
    rng = random.Random(3)
    for _ in range(40):
        n = rng.randint(2, 6)
        perm = random_perm(rng, n)
        edges = [(perm[a], perm[b]) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.4]
        pred = random_perm(rng, n)
        m = dag_order_metrics(pred, n, edges)
        assert m["valid"] == float(pred in D.linear_extensions(n, edges))
        assert m["tau"] == pytest.approx(1 - 2 * m["violated"])


def test_corpus_dag_metrics():
    preds = [[0, 1, 2], [2, 1, 0], [1, 0, 2], [0, 1, 2]]
    refs = [[[0, 1, 2]]] * 4
    dags = [(3, [(0, 1), (1, 2)]), (3, [(0, 1), (1, 2)]), None, (3, [])]
    out = corpus_order_metrics(preds, refs, dags)
    assert out["dag/n"] == 2   # instances without a DAG or without edges are not counted
    assert out["dag/valid"] == 0.5 and out["dag/violated"] == 0.5 and out["dag/tau"] == 0.0
    assert not any(k.startswith("dag/") for k in corpus_order_metrics(preds, refs, [None] * 4))


# ---------------------------------------------------------------- pairwise relations and kappa
def test_pairwise_relations_paper_examples():
    # Wu et al. 2022, B.3.1: pairs {12, 13, 21, 23, 31, 32}; R123 = 110100, R231 = 001110
    np.testing.assert_array_equal(pairwise_relations([1, 2, 3]), [1, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(pairwise_relations([2, 3, 1]), [0, 0, 1, 1, 1, 0])
    # B.3.2: R132 = 110001, R213 = 011100
    np.testing.assert_array_equal(pairwise_relations([1, 3, 2]), [1, 1, 0, 0, 0, 1])
    np.testing.assert_array_equal(pairwise_relations([2, 1, 3]), [0, 1, 1, 1, 0, 0])


def test_pairwise_relations_encoding():
    # ordered pairs (0,1) (0,2) (0,3) (1,0) (1,2) (1,3) (2,0) (2,1) (2,3) (3,0) (3,1) (3,2)
    # order 2 0 3 1: 0<1 yes, 0<2 no, 0<3 yes, 1<0 no, 1<2 no, 1<3 no, 2<0 yes, 2<1 yes, 2<3 yes, 3<0 no, 3<1 yes, 3<2 no
    np.testing.assert_array_equal(pairwise_relations([2, 0, 3, 1]), [1, 0, 1, 0, 0, 0, 1, 1, 1, 0, 1, 0])
    np.testing.assert_array_equal(pairwise_relations(["c", "a", "b"]), [1, 0, 0, 0, 1, 1])  # pairs ab ac ba bc ca cb
    np.testing.assert_array_equal(pairwise_relations([0, 1, 2], items=[2, 1, 0]), [0, 0, 1, 0, 1, 1])
    assert pairwise_relations([5]).shape == (0,)
    assert pairwise_relations([0, 1]).tolist() == [1, 0]
    rng = random.Random(3)
    for n in range(2, 8):  # half of the n (n - 1) ordered pairs hold; (a, b) and (b, a) are complementary
        enc = pairwise_relations(random_perm(rng, n)).reshape(n, n - 1)
        assert enc.size == n * (n - 1) and enc.sum() == n * (n - 1) // 2
    with pytest.raises(ValueError):
        pairwise_relations([0, 1], items=[0, 2])


def test_order_kappa_paper_values():
    # B.3.1 encoding: (1 2 3) vs (1 3 2) agree on 4 of 6 pairs, p_e = 1/2 -> (2/3 - 1/2) / (1/2) = 1/3
    assert order_kappa([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert order_kappa([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert order_kappa([1, 2, 3], [1, 2, 3]) == 1.0
    # (1 2 3) vs (2 3 1): 110100 vs 001110 agree only on 23 and 32 -> p_o = 1/3 -> kappa = -1/3
    assert order_kappa([1, 2, 3], [2, 3, 1]) == pytest.approx(-1 / 3)


def test_order_kappa_matches_sklearn_and_kendall_tau():
    rng = random.Random(4)
    for _ in range(200):
        n = rng.randint(2, 8)
        a, b = random_perm(rng, n), random_perm(rng, n)
        x, y = pairwise_relations(a), pairwise_relations(b)
        assert order_kappa(a, b) == pytest.approx(cohen_kappa_score(x, y))
        # every encoding is half ones, so p_e = 1/2 and kappa = 2 p_o - 1 = Kendall's tau
        pos_a = [a.index(i) for i in range(n)]
        pos_b = [b.index(i) for i in range(n)]
        assert order_kappa(a, b) == pytest.approx(kendalltau(pos_a, pos_b).statistic)


def test_order_kappa_degenerate_cases():
    assert order_kappa([0, 1, 2], [0, 1, 2]) == 1.0
    assert order_kappa([2, 1, 0], [2, 1, 0]) == 1.0
    assert order_kappa([0, 1, 2], [2, 1, 0]) == pytest.approx(-1.0)
    assert order_kappa([0, 1], [1, 0]) == pytest.approx(-1.0)
    assert order_kappa([7], [7]) == 1.0
    with pytest.raises(ValueError):
        order_kappa([0, 1, 2], [0, 1, 3])


# ---------------------------------------------------------------- torchmetrics wrapper
def _random_corpus(seed: int, size: int):
    rng = random.Random(seed)
    preds, refs, dags = [], [], []
    for _ in range(size):
        n = rng.randint(2, 6)
        perm = random_perm(rng, n)
        edges = [(perm[a], perm[b]) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.3]
        preds.append(random_perm(rng, n))
        refs.append([random_perm(rng, n) for _ in range(rng.choice([1, 1, 2, 3]))])
        dags.append(rng.choice([None, (n, edges)]))
    return preds, refs, dags


def test_ordering_metric_equals_corpus_metrics():
    preds, refs, dags = _random_corpus(5, 60)
    expected = corpus_order_metrics(preds, refs, dags)
    metric = OrderingMetrics()
    for start in range(0, 60, 13):
        metric.update(preds[start:start + 13], refs[start:start + 13], dags[start:start + 13])
    got = metric.compute()
    assert set(got) == set(expected)
    for k, v in got.items():
        assert isinstance(v, torch.Tensor) and v.ndim == 0 and v.is_floating_point()
        assert float(v) == pytest.approx(expected[k], abs=1e-12)
    metric.reset()
    metric.update(preds[:3], refs[:3])
    assert {k: float(v) for k, v in metric.compute().items()} == pytest.approx(corpus_order_metrics(preds[:3], refs[:3]))


def test_ordering_metric_states_are_fixed_sums():
    metric = OrderingMetrics()
    names = set(metric._defaults)
    metric.update([[0, 1]], [[[0, 1]]])
    metric.update([[1, 0, 2]], [[[0, 1, 2], [1, 0, 2]]], [(3, [(0, 2)])])
    assert set(metric._defaults) == names
    assert all(metric._reductions[name] is not None for name in names)
    out = metric.compute()
    assert float(out["n_single"]) == 1 and float(out["n_multi"]) == 1 and float(out["dag/n"]) == 1
    with pytest.raises(ValueError):
        metric.update([[0, 0]], [[[0, 1]]])


def test_score_predictions_script_reference_selection(tmp_path, monkeypatch, capsys):
    import json
    import runpy
    import sys
    from pathlib import Path

    path = tmp_path / "predictions_test.jsonl"
    path.write_text(json.dumps({"pred": [0, 1, 2, 3], "references": [[0, 2, 1, 3], [3, 1, 2, 0]]}) + "\n")
    script = Path(__file__).resolve().parents[1] / "scripts" / "tools" / "score_predictions.py"
    rows = {}
    for rule in ("joint", "wu2022"):
        monkeypatch.setattr(sys, "argv", [str(script), str(path), "--reference-selection", rule])
        runpy.run_path(str(script), run_name="__main__")
        rows[rule] = capsys.readouterr().out.strip().splitlines()[-1].split("|")[2:-1]  # acc pmr dist lcs lcstr tau ...
    assert [float(v) for v in rows["joint"][:6]] == pytest.approx([0.5, 0.0, 2.0, 3.0, 1.0, 2 / 3], abs=1e-4)
    assert [float(v) for v in rows["wu2022"][:6]] == pytest.approx([0.5, 0.0, 6.0, 2.0, 2.0, -2 / 3], abs=1e-4)


@pytest.mark.parametrize("call, message", [
    (lambda: order_metrics("abc", [0, 1, 2]), "pred must be a sequence of step ids, got 'abc'"),
    (lambda: order_metrics([0, 1, 2], 5), "gold must be a sequence of step ids, got 5"),
    (lambda: order_metrics([0, 1, 1], [0, 1, 2]), "pred has duplicate items: [0, 1, 1]"),
    (lambda: order_metrics([0, 1, 2], [0, 2, 2]), "gold has duplicate items: [0, 2, 2]"),
    (lambda: order_metrics([0, 1, 3], [0, 1, 2]),
     "pred and gold are not permutations of each other: pred=[0, 1, 3], gold=[0, 1, 2]"),
    (lambda: order_metrics([[0], [1]], [[0], [1]]), "step ids must be hashable: unhashable type: 'list'"),
    (lambda: pairwise_relations(b"ab"), "order must be a sequence of step ids, got b'ab'"),
    (lambda: pairwise_relations([0, 1, 1]), "order has duplicate items: [0, 1, 1]"),
    (lambda: pairwise_relations([0, 1], items="01"), "items must be a sequence of step ids, got '01'"),
    (lambda: pairwise_relations([0, 1], items=[0, 2]),
     "items and order are not permutations of each other: items=[0, 2], order=[0, 1]"),
    (lambda: pairwise_relations([0, 1], items=[0, 1, 1]), "items has duplicate items: [0, 1, 1]"),
    (lambda: pairwise_relations([0, "a"]), "the items cannot be sorted; pass items= to fix the pair order"),
    (lambda: order_kappa(3, [0, 1]), "order_a must be a sequence of step ids, got 3"),
    (lambda: order_kappa([0, 1], "10"), "order_b must be a sequence of step ids, got '10'"),
    (lambda: order_kappa([0, 1], [0, 2]),
     "order_a and order_b are not permutations of each other: order_a=[0, 1], order_b=[0, 2]"),
    (lambda: order_kappa([0, 1], [1, 0], items=[1]),
     "items and order are not permutations of each other: items=[1], order=[0, 1]"),
    (lambda: dag_order_metrics([0, 1, 5], 3, []),
     "pred and range(num_steps) are not permutations of each other: pred=[0, 1, 5], range(num_steps)=[0, 1, 2]"),
    (lambda: dag_order_metrics([0], 0, []), "num_steps must be a positive integer, got 0"),
    (lambda: select_reference([0, 1], "01"), "references must be a list of one or more orders, got '01'"),
    (lambda: select_reference([0, 1], []), "references must hold at least one order"),
    (lambda: select_reference([0, 1], [[0, 1]], reference_selection="best"),
     "reference_selection must be one of ('joint', 'wu2022'), got 'best'"),
])
def test_input_errors_name_the_argument(call, message):
    """Every input error says which argument is wrong and shows its value."""
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_the_metrics_package_loads_the_torchmetrics_class_on_first_use_and_names_unknown_attributes():
    import seqaware.metrics as metrics
    from seqaware.metrics.torch_metrics import OrderingMetrics as direct

    assert getattr(metrics, "OrderingMetrics") is direct
    with pytest.raises(AttributeError, match=r"^module 'seqaware\.metrics' has no attribute 'Ordering'$"):
        getattr(metrics, "Ordering")


@pytest.mark.parametrize("call, message", [
    (lambda: order_metrics([], []), "orders must hold at least one item"),
    (lambda: select_reference([0, 1], [(0, 1), {0, 1}]),
     "each reference must be an order (list of step ids), got {0, 1}; pass references as a list of orders, e.g. [[0, 1, 2]]"),
    (lambda: corpus_order_metrics([[0, 1]], [[[0, 1]], [[1, 0]]]), "got 1 predictions but 2 reference lists"),
    (lambda: corpus_order_metrics([[0, 1]], [[[0, 1]]], dags=[None, None]), "got 1 predictions but 2 DAGs"),
    (lambda: corpus_order_metrics([[0, 1]], [[[0, 1]]], dags=[3]),
     "instance 0: a DAG must be given as (num_steps, edges) or None, got 3"),
    (lambda: corpus_order_metrics([[0, 1]], [[[0, 1]]], dags=[(2,)]),
     "instance 0: a DAG must be given as (num_steps, edges) or None, got (2,)"),
    (lambda: corpus_order_metrics([[0, 1], [1, 0, 2]], [[[0, 1]], [[0, 1, 2], [1, 0]]]),
     "instance 1: pred and gold are not permutations of each other: pred=[1, 0, 2], gold=[1, 0]"),
    (lambda: dag_order_metrics([0, 1, 2], "3", [(0, 1)]), "num_steps must be a positive integer, got '3'"),
    (lambda: dag_order_metrics([0, 1, 2], 3.0, [(0, 1)]), "num_steps must be a positive integer, got 3.0"),
    (lambda: binary_kappa([0, 1], [0, 1, 1]), "encodings differ in length: 2 vs 3"),
])
def test_corpus_and_dag_input_errors_in_full(call, message):
    """The corpus errors name the instance (0-based) and what is wrong with it."""
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_a_cyclic_dag_raises_cycle_error_unchanged():
    """A cycle is not an instance input error: CycleError (a ValueError) comes through as raised, unprefixed."""
    from seqaware.dag import CycleError

    with pytest.raises(CycleError) as err:
        corpus_order_metrics([[0, 1]], [[[0, 1]]], dags=[(2, [(0, 1), (1, 0)])])
    assert str(err.value) == "the dependency graph has a cycle: 0 -> 1 -> 0"


def test_dag_metrics_one_step_numpy_sizes_and_edges_none():
    assert dag_order_metrics([0], 1, []) == {"valid": 1.0, "violated": 0.0, "tau": 1.0}
    assert dag_order_metrics([2, 1, 0], np.int64(3), [(0, 1)]) == {"valid": 0.0, "violated": 1.0, "tau": -1.0}
    # (num_steps, None): no edges, no DAG scores for the instance
    out = corpus_order_metrics([[1, 0]], [[[0, 1]]], dags=[(2, None)])
    assert not any(k.startswith("dag/") for k in out) and out["tau"] == -1.0


def test_corpus_reads_array_references_and_keeps_single_scores_apart():
    """References given as one array per instance; the selected (second) reference is an exact match while the
    authored first one is reversed: multi-reference and single-reference scores differ."""
    out = corpus_order_metrics([np.array([1, 0])], [np.array([[0, 1], [1, 0]])])
    keys = order_keys()
    assert list(out) == [*keys, *(f"single/{k}" for k in keys), *(f"subset_multi/{k}" for k in keys),
                         "n", "n_single", "n_multi"]
    assert {k: out[k] for k in out if not k.startswith("single/")} == {
        **{k: v for k, v in order_metrics([1, 0], [1, 0]).items()},          # exact: the selected reference
        **{f"subset_multi/{k}": v for k, v in order_metrics([1, 0], [1, 0]).items()}, "n": 1.0, "n_single": 0.0,
        "n_multi": 1.0}
    assert {k: out[f"single/{k}"] for k in keys} == order_metrics([1, 0], [0, 1])   # against the authored order
    assert hand(order_metrics([1, 0], [1, 0]), acc=1.0, pmr=1.0, dist=0.0, lcs=2.0, lcstr=2.0, tau=1.0)
    assert hand(order_metrics([1, 0], [0, 1]), acc=0.0, pmr=0.0, dist=2.0, lcs=1.0, lcstr=1.0, tau=-1.0)
    # one instance with one reference: the subset_single keys hold its scores (acc 1/3: only 0 in place)
    single = corpus_order_metrics([[0, 2, 1]], [[[0, 1, 2]]])
    assert single["subset_single/acc"] == 1 / 3 and single["subset_single/lcs"] == 2.0 and single["n_single"] == 1.0


def test_binary_kappa_hand_values_and_conventions():
    # 1011 vs 1101: p_o = 1/2, q = 3/4 each, p_e = 9/16 + 1/16 = 5/8 -> (1/2 - 5/8) / (3/8) = -1/3
    assert binary_kappa([1, 0, 1, 1], [1, 1, 0, 1]) == pytest.approx(-1 / 3)
    assert binary_kappa([1, 0, 1, 1], [1, 1, 0, 1]) == pytest.approx(cohen_kappa_score([1, 0, 1, 1], [1, 1, 0, 1]))
    assert binary_kappa([1, 0, 0, 0], [1, 0, 0, 0]) == 1.0
    # constant encodings (p_e = 1): 1.0 when they agree everywhere, else 0.0; empty: 1.0
    assert binary_kappa([1, 1], [1, 1]) == 1.0 and binary_kappa([0, 0], [0, 0]) == 1.0
    assert binary_kappa([1, 1], [0, 0]) == 0.0
    assert binary_kappa([], []) == 1.0
    assert binary_kappa([1], [0]) == 0.0 and binary_kappa([1], [1]) == 1.0     # one pair: constant encodings


def test_ordering_metric_values_are_float64_and_forward_scores_the_batch():
    """Exact float64 values (1/3 is not a float32 number), torchmetrics options are honoured, and calling the
    metric returns the batch's scores while adding them to the running sums."""
    metric = OrderingMetrics(reference_selection="wu2022", sync_on_compute=False)
    assert metric.sync_on_compute is False and metric.reference_selection == "wu2022"
    batch = metric([[0, 1, 2]], [[[0, 2, 1]]])          # acc 1/3, tau 1 - 2/3 = 1/3
    assert batch["acc"].dtype == torch.float64 and float(batch["acc"]) == 1 / 3
    assert float(batch["tau"]) == pytest.approx(1 / 3, abs=1e-15)
    metric([[1, 0]], [[[1, 0]]], [(2, [(1, 0)])])
    total = metric.compute()
    assert all(v.dtype == torch.float64 and v.ndim == 0 for v in total.values())
    assert float(total["acc"]) == (1 / 3 + 1) / 2 and float(total["n"]) == 2.0 and float(total["dag/valid"]) == 1.0


def test_subset_multi_averages_over_every_multi_reference_instance():
    """The ``subset_multi`` scores are the mean over the instances with several references (here two),
    each scored against the reference it selects; ``subset_single`` over the rest."""
    preds = [[0, 1, 2], [2, 1, 0], [1, 0, 2]]
    refs = [[[0, 1, 2], [1, 0, 2]], [[0, 1, 2], [0, 2, 1]], [[1, 0, 2]]]
    out = corpus_order_metrics(preds, refs)
    assert out["n_multi"] == 2.0
    first, second = order_metrics([0, 1, 2], [0, 1, 2]), order_metrics([2, 1, 0], [0, 1, 2])   # the selected references
    for key in order_keys():
        assert out[f"subset_multi/{key}"] == pytest.approx((first[key] + second[key]) / 2)
        assert out[f"subset_single/{key}"] == pytest.approx(order_metrics([1, 0, 2], [1, 0, 2])[key])


# ---------------------------------------------------------------- the list of metrics: adding one
@pytest.fixture
def toy_metric():
    """One more sequencing metric, added as an entry of SEQUENCING_METRICS (taken out after the test): 1.0 when the
    last predicted step is the reference's last; the joint rule ranks on it after every other metric."""
    from seqaware.metrics.ordering import OrderMetric

    place = max(m.selection for m in SEQUENCING_METRICS if m.selection is not None) + 1
    metric = OrderMetric("last_right", lambda p: float(p[-1] == len(p) - 1), selection=place)
    SEQUENCING_METRICS.append(metric)
    yield metric
    SEQUENCING_METRICS.remove(metric)


def test_a_metric_added_to_the_list_reaches_scores_logs_reports_the_wandb_table_the_script_and_the_rule(
        toy_metric, tmp_path, monkeypatch, capsys):
    import json
    import runpy
    import sys
    import types
    from pathlib import Path

    from seqaware.callbacks import CategoryReport
    from seqaware.metrics import ORDER_KEYS
    from seqaware.metrics.ordering import WU2022_RANKING, ranked_metrics
    from seqaware.reports import markdown_table, per_category

    pred, refs = [0, 1, 2, 3], [[0, 1, 3, 2], [1, 0, 2, 3]]
    first, second = order_metrics(pred, refs[0]), order_metrics(pred, refs[1])
    assert order_keys()[-1] == ORDER_KEYS[-1] == "last_right" and list(first) == list(order_keys())
    assert (first["last_right"], second["last_right"]) == (0.0, 1.0)
    # the rule: the built-ins tie on these references, so the new metric (ranked last) picks the second
    assert {k: v for k, v in first.items() if k != "last_right"} == {k: v for k, v in second.items() if k != "last_right"}
    assert ranked_metrics("joint")[-1] == "last_right" and ranked_metrics("wu2022") == WU2022_RANKING
    assert select_reference(pred, refs) == (1, second)
    assert select_reference(pred, refs, "wu2022")[0] == 0          # the authors' rule is fixed: the first wins the tie
    # corpus scores and the torchmetrics wrapper the modules log from
    corpus = corpus_order_metrics([pred], [refs])
    assert (corpus["last_right"], corpus["single/last_right"], corpus["subset_multi/last_right"]) == (1.0, 0.0, 1.0)
    logged = OrderingMetrics(sync_on_compute=False)
    logged.update([pred], [refs])
    assert {k: float(v) for k, v in logged.compute().items()} == corpus
    # the per-category report (markdown, JSON) and the W&B category table
    records = [{"id": "a", "category": ["x"], "pred": pred, "references": refs},
               {"id": "b", "category": ["y"], "pred": [1, 0], "references": [[0, 1]]}]
    table = per_category(records)
    assert [table[c]["last_right"] for c in ("x", "y", "all")] == [1.0, 0.0, 0.5]
    assert markdown_table(table).splitlines()[0] == f"| category | n | {' | '.join(order_keys())} |"
    logged_tables = []
    fake_wandb = types.SimpleNamespace(Table=lambda columns, data: (columns, data), Image=lambda path: path)
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    WandbLogger = type("WandbLogger", (), {"experiment": types.SimpleNamespace(log=logged_tables.append)})
    module = types.SimpleNamespace(test_predictions=records, hparams={"modality": "text"})
    CategoryReport(str(tmp_path)).on_test_end(types.SimpleNamespace(is_global_zero=True, loggers=[WandbLogger()]), module)
    columns, rows = logged_tables[0]["test/category_table"]
    assert columns == ["category", "n", *order_keys()] and rows[0] == ["x", 1, *(table["x"][k] for k in order_keys())]
    assert json.loads((tmp_path / "category_report.json").read_text())["all"]["last_right"] == 0.5
    # scripts/tools/score_predictions.py: a column of its own, and its help says the joint rule ranks on it
    path = tmp_path / "predictions_test.jsonl"
    path.write_text(json.dumps({"pred": pred, "references": refs}) + "\n")
    script = Path(__file__).resolve().parents[1] / "scripts" / "tools" / "score_predictions.py"
    monkeypatch.setattr(sys, "argv", [str(script), str(path)])
    runpy.run_path(str(script), run_name="__main__")
    header, _, row = capsys.readouterr().out.strip().splitlines()
    assert header == f"| system | {' | '.join(order_keys())} | single/pmr | single/tau |"
    assert float(row.split("|")[2 + order_keys().index("last_right")]) == 1.0
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(script), run_name="__main__")
    assert "joint ranks on pmr, acc, tau, lcs, lcstr, -dist, last_right;" in " ".join(capsys.readouterr().out.split())


def test_a_metric_name_or_selection_place_taken_twice_is_refused_naming_it(monkeypatch):
    from seqaware.metrics import ordering

    acc = SEQUENCING_METRICS[order_keys().index("acc")]
    monkeypatch.setattr(ordering, "SEQUENCING_METRICS", [*SEQUENCING_METRICS, ordering.OrderMetric("acc", acc.score)])
    with pytest.raises(ValueError) as err:
        order_metrics([0, 1], [0, 1])
    assert str(err.value) == "SEQUENCING_METRICS names ['acc'] more than once"
    monkeypatch.setattr(ordering, "SEQUENCING_METRICS",
                        [*SEQUENCING_METRICS, ordering.OrderMetric("toy", acc.score, selection=acc.selection)])
    with pytest.raises(ValueError) as err:
        select_reference([0, 1], [[0, 1]])
    assert str(err.value) == (f"SEQUENCING_METRICS: several metrics take the joint selection places [{acc.selection}]: "
                              "['acc', 'toy']")
