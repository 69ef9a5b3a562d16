#!/usr/bin/env python
"""Is image-swap prediction (ISP) learnable from the frozen visual features, and how fast does the
encoder pick it up?  A diagnostic for "ISP stays at chance" (docs/results/pretraining.md).

    python scripts/studies/isp_probe.py                                    # CLIP-ViL offline preset, std 0.02 vs 0.1
    python scripts/studies/isp_probe.py --steps 400 --step-init-std 0.02 0.1 0.3
    python scripts/studies/isp_probe.py -- data.collator.image_size=224    # Hydra overrides after --

1. Caches the visual backbone's features (frozen, as at initialisation) of ``--train-batches``
   training batches and ``--val-batches`` validation batches of ``experiment=clipvil_pretrain
   objectives=mlm_isp`` (the synthetic default), so no backbone runs in the loops below.
2. **Order probe**: a logistic regression on ``[f_i, f_j, f_i - f_j]`` (mean-pooled features of two
   images of one procedure) predicting whether image i comes before image j; fitted on the pairs of
   the first 80% of the training sequences, scored on the validation sequences' pairs.  High
   accuracy = the swap is visible in the features.
3. **Encoder runs**: for every ``--step-init-std`` value, a fresh pretraining module (same seed;
   ``model.encoder.step_init_std=V``) trained ``--steps`` steps of MLM + ISP on the cached features
   (AdamW, the experiment's lr unless ``--lr``); prints validation ISP / MLM accuracy every
   ``--eval-every`` steps (each validation batch with its own corruption seed).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from seqaware.config import compose_train  # noqa: E402
from seqaware.encoders.base import step_visual_features  # noqa: E402


@torch.no_grad()
def cache_features(encoder, loader, count: int) -> list[dict]:
    """``count`` batches of ``loader`` with ``visual_feats (B, S, P, D)`` in place of the pixels."""
    encoder.eval()
    out = []
    for batch in loader:
        if len(out) >= count:
            break
        batch = dict(batch)
        batch["visual_feats"], patch_mask, _ = step_visual_features(encoder, batch)
        if patch_mask is not None:
            batch["patch_mask"] = patch_mask
        del batch["pixel_values"]
        out.append(batch)
    return out


def order_pairs(batches: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[f_i, f_j, f_i - f_j]`` for every ordered pair of distinct images of a sequence; label i < j."""
    xs, ys = [], []
    for batch in batches:
        pooled, mask = batch["visual_feats"].mean(2), batch["image_mask"].bool()
        for b in range(pooled.shape[0]):
            shown = mask[b].nonzero().squeeze(-1).tolist()
            for i in shown:
                for j in shown:
                    if i != j:
                        xs.append(torch.cat([pooled[b, i], pooled[b, j], pooled[b, i] - pooled[b, j]]))
                        ys.append(float(i < j))
    if not xs:
        raise SystemExit("no sequence with two images in the cached batches")
    return torch.stack(xs), torch.tensor(ys)


def order_probe(train: list[dict], val: list[dict], epochs: int = 300) -> float:
    x, y = order_pairs(train)
    xv, yv = order_pairs(val)
    mean, std = x.mean(0), x.std(0) + 1e-4
    x, xv = (x - mean) / std, (xv - mean) / std
    torch.manual_seed(0)
    probe = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.AdamW(probe.parameters(), lr=1e-3, weight_decay=0.1)
    for _ in range(epochs):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(probe(x).squeeze(-1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(((probe(xv).squeeze(-1) > 0).float() == yv).float().mean())


@torch.no_grad()
def evaluate(module, batches: list[dict]) -> dict[str, float]:
    module.eval()
    sums: dict[str, list[float]] = {}
    for i, batch in enumerate(batches):
        for name in module.schedule.rotating:
            _, logs, _ = module.compute_losses(batch, module.schedule.always + (name,), f"probe-eval-{i}")
            for key, value in logs.items():
                if key.endswith("_acc"):
                    sums.setdefault(key, []).append(float(value))
    module.train()
    return {k: sum(v) / len(v) for k, v in sums.items()}


def train_encoder(cfg, train: list[dict], val: list[dict], steps: int, lr: float | None, eval_every: int,
                  seed: int) -> list[tuple[int, dict[str, float], float]]:
    from hydra.utils import instantiate

    torch.manual_seed(seed)
    module = instantiate(cfg.model)
    module.encoder.visual = None  # the batches carry the cached features
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr or float(cfg.model.optimizer.lr),
                            weight_decay=float(cfg.model.optimizer.get("weight_decay", 0.01)))
    module.train()
    rows, start = [], time.time()
    for step in range(steps):
        names = module.schedule.draw(step)
        loss, _, _ = module.compute_losses(train[step % len(train)], names, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            rows.append((step + 1, evaluate(module, val), time.time() - start))
            print(f"  step {step + 1}: " + " ".join(f"{k} {v:.3f}" for k, v in rows[-1][1].items())
                  + f" ({rows[-1][2]:.0f} s)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="clipvil_pretrain")
    parser.add_argument("--objectives", default="mlm_isp", help="objective set of the encoder runs (needs isp)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--train-batches", type=int, default=75, help="cached training batches (cycled)")
    parser.add_argument("--val-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--lr", type=float, default=None, help="default: the experiment's model.optimizer.lr")
    parser.add_argument("--step-init-std", type=float, nargs="+", default=[0.02, 0.1])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    base = [f"experiment={args.experiment}", f"objectives={args.objectives}", f"data.batch_size={args.batch_size}",
            f"data.eval_batch_size={args.batch_size}", "paths.output_dir=${paths.log_dir}/isp_probe"] + overrides
    cfg = compose_train(base)
    if "isp" not in str(cfg.model.objectives.enabled):
        raise SystemExit(f"--objectives {args.objectives}: the set has no ISP")
    from hydra.utils import instantiate

    data = instantiate(cfg.data)
    data.prepare_data()
    data.setup("fit")
    torch.manual_seed(args.seed)
    encoder = instantiate(cfg.model).encoder
    start = time.time()
    train = cache_features(encoder, data.train_dataloader(), args.train_batches)
    val = cache_features(encoder, data.val_dataloader(), args.val_batches)
    del encoder
    print(f"cached {sum(len(b['meta']) for b in train)} training + {sum(len(b['meta']) for b in val)} validation "
          f"sequences ({time.time() - start:.0f} s)", flush=True)

    cut = max(1, int(0.8 * len(train)))
    print(f"order probe (logistic regression on two images' pooled features): validation pair accuracy "
          f"{order_probe(train[:cut], val):.3f}", flush=True)

    results = {}
    for std in args.step_init_std:
        print(f"encoder, step_init_std={std}:", flush=True)
        run_cfg = compose_train(base + [f"model.encoder.step_init_std={std}"])
        results[std] = train_encoder(run_cfg, train, val, args.steps, args.lr, args.eval_every, args.seed)
    print("\n| step_init_std | " + " | ".join(f"step {s}" for s, _, _ in results[args.step_init_std[0]]) + " |")
    print("|---|" + "---|" * len(results[args.step_init_std[0]]))
    for std, rows in results.items():
        print(f"| {std} | " + " | ".join(f"ISP {r['isp_acc']:.3f} / MLM {r.get('mlm_acc', float('nan')):.3f}"
                                         for _, r, _ in rows) + " |")


if __name__ == "__main__":
    main()
