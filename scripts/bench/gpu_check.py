#!/usr/bin/env python
"""The GPU path in one command: correctness checks and benchmarks, one JSON and one markdown report.

    python scripts/bench/gpu_check.py --out logs/gpu_check              # one GPU: at most 8 minutes (--budget 480)
    python scripts/bench/gpu_check.py --out logs/gpu_check --budget 0   # every step: 9 minutes on one H200 (2026-11-26)
    python scripts/bench/gpu_check.py --short --out logs/gpu_check_cpu  # the CPU subset (what CI runs: tests/test_gpu_check.py)
    python scripts/bench/gpu_check.py --only bench_lora_8b_b8 bench_pretrain_paper   # some steps, in this order (--list)

Every step is a separate process (``python -m pytest ...`` or a ``scripts/bench_*.py``) with its own
timeout; its output goes to ``OUT/logs/<step>.log`` and its figures (the benchmark's ``--json``) into
``OUT/gpu_check.json``. ``OUT/gpu_check.md`` is the table docs/results/performance.md is written from:
the machine (GPU model and memory, CPU model and cores, driver, CUDA, torch / Lightning / transformers
versions), then each check's result and each figure beside its baseline measured in the same run.

On a GPU (``torch.cuda.is_available()``):

* checks: every experiment's fast-dev-run under ``trainer.accelerator=gpu`` in ``bf16-mixed`` (the test
  suite's matrix, ``SEQAWARE_TEST_ACCELERATOR=gpu``), a 1-GPU DDP run (``trainer=ddp``), the FSDP LoRA path
  on ``model=internvl_tiny`` (``trainer=fsdp trainer.devices=1``);
* benchmarks: CLIP-ViL pretraining, paper size (RoBERTa-large + CLIP ViT-B/32, 5 steps x (60 text + 50 image
  tokens), ``mlm_isp_smrm``) and offline size, fp32 eager batch 4 (baseline) against bf16 + SDPA batch 32,
  batch 64 with and without ``torch.compile``, batch 32 with the flash / memory-efficient attention kernels
  only, with MFU and the top operators of a profiled step; the InternVL3.5-8B-size LoRA step with random
  weights, MATEO-sized examples (about 400 text tokens, 2 image tiles): batch 8 with gradient checkpointing
  (``hparams=mateo_fast``) and batch 4 without, against batch 1, profiled; BERSON training steps,
  ``model.pair_encoding=pairwise`` against ``joint``; data-loader throughput against the training step
  (``bench_data.py``).

The steps run in order of importance (the speed targets first), so ``--budget SECONDS`` (a lent GPU's time is
short) keeps the ones that matter most: a step starts only with 20 s left, its timeout is cut to what is left,
and the rest are reported as skipped. The report is rewritten after every step, so a run cut short keeps what
it measured.

Without a GPU it runs the CPU subset of the same steps at toy sizes (``--short`` is implied): the
scripts cannot rot between the sessions that get a GPU. The report says which machine it ran on.

BERSON's ROCStories figure with the real MPNet-base is not a step here: it needs the weights and the ROC files
carried in parts over two earlier calls and a whole call of its own (scripts/maintenance/gpu_roc.py).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
sys.path.insert(0, str(ROOT))   # seqaware.io / seqaware.profiling when run as a script


@dataclass
class Step:
    name: str
    kind: str                      # check | bench
    what: str                      # one line for the report
    cmd: list[str]
    timeout: int                   # seconds
    env: dict[str, str] = field(default_factory=dict)
    json_out: bool = False         # the command takes --json PATH


def _train(*overrides: str) -> list[str]:
    return [PY, "train.py", *overrides, "callbacks.progress_bar.refresh_rate=0"]


def _pretrain_gpu(preset: str, *extra: str, batch: int = 32, precision: str = "bf16-mixed", steps: int = 10) -> list[str]:
    """bench_pretrain.py on the GPU: SDPA, ``precision`` (bf16 autocast by default), batch ``batch``, ``steps``
    timed steps (+ ``extra``)."""
    return [PY, "scripts/bench/bench_pretrain.py", "--preset", preset, "--batch-size", str(batch), "--precision", precision,
            "--sdpa", "--steps", str(steps), *extra]


def _curve(precision: str, seed: int = 0) -> list[str]:
    """The paper-size loss curve: 200 steps at batch 32, lr 1e-4 (configs/model/pretrain.yaml), 8 batches."""
    return _pretrain_gpu("paper", "--no-baseline", "--warmup", "1", "--curve-steps", "200", "--lr", "1e-4",
                         "--curve-seed", str(seed), precision=precision, steps=3)


def plan(gpu: bool) -> list[Step]:
    """The steps of a full GPU run, or the CPU subset at toy sizes."""
    tiny_world = [f"data.source.{k}={v}" for k, v in
                  {"num_train": 24, "num_val": 8, "num_test": 8, "image_size": 64}.items()]
    if not gpu:
        return [
            Step("fast_dev_run", "check", "one experiment's fast-dev-run in both precisions (the suite runs all)",
                 [PY, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", "tests/test_train.py",
                  "-k", "fast_dev_run_every and order_baseline-defaults"], 300),
            Step("bench_pretrain_offline", "bench", "CLIP-ViL pretraining step, offline backbones, toy size",
                 [PY, "scripts/bench/bench_pretrain.py", "--preset", "offline", "--device", "cpu", "--steps", "2", "--warmup", "1",
                  "--batch-size", "2", "--seq-steps", "2", "--tokens", "16", "--image-size", "64", "--profile", "1"],
                 300, json_out=True),
            Step("bench_decode_pairs", "bench", "BERSON training step, pairwise vs joint pair encoding, n = 5, text",
                 [PY, "scripts/bench/bench_decode.py", "--pair-encodings", "--modalities", "text", "--sizes", "5",
                  "--train-steps", "1", "--train-batch", "2"], 300, json_out=True),
            Step("bench_lora_tiny", "bench", "LoRA step on the tiny InternVL",
                 [PY, "scripts/bench/bench_teo_lora.py", "--config", "tiny", "--steps", "2", "--warmup", "1", "--profile", "1"],
                 300, json_out=True),
            Step("bench_data", "bench", "loader vs training step, order_baseline defaults",
                 [PY, "scripts/bench/bench_data.py", "--experiments", "order_baseline", "--batches", "3", "--steps", "1",
                  "--warmup", "1", "--run-dir", "{out}/bench_data"], 300, json_out=True),
        ]
    gpu_env = {"SEQAWARE_TEST_ACCELERATOR": "gpu"}
    lora_8b = [PY, "scripts/bench/bench_teo_lora.py", "--config", "8b", "--bf16", "--steps", "4"]
    lora_8b_true = [PY, "scripts/bench/bench_teo_lora.py", "--config", "8b", "--bf16-true", "--steps", "4"]
    # in the order of what the speed targets need first: a run under --budget skips what no longer fits
    return [
        Step("bench_pretrain_paper", "bench", "CLIP-ViL pretraining, paper size: bf16 + SDPA batch 32 vs fp32 eager batch 4",
             _pretrain_gpu("paper", "--profile", "3"), 150, json_out=True),
        Step("bench_pretrain_paper_true", "bench", "the batch-32 run in bf16-true (bf16 weights, float32 master "
             "weights, no autocast casts)", _pretrain_gpu("paper", "--no-baseline", "--profile", "3",
                                                           precision="bf16-true"), 120, json_out=True),
        Step("bench_pretrain_paper_true_compile", "bench", "bf16-true at batch 64 under torch.compile (model.compile=true)",
             _pretrain_gpu("paper", "--compile", "--no-baseline", "--profile", "2", batch=64, precision="bf16-true"),
             200, json_out=True),
        Step("curve_paper_mixed", "bench", "paper-size loss curve, 200 steps, bf16-mixed (seed 0)", _curve("bf16-mixed"),
             120, json_out=True),
        Step("curve_paper_true", "bench", "the same curve in bf16-true (seed 0: same weights, data, schedule)",
             _curve("bf16-true"), 120, json_out=True),
        Step("curve_paper_mixed_seed1", "bench", "the bf16-mixed curve from seed 1 (the noise level)",
             _curve("bf16-mixed", seed=1), 120, json_out=True),
        Step("bench_lora_8b_b8_true", "bench", "InternVL3.5-8B-size LoRA, batch 8, gradient checkpointing, bf16-true",
             [*lora_8b_true, "--grad-ckpt", "--batch-size", "8", "--profile", "1"], 150, json_out=True),
        Step("bench_pretrain_paper_compile", "bench", "the same at batch 64 under torch.compile",
             _pretrain_gpu("paper", "--compile", "--no-baseline", "--profile", "2", batch=64), 170,
             json_out=True),
        Step("bench_pretrain_paper_attn", "bench", "the batch-32 run with the flash / memory-efficient attention "
             "kernels only (PyTorch picks cuDNN's on Hopper)",
             _pretrain_gpu("paper", "--no-baseline", "--sdpa-backends", "flash,efficient"), 90, json_out=True),
        Step("bench_lora_8b_b8", "bench", "InternVL3.5-8B-size LoRA, batch 8, gradient checkpointing",
             [*lora_8b, "--grad-ckpt", "--batch-size", "8", "--profile", "1"], 150, json_out=True),
        Step("bench_lora_8b_b4_nockpt", "bench", "InternVL3.5-8B-size LoRA, batch 4, no gradient checkpointing",
             [*lora_8b, "--batch-size", "4", "--profile", "1"], 120, json_out=True),
        Step("fast_dev_runs_gpu", "check", "every experiment x preset fast-dev-run on the GPU, bf16-mixed",
             [PY, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", "tests/test_train.py",
              "-k", "fast_dev_run_every and bf16-mixed"], 240, env=gpu_env),
        Step("ddp_1gpu", "check", "trainer=ddp on one GPU (order_baseline, 1 epoch)",
             _train("experiment=order_baseline", "trainer=ddp", "trainer.accelerator=gpu", "trainer.devices=1",
                    "trainer.max_epochs=1", "hydra.run.dir={out}/runs/ddp_1gpu", *tiny_world), 120),
        Step("fsdp_lora_tiny", "check", "trainer=fsdp LoRA on model=internvl_tiny (1 GPU)",
             _train("experiment=teo_lora_internvl", "model=internvl_tiny", "trainer=fsdp", "trainer.devices=1",
                    "trainer.fast_dev_run=true", "model.max_new_tokens=4", "hydra.run.dir={out}/runs/fsdp_lora_tiny",
                    *tiny_world), 120),
        Step("bench_lora_8b_b1", "bench", "InternVL3.5-8B-size LoRA, batch 1, gradient checkpointing (baseline)",
             [*lora_8b, "--grad-ckpt", "--batch-size", "1"], 120, json_out=True),
        Step("bench_decode_pairs", "bench", "BERSON training step, pairwise vs joint, n = 5 / 10 / 20, text and multimodal",
             [PY, "scripts/bench/bench_decode.py", "--pair-encodings", "--bf16", "--train-steps", "3"], 150, json_out=True),
        Step("bench_pretrain_paper_b64", "bench", "CLIP-ViL pretraining, paper size, batch 64, eager",
             _pretrain_gpu("paper", "--no-baseline", batch=64), 90, json_out=True),
        Step("bench_pretrain_offline", "bench", "CLIP-ViL pretraining, offline backbones' architectures (random weights: "
             "no packages on the GPU machine): bf16 + SDPA batch 32 vs fp32 eager batch 4",
             _pretrain_gpu("offline", "--random-weights"), 90, json_out=True),
        Step("bench_pretrain_offline_true", "bench", "the offline preset in bf16-true, batch 32 (random weights)",
             _pretrain_gpu("offline", "--no-baseline", "--random-weights", precision="bf16-true"), 90, json_out=True),
        Step("bench_pretrain_offline_true_compile", "bench", "the offline preset in bf16-true under torch.compile",
             _pretrain_gpu("offline", "--no-baseline", "--random-weights", "--compile", precision="bf16-true"), 150,
             json_out=True),
        Step("bench_data", "bench", "loader vs training step, every experiment's defaults (CPU loader, GPU step)",
             [PY, "scripts/bench/bench_data.py", "--batches", "10", "--steps", "4", "--run-dir", "{out}/bench_data",
              "--", "trainer.accelerator=gpu"], 240, json_out=True),
    ]


def machine() -> dict[str, Any]:
    """What the report is about: GPU, CPU and software."""
    import torch

    info: dict[str, Any] = {"date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "python": platform.python_version(),
                            "torch": torch.__version__, "cuda": torch.version.cuda, "cpu_cores": os.cpu_count()}
    for name in ("pytorch_lightning", "transformers", "peft"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        info["cpu"] = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                            if line.startswith("model name")), platform.processor())
        flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
        info["cpu_bf16"] = "amx_bf16" if "amx_bf16" in flags else ("avx512_bf16" if "avx512_bf16" in flags else None)
    except OSError:
        info["cpu"] = platform.processor()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                    gpu_count=torch.cuda.device_count())
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            info["driver"] = None
    else:
        info["gpu"] = None
    return info


def _cmd(step: Step, out: Path) -> list[str]:
    """The step's command line with ``{out}`` filled in."""
    return [part.replace("{out}", str(out)) for part in step.cmd]


def _command(cmd: list[str]) -> str:
    """A command line as the report shows it (from the repository root, without the interpreter)."""
    return " ".join(cmd[1:] if cmd[0] == PY else cmd)


def run_step(step: Step, out: Path, timeout: Optional[float] = None) -> dict[str, Any]:
    """Run one step (for at most ``timeout`` seconds, default the step's own); its log in OUT/logs, its
    figures (``--json``) read back."""
    timeout = step.timeout if timeout is None else min(step.timeout, timeout)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = _cmd(step, out)
    figures_path = out / "figures" / f"{step.name}.json"
    if step.json_out:
        figures_path.parent.mkdir(parents=True, exist_ok=True)
        figures_path.unlink(missing_ok=True)
        at = cmd.index("--") if "--" in cmd else len(cmd)  # options before bench_data's train.py overrides
        cmd[at:at] = ["--json", str(figures_path)]
    start = time.perf_counter()
    record: dict[str, Any] = {"name": step.name, "kind": step.kind, "what": step.what,
                              "command": _command(cmd)}
    with (logs / f"{step.name}.log").open("w") as log:
        try:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1", **step.env})
            record["returncode"] = proc.returncode
        except subprocess.TimeoutExpired:
            record["returncode"] = None
            record["error"] = f"timed out after {timeout:.0f} s"
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["ok"] = record["returncode"] == 0
    if not record["ok"] and "error" not in record:
        tail = (logs / f"{step.name}.log").read_text(errors="replace").strip().splitlines()[-3:]
        record["error"] = " / ".join(tail)
    if step.json_out and figures_path.is_file():
        record["figures"] = json.loads(figures_path.read_text())
    return record


# ---------------------------------------------------------------- the report
def _fmt(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def figure_rows(record: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, value, baseline in the same run, ratio) rows of one benchmark's figures."""
    fig = record.get("figures")
    if not fig:
        return []
    name = record["name"]
    rows: list[tuple[str, str, str, str]] = []
    if name.startswith("curve_"):
        run = (fig.get("runs") or [{}])[0]
        curve = run.get("loss_curve") or []
        if curve:
            tail = curve[-20:]
            label = f"{run['preset']} b{run['batch_size']} {run.get('precision')} seed {run.get('curve_seed', 0)}"
            rows.append((f"{label}: loss, step 1 / mean of the last {len(tail)} of {len(curve)}",
                         f"{curve[0]:.4f} / {sum(tail) / len(tail):.4f}", "-", "-"))
    elif name.startswith("bench_pretrain"):
        runs = fig.get("runs", [])
        if runs:
            main = runs[0]
            base = runs[1] if len(runs) > 1 else None
            precision = main.get("precision") or ("bf16-mixed" if main["bf16"] else "32-true")
            label = (f"{main['preset']} b{main['batch_size']} {precision} "
                     f"{'sdpa' if main['sdpa'] else 'eager'}{' compiled' if main['compile'] else ''}")
            rows.append((f"{label}: samples/s", _fmt(main["samples_per_s"]),
                         _fmt(base["samples_per_s"]) + " (fp32 eager b4)" if base else "-",
                         f"{main['samples_per_s'] / base['samples_per_s']:.2f}x" if base else "-"))
            if "mfu" in main:
                rows.append((f"{label}: MFU", f"{100 * main['mfu']:.1f}%",
                             f"{100 * base['mfu']:.1f}%" if base and "mfu" in base else "-", "-"))
                rows.append((f"{label}: peak memory GiB", _fmt(main["peak_memory_gb"], 1), "-", "-"))
    elif name.startswith("bench_decode"):
        by = {(r.get("modality"), r.get("n"), r.get("pair_encoding")): r for r in (fig if isinstance(fig, list) else [])}
        for (modality, n, enc), r in sorted(by.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0, str(kv[0][2]))):
            if enc != "joint":
                continue
            base = by.get((modality, n, "pairwise"))
            rows.append((f"BERSON {modality} n={n}: joint step ms", _fmt(1000 * r["step_s"], 0),
                         _fmt(1000 * base["step_s"], 0) + " (pairwise)" if base else "-",
                         f"{base['step_s'] / r['step_s']:.1f}x faster" if base else "-"))
    elif name.startswith("bench_lora"):
        label = (f"LoRA {fig.get('config')} b{fig.get('batch_size')}{' ckpt' if fig.get('grad_ckpt') else ''}"
                 f"{' bf16-true' if fig.get('bf16_true') else ''}")
        rows.append((f"{label}: examples/s", _fmt(fig["examples_per_s"]), "-", "-"))
        rows.append((f"{label}: peak memory GiB", _fmt(fig["peak_memory_gb"], 1), "-", "-"))
    elif name.startswith("bench_data"):
        for r in fig:
            if "skipped" in r or "error" in r:
                rows.append((f"loader/step {r['experiment']}", "skipped" if "skipped" in r else "FAILED",
                             r.get("skipped") or r["error"][:120], "-"))
            else:
                run = f", {r['ratio_run']:.1f}x over {r['run_epochs']} epochs" if "ratio_run" in r else ""
                rows.append((f"loader/step {r['experiment']}", f"{r['loader_batches_per_s']:.1f} batches/s",
                             f"{r['train_steps_per_s']:.2f} steps/s (training)", f"{r['ratio']:.1f}x{run}"))
    return rows


def add_ratios(records: list[dict[str, Any]]) -> None:
    """Baselines that live in another step: every 8B LoRA run against batch 1 (gradient checkpointing)."""
    by = {r["name"]: r for r in records}
    b1 = by.get("bench_lora_8b_b1", {}).get("figures")
    for name, record in by.items():
        fig = record.get("figures")
        if b1 and fig and name.startswith("bench_lora_8b_") and name != "bench_lora_8b_b1":
            record["baseline"] = {"examples_per_s": b1["examples_per_s"],
                                  "ratio": fig["examples_per_s"] / b1["examples_per_s"]}


def markdown(info: dict[str, Any], records: list[dict[str, Any]]) -> str:
    gpu = f"{info['gpu']} ({info.get('gpu_memory_gib')} GiB, driver {info.get('driver')})" if info.get("gpu") else "none"
    lines = [f"# gpu_check, {info['date']}", "",
             f"- GPU: {gpu}", f"- CPU: {info.get('cpu')}, {info.get('cpu_cores')} cores, bf16 instructions: "
             f"{info.get('cpu_bf16') or 'none'}",
             f"- software: Python {info['python']}, torch {info['torch']} (CUDA {info['cuda']}), Lightning "
             f"{info.get('pytorch_lightning')}, transformers {info.get('transformers')}, peft {info.get('peft')}", "",
             "| step | what | result | seconds |", "|---|---|---|---:|"]
    for r in records:
        result = ("skipped: " + r["skipped"] if r.get("skipped") else
                  "ok" if r["ok"] else f"FAILED: {r.get('error', '')[:160]}")
        lines.append(f"| {r['name']} | {r['what']} | {result} | {r['seconds']:.0f} |")
    lines += ["", "| figure | value | baseline (same run) | ratio |", "|---|---:|---:|---:|"]
    for r in records:
        for row in figure_rows(r):
            lines.append("| " + " | ".join(row) + " |")
        base = r.get("baseline")
        if base:
            lines.append(f"| {r['name']} vs b1: examples/s | {_fmt(r['figures']['examples_per_s'])} | "
                         f"{_fmt(base['examples_per_s'])} (b1) | {base['ratio']:.2f}x |")
    for r in records:
        for fig in ([r.get("figures")] if isinstance(r.get("figures"), dict) else []):
            profiled = fig if fig.get("profile") else next((run for run in fig.get("runs", []) if run.get("profile")), None)
            if profiled:
                from seqaware.profiling import format_profile, profile_summary

                summary = profile_summary(profiled)
                busy = f" ({summary})" if summary else ""
                lines += ["", f"Top operators, {r['name']}{busy}:", "", format_profile(profiled["profile"][:10])]
    lines += ["", "Commands (from the repository root):", ""] + [f"- {r['name']}: `{r['command']}`" for r in records]
    return "\n".join(lines) + "\n"


MIN_STEP_S = 20.0  # under --budget, a step is not started with less time than this left
GPU_BUDGET_S = 480.0  # the bound for the whole GPU check: 8 minutes


def write_report(out: Path, info: dict[str, Any], records: list[dict[str, Any]], report: dict[str, Any]) -> str:
    """OUT/gpu_check.json and OUT/gpu_check.md for the steps run so far (written atomically)."""
    from seqaware.io import atomic_open

    add_ratios(records)
    with atomic_open(out / "gpu_check.json", "w") as handle:
        json.dump(report, handle, indent=1, default=str)
    text = markdown(info, records)
    with atomic_open(out / "gpu_check.md", "w") as handle:
        handle.write(text)
    return text


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "logs" / "gpu_check")
    parser.add_argument("--short", action="store_true", help="the CPU subset at toy sizes (implied without a GPU)")
    parser.add_argument("--only", nargs="+", default=None, metavar="STEP", help="run these steps only, in this order")
    parser.add_argument("--list", action="store_true", help="print the steps and exit")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="stop starting steps once this many seconds have passed (a lent GPU's time is short): "
                             "each step's timeout is cut to what is left, and the steps that no longer fit are "
                             f"reported as skipped; the plan runs its steps in order of importance. Default on a GPU: "
                             f"{GPU_BUDGET_S:.0f} s (the whole plan took 530 s on one H200); 0: no limit")
    args = parser.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available() and not args.short
    if args.budget is None:
        args.budget = GPU_BUDGET_S if gpu else 0.0
    steps = plan(gpu)
    if args.list:
        for s in steps:
            print(f"{s.name:32s} {s.kind:6s} {s.timeout:4d} s  {s.what}")
        return {}
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in steps})
        if unknown:
            parser.error(f"unknown steps {unknown}; this machine's steps: {[s.name for s in steps]}")
        by_name = {s.name: s for s in steps}
        steps = [by_name[name] for name in dict.fromkeys(args.only)]  # in the order given
    args.out.mkdir(parents=True, exist_ok=True)
    info = machine()
    budget = f", within a budget of {args.budget:.0f} s" if args.budget else ""
    print(f"gpu_check on {info.get('gpu') or 'no GPU'} / {info.get('cpu')} ({'full' if gpu else 'CPU subset'}): "
          f"{len(steps)} steps, at most {sum(s.timeout for s in steps)} s{budget}", flush=True)
    deadline = time.perf_counter() + args.budget if args.budget else None
    records: list[dict[str, Any]] = []
    report = {"machine": info, "mode": "gpu" if gpu else "cpu-subset", "steps": records}
    text = write_report(args.out, info, records, report)
    for step in steps:
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left < MIN_STEP_S:
            record = {"name": step.name, "kind": step.kind, "what": step.what, "ok": False, "seconds": 0.0,
                      "skipped": f"the {args.budget:.0f} s budget was spent", "command": _command(_cmd(step, args.out))}
        else:
            record = run_step(step, args.out, left)
        records.append(record)
        print(f"  {step.name}: {'skipped' if record.get('skipped') else 'ok' if record['ok'] else 'FAILED'} "
              f"in {record['seconds']:.0f} s", flush=True)
        text = write_report(args.out, info, records, report)  # after every step: a run cut short keeps what it measured
    print(text)
    failed = [r["name"] for r in records if not r["ok"] and not r.get("skipped")]
    if failed:
        print(f"FAILED: {', '.join(failed)} (logs in {args.out / 'logs'})", file=sys.stderr)
    report["failed"] = failed
    return report


if __name__ == "__main__":
    sys.exit(1 if main().get("failed") else 0)
