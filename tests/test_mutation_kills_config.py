"""The OmegaConf resolvers and ``train.py --help``'s groups (seqaware/config.py) where mutation testing found
behaviour no test pinned (docs/mutation.md).  ``register_resolvers`` runs when the module is imported, so the
tests here clear the resolvers and register them again, as a process that has none yet does."""
from __future__ import annotations

import pathlib
import sys
import types
from pathlib import Path
from typing import Any, Optional

import pytest
from omegaconf import OmegaConf

from seqaware.config import (PROJECT_ROOT, argument_hints, auto_precision, check_argument_types, check_values,
                             cpu_has_fast_bf16, help_groups, register_resolvers)

NAMES = ("project_root", "uses_text", "uses_images", "auto_precision", "inference_mode", "help_groups",
         "checkpoint_monitor", "checkpoint_mode", "run_dir")


@pytest.fixture
def fresh_resolvers():
    """The resolvers as ``register_resolvers()`` registers them in a process without any (and again after)."""
    for name in NAMES:
        OmegaConf.clear_resolver(name)
    try:
        register_resolvers()
        yield
    finally:
        for name in NAMES:
            OmegaConf.clear_resolver(name)
        register_resolvers()


def resolve(**values):
    return OmegaConf.to_container(OmegaConf.create(values), resolve=True)


def test_every_resolver_is_registered_once_and_a_second_call_changes_nothing(fresh_resolvers):
    assert all(OmegaConf.has_resolver(name) for name in NAMES)
    register_resolvers()   # idempotent: registered names are left alone (OmegaConf refuses a second registration)
    assert resolve(root="${project_root:}") == {"root": str(PROJECT_ROOT)}


def test_the_modality_resolvers(fresh_resolvers):
    got = resolve(**{f"{what}_{m}": f"${{uses_{what}:{m}}}" for what in ("text", "images")
                     for m in ("text", "image", "multimodal")})
    assert got == {"text_text": True, "text_image": False, "text_multimodal": True,
                   "images_text": False, "images_image": True, "images_multimodal": True}
    with pytest.raises(Exception, match=r"modality must be one of \('text', 'image', 'multimodal'\), got 'audio'"):
        resolve(x="${uses_text:audio}")


def test_the_trainer_and_checkpoint_resolvers(fresh_resolvers):
    target = "seqaware.modules.berson.BersonModule"
    assert resolve(gpu="${auto_precision:gpu}", cpu="${auto_precision:cpu}", eager="${inference_mode:false}",
                   compiled="${inference_mode:true}", monitor=f"${{checkpoint_monitor:{target}}}",
                   mode=f"${{checkpoint_mode:{target}}}", pretrain_mode="${checkpoint_mode:"
                   "seqaware.modules.pretraining.PretrainingModule}") == {
        "gpu": "bf16-mixed", "cpu": auto_precision("cpu"), "eager": True, "compiled": False, "monitor": "val/pmr",
        "mode": "max", "pretrain_mode": "min"}
    assert resolve(h="${help_groups:}") == {"h": help_groups()}


def test_the_run_folder_resolver_is_read_once_per_config(fresh_resolvers, tmp_path):
    cfg = OmegaConf.create({"named": f"${{run_dir:{tmp_path},first}}", "new": f"${{run_dir:{tmp_path}}}"})
    assert cfg.named == str(tmp_path / "first")
    folder = cfg.new
    assert cfg.new == folder and Path(folder).parent == tmp_path and Path(folder).is_dir()
    assert [p.name for p in tmp_path.iterdir()] == [Path(folder).name]   # one folder reserved, not one per read


def test_help_lists_the_groups_a_user_picks_hydras_last(tmp_path):
    for path in ("train.yaml", "hydra/default.yaml", "hydra/launcher/local.yaml", "hydra/sweeper/seqaware_optuna.yaml",
                 "experiment/b.yaml", "experiment/a.yaml", "experiment_base/x.yaml", "data/base.yaml", "data/roc.yaml",
                 "model/common/x.yaml", "model/berson.yaml", "zeta/one.yaml"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}\n")
    assert help_groups(tmp_path).splitlines() == [
        "data: roc", "experiment: a, b", "model: berson", "zeta: one",
        "hydra/launcher: basic, local", "hydra/sweeper: basic, seqaware_optuna"]


def test_a_cpuinfo_with_bytes_that_are_not_utf8_is_still_read_for_its_flags(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_bytes(b"model name\t: Caf\xe9 CPU\nflags\t\t: fpu avx2 avx512_bf16\n")   # \xe9: Latin-1, not UTF-8
    real_read = pathlib.Path.read_text
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *args, **kwargs: real_read(
        cpuinfo if str(self) == "/proc/cpuinfo" else self, *args, **kwargs))
    torch = types.SimpleNamespace(ops=types.SimpleNamespace(mkldnn=types.SimpleNamespace(
        _is_mkldnn_bf16_supported=lambda: True)))                  # oneDNN with bf16 kernels (and no torch import)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.delenv("SEQAWARE_CPU_BF16", raising=False)
    assert cpu_has_fast_bf16() is True


# ---------------------------------------------------------------------------------------------- argument types
def _target(steps: int, name: str = "x", rate: float = 0.5, limit: int | None = None, flag: Optional[bool] = None,
            items: list[int] | None = None, anything=None, what: Any = None):
    """A function whose annotations are every kind ``check_values`` reads."""


class _Target:
    def __init__(self, steps: int, name: str = "x"):
        pass


def test_the_hints_of_a_function_are_its_own_and_of_a_class_its_inits():
    assert argument_hints(_target) == {"steps": int, "name": str, "rate": float, "limit": int | None,
                                       "flag": Optional[bool], "items": list[int] | None, "what": Any}
    assert argument_hints(_Target) == {"steps": int, "name": str}


@pytest.mark.parametrize("values, message", [
    ({"rate": 0.5, "steps": "abc"}, "g.steps='abc': f(steps=...) takes an integer, not text"),   # after a number
    ({"name": "ok", "steps": None}, "g.steps=null: f(steps=...) takes an integer, not null"),     # after good text
    ({"limit": "abc"}, "g.limit='abc': f(limit=...) takes an integer or null, not text"),       # int | None
    ({"flag": "yes"}, "g.flag='yes': f(flag=...) takes true/false or null, not text"),          # Optional[bool]
    ({"name": None}, "g.name=null: f(name=...) takes text, not null"),
])
def test_text_or_null_where_the_annotation_rules_it_out_names_the_key(values, message):
    with pytest.raises(ValueError) as err:
        check_values(values, argument_hints(_target), "g", "f")
    assert str(err.value) == message


def test_values_the_annotation_admits_or_does_not_restrict_to_scalars_pass():
    check_values({"steps": 3, "name": "x", "rate": 1, "limit": None, "flag": None, "items": "abc", "anything": "abc",
                  "what": None, "unknown": "abc"}, argument_hints(_target), "g", "f")


def test_a_target_function_in_a_list_or_a_nested_node_is_checked_under_its_key():
    target = {"_target_": "seqaware.config.auto_precision", "accelerator": None}
    with pytest.raises(ValueError) as err:
        check_argument_types({"callbacks": [{"other": 1}, target]}, "trainer")
    assert str(err.value) == ("trainer.callbacks[1].accelerator=null: auto_precision(accelerator=...) takes text, "
                              "not null")
    with pytest.raises(ValueError) as err:
        check_argument_types({"outer": {"inner": target}}, "model")
    assert str(err.value).startswith("model.outer.inner.accelerator=null: auto_precision(accelerator=...) ")


@pytest.mark.parametrize("target", ["no_such_module.Thing", "NoSuchThing"])
def test_a_target_that_does_not_resolve_is_left_for_instantiate_to_report(target):
    assert check_argument_types({"_target_": target, "steps": "abc"}, "model") is None
