#!/usr/bin/env python
"""Our Wu et al. (ACL 2022) Tables 2 and 3 on the hard synthetic world, through ``train.py``.

    python scripts/studies/wu2022_tables.py                                     # every row, seeds 1-5
    python scripts/studies/wu2022_tables.py --seeds 1 --rows clipvil/N clipvil/Y # a subset
    python scripts/studies/wu2022_tables.py --seeds 1 2 3 --pretrain-steps 1200  # a longer pretraining budget
    python scripts/studies/wu2022_tables.py --seeds 1 2 3 --jobs 14 -- trainer.accelerator=gpu   # one GPU, 14 runs at a time
    python scripts/studies/wu2022_tables.py --seeds 1 2 3 --out logs/wu2022 -- trainer.max_steps=300   # overrides for every run
    python scripts/studies/wu2022_tables.py --seeds 1 2 3 --data roc   # text-only N / Y on ROCStories
        [--finetune-override trainer.limit_test_batches=32 ...]  # overrides of one stage only

Table 2 (sec. 5, "Golden-test-set performance"): BERSON fine-tuned end to end on four encoders --
text-only (MiniLM standing in for RoBERTa), image-only (EfficientNet-Lite0 grid tokens standing in for
CLIP), VisualBERT (detector-style region tokens) and CLIP-ViL (grid tokens) -- each without (N) and
with (Y) sequence-aware pretraining on the same world's training split (``--data roc``: the text rows on
ROCStories, ``roberta_pretrain`` then ``berson_roc``; on the synthetic worlds text/Y is CLIP-ViL's MLM
pretraining without the images, so text-only N and Y share text/N's encoder).  Table 3 (objective
ablation): CLIP-ViL pretrained with MLM, MLM+ISP, MLM+SMRM, MLM+ISP+PISP, MLM+ISP+SMRM, and the
image-only encoder with ISP and ISP+PISP, each then fine-tuned the same way.  MLM+ISP+SMRM is
``clipvil_pretrain``'s own objective set, so that row is the CLIP-ViL Y runs (``clipvil-Y/``), not a
second copy of them.

Every run is a ``train.py`` process with ``hydra.run.dir=OUT/<row>/seed<S>/{pretrain,finetune}``,
``seed=S``, ``data=synthetic_hard`` (``--data``) and the overrides given after ``--`` (last, so they win).
Pretraining runs ``--pretrain-steps`` optimizer steps of ``--pretrain-batch-size`` sequences (default
600 x 16: the budget in which every objective leaves chance with the pretraining defaults,
docs/results/pretraining.md; the experiments' own 100 steps of 4 are the README main job's stage, in
which ISP stays at chance).  A run whose folder already holds its result (``encoder.pt`` and a finished
``run.json`` for pretraining, ``test_metrics.json`` for fine-tuning; a finished fine-tuning is reused without
its ``encoder.pt``) is reused, and an interrupted one
resumes in place (the same folder), so the script can be stopped and started again.  A folder whose run
was made with other overrides, or whose overrides compose to another config now (a default changed since:
``seqaware.runs.check_same_job``), is an error, never silently reused.  Metrics
are the Table 2 columns over the test split, against every order the DAG allows (``test/acc``,
``test/pmr``, ``test/lcs`` = Lq, ``test/lcstr`` = Lr, ``test/tau``, ``test/dist``); Acc and PMR in
percent as in the paper.  The script prints the two tables in the paper's layout (mean +- std over
the seeds), each encoder's seed-matched PMR gap Y - N with its 95% interval and the seeds where Y > N
(:mod:`seqaware.metrics.seeds`; N and Y of one seed fine-tune from one draw of every layer neither pretrained),
and one final line
``WU2022_TABLES_JSON {"<encoder>/<N|Y|objective set>/<metric>": {"mean", "std", "n"}, ...}``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from seqaware import run_reuse, runs  # noqa: E402
from seqaware.io import read_test_metrics  # noqa: E402
from seqaware.launch import split_overrides  # noqa: E402
from seqaware.metrics.seeds import mean_std, seed_matched_gap  # noqa: E402

MARKER = "WU2022_TABLES_JSON"
METRICS = (("acc", "Acc", 100.0), ("pmr", "PMR", 100.0), ("lcs", "Lq", 1.0), ("lcstr", "Lr", 1.0),
           ("tau", "τ", 1.0), ("dist", "Dist", 1.0))
"""(train.py key without ``test/``, Table 2 column, scale)."""


@dataclass(frozen=True)
class Row:
    """One row of Table 2 or 3: how its encoder is pretrained (None: N) and fine-tuned."""

    key: str                      # "<encoder>/<N|Y|objective set>"
    table: int
    group: str                    # Image-Only | Text-Only | Multimodal
    label: str                    # the first column(s) as the paper prints them
    finetune: tuple[str, ...]     # berson_finetune overrides selecting the encoder
    pretrain: Optional[tuple[str, ...]] = None   # train.py overrides of the pretraining run
    same_as: Optional[str] = None  # a row whose runs this one is (its experiment's default objective set)


IMAGE = ("modality=image",)
TEXT = ("modality=text",)
VISUALBERT = ("encoder@model.encoder=visualbert", "data.collator.max_boxes=8")
CLIPVIL = ()
ROWS: tuple[Row, ...] = (
    Row("image/N", 2, "Image-Only", "CLIP (Lite0 grid) N", IMAGE),
    Row("image/Y", 2, "Image-Only", "CLIP (Lite0 grid) Y", IMAGE, ("experiment=clip_image_pretrain",)),
    Row("text/N", 2, "Text-Only", "RoBERTa (MiniLM) N", TEXT),
    Row("text/Y", 2, "Text-Only", "RoBERTa (MiniLM) Y", TEXT, ("experiment=clipvil_pretrain", "modality=text", "objectives=mlm")),
    Row("visualbert/N", 2, "Multimodal", "VisualBERT N", VISUALBERT),
    Row("visualbert/Y", 2, "Multimodal", "VisualBERT Y", VISUALBERT, ("experiment=visualbert_pretrain",)),
    Row("clipvil/N", 2, "Multimodal", "CLIP-ViL N", CLIPVIL),
    Row("clipvil/Y", 2, "Multimodal", "CLIP-ViL Y", CLIPVIL, ("experiment=clipvil_pretrain",)),
    Row("image/isp", 3, "Image-Only", "ISP", IMAGE, ("experiment=clip_image_pretrain", "objectives=isp")),
    Row("image/isp_pisp", 3, "Image-Only", "ISP + PISP", IMAGE, ("experiment=clip_image_pretrain", "objectives=isp_pisp")),
    Row("clipvil/mlm", 3, "Multimodal", "MLM", CLIPVIL, ("experiment=clipvil_pretrain", "objectives=mlm")),
    Row("clipvil/mlm_isp", 3, "Multimodal", "MLM + ISP", CLIPVIL, ("experiment=clipvil_pretrain", "objectives=mlm_isp")),
    Row("clipvil/mlm_smrm", 3, "Multimodal", "MLM + SMRM", CLIPVIL, ("experiment=clipvil_pretrain", "objectives=mlm_smrm")),
    Row("clipvil/mlm_isp_pisp", 3, "Multimodal", "MLM + ISP + PISP", CLIPVIL,
        ("experiment=clipvil_pretrain", "objectives=mlm_isp_pisp")),
    # clipvil_pretrain's own objective set (tests/test_wu2022_tables.py checks it): the runs of clipvil/Y
    Row("clipvil/mlm_isp_smrm", 3, "Multimodal", "MLM + ISP + SMRM", CLIPVIL,
        ("experiment=clipvil_pretrain", "objectives=mlm_isp_smrm"), same_as="clipvil/Y"),
)
ROW_BY_KEY = {r.key: r for r in ROWS}
ROW_KEYS = tuple(r.key for r in ROWS)
TEXT_ONLY_DATA = {"roc": ("berson_roc", "roberta_pretrain")}
"""Text-only data configs -> (fine-tuning experiment, the Y row's pretraining experiment).  The synthetic
worlds fine-tune with ``berson_finetune`` and pretrain text/Y with ``clipvil_pretrain modality=text
objectives=mlm``: the single-stream encoder ``berson_finetune modality=text`` fine-tunes, so text-only N and
Y share one architecture (text/N's).  With ``--data roc`` the text rows are Wu et al.'s text-only N / Y on
real stories (``roberta_pretrain`` on the training part of ``roc/dev.tsv``, then ``berson_roc``, both the
plain text encoder)."""


CHILD_ENV: dict[str, str] = {}
"""Environment the ``train.py`` processes get on top of this one's (``--jobs``: their thread count)."""


def thread_env(jobs: int, cpus: Optional[int] = None) -> dict[str, str]:
    """``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` for ``jobs`` concurrent runs sharing ``cpus`` cores (at least
    1 each), unless the user set them; nothing for one job (PyTorch's own default: every core)."""
    if jobs <= 1:
        return {}
    per_job = str(max(1, (cpus or os.cpu_count() or 1) // jobs))
    return {k: os.environ.get(k, per_job) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def _train(overrides: list[str], run_dir: Path, log_name: str) -> None:
    """One ``train.py`` process; its output goes to ``run_dir/<log_name>``; a failure stops the script."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    log_path = run_dir.parent / log_name
    start = time.time()
    with log_path.open("w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **CHILD_ENV})
    if proc.returncode != 0:
        raise SystemExit(f"train.py failed (exit {proc.returncode}) after {time.time() - start:.0f} s: "
                         f"{' '.join(cmd)}\n  see {log_path}")
    print(f"  {run_dir.relative_to(run_dir.parents[2])}: {time.time() - start:.0f} s", flush=True)


def _pretrained(run_dir: Path) -> bool:
    return (run_dir / "encoder.pt").is_file() and runs.read_state(run_dir).get("status") == "finished"


def pretrain_budget(steps: int, batch_size: int) -> list[str]:
    """The pretraining runs' ``train.py`` overrides for ``steps`` optimizer steps of ``batch_size`` sequences."""
    if steps < 1 or batch_size < 1:
        raise ValueError(f"the pretraining budget must be positive, got {steps} steps of {batch_size}")
    return [f"trainer.max_steps={steps}", "trainer.max_epochs=-1", f"data.batch_size={batch_size}"]


def run_row(row: Row, seed: int, out: Path, data: str, overrides: list[str],
            budget: tuple[str, ...] = (), finetune_only: tuple[str, ...] = ()) -> dict[str, float]:
    """The fine-tuned test metrics of ``row`` for ``seed`` (running what is missing).  ``budget``: the
    pretraining run's own overrides (:func:`pretrain_budget`, ``--pretrain-override``), before
    ``overrides``; ``finetune_only``: the fine-tuning run's own (``--finetune-override``), after them."""
    # absolute: the fine-tuning's encoder path is in the override list the reuse check compares, so a relative
    # and an absolute ``out`` must name the same runs
    base = out.resolve() / row.key.replace("/", "-") / f"seed{seed}"
    common = [f"seed={seed}", f"data={data}", *overrides]
    experiment, text_pretrain = TEXT_ONLY_DATA.get(data, ("berson_finetune", None))
    finetune = [f"experiment={experiment}", *row.finetune, *common, *finetune_only]
    ft_dir = base / "finetune"
    if row.pretrain is not None:
        pre_dir = base / "pretrain"
        pretrain = [*((f"experiment={text_pretrain}",) if text_pretrain else row.pretrain), *budget, *common]
        run_reuse.check_same_job(pre_dir, pretrain)
        finetune.append(f"model.encoder.ckpt={pre_dir / 'encoder.pt'}")
    run_reuse.check_same_job(ft_dir, finetune)
    metrics = read_test_metrics(ft_dir)
    if metrics is None:
        # (a finished fine-tuning needs its encoder no more: runs copied without their large encoder.pt,
        # e.g. back from another machine, are reused, not pretrained again)
        if row.pretrain is not None and not _pretrained(pre_dir):
            _train(pretrain, pre_dir, "pretrain.log")
        _train(finetune, ft_dir, "finetune.log")
        metrics = read_test_metrics(ft_dir)
        if metrics is None:
            raise SystemExit(f"{ft_dir}: the fine-tuning run wrote no test_metrics.json (was it run with test=false?)")
    return metrics


def summarise(results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """``{"<row key>/<metric>": {"mean", "std", "n"}}`` over seeds (sample std; 0 for one seed)."""
    out = {}
    for key, per_seed in results.items():
        for metric, _, scale in METRICS:
            values = [scale * float(m[f"test/{metric}"]) for m in per_seed]
            mean, std = mean_std(values)
            out[f"{key}/{metric}"] = {"mean": mean, "std": std, "n": len(values)}
    return out


def gaps(results: dict[str, list[dict[str, float]]], seeds: list[int]) -> dict[str, dict[str, float]]:
    """``{"<encoder>/Y-N/pmr": {"mean", "std", "low", "high", "n", "wins"}}``: each encoder's seed-matched PMR gap
    (points) between its Y and N rows, with the 95% interval over seeds (:mod:`seqaware.metrics.seeds`)."""
    out = {}
    for key in results:
        encoder, arm = key.split("/")
        if arm != "Y" or f"{encoder}/N" not in results:
            continue
        y = {s: 100 * float(m["test/pmr"]) for s, m in zip(seeds, results[key])}
        n = {s: 100 * float(m["test/pmr"]) for s, m in zip(seeds, results[f"{encoder}/N"])}
        gap = seed_matched_gap(y, n)
        out[f"{encoder}/Y-N/pmr"] = {"mean": gap.mean, "std": gap.std, "low": gap.low, "high": gap.high,
                                     "n": gap.n, "wins": gap.wins, "text": gap.text()}
    return out


def table(summary: dict[str, dict[str, float]], number: int) -> str:
    """Table 2 or 3 in the paper's layout: modality groups, then one row per encoder / objective set."""
    head = "| Modality | " + ("Encoder, pretraining" if number == 2 else "Pretraining objectives") + " | " \
        + " | ".join(f"{name}{'↓' if metric == 'dist' else '↑'}" for metric, name, _ in METRICS) + " |"
    lines = [head, "|---|---|" + "---:|" * len(METRICS)]
    group = None
    for row in ROWS:
        if row.table != number or f"{row.key}/pmr" not in summary:
            continue
        cells = []
        for metric, _, _ in METRICS:
            s = summary[f"{row.key}/{metric}"]
            cells.append(f"{s['mean']:.2f} ± {s['std']:.2f}" if s["n"] > 1 else f"{s['mean']:.2f}")
        lines.append(f"| {row.group if row.group != group else ''} | {row.label} | " + " | ".join(cells) + " |")
        group = row.group
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    argv, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--rows", nargs="+", default=None, metavar="ROW",
                        help=f"rows to run (default: all; the text rows for text-only data): {' '.join(ROW_KEYS)}")
    parser.add_argument("--data", default="synthetic_hard", help="data config (configs/data/), default synthetic_hard")
    parser.add_argument("--out", type=Path, default=ROOT / "logs" / "wu2022_tables")
    parser.add_argument("--pretrain-steps", type=int, default=600, help="optimizer steps of each pretraining run")
    parser.add_argument("--pretrain-batch-size", type=int, default=16, help="sequences per pretraining step")
    parser.add_argument("--pretrain-override", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.py override of the pretraining runs only (repeatable), e.g. "
                             "trainer.val_check_interval=100")
    parser.add_argument("--finetune-override", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.py override of the fine-tuning runs only (repeatable), e.g. "
                             "trainer.limit_test_batches=32")
    parser.add_argument("--jobs", type=int, default=1,
                        help="(row, seed) runs at a time (each pretrains, then fine-tunes); their train.py processes "
                             "get OMP_NUM_THREADS = cores / jobs unless it is set. One GPU takes many: 14 on an "
                             "H200 with 16 cores (docs/results/sequencing.md)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.rows is None:
        args.rows = [k for k in ROW_KEYS if args.data not in TEXT_ONLY_DATA or k.startswith("text/")]
    unknown = sorted(set(args.rows) - set(ROW_KEYS))
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {list(ROW_KEYS)}")
    if args.data in TEXT_ONLY_DATA and any(not k.startswith("text/") for k in args.rows):
        parser.error(f"data={args.data} is text-only: its rows are text/N text/Y, got {' '.join(args.rows)}")
    rows = [r for r in ROWS if r.key in args.rows]
    try:
        budget = (*pretrain_budget(args.pretrain_steps, args.pretrain_batch_size), *args.pretrain_override)
    except ValueError as err:
        parser.error(str(err))
    runs_of = {row.key: ROW_BY_KEY[row.same_as] if row.same_as else row for row in rows}
    for row in rows:
        shared = f", the runs of {runs_of[row.key].key}" if runs_of[row.key] is not row else ""
        print(f"{row.key} (Table {row.table}: {row.label}{shared})", flush=True)
    # every (row, seed) once (an aliased row shares its runs), longest first: the rows that pretrain
    jobs = sorted({(runs_of[row.key].key, seed) for row in rows for seed in args.seeds},
                  key=lambda job: (ROW_BY_KEY[job[0]].pretrain is None, ROW_KEYS.index(job[0]), job[1]))
    CHILD_ENV.clear()
    CHILD_ENV.update(thread_env(args.jobs))

    failed = threading.Event()

    def run(job: tuple[str, int]) -> Optional[dict[str, float]]:
        if failed.is_set():  # after a failure no run starts; the running ones finish, then the script stops
            return None
        try:
            return run_row(ROW_BY_KEY[job[0]], job[1], args.out, args.data, overrides, budget,
                           tuple(args.finetune_override))
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # threads wait on train.py processes
        futures = {pool.submit(run, job): job for job in jobs}
        done = {futures[f]: f.result() for f in as_completed(futures)}  # the first failure is raised
    results = {row.key: [done[(runs_of[row.key].key, seed)] for seed in args.seeds] for row in rows}
    summary = summarise(results)
    seeds = " ".join(map(str, args.seeds))
    for number in (2, 3):
        text = table(summary, number)
        if text.count("\n") > 1:
            print(f"\nTable {number} (ours; {args.data}, test split, mean ± std over seeds {seeds}):\n{text}")
    matched = gaps(results, args.seeds)
    if matched:
        few = " (fewer than 5 seeds)" if len(args.seeds) < 5 else ""
        print(f"\nY - N, test PMR points, seed-matched over seeds {seeds}{few}:")
        for key, gap in matched.items():
            print(f"  {key.split('/')[0]}: {gap['text']}")
        summary.update(matched)
    (args.out).mkdir(parents=True, exist_ok=True)
    (args.out / "tables.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    print(f"{MARKER} {json.dumps(summary, sort_keys=True)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
