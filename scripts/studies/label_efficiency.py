#!/usr/bin/env python
"""Label-efficiency curves: BERSON's test PMR against the number of labelled procedures k, fine-tuned from
the raw backbones (N) and from a sequence-aware pretrained encoder (Y).

    python scripts/studies/label_efficiency.py --world default                 # the embedded synthetic world
    python scripts/studies/label_efficiency.py --world hard                    # data=synthetic_hard
    python scripts/studies/label_efficiency.py --world roc                     # ROCStories, MiniLM text-only
    python scripts/studies/label_efficiency.py --world hard --ks 8 32 --seeds 1 2 3 --objectives '[mlm,smrm]'
    python scripts/studies/label_efficiency.py --world roc -- trainer.accelerator=gpu   # overrides of every run

Per world and seed, one pretraining run on the unlabelled pool (no fine-tuning split is read; the pool's
procedures are in their authored order, so pretraining sees the order of all of them: k counts fine-tuning
labels only), on whole procedures (``data.view.min_steps=max_steps=5``, as ``hparams=wu2022``), the sequences
the joint fine-tuning encodes.  One pretraining per seed (``seed=S``), because a pretraining is itself a draw:
two runs of one configuration that differ only in float rounding gave Y 79.5 and 57.7 on the default world at
k = 8 (docs/results/label_efficiency.md), so Y's spread over seeds must include the pretraining's.

* ``default`` / ``hard``: ``clipvil_pretrain`` on the world's training procedures (the pretraining view's
  sub-sequences, as Wu et al. pretrain on their training data); the test split is raised to 300
  procedures (``data.source.num_test``), so one procedure is a third of a PMR point, and the pretraining
  run is not tested (``test=false``): the test split is never read by pretraining.
* ``roc``: ``roberta_pretrain`` on the 30,731 stories of ``train_extra.tsv`` (their own order, the file's
  own small validation slice; ``dev.tsv`` is never read); fine-tuning (``berson_roc hparams=roc_joint``, the
  joint recipe) picks k stories of ``dev.tsv``'s training slice and tests on its 20% test slice, as every
  ``berson_roc`` run.

Then, for every k and seed, two fine-tuning runs of the same budget (``--steps`` x ``--batch-size``,
whatever k: small k sees its procedures more often): N from the raw backbones, Y from that seed's pretrained
``encoder.pt``. The k procedures are ``data.train_subset=k`` (a seeded subset, the same for N and Y of
one seed, nested across k). No validation labels: fine-tuning runs validate never
(``trainer.limit_val_batches=0``) and the final weights are tested. BERSON with one encoder pass per
procedure (``model.pair_encoding=joint``): the encoding pretraining trains (a whole sequence at a time)
and 5-10x cheaper on a CPU than the pairwise one.  BERSON's own pairwise encoding, with the pretraining on
step pairs: ``--finetune-override model.pair_encoding=pairwise --pretrain-override data.view.max_steps=2
--pretrain-override data.view.min_steps=2``.

Before fine-tuning, the script checks that no test procedure is in the pretraining pool, by content
(:func:`procedure_key`: the normalised text of every step and the bytes of every image) and stops naming
the overlap if there is one. Finished runs are reused (``test_metrics.json``; pretraining: ``encoder.pt``
and a finished ``run.json``), a run made with other overrides or another composed config is an error
(``scripts/studies/wu2022_tables.py``'s rules). It prints the table (PMR and tau per k, N and Y, mean +- std and every seed, the seed-matched gap
``Y - N`` with its 95% interval and the number of seeds where Y > N: :mod:`seqaware.metrics.seeds`, the CPU
time of the curve) and one ``LABEL_EFFICIENCY_JSON {...}`` line; with ``--results DIR`` it also writes
``DIR/<world>.md`` and ``DIR/<world>.png`` (PMR against k, one line per arm, every seed as a point, the spread
shaded), atomically (``--results docs/results/label_efficiency`` for the committed pages).

N and Y of one seed start from the same draw of every layer neither of them pretrained (the BERSON network,
the pair module): the fine-tuning builds the same modules from the same seed whether or not it loads
``encoder.pt`` (tests/test_label_efficiency.py checks it), so their gap is what pretraining changed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.studies.wu2022_tables import _pretrained, _train, pretrain_budget  # noqa: E402
from seqaware import run_reuse  # noqa: E402
from seqaware.io import atomic_open, read_test_metrics  # noqa: E402
from seqaware.launch import split_overrides  # noqa: E402
from seqaware.metrics.seeds import mean_std, seed_matched_gap  # noqa: E402
from seqaware.procedure import Procedure  # noqa: E402

MARKER = "LABEL_EFFICIENCY_JSON"
ARMS = ("N", "Y")
METRICS = ("pmr", "acc", "tau")


@dataclass(frozen=True)
class World:
    """One curve: its fine-tuning and pretraining runs and default grid / budgets."""

    finetune: tuple[str, ...]        # train.py overrides of every fine-tuning run
    pretrain: tuple[str, ...]        # train.py overrides of the pretraining runs (without the objective set and seed)
    objectives: str                  # model.objectives.enabled of the pretraining run
    ks: tuple[int, ...]
    steps: int                       # fine-tuning budget: optimizer steps of batch_size procedures
    batch_size: int
    pretrain_steps: int
    pretrain_batch_size: int
    label: str
    paper: str = ""                  # what Wu et al. report for the nearest setting
    data_overrides: tuple[str, ...] = ()   # shared by pretraining and fine-tuning (one world)


SYNTHETIC_TEST = ("data.source.num_test=300",)
WORLDS: dict[str, World] = {
    "default": World(
        finetune=("experiment=berson_finetune", "data=synthetic"), pretrain=("experiment=clipvil_pretrain", "data=synthetic"),
        objectives="[mlm,smrm]", ks=(8, 32, 128), steps=40, batch_size=4, pretrain_steps=100, pretrain_batch_size=4,
        label="the default synthetic world, CLIP-ViL (MiniLM + EfficientNet-Lite0)", data_overrides=SYNTHETIC_TEST,
        paper="Wu et al. Table 2, CLIP-ViL N -> Y: WikiHow PMR 59.00 -> 65.67, RecipeQA 60.00 -> 68.00 (full labels)"),
    "hard": World(
        finetune=("experiment=berson_finetune", "data=synthetic_hard"),
        pretrain=("experiment=clipvil_pretrain", "data=synthetic_hard"),
        objectives="[mlm,sop,smrm]", ks=(8, 32, 128), steps=100, batch_size=4, pretrain_steps=300,
        pretrain_batch_size=8, label="the hard synthetic world, CLIP-ViL (MiniLM + EfficientNet-Lite0)",
        data_overrides=SYNTHETIC_TEST,
        paper="Wu et al. Table 2, CLIP-ViL N -> Y: WikiHow PMR 59.00 -> 65.67, RecipeQA 60.00 -> 68.00 (full labels)"),
    "roc": World(
        finetune=("experiment=berson_roc", "hparams=roc_joint"),
        pretrain=("experiment=roberta_pretrain", "data=roc", "data.train_path=${paths.shared_data_dir}/roc/train_extra.tsv",
                  "data.source.val_fraction=0.02", "data.source.test_fraction=0.02", "data.collator.max_tokens=35"),
        objectives="[mlm,sop]", ks=(32, 128, 512), steps=150, batch_size=16, pretrain_steps=300, pretrain_batch_size=16,
        label="ROCStories, text-only MiniLM", paper="Wu et al. Table 2, text-only RoBERTa N -> Y: WikiHow PMR "
        "+2.0, RecipeQA +5.0 (full labels; no ROC row)"),
}
PRETRAIN_COMMON = ("data.view.max_steps=5", "data.view.min_steps=5")
"""Pretraining sequences are whole procedures (up to 5 steps), as the joint fine-tuning encodes them. Measured:
an encoder pretrained on the experiments' default 2-step sub-sequences and fine-tuned with one pass over the
whole procedure fell far below N (docs/results/archive/label_efficiency.md, "Calibration")."""
FINETUNE_COMMON = ("model.pair_encoding=joint", "trainer.limit_val_batches=0", "trainer.max_epochs=-1",
                   "trainer.limit_train_batches=null", "trainer.num_sanity_val_steps=0")


def finetune_overrides(world: World, k: int, seed: int, steps: int, batch_size: int, extra: list[str]) -> list[str]:
    return [*world.finetune, *world.data_overrides, *FINETUNE_COMMON, f"data.train_subset={k}",
            f"trainer.max_steps={steps}", f"data.batch_size={batch_size}", f"seed={seed}", *extra]


def pretrain_overrides(world: World, objectives: str, steps: int, batch_size: int, extra: list[str],
                       seed: int | str = "S") -> list[str]:
    """The pretraining run of ``seed`` (``"S"``: the command as a page prints it, one run per seed)."""
    return [*world.pretrain, *world.data_overrides, *PRETRAIN_COMMON, f"model.objectives.enabled={objectives}",
            *pretrain_budget(steps, batch_size), "test=false", f"seed={seed}", *extra]


def procedure_key(procedure: Procedure) -> str:
    """A procedure's content: the normalised text of its steps (``story_key``: any surface form) and the
    SHA-256 of every step image's bytes, in step order. Equal keys are the same procedure."""
    from data_modules.adapters.roc import story_key

    digest = hashlib.sha256(story_key(procedure).encode())
    for s, step in enumerate(procedure.steps):
        for k in range(len(step.images or ())):
            path = procedure.image_path(s, k)
            digest.update(hashlib.sha256(path.read_bytes()).digest() if path and path.is_file() else b"missing")
    return digest.hexdigest()


def run_splits(run_dir: Path) -> dict[str, list[Procedure]]:
    """The procedures of every split of a run, read through its own resolved data source."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    import seqaware.config  # noqa: F401  (the config resolvers)

    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    data = cfg.data
    paths = {k: data.get(k) for k in ("train_path", "val_path", "test_path") if data.get(k) is not None}
    if data.get("extra_train_paths"):
        paths["extra_train_paths"] = list(data.extra_train_paths)
    return instantiate(data.source)(**paths)


def check_no_leak(pretrain_dir: Path, finetune_dir: Path) -> int:
    """Stop if a test procedure of the fine-tuning run is in the pretraining pool (the procedures the pretraining
    run trains and validates on; it runs with ``test=false``); returns the number of test procedures checked."""
    splits = run_splits(pretrain_dir)
    pool = {procedure_key(p) for split in ("train", "val") for p in splits.get(split, [])}
    test = run_splits(finetune_dir)["test"]
    leaked = [p.id for p in test if procedure_key(p) in pool]
    if leaked:
        raise SystemExit(f"{len(leaked)} test procedures of {finetune_dir} are in the pretraining pool of "
                         f"{pretrain_dir}: {leaked[:10]}")
    return len(test)


def run_seconds(run_dir: Path) -> float:
    """Wall seconds of a finished run (``run.json``'s start and finish)."""
    from seqaware import runs

    state = runs.read_state(run_dir)
    try:
        start = time.mktime(time.strptime(state["started_at"], "%Y-%m-%dT%H:%M:%S%z"))
        end = time.mktime(time.strptime(state["finished_at"], "%Y-%m-%dT%H:%M:%S%z"))
    except (KeyError, ValueError):
        return float("nan")
    return end - start


def markdown(world_name: str, world: World, results: dict, info: dict) -> str:
    lines = [f"# Label efficiency: {world.label}", "",
             f"Written by `{info['command']}` on {info['date']} ({info['machine']}).", ""]
    if info.get("pretrain"):   # only a pretraining that ran (an N-only curve has none)
        lines.append(f"Pretraining (Y), one run per seed S: `{' '.join(info['pretrain'])}` ({info['pretrain_s']:.0f} s "
                     "in all).")
    lines += [f"Fine-tuning: {info['steps']} steps of {info['batch_size']} procedures for every k"
              f"{', N and Y' if info.get('pretrain') else ''}; seeds {', '.join(map(str, info['seeds']))}"
              f"{' (fewer than 5)' if len(info['seeds']) < 5 else ''}; test split {info['test_n']} procedures (one = "
              f"{100 / max(info['test_n'], 1):.2f} PMR points)"
              + (", none of them in the pretraining pool (checked by content)." if info.get("pretrain") else "."),
              f"CPU time of the curve: {info['total_s'] / 60:.0f} min ({info['runs']} fine-tuning runs"
              + (" + the pretrainings)." if info.get("pretrain") else ")."),
              "", "| k | arm | PMR (%) mean ± std | per seed | Acc (%) | tau | Y - N (PMR), seed-matched |",
              "|---:|---|---:|---|---:|---:|---|"]
    for k in sorted(results):
        for arm in ARMS:
            rows = results[k].get(arm, {})
            if not rows:
                continue
            pmr = [100 * m["test/pmr"] for m in rows.values()]
            acc = mean_std([100 * m["test/acc"] for m in rows.values()])[0]
            tau = mean_std([m["test/tau"] for m in rows.values()])[0]
            m, s = mean_std(pmr)
            gap = ""
            if arm == "Y" and results[k].get("N") and set(rows) & set(results[k]["N"]):
                gap = seed_matched_gap({sd: 100 * r["test/pmr"] for sd, r in rows.items()},
                                       {sd: 100 * r["test/pmr"] for sd, r in results[k]["N"].items()}).text()
            per_seed = ", ".join(f"{100 * rows[sd]['test/pmr']:.2f}" for sd in sorted(rows))
            lines.append(f"| {k} | {arm} | {m:.2f} ± {s:.2f} | {per_seed} | {acc:.2f} | {tau:.3f} | {gap} |")
    if world.paper:
        lines += ["", f"Paper: {world.paper}."]
    return "\n".join(lines) + "\n"


def chart(world: World, results: dict, path: Path) -> None:
    """PMR (%) against k (log scale): one line per arm through the seed means, the min-max spread shaded,
    every seed a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for arm, colour in zip(ARMS, ("tab:grey", "tab:blue")):
        ks = [k for k in sorted(results) if results[k].get(arm)]
        if not ks:
            continue
        values = [[100 * m["test/pmr"] for m in results[k][arm].values()] for k in ks]
        ax.plot(ks, [sum(v) / len(v) for v in values], "-o", color=colour,
                label={"N": "N: raw backbones", "Y": "Y: sequence-aware pretrained"}[arm])
        ax.fill_between(ks, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.2)
        for k, v in zip(ks, values):
            ax.scatter([k] * len(v), v, color=colour, s=10)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("labelled procedures k")
    ax.set_ylabel("test PMR (%)")
    ax.set_title(world.label, fontsize=9)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=120)
    plt.close(fig)


def machine() -> str:
    """The CPU model, its cores and bf16 support, as a results page names its hardware (``gpu_check``'s facts)."""
    from scripts.bench.gpu_check import machine as facts

    info = facts()
    return f"{info['cpu']}, {info['cpu_cores']} cores, bf16: {info.get('cpu_bf16') or 'none'}"


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", choices=sorted(WORLDS), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--ks", type=int, nargs="+", help="labelled procedures per point (default: the world's)")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--objectives", help="the pretraining objective set, a list such as '[mlm,sop,smrm]'")
    parser.add_argument("--steps", type=int, help="fine-tuning optimizer steps (default: the world's)")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--pretrain-steps", type=int)
    parser.add_argument("--pretrain-batch-size", type=int)
    parser.add_argument("--out", type=Path, default=ROOT / "logs" / "label_efficiency")
    parser.add_argument("--results", type=Path, default=None,
                        help="write <world>.md and <world>.png into this folder (docs/results/label_efficiency for the "
                             "committed pages); without it the table is printed only")
    parser.add_argument("--finetune-override", action="append", default=[], metavar="K=V")
    parser.add_argument("--pretrain-override", action="append", default=[], metavar="K=V")
    args = parser.parse_args(own)
    world = WORLDS[args.world]
    ks = tuple(args.ks or world.ks)
    steps, batch_size = args.steps or world.steps, args.batch_size or world.batch_size
    objectives = args.objectives or world.objectives
    budget = (args.pretrain_steps or world.pretrain_steps, args.pretrain_batch_size or world.pretrain_batch_size)
    extra_pre = [*extra, *args.pretrain_override]
    # absolute, so Y's model.encoder.ckpt override (and the reuse check that compares override lists) is the
    # same whether --out was given relative or absolute
    out = args.out.resolve() / args.world
    pre_root = out / f"pretrain-{objectives.strip('[]').replace(',', '_')}"
    started = time.time()
    pretrained = "Y" in args.arms
    results: dict[int, dict[str, dict[int, dict]]] = {}
    seconds, pre_seconds, test_n = [], [], 0
    for seed in args.seeds:
        pre_dir = pre_root / f"seed{seed}"
        if pretrained:   # one pretraining per seed: Y's spread over seeds includes the pretraining's own
            pretrain = pretrain_overrides(world, objectives, *budget, extra_pre, seed)
            run_reuse.check_same_job(pre_dir, pretrain)
            if not _pretrained(pre_dir):
                print(f"pretraining {args.world}, seed {seed}: {' '.join(pretrain)}", flush=True)
                _train(pretrain, pre_dir, "pretrain.log")
            pre_seconds.append(run_seconds(pre_dir))
        leak_checked = False
        for k in ks:
            for arm in args.arms:
                run_dir = out / f"k{k}" / f"seed{seed}" / arm
                ft = finetune_overrides(world, k, seed, steps, batch_size, [*extra, *args.finetune_override])
                if arm == "Y":
                    ft.append(f"model.encoder.ckpt={pre_dir / 'encoder.pt'}")
                run_reuse.check_same_job(run_dir, ft)
                metrics = read_test_metrics(run_dir)
                if metrics is None:
                    _train(ft, run_dir, f"{arm}.log")
                    metrics = read_test_metrics(run_dir)
                    if metrics is None:
                        raise SystemExit(f"{run_dir}: the fine-tuning run wrote no test_metrics.json")
                if pretrained and not leak_checked:
                    test_n = check_no_leak(pre_dir, run_dir)
                    leak_checked = True
                    print(f"no test procedure of {args.world} is in the pool of pretraining seed {seed} ({test_n} "
                          "checked)", flush=True)
                elif not test_n:
                    test_n = len(run_splits(run_dir)["test"])
                seconds.append(run_seconds(run_dir))
                results.setdefault(k, {}).setdefault(arm, {})[seed] = metrics
                print(f"k={k} seed={seed} {arm}: PMR {100 * metrics['test/pmr']:.2f}", flush=True)
    pre_s = sum(s for s in pre_seconds if s == s)
    info = {"command": "python scripts/studies/label_efficiency.py " + " ".join(argv), "date": time.strftime("%Y-%m-%d"),
            "machine": machine(), "steps": steps, "batch_size": batch_size, "seeds": args.seeds, "test_n": test_n,
            "pretrain": pretrain_overrides(world, objectives, *budget, extra_pre) if pretrained else None,
            "pretrain_s": pre_s, "runs": len(seconds), "total_s": sum(s for s in seconds if s == s) + pre_s}
    page = markdown(args.world, world, results, info)
    print(page, flush=True)
    if args.results is not None:
        args.results.mkdir(parents=True, exist_ok=True)
        with atomic_open(args.results / f"{args.world}.md", "w") as handle:
            handle.write(page)
        chart(world, results, args.results / f"{args.world}.png")
        print(f"wrote {args.results / (args.world + '.md')} and .png in {time.time() - started:.0f} s")
    summary = {f"{k}/{arm}": {"pmr": mean_std([m["test/pmr"] for m in rows.values()]), "seeds": sorted(rows)}
               for k, arms in results.items() for arm, rows in arms.items()}
    print(MARKER, json.dumps({"world": args.world, "points": summary, "cpu_s": info["total_s"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
