"""Run folders: one per run, resumable in place, never mixed with another run.

* :func:`new_run_dir` names a fresh folder (the ``${run_dir:...}`` resolver of
  ``configs/hydra/default.yaml``): ``run_name`` when set, else the SLURM job / torchrun run id (the
  same in every rank of one job, and across a requeue), else a timestamp plus a random suffix, the
  folder reserved with an exclusive ``mkdir`` so two runs started in the same second never share one.
* :func:`prepare` (rank 0 of ``train.py``, before anything is built): removes orphan temporary files
  of an interrupted save, refuses a folder that holds a finished run, and picks the checkpoint to
  resume from: the folder's own ``checkpoints/last.ckpt`` first (re-running the same command
  resumes), else ``ckpt_path=``.
* ``run.json`` in the folder records the state: ``running`` | ``interrupted`` | ``finished``, the
  checkpoint resumed from and the W&B run id (so a resumed run logs into the same W&B run).
"""
from __future__ import annotations

import csv
import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqaware.io import atomic_open

log = logging.getLogger(__name__)


def best_checkpoint(trainer: Any) -> str | None:
    """The best checkpoint of the trainer's first ``ModelCheckpoint`` that monitors a metric, when
    one was written (what ``train.py`` tests and pretraining exports)."""
    for cb in trainer.checkpoint_callbacks:
        if getattr(cb, "monitor", None) and getattr(cb, "best_model_path", "") and Path(cb.best_model_path).is_file():
            return cb.best_model_path
    return None


RUN_STATE_FILE = "run.json"
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


class RunFinishedError(RuntimeError):
    """The run folder already holds a finished run."""


def process_rank() -> int:
    """Global rank of this process as the launcher set it (0 when not launched distributed)."""
    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        value = os.environ.get(var)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                pass
    return 0


def distributed_job_id() -> str | None:
    """An id every process of one launched job shares (and a SLURM requeue keeps), or None."""
    if os.environ.get("SLURM_JOB_ID"):
        array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        return f"slurm-{array_job}_{task}" if array_job and task else f"slurm-{os.environ['SLURM_JOB_ID']}"
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return f"torchrun-{run_id}"
    return None


def new_run_dir(parent: str, run_name: Any = None) -> str:
    """The folder of a new run below ``parent`` (see the module doc)."""
    parent_path = Path(parent)
    if run_name not in (None, "", "null", "None"):
        return str(parent_path / str(run_name))
    job = distributed_job_id()
    if job is not None:
        return str(parent_path / job)
    if process_rank() != 0:  # a rank started on its own cannot know rank 0's random name
        raise RuntimeError("this process is a non-zero rank started without a shared job id (SLURM_JOB_ID or "
                           "torchrun --rdzv-id): set run_name=NAME (or hydra.run.dir=PATH) so every rank uses one folder")
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    parent_path.mkdir(parents=True, exist_ok=True)
    while True:
        candidate = parent_path / f"{stamp}_{secrets.token_hex(3)}"
        try:
            candidate.mkdir()  # exclusive: a folder another run made first raises
            return str(candidate)
        except FileExistsError:
            continue


# ----------------------------------------------------------------------------------- run state
def read_state(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / RUN_STATE_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); delete it to resume this run folder") from err


def write_state(run_dir: str | os.PathLike, **updates: Any) -> dict:
    """Merge ``updates`` into ``run.json`` (atomically) and return the new state."""
    state = read_state(run_dir)
    state.update(updates, updated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    with atomic_open(Path(run_dir) / RUN_STATE_FILE) as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
    return state


def clean_orphans(run_dir: str | os.PathLike) -> list[Path]:
    """Remove the temporary files :func:`seqaware.io.atomic_open` leaves when a process is killed mid-write."""
    removed = []
    root = Path(run_dir)
    if not root.is_dir():
        return removed
    for path in root.rglob(".*.tmp"):
        if path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.info("removed %d temporary file(s) of an interrupted save: %s", len(removed), [str(p) for p in removed])
    return removed


@dataclass
class RunPlan:
    """What :func:`prepare` decided for this run."""

    run_dir: Path
    ckpt_path: str | None = None
    resumed_in_place: bool = False     # the folder's own last.ckpt
    state: dict = field(default_factory=dict)
    csv_rows: list[dict] = field(default_factory=list)


def prepare(run_dir: str | os.PathLike, ckpt_path: str | None, train: bool = True) -> RunPlan:
    """Check the run folder and choose the checkpoint to resume from (see the module doc).

    Every rank calls it (so every rank resumes from the same file); only rank 0 cleans the folder.
    """
    run_dir = Path(run_dir)
    state = read_state(run_dir)
    if state.get("status") == "finished":
        raise RunFinishedError(
            f"{run_dir} holds a finished run (finished {state.get('finished_at', '?')}; test metrics in "
            f"{run_dir / 'test_metrics.json'}). Nothing was changed. Start a new run in a new folder: leave out "
            f"hydra.run.dir / run_name, or set run_name=OTHER_NAME; to continue training it, use "
            f"ckpt_path={run_dir / LAST_CHECKPOINT} with a new run folder and a larger trainer.max_epochs.")
    if process_rank() == 0:
        clean_orphans(run_dir)
    plan = RunPlan(run_dir=run_dir, ckpt_path=ckpt_path, state=state)
    last = run_dir / LAST_CHECKPOINT
    if train and last.is_file():
        if ckpt_path and Path(ckpt_path).resolve() != last.resolve():
            log.info("the run folder has its own %s: resuming from it (ckpt_path=%s was the start of this run)",
                     last, ckpt_path)
        plan.ckpt_path, plan.resumed_in_place = str(last), True
        log.info("resuming run %s from %s", run_dir, last)
    return plan


# ---------------------------------------------------------------------- resume from another folder
def _checkpoint_paths(state: dict) -> list[str]:
    paths = [state.get("best_model_path"), state.get("kth_best_model_path"), state.get("last_model_path")]
    paths += list((state.get("best_k_models") or {}).keys())
    return [p for p in dict.fromkeys(paths) if p]


def rehome_checkpoint(ckpt_path: str | os.PathLike, callbacks: list, run_dir: str | os.PathLike) -> str:
    """Resume ``ckpt_path`` (another run's checkpoint) in ``run_dir`` without losing best tracking.

    Lightning's ModelCheckpoint forgets its best score when its folder changed; so the checkpoints
    it tracked are copied into this run's checkpoint folders, the callback states rewritten to point
    at the copies, and the result written as this run's ``checkpoints/last.ckpt`` (resumed from, and
    found again by :func:`prepare` if this run is interrupted in turn). Returns the path to resume from.
    """
    import torch

    from seqaware.checkpoint_io import load_checkpoint

    checkpoint = load_checkpoint(ckpt_path)
    states = checkpoint.get("callbacks") or {}
    changed = False
    for cb in callbacks:
        key = getattr(cb, "state_key", None)
        state = states.get(key)
        if not isinstance(state, dict) or not getattr(cb, "dirpath", None) or "dirpath" not in state:
            continue
        old_dir, new_dir = Path(state["dirpath"]), Path(cb.dirpath)
        if old_dir.resolve() == new_dir.resolve():
            continue
        new_dir.mkdir(parents=True, exist_ok=True)
        mapping = {}
        for path in _checkpoint_paths(state):
            src = Path(path)
            dst = new_dir / src.name
            if src.is_file() and src.resolve() != Path(ckpt_path).resolve():
                shutil.copy2(src, dst)
            mapping[path] = str(dst)
        for name in ("best_model_path", "kth_best_model_path", "last_model_path"):
            if state.get(name):
                state[name] = mapping.get(state[name], state[name])
        if state.get("best_k_models"):
            state["best_k_models"] = {mapping.get(k, k): v for k, v in state["best_k_models"].items()}
        state["dirpath"] = str(new_dir)
        changed = True
    if not changed:
        return str(ckpt_path)
    target = Path(run_dir) / LAST_CHECKPOINT
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(target, "wb") as fh:
        torch.save(checkpoint, fh)
    log.info("resuming %s in %s with its best-checkpoint tracking (copied into %s)", ckpt_path, run_dir, target.parent)
    return str(target)


# ------------------------------------------------------------------------------- loggers
def checkpoint_step(ckpt_path: str | os.PathLike) -> int:
    from seqaware.checkpoint_io import load_checkpoint

    return int(load_checkpoint(ckpt_path).get("global_step", 0))


def read_csv_rows(path: str | os.PathLike, before_step: int | None = None) -> tuple[list[str], list[dict]]:
    """Header and rows of a CSVLogger ``metrics.csv`` (rows with ``step < before_step`` when given)."""
    path = Path(path)
    if not path.is_file():
        return [], []
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        header = list(reader.fieldnames or [])
    if before_step is not None:
        rows = [r for r in rows if r.get("step") in (None, "") or int(float(r["step"])) < before_step]
    return header, rows


def restore_csv_rows(loggers: list, header: list[str], rows: list[dict]) -> None:
    """Put back the rows of an interrupted run into each CSVLogger's ``metrics.csv`` (Lightning's
    CSV writer deletes an existing file when it starts); later rows are appended to them."""
    if not rows:
        return
    for lg in loggers:
        if type(lg).__name__ != "CSVLogger":
            continue
        writer = lg.experiment
        with open(writer.metrics_file_path, "w", newline="") as fh:
            out = csv.DictWriter(fh, fieldnames=header)
            out.writeheader()
            out.writerows(rows)
        writer.metrics_keys = sorted(set(writer.metrics_keys) | set(header))
        if writer.metrics_keys != header:
            writer._rewrite_with_new_header(writer.metrics_keys)
        log.info("kept %d rows of %s", len(rows), writer.metrics_file_path)
