"""scripts/bench/gpu_check.py: the GPU checks and benchmarks as one command, kept alive on the CPU.

The GPU plan runs only in sessions that have a GPU; what can rot between them is caught here: every
step names a script that exists and takes the options the plan passes (``--json`` included), the
report turns each benchmark's JSON into figure rows beside the baseline of the same run, and the CPU
subset (``--short``) runs end to end.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from scripts.bench import bench_data  # noqa: E402
from scripts.bench import gpu_check  # noqa: E402


def _script_steps():
    for gpu in (False, True):
        for step in gpu_check.plan(gpu):
            script = next((part for part in step.cmd if part.endswith(".py")), None)
            if script is not None and script.startswith("scripts/"):
                yield gpu, step, script


def test_every_step_is_named_once_and_its_script_exists():
    for gpu in (False, True):
        names = [s.name for s in gpu_check.plan(gpu)]
        assert len(names) == len(set(names)), names
    for _, step, script in _script_steps():
        assert (ROOT / script).is_file(), (step.name, script)


@pytest.mark.slow
def test_every_benchmark_takes_the_options_the_plan_passes():
    """Each script's --help lists every option the GPU plan and the CPU subset give it (argparse would
    refuse an unknown one only when the GPU run starts)."""
    helps: dict[str, str] = {}
    for gpu, step, script in _script_steps():
        if script not in helps:
            helps[script] = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True,
                                           text=True, timeout=120, check=True).stdout
        end = step.cmd.index("--") if "--" in step.cmd else len(step.cmd)
        options = {part.split("=")[0] for part in step.cmd[:end] if part.startswith("--")}
        if step.json_out:
            options.add("--json")
        missing = sorted(o for o in options if o not in helps[script])
        assert not missing, f"{'gpu' if gpu else 'cpu'} step {step.name}: {script} lacks {missing}"


def test_report_puts_each_figure_beside_its_baseline_of_the_same_run():
    info = {"date": "2026-11-26 12:00", "python": "3.11", "torch": "2.14.1", "cuda": "13.0", "cpu": "Test CPU",
            "cpu_cores": 2, "gpu": "NVIDIA H100 80GB HBM3", "gpu_memory_gib": 79.2, "driver": "570"}
    records = [
        {"name": "bench_pretrain_paper", "kind": "bench", "what": "paper size", "command": "scripts/bench/bench_pretrain.py",
         "seconds": 60.0, "ok": True, "figures": {"runs": [
             {"preset": "paper", "batch_size": 32, "bf16": True, "sdpa": True, "compile": False,
              "samples_per_s": 150.0, "mfu": 0.5, "peak_memory_gb": 40.0},
             {"preset": "paper", "batch_size": 4, "bf16": False, "sdpa": False, "compile": False,
              "samples_per_s": 15.0, "mfu": 0.06, "peak_memory_gb": 10.0}]}},
        {"name": "bench_decode_pairs", "kind": "bench", "what": "BERSON", "command": "scripts/bench/bench_decode.py",
         "seconds": 30.0, "ok": True, "figures": [
             {"modality": "text", "n": 5, "pair_encoding": "pairwise", "step_s": 0.8},
             {"modality": "text", "n": 5, "pair_encoding": "joint", "step_s": 0.1}]},
        {"name": "bench_lora_8b_b1", "kind": "bench", "what": "b1", "command": "x", "seconds": 1.0, "ok": True,
         "figures": {"config": "8b", "batch_size": 1, "examples_per_s": 2.0, "peak_memory_gb": 20.0}},
        {"name": "bench_lora_8b_b8", "kind": "bench", "what": "b8", "command": "x", "seconds": 1.0, "ok": True,
         "figures": {"config": "8b", "batch_size": 8, "examples_per_s": 8.0, "peak_memory_gb": 35.0}},
        {"name": "ddp_1gpu", "kind": "check", "what": "ddp", "command": "train.py", "seconds": 5.0, "ok": False,
         "error": "gloo: Connection closed by peer"},
        {"name": "bench_data", "kind": "bench", "what": "loader", "command": "scripts/bench/bench_data.py", "seconds": 9.0,
         "ok": True, "figures": [
             {"experiment": "order_baseline", "loader_batches_per_s": 20.0, "train_steps_per_s": 4.0, "ratio": 5.0,
              "ratio_warm": 20.0, "run_epochs": 8, "ratio_run": bench_data.run_ratio(5.0, 20.0, 8)},
             {"experiment": "berson_roc", "error": "FileNotFoundError: dev.tsv"},
             {"experiment": "teo_lora_internvl", "skipped": "hub"}]},
    ]
    gpu_check.add_ratios(records)
    text = gpu_check.markdown(info, records)
    assert "- GPU: NVIDIA H100 80GB HBM3 (79.2 GiB, driver 570)" in text and "- CPU: Test CPU, 2 cores" in text
    assert "| paper b32 bf16-mixed sdpa: samples/s | 150.00 | 15.00 (fp32 eager b4) | 10.00x |" in text
    assert "| paper b32 bf16-mixed sdpa: MFU | 50.0% | 6.0% | - |" in text
    assert "| BERSON text n=5: joint step ms | 100 | 800 (pairwise) | 8.0x faster |" in text
    assert "| bench_lora_8b_b8 vs b1: examples/s | 8.00 | 2.00 (b1) | 4.00x |" in text
    assert "| ddp_1gpu | ddp | FAILED: gloo: Connection closed by peer | 5 |" in text
    # a run of 8 epochs, the first at 5x and the others at 20x: 8 / (1/5 + 7/20) = 14.5x
    assert "| loader/step order_baseline | 20.0 batches/s | 4.00 steps/s (training) | 5.0x, 14.5x over 8 epochs |" in text
    assert "| loader/step berson_roc | FAILED | FileNotFoundError: dev.tsv | - |" in text
    assert "| loader/step teo_lora_internvl | skipped | hub | - |" in text


@pytest.mark.slow
def test_cpu_subset_runs_end_to_end(tmp_path):
    """What CI runs of the GPU check: the CPU subset's benchmarks at toy sizes, one JSON and one markdown
    report (the fast-dev-run step is left out: the suite's matrix in tests/test_train.py runs it)."""
    steps = [s.name for s in gpu_check.plan(False) if s.kind == "bench"]
    proc = subprocess.run([sys.executable, "scripts/bench/gpu_check.py", "--short", "--out", str(tmp_path), "--only", *steps],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["mode"] == "cpu-subset" and report["machine"]["cpu_cores"] >= 1
    assert [r["name"] for r in report["steps"]] == steps
    for record in report["steps"]:
        assert record["ok"] and record.get("figures"), record
        assert gpu_check.figure_rows(record), record["name"]       # every benchmark gives table rows
    text = (tmp_path / "gpu_check.md").read_text()
    assert "Top operators, bench_pretrain_offline" in text and "joint step ms" in text


def test_bench_data_judges_the_loader_over_the_epochs_a_run_trains():
    # max_epochs, or the epochs max_steps spans, whichever ends the run first; neither: one epoch
    assert bench_data.run_epochs(8, None, 50) == 8 and bench_data.run_epochs(-1, 600, 50) == 12
    assert bench_data.run_epochs(3, 40, 100) == 1 and bench_data.run_epochs(None, -1, 10) == 1
    # a ratio r costs 1/r of the step time: the first epoch at 4, three more at 20 -> 4 / (1/4 + 3/20) = 10
    assert bench_data.run_ratio(4.0, 20.0, 4) == pytest.approx(10.0)
    assert bench_data.run_ratio(4.0, None, 4) == pytest.approx(4.0)   # no next-epoch figure: the first's


def test_budget_skips_the_steps_that_no_longer_fit_and_only_keeps_the_given_order(tmp_path, monkeypatch):
    """--budget: a step starts only with MIN_STEP_S left, gets what is left as its timeout, and the rest are
    reported as skipped (not failed); --only runs the named steps in the order given."""
    ran: list[tuple[str, float]] = []
    clock = {"now": 0.0}

    def fake_run(step, out, timeout=None):
        ran.append((step.name, timeout))
        clock["now"] += 50.0
        return {"name": step.name, "kind": step.kind, "what": step.what, "command": "x", "seconds": 50.0, "ok": True}

    monkeypatch.setattr(gpu_check, "run_step", fake_run)
    monkeypatch.setattr(gpu_check.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(gpu_check, "machine", lambda: {"date": "d", "python": "3", "torch": "t", "cuda": None, "cpu": "c",
                                                       "cpu_cores": 2, "gpu": None})
    names = [s.name for s in gpu_check.plan(False)]
    order = [names[2], names[0], names[1], names[3]]
    report = gpu_check.main(["--short", "--out", str(tmp_path), "--budget", "90", "--only", *order])
    assert [name for name, _ in ran] == order[:2]
    assert ran[0][1] == 90.0 and ran[1][1] == 40.0  # the second step gets what was left
    assert [r["name"] for r in report["steps"]] == order
    assert [bool(r.get("skipped")) for r in report["steps"]] == [False, False, True, True]
    assert report["failed"] == []
    text = (tmp_path / "gpu_check.md").read_text()
    assert text.count("skipped: the 90 s budget was spent") == 2


def test_device_busy_time_is_the_union_of_kernel_intervals():
    from torch.autograd import DeviceType

    from seqaware.profiling import busy_us

    class Span:
        def __init__(self, start, end, device=DeviceType.CUDA):
            self.time_range = type("R", (), {"start": start, "end": end})()
            self.device_type = device

    events = [Span(0, 10), Span(5, 12), Span(20, 25), Span(21, 22), Span(30, 40, DeviceType.CPU)]
    assert busy_us(events) == 17  # [0, 12] and [20, 25]; host events do not count
    assert busy_us([]) == 0
