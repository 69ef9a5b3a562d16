"""Reusing a run folder from a script that launches ``train.py`` runs into folders of its own (the study scripts).

Before such a script reuses a finished run or resumes a cut one, :func:`check_same_job` asks whether
``python train.py OVERRIDES hydra.run.dir=FOLDER`` would make that run again: the same overrides
(``.hydra/overrides.yaml``) composing to the same config (``.hydra/config.yaml`` against a fresh composition,
:func:`config_differences`).  The override list alone let a changed config default through: the same command
reused runs made under the old one.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from omegaconf import Container, OmegaConf

from seqaware.config import compose_train


def saved_overrides(run_dir: str | os.PathLike) -> list[str] | None:
    """The ``train.py`` overrides of the run in ``run_dir`` (Hydra's ``.hydra/overrides.yaml``), or None."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    return [str(x) for x in (yaml.safe_load(path.read_text()) or [])]


_UNRESOLVED = object()


def _leaves(tree: Any, key: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_leaves(v, f"{key}.{k}" if key else str(k)))
        return out
    return {key: tree}


def _resolved(conf: Any, key: str) -> Any:
    """``key``'s value in ``conf`` with its interpolations resolved, or ``_UNRESOLVED`` where they cannot be here
    (``${hydra:...}`` outside a Hydra job, a key that is gone)."""
    try:
        value = OmegaConf.select(conf, key, throw_on_missing=False, throw_on_resolution_failure=True)
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, Container) else value
    except Exception:
        return _UNRESOLVED


def config_differences(then: Any, now: Any) -> list[tuple[str, Any, Any]]:
    """``(key, value then, value now)`` of every leaf of the config ``then`` (a run's ``.hydra/config.yaml``,
    loaded) whose value ``now`` (a fresh composition) differs: unresolved values first, and where those differ,
    the values resolved in each config (``'fresh'`` and ``${oc.select:x,fresh}`` with no ``x`` are the same).  A
    key ``now`` has and ``then`` has not is a new option, not a difference (a new option keeps the old behaviour
    by default: the project's rule); a key gone is ``'<absent>'`` now."""
    raw_then, raw_now = _leaves(OmegaConf.to_container(then)), _leaves(OmegaConf.to_container(now))
    out = []
    for key, old in raw_then.items():
        new = raw_now.get(key, "<absent>")
        if old == new:
            continue
        if key in raw_now:
            a, b = _resolved(then, key), _resolved(now, key)
            if a is not _UNRESOLVED and b is not _UNRESOLVED and a == b:
                continue
        out.append((key, old, new))
    return out


def check_same_job(run_dir: str | os.PathLike, overrides: list[str], limit: int = 8) -> None:
    """Stop (``SystemExit``) if ``run_dir`` holds a run that ``python train.py OVERRIDES hydra.run.dir=run_dir``
    would not make again: one made with other overrides, or with the same overrides when they composed to
    another config than they compose to now (a default changed since: a config file's value, a preset's; compared
    with ``.hydra/config.yaml`` key by key, :func:`config_differences`).  The message names the folder and up to
    ``limit`` differences.  A folder without Hydra's record (nothing run yet) passes."""
    run_dir = Path(run_dir)
    advice = "pick another --out, or remove the folder to run it again"
    previous = saved_overrides(run_dir)
    if previous is not None and previous != list(overrides):
        raise SystemExit(f"{run_dir} holds a run made with other overrides than this command's:\n"
                         f"  that run: {' '.join(previous)}\n  this one: {' '.join(overrides)}\n{advice}")
    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        return
    diffs = config_differences(OmegaConf.load(saved), compose_train(overrides))
    if diffs:
        shown = "\n".join(f"  {k}: that run {a!r}, now {b!r}" for k, a, b in diffs[:limit])
        more = f"\n  ... and {len(diffs) - limit} more" if len(diffs) > limit else ""
        raise SystemExit(f"{run_dir} holds a run made with the same overrides, but they compose to another config "
                         f"now (a default changed since it ran):\n{shown}{more}\n{advice}")
