"""Shared Lightning plumbing: optimiser from config, train mode at fit start, exact-resume RNG state,
ordering evaluation."""
from __future__ import annotations

import inspect
import logging
import math
import random
from typing import Any, Callable, Hashable, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from hydra.utils import get_class, get_method, instantiate
from pytorch_lightning.plugins.precision import HalfPrecision, MixedPrecision, Precision
from pytorch_lightning.utilities import GradClipAlgorithmType
from torch import nn

from seqaware.config import to_plain
from seqaware.lr_scaling import scale_learning_rates
from seqaware.master_weights import HALF_DTYPES, MasterWeights
from seqaware.modules.finite import FiniteGuard
from seqaware.metrics.torch_metrics import OrderingMetrics
from seqaware.metrics.ordering import DAG_KEYS, order_keys, select_reference

log = logging.getLogger(__name__)

# bytes of frozen float32 weights a half-precision run keeps to write them unrounded into checkpoints
FROZEN_FP32_LIMIT = 2 ** 30


def as_container(cfg: Any) -> Any:
    """A config as plain containers (so checkpoints store plain hyper-parameters): :func:`seqaware.config.to_plain`."""
    return to_plain(cfg)


def _numpy_state_to_safe(state: tuple) -> dict:
    """NumPy's RNG state with tensors and plain numbers only (loads under ``weights_only=True``)."""
    name, keys, pos, has_gauss, cached = state
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _numpy_state_from_safe(state: dict) -> tuple:
    return (state["name"], state["keys"].numpy().astype(np.uint32), state["pos"], state["has_gauss"], state["cached_gaussian"])


def world_size() -> int:
    """Processes of the default process group (1 without torch.distributed)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def gather_unique(records: list[dict], key: Callable[[dict], Hashable]) -> list[dict]:
    """Every rank's evaluation records, each ``key(record)`` once, sorted by key.

    Distributed evaluation samplers pad the last rank's share by repeating instances so every rank
    runs the same number of batches; metrics computed from these records count each instance
    once, whatever the world size, and the order (hence float sums, predictions files) does not
    depend on it either.  Every rank gets the same list (a collective: call it on every rank).
    """
    parts = [records]
    if world_size() > 1:
        parts = [None] * world_size()
        torch.distributed.all_gather_object(parts, records)
    unique: dict[Hashable, dict] = {}
    for part in parts:
        for rec in part:
            unique.setdefault(key(rec), rec)
    return [unique[k] for k in sorted(unique)]


def global_share(local_counts: torch.Tensor) -> torch.Tensor:
    """``local * world / sum over ranks`` per entry (ones on one process, zeros where the total is 0).

    A rank's mean loss over its ``local`` items times this factor is its share of the mean over
    the global batch: DDP averages gradients over ranks, so the update is that of the global-batch
    mean however unevenly the items (steps, pairs, masked tokens) fall on the ranks.  One
    all-reduce of the counts (a collective: call it on every rank).
    """
    local = local_counts.detach().float()  # counts up to 2**24 are exact
    if world_size() == 1:
        return torch.ones_like(local)
    total = local.clone()
    torch.distributed.all_reduce(total)
    return torch.where(total > 0, local * world_size() / total.clamp(min=1), torch.zeros_like(local))


def global_mean(local_sum: torch.Tensor, local_count: torch.Tensor) -> torch.Tensor:
    """This rank's share of ``sum / count`` over the global batch (see :func:`global_share`):
    ``local_sum / local_count`` on one process."""
    return local_sum / local_count.clamp(min=1) * global_share(local_count).to(local_sum.dtype)


class SeqawareModule(FiniteGuard, pl.LightningModule):
    """Base class: builds the optimiser/scheduler from config, starts ``fit`` in train mode,
    saves RNG states in checkpoints and stops a fit at a non-finite loss or gradient.

    ``optimizer`` is a config with ``_target_`` (e.g. ``torch.optim.AdamW``) and its arguments;
    ``scheduler`` is optional: ``{_target_: ..., interval: step|epoch, ...}``; a transformers schedule
    that takes ``num_training_steps`` gets the run's optimizer steps, and ``warmup_ratio: r`` sets its
    ``num_warmup_steps`` to ``ceil(r * steps)``.  ``lr_scaling`` (a module that saves it among its
    hyper-parameters): every learning rate for the fit's batch, :mod:`seqaware.lr_scaling`.

    Train mode.  ``from_pretrained`` returns modules in eval mode and Lightning (>= 2.2) keeps the
    modes it finds, so a fine-tuned pretrained encoder would train with every Dropout off.  At
    ``on_fit_start`` (before the sanity check, whose end restores the modes it found, as does every
    validation loop) the whole module goes to train mode; :meth:`train` then puts back in eval mode
    exactly the modules :meth:`frozen_modules` lists (e.g. BatchNorm layers with frozen statistics).
    Submodules that override ``train`` themselves keep their own rule (a
    :class:`~seqaware.encoders.visual.VisualBackbone` keeps its BatchNorm layers in eval mode with
    ``freeze_bn``, and the whole backbone with ``trainable: false``).

    Saving the Python, NumPy and torch RNG states with each checkpoint and restoring them makes a
    run resumed with ``ckpt_path=`` continue exactly like the uninterrupted run.

    Half-precision parameters (``trainer.precision=bf16-true``: Lightning converts the whole module to
    bfloat16, no autocast casts).  The optimizer then updates float32 master weights
    (:class:`~seqaware.master_weights.MasterWeights`), so updates below bfloat16's resolution are kept;
    they start from the exact float32 values the module held before Lightning converted it (the
    pretrained or restored weights, not their bfloat16 rounding), and checkpoints hold them, so
    ``ckpt_path=`` resumes exactly and every checkpoint's weights are float32.
    """

    #: whether the whole training step runs in the parameters' dtype, so ``trainer.precision=bf16-true`` works;
    #: modules whose code computes parts in float32 (written for autocast) refuse it with a clear error
    half_precision_ready: bool = False
    #: the validation metric the best checkpoint is chosen on and whether higher (``max``) or lower (``min``) is
    #: better: ``callbacks.model_checkpoint`` takes them unless a config sets its own (``seqaware/monitor.py``).
    #: Every module declares its own (``None``: it validates nothing, the last weights are tested).
    monitor: Optional[str]
    monitor_mode: str = "max"
    master_weights: Optional[MasterWeights] = None
    _master_sources: Optional[dict[int, torch.Tensor]] = None
    _frozen_sources: Optional[dict[str, torch.Tensor]] = None

    def _half_precision(self) -> bool:
        return isinstance(getattr(self._trainer, "precision_plugin", None), HalfPrecision)

    def configure_model(self) -> None:
        """Under a half-precision plugin, keep views of the float32 parameters before Lightning
        restores a checkpoint into them and converts the module: :meth:`configure_optimizers` starts the
        master weights from them (a checkpoint's float32 values arrive in the same storage)."""
        if self._half_precision() and not self.half_precision_ready:
            precision = self.trainer.precision_plugin.precision
            raise ValueError(f"trainer.precision={precision}: {type(self).__name__} computes parts of its step in "
                             "float32 and trains under autocast only; use trainer.precision=bf16-mixed "
                             "(bf16-true: the pretraining, TEO encoder-head and TEO LoRA experiments)")
        if self._half_precision() and self.trainer.state.fn == "fit":
            self._master_sources = {id(p): p.detach() for p in self.parameters()
                                    if p.requires_grad and p.dtype == torch.float32}
            # frozen parameters and buffers: checkpoints keep their float32 values while they do not change (held in
            # host memory for the run: up to FROZEN_FP32_LIMIT bytes, beyond it they are saved in bfloat16)
            frozen = {name: t.detach() for name, t in (*self.named_parameters(), *self.named_buffers())
                      if t.dtype == torch.float32 and not t.requires_grad}
            size = sum(t.numel() * t.element_size() for t in frozen.values())
            if size > FROZEN_FP32_LIMIT:
                log.info("%.1f GB of frozen float32 weights: checkpoints hold their bfloat16 rounding", size / 1e9)
                frozen = {}
            self._frozen_sources = frozen

    def compile_encoder(self, compile: bool | dict) -> None:
        """``model.compile``: ``true`` runs ``self.encoder`` under ``torch.compile`` (fused elementwise kernels and
        far fewer kernel launches; the first steps compile, and a new input shape can recompile, after which
        torch marks the changing dimensions dynamic), a dict passes its keys to it (``{mode: max-autotune,
        dynamic: false}``); ``false`` runs it eagerly.  In place (``nn.Module.compile``): the state dict keeps
        its keys, so checkpoints load either way."""
        if not compile:
            return
        if not isinstance(compile, (bool, dict)):
            raise ValueError(f"model.compile must be true, false or a dict of torch.compile's arguments, got {compile!r}")
        options = {} if compile is True else dict(compile)
        self.encoder.compile(**options)
        log.info("the encoder runs under torch.compile(%s)", ", ".join(f"{k}={v!r}" for k, v in options.items()))

    def validation_metrics(self) -> list[str]:
        """Every metric a validation of this module may log (``val/...``): what ``callbacks.model_checkpoint.monitor``
        may name (:class:`seqaware.monitor.MonitorCheck` refuses anything else before training). Default: none."""
        return []

    def frozen_modules(self) -> list[nn.Module]:
        """Modules that stay in eval mode while the rest trains (each one itself, not its children:
        list every module, e.g. ``list(backbone.modules())``).  Default: none."""
        return []

    def train(self, mode: bool = True) -> "SeqawareModule":
        super().train(mode)
        if mode:
            for module in self.frozen_modules():
                module.training = False
        return self

    def on_fit_start(self) -> None:
        self.train(True)

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

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip as ``trainer.gradient_clip_val`` / ``gradient_clip_algorithm`` say, also for optimizers that
        unscale gradients inside ``step()`` (``fused=True`` AdamW, the default of the BERSON and pretraining
        models) under mixed precision.

        Lightning's mixed-precision plugin refuses to clip for such optimizers, under ``bf16-mixed`` too,
        where nothing is scaled (no ``GradScaler``), so ``hparams=wu2022`` (clipping 1.0) could not run on
        a GPU or a bf16 CPU.  Here the gradients are the true ones under bf16 and are clipped as they are;
        under ``16-mixed`` the scaler first unscales them (``GradScaler.unscale_``), so the clip sees the
        true gradients and ``GradScaler.step`` passes them to the fused step without unscaling twice
        (it skips optimizers whose gradients are already unscaled, and still skips steps with inf/NaN).
        Every other case (no clipping, unfused optimizers, other precision plugins such as FSDP's) is
        Lightning's own :meth:`clip_gradients`.
        """
        plugin = self.trainer.precision_plugin
        if (gradient_clip_val and type(plugin) is MixedPrecision
                and getattr(optimizer, "_step_supports_amp_scaling", False)):
            if plugin.scaler is not None:
                plugin.scaler.unscale_(optimizer)
            algorithm = GradClipAlgorithmType((gradient_clip_algorithm or "norm").lower())
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)  # the plain clip, on true gradients
            return
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm)

    def configure_optimizers(self):
        opt_cfg = dict(self.hparams.optimizer)
        # parameter groups hold tensors: call the class directly rather than through instantiate()
        groups = self.param_groups()
        # model.lr_scaling: every lr for this fit's instances per step against the recipe's (seqaware/lr_scaling.py)
        scale_learning_rates(self.hparams.get("lr_scaling"), lambda: self.trainer, opt_cfg, groups)
        self.master_weights = None
        if self._half_precision() and any(p.dtype in HALF_DTYPES for g in groups for p in g["params"]):
            self.master_weights, groups = MasterWeights.for_param_groups(groups, self._master_sources)
            self.master_weights.keep_frozen(self._frozen_sources or {})
            log.info("%s: the optimizer updates float32 master weights of %d half-precision parameters",
                     self.trainer.precision_plugin.precision, len(self.master_weights))
        self._master_sources = self._frozen_sources = None
        optimizer = get_class(opt_cfg.pop("_target_"))(groups, **opt_cfg)
        if self.master_weights is not None:
            self.master_weights.attach(optimizer)
        sched_cfg = self.hparams.get("scheduler")
        if not sched_cfg:
            return optimizer
        sched_cfg = dict(sched_cfg)
        interval = sched_cfg.pop("interval", "step")
        warmup_ratio = sched_cfg.pop("warmup_ratio", None)
        params = inspect.signature(get_method(sched_cfg["_target_"])).parameters
        total = self.trainer.estimated_stepping_batches  # the run's optimizer steps (inf without a bound)
        needs_length = "num_training_steps" in params and "num_training_steps" not in sched_cfg
        if (needs_length or warmup_ratio is not None) and not math.isfinite(total):
            raise ValueError(f"model.scheduler {sched_cfg['_target_']} decays over the run's length, but the run has no "
                             "bound (trainer.max_steps=-1 and trainer.max_epochs=-1): set one of them, or "
                             "model.scheduler=null for a constant lr")
        if needs_length:  # transformers' decaying schedules: decay over the whole run
            sched_cfg["num_training_steps"] = int(total)
        if warmup_ratio is not None:  # warm-up as a fraction of the run (any max_steps), not a step count
            if "num_warmup_steps" in sched_cfg and sched_cfg["num_warmup_steps"] is None:
                del sched_cfg["num_warmup_steps"]   # a preset's num_warmup_steps: null gives way to the ratio
            if "num_warmup_steps" not in params or "num_warmup_steps" in sched_cfg:
                raise ValueError(f"model.scheduler.warmup_ratio needs a warm-up schedule without num_warmup_steps "
                                 f"(e.g. transformers.get_linear_schedule_with_warmup), got {dict(sched_cfg)}")
            if not 0 <= float(warmup_ratio) < 1:
                raise ValueError(f"model.scheduler.warmup_ratio must be in [0, 1), got {warmup_ratio!r}")
            sched_cfg["num_warmup_steps"] = math.ceil(float(warmup_ratio) * total)
        scheduler = instantiate(sched_cfg, optimizer=optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    def on_before_optimizer_step(self, optimizer) -> None:
        """Non-finite gradients stop the fit or are dropped (:mod:`seqaware.modules.finite`); under half
        precision the gradients go to the float32 master weights (before clipping, which therefore clips
        float32 gradients). Subclasses that edit gradients call this last."""
        self.check_gradients()
        if self.master_weights is not None:
            self.master_weights.grads_to_master()

    def full_precision_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state dict with the float32 master weights in place of their half-precision
        parameters (the plain state dict without master weights)."""
        state = self.state_dict()
        if self.master_weights is not None:
            self.master_weights.state_dict_update(self.named_parameters(), state)
        return state

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self._finite_state(checkpoint)
        if self.master_weights is not None and "state_dict" in checkpoint:
            self.master_weights.state_dict_update(self.named_parameters(), checkpoint["state_dict"])
        checkpoint["rng_states"] = {
            "python": random.getstate(),
            "numpy": _numpy_state_to_safe(np.random.get_state()),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._load_finite_state(checkpoint)
        states = checkpoint.get("rng_states")
        if not states:
            return
        random.setstate(states["python"])
        np.random.set_state(_numpy_state_from_safe(states["numpy"]))
        torch.set_rng_state(states["torch"])
        if states.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])


class GatheredEvalMixin:
    """Evaluation records kept per stage (``self._eval_records["val" | "test"]``), emptied when an
    evaluation epoch starts; when it ends :meth:`_log_eval` scores them (subclasses gather them over
    ranks first with :func:`gather_unique`)."""

    def _log_eval(self, stage: str) -> Any:
        raise NotImplementedError

    def on_validation_epoch_start(self) -> None:
        self._eval_records["val"] = []

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")

    def on_test_epoch_start(self) -> None:
        self._eval_records["test"] = []

    def on_test_epoch_end(self) -> None:
        self.test_rows = self._log_eval("test")  # what the test scoring returned (e.g. report rows)


class OrderingEvalMixin(GatheredEvalMixin):
    """Validation/test bookkeeping for models that predict an order per instance.

    Subclasses call :meth:`_record_orders` with predicted input positions (and, optionally, the
    per-instance sums and counts of their losses).  At the end of the epoch the records of every
    rank are gathered and each instance kept once (:func:`gather_unique`: distributed samplers pad
    with repeats), then scored: ``val/acc``, ``val/pmr``, ..., ``val/n`` and every loss as
    ``sum / count`` over the split (``test/...`` likewise), the same on every rank and for any
    world size.  Test predictions are kept in :attr:`test_predictions` (the same records, sorted
    by id) for ``train.py`` to write, so the file and the logged metrics agree.

    The best checkpoint has the highest ``val/pmr``.  ``eval_losses``: the losses a subclass records per
    instance (:meth:`_record_orders`, :meth:`_derived_losses`), logged as ``val/<name>``.
    """

    monitor = "val/pmr"
    monitor_mode = "max"
    eval_losses: tuple[str, ...] = ("loss",)

    def validation_metrics(self) -> list[str]:
        """Every sequencing metric (:data:`~seqaware.metrics.ordering.SEQUENCING_METRICS`) against the selected
        and the authored reference and per subset, the counts, the DAG scores (data with DAGs) and the losses."""
        keys = order_keys()
        names = [*keys, *(f"{group}/{k}" for group in ("single", "subset_single", "subset_multi") for k in keys),
                 "n", "n_single", "n_multi", *(f"dag/{k}" for k in DAG_KEYS), "dag/n", *self.eval_losses]
        return [f"val/{name}" for name in names]

    def _init_eval(self, reference_selection: str = "joint") -> None:
        # the metrics see records already gathered over ranks: they must not sum again over ranks
        self.val_metrics = OrderingMetrics(reference_selection=reference_selection, sync_on_compute=False)
        self.test_metrics = OrderingMetrics(reference_selection=reference_selection, sync_on_compute=False)
        self.test_predictions: list[dict] = []
        self._eval_records: dict[str, list[dict]] = {"val": [], "test": []}

    def _record_orders(self, stage: str, batch: dict, orders: list[list[int]],
                       losses: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """Keep one record per instance; ``losses``: ``name -> (sums (B,), counts (B,))``."""
        losses = {k: (s.detach().double().cpu().tolist(), c.detach().double().cpu().tolist())
                  for k, (s, c) in (losses or {}).items()}
        for b, (meta, order) in enumerate(zip(batch["meta"], orders)):
            self._eval_records[stage].append({
                "id": meta["id"], "category": meta["category"], "pred": [meta["step_index"][p] for p in order],
                "gold": meta["references"][0], "references": meta["references"], "dag": meta["dag"],
                "losses": {k: (sums[b], counts[b]) for k, (sums, counts) in losses.items()},
            })

    def _derived_losses(self, means: dict[str, float]) -> dict[str, float]:
        """Values computed from the split-level loss means (e.g. a weighted total); default none."""
        return {}

    def _log_eval(self, stage: str) -> dict[str, float]:
        records = gather_unique(self._eval_records[stage], key=lambda r: r["id"])
        self._eval_records[stage] = []
        metric = self.val_metrics if stage == "val" else self.test_metrics
        metric.reset()
        if records:
            metric.update([r["pred"] for r in records], [r["references"] for r in records], [r["dag"] for r in records])
        values = {f"{stage}/{k}": float(v) for k, v in metric.compute().items()} if records else {}
        metric.reset()
        means = {}
        for name in (records[0]["losses"] if records else {}):
            total = sum(r["losses"][name][0] for r in records)
            count = sum(r["losses"][name][1] for r in records)
            means[name] = total / count if count else float("nan")
        means.update(self._derived_losses(means))
        values.update({f"{stage}/{k}": v for k, v in means.items()})
        # every rank holds the same records, hence the same values: nothing to reduce
        self.log_dict(values, sync_dist=False, prog_bar=False)
        if stage == "test":
            # per instance, the reference the split's metrics scored it against (multi-reference: any
            # valid order of the DAG), so a file's PMR column averages to test/pmr
            self.test_predictions = []
            for r in records:
                index, scores = select_reference(r["pred"], r["references"], metric.reference_selection)
                self.test_predictions.append({"id": r["id"], "category": r["category"], "pred": r["pred"],
                                              "gold": r["gold"], "references": r["references"],
                                              "reference": index, "metrics": scores})
        return values
