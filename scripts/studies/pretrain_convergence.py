#!/usr/bin/env python
"""Full-size pretraining convergence on the synthetic default: does each objective learn in a few
hundred CPU steps?

    python scripts/studies/pretrain_convergence.py                        # the default runs below, 300 steps each
    python scripts/studies/pretrain_convergence.py --batch-size 16        # 16 sequences per step instead of the experiments' 4
    python scripts/studies/pretrain_convergence.py --steps 500 --out logs/convergence
    python scripts/studies/pretrain_convergence.py --run clipvil_pretrain:mlm_isp_smrm --run clip_image_pretrain:isp_pisp
    python scripts/studies/pretrain_convergence.py --run clipvil_pretrain:mlm_isp -- model.optimizer.lr=3e-4

Every run is ``python train.py experiment=EXPERIMENT objectives=OBJECTIVES trainer.max_steps=STEPS
[data.batch_size=BATCH] logger=csv hydra.run.dir=OUT/EXPERIMENT-OBJECTIVES`` (the offline backbones:
MiniLM + EfficientNet-Lite0 with their real weights), plus any overrides after ``--``.  The script then
reads the run's CSV log and the test metrics train.py prints, and writes one table row per (run,
objective): the validation accuracy at the last validation and at every validation before it (every
``trainer.val_check_interval`` = 50 steps), the test accuracy of the best ``val/loss`` checkpoint on
the held-out test split, the chance level, steps x batch size (and how many steps drew the
objective under turn-taking), and the run's wall time.  Chance: 0.5 for ISP / PISP (delta = 0.5);
1/|C| for SMRM, with |C| the mean number of candidates the validation logged
(``val/smrm_num_candidates``); MLM's chance (1 / vocabulary) is negligible and shown as 0.  The
table is printed and written to ``OUT/convergence.md`` (+ ``.json``).
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from seqaware.io import parse_test_metrics  # noqa: E402
from seqaware.launch import split_overrides  # noqa: E402

DEFAULT_RUNS = ("clipvil_pretrain:mlm_isp_smrm", "clip_image_pretrain:isp_pisp")
OBJECTIVE_ORDER = ("mlm", "isp", "pisp", "smrm")


def parse_run(spec: str) -> tuple[str, str]:
    experiment, sep, objectives = spec.partition(":")
    if not sep or not experiment or not objectives:
        raise SystemExit(f"--run {spec!r}: expected EXPERIMENT:OBJECTIVES, e.g. clipvil_pretrain:mlm_isp_smrm")
    return experiment, objectives


def read_validations(path: Path) -> list[dict[str, float]]:
    """The rows of a Lightning CSV log that carry validation metrics, as floats (with ``step``)."""
    if not path.is_file():
        raise SystemExit(f"{path}: no CSV log (did the run fail? see its train.log)")
    rows = []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            values = {k: float(v) for k, v in row.items() if k.startswith("val/") and v not in ("", None)}
            if values:
                values["step"] = float(row["step"])
                rows.append(values)
    return rows


def test_metrics(stdout: str) -> dict[str, float]:
    """The ``TEST_METRICS_JSON {...}`` line train.py prints after testing ({} without one)."""
    return parse_test_metrics(stdout) or {}


def objective_steps(objectives: str, steps: int, seed: int, always: Any = None) -> dict[str, int]:
    """How many of ``steps`` optimiser steps drew each objective (the module's turn-taking schedule,
    ``always``: the run's ``model.objectives.always``)."""
    from seqaware.objectives import ObjectiveSchedule

    schedule = ObjectiveSchedule(objectives, seed=seed, always=always)
    counts: dict[str, int] = {}
    for step in range(steps):
        for name in schedule.draw(step):
            counts[name] = counts.get(name, 0) + 1
    return counts


def run_config(run_dir: Path) -> Any:
    """The config Hydra saved in a finished run's folder."""
    from omegaconf import OmegaConf

    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise SystemExit(f"{path}: no saved Hydra config (was the run started with hydra.output_subdir=null?)")
    return OmegaConf.load(path)


def run_batch_size(run_dir: Path) -> int:
    """``data.batch_size`` of a finished run, from the config Hydra saved in its folder."""
    return int(run_config(run_dir).data.batch_size)


def run_always(run_dir: Path) -> Any:
    """``model.objectives.always`` of a finished run (None: the registry's default, MLM)."""
    from omegaconf import OmegaConf

    always = OmegaConf.select(run_config(run_dir), "model.objectives.always")
    return OmegaConf.to_object(always) if OmegaConf.is_config(always) else always


def run_one(experiment: str, objectives: str, steps: int, batch_size: int | None, out: Path, overrides: list[str],
            seed: int) -> list[dict[str, Any]]:
    run_dir = out / f"{experiment}-{objectives}"
    cmd = [sys.executable, str(ROOT / "train.py"), f"experiment={experiment}", f"objectives={objectives}",
           f"trainer.max_steps={steps}", *([f"data.batch_size={batch_size}"] if batch_size else []), "logger=csv", f"hydra.run.dir={run_dir}", f"seed={seed}", *overrides]
    print("$ " + " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "stdout.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise SystemExit(f"{experiment} objectives={objectives} failed (exit {proc.returncode}); "
                         f"log: {run_dir / 'stdout.log'}\n{tail}")
    validations = read_validations(run_dir / "csv" / "metrics.csv")
    if not validations:
        raise SystemExit(f"{run_dir}: the run logged no validation (trainer.val_check_interval > max_steps?)")
    last = validations[-1]
    batch_size = run_batch_size(run_dir)
    test = test_metrics(proc.stdout)
    drawn = objective_steps(objectives, steps, seed, run_always(run_dir))
    rows = []
    for name in OBJECTIVE_ORDER:
        if f"val/{name}_acc" not in last:
            continue
        if name in ("isp", "pisp"):
            chance = 0.5
        elif name == "smrm":
            chance = 1.0 / max(last.get("val/smrm_num_candidates", 1.0), 1.0)
        else:
            chance = 0.0
        rows.append({"experiment": experiment, "objectives": objectives, "objective": name,
                     "val_acc": last[f"val/{name}_acc"], "test_acc": test.get(f"test/{name}_acc"),
                     "chance": chance, "steps": steps, "batch_size": batch_size, "objective_steps": drawn.get(name, 0),
                     "val_step": int(last["step"]) + 1, "wall_s": wall,
                     "val_curve": [round(v[f"val/{name}_acc"], 3) for v in validations if f"val/{name}_acc" in v]})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| experiment | objectives | objective | val acc | test acc | chance | steps x batch (drawn) | val acc curve | wall |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        test = "-" if r["test_acc"] is None else f"{r['test_acc']:.3f}"
        curve = " ".join(f"{v:.2f}" for v in r["val_curve"])
        lines.append(f"| {r['experiment']} | {r['objectives']} | {r['objective'].upper()} | {r['val_acc']:.3f} | {test} | "
                     f"{r['chance']:.3f} | {r['steps']} x {r['batch_size']} ({r['objective_steps']}) | {curve} | {r['wall_s']:.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", default=None, metavar="EXPERIMENT:OBJECTIVES",
                        help=f"a pretraining run (repeatable); default: {' '.join(DEFAULT_RUNS)}")
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps per run (default 300)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="sequences per step (default: the experiment's data.batch_size, 4)")
    parser.add_argument("--out", type=Path, default=Path("logs/convergence"), help="folder of the runs and the table")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if args.steps < 1 or (args.batch_size is not None and args.batch_size < 1):
        parser.error("--steps and --batch-size must be >= 1")
    runs = [parse_run(spec) for spec in (args.run or DEFAULT_RUNS)]
    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for experiment, objectives in runs:
        rows += run_one(experiment, objectives, args.steps, args.batch_size, out, overrides, args.seed)
        print(markdown([r for r in rows if (r["experiment"], r["objectives"]) == (experiment, objectives)]), flush=True)
    table = markdown(rows)
    (out / "convergence.md").write_text(table + "\n")
    (out / "convergence.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n" + table)
    print(f"\nwrote {out / 'convergence.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
