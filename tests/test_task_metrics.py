"""TEO / ISO / COHERENCE / yes-no metrics against sklearn and scipy, plus hand-computed cases."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau
from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support

from data_modules.tasks import coherence_instances, teo_eval_sets
from seqaware.metrics.coherence import (
    coherence_baselines, coherence_report, coherence_rows, coherence_scores, coherence_source_table, coherence_table,
    kendall_tau,
)
from seqaware.metrics.classification import (align_labels, binary_baselines, binary_report, binary_table, choose_threshold,
                                             initial_threshold, majority_label, twin_consistency)
from seqaware.metrics.iso import (implied_nondep_recall, iso_baselines, iso_report, iso_rows, iso_table,
                                  unparsable_consistency)
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
LABELS = ["DEP", "NONDEP"]


@pytest.mark.parametrize("seed", range(5))
def test_iso_report_matches_sklearn(seed):
    """Default (ISO-Bench App. H): sklearn on the parsed subset; ``wrong``: sklearn on everything."""
    rng = np.random.default_rng(seed)
    gold = list(rng.choice(LABELS, size=60))
    pred = list(rng.choice(["DEP", "NONDEP", "other"], size=60, p=[0.45, 0.45, 0.1]))
    keep = [k for k in range(60) if pred[k] != "other"]
    for mode, g, q in (("exclude", [gold[k] for k in keep], [pred[k] for k in keep]), ("wrong", gold, pred)):
        report = iso_report(gold, pred, unparsable=mode)
        p, r, f, s = precision_recall_fscore_support(g, q, labels=LABELS, zero_division=0)
        for k, label in enumerate(LABELS):
            assert report[f"precision_{label}"] == pytest.approx(p[k])
            assert report[f"recall_{label}"] == pytest.approx(r[k])
            assert report[f"f1_{label}"] == pytest.approx(f[k])
            assert report[f"support_{label}"] == s[k]
        for avg in ("macro", "weighted"):
            ps, rs, fs, _ = precision_recall_fscore_support(g, q, labels=LABELS, average=avg, zero_division=0)
            assert (report[f"{avg}_precision"], report[f"{avg}_recall"], report[f"{avg}_f1"]) == pytest.approx((ps, rs, fs))
        assert report["accuracy"] == pytest.approx(accuracy_score(g, q))
        assert report["n"] == 60 and report["n_scored"] == len(g)
        assert report["num_unparsable"] == pred.count("other") == 60 - len(keep)
        assert report["invalid_rate"] == pytest.approx(pred.count("other") / 60)
    ids = [f"i{k}" for k in range(60)]
    assert iso_report(dict(zip(ids, gold)), dict(zip(ids, pred))) == iso_report(gold, pred)


def test_iso_report_hand_values_unparsable_and_bad_input():
    gold = ["DEP", "DEP", "DEP", "NONDEP", "NONDEP", "NONDEP"]
    pred = ["DEP", "other", "NONDEP", "NONDEP", None, "DEP"]
    paper = iso_report(gold, pred)
    # scored: (DEP,DEP) (DEP,NONDEP) (NONDEP,NONDEP) (NONDEP,DEP): each class tp 1, predicted 2, support 2
    assert paper["accuracy"] == 0.5 and paper["n_scored"] == 4 and paper["num_unparsable"] == 2
    assert paper["invalid_rate"] == pytest.approx(1 / 3) and paper["n"] == 6
    assert paper["precision_DEP"] == paper["recall_DEP"] == paper["f1_NONDEP"] == paper["macro_f1"] == 0.5
    strict = iso_report(gold, pred, unparsable="wrong")
    # all 6: each class tp 1, predicted 2, support 3 -> P 1/2, R 1/3, F1 2*1/(2+3) = 0.4
    assert strict["accuracy"] == pytest.approx(2 / 6) and strict["n_scored"] == 6
    assert strict["precision_DEP"] == 0.5 and strict["recall_NONDEP"] == pytest.approx(1 / 3)
    assert strict["f1_DEP"] == strict["macro_f1"] == pytest.approx(0.4)
    # unequal supports: DEP P 1 R 2/3 F 0.8 (support 3); NONDEP P 1/2 R 1 F 2/3 (support 1)
    uneven = iso_report(["DEP", "DEP", "DEP", "NONDEP"], ["DEP", "DEP", "NONDEP", "NONDEP"])
    assert uneven["macro_f1"] == pytest.approx((0.8 + 2 / 3) / 2)
    assert uneven["weighted_f1"] == pytest.approx((3 * 0.8 + 1 * 2 / 3) / 4)
    assert uneven["weighted_recall"] == pytest.approx(uneven["accuracy"]) == 0.75
    # boundary: nothing parsable -> nothing scored, every score 0
    none = iso_report(["DEP", "NONDEP"], ["other", "other"])
    assert none["n_scored"] == 0 and none["accuracy"] == 0.0 and none["macro_f1"] == 0.0 and none["invalid_rate"] == 1.0
    with pytest.raises(ValueError, match="exclude, wrong"):
        iso_report(gold, pred, unparsable="drop")
    with pytest.raises(ValueError, match="DEP or NONDEP"):
        iso_report(["yes", "DEP"], ["DEP", "DEP"])
    with pytest.raises(ValueError, match="differ in length"):
        iso_report(gold, pred[:-1])


def test_iso_baselines_and_table():
    gold = ["DEP"] * 3 + ["NONDEP"] * 5
    rows = iso_rows(gold, {"model": ["DEP"] * 8})
    assert list(rows)[:4] == ["always DEP", "always NONDEP", "majority (NONDEP)", "random"]
    assert rows["always NONDEP"]["accuracy"] == pytest.approx(5 / 8)
    assert rows["always DEP"]["recall_DEP"] == 1.0 and rows["always DEP"]["f1_NONDEP"] == 0.0
    assert rows["model"] == rows["always DEP"]
    # seed 1 draws (numpy PCG64) DEP NONDEP NONDEP NONDEP DEP DEP NONDEP NONDEP against DEP x3, NONDEP x5:
    # right at 0, 3, 6, 7 -> accuracy 1/2; DEP tp 1 of 3 predicted, 3 gold -> 1/3; NONDEP tp 3 of 5, 5 -> 3/5
    random = iso_baselines(gold, seed=1)["random"]
    assert random["accuracy"] == 0.5
    assert (random["precision_DEP"], random["recall_DEP"], random["f1_DEP"]) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert (random["precision_NONDEP"], random["recall_NONDEP"], random["f1_NONDEP"]) == pytest.approx((0.6, 0.6, 0.6))
    assert random["macro_f1"] == pytest.approx((1 / 3 + 0.6) / 2) and random["num_unparsable"] == 0
    table = iso_table(rows)
    assert "| always DEP |" in table and "| model |" in table and "62.5" in table
    assert table.splitlines()[0].endswith("| macro P | macro R | macro F1 | unparsable |")


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


@pytest.mark.parametrize("seed", range(3))
def test_weighted_binary_report_matches_sklearn_sample_weights_and_repetition(seed):
    """Weights are sklearn's sample_weight; integer weights equal repeating the items; share_weights moves the
    weighted share of "yes" to the one asked for."""
    from sklearn.metrics import precision_recall_fscore_support

    from seqaware.metrics.classification import share_weights

    rng = np.random.default_rng(seed)
    gold = list(rng.choice(["yes", "no"], size=60, p=[0.6, 0.4]))
    pred = list(rng.choice(["yes", "no", "unsure"], size=60, p=[0.5, 0.4, 0.1]))
    weights = list(rng.integers(1, 4, size=60))
    report = binary_report(gold, pred, weights=weights)
    p, r, f, _ = precision_recall_fscore_support(gold, pred, labels=["yes", "no"], sample_weight=weights, zero_division=0)
    assert (report["precision"], report["recall"], report["f1"], report["f1_no"]) == pytest.approx((p[0], r[0], f[0], f[1]))
    assert report["macro_f1"] == pytest.approx(f.mean())
    assert report["accuracy"] == pytest.approx(accuracy_score(gold, pred, sample_weight=weights))
    repeated = binary_report([g for g, w in zip(gold, weights) for _ in range(w)], [x for x, w in zip(pred, weights) for _ in range(w)])
    assert {k: v for k, v in report.items() if k != "n"} == pytest.approx({k: v for k, v in repeated.items() if k != "n"})
    shares = share_weights(gold, 0.459)
    assert sum(w for g, w in zip(gold, shares) if g == "yes") / sum(shares) == pytest.approx(0.459)
    assert sum(shares) == pytest.approx(len(gold))
    with pytest.raises(ValueError, match=r"must be in \(0, 1\)"):
        share_weights(gold, 1.0)
    with pytest.raises(ValueError, match="needs both 'yes' and other gold labels"):
        share_weights(["yes", "yes"], 0.5)


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
    # the seed defaults to 0
    assert teo_baselines(original, swapped)["random"]["f1_independent"] == pytest.approx(2 / 11)
    assert teo_rows(original, swapped, {})["random"]["f1_independent"] == pytest.approx(2 / 11)
    # majority: 4 of 6 gold labels are independent in each set -> always independent
    majority = base["majority"]
    assert majority["consistency_independent"] == 1.0 and majority["consistency_dependent"] == 0.0
    assert majority["consistency_accuracy"] == pytest.approx(4 / 6)
    assert majority["mateo_f1_independent"] == pytest.approx(2 * 4 / (6 + 4))  # tp 4, predicted 6, gold 4
    assert majority["mateo_f1_before"] == majority["mateo_f1_after"] == 0.0


def test_teo_majority_baseline_is_chosen_per_set_with_ties_to_before_after():
    """Edges 0->1, 0->3, 2->3: each set holds 3 dependent and 3 independent pairs, a tie that goes to
    the label listed first. The original set's majority is "before", the swapped set's "after" (its
    dependent pairs are "after"): predicting the original's majority on the swapped set would score
    0 consistency."""
    sets = teo_eval_sets([_procedure("q", 4, dag=[(0, 1), (0, 3), (2, 3)])])
    original, swapped = sets["original"], sets["swapped"]
    assert sorted(p["label"] for p in original) == ["before"] * 3 + ["independent"] * 3
    assert sorted(p["label"] for p in swapped) == ["after"] * 3 + ["independent"] * 3
    majority = teo_baselines(original, swapped, seed=0)["majority"]
    assert majority["accuracy_original"] == majority["accuracy_swapped"] == 0.5
    assert majority["consistency_dependent"] == 1.0 and majority["consistency_independent"] == 0.0
    assert majority["consistency_accuracy"] == 0.5
    # before: tp 3, predicted 6, gold 3 -> 6/9; after likewise on the swapped set; independent never predicted
    assert majority["mateo_f1_before"] == majority["mateo_f1_after"] == pytest.approx(2 / 3)
    assert majority["f1_independent"] == 0.0


# ---------------------------------------------------------------- COHERENCE
@pytest.mark.parametrize("seed", range(5))
def test_kendall_tau_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    for n in (2, 3, 5, 9):
        x, y = rng.permutation(n), rng.permutation(n)
        assert kendall_tau(x, y) == pytest.approx(kendalltau(x, y).statistic)


def test_coherence_partial_score_matches_scipy():
    """§4.1: PM = (tau(pred, gold) + 1) / 2 over the placeholder lists = scipy's kendalltau of the two lists."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        n, m = int(rng.integers(2, 8)), int(rng.integers(0, 4))
        perm = [int(c) for c in rng.permutation(n + m)]
        inst = {"instance_id": "x", "candidates": [f"c{i}" for i in range(n + m)], "gold": perm[:n], "distractors": sorted(perm[n:])}
        pred = [int(c) for c in rng.choice(n + m, size=n, replace=False)]
        score = coherence_scores(inst, pred)
        assert score["partial"] == pytest.approx((kendalltau(pred, inst["gold"]).statistic + 1) / 2)
        # the placement variant: the order in which the gold images are placed
        common = [c for c in inst["gold"] if c in pred]
        if len(common) >= 2:
            tau = kendalltau([inst["gold"].index(c) for c in common], [pred.index(c) for c in common]).statistic
            assert score["partial_placement"] == pytest.approx((tau + 1) / 2)
        assert score["exact"] == float(pred == inst["gold"])
        if m:
            assert score["reject"] == float(not set(pred) & set(inst["distractors"]))


def test_coherence_hand_values_and_invalid():
    # App. F error case 4: ground truth [1, 0, 4, 3, 5, 2], model [1, 0, 4, 3, 2, 5] (last two swapped).
    # Discordant placeholder pairs: (4, 5); (2, 4) and (2, 5) (value 4 vs 5 / 2); (3, 4) and (3, 5) (value 3):
    # 5 of 15 -> tau = (10 - 5) / 15 = 1/3 -> PM 2/3. Placement order: one swap of 15 -> tau 13/15 -> 14/15.
    case = {"instance_id": "f", "candidates": list("abcdef"), "gold": [1, 0, 4, 3, 5, 2], "distractors": []}
    score = coherence_scores(case, [1, 0, 4, 3, 2, 5])
    assert score["partial"] == pytest.approx(2 / 3) and score["partial_placement"] == pytest.approx(14 / 15)
    assert score["exact"] == 0.0 and score["reject"] is None

    inst = {"instance_id": "x", "candidates": ["a", "b", "c", "d", "e"], "gold": [2, 0, 4], "distractors": [1, 3]}
    assert coherence_scores(inst, [2, 0, 4]) == {"valid": True, "parsed": True, "exact": 1.0, "partial": 1.0,
                                                 "partial_placement": 1.0, "reject": 1.0, "reject_fraction": 1.0}
    # [4, 0, 2] vs [2, 0, 4]: pairs (0,1) concordant, (0,2) discordant, (1,2) concordant -> tau 1/3;
    # placement: images placed in gold order 2, 1, 0 -> reversed -> 0
    reversed_ = coherence_scores(inst, [4, 0, 2])
    assert reversed_["partial"] == pytest.approx(2 / 3) and reversed_["partial_placement"] == 0.0
    swapped_first = coherence_scores(inst, [0, 2, 4])                      # tau 1/3 both ways
    assert swapped_first["partial"] == pytest.approx(2 / 3) and swapped_first["partial_placement"] == pytest.approx(2 / 3)
    # distractor 1 at placeholder 2: the lists [2, 1, 4] and [2, 0, 4] are fully concordant -> PM 1,
    # not an exact match, and not every distractor is rejected (App. E Reject is all-or-nothing)
    with_distractor = coherence_scores(inst, [2, 1, 4])
    assert with_distractor["partial"] == 1.0 and with_distractor["exact"] == 0.0
    assert with_distractor["reject"] == 0.0 and with_distractor["reject_fraction"] == 0.5
    # one placeholder: C(1, 2) = 0 pairs -> PM = exact match
    single = {"instance_id": "s", "candidates": ["a", "b"], "gold": [1], "distractors": [0]}
    assert coherence_scores(single, [1])["partial"] == 1.0 and coherence_scores(single, [0])["partial"] == 0.0
    for bad in (None, [2, 0], [2, 2, 4], [2, 0, 5], [-1, 0, 4], [2, 0, "4"], [True, 0, 4], "204"):
        assert coherence_scores(inst, bad) == {"valid": False, "parsed": bad is not None, "exact": 0.0, "partial": 0.0,
                                               "partial_placement": 0.0, "reject": 0.0, "reject_fraction": 0.0}
    report = coherence_report([inst], {"x": [2, 0, 4]})
    assert report["exact_match"] == 1.0 and report["invalid_rate"] == 0.0 and report["reject_accuracy"] == 1.0
    missing = coherence_report([inst], {})
    assert missing["invalid_rate"] == missing["unparsable_rate"] == 1.0
    with pytest.raises(ValueError, match="2 predictions for 1 instances"):
        coherence_report([inst], [[2, 0, 4], None])


def test_coherence_report_by_source_is_table1_layout():
    """Overall = mean over instances (as in Table 1), by_source in Table 1's domain order."""
    def inst(iid, source):
        out = {"instance_id": iid, "candidates": ["a", "b"], "gold": [0, 1], "distractors": [], "difficulty": "easy"}
        if source:
            out["source"] = source
        return out

    instances = [inst("w1", "WikiHow"), inst("w2", "WikiHow"), inst("w3", "WikiHow"), inst("s1", "Science"),
                 inst("x1", "Custom"), inst("n1", None)]
    preds = {"w1": [0, 1], "w2": [0, 1], "w3": [1, 0], "s1": [1, 0], "x1": [0, 1], "n1": [0, 1]}
    report = coherence_report(instances, preds)
    assert list(report["by_source"]) == ["WikiHow", "Science", "Custom"]        # Table 1 order, then others
    assert report["by_source"]["WikiHow"]["exact_match"] == pytest.approx(2 / 3)
    assert report["by_source"]["WikiHow"]["partial_score"] == pytest.approx(2 / 3)   # 1, 1, 0
    assert report["by_source"]["Science"]["exact_match"] == 0.0 and report["by_source"]["Custom"]["n"] == 1
    assert report["exact_match"] == pytest.approx(4 / 6) and report["n"] == 6     # over instances, not domains
    table = coherence_source_table({"model": report, "baseline": {"exact_match": 0.0, "partial_score": 0.5}})
    lines = table.splitlines()
    assert lines[0] == ("| system | WikiHow Exact | WikiHow Partial | Science Exact | Science Partial | Custom Exact | "
                        "Custom Partial | Overall Exact | Overall Partial |")
    assert lines[2] == "| model | 66.7 | 66.7 | 0.0 | 0.0 | 100.0 | 100.0 | 66.7 | 66.7 |"
    assert lines[3] == "| baseline | - | - | - | - | - | - | 0.0 | 50.0 |"
    assert coherence_source_table({"baseline": {"exact_match": 0.0}}) == ""


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
    assert rows["random"]["invalid_rate"] == 0.0
    assert "| identity |" in coherence_table(rows)
    no_distractors = coherence_report(coherence_instances(procs), [None] * len(procs))
    assert no_distractors["reject_accuracy"] is None and no_distractors["invalid_rate"] == 1.0


def test_coherence_baselines_hand_values():
    a = {"instance_id": "a", "candidates": ["c0", "c1", "c2", "c3"], "gold": [3, 1], "distractors": [0, 2]}
    b = {"instance_id": "b", "candidates": ["d0", "d1", "d2"], "gold": [2, 0, 1], "distractors": []}
    base = coherence_baselines([a, b], seed=3)
    # seed 3 (numpy PCG64) draws a -> [0, 2], b -> [0, 1, 2].
    # a: [0, 2] vs [3, 1] -> the one pair is discordant -> PM 0; both distractors used -> Reject 0.
    # b: [0, 1, 2] vs [2, 0, 1] -> pairs (0,1) disc, (0,2) disc, (1,2) conc -> tau -1/3 -> PM 1/3.
    random = base["random"]
    assert random["exact_match"] == 0.0 and random["partial_score"] == pytest.approx((0 + 1 / 3) / 2)
    assert random["reject_accuracy"] == 0.0 and random["reject_fraction"] == 0.0 and random["num_with_distractors"] == 1
    # identity: a -> [0, 1]: PM 0, distractor 0 used (Reject 0), distractor 2 unused (fraction 1/2); b as above
    identity = base["identity"]
    assert identity["exact_match"] == 0.0 and identity["partial_score"] == pytest.approx(1 / 6)
    assert identity["reject_accuracy"] == 0.0 and identity["reject_fraction"] == 0.5
    assert identity["invalid_rate"] == random["invalid_rate"] == 0.0


def test_iso_unparsable_rule_of_a_published_row_from_its_own_figures():
    """Gold 10 DEP / 10 NONDEP; replies to DEP: 6 DEP, 2 NONDEP, 2 unparsable; to NONDEP: 1 DEP, 7 NONDEP,
    2 unparsable. Excluded: P_DEP 6/7, R_DEP 6/8, P_NONDEP 7/9, R_NONDEP 7/8. Counted wrong: the same
    precisions, R_DEP 6/10, R_NONDEP 7/10. The printed (2-decimal) rows say which rule made them."""
    gold = ["DEP"] * 10 + ["NONDEP"] * 10
    pred = ["DEP"] * 6 + ["NONDEP"] * 2 + ["other"] * 2 + ["DEP"] + ["NONDEP"] * 7 + ["other"] * 2
    excluded, wrong = iso_report(gold, pred), iso_report(gold, pred, unparsable="wrong")
    assert (excluded["precision_DEP"], excluded["recall_DEP"], excluded["precision_NONDEP"], excluded["recall_NONDEP"]) \
        == pytest.approx((6 / 7, 6 / 8, 7 / 9, 7 / 8))
    assert (wrong["precision_DEP"], wrong["recall_DEP"], wrong["recall_NONDEP"]) == pytest.approx((6 / 7, 0.6, 0.7))
    assert implied_nondep_recall(6 / 7, 6 / 8, 7 / 9) == pytest.approx(7 / 8)  # the exact 2x2 table closes

    def printed(report):
        return ({"p": round(report["precision_DEP"], 2), "r": round(report["recall_DEP"], 2)},
                {"p": round(report["precision_NONDEP"], 2), "r": round(report["recall_NONDEP"], 2)})

    check = unparsable_consistency(*printed(excluded))
    assert check["exclude"] and check["wrong"]      # no unparsable reply is "wrong" with none to count
    lo, hi = check["implied_recall_NONDEP"]
    assert lo <= 7 / 8 <= hi and hi - lo < 0.05
    check = unparsable_consistency(*printed(wrong))
    assert not check["exclude"] and check["wrong"]
    # a NONDEP recall above what exclusion implies fits neither rule
    assert unparsable_consistency({"p": 0.86, "r": 0.75}, {"p": 0.78, "r": 0.95}) == {
        "exclude": False, "wrong": False, "implied_recall_NONDEP": pytest.approx(check["implied_recall_NONDEP"], abs=0.2)}


def test_majority_label_ties_go_to_the_label_listed_first():
    assert majority_label(["b", "a"], ("a", "b")) == "a" and majority_label(["b", "a"], ("b", "a")) == "b"
    assert majority_label(["a", "b", "b"], ("a", "b")) == "b"           # no tie: the count decides
    assert majority_label([], ("before", "after", "independent")) == "before"
    assert "majority (DEP)" in iso_baselines(["DEP", "NONDEP", "NONDEP", "DEP"])
    assert "majority (yes)" in binary_baselines(["no", "yes"])


def test_coherence_overall_is_over_instances_when_domains_differ_in_size():
    """Table 1's Overall weighs domains by their instances: 3 right WikiHow + 1 wrong Cooking = 3/4 (the
    mean of the two domain means would be 1/2)."""
    instances = [{"instance_id": f"i{k}", "candidates": ["a", "b"], "gold": [0, 1], "distractors": [],
                  "difficulty": "easy", "source": source} for k, source in enumerate(["WikiHow"] * 3 + ["Cooking"])]
    report = coherence_report(instances, [[0, 1], [0, 1], [0, 1], [1, 0]])
    assert report["exact_match"] == pytest.approx(3 / 4) and report["partial_score"] == pytest.approx(3 / 4)
    assert report["by_source"]["Cooking"]["exact_match"] == 0.0


def test_metric_inputs_are_checked_with_a_message():
    """Every input rule of the task metrics, its bad case."""
    with pytest.raises(ValueError, match="unparsable must be one of exclude, wrong, got 'drop'"):
        iso_report(["DEP"], ["DEP"], unparsable="drop")
    with pytest.raises(ValueError, match=r"gold labels must be DEP or NONDEP, got \['YES'\]"):
        iso_report(["DEP", "YES"], ["DEP", "DEP"])
    with pytest.raises(TypeError, match="pred must be a mapping"):
        align_labels({"a": "DEP"}, ["DEP"])
    with pytest.raises(ValueError, match="gold and pred differ in length: 2 vs 1"):
        align_labels(["DEP", "NONDEP"], ["DEP"])
    with pytest.raises(ValueError, match="keys and answers differ in length: 2 vs 1"):
        twin_consistency([1, 1], ["yes"])
    with pytest.raises(ValueError, match="gold and scores differ in length"):
        choose_threshold(["yes"], [0.1, 0.2])
    with pytest.raises(ValueError, match="at least one scored question"):
        choose_threshold([], [])
    original, swapped = _fixed_teo_sets()
    with pytest.raises(ValueError, match="same pairs, each once"):
        teo_report(original, swapped[:-1], {}, {})
    with pytest.raises(ValueError, match="same pairs, each once"):
        teo_report(original, [*swapped[:-1], swapped[0]], {}, {})
    stranger = teo_eval_sets([_procedure("z", 2, dag=[(0, 1)])])["swapped"][0]
    with pytest.raises(ValueError, match="has no swapped counterpart"):
        teo_report(original, [*swapped[:-1], stranger], {}, {})


def test_initial_threshold_takes_the_chooser_word_or_a_probability_and_names_the_key():
    """What ``model.threshold`` may hold (the plan head's ``val``, the closure head's ``cv``, or a
    fixed number strictly between 0 and 1) and the buffer value a head starts from."""
    assert initial_threshold("val", "val") == 0.5
    assert initial_threshold("cv", "cv") == 0.5
    assert initial_threshold(0.3, "val") == 0.3 and isinstance(initial_threshold(0.3, "val"), float)
    assert initial_threshold(0.999, "cv") == 0.999
    for bad in ("cv", 0, 1, 1.0, 0.0, -0.2, 1.5, True, None, "0.3"):
        with pytest.raises(ValueError, match=r"^model\.threshold must be 'val' or a number in \(0, 1\), got "):
            initial_threshold(bad, "val")
    with pytest.raises(ValueError, match=r"^head\.tau must be 'cv' or a number in \(0, 1\), got 'val'$"):
        initial_threshold("val", "cv", key="head.tau")


# ---------------------------------------------------------------- classification helpers, by hand and against sklearn
def test_per_class_prf_by_hand_with_absent_labels_and_weights():
    """gold a a b c, pred a b b x: a P 1 R 1/2; b P 1/2 R 1; c never predicted; d neither gold nor
    predicted -- every undefined ratio is 0.0. Weights 1 2 3 4 turn every count into a weighted sum."""
    from seqaware.metrics.classification import per_class_prf

    gold, pred = list("aabc"), list("abbx")
    assert per_class_prf(gold, pred, list("abcd")) == {
        "a": {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2},
        "b": {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3), "support": 1},
        "c": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        "d": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0},
    }
    # weighted: a tp 1, predicted 1, support 1 + 2; b tp 3, predicted 2 + 3, support 3; c support 4
    weighted = per_class_prf(gold, pred, list("abc"), weights=[1, 2, 3, 4])
    assert weighted == {
        "a": {"precision": 1.0, "recall": pytest.approx(1 / 3), "f1": 0.5, "support": 3},
        "b": {"precision": 0.6, "recall": 1.0, "f1": 0.75, "support": 3},
        "c": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 4},
    }
    p, r, f, s = precision_recall_fscore_support(gold, pred, labels=list("abc"), sample_weight=[1, 2, 3, 4], zero_division=0)
    for k, label in enumerate("abc"):
        assert [weighted[label][key] for key in ("precision", "recall", "f1", "support")] == pytest.approx([p[k], r[k], f[k], s[k]])


@pytest.mark.parametrize("call, message", [
    (lambda: __import__("seqaware.metrics.classification", fromlist=["x"]).per_class_prf(["a"], ["a", "b"], ["a"]),
     "gold and pred differ in length: 1 vs 2"),
    (lambda: __import__("seqaware.metrics.classification", fromlist=["x"]).per_class_prf(["a"], ["a"], ["a"], weights=[1, 2]),
     "weights and gold differ in length: 2 vs 1"),
    (lambda: __import__("seqaware.metrics.classification", fromlist=["x"]).share_weights(["yes", "no"], 0),
     "the share of 'yes' must be in (0, 1), got 0"),
    (lambda: __import__("seqaware.metrics.classification", fromlist=["x"]).share_weights(["DEP", "NONDEP"], 1.0, positive="DEP"),
     "the share of 'DEP' must be in (0, 1), got 1.0"),
    (lambda: __import__("seqaware.metrics.classification", fromlist=["x"]).share_weights([], 0.5),
     "re-weighting needs both 'yes' and other gold labels, got a 'yes' share of 0.0"),
    (lambda: __import__("seqaware.metrics.classification", fromlist=["x"]).share_weights(["no", "no"], 0.5, positive="no"),
     "re-weighting needs both 'no' and other gold labels, got a 'no' share of 1.0"),
    (lambda: choose_threshold(["yes"], [0.1, 0.2]), "gold and scores differ in length: 1 vs 2"),
    (lambda: choose_threshold([], []), "choose_threshold needs at least one scored question"),
    (lambda: align_labels(["DEP", "NONDEP"], ["DEP"]), "gold and pred differ in length: 2 vs 1"),
    (lambda: twin_consistency([1, 1], ["yes"]), "keys and answers differ in length: 2 vs 1"),
])
def test_classification_input_errors_in_full(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_classification_report_weighted_by_hand_and_degenerate_label_sets():
    from seqaware.metrics.classification import classification_report

    report = classification_report(list("aabc"), list("abbx"), list("abc"), weights=[1, 2, 3, 4])
    # n counts items; accuracy (1 + 3) / 10; the invalid prediction x weighs 4 of 10
    assert (report["n"], report["accuracy"], report["invalid_rate"]) == (4, 0.4, 0.4)
    assert report["macro_f1"] == pytest.approx((0.5 + 0.75 + 0) / 3)
    assert report["weighted_f1"] == pytest.approx((3 * 0.5 + 3 * 0.75 + 4 * 0) / 10)
    assert report["weighted_precision"] == pytest.approx((3 * 1 + 3 * 0.6) / 10)
    assert report["weighted_recall"] == pytest.approx((3 / 3 + 3 * 1) / 10)
    ps, rs, fs, _ = precision_recall_fscore_support(list("aabc"), list("abbx"), labels=list("abc"), average="weighted",
                                                    sample_weight=[1, 2, 3, 4], zero_division=0)
    assert (report["weighted_precision"], report["weighted_recall"], report["weighted_f1"]) == pytest.approx((ps, rs, fs))
    assert report["support_c"] == 4 and report["precision_b"] == 0.6
    # no gold label among the labels: weighted scores are 0.0, not NaN; accuracy still compares gold and pred
    outside = classification_report(["x"], ["x"], ["a", "b"])
    assert outside["accuracy"] == 1.0 and outside["invalid_rate"] == 1.0
    assert [outside[f"weighted_{k}"] for k in ("precision", "recall", "f1")] == [0.0, 0.0, 0.0]
    assert [outside[f"macro_{k}"] for k in ("precision", "recall", "f1")] == [0.0, 0.0, 0.0]
    # no label at all: macro scores are 0.0; no item: accuracy and invalid rate are 0.0
    no_labels = classification_report(["a"], ["a"], [])
    assert [no_labels[f"macro_{k}"] for k in ("precision", "recall", "f1")] == [0.0, 0.0, 0.0]
    empty = classification_report([], [], ["a"])
    assert (empty["n"], empty["accuracy"], empty["invalid_rate"], empty["weighted_f1"]) == (0, 0.0, 0.0, 0.0)
    zero_weights = classification_report(["a", "b"], ["a", "x"], ["a", "b"], weights=[0, 0])
    assert (zero_weights["n"], zero_weights["accuracy"], zero_weights["invalid_rate"]) == (2, 0.0, 0.0)


def test_format_table_exact_text():
    """Percentages with one decimal (or 3 decimals), ints as ints (numpy ints too), None / missing as -."""
    from seqaware.metrics.classification import format_table

    rows = {"m1": {"a": 0.5, "b": 3, "c": None}, 3: {"a": np.int64(7), "b": 0.12345, "c": True}}
    columns = [("a", "A"), ("b", "B"), ("c", "C")]
    assert format_table(rows, columns) == (
        "| system | A | B | C |\n"
        "|---|---:|---:|---:|\n"
        "| m1 | 50.0 | 3 | - |\n"
        "| 3 | 7 | 12.3 | 100.0 |")
    assert format_table(rows, columns, percent=False).splitlines()[2:] == ["| m1 | 0.500 | 3 | - |", "| 3 | 7 | 0.123 | 1.000 |"]
    assert format_table({}, [("a", "A")]) == "| system | A |\n|---|---:|"
    assert binary_table({"sys": {"accuracy": 0.75, "precision": 1.0, "recall": 0.5, "f1": 2 / 3, "macro_f1": 0.7}}) == (
        "| system | Acc | P | R | F1 | macro F1 | invalid |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n"
        "| sys | 75.0 | 100.0 | 50.0 | 66.7 | 70.0 | - |")


def test_random_labels_are_seeded_numpy_draws():
    from seqaware.metrics.classification import random_labels

    # numpy.random.default_rng(0).integers(3, size=12) = 2 1 1 0 0 0 0 0 0 2 1 2
    labels = ("before", "after", "independent")
    expected = [labels[i] for i in (2, 1, 1, 0, 0, 0, 0, 0, 0, 2, 1, 2)]
    assert random_labels(12, labels) == expected and random_labels(12, labels, seed=0) == expected
    assert random_labels(12, labels, seed=1) != expected
    assert random_labels(0, labels) == []


def test_align_labels_with_mappings_scores_every_gold_id():
    gold, pred = align_labels({"b": "yes", "a": "no", "c": "yes"}, {"a": "no", "b": "no", "z": "yes"})
    assert gold == ["yes", "no", "yes"] and pred == ["no", "no", None]
    assert align_labels(("yes", "no"), iter(["no", "yes"])) == (["yes", "no"], ["no", "yes"])


def test_binary_report_rows_and_baselines_by_hand():
    gold = {"q1": "yes", "q2": "no", "q3": "no", "q4": "no"}
    pred = {"q1": "yes", "q2": "yes", "q3": "no"}                       # q4 unanswered: wrong, invalid
    report = binary_report(gold, pred)
    # yes: tp 1, predicted 2, support 1 -> P 1/2 R 1 F 2/3; no: tp 1, predicted 1, support 3 -> P 1 R 1/3 F 1/2
    assert (report["precision"], report["recall"], report["f1"]) == pytest.approx((0.5, 1.0, 2 / 3))
    assert (report["precision_no"], report["recall_no"], report["f1_no"]) == pytest.approx((1.0, 1 / 3, 0.5))
    assert report["accuracy"] == 0.5 and report["invalid_rate"] == 0.25 and report["macro_f1"] == pytest.approx(7 / 12)
    # another pair of labels: the positive one's scores are the unsuffixed keys
    dep = binary_report(["DEP", "NONDEP"], ["DEP", "DEP"], positive="NONDEP", negative="DEP")
    assert (dep["precision"], dep["recall"], dep["f1"]) == (0.0, 0.0, 0.0) and dep["recall_DEP"] == 1.0
    rows = __import__("seqaware.metrics.classification", fromlist=["x"]).binary_rows(gold, {"model": pred})
    assert list(rows) == ["always yes", "always no", "majority (no)", "model"]
    assert rows["model"] == report
    assert rows["always no"]["accuracy"] == 0.75 and rows["always no"]["f1"] == 0.0
    assert rows["majority (no)"] == rows["always no"]
    assert rows["always yes"]["precision"] == 0.25 and rows["always yes"]["recall"] == 1.0
    custom = __import__("seqaware.metrics.classification", fromlist=["x"]).binary_rows(
        ["A", "B", "B"], {"m": ["A", "A", "B"]}, positive="A", negative="B")
    assert list(custom) == ["always A", "always B", "majority (B)", "m"]
    assert (custom["m"]["precision"], custom["m"]["recall"], custom["m"]["f1_B"]) == pytest.approx((0.5, 1.0, 2 / 3))
    named = binary_baselines(["A", "B", "B"], positive="A", negative="B")
    assert list(named) == ["always A", "always B", "majority (B)"] and named["always A"]["precision"] == pytest.approx(1 / 3)


def test_share_weights_by_hand():
    from seqaware.metrics.classification import share_weights

    # p = 1/4: yes weighs 0.5 / 0.25 = 2, no weighs 0.5 / 0.75 = 2/3; the weights sum to 4
    assert share_weights(["yes", "no", "no", "no"], 0.5) == pytest.approx([2.0, 2 / 3, 2 / 3, 2 / 3])
    assert share_weights(["DEP", "NONDEP"], 0.25, positive="DEP") == pytest.approx([0.5, 1.5])


def test_twin_consistency_counts_only_pairs_asked_twice():
    keys = [("p", 0, 1), ("p", 0, 1), ("p", 1, 2), ("p", 1, 2), ("p", 2, 3), ("q", 0, 1), ("q", 0, 1), ("q", 0, 1),
            ("r", 0, 1), ("r", 0, 1)]
    answers = ["yes", "yes", "yes", "no", "yes", "no", "no", "no", None, None]
    # twins: p 0-1 agree, p 1-2 disagree, r 0-1 both missing (no agreement); p 2-3 asked once and q thrice are left out
    assert twin_consistency(keys, answers) == {"twin_consistency": pytest.approx(1 / 3), "n_twins": 3}
    assert twin_consistency([], []) == {"twin_consistency": 0.0, "n_twins": 0}
    assert twin_consistency(["a", "a"], ["no", "no"]) == {"twin_consistency": 1.0, "n_twins": 1}


def test_choose_threshold_by_hand():
    """gold yes yes no no no no, scores .9 .3 .4 .2 .1 .1. Thresholds in (.4, .9] answer only the first yes
    (accuracy 5/6, F1 yes 2/3, no 8/9); in (.2, .3] the first three (accuracy 5/6, F1 yes 4/5, no 6/7).
    On ties the grid point closest to 0.5 wins, then the smaller one; a score equal to t answers yes."""
    gold, scores = ["yes", "yes", "no", "no", "no", "no"], [0.9, 0.3, 0.4, 0.2, 0.1, 0.1]
    assert choose_threshold(gold, scores) == pytest.approx((0.3, (4 / 5 + 6 / 7) / 2))
    assert choose_threshold(gold, scores, metric="accuracy") == pytest.approx((0.5, 5 / 6))
    assert choose_threshold(gold, scores, metric="f1") == pytest.approx((0.3, 0.8))
    t, value = choose_threshold(gold, scores)
    assert type(t) is float and type(value) is float
    # score == t answers yes: only t in (.2, .25] separates, and .25 is the grid point closest to 0.5
    assert choose_threshold(["no", "no", "yes"], [0.1, 0.2, 0.25]) == (0.25, 1.0)
    # the default grid runs from 0.05 to 0.95
    assert choose_threshold(["no", "yes"], [0.94, 0.95]) == (0.95, 1.0)
    assert choose_threshold(["yes", "no"], [0.05, 0.04]) == (0.05, 1.0)
    # ... and no further: only 0.96 would separate .955 from .97, so every grid point answers yes twice
    # (macro F1 (2/3 + 0) / 2) and the tie goes to 0.5
    assert choose_threshold(["no", "yes"], [0.955, 0.97]) == pytest.approx((0.5, 1 / 3))
    # equally far from 0.5: the smaller threshold, wherever it is in the grid
    assert choose_threshold(["no", "yes"], [0.3, 0.7], grid=[0.6, 0.4, 0.2]) == (0.4, 1.0)
    assert choose_threshold(["no", "yes"], [0.3, 0.7], grid=[0.2, 0.4, 0.6]) == (0.4, 1.0)
    # other answer words
    assert choose_threshold(["DEP", "NONDEP"], [0.8, 0.1], positive="DEP", negative="NONDEP", grid=[0.9, 0.5]) == (0.5, 1.0)


def test_default_seeds_of_the_random_baselines():
    """Every ``seed`` defaults to 0 (numpy PCG64). ISO: default_rng(0).integers(2, size=8) = 1 1 1 0 0 0 0 0,
    i.e. NONDEP x3, DEP x5 against gold DEP x3, NONDEP x5: all wrong (seed 1 gets half right)."""
    gold = ["DEP"] * 3 + ["NONDEP"] * 5
    for rows in (iso_baselines(gold), iso_rows(gold, {}), iso_rows(gold, {}, seed=0)):
        assert rows["random"]["accuracy"] == 0.0 and rows["random"]["recall_NONDEP"] == 0.0
    assert iso_rows(gold, {}, seed=1)["random"]["accuracy"] == 0.5
    # COHERENCE: default_rng(0) draws a -> [4, 5, 3], b -> [3, 1, 2, 0].
    # a vs gold [3, 1, 4]: all 3 pairs discordant -> PM 0; placed gold images 4 (rank 2) then 3 (rank 0) -> 0;
    # distractor 5 used -> Reject 0, 2 of 3 unused. b vs [2, 0, 1, 3]: 3 concordant, 3 discordant -> PM 1/2;
    # gold ranks placed 3 2 0 1 -> 1 concordant, 5 discordant -> tau -2/3 -> 1/6.
    a = {"instance_id": "a", "candidates": [f"c{i}" for i in range(6)], "gold": [3, 1, 4], "distractors": [0, 2, 5]}
    b = {"instance_id": "b", "candidates": [f"d{i}" for i in range(4)], "gold": [2, 0, 1, 3], "distractors": []}
    for rows in (coherence_baselines([a, b]), coherence_rows([a, b], {}), coherence_rows([a, b], {}, seed=0)):
        random = rows["random"]
        assert random["partial_score"] == pytest.approx(0.25)
        assert random["partial_score_placement"] == pytest.approx(1 / 12)
        assert random["reject_accuracy"] == 0.0 and random["reject_fraction"] == pytest.approx(2 / 3)
    rng = np.random.default_rng(0)
    drawn = [[int(c) for c in rng.choice(6, size=3, replace=False)], [int(c) for c in rng.choice(4, size=4, replace=False)]]
    assert coherence_rows([a, b], {})["random"] == coherence_report([a, b], drawn)
    assert coherence_rows([a, b], {}, seed=1)["random"]["partial_score"] == pytest.approx(2 / 3)


def test_iso_rows_pass_the_unparsable_rule_to_the_systems():
    gold = ["DEP", "DEP", "NONDEP", "NONDEP"]
    rows = iso_rows(gold, {"model": ["DEP", "other", "NONDEP", "DEP"]}, unparsable="wrong")
    assert rows["model"]["n_scored"] == 4 and rows["model"]["recall_DEP"] == 0.5 and rows["model"]["accuracy"] == 0.5
    excluded = iso_rows(gold, {"model": ["DEP", "other", "NONDEP", "DEP"]})["model"]
    assert excluded["n_scored"] == 3 and excluded["recall_DEP"] == 1.0 and excluded["accuracy"] == pytest.approx(2 / 3)
    assert list(iso_rows({"x": "DEP", "y": "NONDEP"}, {"m": {"x": "DEP"}})) == [
        "always DEP", "always NONDEP", "majority (DEP)", "random", "m"]


def test_coherence_report_of_no_instances_and_without_distractors():
    """An empty report has zero rates (never NaN) and no reject numbers; instances without distractors
    have no reject numbers either (None, not 0)."""
    assert coherence_report([], {}) == {
        "n": 0, "exact_match": 0.0, "partial_score": 0.0, "partial_score_placement": 0.0, "reject_accuracy": None,
        "reject_fraction": None, "num_with_distractors": 0, "invalid_rate": 0.0, "unparsable_rate": 0.0,
        "by_source": {}, "by_difficulty": {}}
    inst = {"instance_id": "x", "candidates": ["a", "b", "c"], "gold": [2, 0, 1], "distractors": []}
    report = coherence_report([inst], [[2, 1, 0]])
    assert report["reject_accuracy"] is None and report["reject_fraction"] is None and report["num_with_distractors"] == 0
    assert report["invalid_rate"] == 0.0 and report["unparsable_rate"] == 0.0


# ---------------------------------------------------------------- TEO helpers
@pytest.mark.parametrize("raw, label", [
    ("before", "before"), (" Before ", "before"), ("AFTER", "after"), ("independent\n", "independent"),
    ("other", "other"), ("before it", "other"), ("", "other"), (None, "other"), (1, "other"),
])
def test_teo_normalize_label(raw, label):
    from seqaware.metrics.teo import normalize_label

    assert normalize_label(raw) == label


def test_teo_label_ids_swaps_and_pair_keys():
    """The class ids every TEO head uses, the label of a pair shown the other way round, and the key that
    joins an original pair to its swapped twin (procedure id as a string, steps as sorted ints)."""
    from seqaware.metrics.teo import OTHER, SWAPPED_LABEL, TEO_LABEL_ID, TEO_LABELS, pair_key

    assert TEO_LABELS == ("before", "after", "independent") and OTHER == "other"
    assert TEO_LABEL_ID == {"before": 0, "after": 1, "independent": 2}
    assert SWAPPED_LABEL == {"before": "after", "after": "before", "independent": "independent"}
    assert pair_key({"procedure_id": 7, "a": "3", "b": 1}) == ("7", 1, 3)
    assert pair_key({"procedure_id": "p", "a": 0, "b": 2}) == pair_key({"procedure_id": "p", "a": 2, "b": 0}) == ("p", 0, 2)


def _three_step_sets():
    """Procedure r, 3 steps, edge 0->1: original 0-1 before, 0-2 and 1-2 independent; swapped: after, independent x2."""
    sets = teo_eval_sets([_procedure("r", 3, dag=[(0, 1)])])
    return sets["original"], sets["swapped"]


def test_teo_report_counts_accuracies_and_mismatch_messages_by_hand():
    original, swapped = _three_step_sets()
    orig = {"r:0-1": "Before", "r:0-2": "independent", "r:1-2": "after"}
    swap = {"r:0-1:swapped": "after", "r:0-2:swapped": "before", "r:1-2:swapped": "independent"}
    report = teo_report(original, swapped, orig, swap)
    # dependent 0-1: before / after -> consistent; independent 0-2 (indep / before) and 1-2 (after / indep) -> not
    assert (report["num_pairs"], report["num_dependent"], report["num_independent"]) == (3, 1, 2)
    assert report["consistency_dependent"] == 1.0 and report["consistency_independent"] == 0.0
    assert report["consistency_accuracy"] == pytest.approx(1 / 3)
    assert report["accuracy_original"] == pytest.approx(2 / 3) and report["accuracy_swapped"] == pytest.approx(2 / 3)
    # before on original and after on swapped: tp 1 of 1 predicted, 1 gold -> 1; independent pooled: tp 2,
    # predicted 2, gold 4 -> 2/3; on the original only: tp 1, predicted 1, gold 2 -> 2/3
    assert (report["f1_before"], report["f1_after"]) == (1.0, 1.0)
    assert report["f1_independent"] == pytest.approx(2 / 3) and report["mateo_f1_independent"] == pytest.approx(2 / 3)
    assert report["macro_f1"] == pytest.approx(8 / 9) and report["other_rate"] == 0.0
    # a dependent pair answered after / before (both flipped) is not consistent
    flipped = teo_report(original, swapped, {"r:0-1": "after"}, {"r:0-1:swapped": "before"})
    assert flipped["consistency_dependent"] == 0.0 and flipped["other_rate"] == pytest.approx(4 / 6)
    stranger = teo_eval_sets([_procedure("z", 2, dag=[(0, 1)])])["swapped"][0]
    for bad_swapped, message in (
            (swapped[:-1], "original and swapped sets must hold the same pairs, each once"),
            ([swapped[0], swapped[0], swapped[1]], "original and swapped sets must hold the same pairs, each once"),
            ([swapped[0], swapped[1], stranger], "original pair ('r', 1, 2) has no swapped counterpart")):
        with pytest.raises(ValueError) as err:
            teo_report(original, bad_swapped, orig, swap)
        assert str(err.value) == message
    assert teo_report([], [], {}, {})["consistency_accuracy"] == 0.0


def test_teo_complete_pairs_and_predicted_pair_rows():
    """Only pairs seen in both presentations are scored; both lists keep their order."""
    from seqaware.metrics.teo import complete_pairs, predicted_pair_rows

    original, swapped = _three_step_sets()
    kept_o, kept_s = complete_pairs(original, [swapped[1], swapped[0]])
    assert [p["pair_id"] for p in kept_o] == ["r:0-1", "r:0-2"]
    assert [p["pair_id"] for p in kept_s] == ["r:0-2:swapped", "r:0-1:swapped"]
    assert complete_pairs(original, []) == ([], [])
    entries_o = [(p, y) for p, y in zip(original, ["before", "independent", "after"])]
    entries_s = [(p, y) for p, y in zip(swapped[:2], ["after", "before"])]
    rows, kept_o, kept_s = predicted_pair_rows(entries_o, entries_s, "model")
    assert kept_o == entries_o[:2] and kept_s == entries_s
    assert list(rows) == ["always independent", "majority", "random", "model"]
    assert rows["model"] == teo_report(original[:2], swapped[:2], {"r:0-1": "before", "r:0-2": "independent"},
                                       {"r:0-1:swapped": "after", "r:0-2:swapped": "before"})
    assert rows["model"]["num_pairs"] == 2 and rows["model"]["consistency_accuracy"] == 0.5
    assert predicted_pair_rows(entries_o, [], "model") == ({}, [], [])


def test_teo_table_layout():
    original, swapped = _three_step_sets()
    rows = {"m": teo_report(original, swapped, {"r:0-1": "before"}, {"r:0-1:swapped": "after"})}
    assert teo_table(rows).splitlines() == [
        "| system | Cons. Acc | Cons. dep | Cons. indep | F1 before | F1 after | F1 indep | F1 indep (orig.) | macro F1 | Other |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| m | 33.3 | 100.0 | 0.0 | 100.0 | 100.0 | 0.0 | 0.0 | 66.7 | 66.7 |"]


# ---------------------------------------------------------------- COHERENCE details
def test_coherence_scores_tuples_numpy_ints_and_one_placed_gold_image():
    inst = {"instance_id": "x", "candidates": ["a", "b", "c", "d", "e"], "gold": [2, 0, 4], "distractors": [1, 3],
            "difficulty": "hard", "source": "Science"}
    assert coherence_scores(inst, (np.int64(2), 0, np.int32(4))) == {
        "valid": True, "parsed": True, "exact": 1.0, "partial": 1.0, "partial_placement": 1.0, "reject": 1.0,
        "reject_fraction": 1.0}
    # [1, 3, 4] vs [2, 0, 4]: (0,1) discordant, (0,2) and (1,2) concordant -> tau 1/3 -> PM 2/3; only one gold
    # image placed (4): no pair to order, placement falls back to exact (0); both distractors used
    assert coherence_scores(inst, [1, 3, 4]) == {
        "valid": True, "parsed": True, "exact": 0.0, "partial": pytest.approx(2 / 3), "partial_placement": 0.0,
        "reject": 0.0, "reject_fraction": 0.0}
    # two gold images placed (2 first, 4 last) in gold order: placement 1
    assert coherence_scores(inst, [2, 1, 4])["partial_placement"] == 1.0
    no_distractors = {"instance_id": "y", "candidates": ["a", "b"], "gold": [1, 0], "distractors": []}
    assert coherence_scores(no_distractors, None) == {"valid": False, "parsed": False, "exact": 0.0, "partial": 0.0,
                                                      "partial_placement": 0.0, "reject": None, "reject_fraction": None}
    assert coherence_scores(no_distractors, [1, 0]) == {"valid": True, "parsed": True, "exact": 1.0, "partial": 1.0,
                                                        "partial_placement": 1.0, "reject": None, "reject_fraction": None}
    assert np.isnan(kendall_tau([1], [1])) and np.isnan(kendall_tau([], []))
    assert kendall_tau([1, 2], [2, 1]) == -1.0 and kendall_tau([0, 1, 2], [0, 2, 1]) == pytest.approx(1 / 3)
    # unsigned index arrays (differences must not wrap around)
    assert kendall_tau(np.array([0, 2, 1], dtype=np.uint8), np.array([0, 1, 2], dtype=np.uint8)) == pytest.approx(1 / 3)


def test_coherence_report_by_difficulty_and_table():
    """Difficulties sorted, a missing one grouped as "None"; the table shows percentages."""
    inst = {"instance_id": "x", "candidates": ["a", "b", "c", "d", "e"], "gold": [2, 0, 4], "distractors": [1, 3],
            "difficulty": "hard", "source": "Science"}
    other = {"instance_id": "y", "candidates": ["a", "b"], "gold": [1, 0], "distractors": []}
    report = coherence_report([inst, other], {"x": [2, 0, 4], "y": None})
    assert list(report["by_difficulty"]) == ["None", "hard"]
    assert report["by_difficulty"]["None"] == {
        "n": 1, "exact_match": 0.0, "partial_score": 0.0, "partial_score_placement": 0.0, "reject_accuracy": None,
        "reject_fraction": None, "num_with_distractors": 0, "invalid_rate": 1.0, "unparsable_rate": 1.0}
    assert list(report["by_source"]) == ["Science"] and report["by_source"]["Science"]["n"] == 1
    assert (report["exact_match"], report["partial_score_placement"], report["reject_accuracy"]) == (0.5, 0.5, 1.0)
    assert (report["invalid_rate"], report["unparsable_rate"], report["num_with_distractors"]) == (0.5, 0.5, 1)
    invalid = coherence_report([inst], [[2, 0, 0]])
    assert invalid["invalid_rate"] == 1.0 and invalid["unparsable_rate"] == 0.0
    assert coherence_table({"m": report}) == (
        "| system | Exact | Partial | Reject | unparsable | invalid |\n"
        "|---|---:|---:|---:|---:|---:|\n"
        "| m | 50.0 | 50.0 | 100.0 | 50.0 | 50.0 |")


def test_iso_implied_recall_and_rounding_by_hand():
    """With TP = 1: P_DEP 2/3 -> FP 1/2; R_DEP 1/2 -> FN 1; P_NONDEP 0.6 -> TN 1.5; R_NONDEP = 1.5 / 2 = 3/4.
    Rates of 0 and 1 are approached, not divided by."""
    assert implied_nondep_recall(2 / 3, 0.5, 0.6) == pytest.approx(0.75)
    assert implied_nondep_recall(1.0, 1.0, 1.0) == pytest.approx(1.0, abs=1e-6)
    assert implied_nondep_recall(0.0, 0.0, 0.0) == pytest.approx(0.0, abs=1e-6)
    # one decimal (tolerance 0.05): lo = implied(.81, .80, .73) = .7424, hi = implied(.91, .70, .83) = .9549, so a
    # NONDEP recall of .95 fits exclusion, which it does not with two decimals (test above)
    check = unparsable_consistency({"p": 0.86, "r": 0.75}, {"p": 0.78, "r": 0.95}, decimals=1)
    assert check == {"exclude": True, "wrong": True, "implied_recall_NONDEP": pytest.approx((0.7424, 0.9549), abs=1e-4)}
    # the default is two decimals: .87 lies within .005 of lo = .868 (it would not with three decimals)
    default = unparsable_consistency({"p": 0.86, "r": 0.75}, {"p": 0.78, "r": 0.87})
    assert default == unparsable_consistency({"p": 0.86, "r": 0.75}, {"p": 0.78, "r": 0.87}, decimals=2)
    assert default["exclude"] is True
    # a NONDEP recall above hi = .889 but within rounding of it (.89 <= hi + .005) fits both rules
    assert unparsable_consistency({"p": 0.86, "r": 0.75}, {"p": 0.78, "r": 0.89}) == {
        "exclude": True, "wrong": True, "implied_recall_NONDEP": pytest.approx((0.8683, 0.8890), abs=1e-4)}
    assert unparsable_consistency({"p": 0.86, "r": 0.75}, {"p": 0.78, "r": 0.87}, decimals=3)["exclude"] is False
    low = unparsable_consistency({"p": 0.9, "r": 0.8}, {"p": 0.8, "r": 0.6}, decimals=1)
    assert low["exclude"] is False and low["wrong"] is True


def test_iso_report_with_mappings_and_table_layout():
    # id b has no prediction: unparsable, left out by default
    report = iso_report({"a": "DEP", "b": "NONDEP", "c": "NONDEP"}, {"a": "DEP", "c": "DEP", "z": "NONDEP"})
    assert (report["n"], report["n_scored"], report["num_unparsable"]) == (3, 2, 1)
    assert report["invalid_rate"] == pytest.approx(1 / 3) and report["accuracy"] == 0.5
    assert (report["precision_DEP"], report["recall_DEP"], report["support_NONDEP"]) == (0.5, 1.0, 1)
    assert iso_report([], [])["invalid_rate"] == 0.0 and iso_report([], [])["n"] == 0
    assert iso_table({"m": iso_report(["DEP", "NONDEP"], ["DEP", "x"])}).splitlines() == [
        "| system | Acc | P DEP | R DEP | F1 DEP | P NONDEP | R NONDEP | F1 NONDEP | macro P | macro R | macro F1 | unparsable |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| m | 100.0 | 100.0 | 100.0 | 100.0 | 0.0 | 0.0 | 0.0 | 50.0 | 50.0 | 50.0 | 50.0 |"]


def test_binary_baselines_score_with_the_callers_own_labels():
    gold = ["a", "b", "b"]
    rows = binary_baselines(gold, positive="a", negative="b")
    assert list(rows) == ["always a", "always b", "majority (b)"]
    assert rows["always a"] == binary_report(gold, ["a"] * 3, "a", "b")
    assert rows["always b"] == binary_report(gold, ["b"] * 3, "a", "b")
    assert rows["majority (b)"] == rows["always b"]
    assert rows["always a"]["f1"] == 0.5 and rows["always b"]["f1_b"] == 0.8


def test_align_labels_refuses_a_sequence_against_a_mapping():
    with pytest.raises(TypeError) as err:
        align_labels({"q1": "yes"}, ["yes"])
    assert str(err.value) == "gold is a mapping, so pred must be a mapping keyed by the same ids"


def test_teo_rows_random_baseline_follows_the_seed():
    original, swapped = _fixed_teo_sets()
    assert teo_baselines(original, swapped, 0)["random"] != teo_baselines(original, swapped, 5)["random"]
    assert teo_rows(original, swapped, {})["random"] == teo_baselines(original, swapped, 0)["random"]
    assert teo_rows(original, swapped, {}, seed=5)["random"] == teo_baselines(original, swapped, 5)["random"]
