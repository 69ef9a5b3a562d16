"""Throughput and peak memory of one InternVL LoRA training step (the TEO fine-tuning recipe).

    python scripts/bench/bench_teo_lora.py --config tiny                       # CPU-sized smoke figure
    python scripts/bench/bench_teo_lora.py --config 8b --bf16 --grad-ckpt --batch-size 8   # one GPU

``tiny`` is the test model of seqaware/vlm/models.py; ``8b`` is the InternVL3.5-8B architecture built in
code with random weights (no download), directly on the device. Each example is the MATEO
image_text shape: two images (one tile each: 256 image tokens per 448-px tile for 8b, 4 for tiny)
plus ``--text-tokens`` text tokens, of which the last ``--answer-tokens`` are labelled. LoRA r16 /
alpha 32 on the language model's q/k/v/o (as in configs/model/internvl.yaml); AdamW on the adapter.
Prints examples/s, tokens/s and peak memory (GPU: max allocated; CPU: max resident set size);
``--profile N`` the top operators of N more steps, ``--json`` the figures to a file.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from seqaware.master_weights import MasterWeights, precision_plugin  # noqa: E402
from seqaware.vlm.models import answer_loss, apply_lora  # noqa: E402
from seqaware.vlm.models import build_tiny_internvl, internvl_config_8b  # noqa: E402


def build(config: str, device: torch.device, dtype: torch.dtype):
    """The base model (random weights) on ``device`` in ``dtype``."""
    from transformers import InternVLForConditionalGeneration

    if config == "tiny":
        model, _ = build_tiny_internvl(seed=0)
        return model.to(device=device, dtype=dtype)
    cfg = internvl_config_8b()
    with torch.device(device):
        return InternVLForConditionalGeneration._from_config(cfg, dtype=dtype, attn_implementation="sdpa")


def make_batch(model, batch_size: int, text_tokens: int, answer_tokens: int, images_per_example: int,
               device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids with ``images_per_example`` blocks of image tokens, pixel tiles and labels."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    vocab = cfg.text_config.vocab_size
    image_tokens = cfg.image_seq_length
    length = text_tokens + images_per_example * image_tokens
    ids = torch.randint(0, vocab, (batch_size, length), generator=gen)
    ids[ids == cfg.image_token_id] = (cfg.image_token_id + 1) % vocab
    start = 8
    for k in range(images_per_example):  # image blocks after a short text prefix
        s = start + k * (image_tokens + 8)
        ids[:, s:s + image_tokens] = cfg.image_token_id
    labels = torch.full_like(ids, -100)
    labels[:, -answer_tokens:] = ids[:, -answer_tokens:]
    size = cfg.vision_config.image_size
    size = size[0] if isinstance(size, (list, tuple)) else size
    pixels = torch.randn(batch_size * images_per_example, 3, size, size, generator=gen)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
            "pixel_values": pixels.to(device), "labels": labels.to(device)}


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=("tiny", "8b"), default="tiny")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup steps)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="bfloat16 base weights + autocast (LoRA in float32)")
    ap.add_argument("--bf16-true", action="store_true",
                    help="bfloat16 base and LoRA weights, no autocast, float32 master weights of the adapters in the "
                         "optimizer (trainer.precision=bf16-true, seqaware.master_weights)")
    ap.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    ap.add_argument("--text-tokens", type=int, default=398, help="text tokens per example (MATEO image_text ~400)")
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--images", type=int, default=2, help="images (tiles) per example")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after timing, profile N more steps and print the top operators (seqaware.profiling)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--full-logits", action="store_true",
                    help="HF's loss over (B, T, vocabulary) logits instead of the answer-only head (the module's training loss)")
    args = ap.parse_args(argv)

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if args.bf16 and args.bf16_true:
        ap.error("--bf16 (autocast) and --bf16-true exclude each other")
    dtype = torch.bfloat16 if args.bf16 or args.bf16_true else torch.float32
    t0 = time.perf_counter()
    model = apply_lora(build(args.config, device, dtype), {"r": 16, "alpha": 32, "dropout": 0.05, "target": "language"})
    model = model.to(device)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    model.train()
    build_s = time.perf_counter() - t0
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    plugin = precision_plugin("bf16-true" if args.bf16_true else "bf16-mixed" if args.bf16 else "32-true", device)
    masters = None
    if args.bf16_true:
        sources = {id(p): p.detach() for p in groups[0]["params"]}  # PEFT's float32 adapters, before conversion
        plugin.convert_module(model)
        masters, groups = MasterWeights.for_param_groups(groups, sources)
    optimizer = torch.optim.AdamW(groups, lr=args.lr, weight_decay=0.01)
    if masters is not None:
        masters.attach(optimizer)
    batch = plugin.convert_input(make_batch(model, args.batch_size, args.text_tokens, args.answer_tokens, args.images,
                                            device))
    tokens_per_step = batch["input_ids"].numel()
    inputs = {k: v for k, v in batch.items() if k != "labels"}

    def step() -> float:
        with plugin.forward_context():
            if args.full_logits:
                loss = model(**batch).loss
            else:
                loss = answer_loss(model, inputs, batch["labels"])
        loss.backward()
        if masters is not None:
            masters.grads_to_master()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    losses = [step() for _ in range(args.steps)]
    sync()
    elapsed = time.perf_counter() - start
    if device.type == "cuda":
        peak_gb = torch.cuda.max_memory_allocated() / 2**30
        where = f"GPU {torch.cuda.get_device_name()}"
    else:
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
        where = f"CPU ({torch.get_num_threads()} threads)"
    figures = {
        "examples_per_s": args.batch_size * args.steps / elapsed,
        "tokens_per_s": tokens_per_step * args.steps / elapsed,
        "step_s": elapsed / args.steps,
        "peak_memory_gb": peak_gb,
        "tokens_per_example": tokens_per_step / args.batch_size,
        "trainable_params": float(trainable),
        "total_params": float(total),
        "build_s": build_s,
    }
    print(f"config={args.config} device={where} batch={args.batch_size} bf16={args.bf16} bf16_true={args.bf16_true} "
          f"grad_ckpt={args.grad_ckpt} "
          f"steps={args.steps} (+{args.warmup} warm-up) loss={'full logits' if args.full_logits else 'answer-only head'}")
    print(f"params: {total / 1e9:.3f} B total, {trainable / 1e6:.2f} M trainable (LoRA); model built in {build_s:.1f} s")
    print(f"tokens/example {figures['tokens_per_example']:.0f}; loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(f"examples/s {figures['examples_per_s']:.2f}  tokens/s {figures['tokens_per_s']:.0f}  "
          f"step {figures['step_s'] * 1000:.0f} ms  peak memory {peak_gb:.2f} GiB")
    figures.update({"config": args.config, "device": where, "batch_size": args.batch_size, "bf16": args.bf16,
                    "bf16_true": args.bf16_true,
                    "grad_ckpt": args.grad_ckpt, "images": args.images, "text_tokens": args.text_tokens})
    if args.profile:
        from seqaware.profiling import format_profile, profile_figures, profile_summary

        figures.update(profile_figures(step, args.profile, cuda=device.type == "cuda"))
        summary = profile_summary(figures)
        if summary:
            print(summary)
        print(format_profile(figures["profile"]))
    if args.json:
        import json

        from seqaware.io import atomic_open

        with atomic_open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)
    return figures


if __name__ == "__main__":
    main()
