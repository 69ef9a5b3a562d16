"""Launch helpers for DDP under Hydra multirun and for SLURM (see docs/cluster.md).

* :func:`pin_ddp_relaunch`: Lightning's DDP launcher starts ranks > 0 by re-running the command line
  (``sys.argv``) with ``hydra.run.dir=<HydraConfig run.dir>`` appended. Inside a ``-m`` sweep that
  command still says ``-m`` and holds the whole sweep, and ``run.dir`` is not the job's folder, so
  each extra rank re-ran the sweep under a new ``${now:...}`` sweep folder (the stray second sweep
  folder). Called at the start of a multirun job, it makes the re-launched ranks run exactly this
  job (its own overrides, ``hydra.mode=RUN``) in this job's output folder.
* :func:`slurm_environment`: Lightning's ``SLURMEnvironment`` with ``auto_requeue`` off when the
  process runs under SLURM (None otherwise). Lightning's own requeue handler would save a second,
  ``hpc_ckpt_*.ckpt`` checkpoint and requeue on its own; the project's signal handling checkpoints
  and submitit requeues.
* :func:`split_overrides`: the command line of a script that launches ``train.py`` runs: its own
  arguments, then ``--`` and Hydra overrides for every run.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

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
