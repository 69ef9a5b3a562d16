"""The OmegaConf resolvers and ``train.py --help``'s groups (seqaware/config.py) where mutation testing found
behaviour no test pinned (docs/mutation.md).  ``register_resolvers`` runs when the module is imported, so the
tests here clear the resolvers and register them again, as a process that has none yet does."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seqaware.config import PROJECT_ROOT, auto_precision, help_groups, register_resolvers

NAMES = ("project_root", "uses_text", "uses_images", "auto_precision", "inference_mode", "help_groups",
         "checkpoint_monitor", "checkpoint_mode", "run_dir")


@pytest.fixture
def fresh_resolvers():
    """The resolvers as ``register_resolvers()`` registers them in a process without any (and again after)."""
    for name in NAMES:
        OmegaConf.clear_resolver(name)
    try:
        register_resolvers()
        yield
    finally:
        for name in NAMES:
            OmegaConf.clear_resolver(name)
        register_resolvers()


def resolve(**values):
    return OmegaConf.to_container(OmegaConf.create(values), resolve=True)


def test_every_resolver_is_registered_once_and_a_second_call_changes_nothing(fresh_resolvers):
    assert all(OmegaConf.has_resolver(name) for name in NAMES)
    register_resolvers()   # idempotent: registered names are left alone (OmegaConf refuses a second registration)
    assert resolve(root="${project_root:}") == {"root": str(PROJECT_ROOT)}


def test_the_modality_resolvers(fresh_resolvers):
    got = resolve(**{f"{what}_{m}": f"${{uses_{what}:{m}}}" for what in ("text", "images")
                     for m in ("text", "image", "multimodal")})
    assert got == {"text_text": True, "text_image": False, "text_multimodal": True,
                   "images_text": False, "images_image": True, "images_multimodal": True}
    with pytest.raises(Exception, match=r"modality must be one of \('text', 'image', 'multimodal'\), got 'audio'"):
        resolve(x="${uses_text:audio}")


def test_the_trainer_and_checkpoint_resolvers(fresh_resolvers):
    target = "seqaware.modules.berson.BersonModule"
    assert resolve(gpu="${auto_precision:gpu}", cpu="${auto_precision:cpu}", eager="${inference_mode:false}",
                   compiled="${inference_mode:true}", monitor=f"${{checkpoint_monitor:{target}}}",
                   mode=f"${{checkpoint_mode:{target}}}", pretrain_mode="${checkpoint_mode:"
                   "seqaware.modules.pretraining.PretrainingModule}") == {
        "gpu": "bf16-mixed", "cpu": auto_precision("cpu"), "eager": True, "compiled": False, "monitor": "val/pmr",
        "mode": "max", "pretrain_mode": "min"}
    assert resolve(h="${help_groups:}") == {"h": help_groups()}


def test_the_run_folder_resolver_is_read_once_per_config(fresh_resolvers, tmp_path):
    cfg = OmegaConf.create({"named": f"${{run_dir:{tmp_path},first}}", "new": f"${{run_dir:{tmp_path}}}"})
    assert cfg.named == str(tmp_path / "first")
    folder = cfg.new
    assert cfg.new == folder and Path(folder).parent == tmp_path and Path(folder).is_dir()
    assert [p.name for p in tmp_path.iterdir()] == [Path(folder).name]   # one folder reserved, not one per read


def test_help_lists_the_groups_a_user_picks_hydras_last(tmp_path):
    for path in ("train.yaml", "hydra/default.yaml", "hydra/launcher/local.yaml", "hydra/sweeper/seqaware_optuna.yaml",
                 "experiment/b.yaml", "experiment/a.yaml", "experiment_base/x.yaml", "data/base.yaml", "data/roc.yaml",
                 "model/common/x.yaml", "model/berson.yaml", "zeta/one.yaml"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}\n")
    assert help_groups(tmp_path).splitlines() == [
        "data: roc", "experiment: a, b", "model: berson", "zeta: one",
        "hydra/launcher: basic, local", "hydra/sweeper: basic, seqaware_optuna"]
