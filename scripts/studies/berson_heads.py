#!/usr/bin/env python
"""BERSON's head as released against ours on ROCStories, and which of their differences move PMR.

    python scripts/studies/berson_heads.py --seeds 0 1 2                          # both heads, joint encoding, 3 seeds
    python scripts/studies/berson_heads.py --seeds 0 --rows ablation               # BERSON's head less one point at a time
    python scripts/studies/berson_heads.py --seeds 0 --rows ours/pairwise paper/pairwise --steps 150
    python scripts/studies/berson_heads.py --seeds 0 1 2 --rows recipe/paper recipe/roc_base --steps 0 \\
        -- backbones=base trainer=gpu 'data.extra_train_paths=[${paths.shared_data_dir}/roc/train_extra.tsv]'

Every row is ``python train.py experiment=berson_roc`` with the row's overrides, ``seed=S``, the budget and
the overrides after ``--`` (last, so they win), in ``OUT/<row>/seed<S>/`` (``hydra.run.dir``); the test split
is the 20% test slice of ``dev.tsv`` (1,963 stories, seed 0), the checkpoint with the best validation PMR is
tested.  The rows:

``ours/joint``, ``paper/joint``, ``ours/pairwise``, ``paper/pairwise``
    ``model.decoder.variant`` x ``model.pair_encoding`` under one recipe, ``hparams=roc_joint`` (batches of
    16, encoder lr 2e-4 with a 10% warm-up and a linear decay, head lr 1e-3).
``paper-<switch>/joint`` (``--rows ablation``: all of them)
    BERSON's head with one of its points set back to ours (``decoders.berson.VARIANTS``), joint encoding.
``recipe/paper``, ``recipe/roc_base``
    the whole recipes: ``hparams=berson_roc_paper`` (BERSON's release: head, batch 4, lr 2e-5, 2 epochs) and
    ``hparams=roc_base_b16`` (ours for MPNet-base in batches of 16: the recipe these rows measured before
    ``hparams=roc_base`` took token-budget batches); their budget is their own unless ``--steps`` is given.
``recipe/roc_joint``, ``recipe/roc_joint_large``
    MiniLM, joint encoding: ``hparams=roc_joint`` (batches of 16 stories) against ``hparams=roc_joint_large``
    (batches of at most 8,192 tokens, about 137 stories, its learning rates scaled by the square-root rule):
    the large-batch recipe against the one its rates were chosen for.  A token-budget row has no fixed
    batch, so ``--steps`` cannot size it: give ``--epochs`` (or ``--steps 0``).

Budget: ``--steps`` optimizer steps of ``--batch-size`` stories for every row (the same stories seen; a
recipe with other batches gets the same number of stories: ``steps * batch_size / its batch``), validation
at the middle and the end on ``--val-stories``; ``--steps 0``: the rows' own recipes, untouched.
``--epochs F`` instead: every row sees the same share of its training set whatever its batches (F <= 1: the
first F of one shuffled epoch, ``trainer.limit_train_batches``, validated at its middle and its end; a whole
F > 1: F epochs, validated at each epoch's end), with the learning-rate schedule over those steps.  A folder
that holds a tested run is reused; one made with other overrides, or with a config that changed since, is an
error (scripts/studies/wu2022_tables.py's rules).  Prints the table (PMR / Acc / tau, mean +- std over seeds, each seed's PMR, each later row's PMR minus
the first row's over the seeds both ran with its 95% t interval, wall time and logged training tokens/s per run)
and one line ``BERSON_HEADS_JSON {...}``; ``--table FILE`` also writes the markdown.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from decoders.berson import VARIANTS  # noqa: E402
from scripts.studies.wu2022_tables import _train  # noqa: E402
from seqaware import run_reuse  # noqa: E402
from seqaware.io import atomic_open, read_test_metrics  # noqa: E402
from seqaware.launch import split_overrides  # noqa: E402
from seqaware.metrics.seeds import mean_std, seed_matched_gap  # noqa: E402
from seqaware.profiling import logged_perf  # noqa: E402

MARKER = "BERSON_HEADS_JSON"
RECIPE = ("hparams=roc_joint",)
ABLATED = ("relation", "pointer_inputs", "loss_norm", "summary_divisor", "paragraph", "step_score", "init")
"""The switches the ablation sets back to ours, on the joint encoding; ``sep_in_pools`` / ``pool_dropout`` act
on the token pools of the pairwise encoding only (the joint path builds pair vectors from step states)."""


def rows() -> dict[str, tuple[tuple[str, ...], Optional[int]]]:
    """Row name -> (train.py overrides, the recipe's batch size; None for batches of a token budget)."""
    out: dict[str, tuple[tuple[str, ...], Optional[int]]] = {}
    for variant in ("ours", "paper"):
        for encoding in ("joint", "pairwise"):
            out[f"{variant}/{encoding}"] = (
                (*RECIPE, f"model.decoder.variant={variant}", f"model.pair_encoding={encoding}"), 16)
    for switch in ABLATED:
        back = [f"model.decoder.{switch}={str(VARIANTS['ours'][switch]).lower()}"]
        out[f"paper-{switch}/joint"] = ((*RECIPE, "model.decoder.variant=paper", "model.pair_encoding=joint", *back), 16)
    out["recipe/paper"] = (("hparams=berson_roc_paper",), 4)
    out["recipe/roc_base"] = (("hparams=roc_base_b16",), 16)
    out["recipe/roc_joint"] = (("hparams=roc_joint",), 16)
    out["recipe/roc_joint_large"] = (("hparams=roc_joint_large",), None)   # token-budget batches
    return out


def select(names: list[str]) -> list[str]:
    """Row names from ``--rows`` (``ablation``: every ``paper-*`` row); an unknown one lists the known."""
    known = rows()
    out: list[str] = []
    for name in names:
        chosen = [k for k in known if k.startswith("paper-")] if name == "ablation" else [name]
        for k in chosen:
            if k not in known:
                raise SystemExit(f"--rows: unknown row {k!r}; known: ablation, {', '.join(known)}")
            if k not in out:
                out.append(k)
    return out


def budget(steps: int, batch_size: int, recipe_batch: Optional[int], val_stories: int,
           epochs: Optional[float] = None, name: str = "") -> list[str]:
    """``train.py`` overrides for ``steps`` steps of ``batch_size`` stories, counted in the recipe's batches, or
    for ``epochs`` of the training set (see the module doc); none for ``steps <= 0`` without ``epochs``."""
    val = [f"trainer.limit_val_batches={max(1, math.ceil(val_stories / 16))}", "data.eval_batch_size=16"]
    if epochs is not None:
        if epochs <= 0 or (epochs > 1 and epochs != int(epochs)):
            raise SystemExit(f"--epochs must be a share of one epoch (0 < F <= 1) or a whole number, got {epochs}")
        if epochs <= 1:
            # a float, always: Lightning reads limit_train_batches=1 (an int) as one batch, 1.0 as the whole epoch
            return ["trainer.max_steps=-1", "trainer.max_epochs=1", f"trainer.limit_train_batches={float(epochs)}",
                    "trainer.val_check_interval=0.5", "trainer.check_val_every_n_epoch=1", *val]
        return ["trainer.max_steps=-1", f"trainer.max_epochs={int(epochs)}", "trainer.limit_train_batches=1.0",
                "trainer.val_check_interval=1.0", "trainer.check_val_every_n_epoch=1", *val]
    if steps <= 0:
        return []
    if recipe_batch is None:
        raise SystemExit(f"row {name!r} trains in batches of a token budget, which --steps cannot count: "
                         f"give --epochs, or --steps 0 for its own recipe")
    own = max(1, math.ceil(steps * batch_size / recipe_batch))
    return [f"trainer.max_steps={own}", "trainer.max_epochs=-1", f"trainer.val_check_interval={max(1, own // 2)}",
            "trainer.check_val_every_n_epoch=null", *val]


def run(name: str, seed: int, out: Path, overrides: list[str], steps: int, batch_size: int,
        val_stories: int, epochs: Optional[float] = None) -> tuple[dict, float, Optional[float]]:
    """The test metrics of row ``name`` for ``seed`` (training what is missing), its wall time (s) and its mean
    logged training tokens/s (None when its CSV log has none)."""
    row, recipe_batch = rows()[name]
    run_dir = out / name.replace("/", "-") / f"seed{seed}"
    cmd = ["experiment=berson_roc", *row, f"seed={seed}",
           *budget(steps, batch_size, recipe_batch, val_stories, epochs, name), *overrides]
    run_reuse.check_same_job(run_dir, cmd)
    metrics = read_test_metrics(run_dir)
    wall_file = run_dir / "wall_seconds.txt"
    if metrics is None:
        start = time.time()
        _train(cmd, run_dir, f"{run_dir.name}.log")
        wall_file.write_text(f"{time.time() - start:.1f}\n")
        metrics = read_test_metrics(run_dir)
        if metrics is None:
            raise SystemExit(f"{run_dir}: the run wrote no test_metrics.json")
    wall = float(wall_file.read_text()) if wall_file.is_file() else float("nan")
    return metrics, wall, logged_perf(run_dir).get("tokens_per_s")


def summary(results: dict[str, list[tuple[int, dict, float, Optional[float]]]]) -> dict[str, dict]:
    """Per row: seeds, wall per run, mean logged training tokens/s per run, test PMR / Acc / tau (mean, sample
    std, values) and, for every row after the first, its PMR minus the first row's over the seeds both ran."""
    out: dict[str, dict] = {}
    first = None
    for name, per_seed in results.items():
        entry: dict = {"seeds": [s for s, *_ in per_seed], "wall_s": [round(w, 1) for _, _, w, _ in per_seed],
                       "tokens_per_s": [None if t is None else round(t, 1) for *_, t in per_seed]}
        for metric in ("pmr", "acc", "tau"):
            values = [float(m[f"test/{metric}"]) for _, m, _, _ in per_seed]
            mean, std = mean_std(values)
            entry[metric] = {"mean": mean, "std": std, "values": values}
        if first is None:
            first = name
        else:
            base = {s: float(m["test/pmr"]) for s, m, _, _ in results[first]}
            gap = seed_matched_gap({s: float(m["test/pmr"]) for s, m, _, _ in per_seed}, base)
            entry["pmr_gap"] = {"against": first, "mean": gap.mean, "std": gap.std, "low": gap.low, "high": gap.high,
                                "seeds": gap.n, "wins": gap.wins}
        out[name] = entry
    return out


def table(stats: dict[str, dict]) -> str:
    first = next(iter(stats), "")
    lines = [f"| row | seeds | test PMR | Acc | tau | PMR per seed | PMR - `{first}` (seed-matched, 95% CI) "
             "| wall per run (s) | training tokens/s per run |", "|---|---|---:|---:|---:|---|---|---|---|"]
    for name, e in stats.items():
        cells = [f"{e[m]['mean']:.3f} ± {e[m]['std']:.3f}" if len(e["seeds"]) > 1 else f"{e[m]['mean']:.3f}"
                 for m in ("pmr", "acc", "tau")]
        per_seed = " / ".join(f"{v:.3f}" for v in e["pmr"]["values"])
        gap = e.get("pmr_gap")
        if gap is None:
            gap_cell = "-"
        elif gap["seeds"] > 1:
            gap_cell = (f"{gap['mean']:+.3f} [{gap['low']:+.3f}, {gap['high']:+.3f}], higher on {gap['wins']} of "
                        f"{gap['seeds']}")
        else:
            gap_cell = f"{gap['mean']:+.3f} (one seed)"
        walls = " / ".join(f"{w:.0f}" for w in e["wall_s"])
        speeds = " / ".join("-" if t is None else f"{t:,.0f}" for t in e["tokens_per_s"])
        lines.append(f"| `{name}` | {' '.join(map(str, e['seeds']))} | {' | '.join(cells)} | {per_seed} | {gap_cell} "
                     f"| {walls} | {speeds} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, overrides = split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rows", nargs="+", default=["ours/joint", "paper/joint"])
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps of --batch-size stories (0: recipes' own)")
    parser.add_argument("--epochs", type=float, default=None,
                        help="instead of --steps: this share of an epoch (<= 1) or these whole epochs, for every row")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--val-stories", type=int, default=400)
    parser.add_argument("--out", type=Path, default=ROOT / "logs" / "berson_heads")
    parser.add_argument("--table", type=Path, default=None, help="also write the markdown table here")
    args = parser.parse_args(own)
    names = select(args.rows)
    results: dict[str, list[tuple[int, dict, float, Optional[float]]]] = {}
    for seed in args.seeds:          # seeds outermost: every row gets its first seed before any its second
        for name in names:
            print(f"{name} seed {seed}", flush=True)
            metrics, wall, speed = run(name, seed, args.out, overrides, args.steps, args.batch_size,
                                       args.val_stories, args.epochs)
            results.setdefault(name, []).append((seed, metrics, wall, speed))
    stats = summary({n: results[n] for n in names})
    text = table(stats)
    print(text)
    if args.table is not None:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(args.table, "w") as handle:   # a table cut short never replaces a whole one
            handle.write(text + "\n")
    print(MARKER, json.dumps(stats, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
