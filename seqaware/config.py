"""OmegaConf resolvers used by the Hydra configs (registered on import; idempotent)."""
from __future__ import annotations

import inspect
import logging
import os
import threading
import types
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

log = logging.getLogger(__name__)
_COMPOSING = threading.Lock()

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MODALITIES = ("text", "image", "multimodal")


def to_plain(value: Any) -> Any:
    """An OmegaConf container (interpolations resolved) as plain dicts / lists; anything else as it is.
    Used wherever configs become hyper-parameters, options or cache keys."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _simple_types(annotation: Any) -> set[type] | None:
    """The scalar types (int, float, bool, str, NoneType) an annotation admits, or None when it admits
    anything else too (Any, a class, a container, a callable: not checked)."""
    import typing

    if annotation is inspect.Parameter.empty or annotation is typing.Any:
        return None
    if annotation in (int, float, bool, str, type(None)):
        return {float, int} if annotation is float else {annotation}
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return {type(v) for v in typing.get_args(annotation)}
    if origin in (typing.Union, types.UnionType):
        found: set[type] = set()
        for arg in typing.get_args(annotation):
            sub = _simple_types(arg)
            if sub is None:
                return None
            found |= sub
        return found
    return None


_WORDS = {bool: "true/false", int: "an integer", float: "a number", str: "text", type(None): "null"}


def check_values(values: dict, hints: dict, key: str, callee: str) -> None:
    """ValueError naming the key ``{key}.{name}`` for the first of ``values`` that the type annotation
    ``hints[name]`` of ``callee``'s argument rules out: text where it takes only numbers / booleans
    (``trainer.max_steps=abc``), or null where it takes no null (``data.view.max_steps=null``, which
    would otherwise break a comparison far from the config).  Arguments without an annotation, or
    that also take other types (a class, a container, Any), are not checked."""
    for name, value in values.items():
        if not (isinstance(value, str) or value is None) or name not in hints:
            continue
        allowed = _simple_types(hints[name])
        if allowed is None or type(value) in allowed:
            continue
        kinds = " or ".join(dict.fromkeys(_WORDS[t] for t in _WORDS if t in allowed))
        shown = "null" if value is None else repr(value)
        raise ValueError(f"{key}.{name}={shown}: {callee}({name}=...) takes {kinds}, not {_WORDS[type(value)]}")


def argument_hints(fn: Any) -> dict:
    """The evaluated type annotations of ``fn``'s arguments (a class: its ``__init__``), {} when they do
    not evaluate."""
    import typing

    try:
        return typing.get_type_hints(fn.__init__ if inspect.isclass(fn) else fn)
    except Exception:  # noqa: BLE001  (annotations that do not evaluate: nothing is checked)
        return {}


def check_argument_types(cfg: Any, key: str) -> None:
    """ValueError naming the key when a text value is given where a target's argument takes only
    numbers / booleans (``trainer.max_steps=abc``), before anything is built.

    Walks every ``_target_`` node of ``cfg`` (a config or plain containers; ``key``: its dotted path)
    and compares each text value with the type annotation of the argument of that name. Arguments
    without an annotation, or that also take other types, are not checked; nor are targets whose
    annotations do not evaluate."""
    import typing

    from hydra._internal.utils import _locate

    node = to_plain(cfg)
    if isinstance(node, list):
        for i, item in enumerate(node):
            check_argument_types(item, f"{key}[{i}]")
        return
    if not isinstance(node, dict):
        return
    target = node.get("_target_")
    if isinstance(target, str):
        try:
            obj = _locate(target)
            fn = obj.__init__ if inspect.isclass(obj) else obj
            params = inspect.signature(fn).parameters
            hints = typing.get_type_hints(fn)
        except Exception:  # noqa: BLE001  (unresolvable target or annotations: instantiate reports it)
            params, hints = {}, {}
        check_values({k: v for k, v in node.items() if k in params}, hints, key, target.rsplit('.', 1)[-1])
    for name, value in node.items():
        if isinstance(value, (dict, list)):
            check_argument_types(value, f"{key}.{name}")


def _check_modality(modality: str) -> str:
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    return modality


CPU_BF16_ENV = "SEQAWARE_CPU_BF16"
"""``SEQAWARE_CPU_BF16=0`` makes :func:`cpu_has_fast_bf16` answer False (``1``: True) whatever the CPU: a bf16
machine then picks the fp32 defaults an fp32-only CPU would (e.g. to run the test suite as such a CPU does)."""


def cpu_has_fast_bf16() -> bool:
    """True when the CPU has bf16 matrix instructions (AMX or AVX512-BF16): bf16 autocast is then
    about 2x faster than fp32 for transformer encoders; without them it is slower.
    ``SEQAWARE_CPU_BF16=0|1`` overrides the answer (:data:`CPU_BF16_ENV`)."""
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ValueError(f"{CPU_BF16_ENV} must be 0 or 1, got {forced!r}")
    try:
        import torch

        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except (OSError, RuntimeError, AttributeError):
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def auto_precision(accelerator: str = "cpu") -> str:
    """Lightning precision for ``trainer.precision: ${auto_precision:${trainer.accelerator}}``:
    ``bf16-mixed`` on GPUs and on CPUs with fast bf16, ``32-true`` otherwise."""
    if accelerator in ("gpu", "cuda"):
        return "bf16-mixed"
    if accelerator == "auto":
        import torch

        if torch.cuda.is_available():
            return "bf16-mixed"
    return "bf16-mixed" if cpu_has_fast_bf16() else "32-true"


# config groups / options that other configs include and a user never picks (left out of train.py --help)
INTERNAL_GROUPS = ("eval", "experiment_base", "model/common", "prompts", "source")
INTERNAL_OPTIONS = {"data": ("base",), "encoder": ("base", "single_stream"), "objectives": ("base",), "trainer": ("default",)}
# the groups of Hydra itself a user picks, beside the options in configs/hydra/<group>/
HYDRA_GROUPS = {"hydra/launcher": ("basic",), "hydra/sweeper": ("basic", "seqaware_optuna")}


def help_groups(config_dir: str | Path = PROJECT_ROOT / "configs") -> str:
    """The ``group: option, ...`` lines of ``train.py --help`` (``hydra.help.template``): the groups and
    options a user picks, without the internal ones (:data:`INTERNAL_GROUPS`, :data:`INTERNAL_OPTIONS`),
    and Hydra's launcher and sweeper."""
    root = Path(config_dir)
    groups: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.yaml")):
        group = path.parent.relative_to(root).as_posix()
        if group == "." or group == "hydra" or group in INTERNAL_GROUPS or path.stem in INTERNAL_OPTIONS.get(group, ()):
            continue
        groups.setdefault(group, []).append(path.stem)
    for group, builtin in HYDRA_GROUPS.items():
        groups[group] = sorted(set(builtin) | set(groups.get(group, [])))
    order = sorted(groups, key=lambda g: (g.startswith("hydra/"), g))
    return "\n".join(f"{group}: {', '.join(sorted(groups[group]))}" for group in order)


def checkpoint_monitor(target: str) -> str | None:
    """``${checkpoint_monitor:${model._target_}}``: the validation metric the model class declares for its best
    checkpoint (:func:`seqaware.monitor.declared_monitor`)."""
    from seqaware.monitor import declared_monitor

    return declared_monitor(target)[0]


def checkpoint_mode(target: str) -> str:
    """``${checkpoint_mode:${model._target_}}``: ``max`` or ``min``, as the model class declares."""
    from seqaware.monitor import declared_monitor

    return declared_monitor(target)[1]


def register_resolvers() -> None:
    resolvers = {
        # the checkout (or installed package) root; configs resolve relative paths against it
        "project_root": lambda: str(PROJECT_ROOT),
        "uses_text": lambda m: _check_modality(m) in ("text", "multimodal"),
        "uses_images": lambda m: _check_modality(m) in ("image", "multimodal"),
        "auto_precision": auto_precision,
        # trainer.inference_mode: evaluation under torch.inference_mode unless the encoder is compiled (model.compile)
        "inference_mode": lambda compile: not compile,
        "help_groups": help_groups,
        # callbacks.model_checkpoint: the metric the model's class declares for its best checkpoint, and its direction
        "checkpoint_monitor": checkpoint_monitor,
        "checkpoint_mode": checkpoint_mode,
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    if not OmegaConf.has_resolver("run_dir"):
        from seqaware.runs import new_run_dir

        # cached: every read of hydra.run.dir in a process gives the one folder reserved for the run
        OmegaConf.register_new_resolver("run_dir", new_run_dir, use_cache=True)


register_resolvers()


def let_max_steps_decide(cfg: DictConfig, overrides: Sequence[str]) -> bool:
    """``trainer.max_steps=N`` on the command line without ``trainer.max_epochs``: the run trains N steps.

    An experiment's ``trainer.max_epochs`` (``berson_finetune``: 1 epoch of at most 40 batches) would
    otherwise end it earlier; it is raised to N (every epoch has at least one step, so N epochs never
    end the run first, and a value that is read elsewhere, ``${trainer.max_epochs}``, stays a count), said
    in the log. With both on the command line both stay, and :class:`seqaware.callbacks.FitLimits` warns
    at the start of fit when max_epochs ends it first. Returns whether it changed the config (``train.py`` then
    rewrites the run folder's ``.hydra/config.yaml``, so re-running the saved config trains the same steps).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = {o.key_or_group for o in OverridesParser.create().parse_overrides(overrides)}
    if "trainer.max_steps" not in keys or "trainer.max_epochs" in keys:
        return False
    max_steps, max_epochs = cfg.trainer.get("max_steps"), cfg.trainer.get("max_epochs")
    if max_steps is None or max_steps < 1 or max_epochs is None or max_epochs == -1 or max_epochs >= max_steps:
        return False
    cfg.trainer.max_epochs = max_steps
    log.info("trainer.max_steps=%d is on the command line and trainer.max_epochs is not: the config's "
             "trainer.max_epochs=%d is raised to %d so that the run trains %d steps (give trainer.max_epochs too "
             "to keep both limits)", max_steps, max_epochs, max_steps, max_steps)
    return True


def compose_train(overrides: Sequence[str] = ()) -> DictConfig:
    """``configs/train.yaml`` composed with ``overrides`` as ``python train.py OVERRIDES`` composes it, with
    :func:`let_max_steps_decide`'s change, nothing run: the config its run folder's ``.hydra/config.yaml`` holds
    (unresolved).  Hydra's compose API; its global state is cleared before and after, under a lock (the study
    scripts check run folders from several threads)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with _COMPOSING:                          # Hydra's state is the process's: one composition at a time
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(PROJECT_ROOT / "configs"), version_base="1.3"):
                cfg = compose(config_name="train.yaml", overrides=list(overrides))
        finally:
            GlobalHydra.instance().clear()
    let_max_steps_decide(cfg, list(overrides))
    return cfg
