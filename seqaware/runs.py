"""Run folders: one per run, resumable in place, never mixed with another run.

* :func:`new_run_dir` names a fresh folder (the ``${run_dir:...}`` resolver of
  ``configs/hydra/default.yaml``): ``run_name`` when set, else the SLURM job / torchrun run id (the
  same in every rank of one job, and across a requeue), else a timestamp plus a random suffix, the
  folder reserved with an exclusive ``mkdir`` so two runs started in the same second never share one.
* :func:`prepare` (rank 0 of ``train.py``, before anything is built): removes orphan temporary files
  of an interrupted save, refuses a folder that holds a finished run, and picks the checkpoint to
  resume from: the folder's own ``checkpoints/last.ckpt`` first (re-running the same command
  resumes), else ``ckpt_path=``.
* :class:`RunLock` (rank 0 of ``train.py``, for the whole run): an exclusive ``fcntl.flock`` on
  ``run.lock`` in the folder, so two processes never run in one folder; the kernel releases it when
  the process ends, however it ends (a SIGKILL leaves no stale lock).
* ``run.json`` in the folder records the state: ``running`` | ``interrupted`` | ``failed`` |
  ``finished`` (see docs/running.md), the checkpoint resumed from and the W&B run id (so a resumed
  run logs into the same W&B run).
* :func:`checkpoint_to_test`: what a run without training tests for ``ckpt_path=`` (a ``last.ckpt``: the best
  checkpoint beside it when its run tracked one; any other file: that file).
* :func:`resolve_latest`: ``latest:TASK/FILE`` config values name FILE in the newest finished run of TASK.
* Reusing a folder from a script that launches ``train.py`` runs (the study scripts): :mod:`seqaware.run_reuse`.
"""
from __future__ import annotations

import csv
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import socket
import sys
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


class RunLockedError(RuntimeError):
    """Another process is running in the run folder."""


_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+,@-]*")


def check_run_name(run_name: Any) -> str:
    """``run_name`` as a folder name, or ValueError: one path component of letters, digits and ``. _ - = + , @``
    that starts with a letter or digit (no ``/``, no ``..``, no hidden or absolute name)."""
    name = str(run_name)
    if not _RUN_NAME.fullmatch(name) or name.endswith(".") or ".." in name:
        raise ValueError(f"run_name={name!r} is not a folder name: use letters, digits and . _ - = + , @, starting with "
                         f"a letter or digit (no '/', no '..'). The run folder is <paths.log_dir>/<task_name>/runs/<run_name>; "
                         f"to write somewhere else set hydra.run.dir=PATH")
    return name


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


_PRINT_FLAGS = frozenset({"--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i"})


def _only_printing() -> bool:
    """Whether Hydra was asked only to print (the config, its help or info) on this command line."""
    return any(arg in _PRINT_FLAGS or arg.startswith("--cfg=") for arg in sys.argv[1:])


def new_run_dir(parent: str, run_name: Any = None) -> str:
    """The folder of a new run below ``parent`` (see the module doc)."""
    parent_path = Path(parent)
    if run_name not in (None, "", "null", "None"):
        return str(parent_path / check_run_name(run_name))
    job = distributed_job_id()
    if job is not None:
        return str(parent_path / job)
    if process_rank() != 0:  # a rank started on its own cannot know rank 0's random name
        raise RuntimeError("this process is a non-zero rank started without a shared job id (SLURM_JOB_ID or "
                           "torchrun --rdzv-id): set run_name=NAME (or hydra.run.dir=PATH) so every rank uses one folder")
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    if _only_printing():  # train.py --cfg / --help / --info: Hydra shows the name, nothing runs in it
        return str(parent_path / f"{stamp}_{secrets.token_hex(3)}")
    parent_path.mkdir(parents=True, exist_ok=True)
    while True:
        candidate = parent_path / f"{stamp}_{secrets.token_hex(3)}"
        try:
            candidate.mkdir()  # exclusive: a folder another run made first raises
            return str(candidate)
        except FileExistsError:
            continue


# ----------------------------------------------------------------------------------- lock
LOCK_FILE = "run.lock"


class RunLock:
    """An exclusive lock on a run folder for as long as the ``with`` block (or the process) lasts.

    ``fcntl.flock`` on ``<run_dir>/run.lock`` (created, never deleted: deleting a lock file lets two
    processes lock two different files). The holder writes its pid and host into the file for the
    message another process gets (:class:`RunLockedError`). The kernel drops the lock when the process
    ends, even by SIGKILL, so a killed run never blocks the next one.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunLockedError(
                f"{self.path.parent} is in use by another process ({holder}): two runs never share a folder. Wait for "
                f"it to end, or start this run in another folder (another run_name, or none for a fresh one)") from err
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


# ----------------------------------------------------------------------------------- run state
def read_state(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / RUN_STATE_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); delete it to resume this run folder") from err


def write_state(run_dir: str | os.PathLike, drop: tuple[str, ...] = (), **updates: Any) -> dict:
    """Merge ``updates`` into ``run.json`` (atomically), removing the keys ``drop``; returns the new state."""
    state = read_state(run_dir)
    for key in drop:
        state.pop(key, None)
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


def check_not_finished(run_dir: str | os.PathLike) -> dict:
    """The folder's state; :class:`RunFinishedError` (nothing changed) when it holds a finished run."""
    run_dir = Path(run_dir)
    state = read_state(run_dir)
    if state.get("status") == "finished":
        raise RunFinishedError(
            f"{run_dir} holds a finished run (finished {state.get('finished_at', '?')}; test metrics in "
            f"{run_dir / 'test_metrics.json'}). Nothing was changed. Start a new run in a new folder: leave out "
            f"hydra.run.dir / run_name, or set run_name=OTHER_NAME; to continue training it, use "
            f"ckpt_path={run_dir / LAST_CHECKPOINT} with a new run folder and a larger trainer.max_epochs.")
    return state


def prepare(run_dir: str | os.PathLike, ckpt_path: str | None, train: bool = True) -> RunPlan:
    """Check the run folder and choose the checkpoint to resume from (see the module doc).

    Every rank calls it (so every rank resumes from the same file); only rank 0 cleans the folder.
    """
    run_dir = Path(run_dir)
    state = check_not_finished(run_dir)
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
    """Resume ``ckpt_path`` in ``run_dir`` without losing best tracking: another run's checkpoint,
    or this folder's own ``last.ckpt`` after the folder was moved or renamed.

    Lightning's ModelCheckpoint forgets its best score when its folder changed; so the checkpoints
    it tracked are copied into this run's checkpoint folders (a moved folder already holds them),
    the callback states rewritten to point at them, and the result written as this run's
    ``checkpoints/last.ckpt`` (resumed from, and found again by :func:`prepare` if this run is
    interrupted in turn). A tracked checkpoint is looked for where its run left it, then beside
    ``ckpt_path`` (the source folder was moved, renamed or copied from another machine: its files
    are where ``ckpt_path`` is now). One found in neither place (nor already in the new folder) is
    named in a warning and dropped from the tracking: the best is then the best of what is left,
    and of what this run saves, so the test never falls back to the current weights because the
    best names a file that is gone. Returns the path to resume from.
    """
    import torch

    from seqaware.checkpoint_io import load_checkpoint

    checkpoint = load_checkpoint(ckpt_path)
    states = checkpoint.get("callbacks") or {}
    changed = False
    target = Path(run_dir) / LAST_CHECKPOINT     # where the resumed checkpoint is written (below)
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
        missing = []
        for path in _checkpoint_paths(state):
            # where the run left it, else beside ckpt_path (the source folder moved or was copied elsewhere)
            src = next((c for c in (Path(path), Path(ckpt_path).parent / Path(path).name) if c.is_file()), Path(path))
            dst = new_dir / src.name
            # the resumed file is written below as last.ckpt; tracked under another name (ckpt_path=<its best
            # checkpoint>) it is copied like the others, so the best it names is there to test
            written_below = dst.resolve() == target.resolve() and src.resolve() == Path(ckpt_path).resolve()
            if src.is_file() and not dst.exists() and not written_below:
                shutil.copy2(src, dst)
            if not dst.is_file() and not written_below:
                missing.append(path)
            mapping[path] = str(dst)
        if missing:
            log.warning("%s: the checkpoint(s) %s that %s tracked (best_model_path, best_k_models) are neither where "
                        "the run left them, nor beside it, nor in %s: 'best' now ranks only what is left and what "
                        "this run saves from here on, and the test may use a later checkpoint. Copy them into %s "
                        "to keep them", ckpt_path, missing, key, new_dir, new_dir)
            _forget(state, missing, getattr(cb, "mode", None))
        for name in ("best_model_path", "kth_best_model_path", "last_model_path"):
            if state.get(name):
                state[name] = mapping.get(state[name], state[name])
        if state.get("best_k_models"):
            state["best_k_models"] = {mapping.get(k, k): v for k, v in state["best_k_models"].items()}
        state["dirpath"] = str(new_dir)
        changed = True
    if not changed:
        return str(ckpt_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(target, "wb") as fh:
        torch.save(checkpoint, fh)
    log.info("resuming %s in %s with its best-checkpoint tracking (copied into %s)", ckpt_path, run_dir, target.parent)
    return str(target)


def _forget(state: dict, missing: list[str], mode: str | None) -> None:
    """Drop the checkpoints ``missing`` from a ``ModelCheckpoint`` state: out of ``best_k_models``, and the best
    and k-th best recomputed from what is left (``mode``: ``min`` / ``max``; None: read from the recorded best
    score), or emptied when nothing is left, so the resumed callback saves the next checkpoint it scores."""
    gone = set(missing)
    scores = {k: v for k, v in (state.get("best_k_models") or {}).items() if k not in gone}
    if "best_k_models" in state:
        state["best_k_models"] = scores
    if mode not in ("min", "max"):
        best_score = state.get("best_model_score")
        mode = "max" if best_score is None or all(float(best_score) >= float(v) for v in scores.values()) else "min"
    better, worse = (max, min) if mode == "max" else (min, max)
    if state.get("best_model_path") in gone:
        state["best_model_path"] = better(scores, key=lambda k: float(scores[k])) if scores else ""
        state["best_model_score"] = scores[state["best_model_path"]] if scores else None
    if state.get("kth_best_model_path") in gone:
        state["kth_best_model_path"] = worse(scores, key=lambda k: float(scores[k])) if scores else ""
        if scores:
            state["kth_value"] = scores[state["kth_best_model_path"]]
    if state.get("last_model_path") in gone:
        state["last_model_path"] = ""


def checkpoint_to_test(ckpt_path: str | os.PathLike, callbacks: list) -> tuple[str, str]:
    """The checkpoint a run without training (``train=false``) tests for ``ckpt_path=``, and a log line
    that says which and why.  The rule (docs/running.md, "Which checkpoint the test uses"):

    * ``ckpt_path=<run>/checkpoints/last.ckpt`` (a file named ``last.ckpt``) stands for its run: the best
      checkpoint that run tracked (``best_model_path`` of the monitoring ``ModelCheckpoint``, the one
      ``callbacks`` monitor first, as :func:`best_checkpoint` picks after a fit) is tested when a file of that
      name lies beside it, as the run itself tested it; otherwise ``last.ckpt`` itself, saying why;
    * any other file is tested exactly as given: a best checkpoint, a checkpoint saved at some step, a copy of
      a ``last.ckpt`` under another name (``cp last.ckpt last_weights.ckpt``: how to test a last checkpoint's own
      weights).
    """
    from seqaware.checkpoint_io import load_checkpoint

    given = Path(ckpt_path)
    states = load_checkpoint(given).get("callbacks") or {}
    keys = [cb.state_key for cb in callbacks if getattr(cb, "monitor", None) and getattr(cb, "state_key", None)]
    keys += [k for k, v in states.items() if isinstance(v, dict) and v.get("monitor")]
    state = next((states[k] for k in keys if isinstance(states.get(k), dict) and states[k].get("best_model_path")), None)
    if state is None:
        return str(given), (f"testing ckpt_path={given} as given (its run tracked no best checkpoint: no monitored "
                            "validation metric when it was saved)")
    recorded = Path(state["best_model_path"])
    best = given.parent / recorded.name
    score = state.get("best_model_score")
    metric = f"{state['monitor']} {float(score):.4f}" if score is not None else state["monitor"]
    if recorded.name == given.name:
        return str(given), f"testing ckpt_path={given}, the best checkpoint its run tracked ({metric})"
    if given.name != LAST_CHECKPOINT.name:
        return str(given), (f"testing ckpt_path={given} as given (only a file named {LAST_CHECKPOINT.name} stands for "
                            f"the best checkpoint its run tracked; this one's run tracked {recorded.name}, {metric})")
    if not best.is_file():
        return str(given), (f"testing ckpt_path={given} itself: the best checkpoint its run tracked ({recorded.name}, "
                            f"{metric}) is not beside it")
    return str(best), (f"testing the best checkpoint {best} ({metric}) that the run of ckpt_path={given} tracked, "
                       f"not ckpt_path itself (to test its own weights, pass a copy under another name than "
                       f"{LAST_CHECKPOINT.name})")


def rewrite_saved_config(cfg: Any) -> Path | None:
    """Rewrite Hydra's record of this job's config (``<run folder>/.hydra/config.yaml``, written before the job
    started) with ``cfg`` as it is now, atomically, in Hydra's own format: for a change ``train.py`` makes to the
    composed config (``trainer.max_epochs`` raised by ``trainer.max_steps``), so that re-running the saved config
    runs the same job. Returns the path, or None outside a Hydra job or when Hydra saved no config
    (``hydra.output_subdir=null``)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.output_subdir is None:
        return None
    path = Path(hydra_cfg.runtime.output_dir) / str(hydra_cfg.output_subdir) / "config.yaml"
    if not path.is_file():
        return None
    with atomic_open(path) as fh:
        fh.write(OmegaConf.to_yaml(cfg))
    return path


# ------------------------------------------------------------------------- latest:TASK/FILE
LATEST_PREFIX = "latest:"
_LATEST = re.compile(r"latest:(?P<task>[A-Za-z0-9][A-Za-z0-9._=+,@-]*)/(?P<file>[^/].*)")


def finished_runs(log_dir: str | os.PathLike, task: str) -> list[Path]:
    """Folders of the finished runs of ``task`` under ``log_dir`` (``runs/*`` and sweep jobs
    ``multiruns/*/*``), the most recently finished first."""
    root = Path(log_dir) / task
    found = []
    for state_file in [*root.glob(f"runs/*/{RUN_STATE_FILE}"), *root.glob(f"multiruns/*/*/{RUN_STATE_FILE}")]:
        try:
            state = json.loads(state_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if state.get("status") == "finished":
            found.append((str(state.get("finished_at", "")), state_file.stat().st_mtime_ns, state_file.parent))
    return [run for *_, run in sorted(found, key=lambda f: f[:2], reverse=True)]


def resolve_latest(value: str, log_dir: str | os.PathLike) -> str:
    """``latest:TASK/FILE`` -> ``<log_dir>/TASK/.../<newest finished run holding FILE>/FILE``.

    Runs that are running, interrupted or failed never count. FileNotFoundError when no finished run
    of TASK holds FILE, naming where it looked."""
    match = _LATEST.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r}: expected latest:TASK/FILE, e.g. latest:clipvil_pretrain/encoder.pt")
    task, name = match["task"], match["file"]
    runs = finished_runs(log_dir, task)
    for run_dir in runs:
        if (run_dir / name).is_file():
            return str(run_dir / name)
    looked = Path(log_dir) / task
    raise FileNotFoundError(
        f"{value}: no finished run of task '{task}' under {looked} holds {name} ({len(runs)} finished run(s) there). "
        f"Run that stage first (e.g. python train.py experiment={task}), or give the file's path")


def resolve_latest_values(cfg: Any, log_dir: str | os.PathLike) -> dict[str, str]:
    """Replace, in place, every string value ``latest:TASK/FILE`` of an OmegaConf config by the file it
    names (:func:`resolve_latest`); returns ``{key: path}``."""
    from omegaconf import OmegaConf, open_dict

    found: dict[str, str] = {}

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}.{i}")
        elif isinstance(node, str) and node.startswith(LATEST_PREFIX):
            found[key] = node

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    resolved = {}
    with open_dict(cfg):
        for key, value in found.items():
            resolved[key] = resolve_latest(value, log_dir)
            OmegaConf.update(cfg, key, resolved[key], merge=False)
            log.info("%s=%s: %s", key, value, resolved[key])
    return resolved


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
