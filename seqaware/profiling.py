"""A training step's work and where its time goes: one home for both.

* **FLOPs** (:func:`transformer_flops`): the model FLOPs of a sequence encoder's transformer from the real
  (non-padding) tokens it is given and its shape (:func:`transformer_shape`), the figure MFU is quoted in
  (PaLM's convention: ``6 W N + 12 layers H sum(L^2)`` for a training step; padding, recomputation, embeddings
  lookups, LayerNorms and the heads on top are not counted).  Counted from the tokens of the step
  (:class:`WorkMeter`), so it costs nothing in the loop, and ``model.packed`` does not change it: the
  arithmetic a padded pass spends on padding is waste, not work.  :func:`counted_flops` runs a step under
  ``torch.utils.flop_counter.FlopCounterMode`` instead (every matmul executed, padding included: a benchmark's
  cross-check, far too slow for the loop; ``tests/test_packing.py`` checks the formula against it).
* **Fits** (:class:`StepWork`, a callback every BERSON fit gets): ``perf/flops_per_step``, ``perf/tokens_per_s``,
  ``perf/padding`` (the padded layout's share of padding) and on a GPU ``perf/mfu`` (against
  :func:`gpu_peak_flops`, a table of dense bf16 peaks keyed by the GPU's name).
  :func:`logged_perf` reads their means back from a run's CSV log (the study scripts' tables).
* **Machines** (:func:`machine`): the CPU model and cores, or the GPU, that a timing or a forecast names.
* **Profiles** (:func:`profile_figures`): the top operators of a few profiled steps (the benchmark scripts'
  ``--profile N``; ``scripts/bench/gpu_check.py`` writes them into its report).
"""
from __future__ import annotations

import csv
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch

# dense bf16 tensor-core peaks (no sparsity), FLOP/s, by a substring of torch.cuda.get_device_name(): the first
# that matches counts (PCIe / NVL parts before the SXM name they contain; L40S before L4, A100 before A10)
GPU_BF16_PEAK = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H200 NVL", 835e12), ("H100", 989e12),
                 ("H200", 989e12), ("GH200", 989e12), ("B200", 2250e12), ("A100", 312e12), ("L40S", 362e12),
                 ("L4", 121e12), ("A10", 125e12))


def gpu_peak_flops(name: str) -> Optional[float]:
    """The dense bf16 peak (FLOP/s) of the GPU called ``name`` (:data:`GPU_BF16_PEAK`); None when not listed."""
    return next((peak for key, peak in GPU_BF16_PEAK if key in name), None)


def cpu_model() -> str:
    """The CPU's model name (``lscpu``'s "Model name", from /proc/cpuinfo), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: Any = None) -> str:
    """What a timing ran on: ``"NVIDIA H200 (1 GPU)"`` for a CUDA ``device``, else ``"AMD EPYC, 2 cores"``."""
    if device is not None and torch.device(device).type == "cuda":
        return f"{torch.cuda.get_device_name(torch.device(device))} (1 GPU)"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu_model()}, {cores} cores"


def transformer_shape(backbone: torch.nn.Module) -> dict[str, int]:
    """``layers``, ``hidden`` and ``weights`` (the elements of every Linear weight in the transformer layers:
    2 FLOPs each per token forward) of a Hugging Face encoder model."""
    layers = backbone.encoder.layer
    weights = sum(m.weight.numel() for m in layers.modules() if isinstance(m, torch.nn.Linear))
    return {"layers": len(layers), "hidden": int(backbone.config.hidden_size), "weights": int(weights)}


def transformer_flops(tokens: int, squares: int, layers: int, hidden: int, weights: int, train: bool = True) -> int:
    """Model FLOPs of a transformer pass over sequences of L_1, L_2, ... real tokens: ``tokens`` = sum(L_i),
    ``squares`` = sum(L_i^2).  Forward: ``2 weights tokens`` (the linear layers) + ``4 layers hidden squares``
    (attention's scores and weighted sum); a training step (``train``) adds the backward, twice the forward."""
    forward = 2 * weights * tokens + 4 * layers * hidden * squares
    return 3 * forward if train else forward


def counted_flops(step: Callable[[], Any]) -> int:
    """Every FLOP ``step()`` executes, as ``torch.utils.flop_counter.FlopCounterMode`` counts them (matmuls and the
    GPU attention kernels; padding included; torch 2.14 does not count the CPU SDPA kernel).  For benchmarks: far
    too slow for a training loop."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return int(counter.get_total_flops())


@dataclass
class Work:
    """What a :class:`WorkMeter` counted: real ``tokens``, ``squares`` (sum of squared sequence lengths),
    ``slots`` (the padded layouts' B x T), ``passes`` (transformer calls); ``forward_tokens`` /
    ``forward_squares``: the part of ``tokens`` / ``squares`` passed without gradients (no backward: pretraining's
    clean SMRM pass, evaluation)."""
    tokens: int = 0
    squares: int = 0
    slots: int = 0
    passes: int = 0
    forward_tokens: int = 0
    forward_squares: int = 0

    @property
    def padding(self) -> float:
        return 1.0 - self.tokens / self.slots if self.slots else 0.0

    def flops(self, shape: dict[str, int]) -> int:
        """Model FLOPs of the counted passes for a transformer of ``shape`` (:func:`transformer_shape`): a training
        step's for the passes with gradients, a forward's for the others."""
        trained = transformer_flops(self.tokens - self.forward_tokens, self.squares - self.forward_squares, **shape)
        return trained + transformer_flops(self.forward_tokens, self.forward_squares, **shape, train=False)


class WorkMeter:
    """Counts what a sequence encoder's transformer is given (:func:`seqaware.encoders.packing.run_transformer`
    calls :meth:`add` with each padded batch's token mask): kept as device tensors and read once (:meth:`read`),
    so counting costs no synchronisation in the step.  ``active`` off: calls are not counted (a recomputation
    in backward)."""

    def __init__(self):
        self.active = True
        self.reset()

    def reset(self) -> None:
        self._counts: list[torch.Tensor] = []
        self._slots = 0
        self._passes = 0

    @torch.compiler.disable
    def add(self, mask: torch.Tensor) -> None:
        if not self.active:
            return
        lengths = mask.long().sum(1)
        tokens, squares = lengths.sum(), (lengths * lengths).sum()
        plain = torch.is_grad_enabled()
        self._counts.append(torch.stack([tokens, squares, tokens * (not plain), squares * (not plain)]))
        self._slots += mask.numel()
        self._passes += 1

    def read(self) -> Work:
        if not self._counts:
            return Work(passes=self._passes)
        tokens, squares, forward_tokens, forward_squares = (int(x) for x in torch.stack(self._counts).sum(0).tolist())
        return Work(tokens, squares, self._slots, self._passes, forward_tokens, forward_squares)


class StepWork(pl.Callback):
    """Logs every training batch's work (:class:`WorkMeter` on the module's ``encoder``): ``perf/flops_per_step``
    (:meth:`Work.flops`: :func:`transformer_flops` of the batch's real tokens; a pair chunk recomputed in backward
    is not counted again), ``perf/tokens_per_s`` (real tokens over the time from the previous batch's end, data
    loading included; validation and epoch starts excluded), ``perf/padding`` and, on a GPU listed in
    :data:`GPU_BF16_PEAK`, ``perf/mfu`` (against the bf16 peak whatever the precision, as MFU is quoted).  Per
    training batch (with ``trainer.accumulate_grad_batches`` a step is several) and this rank's.  Nothing is
    synchronised but the one read of the counts per batch.  A module without an ``encoder`` wrapping a Hugging
    Face ``backbone`` logs nothing."""

    def __init__(self):
        self.meter: Optional[WorkMeter] = None
        self.shape: dict[str, int] = {}
        self.peak: Optional[float] = None
        self._last: Optional[float] = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        encoder = getattr(pl_module, "encoder", None)
        backbone = getattr(encoder, "backbone", None)
        if backbone is None or not hasattr(getattr(backbone, "encoder", None), "layer"):
            return
        self.shape = transformer_shape(backbone)
        self.meter = encoder.work_meter = WorkMeter()
        device = pl_module.device
        self.peak = gpu_peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        if self.meter is not None:
            self.meter.reset()
            self.meter.active = True
            if self._last is None:
                self._last = time.perf_counter()

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self.meter is not None:
            self.meter.active = False

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        if self.meter is None or self._last is None:
            return
        work, now = self.meter.read(), time.perf_counter()
        seconds, self._last = max(now - self._last, 1e-9), now
        flops = work.flops(self.shape)
        metrics = {"perf/flops_per_step": float(flops), "perf/tokens_per_s": work.tokens / seconds,
                   "perf/padding": work.padding}
        if self.peak:
            metrics["perf/mfu"] = flops / seconds / self.peak
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._last is not None:
            self._last = time.perf_counter()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        encoder = getattr(pl_module, "encoder", None)
        if self.meter is not None and encoder is not None and encoder.work_meter is self.meter:
            encoder.work_meter = None
        self.meter = None


def profile_figures(step: Callable[[], Any], steps: int = 3, top: int = 12, cuda: bool = False) -> dict[str, Any]:
    """Run ``step`` ``steps`` times under ``torch.profiler``; returns a benchmark's profile figures:

    * ``profile``: the ``top`` operators by self time (CUDA self time when ``cuda``, else CPU self time),
      ``{name, calls, self_ms, share}`` per operator, per profiled step, ``share`` its fraction of the total
      self time of all operators;
    * ``profile_wall_ms``: the wall time per step;
    * ``profile_device_busy_ms`` (``cuda`` only): the time per step the GPU was running kernels (the union of
      their intervals). Busy time well under wall time means the step waits on the host (Python, launches,
      synchronisations, the data) rather than on the GPU.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    total = sum(getattr(e, attr, 0.0) for e in events) or 1.0
    ranked = sorted(events, key=lambda e: getattr(e, attr, 0.0), reverse=True)[:top]
    rows = [{"name": e.key, "calls": int(e.count) // max(steps, 1), "self_ms": getattr(e, attr, 0.0) / 1000 / steps,
             "share": getattr(e, attr, 0.0) / total} for e in ranked]
    out: dict[str, Any] = {"profile": rows, "profile_wall_ms": 1000 * wall / max(steps, 1)}
    if cuda:
        out["profile_device_busy_ms"] = busy_us(prof.events()) / 1000 / max(steps, 1)
    return out


def profile_summary(figures: dict[str, Any]) -> str:
    """"a profiled step: W ms wall, GPU busy B ms" from :func:`profile_figures` output ("" without a GPU)."""
    if "profile_device_busy_ms" not in figures:
        return ""
    return (f"a profiled step: {figures['profile_wall_ms']:.0f} ms wall, "
            f"GPU busy {figures['profile_device_busy_ms']:.0f} ms")


def busy_us(events: Any) -> float:
    """Microseconds covered by the union of the device (kernel and copy) events' intervals."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if getattr(e, "device_type", None) == DeviceType.CUDA and e.time_range.end > e.time_range.start)
    busy, end = 0.0, float("-inf")
    for s, e in spans:
        if s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy


def format_profile(rows: list[dict[str, Any]]) -> str:
    """A markdown table of the ``profile`` rows of :func:`profile_figures`."""
    lines = ["| operator | calls / step | self ms / step | share |", "|---|---:|---:|---:|"]
    lines += [f"| `{r['name']}` | {r['calls']} | {r['self_ms']:.2f} | {100 * r['share']:.1f}% |" for r in rows]
    return "\n".join(lines)


def logged_perf(run_dir: Path) -> dict[str, float]:
    """Means of the ``perf/mfu`` and ``perf/tokens_per_s`` a fit logged (:class:`StepWork`) in ``run_dir``'s CSV log
    (``csv/metrics.csv``), keyed ``mfu`` / ``tokens_per_s``; a figure never logged (no GPU, no CSV) is absent."""
    path = Path(run_dir) / "csv" / "metrics.csv"
    values: dict[str, list[float]] = {}
    if path.is_file():
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                for key in ("perf/mfu", "perf/tokens_per_s"):
                    if row.get(key):
                        values.setdefault(key, []).append(float(row[key]))
    return {k.split("/")[1]: sum(v) / len(v) for k, v in values.items()}
