#!/usr/bin/env python
"""Data-loading throughput: procedures per second through view + collator + DataLoader.

    python scripts/bench_data.py                       # synthetic default, 0 and 2 workers
    python scripts/bench_data.py --workers 0 2 4 --image-size 224 --batches 40

Prints, per worker count, procedures/s and batches/s over a full pass (or --batches batches),
after one warm-up batch.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_modules.datamodule import ProcedureDataModule  # noqa: E402
from data_modules.sources import synthetic_source  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=str(Path(__file__).resolve().parents[1] / ".cache" / "synthetic"))
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batches", type=int, default=0, help="batches per measurement (0: one epoch)")
    parser.add_argument("--task", default="sequencing", choices=["sequencing", "pretraining"])
    args = parser.parse_args()

    start = time.perf_counter()
    source = lambda **kw: synthetic_source(cache_dir=args.cache_dir, **kw)  # noqa: E731
    source()
    print(f"synthetic data ready in {time.perf_counter() - start:.1f}s (generation time if not cached)")
    for workers in args.workers:
        dm = ProcedureDataModule(source, task=args.task, batch_size=args.batch_size, num_workers=workers,
                                 collator={"image_size": args.image_size})
        dm.setup("fit")
        loader = dm.train_dataloader()
        it = iter(loader)
        next(it)  # warm-up: worker start, tokenizer load
        count, batches, t0 = 0, 0, time.perf_counter()
        for batch in it:
            count += len(batch["meta"])
            batches += 1
            if args.batches and batches >= args.batches:
                break
        dt = time.perf_counter() - t0
        print(f"workers={workers}: {count / dt:.1f} procedures/s, {batches / dt:.2f} batches/s "
              f"(batch {args.batch_size}, images {args.image_size}px, {count} procedures in {dt:.1f}s)")


if __name__ == "__main__":
    main()
