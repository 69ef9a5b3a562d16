"""TEO / ISO / COHERENCE / yes-no metrics against sklearn and scipy, plus hand-computed cases."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau
from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support

from data_modules.tasks import coherence_instances, teo_eval_sets
from seqaware.metrics.coherence import (
    coherence_baselines, coherence_report, coherence_rows, coherence_scores, coherence_table, kendall_tau,
)
from seqaware.metrics.iso import (
    binary_baselines, binary_report, binary_table, iso_baselines, iso_report, iso_rows, iso_table,
)
from seqaware.metrics.teo import teo_baselines, teo_report, teo_rows, teo_table
from seqaware.procedure import Procedure, Step


def _procedure(pid: str, n: int, dag=None) -> Procedure:
    return Procedure(id=pid, steps=[Step(text=f"{pid} {i}", images=[f"images/{pid}_{i}.jpg"]) for i in range(n)], dag=dag)


def _random_dag_procedures(rng, count: int) -> list[Procedure]:
    procs = []
    for k in range(count):
        n = int(rng.integers(3, 8))
        edges = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.3]
        procs.append(_procedure(f"r{k}", n, dag=edges))
    return procs


def test_seqaware_metrics_do_not_import_sklearn():
    """seqaware.metrics may use numpy/scipy/torch only; sklearn is for tests (static check, fast)."""
    import ast
    from pathlib import Path

    import seqaware.metrics

    for path in sorted(Path(seqaware.metrics.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] == "sklearn" for n in names), f"{path.name} imports sklearn"


# ---------------------------------------------------------------- ISO and yes/no
@pytest.mark.parametrize("seed", range(5))
def test_iso_report_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    gold = list(rng.choice(["DEP", "NONDEP"], size=60))
    pred = list(rng.choice(["DEP", "NONDEP", "other"], size=60, p=[0.45, 0.45, 0.1]))
    report = iso_report(gold, pred)
    p, r, f, s = precision_recall_fscore_support(gold, pred, labels=["DEP", "NONDEP"], zero_division=0)
    for k, label in enumerate(["DEP", "NONDEP"]):
        assert report[f"precision_{label}"] == pytest.approx(p[k])
        assert report[f"recall_{label}"] == pytest.approx(r[k])
        assert report[f"f1_{label}"] == pytest.approx(f[k])
        assert report[f"support_{label}"] == s[k]
    assert report["macro_f1"] == pytest.approx(f1_score(gold, pred, labels=["DEP", "NONDEP"], average="macro", zero_division=0))
    assert report["accuracy"] == pytest.approx(accuracy_score(gold, pred))
    assert report["invalid_rate"] == pytest.approx(pred.count("other") / 60)
    ids = [f"i{k}" for k in range(60)]
    assert iso_report(dict(zip(ids, gold)), dict(zip(ids, pred))) == report


def test_iso_baselines_and_table():
    gold = ["DEP"] * 3 + ["NONDEP"] * 5
    rows = iso_rows(gold, {"model": ["DEP"] * 8})
    assert list(rows)[:4] == ["always DEP", "always NONDEP", "majority (NONDEP)", "random"]
    assert rows["always NONDEP"]["accuracy"] == pytest.approx(5 / 8)
    assert rows["always DEP"]["recall_DEP"] == 1.0 and rows["always DEP"]["f1_NONDEP"] == 0.0
    assert rows["model"] == rows["always DEP"]
    assert iso_baselines(gold, seed=1)["random"] == iso_baselines(gold, seed=1)["random"]
    table = iso_table(rows)
    assert "| always DEP |" in table and "| model |" in table and "62.5" in table


@pytest.mark.parametrize("seed", range(3))
def test_binary_report_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    gold = list(rng.choice(["yes", "no"], size=50, p=[0.3, 0.7]))
    pred = list(rng.choice(["yes", "no", "unsure"], size=50))
    report = binary_report(gold, pred)
    assert report["f1"] == pytest.approx(f1_score(gold, pred, labels=["yes"], average="macro", zero_division=0))
    assert report["f1_no"] == pytest.approx(f1_score(gold, pred, labels=["no"], average="macro", zero_division=0))
    assert report["accuracy"] == pytest.approx(accuracy_score(gold, pred))
    rows = binary_baselines(gold)
    assert set(rows) == {"always yes", "always no", "majority (no)"}
    assert rows["always yes"]["recall"] == 1.0
    assert "majority (no)" in binary_table(rows)


# ---------------------------------------------------------------- TEO
def test_teo_consistency_hand_example():
    procs = [_procedure("p", 3, dag=[(0, 1), (0, 2)]), _procedure("q", 3, dag=[(0, 2)])]
    sets = teo_eval_sets(procs)
    original, swapped = sets["original"], sets["swapped"]
    # p: (0,1) before, (0,2) before, (1,2) independent; q: (0,1) indep, (0,2) before, (1,2) indep
    assert [(p["procedure_id"], p["a"], p["b"], p["label"]) for p in original] == [
        ("p", 0, 1, "before"), ("p", 0, 2, "before"), ("p", 1, 2, "independent"),
        ("q", 0, 1, "independent"), ("q", 0, 2, "before"), ("q", 1, 2, "independent")]
    orig_pred = {"p:0-1": "before", "p:0-2": "before", "p:1-2": "independent",
                 "q:0-1": "independent", "q:0-2": "after", "q:1-2": "Independent "}
    swap_pred = {"p:0-1:swapped": "after", "p:0-2:swapped": "before", "p:1-2:swapped": "independent",
                 "q:0-1:swapped": "no idea", "q:0-2:swapped": "after"}  # q:1-2:swapped missing -> other
    report = teo_report(original, swapped, orig_pred, swap_pred)
    # consistent: p:0-1 (dep), p:1-2 (indep); inconsistent: p:0-2, q:0-2 (dep), q:0-1, q:1-2 (indep)
    assert report["consistency_accuracy"] == pytest.approx(2 / 6)
    assert report["consistency_dependent"] == pytest.approx(1 / 3)
    assert report["consistency_independent"] == pytest.approx(1 / 3)
    assert report["other_rate"] == pytest.approx(2 / 12)
    # before on original: tp=2, predicted before=2, gold before=3 -> F1 = 4/5
    assert report["f1_before"] == pytest.approx(0.8)
    # after on swapped: tp=2 (p:0-1, q:0-2), predicted after=2, gold after=3 -> 4/5
    assert report["f1_after"] == pytest.approx(0.8)
    # independent on both: tp=4 (orig p:1-2, q:0-1, q:1-2; swapped p:1-2), predicted=4, gold=6 -> 0.8
    assert report["f1_independent"] == pytest.approx(0.8)
    assert report["macro_f1"] == pytest.approx(0.8)
    # MATEO Table 4: before / independent on the original order, after on the swapped order.
    # independent on original: tp=3 (p:1-2, q:0-1, q:1-2), predicted=3, gold=3 -> 1.0 (pooled: 0.8)
    assert report["mateo_f1_before"] == pytest.approx(0.8)
    assert report["mateo_f1_independent"] == pytest.approx(1.0)
    assert report["mateo_f1_after"] == pytest.approx(0.8)
    with pytest.raises(ValueError):
        teo_report(original, swapped[:-1], orig_pred, swap_pred)


@pytest.mark.parametrize("seed", range(4))
def test_teo_f1_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    sets = teo_eval_sets(_random_dag_procedures(rng, 8))
    original, swapped = sets["original"], sets["swapped"]
    labels = ["before", "after", "independent", "other"]
    orig_pred = {p["pair_id"]: str(rng.choice(labels)) for p in original}
    swap_pred = {p["pair_id"]: str(rng.choice(labels)) for p in swapped}
    report = teo_report(original, swapped, orig_pred, swap_pred)
    go, po = [p["label"] for p in original], [orig_pred[p["pair_id"]] for p in original]
    gs, ps = [p["label"] for p in swapped], [swap_pred[p["pair_id"]] for p in swapped]

    def f1(g, p, label):
        return f1_score(g, p, labels=[label], average=None, zero_division=0)[0]

    assert report["f1_before"] == pytest.approx(f1(go, po, "before"))
    assert report["f1_after"] == pytest.approx(f1(gs, ps, "after"))
    assert report["f1_independent"] == pytest.approx(f1(go + gs, po + ps, "independent"))
    assert report["mateo_f1_before"] == pytest.approx(f1(go, po, "before"))
    assert report["mateo_f1_independent"] == pytest.approx(f1(go, po, "independent"))
    assert report["mateo_f1_after"] == pytest.approx(f1(gs, ps, "after"))
    expected = np.mean([
        (po[i] == "before" and ps[i] == "after") if go[i] == "before" else (po[i] == ps[i] == "independent")
        for i in range(len(original))
    ])
    assert report["consistency_accuracy"] == pytest.approx(expected)
    assert report["other_rate"] == pytest.approx((po + ps).count("other") / (2 * len(po)))


def test_teo_baselines_rows_and_table():
    sets = teo_eval_sets(_random_dag_procedures(np.random.default_rng(0), 6))
    original, swapped = sets["original"], sets["swapped"]
    base = teo_baselines(original, swapped, seed=0)
    assert set(base) == {"always independent", "majority", "random"}
    always = base["always independent"]
    assert always["consistency_independent"] == 1.0 and always["consistency_dependent"] == 0.0
    assert always["f1_before"] == always["f1_after"] == 0.0
    gold = ({p["pair_id"]: p["label"] for p in original}, {p["pair_id"]: p["label"] for p in swapped})
    rows = teo_rows(original, swapped, {"oracle": gold})
    assert list(rows) == ["always independent", "majority", "random", "oracle"]
    assert rows["oracle"]["consistency_accuracy"] == 1.0 and rows["oracle"]["macro_f1"] == 1.0
    table = teo_table(rows)
    assert table.count("\n") == 1 + len(rows)
    assert "| oracle | 100.0 |" in table


def _fixed_teo_sets():
    """One procedure r with 4 steps and edges 0->1, 2->3: pairs 0-1 and 2-3 before, the other four
    independent (original order); swapped: 0-1 and 2-3 after, the others independent."""
    sets = teo_eval_sets([_procedure("r", 4, dag=[(0, 1), (2, 3)])])
    assert [(p["pair_id"], p["label"]) for p in sets["original"]] == [
        ("r:0-1", "before"), ("r:0-2", "independent"), ("r:0-3", "independent"), ("r:1-2", "independent"),
        ("r:1-3", "independent"), ("r:2-3", "before")]
    return sets["original"], sets["swapped"]


def test_teo_mateo_f1_on_a_fixed_set_against_sklearn_and_by_hand():
    original, swapped = _fixed_teo_sets()
    pred_o = ["before", "independent", "before", "other", "independent", "independent"]
    pred_s = ["after", "independent", "independent", "after", "independent", "before"]
    report = teo_report(original, swapped, {p["pair_id"]: y for p, y in zip(original, pred_o)},
                        {p["pair_id"]: y for p, y in zip(swapped, pred_s)})
    gold_o, gold_s = [p["label"] for p in original], [p["label"] for p in swapped]

    def sk(gold, pred, label):
        return f1_score(gold, pred, labels=[label], average=None, zero_division=0)[0]

    assert report["mateo_f1_before"] == pytest.approx(sk(gold_o, pred_o, "before"))
    assert report["mateo_f1_independent"] == pytest.approx(sk(gold_o, pred_o, "independent"))
    assert report["mateo_f1_after"] == pytest.approx(sk(gold_s, pred_s, "after"))
    assert report["f1_independent"] == pytest.approx(sk(gold_o + gold_s, pred_o + pred_s, "independent"))
    # by hand. original: before tp=1 (0-1), predicted 2 (0-1, 0-3), gold 2 -> 2/4;
    # independent tp=2 (0-2, 1-3), predicted 3 (+2-3), gold 4 -> 4/7.
    # swapped: after tp=1 (0-1), predicted 2 (+1-2), gold 2 -> 2/4; independent tp=3, predicted 3, gold 4.
    # pooled independent: tp=5, predicted 6, gold 8 -> 10/14.
    assert report["mateo_f1_before"] == pytest.approx(0.5)
    assert report["mateo_f1_independent"] == pytest.approx(4 / 7)
    assert report["mateo_f1_after"] == pytest.approx(0.5)
    assert report["f1_independent"] == pytest.approx(5 / 7)
    assert report["macro_f1"] == pytest.approx((0.5 + 0.5 + 5 / 7) / 3)
    # consistency (Table 3): dependent 0-1 yes, 2-3 no; independent 0-2, 1-3 yes, 0-3, 1-2 no -> 3/6
    assert report["consistency_accuracy"] == pytest.approx(0.5)
    assert report["consistency_dependent"] == report["consistency_independent"] == pytest.approx(0.5)
    assert report["other_rate"] == pytest.approx(1 / 12)


def test_teo_random_and_majority_baselines_by_hand():
    original, swapped = _fixed_teo_sets()
    base = teo_baselines(original, swapped, seed=0)
    # numpy.random.default_rng(0).integers(3, size=12) = 2 1 1 0 0 0 | 0 0 0 2 1 2 over (before, after, independent):
    # original preds: independent after after before before before; swapped: before before before independent after independent
    rand = base["random"]
    # original: before tp=1 (2-3), predicted 3, gold 2 -> 2/5; independent tp=0 (0-1 is before) -> 0
    assert rand["mateo_f1_before"] == rand["f1_before"] == pytest.approx(0.4)
    assert rand["mateo_f1_independent"] == 0.0
    # swapped: after predicted only for 1-3 (gold independent) -> tp=0 -> 0
    assert rand["mateo_f1_after"] == rand["f1_after"] == 0.0
    # pooled independent: tp=1 (1-2 swapped), predicted 3, gold 8 -> 2/11
    assert rand["f1_independent"] == pytest.approx(2 / 11)
    assert rand["macro_f1"] == pytest.approx((0.4 + 0.0 + 2 / 11) / 3)
    assert rand["consistency_accuracy"] == 0.0 and rand["other_rate"] == 0.0
    assert rand["accuracy_original"] == pytest.approx(1 / 6) and rand["accuracy_swapped"] == pytest.approx(1 / 6)
    assert teo_baselines(original, swapped, seed=1)["random"]["f1_independent"] != pytest.approx(2 / 11)
    # majority: 4 of 6 gold labels are independent in each set -> always independent
    majority = base["majority"]
    assert majority["consistency_independent"] == 1.0 and majority["consistency_dependent"] == 0.0
    assert majority["consistency_accuracy"] == pytest.approx(4 / 6)
    assert majority["mateo_f1_independent"] == pytest.approx(2 * 4 / (6 + 4))  # tp 4, predicted 6, gold 4
    assert majority["mateo_f1_before"] == majority["mateo_f1_after"] == 0.0


# ---------------------------------------------------------------- COHERENCE
@pytest.mark.parametrize("seed", range(5))
def test_kendall_tau_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    for n in (2, 3, 5, 9):
        x, y = rng.permutation(n), rng.permutation(n)
        assert kendall_tau(x, y) == pytest.approx(kendalltau(x, y).statistic)


def test_coherence_partial_score_matches_scipy_rankings():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, m = int(rng.integers(2, 7)), int(rng.integers(0, 3))
        perm = [int(c) for c in rng.permutation(n + m)]
        inst = {"instance_id": "x", "candidates": [f"c{i}" for i in range(n + m)], "gold": perm[:n], "distractors": sorted(perm[n:])}
        pred = [int(c) for c in rng.choice(n + m, size=n, replace=False)]
        score = coherence_scores(inst, pred)
        # rankings of the gold images that the prediction placed
        common = [c for c in inst["gold"] if c in pred]
        if len(common) >= 2:
            tau = kendalltau([inst["gold"].index(c) for c in common], [pred.index(c) for c in common]).statistic
            assert score["partial"] == pytest.approx((tau + 1) / 2)
        else:
            assert score["partial"] == 0.0
        assert score["exact"] == float(pred == inst["gold"])


def test_coherence_hand_values_and_invalid():
    inst = {"instance_id": "x", "candidates": ["a", "b", "c", "d", "e"], "gold": [2, 0, 4], "distractors": [1, 3]}
    assert coherence_scores(inst, [2, 0, 4]) == {"valid": True, "exact": 1.0, "partial": 1.0, "reject": 1.0}
    assert coherence_scores(inst, [4, 0, 2])["partial"] == 0.0            # reversed
    swapped_first = coherence_scores(inst, [0, 2, 4])                      # tau = 1/3
    assert swapped_first["partial"] == pytest.approx(2 / 3)
    with_distractor = coherence_scores(inst, [2, 1, 4])
    assert with_distractor["reject"] == 0.5 and with_distractor["partial"] == 1.0
    for bad in (None, [2, 0], [2, 2, 4], [2, 0, 5], [2, 0, "4"], "204"):
        assert coherence_scores(inst, bad) == {"valid": False, "exact": 0.0, "partial": 0.0, "reject": 0.0}
    report = coherence_report([inst], {"x": [2, 0, 4]})
    assert report["exact_match"] == 1.0 and report["invalid_rate"] == 0.0 and report["reject_accuracy"] == 1.0
    assert coherence_report([inst], {})["invalid_rate"] == 1.0


def test_coherence_report_and_baselines():
    procs = [_procedure(f"p{k}", n) for k, n in enumerate([2, 3, 4, 5, 6, 7])]
    instances = coherence_instances(procs, num_distractors=2, seed=0)
    gold = {i["instance_id"]: i["gold"] for i in instances}
    rows = coherence_rows(instances, {"oracle": gold})
    assert list(rows) == ["random", "identity", "oracle"]
    oracle = rows["oracle"]
    assert oracle["exact_match"] == oracle["partial_score"] == oracle["reject_accuracy"] == 1.0
    assert set(oracle["by_difficulty"]) == {"easy", "medium", "hard"}
    assert oracle["by_difficulty"]["easy"]["n"] == 2
    assert coherence_baselines(instances, seed=3) == coherence_baselines(instances, seed=3)
    assert rows["random"]["invalid_rate"] == 0.0
    assert "| identity |" in coherence_table(rows)
    no_distractors = coherence_report(coherence_instances(procs), [None] * len(procs))
    assert no_distractors["reject_accuracy"] is None and no_distractors["invalid_rate"] == 1.0
