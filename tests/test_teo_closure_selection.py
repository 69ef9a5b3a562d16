"""The closure head's model selection as a user sees it: the decision rule of the fold scores, the
out-of-fold threshold (every repetition, the configured metric), the run's seed, what ``setup`` encodes,
checkpoints from before blends, and the CaT-Bench tables logged at test end (builders and the refusals:
tests/test_teo_selection.py)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from test_teo_selection import CvWorld, SimpleTrainer, capture_logs, closure_test_records, tiny_closure_head


# ---------------------------------------------------------------- fold scores
def test_a_fold_probability_at_the_threshold_is_a_yes():
    """Yes when p >= threshold, as at test time and in choose_threshold: each fold is answered at 0.5 (every
    threshold in (0.1, 0.9] and in (0.4, 0.5] separates the other fold; 0.5 is the one closest to 0.5), and
    fold 1's 0.5 is a yes."""
    from seqaware.modules.teo_closure_head import fold_scores

    folds = [(["yes", "no"], np.array([0.9, 0.1])), (["yes", "no"], np.array([0.5, 0.4]))]
    perfect = {"accuracy": 1.0, "f1": 1.0, "macro_f1": 1.0, "threshold": 0.5}
    assert fold_scores(folds) == [perfect, perfect]


# ---------------------------------------------------------------- the out-of-fold threshold
def stand_in_heads(world, monkeypatch, probability):
    """Heads whose probability of each held-out labelled pair is ``probability(held plan ids, plan id, a, b)``."""
    monkeypatch.setattr(world.model, "_fit_heads", lambda setting, plans, embeddings, steps, seed, where: "heads")
    monkeypatch.setattr(world.model, "_predict", lambda heads, plans, embeddings: np.array(
        [probability([p["plan_id"] for p in plans], p["plan_id"], a, b) for p in plans for a, b, _ in p["labels"]]))


def test_the_threshold_is_chosen_on_the_out_of_fold_probabilities_of_every_repetition(monkeypatch, tmp_path):
    """Two repetitions of the folds (tests/test_teo_selection.py's CV_PLANS): the first repetition's heads say
    yes 0.9 / no 0.7, the second's yes 0.9 / no 0.2.  Pooled, only thresholds in (0.7, 0.9] separate yes from
    no, and 0.71 is the one closest to 0.5 (the second repetition alone would give 0.5)."""
    world = CvWorld(monkeypatch, tmp_path, cv_grid=[{}], logistic_baseline=False, cv_file=None)
    first_repetition = (["p0", "p1"], ["p2", "p3"])          # its held-out folds; the second holds out p0+p2, p1+p3
    labels = {(p["plan_id"], a, b): y for p in world.plans for a, b, y in p["labels"]}
    stand_in_heads(world, monkeypatch, lambda held, plan, a, b: 0.9 if labels[plan, a, b] == "yes"
                   else (0.7 if held in first_repetition else 0.2))
    world.model.setup("fit")
    report = world.model.cv_report
    assert report["repeats"] == 2 and len(report["rows"]["defaults"]["folds"]) == 4
    assert report["oof_threshold"] == 0.71 and float(world.model.decision_threshold) == pytest.approx(0.71)


# yes pairs: 3 at 0.9, 2 at 0.3; no pairs: 3 at 0.6, 3 at 0.1 (every repetition holds each plan out once).
# At t in (0.6, 0.9]: F1 yes 6/8, F1 no 12/14 (macro 0.80), 2 errors; at (0.1, 0.3]: F1 yes 10/13 (0.77),
# F1 no 6/9 (macro 0.72), 3 errors; in between worse.  F1 of yes picks 0.3, macro F1 and accuracy 0.61.
LOW_YES = {("p0", 1, 2), ("p2", 0, 1)}
HIGH_NO = {("p1", 0, 1), ("p1", 1, 2), ("p3", 0, 1)}


@pytest.mark.parametrize("metric, tau", [("f1", 0.3), ("macro_f1", 0.61), ("accuracy", 0.61)])
def test_the_out_of_fold_threshold_maximises_the_configured_metric(monkeypatch, tmp_path, metric, tau):
    world = CvWorld(monkeypatch, tmp_path, cv_grid=[{}], cv_metric=metric, logistic_baseline=False, cv_file=None)
    labels = {(p["plan_id"], a, b): y for p in world.plans for a, b, y in p["labels"]}
    stand_in_heads(world, monkeypatch, lambda held, plan, a, b: (0.3 if (plan, a, b) in LOW_YES else 0.9)
                   if labels[plan, a, b] == "yes" else (0.6 if (plan, a, b) in HIGH_NO else 0.1))
    world.model.setup("fit")
    assert world.model.cv_report["metric"] == metric and world.model.cv_report["oof_threshold"] == tau
    assert float(world.model.decision_threshold) == pytest.approx(tau)


# ---------------------------------------------------------------- the run's seed
def test_the_run_seed_decides_the_heads_and_the_same_seed_repeats_them(monkeypatch, tmp_path):
    """The cross-validation leaves the global random stream alone, so the winner's heads are drawn from the
    run's seed: the same seed gives the same heads, each other seed (a sweep over seeds 0..99, say) its own."""
    heads = []
    for seed in (1, 1, 2, 63):
        world = CvWorld(monkeypatch, tmp_path, cv_file=None)
        torch.manual_seed(seed)
        world.model.setup("fit")
        heads.append(world.model.ensemble.proj.weight.detach().clone())
    assert torch.equal(heads[0], heads[1])
    assert not any(torch.equal(x, y) for x, y in [(heads[0], heads[2]), (heads[0], heads[3]), (heads[2], heads[3])])


# ---------------------------------------------------------------- what setup encodes
class FakeTextModel(torch.nn.Identity):
    hidden_size = 32


@pytest.mark.parametrize("trainer, requested", [
    (SimpleTrainer(), [("encoder", "minilm")]),                    # a fresh fit: the grid's features too
    (SimpleTrainer(ckpt_path="last.ckpt"), [("encoder",)]),        # resumed: no selection, the baseline's only
])
def test_setup_encodes_the_grid_features_only_when_it_cross_validates(monkeypatch, tmp_path, trainer, requested):
    """An extra feature model (mpnet, MiniLM, ...) named by the grid only is never run over the training plans
    when a resumed fit keeps its checkpoint's setting."""
    from seqaware.modules import teo_closure_head as mod

    monkeypatch.setattr(mod, "TextEncoder", lambda name_or_path: FakeTextModel())
    monkeypatch.setattr(mod, "load_tokenizer", lambda weights, config_key=None: None)
    world = CvWorld(monkeypatch, tmp_path, extra_features={"minilm": "offline:minilm"}, cv_file=None,
                    cv_grid=[{"features": "minilm", "dropout": 0.5}, {}])
    world.model.trainer = trainer
    world.model.setup("fit")
    assert world.requested == requested
    assert world.model.baseline == "lr"


def test_a_data_module_without_a_batch_size_is_cross_validated(monkeypatch, tmp_path):
    """Only a data module that batches (``batch_size`` not None) is refused; one without the attribute
    gives every plan at once."""
    world = CvWorld(monkeypatch, tmp_path, cv_file=None)
    world.model.trainer.datamodule = SimpleNamespace()
    world.model.setup("fit")
    assert world.model.cv_report["winner_name"] == "defaults" and len(world.fits) == 8


# ---------------------------------------------------------------- testing
def test_a_checkpoint_from_before_blends_answers_from_the_head_alone():
    """A checkpoint whose setting has no ``blend`` (saved before blends existed) tests the head's own
    probabilities, although a baseline is fitted."""
    import json

    model = tiny_closure_head(threshold=0.625, members=2)
    model.on_load_checkpoint({"closure_head": {"setting": {"members": 1, "rfg_weight": 1.0, "dropout": 0.2},
                                               "cv_report": json.dumps({})}})
    assert model.setting == {"features": "encoder", "members": 1, "rfg_weight": 1.0, "dropout": 0.2}
    assert model.ensemble.members == 1
    model.baseline = "lr"
    capture_logs(model)
    model._eval_records = closure_test_records()
    model.on_test_epoch_end()
    assert [(p["id"], p["p_dependent"], p["answer"]) for p in model.test_predictions] == [
        ("q1", 0.8, "yes"), ("q2", 0.8, "yes"), ("q3", 0.5, "no"), ("q4", 0.9, "yes"), ("q5", 0.8, "yes"),
        ("a1", 0.2, "no"), ("a2", 0.2, "no")]


def test_the_catbench_table_of_every_question_file_is_logged(caplog):
    from seqaware.metrics.classification import format_table
    from seqaware.modules.teo_closure_head import TABLE_COLUMNS

    model = tiny_closure_head(threshold=0.6, members=1)
    model.baseline = "lr"
    capture_logs(model)
    model._eval_records = closure_test_records()
    with caplog.at_level("INFO", logger="seqaware.modules.teo_closure_head"):
        model.on_test_epoch_end()
    for name in ("catbench", "all_pairs"):
        table = format_table(model.test_rows[name], TABLE_COLUMNS)
        assert f"CaT-Bench questions '{name}' (threshold 0.60):\n{table}" in caplog.messages
    assert "| closure head |" in table and "| logistic regression |" in table
