"""The metric a best checkpoint is chosen on (seqaware/monitor.py): every module declares it, the checkpoint
callback takes it by default, and a configured monitor the module does not log is refused before training."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint

import train
from seqaware.modules.base import SeqawareModule
from seqaware.monitor import MODES, MonitorCheck, declared_monitor

ROOT = Path(__file__).resolve().parents[1]


def module_classes() -> list[type]:
    """Every Lightning module class of seqaware/modules/ (its modules imported), defined there."""
    import seqaware.modules as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"seqaware.modules.{info.name}")
    found, todo = [], [SeqawareModule]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("seqaware.modules.") and not inspect.isabstract(sub):
                found.append(sub)
    return sorted(set(found), key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_every_module_declares_its_checkpoint_metric_and_direction():
    classes = module_classes()
    names = {c.__name__ for c in classes}
    assert {"PairwiseSequencingModule", "BersonModule", "PretrainingModule", "TeoHeadModule", "TeoPlanHeadModule",
            "TeoLoraModule", "TeoClosureHeadModule"} <= names
    for cls in classes:
        target = f"{cls.__module__}.{cls.__qualname__}"
        monitor, mode = declared_monitor(target)
        assert monitor is None or monitor.startswith("val/"), target
        assert mode in MODES and (monitor, mode) == (cls.monitor, cls.monitor_mode), target


class NoMonitor:
    """A module class that declares nothing."""


class SideWays:
    monitor = "val/acc"
    monitor_mode = "up"


def test_a_class_without_a_declaration_or_with_another_mode_is_an_error_naming_what_to_set():
    with pytest.raises(ValueError) as err:
        declared_monitor(f"{__name__}.NoMonitor")
    assert str(err.value) == (f"{__name__}.NoMonitor declares no checkpoint metric: give the class `monitor` (a "
                              "validation metric it logs, or None) and `monitor_mode` (max | min), or set "
                              "callbacks.model_checkpoint.monitor and callbacks.model_checkpoint.mode")
    with pytest.raises(ValueError) as err:
        declared_monitor(f"{__name__}.SideWays")
    assert str(err.value) == f"{__name__}.SideWays.monitor_mode must be one of ('max', 'min'), got 'up'"


@pytest.mark.parametrize("overrides", [["model=order_baseline"], ["model=berson"], ["model=pretrain"],
                                       ["model=teo_head"], ["model=teo_plan_head"], ["model=internvl_tiny"],
                                       ["model=teo_closure_head"]], ids=lambda o: o[0])
def test_the_best_checkpoint_takes_the_models_own_metric_unless_the_config_sets_one(compose_train, overrides):
    cfg = compose_train(*overrides)
    checkpoint = cfg.callbacks.model_checkpoint
    assert (checkpoint.monitor, checkpoint.mode) == declared_monitor(cfg.model._target_)
    assert OmegaConf.to_container(cfg.callbacks, resolve=True)["model_checkpoint"]["monitor"] == checkpoint.monitor
    set_here = compose_train(*overrides, "callbacks.model_checkpoint.monitor=val/loss", "callbacks.model_checkpoint.mode=min")
    assert (set_here.callbacks.model_checkpoint.monitor, set_here.callbacks.model_checkpoint.mode) == ("val/loss", "min")


def test_the_experiments_keep_the_metrics_they_chose():
    """Behaviour unchanged: each shipped experiment monitors what it did before the default came from the model."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    expected = {"order_baseline": ("val/pmr", "max"), "berson_finetune": ("val/pmr", "max"),
                "berson_roc": ("val/pmr", "max"), "roberta_pretrain": ("val/loss", "min"),
                "clipvil_pretrain": ("val/loss", "min"), "visualbert_pretrain": ("val/loss", "min"),
                "clip_image_pretrain": ("val/loss", "min"), "teo_head_rfg": ("val/teo_consistency_accuracy", "max"),
                "teo_head_synthetic": ("val/teo_consistency_accuracy", "max"),
                "teo_lora_internvl": ("val/teo_consistency_accuracy", "max"),
                "teo_lora_modalities": ("val/teo_consistency_accuracy", "max"),
                "teo_lora_synthetic": ("val/teo_consistency_accuracy", "max"),
                "teo_plan_head_rfg": ("val/pair_macro_f1", "max"), "teo_plan_head_synthetic": ("val/pair_macro_f1", "max"),
                "teo_plan_head_catbench": None}   # no validation: no best checkpoint
    assert sorted(expected) == sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        for name, monitored in expected.items():
            checkpoint = compose(config_name="train.yaml", overrides=[f"experiment={name}"]).callbacks.model_checkpoint
            assert (None if checkpoint is None else (checkpoint.monitor, checkpoint.mode)) == monitored, name
    GlobalHydra.instance().clear()


def test_a_monitor_the_model_does_not_log_fails_before_the_first_training_step(compose_train, monkeypatch):
    from hydra.utils import instantiate

    from seqaware.modules.sequencing import PairwiseSequencingModule

    def no_step(self, batch, batch_idx):
        raise AssertionError("a training step ran")

    monkeypatch.setattr(PairwiseSequencingModule, "training_step", no_step)
    cfg = compose_train("experiment=order_baseline", "trainer.max_steps=2",
                        "callbacks.model_checkpoint.monitor=val/teo_consistency_accuracy")
    with pytest.raises(ValueError) as err:
        train.run(cfg)
    logged = instantiate(cfg.model).validation_metrics()
    assert "val/pmr" in logged and "val/loss" in logged and "val/tau" in logged
    assert str(err.value) == (
        "callbacks.model_checkpoint.monitor=val/teo_consistency_accuracy: PairwiseSequencingModule does not log it, so "
        f"no best checkpoint could be chosen; it logs {', '.join(logged)}. Set callbacks.model_checkpoint.monitor to one "
        "of them, or drop the setting: the default is the model's own (val/pmr)")


def test_the_check_passes_logged_training_and_unset_monitors_and_modules_that_list_nothing():
    module = SimpleNamespace(validation_metrics=lambda: ["val/loss", "val/acc"])
    checkpoints = [ModelCheckpoint(monitor="val/acc"), ModelCheckpoint(monitor="train/loss"), ModelCheckpoint(monitor=None)]
    check = MonitorCheck()
    check.setup(SimpleNamespace(callbacks=checkpoints), module, "fit")
    check.setup(SimpleNamespace(callbacks=[ModelCheckpoint(monitor="val/pmr")]), module, "test")   # only fits are checked
    check.setup(SimpleNamespace(callbacks=[ModelCheckpoint(monitor="val/pmr")]), object(), "fit")  # no list: not checked
    with pytest.raises(ValueError, match=r"^callbacks.model_checkpoint.monitor=val/pmr: SimpleNamespace does not log it"):
        check.setup(SimpleNamespace(callbacks=checkpoints + [ModelCheckpoint(monitor="val/pmr")]), module, "fit")
