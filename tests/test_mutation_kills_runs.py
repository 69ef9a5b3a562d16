"""Run folders (seqaware/runs.py) where mutation testing found behaviour no test pinned (docs/mutation.md): the
best-checkpoint tracking left after tracked checkpoints are lost, which callback state a test-only run reads, and
the rewrite of Hydra's saved config."""
from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from seqaware import runs

KEY = "ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max'}"


# ---------------------------------------------------------------------------------------------- _forget
def _state(best: str, kth: str, last: str, scores: dict[str, float], best_score: float | None = None) -> dict:
    state = {"best_k_models": dict(scores), "best_model_path": best, "kth_best_model_path": kth,
             "kth_value": scores.get(kth), "last_model_path": last}
    if best_score is not None:
        state["best_model_score"] = best_score
    return state


SCORES = {"a": 0.1, "b": 0.7, "c": 0.4, "d": 0.9}


@pytest.mark.parametrize("mode", ["max", None])     # None: read from the recorded best score (0.9, the highest)
def test_losing_the_best_and_the_kth_of_a_max_run(mode):
    state = _state("d", "a", "d", SCORES, best_score=0.9)
    runs._forget(state, ["d", "a"], mode)
    assert state == {"best_k_models": {"b": 0.7, "c": 0.4}, "best_model_path": "b", "best_model_score": 0.7,
                     "kth_best_model_path": "c", "kth_value": 0.4, "last_model_path": ""}


@pytest.mark.parametrize("mode", ["min", None])     # None: 0.1 is below what is left: a min run
def test_losing_the_best_and_the_kth_of_a_min_run(mode):
    state = _state("a", "d", "b", SCORES, best_score=0.1)
    runs._forget(state, ["a", "d"], mode)
    assert state == {"best_k_models": {"b": 0.7, "c": 0.4}, "best_model_path": "c", "best_model_score": 0.4,
                     "kth_best_model_path": "b", "kth_value": 0.7, "last_model_path": "b"}


def test_a_given_mode_wins_over_the_recorded_score():
    state = _state("a", "d", "", SCORES)                  # no best score recorded: read alone, it would say max
    runs._forget(state, ["a", "d"], "min")
    assert (state["best_model_path"], state["kth_best_model_path"]) == ("c", "b")
    state = _state("d", "a", "", SCORES, best_score=0.0)  # a score below everything left: read alone, min
    runs._forget(state, ["d", "a"], "max")
    assert (state["best_model_path"], state["kth_best_model_path"]) == ("b", "c")


def test_a_best_score_tied_with_one_left_is_still_a_max_run():
    state = _state("d", "a", "", {**SCORES, "b": 0.9}, best_score=0.9)   # equal val metrics are common
    runs._forget(state, ["d"], None)
    assert state["best_model_path"] == "b" and state["best_model_score"] == 0.9


def test_losing_every_tracked_checkpoint_empties_the_tracking():
    state = _state("d", "a", "d", {"a": 0.1, "d": 0.9}, best_score=0.9)
    runs._forget(state, ["a", "d"], "max")
    assert {k: state[k] for k in ("best_k_models", "best_model_path", "best_model_score", "kth_best_model_path",
                                  "last_model_path")} == {
        "best_k_models": {}, "best_model_path": "", "best_model_score": None, "kth_best_model_path": "",
        "last_model_path": ""}


# ---------------------------------------------------------------------------------------------- rehome_checkpoint
def test_resuming_a_best_checkpoint_whose_runs_last_checkpoint_is_gone_drops_that_last_checkpoint(tmp_path, caplog):
    """ckpt_path=<run>/checkpoints/best.ckpt, its run's last.ckpt deleted: that last.ckpt is found nowhere, so it
    is named as lost and dropped (last_model_path ""), although the new folder's last.ckpt is written under the same
    name; only the file being resumed counts as written there."""
    old, new_ck = tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"
    old.mkdir(parents=True)
    best, lost = old / "best.ckpt", old / "last.ckpt"
    state = {"dirpath": str(old), "monitor": "val/acc", "best_model_score": 0.9, "best_model_path": str(best),
             "kth_best_model_path": str(best), "kth_value": 0.9, "last_model_path": str(lost),
             "best_k_models": {str(best): 0.9}}
    torch.save({"global_step": 4, "callbacks": {KEY: state}}, best)
    with caplog.at_level(logging.WARNING, logger="seqaware.runs"):
        resumed = runs.rehome_checkpoint(best, [SimpleNamespace(state_key=KEY, dirpath=str(new_ck), mode="max")],
                                         tmp_path / "b")
    assert resumed == str(new_ck / "last.ckpt")
    assert sorted(p.name for p in new_ck.iterdir()) == ["best.ckpt", "last.ckpt"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{best}: the checkpoint(s) {[str(lost)]} that {KEY} tracked (best_model_path, best_k_models) are neither "
        f"where the run left them, nor beside it, nor in {new_ck}: 'best' now ranks only what is left and what this "
        f"run saves from here on, and the test may use a later checkpoint. Copy them into {new_ck} to keep them"]
    assert torch.load(resumed, weights_only=True)["callbacks"][KEY] == {
        "dirpath": str(new_ck), "monitor": "val/acc", "best_model_score": 0.9,
        "best_model_path": str(new_ck / "best.ckpt"), "kth_best_model_path": str(new_ck / "best.ckpt"),
        "kth_value": 0.9, "last_model_path": "", "best_k_models": {str(new_ck / "best.ckpt"): 0.9}}


# ---------------------------------------------------------------------------------------------- checkpoint_to_test
def test_a_test_only_run_reads_only_the_state_of_a_monitoring_callback(tmp_path):
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    for name in ("best.ckpt", "epoch_3.ckpt"):
        (ck / name).write_bytes(b"x")
    last_only = "ModelCheckpoint{'monitor': None}"
    # a checkpoint callback without a metric records its latest file as its "best"
    torch.save({"callbacks": {last_only: {"monitor": None, "best_model_path": str(ck / "epoch_3.ckpt")},
                              KEY: {"monitor": "val/acc", "best_model_path": str(ck / "best.ckpt")}}}, ck / "last.ckpt")
    callbacks = [SimpleNamespace(), SimpleNamespace(state_key=last_only, monitor=None),   # e.g. a progress bar first
                 SimpleNamespace(state_key=KEY, monitor="val/acc")]
    assert runs.checkpoint_to_test(ck / "last.ckpt", callbacks)[0] == str(ck / "best.ckpt")


# ---------------------------------------------------------------------------------------------- rewrite_saved_config
@pytest.fixture
def hydra_run(monkeypatch, tmp_path):
    """A Hydra run config with its output folder in ``tmp_path`` made current (``subdir``: hydra.output_subdir)."""
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    monkeypatch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)   # restored afterwards

    def make(subdir: str | None = ".hydra"):
        cfg = OmegaConf.structured({"hydra": HydraConf})
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(tmp_path)
            cfg.hydra.output_subdir = subdir
        HydraConfig.instance().set_config(cfg)

    return make


def test_the_saved_config_is_rewritten_with_the_config_as_it_is_now(hydra_run, tmp_path):
    hydra_run()
    saved = tmp_path / ".hydra" / "config.yaml"
    saved.parent.mkdir()
    saved.write_text("trainer:\n  max_epochs: 1\n")
    cfg = OmegaConf.create({"trainer": {"max_epochs": 7, "max_steps": 100}})
    assert runs.rewrite_saved_config(cfg) == saved
    assert OmegaConf.load(saved) == cfg


def test_no_saved_config_is_written_where_hydra_saved_none(hydra_run, tmp_path, monkeypatch):
    cfg = OmegaConf.create({"seed": 1})
    hydra_run()
    assert runs.rewrite_saved_config(cfg) is None                  # the job's folder holds no .hydra/config.yaml
    assert not (tmp_path / ".hydra").exists()
    hydra_run(subdir=None)                                         # hydra.output_subdir=null
    (tmp_path / "None").mkdir()
    (tmp_path / "None" / "config.yaml").write_text("seed: 0\n")
    assert runs.rewrite_saved_config(cfg) is None
    assert (tmp_path / "None" / "config.yaml").read_text() == "seed: 0\n"
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)       # outside a Hydra job
    assert runs.rewrite_saved_config(cfg) is None
