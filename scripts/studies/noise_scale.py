#!/usr/bin/env python
r"""The gradient noise scale of a BERSON run (McCandlish et al. 2018; :mod:`seqaware.noise_scale`): how many
stories a step can hold before a larger batch needs more epochs, and the epochs it predicts a batch needs.

    python scripts/studies/noise_scale.py --run logs/bigbatch/recipe-roc_joint/seed0
    python scripts/studies/noise_scale.py --run RUN --at init last --small 16 --big 128 --batches 16 --compare 140.8

``--run`` is a finished (or cut) ``train.py`` run folder: its ``.hydra/overrides.yaml`` composes the model and
the data again (with ``data.batch_size=--small`` and no token budget), and ``--at`` names where to measure:
``init`` (the model as the run built it: the pretrained encoder and a freshly seeded head), ``last`` and
``best`` (its ``checkpoints/last.ckpt`` and ``best*.ckpt``) or a checkpoint path.  For each of ``--batches``
big batches of ``--big`` training stories (consecutive batches of ``--small`` of the run's shuffled training
loader), the script takes the gradient of the training loss (train mode, dropout on, float32) of every small
batch, and of their mean (the big batch's gradient: every ROC story has 5 sentences, so the mean of the small
batches' mean losses is the big batch's); ``|G|^2`` and ``tr(Sigma)`` come from the two squared norms
(their appendix A.1), ``B_simple`` from their means with a bootstrap 95% interval over the big batches.  Each
``--compare`` batch gets section 2.3's epoch factor against ``--small`` at each point (the epochs it needs, near
that point, for the progress ``--small`` makes), and, from two or more points (say the init, checkpoints saved
along the run and its last), the whole run's factor: that factor stretch by stretch, each weighted by its steps
(:func:`seqaware.noise_scale.run_epoch_factor`).  Writes ``--out`` (default ``RUN/noise_scale.json``).

    python scripts/studies/noise_scale.py --run RUN --at init RUN/steps/*.ckpt last --compare 140.8
    # RUN trained with a weights checkpoint every 65 steps: train.py ... \
    #   +callbacks.steps._target_=pytorch_lightning.callbacks.ModelCheckpoint +callbacks.steps.every_n_train_steps=65 \
    #   +callbacks.steps.save_top_k=-1 +callbacks.steps.save_weights_only=true +callbacks.steps.monitor=null \
    #   '+callbacks.steps.dirpath=${paths.output_dir}/steps' '+callbacks.steps.filename="step_{step:05d}"'
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from seqaware.io import atomic_open  # noqa: E402
from seqaware.noise_scale import epoch_factor, run_epoch_factor, simple_noise_scale, unbiased_terms  # noqa: E402


def build(run: Path, small: int):
    """The run's data module (set up for fitting, ``small`` stories a batch) and its composed config."""
    from hydra.utils import instantiate

    from seqaware.config import compose_train
    from seqaware.run_reuse import saved_overrides

    overrides = saved_overrides(run)
    if overrides is None:
        raise SystemExit(f"{run}: no .hydra/overrides.yaml; --run takes a train.py run folder")
    cfg = compose_train([*overrides, f"paths.output_dir={run}", f"data.batch_size={small}", "data.batch_tokens=null",
                         "data.num_workers=0"])
    data = instantiate(cfg.data)
    data.prepare_data()
    data.setup("fit")
    return data, cfg


def load_model(cfg, run: Path, at: str):
    """``(module, optimizer steps it was trained)`` at ``at``: init, last, best or a checkpoint path."""
    import pytorch_lightning as pl
    from hydra.utils import get_class, instantiate

    from seqaware.checkpoint_io import load_checkpoint

    if at == "init":
        pl.seed_everything(int(cfg.seed), verbose=False)
        return instantiate(cfg.model), 0
    if at in ("last", "best"):
        found = sorted((run / "checkpoints").glob("last.ckpt" if at == "last" else "best*.ckpt"))
        if not found:
            raise SystemExit(f"{run / 'checkpoints'}: no {at} checkpoint")
        path = found[-1]
    else:
        path = Path(at)
        if not path.is_file():
            raise SystemExit(f"--at {at}: not init, last, best or a checkpoint file")
    step = int(load_checkpoint(path)["global_step"])
    return get_class(cfg.model._target_).load_from_checkpoint(str(path), map_location="cpu"), step


def flat_grad(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])


def measure(model, loader, small: int, big: int, batches: int, seed: int = 0) -> list[tuple[float, float]]:
    """One :func:`unbiased_terms` pair per big batch of ``big // small`` consecutive full small batches."""
    per_big = big // small
    model.float().train()
    torch.manual_seed(seed)                   # the dropout masks: the same at every point measured
    params = [p for p in model.parameters() if p.requires_grad]
    terms, total, small_sq, count = [], None, 0.0, 0   # one big batch's running sum of gradients, of squared norms
    for batch in loader:
        if len(batch["meta"]) != small:
            continue
        model.zero_grad(set_to_none=True)
        losses, _ = model._losses(batch)
        losses["loss"].backward()
        grad = flat_grad(params)
        total = grad if total is None else total.add_(grad)
        small_sq, count = small_sq + float(grad.square().sum()), count + 1
        if count == per_big:
            big_sq = float(total.div_(per_big).square().sum())
            terms.append(unbiased_terms(small_sq / per_big, big_sq, small, per_big * small))
            total, small_sq, count = None, 0.0, 0
            if len(terms) == batches:
                break
    model.zero_grad(set_to_none=True)
    if len(terms) < batches:
        raise SystemExit(f"the training loader gave {len(terms)} big batches of {per_big * small}, not {batches}")
    return terms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a train.py run folder (its .hydra/overrides.yaml)")
    parser.add_argument("--at", nargs="+", default=["init", "last"], help="init | last | best | checkpoint paths")
    parser.add_argument("--small", type=int, default=16, help="stories in a small batch")
    parser.add_argument("--big", type=int, default=128, help="stories in a big batch (a multiple of --small)")
    parser.add_argument("--batches", type=int, default=16, help="big batches to average over")
    parser.add_argument("--compare", type=float, nargs="*", default=[], help="batch sizes to predict epochs for")
    parser.add_argument("--out", type=Path, default=None, help="the JSON written (default RUN/noise_scale.json)")
    args = parser.parse_args()
    if args.small < 1 or args.big % args.small or args.big <= args.small:
        raise SystemExit(f"--big ({args.big}) must be a multiple of --small ({args.small}) and larger")
    data, cfg = build(args.run, args.small)
    records = []
    for at in args.at:
        start = time.perf_counter()
        model, step = load_model(cfg, args.run, at)
        terms = measure(model, data.train_dataloader(), args.small, args.big, args.batches, int(cfg.seed))
        scale = simple_noise_scale(terms)
        record = {"at": at, "step": step, "b_simple": scale.b_simple, "ci95": [scale.low, scale.high], "g2": scale.g2,
                  "trace": scale.trace, "big_batches": scale.batches, "small": args.small, "big": args.big,
                  "seconds": round(time.perf_counter() - start, 1),
                  "epoch_factor": {}}
        if 0 < scale.b_simple < math.inf:      # a mean |G|^2 or tr(Sigma) under 0: too few batches to predict
            record["epoch_factor"] = {str(b): epoch_factor(b, args.small, scale.b_simple) for b in args.compare}
        records.append(record)
        factors = "".join(f"; batch {b}: x {f:.2f} the epochs of {args.small}" for b, f in
                          record["epoch_factor"].items())
        print(f"{at} (step {step}): B_simple {scale.b_simple:.1f} stories (95% CI {scale.low:.1f}-{scale.high:.1f}; "
              f"|G|^2 {scale.g2:.4g}, tr(Sigma) {scale.trace:.4g}; {scale.batches} batches of {args.big}, "
              f"{record['seconds']:.0f} s){factors}", flush=True)
    usable = [r for r in sorted(records, key=lambda r: r["step"]) if 0 < r["b_simple"] < math.inf]
    steps = [r["step"] for r in usable]
    whole = {}
    if len(usable) >= 2 and len(set(steps)) == len(steps):
        for b in args.compare:   # the epoch factor stretch by stretch (seqaware.noise_scale.run_epoch_factor)
            whole[str(b)] = run_epoch_factor(b, args.small, [r["b_simple"] for r in usable], steps)
            print(f"the run, steps {steps[0]}-{steps[-1]} ({len(usable)} points): batch {b} needs "
                  f"x {whole[str(b)]:.2f} the epochs of {args.small}")
    out = args.out or args.run / "noise_scale.json"
    with atomic_open(out) as handle:
        json.dump({"run": str(args.run), "records": records, "run_epoch_factor": whole}, handle, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
