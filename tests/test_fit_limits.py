"""A fit does what its limits say: which limit ends it (seqaware.callbacks.FitLength), the warning when
trainer.max_epochs ends it before trainer.max_steps and the validation at the end of a fit shorter than one
validation interval (FitLimits), trainer.max_steps alone on the command line (train.let_max_steps_decide).
train.py runs of the same: tests/test_train.py."""
from __future__ import annotations

import logging
import math

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import train
from seqaware.callbacks import FitLength, FitLimits, fit_length

INF = math.inf


@pytest.mark.parametrize("max_steps, max_epochs, batches, accumulate, expected", [
    (3, 1, 2, 1, FitLength(2, 2, "trainer.max_epochs")),      # berson_finetune's 1 epoch on 6 procedures in batches of 4
    (3, -1, 2, 1, FitLength(3, 3, "trainer.max_steps")),
    (4, 2, 2, 1, FitLength(4, 4, "trainer.max_steps")),       # both stop at step 4: Lightning checks max_steps first
    (-1, 3, 40, 1, FitLength(120, 120, "trainer.max_epochs")),
    (5, -1, 3, 2, FitLength(5, 8, "trainer.max_steps")),      # 2 steps an epoch (2 batches + the partial 1): 3 + 3 + 2
    (4, 1, 5, 2, FitLength(3, 5, "trainer.max_epochs")),      # ceil(5 / 2) steps per epoch
    (7, None, INF, 1, FitLength(7, 7, "trainer.max_steps")),  # a data set without a length
    (-1, -1, 10, 1, FitLength(INF, INF, None)),
    (-1, 0, 10, 1, FitLength(0, 0, "trainer.max_epochs")),
])
def test_fit_length_is_the_earliest_limit(max_steps, max_epochs, batches, accumulate, expected):
    assert fit_length(max_steps, max_epochs, batches, accumulate) == expected


class _Module(pl.LightningModule):
    """Logs val/loss; counts its validations (sanity checks excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.validations = []

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch[0]).pow(2).mean())

    def on_validation_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.validations.append(self.trainer.global_step)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path, samples: int = 6, batch_size: int = 4, val_samples: int = 4, **trainer_kwargs):
    limits = FitLimits()
    best = ModelCheckpoint(dirpath=tmp_path / "checkpoints", monitor="val/loss", mode="min", filename="best")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=[limits, best], default_root_dir=tmp_path, **trainer_kwargs)
    module = _Module()
    trainer.fit(module, DataLoader(TensorDataset(torch.randn(samples, 2)), batch_size=batch_size),
                DataLoader(TensorDataset(torch.randn(val_samples, 2)), batch_size=2))
    return trainer, module, limits, best


def test_max_epochs_that_ends_the_fit_before_max_steps_is_named_at_its_start(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="seqaware.callbacks"):
        trainer, module, limits, _ = _fit(tmp_path, max_steps=3, max_epochs=1, limit_train_batches=40)
    assert [r.getMessage() for r in caplog.records if "will not be reached" in r.getMessage()] == [
        "trainer.max_steps=3 will not be reached: trainer.max_epochs=1 x 2 training batches per epoch (6 training "
        "samples at batch size 4; trainer.limit_train_batches=40) stops the run at step 2; raise trainer.max_epochs "
        "or set it to -1"]
    assert trainer.global_step == 2 and limits.length == FitLength(2, 2, "trainer.max_epochs")
    assert module.validations == [2] and not limits.validates_at_end  # the epoch's end validates as always


def test_the_warning_names_the_accumulation(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="seqaware.callbacks"):
        trainer, *_ = _fit(tmp_path, samples=10, batch_size=2, max_steps=10, max_epochs=2, accumulate_grad_batches=2)
    [message] = [r.getMessage() for r in caplog.records if "will not be reached" in r.getMessage()]
    assert message == ("trainer.max_steps=10 will not be reached: trainer.max_epochs=2 x 3 optimizer steps per epoch "
                       "(10 training samples at batch size 2; 5 batches with trainer.accumulate_grad_batches=2) stops "
                       "the run at step 6; raise trainer.max_epochs or set it to -1")
    assert trainer.global_step == 6


def test_a_fit_that_reaches_max_steps_is_not_warned_about(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="seqaware.callbacks"):
        trainer, *_ = _fit(tmp_path, max_steps=3, max_epochs=-1)
    assert trainer.global_step == 3 and "will not be reached" not in caplog.text


@pytest.mark.parametrize("trainer_kwargs, first", [
    ({"max_steps": 4, "max_epochs": -1, "val_check_interval": 50, "check_val_every_n_epoch": None}, "batch 50"),
    ({"max_steps": 4, "max_epochs": -1}, "batch 10"),                               # ends inside the first epoch
    ({"max_epochs": 2, "check_val_every_n_epoch": 3}, "batch 30"),                  # ends before the epoch that validates
], ids=["val_check_interval", "mid_epoch", "check_val_every_n_epoch"])
def test_a_fit_shorter_than_one_validation_interval_validates_once_at_its_end(tmp_path, caplog, trainer_kwargs, first):
    with caplog.at_level(logging.INFO, logger="seqaware.callbacks"):
        trainer, module, limits, best = _fit(tmp_path, samples=40, **trainer_kwargs)
    steps = trainer.global_step
    assert steps == (4 if "max_steps" in trainer_kwargs else 20)
    assert module.validations == [steps] and limits.validates_at_end
    assert best.best_model_path == str(tmp_path / "checkpoints" / "best.ckpt")
    assert torch.load(best.best_model_path, weights_only=True)["global_step"] == steps
    [message] = [r.getMessage() for r in caplog.records if "before its first validation" in r.getMessage()]
    interval = trainer_kwargs.get("val_check_interval", 1.0)
    every = trainer_kwargs.get("check_val_every_n_epoch", 1)
    ended_by = "trainer.max_steps" if "max_steps" in trainer_kwargs else "trainer.max_epochs"
    assert message == (f"this fit ends after training batch {steps} ({ended_by}), before its first validation (after "
                       f"{first}: trainer.val_check_interval={interval}, trainer.check_val_every_n_epoch={every}): it "
                       "validates once at its end, so the best checkpoint is kept and tested")


def test_validation_that_is_off_stays_off(tmp_path):
    trainer, module, limits, best = _fit(tmp_path, max_steps=2, max_epochs=-1, limit_val_batches=0)
    assert trainer.global_step == 2 and module.validations == [] and not limits.validates_at_end
    assert best.best_model_path == ""


def test_a_fit_that_validates_within_its_length_is_left_as_it_is(tmp_path):
    trainer, module, limits, _ = _fit(tmp_path, samples=16, max_epochs=2)   # 4 batches an epoch
    assert module.validations == [4, 8] and not limits.validates_at_end
    assert trainer.check_val_every_n_epoch == 1


@pytest.mark.parametrize("overrides, max_epochs, changed", [
    (["trainer.max_steps=3"], 3, True),                               # the experiment's 1 epoch is raised
    (["++trainer.max_steps=3", "seed=1"], 3, True),
    (["trainer.max_steps=3", "trainer.max_epochs=1"], 1, False),      # both given: both stay (FitLimits warns)
    (["seed=1"], 1, False),                                           # max_steps from the config: left alone
    (["trainer.max_steps=1"], 1, False),                              # 1 epoch never ends the run before step 1
    (["trainer.max_steps=-1"], 1, False),
])
def test_max_steps_alone_on_the_command_line_decides(compose_train, caplog, overrides, max_epochs, changed):
    cfg = compose_train("experiment=berson_finetune", "trainer.max_steps=3")  # the config: max_epochs 1, max_steps 3
    cfg.trainer.max_steps = int(next((o.split("=")[1] for o in overrides if "max_steps" in o), 3))
    with caplog.at_level(logging.INFO, logger="seqaware.config"):
        assert train.let_max_steps_decide(cfg, overrides) is changed
    assert cfg.trainer.max_epochs == max_epochs
    messages = [r.getMessage() for r in caplog.records if "is on the command line" in r.getMessage()]
    assert messages == ([
        "trainer.max_steps=3 is on the command line and trainer.max_epochs is not: the config's trainer.max_epochs=1 "
        "is raised to 3 so that the run trains 3 steps (give trainer.max_epochs too to keep both limits)"]
        if changed else [])


def test_pretraining_without_an_epoch_limit_is_left_alone(compose_train):
    cfg = compose_train("experiment=clipvil_pretrain", "trainer.max_steps=10")
    assert not train.let_max_steps_decide(cfg, ["trainer.max_steps=10"]) and cfg.trainer.max_epochs == -1
    assert train.command_line_overrides() == []  # outside a Hydra app


@pytest.mark.slow  # a train.py subprocess: 6-40 s on 2 cores
def test_the_saved_config_records_the_max_epochs_that_max_steps_raised(tmp_path, cache_dir):
    """``.hydra/config.yaml`` is written by Hydra before ``main`` raises max_epochs: ``main`` rewrites it, so the
    saved config, run again (``--config-path RUN/.hydra --config-name config``), trains the same 12 steps and not
    order_baseline's 8 epochs x 1 batch. A run that builds and stops (train=false test=false): a few seconds."""
    import subprocess
    import sys
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from conftest import TINY_SYNTHETIC

    root = Path(train.__file__).resolve().parent
    run_dir = tmp_path / "run"
    command = [sys.executable, str(root / "train.py"), "experiment=order_baseline", "trainer.max_steps=12",
               "trainer.limit_train_batches=1", "train=false", "test=false", f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache_dir}",
               *[f"data.source.{k}={v}" for k, v in TINY_SYNTHETIC.items()]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the config's trainer.max_epochs=8 is raised to 12" in done.stderr + done.stdout
    saved = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    assert (saved.trainer.max_steps, saved.trainer.max_epochs) == (12, 12)
    assert not list((run_dir / ".hydra").glob(".*.tmp"))                # written atomically, nothing left over
    assert OmegaConf.load(run_dir / ".hydra" / "overrides.yaml") == OmegaConf.create(   # Hydra's record, as it was
        [o for o in command[2:] if not o.startswith("hydra.")])
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(run_dir / ".hydra"), version_base="1.3"):
            again = compose(config_name="config")                    # the saved config run again, no override
    finally:
        GlobalHydra.instance().clear()
    assert not train.let_max_steps_decide(again, [])
    # 1 training batch per epoch (limit_train_batches=1): the saved limits end the fit at step 12, as the first run
    assert again.trainer.limit_train_batches == 1
    assert fit_length(again.trainer.max_steps, again.trainer.max_epochs, 1) == FitLength(12, 12, "trainer.max_steps")
    assert OmegaConf.to_container(again) == OmegaConf.to_container(saved)
    # the study scripts' reuse check: the same overrides compose to the saved config (max_epochs raised alike)
    from seqaware.run_reuse import check_same_job

    check_same_job(run_dir, [o for o in command[2:] if not o.startswith("hydra.")])


# ---------------------------------------------------------------- trainer.max_time inside the first epoch
class _Clock:
    """Lightning's Timer's clock, advanced 1 s by each training step (and by nothing else)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _TimedModule(_Module):
    def __init__(self, clock: _Clock, stop_at: int | None = None) -> None:
        super().__init__()
        self.clock, self.stop_at = clock, stop_at

    def training_step(self, batch, batch_idx):
        self.clock.now += 1.0
        if self.stop_at is not None and batch_idx + 1 == self.stop_at:
            self.trainer.should_stop = True               # what an early-stopping callback asks
        return super().training_step(batch, batch_idx)


def _timed_fit(tmp_path, monkeypatch, module_kwargs=None, **trainer_kwargs):
    import pytorch_lightning.callbacks.timer as timer_module

    clock = _Clock()
    monkeypatch.setattr(timer_module, "time", clock)
    limits = FitLimits()
    best = ModelCheckpoint(dirpath=tmp_path / "checkpoints", monitor="val/loss", mode="min", filename="best")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=[limits, best], default_root_dir=tmp_path, **trainer_kwargs)
    module = _TimedModule(clock, **(module_kwargs or {}))
    trainer.fit(module, DataLoader(TensorDataset(torch.randn(40, 2)), batch_size=4),      # 10 batches an epoch
                DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
    return trainer, module, limits, best


@pytest.mark.parametrize("every", [1, 2])
def test_max_time_ends_a_fit_inside_its_first_epoch_validated_at_the_cut(compose_train, tmp_path, monkeypatch, caplog, every):
    """The project's trainer config asks for min_epochs 1 (for early stopping); trainer.max_time still ends the fit
    at the batch its 3 s are up (step 3 of 10 in epoch 0), validated there (also when the epoch that validates is
    the second) so the best checkpoint is the cut's; Lightning alone would train on to the epoch's end."""
    min_epochs = compose_train().trainer.min_epochs
    assert min_epochs == 1
    with caplog.at_level(logging.INFO, logger="seqaware.callbacks"):
        trainer, module, limits, best = _timed_fit(tmp_path, monkeypatch, max_epochs=2, min_epochs=min_epochs,
                                                   max_time={"seconds": 3}, check_val_every_n_epoch=every)
    assert trainer.global_step == 3 and limits.cut_by_max_time                      # of 10 in epoch 0
    assert module.validations == [3]
    assert torch.load(best.best_model_path, weights_only=True)["global_step"] == 3
    assert [r.getMessage() for r in caplog.records if "max_time" in r.getMessage()] == [
        "trainer.max_time is up at step 3 (epoch 0): the fit ends here, before trainer.min_epochs=1 (a minimum that "
        "holds back early stopping, not the time limit), validated at the cut"]


def test_min_epochs_still_holds_back_other_stop_requests(tmp_path, monkeypatch):
    """What trainer.min_epochs: 1 is for: a stop asked inside the first epoch (an early-stopping callback) waits for
    the epoch's end; with max_time set but not up, too."""
    trainer, module, limits, _ = _timed_fit(tmp_path, monkeypatch, module_kwargs={"stop_at": 2}, max_epochs=3,
                                            min_epochs=1, max_time={"seconds": 100})
    assert trainer.global_step == 10 and module.validations == [10] and not limits.cut_by_max_time
