"""Hydra entry point: compose configs/, build data module + Lightning module, fit, then test.

    python train.py                                   # the default experiment on the synthetic data
    python train.py experiment=order_baseline trainer.max_epochs=3
    python train.py -m experiment=order_baseline model.net.modality=text,multimodal
    python train.py experiment=order_baseline run_name=exp1     # logs/order_baseline/runs/exp1; re-run to resume
    python train.py experiment=order_baseline ckpt_path=logs/.../checkpoints/last.ckpt   # continue another run, exactly

Run folders, resuming, signals and safe loading: docs/running.md.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from pytorch_lightning.callbacks import LearningRateMonitor
from pytorch_lightning.utilities.exceptions import SIGTERMException

import seqaware.config  # noqa: F401  (registers the config resolvers)
from data_modules.datamodule import check_fit_saw_batches
from seqaware import runs
from seqaware.callbacks import Preemption
from seqaware.checkpoint_io import AtomicCheckpointIO
from seqaware.config import check_argument_types, let_max_steps_decide
from seqaware.io import format_test_metrics, write_jsonl, write_test_metrics
from seqaware.launch import ddp_sweep_job

log = logging.getLogger("seqaware.train")


def _instantiate_group(cfg: DictConfig | None) -> list[Any]:
    """Instantiate every entry of a config group dict (callbacks, loggers) that has a _target_."""
    if not cfg:
        return []
    return [instantiate(c) for c in cfg.values() if isinstance(c, DictConfig) and "_target_" in c]


def build(cfg: DictConfig, plan: runs.RunPlan | None = None) -> tuple[pl.LightningDataModule, pl.LightningModule, pl.Trainer]:
    """Instantiate data module, model and trainer (with callbacks and loggers) from a composed config.

    With a ``plan`` that resumes in the run folder, the W&B run is resumed by id and the CSV log
    keeps the rows logged before the checkpoint.
    """
    for group in ("trainer", "data", "model", "callbacks", "logger"):  # a typo'd value, named, before anything runs
        if cfg.get(group) is not None:
            check_argument_types(cfg[group], group)
    pl.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    model = instantiate(cfg.model)
    callbacks = _instantiate_group(cfg.get("callbacks"))
    logger_cfg = cfg.get("logger")
    wandb_id = plan.state.get("wandb_id") if plan is not None and plan.resumed_in_place else None
    if wandb_id and logger_cfg and "wandb" in logger_cfg:
        logger_cfg = OmegaConf.create(OmegaConf.to_container(logger_cfg, resolve=True))  # an open copy
        logger_cfg.wandb.id, logger_cfg.wandb.resume = wandb_id, "allow"  # log into the same W&B run
    loggers = _instantiate_group(logger_cfg)
    csv_rows: list[tuple[list[str], list[dict]]] = []
    if plan is not None and plan.resumed_in_place and plan.ckpt_path:
        step = runs.checkpoint_step(plan.ckpt_path)
        for lg in loggers:  # read before the CSV writer starts (it deletes an existing metrics.csv)
            if type(lg).__name__ == "CSVLogger":
                csv_rows.append(runs.read_csv_rows(Path(lg.log_dir) / "metrics.csv", before_step=step))
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
    for header, rows in csv_rows:
        runs.restore_csv_rows(loggers, header, rows)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for lg in loggers:
        lg.log_hyperparams(resolved)
    return datamodule, model, trainer


def _finish_wandb(trainer: pl.Trainer) -> None:
    """Close this run's W&B runs: otherwise the next run in the same process (a ``-m`` sweep with
    the basic launcher, a test) would silently log into this one."""
    for lg in trainer.loggers:
        if type(lg).__name__ == "WandbLogger" and getattr(lg, "_experiment", None) is not None:
            lg.experiment.finish()


def run(cfg: DictConfig) -> dict[str, float]:
    """Fit and/or test as the config says; returns the logged metrics as floats.

    Rank 0 locks the run folder (``paths.output_dir``, :class:`seqaware.runs.RunLock`) for the whole
    run; the folder is checked and resumed first (:func:`seqaware.runs.prepare`), and ``latest:TASK/FILE``
    values are resolved (:func:`seqaware.runs.resolve_latest_values`). A SIGTERM / SIGUSR1 during fit
    saves ``checkpoints/last.ckpt`` and exits with 128 + the signal; ``run.json`` ends ``finished``,
    ``interrupted`` (a signal, Ctrl-C) or ``failed`` (any other exception, with the error).
    """
    out = Path(cfg.paths.output_dir)
    rank_zero = runs.process_rank() == 0
    runs.check_not_finished(out)  # before the lock writes its holder into the folder: a finished run is left as it was
    with runs.RunLock(out) if rank_zero else contextlib.nullcontext():
        return _run_in_folder(cfg, out, rank_zero)


def _run_in_folder(cfg: DictConfig, out: Path, rank_zero: bool) -> dict[str, float]:
    plan = runs.prepare(out, cfg.get("ckpt_path"), train=cfg.get("train", True))
    if rank_zero:
        runs.write_state(out, status="running", started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         command=sys.argv, resumed_from=plan.ckpt_path, drop=("error", "failed_rank", "failed_at"))
    trainer = None
    try:
        resolved = runs.resolve_latest_values(cfg, cfg.paths.log_dir)
        if resolved and rank_zero:
            runs.write_state(out, resolved=resolved)
        datamodule, model, trainer = build(cfg, plan)
        if plan.ckpt_path and cfg.get("train", True):
            # another run's checkpoint, or this folder's own after the folder was moved: keep best tracking
            plan.ckpt_path = runs.rehome_checkpoint(plan.ckpt_path, trainer.checkpoint_callbacks, out)
        if rank_zero:
            for lg in trainer.loggers:
                if type(lg).__name__ == "WandbLogger":
                    runs.write_state(out, wandb_id=lg.version)
        metrics = _fit_and_test(cfg, datamodule, model, trainer, plan.ckpt_path)
    except SIGTERMException:
        signum = next((cb.received for cb in trainer.callbacks if isinstance(cb, Preemption) and cb.received),
                      int(signal.SIGTERM))
        saved = next((str(cb.saved_path) for cb in trainer.callbacks if isinstance(cb, Preemption) and cb.saved_path), None)
        if trainer.is_global_zero:
            runs.write_state(out, status="interrupted", signal=signum, checkpoint=saved)
            print(f"interrupted by signal {signum}; " + (f"resumable checkpoint {saved}: re-run the same command "
                  f"(same run folder {out}) to resume" if saved else "no checkpoint was saved"), file=sys.stderr)
        raise SystemExit(128 + signum)
    except BaseException as err:
        _record_stop(out, err, rank_zero)
        raise
    finally:
        if trainer is not None:
            _finish_wandb(trainer)
    if trainer.is_global_zero:
        runs.write_state(out, status="finished", finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return metrics


def _record_stop(out: Path, err: BaseException, rank_zero: bool) -> None:
    """``run.json`` after an exception: ``interrupted`` for Ctrl-C (Lightning turns the KeyboardInterrupt
    of fit / test into ``sys.exit(1)``), else ``failed`` with the error. Rank 0 writes it; another rank
    writes it only while the state still says ``running`` (under DDP a failing rank takes rank 0 down,
    which may not get to write)."""
    if isinstance(err, SystemExit) and not isinstance(err.__context__, KeyboardInterrupt):
        if err.code in (None, 0):
            return
    rank = runs.process_rank()
    if not rank_zero and runs.read_state(out).get("status") != "running":
        return
    if isinstance(err, KeyboardInterrupt) or isinstance(err.__context__, KeyboardInterrupt):
        last = out / runs.LAST_CHECKPOINT
        runs.write_state(out, status="interrupted", signal=int(signal.SIGINT),
                         checkpoint=str(last) if last.is_file() else None)
        if rank_zero:
            print("interrupted (Ctrl-C); " + (f"re-run the same command to resume from {last}" if last.is_file()
                  else "no checkpoint was saved yet"), file=sys.stderr)
        return
    message = f"{type(err).__name__}: {err}" if not isinstance(err, SystemExit) else f"SystemExit({err.code})"
    runs.write_state(out, status="failed", error=message[:2000], failed_rank=rank,
                     failed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def _fit_and_test(cfg: DictConfig, datamodule: pl.LightningDataModule, model: pl.LightningModule,
                  trainer: pl.Trainer, ckpt_path: str | None) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if cfg.get("train", True):
        trainer.fit(model=model, datamodule=datamodule, ckpt_path=ckpt_path)
        check_fit_saw_batches(trainer, datamodule)  # never test an untrained model as if it were trained
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    if cfg.get("test", True):
        ckpt = _checkpoint_to_test(cfg, trainer)
        trainer.test(model=model, datamodule=datamodule, ckpt_path=ckpt, verbose=False)  # printed once, below
        test_metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}
        metrics.update(test_metrics)
        if trainer.is_global_zero:
            predictions = getattr(model, "test_predictions", None)
            if predictions is not None and cfg.get("predictions_file"):
                path = Path(cfg.paths.output_dir) / cfg.predictions_file
                write_jsonl(path, predictions)
                log.info("wrote %d test predictions to %s", len(predictions), path)
            write_test_metrics(cfg.paths.output_dir, test_metrics)
            runs.write_state(cfg.paths.output_dir, tested_checkpoint=ckpt)
            print("test metrics:")
            width = max((len(k) for k in test_metrics), default=0)
            for key in sorted(test_metrics):
                print(f"  {key + ':':<{width + 1}} {test_metrics[key]:.4f}")
            print(format_test_metrics(test_metrics))
            sys.stdout.flush()
    return metrics


def _checkpoint_to_test(cfg: DictConfig, trainer: pl.Trainer) -> str | None:
    """The checkpoint the test loads, said in the log: after a fit the best checkpoint (of this run, or
    tracked by the run ``ckpt_path`` continued); without training the one :func:`seqaware.runs.checkpoint_to_test`
    picks for ``ckpt_path`` (a ``last.ckpt``: the best checkpoint its run tracked, beside it; any other file: exactly
    that file). None (the current weights) only with a warning that says so."""
    if cfg.get("train", True):
        ckpt = runs.best_checkpoint(trainer)
        if ckpt is None:
            log.warning("no best checkpoint was saved (e.g. fast_dev_run or no validation): "
                        "testing the current weights")
        else:
            log.info("testing the best checkpoint %s", ckpt)
        return ckpt
    if not cfg.get("ckpt_path"):
        log.warning("train=false without ckpt_path: testing the current weights, those the model was built with "
                    "(its initialisation and any checkpoint its config loads, e.g. model.encoder.ckpt); give "
                    "ckpt_path=RUN/checkpoints/best_....ckpt to test a trained run")
        return None
    ckpt, why = runs.checkpoint_to_test(cfg.ckpt_path, trainer.checkpoint_callbacks)
    log.info(why)
    return ckpt


def command_line_overrides() -> list[str]:
    """The overrides of this Hydra job's command line (a sweep job: its own), none outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


@hydra.main(version_base="1.3", config_path="configs", config_name="train.yaml")
def main(cfg: DictConfig) -> float | None:
    if let_max_steps_decide(cfg, command_line_overrides()):
        runs.rewrite_saved_config(cfg)  # Hydra saved .hydra/config.yaml before this ran: record the raised max_epochs
    # in a -m sweep, DDP's extra ranks re-run this job in this folder (no stray sweep), and the next job
    # launches its own ranks
    with ddp_sweep_job():
        metrics = run(cfg)
    return optimized_value(cfg, metrics)


def optimized_value(cfg: DictConfig, metrics: dict[str, float]) -> float | None:
    """The value returned to sweepers: ``metrics[optimized_metric]``, or None (with a warning) when the
    run finished without logging it -- e.g. validation was off (``trainer.limit_val_batches=0``; a fit that
    ends before its first validation validates at its end, :class:`seqaware.callbacks.FitLimits`). The run itself is fine (tested, ``run.json`` finished); an Optuna sweep records that trial as FAIL."""
    name = cfg.get("optimized_metric")
    if not name or not cfg.get("train", True):  # an evaluation-only run (train=false) logs no val/ metric
        return None
    if name not in metrics:
        logged = sorted(k for k in metrics if not k.startswith("test/"))
        log.warning("optimized_metric=%s was not logged, so this run returns no value to a sweeper (logged: %s). "
                    "Was validation off (trainer.limit_val_batches=0), or does the model log it under another "
                    "name?", name, ", ".join(logged) or "nothing")
        return None
    return metrics[name]


if __name__ == "__main__":
    main()
