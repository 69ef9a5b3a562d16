"""Lightning callbacks of the project."""
from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl

from seqaware.io import atomic_open
from seqaware.profiling import machine
from seqaware.reports import bar_chart, columns, markdown_table, per_category

log = logging.getLogger(__name__)


class CategoryReport(pl.Callback):
    """After testing, write the per-category metrics of the test predictions.

    Files in ``output_dir``: ``category_report.md`` / ``.json`` and ``category_pmr.png`` (a bar
    chart of per-category PMR).  With a W&B logger attached, the table and the chart are logged
    too.  Runs on rank 0 only; does nothing for modules without ``test_predictions``.
    """

    def __init__(self, output_dir: str, level: int = 1, metric: str = "pmr"):
        self.output_dir = Path(output_dir)
        self.level = int(level)
        self.metric = metric

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        records = getattr(pl_module, "test_predictions", None)
        if not trainer.is_global_zero or not records or "references" not in records[0]:
            return  # only ordering predictions (pred + references) have a per-category ordering report
        table = per_category(records, self.level)
        label = getattr(pl_module.hparams, "get", lambda *_: None)("modality") or "model"
        with atomic_open(self.output_dir / "category_report.json") as fh:
            json.dump(table, fh, indent=1)
        with atomic_open(self.output_dir / "category_report.md") as fh:
            fh.write(markdown_table(table))
        chart = bar_chart({label: table}, self.output_dir / f"category_{self.metric}.png", self.metric)
        log.info("per-category report written to %s", self.output_dir)
        for lg in trainer.loggers:
            if type(lg).__name__ == "WandbLogger":
                import wandb

                metrics = columns()  # the report's: every sequencing metric
                rows = [[name, row["n"]] + [row[c] for c in metrics] for name, row in table.items()]
                lg.experiment.log({"test/category_table": wandb.Table(columns=["category", "n", *metrics], data=rows),
                                   f"test/category_{self.metric}": wandb.Image(str(chart))})


class _SkipFirst:
    """A sampler that leaves out the first ``skip`` indices of the wrapped sampler's next pass (the
    part of an interrupted epoch that was already trained on), then behaves as the wrapped one."""

    def __init__(self, inner, skip: int):
        self.inner, self.skip = inner, int(skip)

    def __iter__(self):
        skip, self.skip = self.skip, 0
        for i, index in enumerate(self.inner):
            if i >= skip:
                yield index

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)


class Preemption(pl.Callback):
    """Preemption-safe fitting: on SIGTERM or SIGUSR1 (what SLURM sends before a time limit) save
    ``<dirpath>/<filename>.ckpt`` at the end of the current training batch and stop; ``train.py``
    then exits with 128 + the signal number. Re-running the same command resumes from that file
    (see :mod:`seqaware.runs`), mid-epoch included: the batches of the interrupted epoch already
    trained on are skipped, so the resumed run sees exactly the data the uninterrupted one saw.

    SIGTERM is caught by Lightning itself; the other ``signals`` are routed to the same flag (so
    under DDP every rank stops at the same batch).

    Before training, from ``setup`` on (the module's own ``setup`` may run for long: the closure head's
    cross-validation), Lightning's handlers are not in place yet and a signal would kill the process with
    ``run.json`` left ``running``: there the ``signals`` raise Lightning's ``SIGTERMException`` at once, which
    ``train.py`` records as ``interrupted`` (exit 128 + the signal). Nothing is trained yet, so no checkpoint
    is saved; the same command starts again.
    """

    def __init__(self, dirpath: str, filename: str = "last", signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")):
        self.dirpath = Path(dirpath)
        self.filename = filename
        self.signals = [getattr(signal, s) if isinstance(s, str) else signal.Signals(s) for s in signals]
        self.received: int | None = None
        self.saved_path: Path | None = None
        self._previous: dict[int, object] = {}
        self._before_training = False

    @property
    def path(self) -> Path:
        return self.dirpath / f"{self.filename}.ckpt"

    def _handler(self, trainer: pl.Trainer):
        def handle(signum, frame):
            log.warning("received signal %d: saving a resumable checkpoint after the current batch", signum)
            self.received = signum
            trainer._signal_connector.received_sigterm = True  # Lightning's stop flag (broadcast to ranks)
        return handle

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Until ``on_fit_start``: a signal stops the run (``SIGTERMException``), see the class docstring."""
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        self._before_training = True
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._stop_before_training)

    def _stop_before_training(self, signum, frame) -> None:
        from pytorch_lightning.utilities.exceptions import SIGTERMException

        self.received = signum
        log.warning("received signal %d before training started (setup): stopping; nothing was trained, so no "
                    "checkpoint is saved", signum)
        raise SIGTERMException()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_handlers()  # those of setup; Lightning's own come next, the ones below chained to them
        self._before_training = False
        # Lightning warns that a mid-epoch resume repeats data; on_train_start below prevents that
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            if sig == signal.SIGTERM:
                # Lightning's own SIGTERM handler sets the stop flag; remember that it was SIGTERM
                previous = signal.getsignal(sig)
                self._previous[sig] = previous

                def chained(signum, frame, previous=previous):
                    self.received = signum
                    if callable(previous):
                        previous(signum, frame)
                signal.signal(sig, chained)
            else:
                self._previous[sig] = signal.signal(sig, self._handler(trainer))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_handlers()

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Resumed mid-epoch: skip the batches of this epoch that were trained on before the stop.  A checkpoint
        written at the end of an epoch (its validation after the last batch) counts all of that epoch's batches
        as done; Lightning then starts the next epoch, which is trained from its first batch."""
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        loader = trainer.train_dataloader
        batch_sampler = getattr(loader, "batch_sampler", None)
        if not trainer.fit_loop.restarting or not done or batch_sampler is None:
            return
        if done >= trainer.num_training_batches:   # the epoch was finished: nothing of the next one to skip
            return
        if hasattr(batch_sampler, "skip_batches"):   # a batch sampler of its own (token budget, length buckets)
            batch_sampler.skip_batches(done)
        elif hasattr(batch_sampler, "sampler"):
            batch_sampler.sampler = _SkipFirst(batch_sampler.sampler, done * batch_sampler.batch_size)
        else:
            return
        log.info("resumed mid-epoch: skipping the %d batches of epoch %d already trained on", done, trainer.current_epoch)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()
        if type(exception).__name__ != "SIGTERMException" or trainer.state.fn != "fit" or self._before_training:
            return
        if self.received is None:
            self.received = int(signal.SIGTERM)
        trainer.save_checkpoint(self.path)  # a full checkpoint (optimiser, loops, callbacks); loaded with weights_only=True
        self.saved_path = self.path
        if trainer.is_global_zero:
            log.warning("stopped by signal %d: resumable checkpoint %s (re-run the same command to resume)",
                        self.received, self.path)


class PretrainingSampleTable(pl.Callback):
    """A W&B table of the first ``rows`` sequences of each validation: id, step indices, the step
    images side by side, the step texts, and each objective's target and prediction as the
    objective shows them (:meth:`seqaware.objectives.base.Objective.show`).

    Reads what a module's ``validation_step`` returns for the first batch, ``{"samples":
    {objectives, corrupted, targets, outputs}}`` (:class:`seqaware.modules.pretraining.PretrainingModule`);
    does nothing without a ``WandbLogger``, off rank 0, during the sanity check or for modules that
    return nothing.
    """

    def __init__(self, rows: int = 4):
        self.rows = int(rows)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if (self.rows <= 0 or batch_idx != 0 or not isinstance(outputs, dict) or "samples" not in outputs
                or not trainer.is_global_zero or trainer.sanity_checking):
            return
        from pytorch_lightning.loggers import WandbLogger

        loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if not loggers:
            return
        import wandb

        table = self.table(pl_module, batch, outputs["samples"], getattr(trainer.datamodule, "tokenizer", None),
                           wandb.Table, wandb.Image)
        for lg in loggers:
            lg.experiment.log({"val/samples": table, "trainer/global_step": trainer.global_step})

    def table(self, pl_module, batch: dict, samples: dict, tokenizer, table_cls, image_cls):
        """The table (``table_cls(columns=...)`` with rows added), images made with ``image_cls``."""
        import torch

        names = tuple(samples["objectives"])
        rows = min(self.rows, len(batch["meta"]))
        decode = tokenizer.convert_ids_to_tokens if tokenizer is not None else (lambda ids: ids)
        shown = {name: pl_module.objectives[name].show(samples["outputs"], samples["targets"], rows, decode)
                 for name in names}
        table = table_cls(columns=["id", "steps", "images", "text"]
                          + [f"{name}_{part}" for name in names for part in ("target", "prediction")])
        for b in range(rows):
            meta = batch["meta"][b]
            n = int(batch["step_mask"][b].sum())
            image = None
            if "pixel_values" in batch:
                strip = torch.cat(list(batch["pixel_values"][b, :n]), dim=-1)  # (3, H, n*W)
                strip = (strip - strip.amin()) / (strip.amax() - strip.amin()).clamp(min=1e-6)
                image = image_cls(strip.permute(1, 2, 0).float().cpu().numpy())
            text = ""
            if tokenizer is not None and "input_ids" in batch:
                text = " | ".join(tokenizer.batch_decode(batch["input_ids"][b, :n], skip_special_tokens=True))
            row = [meta["id"], str(meta.get("step_index")), image, text]
            for name in names:
                gold, pred = shown[name]
                row += [gold[b], pred[b]]
            table.add_data(*row)
        return table


@dataclass(frozen=True)
class FitLength:
    """How long a fit trains, and which trainer limit ends it (``trainer.max_time`` aside: only a
    measured pace forecasts it, :class:`RuntimeForecast`).

    ``steps``: optimizer steps; ``batches``: training batches (``steps`` x the gradient accumulation,
    an epoch's last partial accumulation stepping too); ``ended_by``: ``"trainer.max_steps"`` (also when
    both limits stop at the same step: Lightning checks it first), ``"trainer.max_epochs"``, or None
    for a fit bounded by neither (both inf).
    """

    steps: float
    batches: float
    ended_by: str | None

    @classmethod
    def of(cls, trainer: pl.Trainer) -> "FitLength":
        """The trainer's fit, once its training data is set up (from ``on_train_start`` on)."""
        return fit_length(trainer.max_steps, trainer.max_epochs, trainer.num_training_batches,
                          trainer.accumulate_grad_batches)


def fit_length(max_steps: int | None, max_epochs: int | None, batches_per_epoch: float, accumulate: int = 1) -> FitLength:
    """:class:`FitLength` of a fit with these trainer limits (-1 or None: no limit) and epochs of
    ``batches_per_epoch`` training batches (after ``trainer.limit_train_batches``; inf for a data set
    without a length)."""
    accumulate = max(int(accumulate), 1)
    steps_per_epoch = math.ceil(batches_per_epoch / accumulate) if math.isfinite(batches_per_epoch) else math.inf
    by_steps = max_steps if max_steps is not None and max_steps >= 0 else math.inf
    if max_epochs is None or max_epochs < 0:
        by_epochs = math.inf
    else:
        by_epochs = max_epochs * steps_per_epoch if max_epochs else 0
    if math.isfinite(by_steps) and by_steps <= by_epochs:
        if math.isfinite(steps_per_epoch) and steps_per_epoch > 0:
            epochs, rest = divmod(int(by_steps), steps_per_epoch)
            batches = epochs * batches_per_epoch + min(rest * accumulate, batches_per_epoch)
        else:
            batches = by_steps * accumulate
        return FitLength(by_steps, batches, "trainer.max_steps")
    if math.isfinite(by_epochs):
        return FitLength(by_epochs, max_epochs * batches_per_epoch if max_epochs else 0, "trainer.max_epochs")
    return FitLength(math.inf, math.inf, None)


def first_validation_batch(trainer: pl.Trainer) -> float | None:
    """The training batch of the fit (counted from 1, across epochs) after which Lightning first
    validates; None when validation is off (``trainer.limit_val_batches=0``, no validation data or
    ``validation_step``) or timed (``val_check_interval`` as a duration). Read from ``on_train_start`` on."""
    if not trainer.enable_validation or getattr(trainer, "_val_check_time_interval", None) is not None:
        return None
    every, per_epoch, within = trainer.check_val_every_n_epoch, trainer.num_training_batches, trainer.val_check_batch
    if within is None:
        return None
    if every is None:            # every val_check_batch batches, counted across epochs
        return within
    if not math.isfinite(within):  # an epoch without a length validates at its end
        within = per_epoch
    return within if every == 1 else (every - 1) * per_epoch + within


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else ("es" if word.endswith("ch") else "s"))


class FitLimits(pl.Callback):
    """A fit does what its limits say, checked when training starts (docs/running.md, "How long a run trains").

    * ``trainer.max_steps`` that ``trainer.max_epochs`` x the epoch's batches ends first: one warning that
      names max_epochs, the epoch's batches (samples, batch size, ``trainer.limit_train_batches``,
      accumulation) and the step the fit stops at. (``train.py`` raises max_epochs itself when max_steps
      alone is on the command line: :func:`seqaware.config.let_max_steps_decide`; a ``trainer.max_time`` that ends
      the fit first is forecast by :class:`RuntimeForecast` a few batches in.)
    * A fit that ends before its first validation (fewer batches than ``trainer.val_check_interval``, or
      ending before the epoch ``trainer.check_val_every_n_epoch`` validates) validates once after its
      last batch instead, so the monitoring ``ModelCheckpoint`` keeps a best checkpoint for the test (and
      pretraining's ``encoder.pt``). Validation that is off stays off (``trainer.limit_val_batches=0``,
      no validation data); ``fast_dev_run`` is left to Lightning.
    * ``trainer.max_time`` ends the fit at the batch its time is up, inside the first epoch too: Lightning
      lets no stop request (its Timer's included) end a fit before ``trainer.min_epochs`` (1 in
      ``configs/trainer/default.yaml``, there so that an early-stopping callback waits for a whole epoch);
      when the time is up before then, the minimum is lifted for this fit (said in the log), and the cut
      is validated (the validation epoch ``check_val_every_n_epoch`` waits for included), so a best
      checkpoint is kept and tested. A stop request of anything else still waits for ``min_epochs``.

    ``length`` (:class:`FitLength`), ``validates_at_end`` and ``cut_by_max_time`` say what it found.
    """

    def __init__(self):
        self.length: FitLength | None = None
        self.validates_at_end = False
        self.cut_by_max_time = False
        self._timer = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from pytorch_lightning.callbacks import Timer

        if trainer.fast_dev_run:
            return
        self._timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer) and cb.time_remaining() is not None),
                           None)
        self.length = length = FitLength.of(trainer)
        if trainer.is_global_zero and trainer.max_steps > 0 and length.steps < trainer.max_steps:
            log.warning(self.max_steps_message(trainer, length))
        first = first_validation_batch(trainer)
        if first is None or not 1 <= length.batches < first:
            return
        settings = (f"trainer.val_check_interval={trainer.val_check_interval}, "
                    f"trainer.check_val_every_n_epoch={trainer.check_val_every_n_epoch}")
        trainer.check_val_every_n_epoch = None       # validate after the fit's last batch, counted across epochs
        trainer.val_check_batch = int(length.batches)
        self.validates_at_end = True
        if trainer.is_global_zero:
            first_text = f"batch {int(first):,}" if math.isfinite(first) else "the end of the first epoch"
            log.info(f"this fit ends after training batch {int(length.batches):,} ({length.ended_by}), before its "
                     f"first validation (after {first_text}: {settings}): it validates once at its end, so the "
                     "best checkpoint is kept and tested")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        """``trainer.max_time`` up before ``trainer.min_epochs`` / ``min_steps`` are met: stop at this batch."""
        loop = trainer.fit_loop
        if self._timer is None or self.cut_by_max_time or not (loop.min_epochs or loop.min_steps):
            return
        if (loop.epoch_progress.current.processed >= (loop.min_epochs or 0)
                and trainer.global_step >= (loop.min_steps or 0)):
            return                                      # Lightning stops at max_time itself from here on
        left = self._timer.time_remaining()
        if not trainer.strategy.broadcast(left is not None and left <= 0):   # rank 0's clock, as the Timer's
            return
        minimum = f"trainer.min_epochs={loop.min_epochs}" + (f", min_steps={loop.min_steps}" if loop.min_steps else "")
        loop.min_epochs, loop.epoch_loop.min_steps = 0, None
        trainer.should_stop = self.cut_by_max_time = True
        every = trainer.check_val_every_n_epoch
        if trainer.enable_validation and every is not None and (trainer.current_epoch + 1) % every:
            trainer.check_val_every_n_epoch = None      # so Lightning validates at the cut, in any epoch
        if trainer.is_global_zero:
            log.info(f"trainer.max_time is up at step {trainer.global_step:,} (epoch {trainer.current_epoch}): the fit "
                     f"ends here, before {minimum} (a minimum that holds back early stopping, not the time limit)"
                     + (", validated at the cut" if trainer.enable_validation else ""))

    @staticmethod
    def max_steps_message(trainer: pl.Trainer, length: FitLength) -> str:
        """The warning for a ``trainer.max_steps`` that ``trainer.max_epochs`` keeps the fit from reaching."""
        accumulate = max(int(trainer.accumulate_grad_batches), 1)
        batches = int(trainer.num_training_batches)
        per_epoch = (_plural(math.ceil(batches / accumulate), "optimizer step") if accumulate > 1
                     else _plural(batches, "training batch"))
        why = []
        loader = trainer.train_dataloader
        try:
            samples = len(loader.dataset)
        except (AttributeError, TypeError):
            samples = None
        batch_size = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        if samples is not None and batch_size and trainer.world_size == 1:
            why.append(f"{_plural(samples, 'training sample')} at batch size {batch_size}")
        limit = trainer.limit_train_batches
        if limit is not None and (isinstance(limit, int) or float(limit) != 1.0):
            why.append(f"trainer.limit_train_batches={limit}")
        if accumulate > 1:
            why.append(f"{_plural(batches, 'batch')} with trainer.accumulate_grad_batches={accumulate}")
        return (f"trainer.max_steps={trainer.max_steps} will not be reached: trainer.max_epochs={trainer.max_epochs} x "
                f"{per_epoch} per epoch" + (f" ({'; '.join(why)})" if why else "")
                + f" stops the run at step {int(length.steps):,}; raise trainer.max_epochs or set it to -1")


BASE_HIDDEN_SIZE = 768   # BERT-base / MPNet-base and up: the text models that recipes size for a GPU


def text_model_width(pl_module: pl.LightningModule) -> int | None:
    """The hidden size of the widest Hugging Face transformer inside ``pl_module`` (the encoder's text
    model: 384 for MiniLM, 768 for MPNet-base, 1024 for RoBERTa-large), None when it holds none."""
    from transformers import PreTrainedModel

    sizes = [int(getattr(m.config, "hidden_size", 0) or 0) for m in pl_module.modules() if isinstance(m, PreTrainedModel)]
    return max(sizes) if sizes else None


class RuntimeForecast(pl.Callback):
    """Warn early when a fit on the CPU is on course to take longer than ``limit_hours``.

    Base-size encoders (``backbones=base``: MPNet-base, 110M parameters) and GPU recipes
    (``hparams=roc_base``) are easy to start on a laptop by mistake.  After ``warmup_steps`` training
    batches (not timed: the first ones build caches) the next ``measure_steps`` are timed, and the run
    that will happen is projected at that pace, validation excluded: the fit's remaining batches
    (:class:`FitLength`: the earlier of ``trainer.max_steps`` and ``max_epochs`` x the epoch's batches),
    cut short by ``trainer.max_time`` when that comes first; when it is ``max_time`` that ends a fit with a
    ``trainer.max_steps``, one warning (on any accelerator) says that step will not be reached and near
    which step the fit ends.  Over ``limit_hours`` on a CPU accelerator, one warning names the projection,
    what ends the fit, the model's size and what to do (the base-size advice only when the model's text
    transformer is base-size, hidden size >= 768); nothing is stopped.  On an accelerator other than the
    CPU, or for a fit bounded by none of the three, it does nothing.
    """

    def __init__(self, limit_hours: float = 1.0, warmup_steps: int = 2, measure_steps: int = 3):
        if limit_hours <= 0 or warmup_steps < 0 or measure_steps < 1:
            raise ValueError("RuntimeForecast needs limit_hours > 0, warmup_steps >= 0 and measure_steps >= 1")
        self.limit_hours = float(limit_hours)
        self.warmup_steps = int(warmup_steps)
        self.measure_steps = int(measure_steps)
        self._start: float | None = None
        self._done = False
        self.forecast_hours: float | None = None
        self.stopped_by: str | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        if self._start is None and not self._done and self._seen(trainer) == self.warmup_steps:
            self._start = time.monotonic()

    def _seen(self, trainer: pl.Trainer) -> int:
        return int(trainer.fit_loop.epoch_loop.total_batch_idx)

    @staticmethod
    def _time_left(trainer: pl.Trainer) -> float | None:
        """Seconds of ``trainer.max_time`` left (Lightning's Timer callback), None without one."""
        from pytorch_lightning.callbacks import Timer

        timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)
        left = timer.time_remaining() if timer is not None else None
        return None if left is None else max(float(left), 0.0)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        if self._done or self._start is None or self._seen(trainer) + 1 < self.warmup_steps + self.measure_steps:
            return
        self._done = True
        per_batch = (time.monotonic() - self._start) / self.measure_steps
        if not trainer.is_global_zero:
            return
        length = FitLength.of(trainer)
        remaining = max(length.batches - self._seen(trainer) - 1, 0)      # inf for a fit without max_steps / max_epochs
        seconds = remaining * per_batch
        self.stopped_by = length.ended_by
        time_left = self._time_left(trainer)
        if time_left is not None and time_left < seconds:
            seconds, self.stopped_by = time_left, "trainer.max_time"
            remaining = int(seconds / per_batch) if per_batch > 0 else remaining
        if not math.isfinite(seconds):
            self.stopped_by = None
            return
        self.forecast_hours = seconds / 3600
        if self.stopped_by == "trainer.max_time" and trainer.max_steps > 0:
            step = (self._seen(trainer) + 1 + remaining) // max(int(trainer.accumulate_grad_batches), 1)
            log.warning(f"trainer.max_steps={trainer.max_steps} will not be reached: at {per_batch:.2f} s a training "
                        f"batch on {machine(pl_module.device)}, trainer.max_time ends the fit in about "
                        f"{self.forecast_hours:.1f} h, near step {step:,}; "
                        "raise trainer.max_time or lower trainer.max_steps")
        cpu = type(trainer.accelerator).__name__ == "CPUAccelerator"
        if cpu and self.forecast_hours > self.limit_hours:
            params = sum(p.numel() for p in pl_module.parameters()) / 1e6
            message = (f"this fit is on course to take {self.forecast_hours:.1f} h on this CPU, {machine()} "
                       f"({remaining:,} more "
                       f"training batches at {per_batch:.2f} s each until {self.stopped_by} ends it, validation not "
                       f"counted; a {params:.3g}M-parameter model).")
            width = text_model_width(pl_module)
            if width is not None and width >= BASE_HIDDEN_SIZE:
                message += (f" Its text model is base-size (hidden size {width}); recipes with a base-size encoder "
                            "(backbones=base) are sized for a GPU (trainer=gpu); on the CPU, lower trainer.max_steps / "
                            "max_epochs / max_time or use backbones=offline.")
            else:
                message += (" To shorten it, lower trainer.max_steps / max_epochs / max_time (or "
                            "trainer.limit_train_batches), or train on a GPU (trainer=gpu).")
            log.warning(message)
            warnings.warn(message, stacklevel=1)


class StepClock(pl.Callback):
    """Seconds per training step once the first ``warmup_steps`` are over (a benchmark's figure; not a default
    callback): ``+callbacks.step_clock._target_=seqaware.callbacks.StepClock +callbacks.step_clock.path=FILE``.

    The clock starts after batch ``warmup_steps`` ends (the first steps build caches, and compile under
    ``model.compile``) and stops after ``warmup_steps + steps`` batches; on a GPU both ends synchronise the
    device, so the figure is the steps' whole time, host and device.  ``path`` receives (atomically) one JSON
    object: ``warmup_s`` (from the start of training to the clock's start), ``steps``, ``seconds`` and
    ``s_per_step``; the same figures are logged.  A fit that ends before the clock stops writes nothing.  The first
    validation after the clock stopped is timed too (``val_batches``, ``val_s``: an evaluation pace for forecasts)."""

    def __init__(self, path: str, warmup_steps: int = 50, steps: int = 200):
        if warmup_steps < 0 or steps < 1:
            raise ValueError(f"StepClock needs warmup_steps >= 0 and steps >= 1, got {warmup_steps} and {steps}")
        self.path, self.warmup_steps, self.steps = Path(path), int(warmup_steps), int(steps)
        self._train_start: float | None = None
        self._start: float | None = None
        self._val_start: float | None = None
        self.figures: dict | None = None

    @staticmethod
    def _now(pl_module: pl.LightningModule) -> float:
        if pl_module.device.type == "cuda":
            import torch

            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._train_start = self._now(pl_module)
        if self.warmup_steps == 0:
            self._start = self._train_start

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        done = int(trainer.fit_loop.epoch_loop.total_batch_idx) + 1     # training batches finished
        if done == self.warmup_steps:
            self._start = self._now(pl_module)
        elif done == self.warmup_steps + self.steps and self._start is not None and self.figures is None:
            seconds = self._now(pl_module) - self._start
            self.figures = {"warmup_steps": self.warmup_steps, "warmup_s": round(self._start - self._train_start, 3),
                            "steps": self.steps, "seconds": round(seconds, 3),
                            "s_per_step": round(seconds / self.steps, 5)}
            log.info("step clock: %d steps after %d warm-up steps (%.1f s): %.4f s a step", self.steps,
                     self.warmup_steps, self.figures["warmup_s"], self.figures["s_per_step"])
            self._write(trainer)

    def _write(self, trainer: pl.Trainer) -> None:
        if trainer.is_global_zero:
            with atomic_open(self.path, "w") as handle:
                json.dump(self.figures, handle)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.figures is not None and "val_s" not in self.figures and not trainer.sanity_checking:
            self._val_start = self._now(pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val_start is not None:
            self.figures.update(val_batches=int(sum(trainer.num_val_batches)),
                                val_s=round(self._now(pl_module) - self._val_start, 3))
            self._val_start = None
            self._write(trainer)


class NonFiniteLoss(pl.Callback):
    """What a fit does at a NaN / inf loss, logged loss term or gradient (:mod:`seqaware.modules.finite`):
    ``stop`` (default: the run fails naming the step, the term and its last finite value) or ``skip`` (the
    step changes nothing and ``train/nonfinite_skips`` counts it). Sets the module's ``nonfinite_action``; a
    module fitted without this callback stops."""

    def __init__(self, action: str = "stop"):
        from seqaware.modules.finite import ACTIONS, SWITCH

        if action not in ACTIONS:
            raise ValueError(f"{SWITCH} must be one of {list(ACTIONS)}, got {action!r}")
        self.action = action

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        pl_module.nonfinite_action = self.action
