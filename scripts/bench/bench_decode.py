#!/usr/bin/env python
"""Decoding and BERSON training throughput.

    python scripts/bench/bench_decode.py                       # decoders at n = 5, 10, 20 + BERSON training on CPU
    python scripts/bench/bench_decode.py --train-only --bf16   # training samples/s under bf16 autocast (a CPU with
                                                         # AVX512-BF16 / AMX, or a GPU: elsewhere bf16 is emulated, ~20x slower)
    python scripts/bench/bench_decode.py --pair-encodings --sizes 5 10 20 --json /tmp/bench_decode.json
    python scripts/bench/bench_decode.py --pair-encodings --sizes 5 --steps 2          # < 1 minute on a CPU
    python scripts/bench/bench_decode.py --packing joint --steps 20                     # padded vs packed, roc_joint's step

Decoders: procedures/s of the pointer network's greedy and beam-16 search and of the pairwise
topological sort (and the exact decoder at n <= 10), on random BERSON states of hidden size 384
(MiniLM), batch 32.  Training: samples/s of the full BERSON step (pair encoding with the offline
MiniLM encoder + decoder + backward + AdamW) on ROC-like 5-step stories, 4 per step.

``--pair-encodings``: BERSON's two pair encodings (``model.pair_encoding``) side by side in one run,
per procedure of n steps (``--sizes``) and modality (``--modalities``): ``text`` (MiniLM, offline
weights) and ``multimodal`` (CLIP-ViL-style single-stream: MiniLM + EfficientNet-Lite0 grid tokens,
the offline backbones, random images of ``--image-size`` px).  Figures per procedure: encoder passes,
real encoder tokens (text + visual), forward FLOPs of the sequence encoder (measured with
``torch.utils.flop_counter.FlopCounterMode``; the visual backbone runs once per step image in both
paths and is left out) and of the whole encoding, and the training step time (forward + backward +
AdamW; ``--train-batch`` procedures per step, default 4 as the BERSON experiments train; the median of
``--steps`` steps after one warm-up, the two paths' steps alternating so that
the load of a shared machine falls on both alike) with the joint/pairwise speed-up.
``--random-weights``: the same architectures with random weights (timing only).  Prints a table and
one line ``BENCH_DECODE_JSON [{...}, ...]``; ``--json PATH`` writes the same list.

``--packing joint pairwise``: the padded and the packed encoder pass (``model.packed``) side by side on
ROCStories (``--stories``, default the shared dev.tsv; ``--train-batch`` stories a step, default 16 as
``hparams=roc_joint``): per step the real tokens, the padding share, the model FLOPs from the real tokens
(:mod:`seqaware.profiling`, the one home for counting), tokens/s, TFLOP/s, MFU on a GPU, the machine, and the
packed/padded speed-up.  ``python scripts/bench/bench_decode.py --packing joint --steps 20`` (the roc_joint step), or
``--packing pairwise --train-batch 4`` (berson_roc's pairwise step).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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
    from seqaware.profiling import machine

    print(f"BERSON training on {machine(device)} ({device}, {'bf16 autocast' if bf16 else 'fp32'}, MiniLM, 5-step "
          f"stories x {batch}): "
          f"{steps * batch / elapsed:.2f} samples/s, {elapsed / steps:.2f} s/step{mem}")


MARKER = "BENCH_DECODE_JSON"
WORDS = "she went to the store and bought some milk then came home happy after a long day".split()


def _procedure_batch(n: int, batch: int, modality: str, text: str, image_size: int, seed: int = 0) -> dict:
    """``batch`` shuffled procedures of ``n`` 9-word steps, collated; random step images unless text."""
    from data_modules.collate import StepCollator
    from data_modules.views import SequencingView
    from seqaware.pretrained import load_tokenizer
    from seqaware.procedure import Procedure, Step

    g = torch.Generator().manual_seed(seed)
    procs = [Procedure(id=f"p{k}", title="", split="train",
                       steps=[Step(text=" ".join(WORDS[int(x)] for x in torch.randint(len(WORDS), (9,), generator=g)))
                              for _ in range(n)]) for k in range(batch)]
    view = SequencingView(procs, max_steps=n, seed=seed)
    collate = StepCollator(tokenizer=load_tokenizer(text), max_steps=n, max_tokens=35, use_images=False)
    out = collate([view[k] for k in range(batch)])
    if modality == "multimodal":
        out["pixel_values"] = torch.randn(batch, n, 3, image_size, image_size, generator=g)
        out["image_mask"] = out["step_mask"].clone()
    return out


def _berson(modality: str, pair_encoding: str, text: str, random_weights: bool, **options):
    from seqaware.modules.berson import BersonModule

    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text" if modality == "text" else "clipvil",
               "name_or_path": text, "tokenizer": text}
    if random_weights:
        from transformers import AutoConfig

        from seqaware.pretrained import resolve_name

        encoder["config"] = AutoConfig.from_pretrained(resolve_name(text)).to_dict()
    if modality == "multimodal":  # configs/backbones/offline.yaml, the encoder's defaults (step embedding, 16 steps)
        encoder["visual"] = {"name": "efficientnet_lite0", "pretrained": not random_weights}
    torch.manual_seed(0)
    return BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 2e-5},
                        pair_encoding=pair_encoding, **options)


def _encoder_load(model, batch: dict) -> dict:
    """Encoder passes, real tokens and forward FLOPs of encoding ``batch`` once (no gradients)."""
    from torch.utils.flop_counter import FlopCounterMode

    seen = {"passes": 0, "tokens": 0}
    encoder = model.encoder
    forward = encoder.forward

    def counting(fusion: dict):
        rows = 0
        if "attention_mask" in fusion:
            seen["tokens"] += int(fusion["attention_mask"].sum())
            rows = fusion["attention_mask"].shape[0]
        if "visual_feats" in fusion:
            vmask = fusion["visual_mask"].bool()
            per = fusion["patch_mask"].sum(-1) if "patch_mask" in fusion else fusion["visual_feats"].shape[2]
            seen["tokens"] += int((vmask * per).sum())
            if not encoder.uses_text:
                seen["tokens"] += vmask.shape[0]  # the learned [CLS]
            rows = vmask.shape[0]
        seen["passes"] += rows
        return forward(fusion)

    encoder.forward = counting
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model.encode(batch)
    finally:
        del encoder.forward
    flops = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    return {**seen, "encoder_flops": flops.get(type(encoder).__name__, 0), "total_flops": flops.get("Global", 0)}


def _train_step(model, opt, batch: dict, bf16: bool, device: str) -> float:
    """One BERSON training step (forward + backward + optimizer); its wall time in seconds."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
        loss = model._losses(batch)[0]["loss"]
    opt.zero_grad()
    loss.backward()
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench_pair_encodings(sizes: list[int], modalities: list[str], steps: int, batch: int, bf16: bool, device: str,
                         text: str, random_weights: bool, image_size: int) -> list[dict]:
    """Pairwise vs joint pair encoding: one record per (modality, n, pair encoding), printed as a table."""
    from seqaware.profiling import machine

    where = machine(device)
    records = []
    for modality in modalities:
        for n in sizes:
            data = _procedure_batch(n, batch, modality, text, image_size)
            data = {k: v.to(device) if torch.is_tensor(v) else v for k, v in data.items()}
            runs = {}
            for pair_encoding in ("pairwise", "joint"):
                model = _berson(modality, pair_encoding, text, random_weights).to(device)
                load = _encoder_load(model.eval(), data)
                # configs/model/berson.yaml's optimizer: fused AdamW (one kernel for all parameters)
                opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5, fused=True)
                runs[pair_encoding] = (model.train(), opt, load, [])
                _train_step(model, opt, data, bf16, device)  # warm-up
            # the two paths' steps alternate, so a busy shared machine slows both alike
            for _ in range(steps):
                for model, opt, _, times in runs.values():
                    times.append(_train_step(model, opt, data, bf16, device))
            for pair_encoding, (_, _, load, times) in runs.items():
                step_s = statistics.median(times)  # the median: robust to a burst of load on a shared machine
                records.append({"modality": modality, "n": n, "pair_encoding": pair_encoding, "batch": batch,
                                "device": device, "machine": where, "bf16": bf16, "random_weights": random_weights,
                                "image_size": image_size if modality == "multimodal" else None,
                                "encoder_passes": load["passes"] / batch, "tokens": load["tokens"] / batch,
                                "encoder_flops": load["encoder_flops"] / batch, "total_flops": load["total_flops"] / batch,
                                "step_s": step_s, "step_s_per_procedure": step_s / batch})
                print(f"{modality} n={n} {pair_encoding}: {step_s / batch:.3f} s per procedure", file=sys.stderr, flush=True)
            del runs
    by = {(r["modality"], r["n"], r["pair_encoding"]): r for r in records}
    for r in records:
        if r["pair_encoding"] == "joint":
            base = by[(r["modality"], r["n"], "pairwise")]
            r["speedup"] = base["step_s"] / r["step_s"]
            r["flops_ratio"] = base["encoder_flops"] / max(r["encoder_flops"], 1)
    weights = "random weights" if random_weights else "offline weights"
    print(f"BERSON pair encodings on {where} ({device}, {'bf16 autocast' if bf16 else 'fp32'}, {weights}, batch {batch}, "
          f"{steps} timed steps): per procedure")
    print("| modality | n | pair encoding | encoder passes | encoder tokens | encoder GFLOPs (fwd) | encode GFLOPs (fwd) "
          "| train step s | joint speed-up |\n|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in records:
        speed = f"{r['speedup']:.1f}x" if "speedup" in r else "-"
        print(f"| {r['modality']} | {r['n']} | {r['pair_encoding']} | {r['encoder_passes']:.0f} | {r['tokens']:.0f} | "
              f"{r['encoder_flops'] / 1e9:.2f} | {r['total_flops'] / 1e9:.2f} | {r['step_s_per_procedure']:.3f} | {speed} |")
    return records


def _roc_batches(path: str, text: str, batch: int, count: int, seed: int = 0) -> list[dict]:
    """``count`` collated batches of ``batch`` ROCStories (``path``, BERSON's tsv), drawn at random without
    repeats, each story's sentences shuffled, tokenised as ``data=roc`` does (MiniLM word pieces, 35 a sentence)."""
    from data_modules.adapters.roc import roc_source
    from data_modules.collate import StepCollator
    from data_modules.views import SequencingView
    from seqaware.pretrained import load_tokenizer

    stories = roc_source(path, test_fraction=0.0, val_fraction=0.0, max_stories=max(batch * count, 200))["train"]
    order = torch.randperm(len(stories), generator=torch.Generator().manual_seed(seed)).tolist()
    view = SequencingView([stories[k] for k in order[:batch * count]], seed=seed)
    collate = StepCollator(tokenizer=load_tokenizer(text), max_tokens=35, use_images=False)
    return [collate([view[k * batch + x] for x in range(batch)]) for k in range(count)]


def bench_packing(encodings: list[str], batch: int, steps: int, bf16: bool, device: str, text: str,
                  random_weights: bool, stories: str) -> list[dict]:
    """Padded vs packed (``model.packed``) BERSON training steps on ROCStories batches, one record per (pair
    encoding, path): the work of a step (real tokens entering the encoder, the padded layout's padding share,
    model FLOPs from the real tokens: :func:`seqaware.profiling.transformer_flops`) and its speed (median step
    time of ``steps`` steps after one warm-up, the two paths alternating on the same batches; tokens/s, TFLOP/s,
    and MFU on a GPU listed in :data:`seqaware.profiling.GPU_BF16_PEAK`).  The speed-up is the median of the
    per-batch ratios, of wall time and of the process's CPU time (user + system: less moved than wall time by
    other jobs on a shared machine; with ``OMP_NUM_THREADS=1`` it is the step's CPU work)."""
    from seqaware.profiling import WorkMeter, gpu_peak_flops, machine, transformer_flops, transformer_shape

    where = machine(device) + (f", {torch.get_num_threads()} torch threads" if device == "cpu" else "")
    peak = gpu_peak_flops(torch.cuda.get_device_name(device)) if device.startswith("cuda") else None
    data = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()}
            for b in _roc_batches(stories, text, batch, steps + 1)]
    records = []
    for pair_encoding in encodings:
        runs = {}
        for packed in (False, True):
            model = _berson("text", pair_encoding, text, random_weights, packed=packed).to(device).train()
            meter = model.encoder.work_meter = WorkMeter()
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5, fused=True)
            runs[packed] = (model, opt, meter, [], [], [])
        for k, step_batch in enumerate(data):
            for model, opt, meter, times, cpu_times, work in runs.values():
                meter.reset()
                cpu = time.process_time()
                seconds = _train_step(model, opt, step_batch, bf16, device)
                if k:                                   # batch 0 warms up
                    times.append(seconds)
                    cpu_times.append(time.process_time() - cpu)
                    work.append(meter.read())
        for packed, (model, _, _, times, cpu_times, work) in runs.items():
            shape = transformer_shape(model.encoder.backbone)
            tokens = sum(w.tokens for w in work) / len(work)
            flops = sum(transformer_flops(w.tokens, w.squares, **shape) for w in work) / len(work)
            step_s = statistics.median(times)
            record = {"pair_encoding": pair_encoding, "path": "packed" if packed else "padded", "batch": batch,
                      "device": device, "machine": where, "bf16": bf16, "random_weights": random_weights,
                      "steps": len(times), "step_s": step_s, "tokens_per_step": tokens,
                      "padding": sum(w.padding for w in work) / len(work), "flops_per_step": flops,
                      "tokens_per_s": tokens / step_s, "tflops": flops / step_s / 1e12, "times": times,
                      "cpu_s": statistics.median(cpu_times), "cpu_times": cpu_times}
            if peak:
                record["mfu"] = flops / step_s / peak
            records.append(record)
            print(f"{pair_encoding} {record['path']}: {1000 * step_s:.0f} ms a step", file=sys.stderr, flush=True)
        del runs
    for r in records:
        if r["path"] == "packed":
            base = next(x for x in records if x["pair_encoding"] == r["pair_encoding"] and x["path"] == "padded")
            # the median of the per-batch ratios: each pair of steps ran back to back, on the same batch
            r["speedup"] = statistics.median(a / b for a, b in zip(base.pop("times"), r.pop("times")))
            r["cpu_speedup"] = statistics.median(a / b for a, b in zip(base.pop("cpu_times"), r.pop("cpu_times")))
    weights = "random weights" if random_weights else "offline weights"
    print(f"BERSON training step, padded vs packed (model.packed) on {where} ({device}, "
          f"{'bf16 autocast' if bf16 else 'fp32'}, {text}, {weights}), batches of {batch} ROCStories, median of "
          f"{steps} steps (speed-up: the median of the per-batch ratios)")
    print("| pair encoding | path | step ms | process CPU s | tokens / step | padding | GFLOP / step | tokens / s | "
          "TFLOP/s | MFU | speed-up (wall / CPU) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in records:
        mfu = f"{100 * r['mfu']:.2f}%" if "mfu" in r else "-"
        speed = f"{r['speedup']:.2f}x / {r['cpu_speedup']:.2f}x" if "speedup" in r else "-"
        print(f"| {r['pair_encoding']} | {r['path']} | {1000 * r['step_s']:.0f} | {r['cpu_s']:.2f} | "
              f"{r['tokens_per_step']:.0f} | {100 * r['padding']:.0f}% | {r['flops_per_step'] / 1e9:.1f} | "
              f"{r['tokens_per_s']:.0f} | {r['tflops']:.3f} | {mfu} | {speed} |")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--beam", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", "--steps", type=int, default=None, dest="train_steps",
                        help="timed training steps after one warm-up (default 10; --pair-encodings: 2)")
    parser.add_argument("--train-batch", type=int, default=None,
                        help="procedures per training step (default 4, the BERSON experiments' batch size)")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--text", default="offline:minilm", help="text encoder weights (alias, folder or hub id)")
    parser.add_argument("--random-weights", action="store_true", help="the text encoder's architecture with random weights")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--train-only", action="store_true")
    parser.add_argument("--decode-only", action="store_true")
    parser.add_argument("--pair-encodings", action="store_true",
                        help="BERSON training step, pairwise vs joint pair encoding (model.pair_encoding), per procedure")
    parser.add_argument("--modalities", nargs="+", choices=["text", "multimodal"], default=["text", "multimodal"])
    parser.add_argument("--image-size", type=int, default=128, help="--pair-encodings multimodal: image px (128: berson_finetune)")
    parser.add_argument("--json", type=Path, default=None,
                        help="--pair-encodings / --packing: also write the figures to this JSON file")
    parser.add_argument("--packing", nargs="+", choices=["joint", "pairwise"], default=None, metavar="ENCODING",
                        help="padded vs packed (model.packed) training steps on ROCStories for these pair encodings")
    parser.add_argument("--stories", default=str(Path(__file__).resolve().parents[3] / "shared/data/roc/dev.tsv"),
                        help="--packing: ROCStories in BERSON's tsv (default: the shared dev.tsv)")
    args = parser.parse_args()
    # --pair-encodings: a 20-step procedure is 380 pairwise encoder passes; fewer, smaller steps keep the run short
    args.train_steps = args.train_steps or (2 if args.pair_encodings else 10)
    args.train_batch = args.train_batch or (16 if args.packing else 4)   # hparams=roc_joint's; berson_roc's: 4
    if args.pair_encodings or args.packing:
        if args.packing:
            records = bench_packing(args.packing, args.train_batch, args.train_steps, args.bf16, args.device, args.text,
                                    args.random_weights, args.stories)
        else:
            records = bench_pair_encodings(args.sizes, args.modalities, args.train_steps, args.train_batch, args.bf16,
                                           args.device, args.text, args.random_weights, args.image_size)
        print(f"{MARKER} {json.dumps(records)}")
        if args.json:
            from seqaware.io import atomic_open

            args.json.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(args.json, "w") as handle:
                json.dump(records, handle, indent=1)
        return
    if not args.train_only:
        bench_decoders(args.hidden, args.batch, args.sizes, args.beam, args.repeats)
    if not args.decode_only:
        bench_training(args.train_steps, args.train_batch, args.bf16, args.device, args.text, args.random_weights)


if __name__ == "__main__":
    main()
