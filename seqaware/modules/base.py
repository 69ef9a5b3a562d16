"""Shared Lightning plumbing: optimiser from config, exact-resume RNG state, ordering evaluation."""
from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from seqaware.metrics.torch_metrics import OrderingMetrics
from seqaware.metrics.ordering import order_metrics

log = logging.getLogger(__name__)


def as_container(cfg: Any) -> Any:
    """DictConfig -> plain dict (so checkpoints store plain hyper-parameters)."""
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def _numpy_state_to_safe(state: tuple) -> dict:
    """NumPy's RNG state with tensors and plain numbers only (loads under ``weights_only=True``)."""
    name, keys, pos, has_gauss, cached = state
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _numpy_state_from_safe(state: dict) -> tuple:
    return (state["name"], state["keys"].numpy().astype(np.uint32), state["pos"], state["has_gauss"], state["cached_gaussian"])


class SeqawareModule(pl.LightningModule):
    """Base class: builds the optimiser/scheduler from config and saves RNG states in checkpoints.

    ``optimizer`` is a config with ``_target_`` (e.g. ``torch.optim.AdamW``) and its arguments;
    ``scheduler`` is optional: ``{_target_: ..., interval: step|epoch, ...}``.
    Saving the Python, NumPy and torch RNG states with each checkpoint and restoring them makes a
    run resumed with ``ckpt_path=`` continue exactly like the uninterrupted run.
    """

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, *args, **kwargs):  # type: ignore[override]
        """Lightning's loader with ``weights_only=True``, building only allow-listed ``_target_``
        classes from the checkpoint's hyper-parameters (:mod:`seqaware.checkpoint_io`)."""
        from seqaware.checkpoint_io import load_checkpoint

        load_checkpoint(checkpoint_path)  # raises UnsafeCheckpointError naming the file and the key
        kwargs["weights_only"] = True
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def param_groups(self) -> list[dict]:
        """Parameter groups of the optimiser (default: one group of all trainable parameters)."""
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]

    def configure_optimizers(self):
        opt_cfg = dict(self.hparams.optimizer)
        # parameter groups hold tensors: call the class directly rather than through instantiate()
        optimizer = get_class(opt_cfg.pop("_target_"))(self.param_groups(), **opt_cfg)
        sched_cfg = self.hparams.get("scheduler")
        if not sched_cfg:
            return optimizer
        sched_cfg = dict(sched_cfg)
        interval = sched_cfg.pop("interval", "step")
        if sched_cfg.get("_target_") == "transformers.get_linear_schedule_with_warmup":
            sched_cfg.setdefault("num_training_steps", self.trainer.estimated_stepping_batches)
        scheduler = instantiate(sched_cfg, optimizer=optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng_states"] = {
            "python": random.getstate(),
            "numpy": _numpy_state_to_safe(np.random.get_state()),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        states = checkpoint.get("rng_states")
        if not states:
            return
        random.setstate(states["python"])
        np.random.set_state(_numpy_state_from_safe(states["numpy"]))
        torch.set_rng_state(states["torch"])
        if states.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])


class OrderingEvalMixin:
    """Validation/test bookkeeping for models that predict an order per instance.

    Subclasses call :meth:`_record_orders` with predicted input positions; metrics are logged as
    ``val/acc``, ``val/pmr``, ... and ``test/...``; test predictions are kept in
    :attr:`test_predictions` (gathered over ranks) for ``train.py`` to write.
    """

    def _init_eval(self) -> None:
        self.val_metrics = OrderingMetrics()
        self.test_metrics = OrderingMetrics()
        self.test_predictions: list[dict] = []
        self._test_buffer: list[dict] = []

    def _record_orders(self, stage: str, batch: dict, orders: list[list[int]]) -> None:
        preds, refs, dags = [], [], []
        for meta, order in zip(batch["meta"], orders):
            preds.append([meta["step_index"][p] for p in order])
            refs.append(meta["references"])
            dags.append(meta["dag"])
        metric = self.val_metrics if stage == "val" else self.test_metrics
        metric.update(preds, refs, dags)
        if stage == "test":
            for meta, pred in zip(batch["meta"], preds):
                scores = order_metrics(pred, meta["references"][0])
                self._test_buffer.append({
                    "id": meta["id"], "category": meta["category"], "pred": pred,
                    "gold": meta["references"][0], "references": meta["references"],
                    "metrics": scores,
                })

    def _log_metrics(self, stage: str) -> dict[str, float]:
        metric = self.val_metrics if stage == "val" else self.test_metrics
        values = {f"{stage}/{k}": float(v) for k, v in metric.compute().items()}
        metric.reset()
        self.log_dict(values, sync_dist=False, prog_bar=False)
        return values

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_start(self) -> None:
        self._test_buffer = []

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")
        gathered = [self._test_buffer]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, self._test_buffer)
        seen, merged = set(), []
        for part in gathered:  # a distributed sampler pads with repeats: keep each id once
            for rec in part:
                if rec["id"] not in seen:
                    seen.add(rec["id"])
                    merged.append(rec)
        self.test_predictions = merged
