#!/usr/bin/env python
"""The ROCStories table on one GPU in one command: ``hparams=roc_base`` (ours, MPNet-base) for every seed and BERSON's
recipe with MPNet-base, each trained to the end of its recipe, tested on the 1,963 stories of the test slice.

    pip install -r requirements-mpnet.txt                     # all-mpnet-base-v2, once
    python scripts/studies/roc_table.py --seeds 0 1 2                 # one GPU: forecast, then the runs, then the table
    python scripts/studies/roc_table.py --seeds 0 1 2                 # again: finished runs reused, a cut one resumed
    python scripts/studies/roc_table.py --seeds 0 --budget-s 3600 -- model.compile={dynamic:true}   # a time limit; overrides

The rows (``python train.py experiment=berson_roc ROW seed=S trainer=gpu`` each, in its own run folder
``OUT/berson_roc/runs/<row>-seed<S>`` through ``paths.log_dir=OUT run_name=<row>-seed<S>``):

``roc_base``       ``hparams=roc_base``: one pass per story, 4 epochs of dev.tsv's training slice + train_extra.tsv
                   in 8,192-token batches (~140 stories), lrs by the sqrt rule (configs/hparams/roc_base.yaml);
                   for every ``--seeds``.
``berson_paper``   ``hparams=berson_roc_paper_large backbones=base`` + train_extra.tsv: BERSON's head and recipe,
                   pairwise encoding, 2 epochs in 65,536 pair-token batches (~130 stories; the release's batch of 4
                   would take 18,800 steps); for every ``--paper-seeds`` (default 0).

First each row's steps are timed (``--warmup-steps`` then ``--timed-steps`` training steps and one validation of
``--val-batches`` batches, :class:`seqaware.callbacks.StepClock`; the data and the batch count are the real runs'),
or read from ``OUT/step_times.json`` when it holds this row's timing for these overrides on this machine
(``--step-times FILE``: another run's).  The forecast of every run (start-up, the first steps, the rest at the
timed pace, its validations and its test at the timed evaluation pace), naming the machine, is printed before the
first run; over ``--budget-s`` seconds (the timing included; default 0: no limit) nothing runs: for a machine
held for a fixed time (a scheduler's wall-time limit). Then the runs, seeds outermost. A run whose folder holds a
finished, tested run is reused; one that was cut (SIGTERM / SIGUSR1 to this command is passed on to its train.py,
which saves ``last.ckpt``) resumes from its ``last.ckpt`` when the same command is given again; a folder made with
other overrides (or with a config that changed since) is refused. After every run ``OUT/roc_table.md`` and
``OUT/roc_table.json`` are rewritten: machine, command, date, software, the forecast against each run's wall time,
and per row test PMR / Acc / tau (mean +- std over seeds), wall time per run and the mean of the logged ``perf/mfu``
(GPU) and ``perf/tokens_per_s``. Each run's output: ``OUT/logs/<run>.log``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from seqaware import run_reuse, runs  # noqa: E402
from seqaware.config import compose_train  # noqa: E402

EXTRA = "data.extra_train_paths=[${paths.shared_data_dir}/roc/train_extra.tsv]"
ROWS = {"roc_base": ("hparams=roc_base",),
        "berson_paper": ("hparams=berson_roc_paper_large", "backbones=base", EXTRA)}
"""Row -> its train.py overrides after ``experiment=berson_roc`` (the recipes' own commands)."""
MARKER = "ROC_TABLE_JSON"
STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGUSR1)
"""train.py's exit codes after a SIGTERM / SIGUSR1: ``last.ckpt`` saved, the same command resumes it."""


# ---------------------------------------------------------------- the runs' commands
def run_name(row: str, seed: int) -> str:
    return f"{row}-seed{seed}"


def run_overrides(row: str, seed: int, trainer: str, out: Path, extra: Sequence[str]) -> list[str]:
    """``train.py`` overrides of one run (``extra``, the command's own after ``--``, last)."""
    return ["experiment=berson_roc", *ROWS[row], f"seed={seed}", f"trainer={trainer}", f"paths.log_dir={out}",
            f"run_name={run_name(row, seed)}", "callbacks.progress_bar.refresh_rate=0", *extra]


def timing_overrides(row: str, trainer: str, out: Path, warmup: int, steps: int, val_batches: int,
                     extra: Sequence[str]) -> list[str]:
    """``train.py`` overrides timing ``row``: its seed-0 run's data and model, ``warmup`` + ``steps`` training steps
    under :class:`~seqaware.callbacks.StepClock`, one validation of ``val_batches`` batches, no test."""
    total = warmup + steps
    return ["experiment=berson_roc", *ROWS[row], "seed=0", f"trainer={trainer}", f"paths.log_dir={out / 'timing'}",
            f"run_name={row}", "callbacks.progress_bar.refresh_rate=0", *extra,
            f"trainer.max_steps={total}", "trainer.max_epochs=-1", f"trainer.val_check_interval={total}",
            "trainer.check_val_every_n_epoch=null", f"trainer.limit_val_batches={val_batches}",
            "trainer.num_sanity_val_steps=0", "test=false", "+callbacks.step_clock._target_=seqaware.callbacks.StepClock",
            f"+callbacks.step_clock.path={out / 'timing' / (row + '.json')}",
            f"+callbacks.step_clock.warmup_steps={warmup}", f"+callbacks.step_clock.steps={steps}"]


def run_dir(out: Path, name: str) -> Path:
    return out / "berson_roc" / "runs" / name


def train(overrides: list[str], log: Path) -> tuple[int, float]:
    """One ``train.py`` process (its output appended to ``log``); SIGTERM / SIGUSR1 sent to this process go to it
    (it saves ``last.ckpt`` and exits 128 + the signal).  Returns its exit code and wall seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with log.open("a") as handle:
        handle.write(f"\n==> {dt.datetime.now():%Y-%m-%d %H:%M:%S} python train.py {' '.join(overrides)}\n")
        handle.flush()
        proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *overrides], cwd=ROOT, stdout=handle,
                                stderr=subprocess.STDOUT)
        previous = {sig: signal.signal(sig, lambda signum, frame: proc.send_signal(signum))
                    for sig in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            code = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return code, time.monotonic() - start


# ---------------------------------------------------------------- timing and forecast
DATA_LINE = re.compile(r"\] - data: (\{.*\})$", re.M)
BUDGET_LINE = re.compile(r"\] - data\.batch_tokens=\d+ \(\w+ tokens\): \d+ batches an epoch \((\d+) per process\)")


def timing_figures(folder: Path, clock: Path, wall: float) -> dict[str, Any]:
    """What the forecast needs from a timing run: the clock's figures, the splits' sizes, training batches per epoch
    and the seconds outside the timed steps and validation (start-up, data, the first steps' excess)."""
    import ast

    figures = json.loads(clock.read_text())
    if "val_s" not in figures:
        raise ValueError(f"{clock}: no validation was timed")
    log = (folder / "train.log").read_text(errors="replace")
    splits = ast.literal_eval(DATA_LINE.findall(log)[0])
    budget = BUDGET_LINE.search(log)
    cfg = compose_train(run_reuse.saved_overrides(folder))
    per_epoch = int(budget[1]) if budget else math.ceil(splits["train"] / cfg.data.batch_size)
    return {**figures, "splits": splits, "batches_per_epoch": per_epoch, "wall_s": round(wall, 1),
            "s_per_eval_batch": figures["val_s"] / figures["val_batches"],
            "overhead_s": round(max(0.0, wall - figures["warmup_s"] - figures["seconds"] - figures["val_s"]), 1)}


def validations(cfg: Any, steps: int, per_epoch: int) -> int:
    """Validations of a fit of ``steps`` optimizer steps, ``per_epoch`` an epoch, under ``cfg.trainer``."""
    interval, every = cfg.trainer.val_check_interval, cfg.trainer.check_val_every_n_epoch
    if every is None:
        return steps // int(interval)
    per = 1 if interval is None or interval == 1.0 else (
        round(1 / interval) if isinstance(interval, float) else max(1, per_epoch // int(interval)))
    return min(per, per_epoch) * (math.ceil(steps / per_epoch) // int(every))


def forecast(cfg: Any, timing: dict[str, Any], done: int = 0) -> dict[str, Any]:
    """Seconds of one run (``done`` steps already trained): start-up, the first steps, the rest at the timed pace,
    its validations and its test at the timed evaluation pace."""
    per_epoch = timing["batches_per_epoch"]
    steps = int(cfg.trainer.max_epochs) * per_epoch
    if int(cfg.trainer.max_steps) > 0:
        steps = min(steps, int(cfg.trainer.max_steps))
    left = max(0, steps - done)
    warm = min(left, timing["warmup_steps"])
    train_s = (timing["warmup_s"] if warm else 0.0) + (left - warm) * timing["s_per_step"]
    eval_size = int(cfg.data.eval_batch_size)
    limit = cfg.trainer.limit_val_batches
    val_batches = math.ceil(timing["splits"]["val"] / eval_size)
    if isinstance(limit, int) and limit > 0:
        val_batches = min(val_batches, limit)
    n_val = round(validations(cfg, steps, per_epoch) * left / steps) if steps else 0   # a resumed run: those left
    eval_s = (n_val * val_batches + math.ceil(timing["splits"]["test"] / eval_size)) * timing["s_per_eval_batch"]
    total = timing["overhead_s"] + train_s + eval_s
    return {"steps": steps, "left": left, "s_per_step": timing["s_per_step"], "train_s": round(train_s, 1),
            "validations": n_val, "eval_s": round(eval_s, 1), "overhead_s": timing["overhead_s"],
            "total_s": round(total, 1)}


def steps_done(folder: Path) -> int:
    """Optimizer steps a cut run has trained: its ``last.ckpt``'s ``global_step`` (memory-mapped: the tensors are
    not read); 0 without one."""
    import torch

    path = folder / "checkpoints" / "last.ckpt"
    if not path.is_file():
        return 0
    return int(torch.load(path, map_location="cpu", mmap=True, weights_only=True).get("global_step", 0))


# ---------------------------------------------------------------- results
def summary(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per row: its tested seeds, test PMR / Acc / tau (mean, std, values), wall per run, the perf means' mean."""
    from seqaware.metrics.seeds import mean_std

    out: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rec.get("metrics"):
            out.setdefault(rec["row"], {"seeds": [], "runs": []})
            out[rec["row"]]["seeds"].append(rec["seed"])
            out[rec["row"]]["runs"].append(rec)
    for entry in out.values():
        runs = entry.pop("runs")
        for metric in ("pmr", "acc", "tau"):
            values = [float(r["metrics"][f"test/{metric}"]) for r in runs]
            entry[metric] = dict(zip(("mean", "std"), mean_std(values)), values=values)
        entry["wall_s"] = [r.get("wall_s") for r in runs]
        for key in ("mfu", "tokens_per_s"):
            values = [r["perf"][key] for r in runs if key in r.get("perf", {})]
            entry[key] = sum(values) / len(values) if values else None
    return out


def markdown(report: dict[str, Any]) -> str:
    info = report["machine"]
    lines = [f"# BERSON on ROCStories, the test slice ({report['test_stories']:,} stories): {info['machine']}, "
             f"{report['date']}", "",
             f"- command: `python scripts/studies/roc_table.py {' '.join(report['argv'])}`",
             f"- software: torch {info['torch']}, Lightning {info['lightning']}, transformers {info['transformers']}",
             f"- this command's forecast: {report['forecast_total_s']:.0f} s of runs after {report['timing_s']:.0f} s "
             f"of timing (--budget-s {report['budget_s']:.0f}); finished runs reused: "
             f"{sum(r['status'] == 'finished' for r in report['runs'])}", "",
             "| row | train.py | seeds | test PMR | Acc | tau | PMR per seed | wall per run (s) | MFU | tokens/s |",
             "|---|---|---|---:|---:|---:|---|---|---:|---:|"]
    for row, e in report["stats"].items():
        cells = [f"{e[m]['mean']:.3f} ± {e[m]['std']:.3f}" if len(e["seeds"]) > 1 else f"{e[m]['mean']:.3f}"
                 for m in ("pmr", "acc", "tau")]
        mfu = f"{100 * e['mfu']:.1f}%" if e.get("mfu") is not None else "-"
        tps = f"{e['tokens_per_s']:,.0f}" if e.get("tokens_per_s") is not None else "-"
        lines.append(f"| `{row}` | `{' '.join(ROWS[row])}` | {' '.join(map(str, e['seeds']))} | {' | '.join(cells)} | "
                     f"{' / '.join(f'{v:.3f}' for v in e['pmr']['values'])} | "
                     f"{' / '.join(f'{w:.0f}' for w in e['wall_s'] if w is not None)} | {mfu} | {tps} |")
    lines += ["", "| run | status | steps | s a step (timed) | forecast (s) | wall (s) | test PMR |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for r in report["runs"]:
        f = r.get("forecast") or {}
        pmr = f"{r['metrics']['test/pmr']:.3f}" if r.get("metrics") else "-"
        lines.append(f"| `{run_name(r['row'], r['seed'])}` | {r['status']} | {f.get('steps', '-')} | "
                     f"{f.get('s_per_step', '-')} | {f.get('total_s', '-')} | {r.get('wall_s', '-')} | {pmr} |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out: Path) -> str:
    from seqaware.io import atomic_open

    report["stats"] = summary(report["runs"])
    text = markdown(report)
    with atomic_open(out / "roc_table.json", "w") as handle:
        json.dump(report, handle, indent=1, default=str)
    with atomic_open(out / "roc_table.md", "w") as handle:
        handle.write(text)
    return text


def machine_info(trainer: str) -> dict[str, str]:
    import pytorch_lightning
    import torch
    import transformers

    from seqaware.profiling import machine

    device = "cuda" if trainer == "gpu" and torch.cuda.is_available() else None
    return {"machine": machine(device), "torch": torch.__version__, "lightning": pytorch_lightning.__version__,
            "transformers": transformers.__version__}


# ---------------------------------------------------------------- the command
def plan(seeds: Sequence[int], paper_seeds: Sequence[int], rows: Sequence[str]) -> list[tuple[str, int]]:
    """(row, seed) in order: seeds outermost, so every row's first seed comes before any second one."""
    wanted = {"roc_base": list(seeds), "berson_paper": list(paper_seeds)}
    return [(row, seed) for seed in sorted({*seeds, *paper_seeds}) for row in rows if seed in wanted[row]]


def same_timing(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two timing runs' overrides time the same thing (where they wrote it aside: another ``--out``)."""
    def key(overrides: Sequence[str]) -> list[str]:
        return [o for o in overrides if not o.startswith(("paths.log_dir=", "+callbacks.step_clock.path="))]
    return key(a) == key(b)


def time_rows(args: argparse.Namespace, rows: Sequence[str], extra: list[str], machine: str) -> tuple[dict, float]:
    """Each row's timing: reused from ``OUT/step_times.json`` (or ``--step-times``) when made with the same overrides on
    this machine, else measured now.  Returns the timings and the seconds spent measuring."""
    from seqaware.io import atomic_open

    path = args.out / "step_times.json"
    known = json.loads(Path(args.step_times or path).read_text()) if Path(args.step_times or path).is_file() else {}
    spent, timings = 0.0, {}
    for row in rows:
        overrides = timing_overrides(row, args.trainer, args.out, args.warmup_steps, args.timed_steps,
                                     args.val_batches, extra)
        entry = known.get(row)
        if entry and same_timing(entry.get("overrides") or [], overrides) and entry.get("machine") == machine:
            print(f"{row}: step times reused ({entry['s_per_step']:.4f} s a step on {machine})", flush=True)
            timings[row] = entry
            continue
        folder = run_dir(args.out / "timing", row)
        shutil.rmtree(folder, ignore_errors=True)
        code, wall = train(overrides, args.out / "logs" / f"timing-{row}.log")
        spent += wall
        if code != 0:
            raise SystemExit(f"timing {row}: train.py exited {code}; see {args.out / 'logs' / f'timing-{row}.log'}")
        timings[row] = {**timing_figures(folder, args.out / "timing" / f"{row}.json", wall), "overrides": overrides,
                        "machine": machine, "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M")}
        known[row] = timings[row]
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "w") as handle:
            json.dump(known, handle, indent=1)
        print(f"{row}: {timings[row]['s_per_step']:.4f} s a step, {timings[row]['s_per_eval_batch']:.3f} s an "
              f"evaluation batch, {timings[row]['batches_per_epoch']} steps an epoch ({wall:.0f} s)", flush=True)
    return timings, spent


def main(argv: Optional[Sequence[str]] = None) -> int:
    from seqaware.io import atomic_open, read_test_metrics
    from seqaware.launch import split_overrides
    from seqaware.profiling import logged_perf

    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="roc_base's seeds")
    parser.add_argument("--paper-seeds", type=int, nargs="*", default=[0], help="BERSON's recipe's seeds")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--out", type=Path, default=ROOT / "logs" / "roc_table")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="refuse a forecast over this many seconds (default 0: no limit)")
    parser.add_argument("--trainer", default="gpu", choices=("gpu", "cpu"))
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--timed-steps", type=int, default=20)
    parser.add_argument("--val-batches", type=int, default=4)
    parser.add_argument("--step-times", type=Path, default=None, help="a step_times.json to read the timings from")
    args = parser.parse_args(own)
    args.out = args.out.resolve()
    info = machine_info(args.trainer)
    report: dict[str, Any] = {"argv": argv, "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": info,
                              "budget_s": args.budget_s, "runs": []}
    todo = plan(args.seeds, args.paper_seeds, args.rows)
    past_path = args.out / "runs.json"     # each run's forecast and wall time (all its parts), by this command
    past: dict[str, dict] = json.loads(past_path.read_text()) if past_path.is_file() else {}
    timings, report["timing_s"] = time_rows(args, sorted({row for row, _ in todo}, key=list(ROWS).index), extra,
                                            info["machine"])
    for row, seed in todo:
        overrides = run_overrides(row, seed, args.trainer, args.out, extra)
        folder = run_dir(args.out, run_name(row, seed))
        run_reuse.check_same_job(folder, overrides)
        record: dict[str, Any] = {"row": row, "seed": seed, "overrides": overrides}
        if runs.read_state(folder).get("status") == "finished" and read_test_metrics(folder) is not None:
            record.update(status="finished", forecast=past.get(folder.name, {}).get("forecast") or {})
        else:
            record.update(status="to run", forecast=forecast(compose_train(overrides), timings[row], steps_done(folder)))
        report["runs"].append(record)
    report["test_stories"] = next(iter(timings.values()))["splits"]["test"] if timings else None
    report["forecast_total_s"] = sum(r["forecast"]["total_s"] for r in report["runs"] if r["status"] != "finished")
    print(f"forecast on {info['machine']} (timings {report['timing_s']:.0f} s):", flush=True)
    for r in report["runs"]:
        f = r["forecast"]
        print(f"  {run_name(r['row'], r['seed'])}: " + ("finished, reused" if r["status"] == "finished" else
              f"{f['left']} of {f['steps']} steps x {f['s_per_step']:.4f} s + start-up {f['overhead_s']:.0f} s + "
              f"{f['validations']} validations and the test {f['eval_s']:.0f} s = {f['total_s']:.0f} s"), flush=True)
    total = report["forecast_total_s"] + report["timing_s"]
    print(f"  total {report['forecast_total_s']:.0f} s of runs, {total:.0f} s with the timing", flush=True)
    write_report(report, args.out)
    if args.budget_s and total > args.budget_s:
        print(f"roc_table.py: the forecast ({total:.0f} s) is over --budget-s {args.budget_s:.0f}: nothing run "
              "(--budget-s 0 runs it anyway)", file=sys.stderr)
        return 2
    for record in report["runs"]:
        folder = run_dir(args.out, run_name(record["row"], record["seed"]))
        if record["status"] != "finished":
            print(f"{run_name(record['row'], record['seed'])}: training ({record['forecast']['total_s']:.0f} s "
                  "forecast)", flush=True)
            code, wall = train(record["overrides"], args.out / "logs" / f"{run_name(record['row'], record['seed'])}.log")
            entry = past.setdefault(folder.name, {})
            entry["wall_s"] = round(entry.get("wall_s", 0.0) + wall, 1)        # a resumed run: every part
            entry.setdefault("forecast", record["forecast"])                    # the forecast of its first part
            with atomic_open(past_path, "w") as handle:
                json.dump(past, handle, indent=1)
            if code in STOPPED:
                record["status"] = "stopped"
                write_report(report, args.out)
                print(f"stopped by a signal during {folder.name}: its last.ckpt is saved; give the same command again "
                      "to resume it", file=sys.stderr)
                return code
            record["status"] = "tested" if code == 0 else f"failed (exit {code})"
        record["wall_s"] = past.get(folder.name, {}).get("wall_s")
        record["forecast"] = past.get(folder.name, {}).get("forecast") or record["forecast"]
        record["metrics"] = read_test_metrics(folder)
        record["perf"] = logged_perf(folder)
        write_report(report, args.out)
    print(write_report(report, args.out))
    print(MARKER, json.dumps(report["stats"], sort_keys=True))
    return 0 if all(r.get("metrics") for r in report["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
