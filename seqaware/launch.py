"""Launch helpers for DDP under Hydra multirun and for SLURM (see docs/cluster.md).

* :func:`pin_ddp_relaunch`: Lightning's DDP launcher starts ranks > 0 by re-running the command line
  (``sys.argv``) with ``hydra.run.dir=<HydraConfig run.dir>`` appended. Inside a ``-m`` sweep that
  command still says ``-m`` and holds the whole sweep, and ``run.dir`` is not the job's folder, so
  each extra rank re-ran the sweep under a new ``${now:...}`` sweep folder (the stray second sweep
  folder). Called at the start of a multirun job, it makes the re-launched ranks run exactly this
  job (its own overrides, ``hydra.mode=RUN``) in this job's output folder.
* :func:`ddp_sweep_job`: the context of one job of such a sweep. Rank 0 runs every job of the sweep
  in one process, but Lightning launches the extra ranks (and sets ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``MASTER_PORT``, ... and the process group) once per *process*: without a reset the second job
  found ``LOCAL_RANK`` set, launched no rank and talked to job 0's exited rank 1 ("Connection
  closed by peer"). At the end of each job it waits for the job's ranks (kills them when the job
  failed), destroys the process group and restores those variables, so the next job launches its own.
* :func:`slurm_environment`: Lightning's ``SLURMEnvironment`` with ``auto_requeue`` off when the
  process runs under SLURM (None otherwise). Lightning's own requeue handler would save a second,
  ``hpc_ckpt_*.ckpt`` checkpoint and requeue on its own; the project's signal handling checkpoints
  and submitit requeues.
* :func:`split_overrides`: the command line of a script that launches ``train.py`` runs: its own
  arguments, then ``--`` and Hydra overrides for every run.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

log = logging.getLogger(__name__)

BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def pin_ddp_relaunch() -> bool:
    """In a Hydra multirun job, point Lightning's re-launch of DDP ranks at this job and folder.

    Rewrites ``sys.argv`` to this job's task overrides + ``hydra.mode=RUN`` and sets the Hydra
    config's ``run.dir`` to the job's output folder (Lightning appends ``hydra.run.dir=<run.dir>``).
    Returns True when it changed something (a multirun job of Hydra's basic launcher), False otherwise.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict, read_write

    if not HydraConfig.initialized():
        return False
    hydra_cfg = HydraConfig.get()
    # only Hydra's basic launcher runs the jobs inside the process whose command line Lightning reuses
    # (submitit jobs run `python -m submitit.core._submit`; on SLURM, srun starts every rank itself)
    if hydra_cfg.mode != RunMode.MULTIRUN or hydra_cfg.launcher.get("_target_") != BASIC_LAUNCHER:
        return False
    output_dir = hydra_cfg.runtime.output_dir
    with read_write(hydra_cfg), open_dict(hydra_cfg):
        hydra_cfg.run.dir = output_dir
    sys.argv = [sys.argv[0], *hydra_cfg.overrides.task, "hydra.mode=RUN"]
    log.debug("DDP ranks > 0 will re-run this job in %s: %s", output_dir, sys.argv[1:])
    return True


# what Lightning's launcher (and torch.distributed) set in the launching process for one DDP job
_DDP_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@contextmanager
def ddp_sweep_job(rank_timeout_s: float = 600.0) -> Iterator[bool]:
    """Run one job of a ``-m`` sweep so that the next job can launch its own DDP ranks.

    Calls :func:`pin_ddp_relaunch`; yields whether this is such a job (Hydra's basic launcher). Then,
    in that case only, on the way out (after the job returned or raised): :func:`release_ddp_ranks`
    (wait up to ``rank_timeout_s`` for the ranks this process launched, kill them at once if the job
    raised), destroy the default process group and put back the DDP variables as they were before the job.
    """
    pinned = pin_ddp_relaunch()
    saved = {var: os.environ.get(var) for var in _DDP_ENV}
    failed = True
    try:
        yield pinned
        failed = False
    finally:
        if pinned:
            codes = release_ddp_ranks(kill=failed, timeout_s=rank_timeout_s)
            _reset_ddp_state(saved)
            bad = {rank: code for rank, code in codes.items() if code != 0}
            if bad and not failed:
                raise RuntimeError(f"DDP ranks of this job exited with a failure (rank: exit code) {bad}; see their "
                                   f"logs (train_ddp_process_<rank>.log) in {_output_dir()}")


def _output_dir() -> str:
    from hydra.core.hydra_config import HydraConfig

    try:
        return str(HydraConfig.get().runtime.output_dir)
    except Exception:  # noqa: BLE001  (no Hydra app, or no output folder yet)
        return "the run folder"


def release_ddp_ranks(kill: bool = False, timeout_s: float = 600.0) -> dict[int, int | None]:
    """Wait for the DDP ranks Lightning's launcher started from this process (or kill them); their exit codes.

    Lightning keeps them only in the watchdog thread it starts beside them (``_ChildProcessObserver``),
    which SIGKILLs this process as soon as one of them exits with an error: the watchdog is detached
    first (its list emptied, so it stops on its next poll), so that a job's ranks ending -- or being
    killed after a failure -- cannot take the rest of the sweep down. A rank still running after
    ``timeout_s`` is killed. Returns ``{local rank: exit code}`` (1, 2, ...).
    """
    from lightning_fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    procs: list[subprocess.Popen] = []
    for thread in threading.enumerate():
        if isinstance(thread, _ChildProcessObserver) and thread.is_alive():
            procs.extend(thread._child_processes)
            thread._child_processes = []  # all() of nothing: the watchdog finishes without acting
    for proc in procs:
        if kill and proc.poll() is None:
            proc.kill()
    codes = {}
    for rank, proc in enumerate(procs, start=1):
        try:
            codes[rank] = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.error("DDP rank %d (pid %d) still runs %.0f s after this job ended: killing it", rank, proc.pid, timeout_s)
            proc.kill()
            codes[rank] = proc.wait()
    return codes


def _reset_ddp_state(saved: dict[str, str | None]) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def slurm_environment(auto_requeue: bool = False) -> Any:
    """``SLURMEnvironment(auto_requeue=...)`` when running inside a SLURM job, else None."""
    from lightning_fabric.plugins.environments import SLURMEnvironment

    if not SLURMEnvironment.detect():
        return None
    return SLURMEnvironment(auto_requeue=auto_requeue)


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[script args..., "--", overrides...]`` -> (script args, overrides); no ``--``: no overrides."""
    if "--" not in argv:
        return list(argv), []
    cut = argv.index("--")
    return list(argv[:cut]), list(argv[cut + 1:])
