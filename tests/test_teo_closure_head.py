"""CaT-Bench with its own labels: the validation-split reader, plan-level folds, the closure head,
cross-validated thresholds, the logistic-regression baseline, scoring on the paper's questions, and the
wall between the sample plans and training (the experiment's run: tests/test_train.py)."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from data_modules.adapters.catbench import read_catbench
from data_modules.catbench_plans import CatBenchPlansDataModule, check_disjoint, labelled_plans, plan_folds, plan_key
from seqaware.metrics.classification import binary_report
from seqaware.modules.teo_closure_head import (ClosureEnsemble, baseline_features, baseline_probs, content_words,
                                               fit_baseline, fold_scores, lexical_pair_features, max_product_closure,
                                               pair_features, plan_tensors, summarise)

STEPS = ["Preheat the oven.", "Mix flour and eggs.", "Pour the batter into a tin.", "Bake for 20 minutes.", "Serve."]


def question(plan, idx, first, second, label, direction="before", steps=STEPS, title="cake", qtype=None):
    qtype = qtype or f"{'dependent' if label == 'yes' else 'nondependent'}_real_{direction}"
    return {"plan_idx": plan, "title": title, "question_idx": idx, "question_type": qtype, "direction": direction,
            "binary_question": "?", "steps": list(steps), "first_step_idx": first, "second_step_idx": second,
            "label": label, "efg_recipe_id": None}


def write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------- the head
def brute_force_closure(direct: np.ndarray) -> np.ndarray:
    n = len(direct)
    out = np.zeros_like(direct)
    for a, b in itertools.combinations(range(n), 2):
        inner = range(a + 1, b)
        best = 0.0
        for k in range(b - a):  # every increasing path a < m_1 < ... < m_k < b
            for middle in itertools.combinations(inner, k):
                path = (a, *middle, b)
                best = max(best, float(np.prod([direct[u, v] for u, v in zip(path, path[1:])])))
        out[a, b] = best
    return out


def test_closure_is_the_most_probable_chain_of_direct_dependencies():
    rng = np.random.default_rng(0)
    for n in (2, 3, 6, 7):
        direct = rng.random((n, n))
        got = max_product_closure(torch.tensor(direct)[None])[0].numpy()
        np.testing.assert_allclose(got, brute_force_closure(direct), rtol=1e-12)
    # a chain 0 -> 1 -> 2 -> 3 of certain edges reaches 3 from 0 although the direct score is 0
    chain = torch.zeros(1, 4, 4)
    chain[0, 0, 1] = chain[0, 1, 2] = chain[0, 2, 3] = 1.0
    assert max_product_closure(chain)[0, 0, 3] == 1.0 and max_product_closure(chain)[0, 3, 0] == 0.0


def test_direct_scores_the_real_forward_pairs_only():
    torch.manual_seed(0)
    ensemble = ClosureEnsemble(8, members=2, step_dim=6, pair_hidden=5).eval()
    steps, num_steps = torch.randn(2, 5, 8), torch.tensor([5, 3])
    mask = torch.arange(5)[None] < num_steps[:, None]
    direct = ensemble.direct(steps, mask, num_steps)
    feats = pair_features(num_steps, 5)
    for m, k, a, b in itertools.product(range(2), range(2), range(5), range(5)):
        if a < b < int(num_steps[k]):     # member m's own linear layers, as torch.nn.Linear would apply them
            h = lambda i: steps[k, i] @ ensemble.proj.weight[m] + ensemble.proj.bias[m, 0]  # noqa: E731
            x = torch.cat([h(a), h(b), h(a) * h(b), (h(a) - h(b)).abs(), feats[k, a, b]])
            hidden = torch.nn.functional.gelu(x @ ensemble.hidden.weight[m] + ensemble.hidden.bias[m, 0])
            expected = torch.sigmoid(hidden @ ensemble.out.weight[m] + ensemble.out.bias[m, 0])[0]
            assert torch.allclose(direct[m, k, a, b], expected, atol=1e-6)
        else:
            assert direct[m, k, a, b] == 0
    assert not torch.allclose(direct[0], direct[1])                        # members start apart
    # pair features: (b - a)/n, a/n, b/n, sign, 1/|b - a|, b last, a first, n/20
    assert feats[1, 0, 2].tolist() == pytest.approx([2 / 3, 0, 2 / 3, 1, 0.5, 1, 1, 0.15])


def test_both_presentations_of_a_pair_get_one_answer():
    torch.manual_seed(0)
    ensemble = ClosureEnsemble(8, members=2, step_dim=6, pair_hidden=5).eval()
    steps, num_steps = torch.randn(2, 6, 8), torch.tensor([6, 4])
    mask = torch.arange(6)[None] < num_steps[:, None]
    probs = ensemble(steps, mask, num_steps)
    assert torch.equal(probs, probs.transpose(1, 2))                       # r(b, a) = r(a, b): twins agree
    assert torch.all(probs.diagonal(dim1=1, dim2=2) == 0) and probs.min() >= 0 and probs.max() <= 1
    assert torch.all(probs[1, 4:] == 0)                                    # padding steps answer nothing
    assert torch.allclose(probs, ensemble.member_probs(steps, mask, num_steps).mean(0))


def test_ensemble_members_train_on_their_own_losses():
    torch.manual_seed(0)
    plans = [{"labels": [(0, 2, "yes"), (1, 2, "no"), (0, 1, "no")]}, {"labels": [(0, 3, "yes"), (1, 3, "yes")], "source": "rfg"}]
    data = plan_tensors([torch.randn(3, 8), torch.randn(4, 8)], plans, rfg_weight=0.5)
    assert data["plan"].tolist() == [0, 0, 0, 1, 1] and data["target"].tolist() == [1, 0, 0, 1, 1]
    assert data["weight"].tolist() == [1, 1, 1, 0.5, 0.5] and data["mask"].tolist()[0] == [True] * 3 + [False]
    ensemble = ClosureEnsemble(8, members=2, step_dim=6, pair_hidden=5, dropout=0.0)
    losses = ensemble.member_losses(data)
    probs = ensemble.member_probs(data["steps"], data["mask"], data["num_steps"])[0, data["plan"], data["a"], data["b"]]
    bce = torch.nn.functional.binary_cross_entropy(probs, data["target"], reduction="none")
    assert torch.allclose(losses[0], (bce * data["weight"]).sum() / 4.0)   # weighted mean: weights sum to 4
    losses[0].backward()                                                   # member 0's loss moves member 0 only
    assert ensemble.proj.weight.grad[1].abs().sum() == 0 and ensemble.proj.weight.grad[0].abs().sum() > 0
    ensemble.zero_grad()
    optimizer = torch.optim.AdamW(ensemble.parameters(), lr=1e-2)
    before = float(ensemble.loss(data).detach())
    for _ in range(30):
        optimizer.zero_grad()
        ensemble.loss(data).backward()
        optimizer.step()
    assert float(ensemble.loss(data).detach()) < 0.5 * before


def test_lexical_pair_features_by_hand():
    steps = ("Preheat the oven to 180C.", "Mix the flour and eggs in a bowl.", "Pour the batter into a tin.",
             "Bake it in the oven for 20 minutes.", "Serve the cakes.")
    assert content_words(steps[3]) == {"bake", "oven"}                     # "it", "in", "the", "minutes", "for": stop words
    assert content_words("Slice the tomatoes") == {"slice", "tomatoe"}      # a plural s dropped from words of 4+ letters
    f = lexical_pair_features(steps)
    assert f.shape == (5, 5, 8)
    # 0 -> 3 share "oven" of {preheat, oven} and {bake, oven}; 0 is 3's best-overlapping earlier step;
    # 3 says "it"; no step between 0 and 3 mentions oven
    assert f[0, 3].tolist() == pytest.approx([1 / 3, 1 / 2, 1 / 2, 1, 1, 1, 0, 1 / 5])
    assert f[2, 3].tolist() == pytest.approx([0, 0, 0, 0, 0, 1, 0, 0])     # nothing shared; 3 refers back
    assert f[1, 2].tolist() == [0] * 8                                     # nothing shared, no anaphor
    assert np.all(f[np.tril_indices(5)] == 0)                              # only a < b is filled
    # a word of a that reappears between a and b
    g = lexical_pair_features(("Chop the onion.", "Fry the onion.", "Add the onion to the soup."))
    assert g[0, 2, 6] == 1 and g[1, 2, 6] == 0 and g[0, 2, 4] == 0 and g[1, 2, 4] == 1   # ties go to the latest step


def test_a_lexical_head_reads_the_word_overlap_of_the_pair():
    torch.manual_seed(0)
    plans = [{"steps": list(STEPS[:3]), "labels": [(0, 2, "yes")]}, {"steps": list(STEPS[:4]), "labels": [(1, 3, "no")]}]
    assert "lexical" not in plan_tensors([torch.randn(3, 8), torch.randn(4, 8)], plans)   # only for a head that reads it
    data = plan_tensors([torch.randn(3, 8), torch.randn(4, 8)], plans, lexical=True)
    assert data["lexical"].shape == (2, 4, 4, 8)
    assert torch.equal(data["lexical"][1], torch.tensor(lexical_pair_features(tuple(STEPS[:4]))))
    assert torch.all(data["lexical"][0, 3] == 0) and torch.all(data["lexical"][0, :, 3] == 0)   # the padding step
    ensemble = ClosureEnsemble(8, members=2, step_dim=6, pair_hidden=5, lexical=True).eval()
    assert ensemble.hidden.weight.shape == (2, 4 * 6 + 8 + 8, 5)
    probs = ensemble(data["steps"], data["mask"], data["num_steps"], data["lexical"])
    changed = data["lexical"].clone()
    changed[1, 1, 3] += 1.0
    moved = ensemble(data["steps"], data["mask"], data["num_steps"], changed)
    assert moved[1, 1, 3] != probs[1, 1, 3] and torch.equal(moved[0], probs[0])
    with pytest.raises(ValueError, match="lexical pair features"):
        ensemble(data["steps"], data["mask"], data["num_steps"])
    with pytest.raises(ValueError, match="3 step texts but 4 step embeddings"):
        plan_tensors([torch.randn(4, 8)], [{"plan_id": "p", "steps": list(STEPS[:3]), "labels": []}], lexical=True)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="closure must be one of"):
        ClosureEnsemble(8, closure="min")
    with pytest.raises(ValueError, match="members must be at least 1"):
        ClosureEnsemble(8, members=0)


# ---------------------------------------------------------------- folds and thresholds
def test_plan_folds_never_split_a_plan():
    sizes = {f"p{i}": s for i, s in enumerate([1, 3, 5, 8, 13, 21, 2, 34, 9, 4, 6, 10, 14, 7])}
    draws = []
    for seed, k in itertools.product(range(5), (2, 4, 7)):
        folds = plan_folds(sizes, k, seed)
        assert set(folds) == set(sizes) and set(folds.values()) == set(range(k))   # one fold per plan, none empty
        load = [sum(s for p, s in sizes.items() if folds[p] == f) for f in range(k)]
        assert max(load) - min(load) <= max(sizes.values())                        # about equally many pairs
        draws.append(tuple(sorted(folds.items())))
    assert len(set(draws)) == len(draws)                                            # every seed draws anew
    assert plan_folds(sizes, 4, 3) == plan_folds(dict(reversed(list(sizes.items()))), 4, 3)  # not the dict order
    with pytest.raises(ValueError, match="at least 2"):
        plan_folds(sizes, 1, 0)
    with pytest.raises(ValueError, match="needs at least 20 training plans"):
        plan_folds(sizes, 20, 0)


def test_each_fold_is_answered_at_a_threshold_chosen_on_the_other_folds():
    folds = [(["yes", "no", "yes", "no"], np.array([0.9, 0.8, 0.85, 0.1])),
             (["yes", "no"], np.array([0.6, 0.3]))]
    scores = fold_scores(folds)
    # fold 0 at fold 1's threshold (0.31 .. 0.60 all separate fold 1; the one closest to 0.5 wins),
    # fold 1 at fold 0's (only 0.81 .. 0.85 separate fold 0; the one closest to 0.5 wins)
    assert scores[0]["threshold"] == 0.5 and scores[1]["threshold"] == 0.81
    assert scores[0]["accuracy"] == 0.75 and scores[0]["f1"] == pytest.approx(0.8)        # 0.9, 0.8, 0.85 yes; 0.8 wrong
    assert scores[1]["accuracy"] == 0.5 and scores[1]["f1"] == 0.0                          # 0.6 < 0.81: both "no"
    summary = summarise(scores)
    assert summary["accuracy_mean"] == 0.625 and summary["accuracy_std"] == 0.125


def test_labelled_plans_keep_one_label_per_pair_and_name_conflicts(tmp_path):
    rows = [question(0, 0, 1, 3, "yes"), question(0, 0, 1, 3, "yes", "after"), question(0, 1, 0, 2, "no", "after"),
            question(1, 0, 0, 1, "yes", steps=["A.", "B."], title="other")]
    plans = labelled_plans(read_catbench(write(tmp_path / "q.jsonl", rows)), "q.jsonl")
    assert [p["labels"] for p in plans] == [[(0, 2, "no"), (1, 3, "yes")], [(0, 1, "yes")]]
    assert [p["title"] for p in plans] == ["cake", "other"]
    bad = rows[:1] + [question(0, 0, 1, 3, "no", "after", qtype="dependent_real_after")]
    with pytest.raises(ValueError, match=r"questions 0-dependent_real_before-0 and 0-dependent_real_after-0 ask about the same step pair \(1, 3\)"):
        labelled_plans(read_catbench(write(tmp_path / "bad.jsonl", bad)), "bad.jsonl")


def test_questions_of_one_plan_that_disagree_on_its_steps_are_an_error(tmp_path):
    """One plan_idx, two step lists (an edited step): refused naming the file, both questions, their lines and
    the first step that differs, instead of becoming a second plan that another fold could hold."""
    edited = STEPS[:3] + ["Bake for 25 minutes."] + STEPS[4:]
    rows = [question(0, 0, 1, 3, "yes"), question(1, 0, 0, 1, "yes", steps=["A.", "B."]),
            question(0, 1, 0, 2, "no", steps=edited)]
    with pytest.raises(ValueError, match=r"d.jsonl:3: plan 0 question 0-nondependent_real_before-1: steps: differ from "
                                         r"those of question 0-dependent_real_before-0 of the same plan \(line 1\) at step 3"):
        labelled_plans(read_catbench(write(tmp_path / "d.jsonl", rows)), tmp_path / "d.jsonl")


def test_an_empty_training_file_names_the_training_key(tmp_path):
    from data_modules.catbench_plans import CatBenchPlansDataModule

    empty = write(tmp_path / "empty.jsonl", [])
    held = write(tmp_path / "test.jsonl", [question(5, 0, 0, 1, "yes", steps=["A.", "B."])])
    with pytest.raises(ValueError, match=f"data.train_path={empty}: the file holds no CaT-Bench questions"):
        CatBenchPlansDataModule(str(empty), str(held)).setup()
    with pytest.raises(FileNotFoundError, match="data.train_path: no such file"):
        CatBenchPlansDataModule(str(tmp_path / "missing.jsonl"), str(held)).setup()
    train = write(tmp_path / "train.jsonl", [question(0, 0, 0, 1, "yes", steps=["C.", "D."]),
                                             question(1, 0, 0, 1, "no", steps=["E.", "F."])])
    with pytest.raises(FileNotFoundError, match="data.eval_path: no such file"):
        CatBenchPlansDataModule(str(train), str(tmp_path / "missing.jsonl"), cv_folds=2).setup()
    # a missing extra evaluation file names its own key, not data.eval_path
    with pytest.raises(FileNotFoundError, match="data.extra_eval_paths.all_pairs: no such file"):
        CatBenchPlansDataModule(str(train), str(held), extra_eval_paths={"all_pairs": str(tmp_path / "gone.jsonl")},
                                cv_folds=2).setup()


def test_a_test_plan_that_is_a_training_plan_is_an_error(tmp_path):
    train = labelled_plans(read_catbench(write(tmp_path / "t.jsonl", [question(0, 0, 0, 1, "yes")])), "t")
    same = [dict(train[0], plan_id="x", steps=[s.upper().replace(".", " .") for s in STEPS])]  # reformatted steps
    with pytest.raises(ValueError, match="test plan x .* is also the training plan"):
        check_disjoint(train, same, "data.eval_path")
    check_disjoint(train, [{"plan_id": "y", "steps": ["Other."], "title": "cake"}], "data.eval_path")  # a shared title alone is not the same plan
    assert plan_key(["Add salt , then stir ."]) == plan_key(["add salt, then stir."])


# ---------------------------------------------------------------- the baseline and the scores
def test_baseline_answers_both_presentations_alike():
    rng = np.random.default_rng(0)
    emb = [rng.normal(size=(5, 4)) for _ in range(3)]
    plans = [{"labels": [(0, 4, "yes"), (1, 2, "no"), (2, 4, "yes"), (0, 1, "no")]} for _ in emb]
    model = fit_baseline(emb, plans)
    feats = baseline_features(emb[0], 3, 1)
    assert feats[-6:].tolist() == pytest.approx([0.75, 0.25, 0.4, 0.0, 0.25, -1.0])   # u/(n-1), v/(n-1), gap, v last, n/20, sign
    probs = baseline_probs(model, emb[0], [(1, 3), (3, 1)])
    assert probs[0] == pytest.approx(probs[1])


def test_scores_by_hand(tmp_path):
    """Accuracy, P/R/F1 of yes and macro F1 of a small answer set, and the always-yes row, by hand."""
    gold = ["yes", "yes", "yes", "no", "no"]
    pred = ["yes", "no", "yes", "yes", "no"]
    report = binary_report(gold, pred)
    # tp 2, fp 1, fn 1, tn 1: P 2/3, R 2/3, F1 2/3; "no": P 1/2, R 1/2, F1 1/2
    assert report["accuracy"] == pytest.approx(3 / 5) and report["f1"] == pytest.approx(2 / 3)
    assert report["macro_f1"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    always_yes = binary_report(gold, ["yes"] * 5)
    assert always_yes["f1"] == pytest.approx(2 * 3 / (5 + 3)) and always_yes["macro_f1"] == pytest.approx(3 / 8)


@pytest.mark.shared_data
def test_paper_subset_scored_by_hand(shared_data):
    """The 748 paper questions of the sample: 460 yes; always-yes F1 = 2 * 460 / (748 + 460)."""
    from scripts.tools import catbench_eval as module
    questions = read_catbench(shared_data / "catbench" / "test_questions_sample_paper.jsonl")
    assert len(questions) == 748 and sum(q["answer"] == "yes" for q in questions) == 460
    rows = module.score(questions, {})
    yes, no = rows["always yes"], rows["always no"]
    assert yes["accuracy"] == pytest.approx(460 / 748) and yes["f1"] == pytest.approx(920 / 1208)
    assert yes["macro_f1"] == pytest.approx(920 / 1208 / 2) and yes["twin_consistency"] == 1.0 and yes["n_twins"] == 374
    assert no["accuracy"] == pytest.approx(288 / 748) and no["macro_f1"] == pytest.approx(2 * 288 / (748 + 288) / 2)


# ---------------------------------------------------------------- the validation split and the wall
@pytest.mark.shared_data
def test_validation_split_reader(shared_data):
    path = shared_data / "catbench" / "val_questions.jsonl"
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    items = read_catbench(path)
    assert len(items) == len(raw) == 1616 and len({q["pair_id"] for q in items}) == 1616       # ids unique
    assert [q["answer"] for q in items] == [r["label"] for r in raw]                            # labels from the file
    plans = labelled_plans(items, path)
    assert len(plans) == 28 and sum(len(p["labels"]) for p in plans) == 808                     # each pair asked twice
    assert sum(y == "yes" for p in plans for _, _, y in p["labels"]) == 404
    by_pair = {(tuple(r["steps"]), min(r["first_step_idx"], r["second_step_idx"]),
                max(r["first_step_idx"], r["second_step_idx"])): r["label"] for r in raw}
    assert all(by_pair[(tuple(p["steps"]), a, b)] == y for p in plans for a, b, y in p["labels"])


@pytest.mark.shared_data
def test_no_sample_plan_reaches_training_or_model_selection(shared_data):
    data = shared_data / "catbench"
    dm = CatBenchPlansDataModule(str(data / "val_questions.jsonl"), str(data / "test_questions_sample_paper.jsonl"),
                                 {"all_pairs": str(data / "test_questions_sample.jsonl")}, cv_folds=7,
                                 rfg_path=str(shared_data / "rfg" / "r-100"), seed=0)
    dm.setup()
    sample = [json.loads(line) for line in (data / "test_questions_sample.jsonl").read_text(encoding="utf-8").splitlines()]
    sample_recipes = {q["efg_recipe_id"] for q in sample}
    sample_titles = {q["title"] for q in sample}
    sample_steps = {plan_key(q["steps"]) for q in sample}
    assert len(sample_recipes) == len(sample_titles) == len(sample_steps) == 13
    train = dm.items["train"]
    assert sum(p["source"] == "catbench" for p in train) == 28 and sum(p["source"] == "rfg" for p in train) == 87
    assert not {p["efg_recipe_id"] for p in train} & sample_recipes                  # r-FG ids of every training plan
    assert not {p["title"] for p in train if p["source"] == "catbench"} & sample_titles
    assert not {plan_key(p["steps"]) for p in train} & sample_steps                  # the steps themselves
    # model selection sees the training plans only: every fold is made of them
    assert all(len(p["folds"]) == 1 and 0 <= p["folds"][0] < 7 for p in train if p["source"] == "catbench")
    assert {p["set"] for p in dm.items["test"]} == {"catbench", "all_pairs"} and len(dm.items["test"]) == 26
    # an r-FG copy of a validation plan is held out with that plan's fold
    twins = [p for p in train if p["source"] == "rfg" and p["duplicates"]]
    assert len(twins) == 11
    folds = {p["plan_id"]: p["folds"] for p in train}
    assert all(p["folds"] == folds[p["duplicates"]] for p in twins)
    # testing on the training plans is refused
    with pytest.raises(ValueError, match="is also the training plan"):
        CatBenchPlansDataModule(str(data / "val_questions.jsonl"), str(data / "val_questions.jsonl")).setup()


# ---------------------------------------------------------------- the recipe, end to end on tiny files
def tiny_questions(path: Path, plans: range) -> Path:
    rows = []
    for p in plans:
        steps = [f"plan {p} step {i}: " + " ".join(["stir the sauce"] * (1 + (i + p) % 3)) + "." for i in range(5)]
        for i, (a, b) in enumerate(itertools.combinations(range(5), 2)):
            label = "yes" if b == a + 1 or b == 4 else "no"
            for direction in ("before", "after"):
                rows.append(question(p, i, a, b, label, direction, steps=steps, title=f"plan {p}"))
    return write(path, rows)


def test_cross_validation_picks_the_setting_then_the_fit_trains_it(compose_train, tmp_path):
    from conftest import TINY_BERT
    import train

    cfg = compose_train("experiment=teo_plan_head_catbench", f"data.train_path={tiny_questions(tmp_path / 'val.jsonl', range(6))}",
                        f"data.eval_path={tiny_questions(tmp_path / 'test.jsonl', range(6, 8))}", "~data.extra_eval_paths.all_pairs", "data.rfg_path=null",
                        "data.cv_folds=3", "trainer.max_epochs=4", f"model.encoder.config={TINY_BERT}", "model.members=2",
                        "model.cv_grid=[{closure: max},{closure: none, step_dim: 8}]")
    datamodule, model, trainer = train.build(cfg)
    trainer.fit(model, datamodule=datamodule)
    cv = json.loads(Path(cfg.model.cv_file).read_text())
    assert list(cv["rows"]) == ["closure=max", "closure=none, step_dim=8", "logistic regression"]
    assert all(len(row["folds"]) == 3 for row in cv["rows"].values())
    best = max(["closure=max", "closure=none, step_dim=8"], key=lambda n: cv["rows"][n]["macro_f1_mean"])
    assert cv["winner_name"] == best and model.setting == cv["winner"]
    assert float(model.decision_threshold) == pytest.approx(cv["oof_threshold"])
    # the optimiser trained the winner's heads (cross-validation ran before it was built)
    assert {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]} == {id(p) for p in model.ensemble.parameters()}
    torch.manual_seed(cfg.seed)
    fresh = model._build(model.setting)
    assert not torch.allclose(fresh.proj.weight, model.ensemble.proj.weight)
    assert all(not p.requires_grad for p in model.encoder.parameters())
    trainer.test(model, datamodule=datamodule)
    assert model.test_rows["catbench"]["closure head"]["twin_consistency"] == 1.0 and model.test_rows["catbench"]["closure head"]["n"] == 40


def test_blend_settings_share_their_heads_and_mix_in_the_baseline(compose_train, tmp_path, monkeypatch):
    """Grid settings that differ only in ``blend`` train one set of heads per fold; their out-of-fold
    probabilities are (1 - w) head + w baseline, and so are the tested answers' (predictions keep both)."""
    from conftest import TINY_BERT
    import train
    from seqaware.modules import teo_closure_head as mod

    cfg = compose_train("experiment=teo_plan_head_catbench", f"data.train_path={tiny_questions(tmp_path / 'val.jsonl', range(6))}",
                        f"data.eval_path={tiny_questions(tmp_path / 'test.jsonl', range(6, 8))}", "~data.extra_eval_paths.all_pairs",
                        "data.rfg_path=null", "data.cv_folds=3", "trainer.max_epochs=3", f"model.encoder.config={TINY_BERT}",
                        "model.members=2", "model.cv_grid=[{closure: max},{closure: max, blend: 0.25},{closure: max, blend: 1.0}]")
    datamodule, model, trainer = train.build(cfg)
    fits, scored = [], {}
    real_fit, real_scores = model._fit_heads, mod.fold_scores
    monkeypatch.setattr(model, "_fit_heads", lambda *a, **k: fits.append(a[0]) or real_fit(*a, **k))
    monkeypatch.setattr(mod, "fold_scores", lambda folds, metric: scored.setdefault(len(scored), folds) and real_scores(folds, metric))
    trainer.fit(model, datamodule=datamodule)
    assert len(fits) == 3                                   # one fit per fold, shared by the three settings
    head, quarter, lr_only = (scored[i] for i in range(3))
    cv = json.loads(Path(cfg.model.cv_file).read_text())
    assert list(cv["rows"]) == ["closure=max", "closure=max, blend=0.25", "closure=max, blend=1.0", "logistic regression"]
    for (gold, h), (_, q), (_, lr) in zip(head, quarter, lr_only):
        np.testing.assert_allclose(q, 0.75 * h + 0.25 * lr, rtol=1e-6)
    model.setting = dict(model.setting, blend=0.25)         # test the blended answer whatever setting won
    trainer.test(model, datamodule=datamodule)
    rows = [r for r in model.test_predictions if r["set"] == "catbench"]
    tau = float(model.decision_threshold)
    for r in rows:
        assert r["p_dependent"] == pytest.approx(0.75 * r["p_head"] + 0.25 * r["p_lr"])
        assert r["answer"] == ("yes" if r["p_dependent"] >= tau else "no")
    assert model.test_rows["catbench"]["closure head"]["twin_consistency"] == 1.0


def test_bad_blends_are_named():
    from seqaware.modules.teo_closure_head import TeoClosureHeadModule

    encoder, optimizer = {}, {"_target_": "torch.optim.AdamW", "lr": 1e-3}   # refused before anything is built
    with pytest.raises(ValueError, match=r"model.cv_grid\[1\].blend must be in \[0, 1\]"):
        TeoClosureHeadModule(encoder, optimizer, cv_grid=[{}, {"blend": 1.5}])
    with pytest.raises(ValueError, match="model.blend=0.5 blends in the logistic-regression baseline"):
        TeoClosureHeadModule(encoder, optimizer, blend=0.5, logistic_baseline=False)


def test_cross_validation_chooses_the_step_features_like_any_setting(compose_train, tmp_path):
    """model.extra_features adds a frozen text model; the grid's ``features`` picks the model's encoder, the extra
    one or both side by side; each setting's heads read their own features (widths 32, 384, 416), the baseline
    reads model.features; the extra model is not saved in checkpoints and a test from the checkpoint rebuilds it."""
    from conftest import TINY_BERT
    import train
    from seqaware.modules.teo_closure_head import mean_pooled

    cfg = compose_train("experiment=teo_plan_head_catbench", f"data.train_path={tiny_questions(tmp_path / 'val.jsonl', range(6))}",
                        f"data.eval_path={tiny_questions(tmp_path / 'test.jsonl', range(6, 8))}", "~data.extra_eval_paths.all_pairs",
                        "data.rfg_path=null", "data.cv_folds=3", "trainer.max_epochs=3", f"model.encoder.config={TINY_BERT}",
                        "model.members=1", "+model.extra_features.minilm=offline:minilm", "model.features=minilm",
                        "model.cv_grid=[{features: encoder},{features: minilm},{features: encoder+minilm}]",
                        "callbacks.last_checkpoint.every_n_epochs=1")
    datamodule, model, trainer = train.build(cfg)
    fitted = []
    real_fit = model._fit_heads
    model._fit_heads = lambda setting, plans, emb, *a: fitted.append((setting["features"], emb[0].shape[-1])) or real_fit(setting, plans, emb, *a)
    trainer.fit(model, datamodule=datamodule)
    assert {features: width for features, width in fitted} == {"encoder": 32, "minilm": 384, "encoder+minilm": 416}
    cv = json.loads(Path(cfg.model.cv_file).read_text())
    assert list(cv["rows"]) == ["features=encoder", "features=minilm", "features=encoder+minilm", "logistic regression"]
    assert model.ensemble.proj.weight.shape[-2] == model.feature_dim(model.setting["features"])
    # the extra set: MiniLM's own tokenizer and mean pooling, L2-normalised, side by side after the encoder's
    batch = datamodule.collator(datamodule.items["train"][:1])
    both = model.embed(batch, "encoder+minilm")[0]
    extra, tokenizer = model._extra["minilm"]
    tokens = tokenizer(list(batch["meta"][0]["steps"]), padding=True, return_tensors="pt")
    torch.testing.assert_close(both[:, 32:], mean_pooled(extra, tokens["input_ids"], tokens["attention_mask"]))
    torch.testing.assert_close(both[:, :32], model.embed(batch, "encoder")[0])
    ckpt = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert not any("minilm" in key or key.startswith("_extra") for key in ckpt["state_dict"])
    assert ckpt["closure_head"]["setting"]["features"] == model.setting["features"]
    trainer.test(model, datamodule=datamodule)
    expected = model.test_rows["catbench"]["closure head"]
    _, reloaded, tester = train.build(cfg)
    tester.test(reloaded, datamodule=datamodule, ckpt_path=str(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"))
    assert reloaded.setting == model.setting and reloaded.test_rows["catbench"]["closure head"] == expected


def test_unknown_feature_sets_are_named():
    from seqaware.modules.teo_closure_head import TeoClosureHeadModule

    encoder, optimizer = {}, {"_target_": "torch.optim.AdamW", "lr": 1e-3}   # refused before anything is built
    with pytest.raises(ValueError, match=r"model.cv_grid\[1\].features='encoder\+mpnet': unknown feature set\(s\) \['mpnet'\]"):
        TeoClosureHeadModule(encoder, optimizer, cv_grid=[{}, {"features": "encoder+mpnet"}])
    with pytest.raises(ValueError, match="model.features='minilm'"):
        TeoClosureHeadModule(encoder, optimizer, features="minilm")
    with pytest.raises(ValueError, match="model.extra_features: names must not be 'encoder'"):
        TeoClosureHeadModule(encoder, optimizer, extra_features={"encoder": "offline:minilm"})


def test_fine_tuning_the_encoder_starts_every_fold_from_the_pretrained_weights_and_trains_end_to_end(compose_train,
                                                                                                     tmp_path):
    """``model.encoder_lr``: each cross-validation fit fine-tunes a fresh copy of the pretrained encoder on its
    fold's training plans alone, the final fit fine-tunes the module's encoder with the heads (two parameter
    groups), the baseline reads the frozen pretrained features, and the copy stays out of the checkpoint."""
    from conftest import TINY_BERT
    import train
    from seqaware.modules.teo_closure_head import mean_pooled

    cfg = compose_train("experiment=teo_plan_head_catbench", f"data.train_path={tiny_questions(tmp_path / 'val.jsonl', range(6))}",
                        f"data.eval_path={tiny_questions(tmp_path / 'test.jsonl', range(6, 8))}", "~data.extra_eval_paths.all_pairs",
                        "data.rfg_path=null", "data.cv_folds=3", "trainer.max_epochs=3", f"model.encoder.config={TINY_BERT}",
                        "model.members=1", "model.encoder_lr=1e-2", "model.cv_grid=[{closure: max},{closure: none}]",
                        "callbacks.last_checkpoint.every_n_epochs=1")
    datamodule, model, trainer = train.build(cfg)
    pretrained = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    fits = []
    real_fit = model._fit_tuned

    def spy(setting, plans, steps, seed, where):
        start = model._frozen_encoder().state_dict()
        assert all(torch.equal(start[k], v) for k, v in pretrained.items())     # every fit starts pretrained
        ensemble, encoder = real_fit(setting, plans, steps, seed, where)
        fits.append(({p["plan_id"] for p in plans}, any(not torch.equal(encoder.state_dict()[k], v)
                                                        for k, v in pretrained.items())))
        return ensemble, encoder

    model._fit_tuned = spy
    trainer.fit(model, datamodule=datamodule)
    assert len(fits) == 6 and all(tuned for _, tuned in fits)                  # 3 folds x 2 settings, each fine-tuned
    assert sorted(len(plans) for plans, _ in fits) == [4] * 6                  # 6 plans, 3 folds: 4 to train on
    cv = json.loads(Path(cfg.model.cv_file).read_text())
    assert list(cv["rows"]) == ["closure=max", "closure=none", "logistic regression"]
    groups = trainer.optimizers[0].param_groups
    assert [g["lr"] for g in groups] == [cfg.model.optimizer.lr, 1e-2]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in model.encoder.parameters()}
    assert any(not torch.equal(model.encoder.state_dict()[k], v) for k, v in pretrained.items())   # the fit tuned it
    batch = datamodule.collator(datamodule.items["train"][:1])
    frozen = mean_pooled(model._pretrained[0], batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(model.embed(batch, "encoder")[0], frozen)      # the baseline's features: pretrained
    model.eval()
    assert not torch.allclose(model.head_features(batch)[0], frozen)          # the heads': the fine-tuned encoder's
    ckpt = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert set(ckpt["state_dict"]) == set(model.state_dict()) and not any("_pretrained" in k for k in ckpt["state_dict"])
    trainer.test(model, datamodule=datamodule)
    rows = model.test_rows["catbench"]
    assert rows["closure head"]["twin_consistency"] == 1.0 and rows["closure head"]["n"] == 40
    _, reloaded, tester = train.build(cfg)                                   # tested from the checkpoint
    tester.test(reloaded, datamodule=datamodule, ckpt_path=str(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"))
    assert reloaded.test_rows["catbench"]["closure head"] == rows["closure head"]


def test_fine_tuning_settings_are_checked():
    from seqaware.modules.teo_closure_head import TeoClosureHeadModule

    encoder, optimizer = {}, {"_target_": "torch.optim.AdamW", "lr": 1e-3}   # refused before anything is built
    with pytest.raises(ValueError, match=r"^model.encoder_lr must be a positive learning rate or null \(frozen\), got 0$"):
        TeoClosureHeadModule(encoder, optimizer, encoder_lr=0)
    with pytest.raises(ValueError, match=r"^model.encoder_lr=2e-05 fine-tunes the module's encoder, so the heads read "
                                         r"features 'encoder' alone; got model.cv_grid\[1\].features='encoder\+mpnet'$"):
        TeoClosureHeadModule(encoder, optimizer, encoder_lr=2e-5, extra_features={"mpnet": "offline:mpnet"},
                             cv_grid=[{}, {"features": "encoder+mpnet"}])


# ---------------------------------------------------------------- progress of the cross-validation, and SIGTERM in it
def _tiny_catbench(tmp_path, *extra: str) -> list[str]:
    from conftest import TINY_BERT

    return ["experiment=teo_plan_head_catbench", f"data.train_path={tiny_questions(tmp_path / 'val.jsonl', range(6))}",
            f"data.eval_path={tiny_questions(tmp_path / 'test.jsonl', range(6, 8))}", "~data.extra_eval_paths.all_pairs",
            "data.rfg_path=null", "data.cv_folds=3", f"model.encoder.config={TINY_BERT}", "model.members=1",
            "model.encoder_lr=1e-2", *extra]          # hparams=catbench_finetune's path: the encoder fine-tunes in every fit


def test_cross_validation_logs_each_fit_with_a_forecast_for_the_rest(compose_train, tmp_path, monkeypatch, caplog):
    """One line per fit as it ends (3 folds x 2 settings; the blend-only third setting shares the second's fits),
    on a clock that advances 1.5 s a reading: every fit takes 1.5 s, and the rest is forecast at that pace."""
    import logging

    import train
    from seqaware.modules.teo_closure_selection import CVProgress

    readings = iter(range(10 ** 6))
    monkeypatch.setattr(CVProgress, "clock", staticmethod(lambda: 1.5 * next(readings)))
    cfg = compose_train(*_tiny_catbench(tmp_path, "trainer.max_epochs=2",
                                        "model.cv_grid=[{closure: max},{closure: none},{closure: none, blend: 0.5}]"))
    datamodule, model, trainer = train.build(cfg)
    with caplog.at_level(logging.INFO, logger="seqaware.modules.teo_closure_selection"):
        trainer.fit(model, datamodule=datamodule)
    lines = [r.getMessage() for r in caplog.records if r.name == "seqaware.modules.teo_closure_selection"]
    assert lines == [
        "cross-validation: 3 setting(s) x 3 fold(s): 6 fits of 2 steps (settings that differ only in blend share theirs)",
        "fold 1/3 of setting 1/3 took 1.5 s; forecast 0.1 min for the rest (5 fits)",
        "fold 1/3 of setting 2/3 took 1.5 s; forecast 0.1 min for the rest (4 fits)",
        "fold 2/3 of setting 1/3 took 1.5 s; forecast 0.1 min for the rest (3 fits)",
        "fold 2/3 of setting 2/3 took 1.5 s; forecast 0.1 min for the rest (2 fits)",
        "fold 3/3 of setting 1/3 took 1.5 s; forecast 0.0 min for the rest (1 fit)",
        "fold 3/3 of setting 2/3 took 1.5 s; cross-validation fits done"]


def test_progress_names_repetitions_and_forecasts_from_the_mean_fit_time(monkeypatch, caplog):
    import logging

    from seqaware.modules.teo_closure_selection import CVProgress

    times = iter([0.0, 10.0, 10.0, 40.0])            # __init__ (the first fit's start), fitted; start, fitted
    monkeypatch.setattr(CVProgress, "clock", staticmethod(lambda: next(times)))
    with caplog.at_level(logging.INFO, logger="seqaware.modules.teo_closure_selection"):
        progress = CVProgress(settings=2, folds=[5, 5], fits_per_fold=2, steps=100)
        assert progress.fitted(1, 0, 0) == ("fold 1/5 of repetition 1/2 of setting 2/2 took 10.0 s; forecast 3.2 min "
                                            "for the rest (19 fits)")
        progress.start()
        assert progress.fitted(0, 4, 1) == ("fold 5/5 of repetition 2/2 of setting 1/2 took 30.0 s; forecast 6.0 min "
                                            "for the rest (18 fits)")
    assert caplog.messages[0] == "cross-validation: 2 setting(s) x 10 fold(s) over 2 repetitions: 20 fits of 100 steps"


def test_a_signal_in_setup_stops_the_run_interrupted_in_process(compose_train, tmp_path, monkeypatch, capsys):
    """train.run as train.py runs it: SIGTERM (sent by the second cross-validation fit to its own process) raises
    Lightning's SIGTERMException there; run.json says interrupted, signal 15, no checkpoint; no more fits run, and
    the process's own handlers are back afterwards."""
    import os
    import signal

    import train
    from seqaware import runs
    from seqaware.modules.teo_closure_head import TeoClosureHeadModule

    fits = []
    real_fit = TeoClosureHeadModule._fit_tuned

    def fit_then_signal(self, *args, **kwargs):
        fits.append(len(fits))
        out = real_fit(self, *args, **kwargs)
        if len(fits) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(TeoClosureHeadModule, "_fit_tuned", fit_then_signal)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    cfg = compose_train(*_tiny_catbench(tmp_path, "trainer.max_epochs=2", "model.cv_grid=[{closure: max},{closure: none}]"))
    with pytest.raises(SystemExit) as stop:
        train.run(cfg)
    assert stop.value.code == 128 + 15 and len(fits) == 2
    state = runs.read_state(cfg.paths.output_dir)
    assert (state["status"], state["signal"], state["checkpoint"]) == ("interrupted", 15, None)
    assert not (Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt").exists()
    assert "interrupted by signal 15; no checkpoint was saved" in capsys.readouterr().err
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == before


@pytest.mark.slow  # a train.py process: about 8 s of CPU
def test_sigterm_during_the_cross_validation_leaves_the_run_interrupted(tmp_path, cache_dir):
    """The cross-validation runs in setup, before Lightning's signal handling: a SIGTERM there (sent once the first
    fit's progress line is out) stops the run at once with exit 143 and run.json ``interrupted`` (signal 15, no
    checkpoint: nothing trained yet), not a dead process whose run.json still says ``running``."""
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    run_dir = tmp_path / "run"
    command = [sys.executable, str(root / "train.py"),
               *_tiny_catbench(tmp_path, "trainer.max_epochs=60", "model.cv_grid=[{closure: max},{closure: none}]"),
               f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache_dir}", "callbacks.progress_bar.refresh_rate=0"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = []
    for line in child.stdout:
        out.append(line)
        if "fold 1/3 of setting 1/2 took" in line:
            child.send_signal(signal.SIGTERM)
            break
    out.append(child.communicate(timeout=300)[0])
    text = "".join(out)
    assert child.returncode == 128 + 15, text[-3000:]
    state = json.loads((run_dir / "run.json").read_text())
    assert (state["status"], state["signal"], state["checkpoint"]) == ("interrupted", 15, None)
    assert "received signal 15 before training started (setup): stopping; nothing was trained, so no checkpoint is " \
           "saved" in text
    assert "interrupted by signal 15; no checkpoint was saved" in text
    assert "fold 3/3" not in text and not (run_dir / "checkpoints" / "last.ckpt").exists()
