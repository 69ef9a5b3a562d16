"""Hydra entry point: compose configs/, build data module + Lightning module, fit, then test.

    python train.py                                   # the default experiment on the synthetic data
    python train.py experiment=order_baseline trainer.max_epochs=3
    python train.py -m experiment=order_baseline model.net.modality=text,multimodal
    python train.py experiment=order_baseline ckpt_path=logs/.../checkpoints/last.ckpt   # resume exactly
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from pytorch_lightning.callbacks import LearningRateMonitor, ModelCheckpoint

import seqaware.config  # noqa: F401  (registers the config resolvers)
from seqaware.checkpoint_io import AtomicCheckpointIO
from seqaware.io import format_test_metrics, write_jsonl
from seqaware.launch import pin_ddp_relaunch

log = logging.getLogger("seqaware.train")


def _instantiate_group(cfg: DictConfig | None) -> list[Any]:
    """Instantiate every entry of a config group dict (callbacks, loggers) that has a _target_."""
    if not cfg:
        return []
    return [instantiate(c) for c in cfg.values() if isinstance(c, DictConfig) and "_target_" in c]


def build(cfg: DictConfig) -> tuple[pl.LightningDataModule, pl.LightningModule, pl.Trainer]:
    """Instantiate data module, model and trainer (with callbacks and loggers) from a composed config."""
    pl.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    model = instantiate(cfg.model)
    callbacks = _instantiate_group(cfg.get("callbacks"))
    loggers = _instantiate_group(cfg.get("logger"))
    if not loggers:
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    # trainer.plugins: a dict of plugins; an entry that instantiates to None (e.g. the SLURM environment
    # outside SLURM) is left out
    plugins = [p for p in _instantiate_group(cfg.trainer.get("plugins")) if p is not None]
    trainer_cfg = cfg.trainer.copy()  # keeps its parent: interpolations still resolve
    with open_dict(trainer_cfg):
        trainer_cfg.pop("plugins", None)
    trainer = instantiate(trainer_cfg, callbacks=callbacks, logger=loggers or False,
                          plugins=[AtomicCheckpointIO(), *plugins])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for lg in loggers:
        lg.log_hyperparams(resolved)
    return datamodule, model, trainer


def _best_checkpoint(trainer: pl.Trainer) -> str | None:
    """The best checkpoint of the first ModelCheckpoint that monitors a metric, if one was written."""
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.monitor and cb.best_model_path and Path(cb.best_model_path).is_file():
            return cb.best_model_path
    return None


def _finish_wandb(trainer: pl.Trainer) -> None:
    """Close this run's W&B runs: otherwise the next run in the same process (a ``-m`` sweep with
    the basic launcher, a test) would silently log into this one."""
    for lg in trainer.loggers:
        if type(lg).__name__ == "WandbLogger" and getattr(lg, "_experiment", None) is not None:
            lg.experiment.finish()


def run(cfg: DictConfig) -> dict[str, float]:
    """Fit and/or test as the config says; returns the logged metrics as floats."""
    datamodule, model, trainer = build(cfg)
    try:
        return _fit_and_test(cfg, datamodule, model, trainer)
    finally:
        _finish_wandb(trainer)


def _fit_and_test(cfg: DictConfig, datamodule: pl.LightningDataModule, model: pl.LightningModule,
                  trainer: pl.Trainer) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if cfg.get("train", True):
        trainer.fit(model=model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    if cfg.get("test", True):
        ckpt = _best_checkpoint(trainer) if cfg.get("train", True) else cfg.get("ckpt_path")
        if ckpt is None:
            log.warning("no best checkpoint was saved (e.g. fast_dev_run or no validation): "
                        "testing the current weights")
        else:
            log.info("testing the best checkpoint %s", ckpt)
        trainer.test(model=model, datamodule=datamodule, ckpt_path=ckpt)
        test_metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}
        metrics.update(test_metrics)
        if trainer.is_global_zero:
            predictions = getattr(model, "test_predictions", None)
            if predictions is not None and cfg.get("predictions_file"):
                path = Path(cfg.paths.output_dir) / cfg.predictions_file
                write_jsonl(path, predictions)
                log.info("wrote %d test predictions to %s", len(predictions), path)
            print("test metrics:")
            for key in sorted(test_metrics):
                print(f"  {key}: {test_metrics[key]:.4f}")
            print(format_test_metrics(test_metrics))
            sys.stdout.flush()
    return metrics


@hydra.main(version_base="1.3", config_path="configs", config_name="train.yaml")
def main(cfg: DictConfig) -> float | None:
    pin_ddp_relaunch()  # in a -m sweep, DDP's extra ranks re-run this job in this folder (no stray sweep)
    metrics = run(cfg)
    name = cfg.get("optimized_metric")
    if name:
        if name not in metrics:
            raise KeyError(f"optimized_metric={name!r} was not logged; logged: {sorted(metrics)}")
        return metrics[name]
    return None


if __name__ == "__main__":
    main()
