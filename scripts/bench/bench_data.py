#!/usr/bin/env python
"""Is the data loader ever the bottleneck?  Loader throughput against training-step throughput, per experiment.

    python scripts/bench/bench_data.py                                   # every CPU experiment, its own defaults
    python scripts/bench/bench_data.py --experiments berson_finetune clipvil_pretrain --batches 20 --steps 8
    python scripts/bench/bench_data.py --experiments order_baseline --workers 0 2 -- data.batch_size=32

For each experiment the config is composed exactly as ``python train.py experiment=NAME [OVERRIDES]``
would compose it (its defaults, the data it names, ``trainer.precision`` as configured: ``auto_precision``
picks bf16-mixed on a CPU with AMX / AVX512-BF16).  Then, in one process:

* **loader**: batches/s of the training loader alone (view + collator + ``DataLoader`` with
  ``data.num_workers``, or each ``--workers`` value), over ``--batches`` batches after one warm-up batch;
* **step**: optimizer steps/s of ``Trainer.fit`` (forward, loss, backward, clipping, optimizer step),
  timed between ``on_train_batch_start`` and ``on_train_batch_end`` so the loader's own time is left
  out, over ``--steps`` steps after ``--warmup`` untimed ones; no validation;
* **next epoch**: for epochs of at most ``WARM_EPOCH_BATCHES`` batches, the loader again after one whole
  epoch, when decoded images and tokenised step texts come from the collator's memory
  (``data.collator.image_cache_mb``, :class:`data_modules.collate.StepTokens`);
* **ratio** = loader batches/s / training steps/s: how many batches the loader makes in the time one
  step takes.  With ``num_workers=0`` the loader runs between steps in the training process, so a
  ratio r costs 1/r of the step time (r >= 5: at most 20%, the target of the speed issue);
* **run** ratio: over the epochs a run of the experiment trains (``trainer.max_epochs``, or the epochs
  ``trainer.max_steps`` spans: :func:`run_epochs`), the first epoch at its ratio and the others at the
  next epoch's (:func:`run_ratio`); the target is judged on it (``ok``).

Experiments that need a GPU model from the hub (``teo_lora_internvl``, ``teo_lora_modalities``: the
InternVL3.5-8B processor and weights) are listed as skipped on a machine without them; their data path
is ``teo_lora_synthetic``'s.  Prints a table and one line ``BENCH_DATA_JSON [{...}, ...]``; ``--json``
also writes the rows to a file.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MARKER = "BENCH_DATA_JSON"
HUB_ONLY = {"teo_lora_internvl": "InternVL3.5-8B processor and weights (hub; GPU)",
            "teo_lora_modalities": "InternVL3.5-8B processor and weights (hub; GPU)"}
TARGET_RATIO = 5.0
WARM_EPOCH_BATCHES = 400   # epochs up to this long are also measured a second time (decoded images cached)


def experiments() -> list[str]:
    return sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))


def compose(experiment: str, overrides: Sequence[str], run_dir: Path) -> Any:
    from seqaware.config import compose_train

    return compose_train([f"experiment={experiment}", f"paths.output_dir={run_dir}", *overrides])


def loader_rate(datamodule: Any, batches: int) -> tuple[float, int, Optional[float], int]:
    """Training-loader batches/s over ``batches`` batches after one warm-up batch (fewer if the epoch is
    shorter; a whole-set batch, one per epoch, has no batch to spare for a warm-up): the first epoch's
    (images decoded from their files), and, when an epoch has at most ``WARM_EPOCH_BATCHES`` batches, the
    next epoch's (decoded images and step tokens served from the collator's memory,
    ``data.collator.image_cache_mb``; None for longer epochs).  Returns ``(first, batches timed in the
    first epoch, next, batches per epoch)``."""
    loader = datamodule.train_dataloader()
    per_epoch = len(loader)
    epochs = 2 if per_epoch <= WARM_EPOCH_BATCHES else 1
    rates, counts = [], []
    for epoch in range(epochs):
        it = iter(loader if epoch == 0 else datamodule.train_dataloader())
        if per_epoch > 1:
            next(it)  # worker start-up, tokenizer / processor load
        count, start = 0, time.perf_counter()
        for _ in it:
            count += 1
            if count >= batches:
                break
        rates.append(count / (time.perf_counter() - start) if count else None)
        counts.append(count)
        if epoch + 1 < epochs:
            for _ in it:  # the rest of the epoch (untimed): what fills the collator's caches
                pass
    return rates[0], counts[0], rates[1] if epochs > 1 else None, per_epoch


def step_rate(cfg: Any, datamodule: Any, steps: int, warmup: int) -> float:
    """Optimizer steps/s of ``Trainer.fit`` on the experiment's module, data time left out."""
    import pytorch_lightning as pl
    from hydra.utils import instantiate

    class StepTimer(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._start = 0.0

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self.times.append(time.perf_counter() - self._start)

    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    model = instantiate(cfg.model)
    timer = StepTimer()
    trainer = pl.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                         max_steps=warmup + steps, max_epochs=warmup + steps,   # whole-set batches: one step per epoch
                         limit_val_batches=0, num_sanity_val_steps=0,
                         default_root_dir=cfg.paths.output_dir,   # what a run writes (encoder.pt) stays in --run-dir
                         gradient_clip_val=cfg.trainer.get("gradient_clip_val"),
                         accumulate_grad_batches=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
                         use_distributed_sampler=False)
    trainer.fit(model, datamodule=datamodule)
    timed = timer.times[warmup:]
    if not timed:
        raise RuntimeError(f"no timed training step (the epoch has {len(timer.times)} batches)")
    return 1.0 / statistics.median(timed)


def bench(experiment: str, overrides: Sequence[str], batches: int, steps: int, warmup: int,
          workers: Optional[int], run_dir: Path) -> dict[str, Any]:
    from hydra.utils import instantiate

    extra = [*overrides] + ([f"data.num_workers={workers}"] if workers is not None else [])
    cfg = compose(experiment, extra, run_dir)
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    loader_bps, measured, warm_bps, per_epoch = loader_rate(datamodule, batches)
    steps_ps = step_rate(cfg, datamodule, steps, warmup)
    batch_size = cfg.data.get("batch_size")
    ratio, ratio_warm = loader_bps / steps_ps, (warm_bps / steps_ps if warm_bps else None)
    epochs = run_epochs(cfg.trainer.get("max_epochs"), cfg.trainer.get("max_steps"), per_epoch)
    ratio_run = run_ratio(ratio, ratio_warm, epochs)
    return {"experiment": experiment, "batch_size": int(batch_size) if batch_size is not None else "all",
            "num_workers": int(cfg.data.get("num_workers", 0)), "precision": str(cfg.trainer.precision),
            "loader_batches_per_s": loader_bps, "loader_batches": measured, "train_steps_per_s": steps_ps,
            "ratio": ratio, "loader_warm_batches_per_s": warm_bps, "ratio_warm": ratio_warm,
            "run_epochs": epochs, "ratio_run": ratio_run, "ok": ratio_run >= TARGET_RATIO}


def run_epochs(max_epochs: Optional[int], max_steps: Optional[int], batches_per_epoch: int) -> int:
    """Epochs a run of the experiment trains: ``trainer.max_epochs`` or the epochs ``trainer.max_steps``
    spans, whichever ends the run first (:func:`seqaware.callbacks.fit_length`; a value <= 0 or None: no
    bound; neither bound: 1)."""
    from seqaware.callbacks import fit_length

    def bound(value: Optional[int]) -> int:
        return int(value) if value is not None and int(value) > 0 else -1

    batches = fit_length(bound(max_steps), bound(max_epochs), max(1, batches_per_epoch)).batches
    return max(1, math.ceil(batches / max(1, batches_per_epoch))) if math.isfinite(batches) else 1


def run_ratio(first: float, warm: Optional[float], epochs: int) -> float:
    """The loader / step ratio over a whole run of ``epochs`` epochs: the first epoch at ``first``, the
    others at ``warm`` (decoded images and step tokens cached; ``first`` when not measured).  A ratio r
    costs 1/r of the step time, so the run's ratio is the harmonic mean, epochs weighted alike."""
    later = warm if warm else first
    return epochs / (1.0 / first + (epochs - 1) / later)


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| experiment | batch | workers | precision | loader batches/s | train steps/s | loader / step | "
             "next epoch: loader / step | epochs | run: loader / step |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "skipped" in r or "error" in r:
            what = f"skipped: {r['skipped']}" if "skipped" in r else f"FAILED: {r['error'][:120]}"
            lines.append(f"| {r['experiment']} | | | | {what} | | | | | |")
            continue
        flag = "" if r["ok"] else f" (< {TARGET_RATIO:g})"
        lines.append(f"| {r['experiment']} | {r['batch_size']} | {r['num_workers']} | {r['precision']} | "
                     f"{r['loader_batches_per_s']:.2f} | {r['train_steps_per_s']:.2f} | {r['ratio']:.1f} | "
                     f"{format(r['ratio_warm'], '.1f') if r.get('ratio_warm') else '-'} | {r['run_epochs']} | "
                     f"{r['ratio_run']:.1f}{flag} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides: list[str] = []
    if "--" in argv:
        overrides = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", nargs="+", default=["all"], help="experiment names, or all (default)")
    parser.add_argument("--batches", type=int, default=20, help="timed loader batches (after one warm-up batch)")
    parser.add_argument("--steps", type=int, default=6, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed training steps first")
    parser.add_argument("--workers", type=int, nargs="+", default=None,
                        help="data.num_workers values to measure (default: each experiment's own)")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "logs" / "bench_data", help="scratch output folder")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    names = experiments() if args.experiments == ["all"] else args.experiments
    unknown = sorted(set(names) - set(experiments()))
    if unknown:
        parser.error(f"unknown experiments {unknown}; choose from {experiments()}")
    rows: list[dict[str, Any]] = []
    for name in names:
        if name in HUB_ONLY:
            rows.append({"experiment": name, "skipped": HUB_ONLY[name]})
            continue
        for workers in args.workers or [None]:
            start = time.perf_counter()
            try:
                row = bench(name, overrides, args.batches, args.steps, args.warmup, workers, args.run_dir / name)
            except Exception as err:  # one experiment's failure is reported, the others are still measured
                traceback.print_exc()
                rows.append({"experiment": name, "error": f"{type(err).__name__}: {err}"})
                print(f"{name}: FAILED ({type(err).__name__}: {err})", flush=True)
                continue
            row["seconds"] = time.perf_counter() - start
            rows.append(row)
            print(f"{name}: loader {row['loader_batches_per_s']:.2f} batches/s, training {row['train_steps_per_s']:.2f} "
                  f"steps/s, ratio {row['ratio']:.1f} ({row['seconds']:.0f} s)", flush=True)
    print(table(rows))
    print(f"{MARKER} {json.dumps(rows)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    sys.exit(1 if any("error" in row for row in main()) else 0)
