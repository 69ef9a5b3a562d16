#!/usr/bin/env python
"""Decoding and BERSON training throughput.

    python scripts/bench_decode.py                       # decoders at n = 5, 10, 20 + BERSON training on CPU
    python scripts/bench_decode.py --train-only --bf16   # training samples/s under bf16 autocast

Decoders: procedures/s of the pointer network's greedy and beam-16 search and of the pairwise
topological sort (and the exact decoder at n <= 10), on random BERSON states of hidden size 384
(MiniLM), batch 32.  Training: samples/s of the full BERSON step (pair encoding with the offline
MiniLM encoder + decoder + backward + AdamW) on ROC-like 5-step stories, 4 per step.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decoders import PAIRWISE_DECODERS  # noqa: E402
from decoders.berson import BersonDecoder, pair_index  # noqa: E402


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def bench_decoders(hidden: int, batch: int, sizes: list[int], beam: int, repeats: int) -> None:
    torch.manual_seed(0)
    decoder = BersonDecoder(hidden).eval()
    print(f"decoders (hidden {hidden}, batch {batch}, beam {beam}): procedures/s")
    print("| n | greedy | beam | topological | exact |\n|---:|---:|---:|---:|---:|")
    for n in sizes:
        mask = torch.ones(batch, n, dtype=torch.bool)
        b, i, j = pair_index(mask)
        with torch.inference_mode():
            state = decoder.encode(*(torch.randn(len(b), hidden) for _ in range(3)), (b, i, j), mask)
            rows = {
                "greedy": _timed(lambda: decoder.greedy(state), repeats),
                "beam": _timed(lambda: decoder.beam_search(state, beam), repeats),
                "topological": _timed(lambda: PAIRWISE_DECODERS["topological"](state.pair_logits, mask), repeats),
            }
            if n <= 10:
                rows["exact"] = _timed(lambda: PAIRWISE_DECODERS["exact"](state.pair_logits, mask), 1)
        cells = [f"{batch / rows[k]:.0f}" if k in rows else "-" for k in ("greedy", "beam", "topological", "exact")]
        print(f"| {n} | " + " | ".join(cells) + " |")


def bench_training(steps: int, batch: int, bf16: bool, device: str, text: str = "offline:minilm",
                   random_weights: bool = False) -> None:
    from data_modules.collate import StepCollator
    from data_modules.views import SequencingView
    from seqaware.modules.berson import BersonModule
    from seqaware.pretrained import load_tokenizer
    from seqaware.procedure import Procedure, Step

    words = "she went to the store and bought some milk then came home happy after a long day".split()
    g = torch.Generator().manual_seed(0)
    procs = []
    for k in range(batch * (steps + 2)):
        sents = [" ".join(words[int(x)] for x in torch.randint(len(words), (9,), generator=g)) for _ in range(5)]
        procs.append(Procedure(id=f"p{k}", title="", split="train", steps=[Step(text=s) for s in sents]))
    view = SequencingView(procs, seed=0)
    collate = StepCollator(tokenizer=load_tokenizer(text), max_tokens=35, use_images=False)
    encoder = {"_target_": "seqaware.encoders.text.TextEncoder", "name_or_path": text}
    if random_weights:  # same architecture, random init: throughput only (e.g. on a machine without the weights)
        from transformers import AutoConfig

        from seqaware.pretrained import resolve_name

        encoder["config"] = AutoConfig.from_pretrained(resolve_name(text)).to_dict()
        encoder["tokenizer"] = text
    model = BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 2e-5}).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)

    def step(k: int) -> None:
        batch_ = collate([view[k * batch + x] for x in range(batch)])
        batch_ = {key: v.to(device) if torch.is_tensor(v) else v for key, v in batch_.items()}
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            loss = model._losses(batch_)[0]["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()

    step(0)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for k in range(1, steps + 1):
        step(k)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    mem = f", peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device == "cuda" else ""
    print(f"BERSON training ({device}, {'bf16 autocast' if bf16 else 'fp32'}, MiniLM, 5-step stories x {batch}): "
          f"{steps * batch / elapsed:.2f} samples/s, {elapsed / steps:.2f} s/step{mem}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--beam", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=10)
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--text", default="offline:minilm", help="text encoder weights (alias, folder or hub id)")
    parser.add_argument("--random-weights", action="store_true", help="the text encoder's architecture with random weights")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--train-only", action="store_true")
    parser.add_argument("--decode-only", action="store_true")
    args = parser.parse_args()
    if not args.train_only:
        bench_decoders(args.hidden, args.batch, args.sizes, args.beam, args.repeats)
    if not args.decode_only:
        bench_training(args.train_steps, args.train_batch, args.bf16, args.device, args.text, args.random_weights)


if __name__ == "__main__":
    main()
