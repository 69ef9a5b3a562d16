"""seqaware.checkpoint_io: what a checkpoint may build, the exact refusal a user reads, and the atomic writer.

test_safe_loading.py shows the attacks are refused end to end; here each rule and message is pinned."""
from __future__ import annotations

import re

import pytest
import torch

from seqaware import checkpoint_io as cio
from seqaware.checkpoint_io import AtomicCheckpointIO, UnsafeCheckpointError, check_targets, load_checkpoint, target_refusal

RULE = ("A checkpoint may only build torch.nn.Module classes of seqaware, decoders, data_modules, optimisers and "
        "schedulers of torch.optim, and the factories listed in seqaware.checkpoint_io.ALLOWED_FUNCTIONS; nothing was "
        "built. If you trust this file, build the module from your config and load its state_dict instead of "
        "load_from_checkpoint.")


@pytest.mark.parametrize("target", [
    "seqaware.modules.sequencing.PairwiseSequencingModule", "decoders.berson.BersonDecoder",
    "torch.optim.AdamW", "torch.optim.SGD", "torch.optim.Optimizer", "torch.optim.lr_scheduler.StepLR",
    "torch.optim.lr_scheduler.LambdaLR", "seqaware.encoders.create_encoder",
    "transformers.optimization.get_constant_schedule", "transformers.optimization.get_wsd_schedule",
    "transformers.get_cosine_schedule_with_warmup",
])
def test_allowed_targets_have_no_refusal(target):
    assert target_refusal(target) is None


@pytest.mark.parametrize("target, reason", [
    (["torch", "load"], "a _target_ must be a dotted name, got list"),
    (3, "a _target_ must be a dotted name, got int"),
    ("os.system", "package 'os' is not one a checkpoint may build from"),
    ("seqawarex.Foo", "package 'seqawarex' is not one a checkpoint may build from"),
    ("", "package '' is not one a checkpoint may build from"),
    ("seqaware.no_such.Thing", "'seqaware.no_such.Thing' does not resolve (ImportError)"),
    ("torch.optimx", "'torch.optimx' does not resolve (ImportError)"),
    ("seqaware..io", "'seqaware..io' does not resolve (ValueError)"),
    ("seqaware.vlm.runner.OutputCache", "it names the class seqaware.vlm.runner.OutputCache, which is not a "
     "torch.nn.Module (a checkpoint builds the project's modules, models, encoders, heads, objectives and decoders only)"),
    ("seqaware.runs.RunPlan", "it names the class seqaware.runs.RunPlan, which is not a torch.nn.Module (a checkpoint "
     "builds the project's modules, models, encoders, heads, objectives and decoders only)"),
    ("torch.optim.swa_utils.AveragedModel", "it names the class torch.optim.swa_utils.AveragedModel, which is neither "
     "a torch optimiser nor a learning-rate scheduler"),
    ("torch.nn.Linear", "it names the class torch.nn.modules.linear.Linear, which is not defined in seqaware, "
     "decoders, data_modules, torch.optim"),
    ("seqaware.modules.base.nn.Linear", "it names the class torch.nn.modules.linear.Linear, which is not defined in "
     "seqaware, decoders, data_modules, torch.optim"),
    ("torch.load", "it names the function torch.serialization.load, which is not a class and not in ALLOWED_FUNCTIONS"),
    ("torch.zeros", "it names the function torch._VariableFunctionsClass.zeros, which is not a class and not in "
     "ALLOWED_FUNCTIONS"),   # a built-in routine is a function too
    ("seqaware.checkpoint_io.torch.load", "it names the function torch.serialization.load, which is not a class and "
     "not in ALLOWED_FUNCTIONS"),
    ("seqaware.io.write_jsonl", "it names the function seqaware.io.write_jsonl, which is not a class and not in "
     "ALLOWED_FUNCTIONS"),
    ("torch.optim.AdamW.step", "it names the function torch.optim.adam.Adam.step, which is not a class and not in "
     "ALLOWED_FUNCTIONS"),
    ("torch.float32", "it names the dtype torch.?, which is not a class and not in ALLOWED_FUNCTIONS"),
    ("seqaware.checkpoint_io.OWN_PACKAGES", "it names the tuple ?.?, which is not a class and not in ALLOWED_FUNCTIONS"),
    ("torch.nn", "it names the module ?.torch.nn, which is not a class and not in ALLOWED_FUNCTIONS"),
    ("seqaware.runs.log", "it names the Logger logging.?, which is not a class and not in ALLOWED_FUNCTIONS"),
])
def test_each_refusal_says_what_the_target_is_and_which_rule_it_breaks(target, reason):
    assert target_refusal(target) == reason


@pytest.mark.parametrize("module, inside", [
    ("torch.optim", True), ("torch.optim.lr_scheduler", True), ("torch.optim.adamw", True),
    ("torch.optimizer_x", False), ("torch.optim_", False), ("torch", False), ("torch.nn.optim", False),
    ("xtorch.optim", False), ("seqaware", True), ("seqaware.modules.base", True), ("seqawarex", False),
    ("data_modulesx.y", False), ("decoders_extra", False),
])
def test_an_allowed_package_is_matched_by_whole_dotted_components(module, inside):
    """``torch.optim`` admits itself and its submodules, never a module whose name merely starts with it."""
    assert cio._in_package(module, cio.OWN_PACKAGES + cio.LIBRARY_CLASS_PACKAGES) is inside


@pytest.mark.parametrize("module, reason", [
    ("torch.optim.custom_x", None),
    ("torch.optimizer_x", "it names the class torch.optimizer_x.Sneaky, which is not defined in seqaware, decoders, "
     "data_modules, torch.optim"),
])
def test_an_optimiser_class_of_a_module_named_like_torch_optim_is_refused(monkeypatch, module, reason):
    """The same torch optimiser subclass is admitted from a submodule of ``torch.optim`` and refused from
    ``torch.optimizer_x``, whose name only begins with ``torch.optim``: the rule compares whole dotted components."""
    import sys
    import types

    fake = types.ModuleType(module)
    fake.Sneaky = type("Sneaky", (torch.optim.SGD,), {"__module__": module})
    monkeypatch.setitem(sys.modules, module, fake)
    assert target_refusal(f"{module}.Sneaky") == reason


def test_a_refused_target_names_the_file_the_key_and_the_rule():
    hparams = {"net": {"encoder": {"_target_": "seqaware.encoders.create_encoder"},
                       "heads": [{"_target_": "torch.nn.Linear"}]}}
    with pytest.raises(UnsafeCheckpointError) as err:
        check_targets(hparams, "run/last.ckpt (hyper_parameters)")
    assert str(err.value) == ("run/last.ckpt (hyper_parameters): refusing to build torch.nn.Linear (hyper-parameter "
                              "'net.heads[0]._target_'): it names the class torch.nn.modules.linear.Linear, which is "
                              "not defined in seqaware, decoders, data_modules, torch.optim. " + RULE)


@pytest.mark.parametrize("hparams, where, name", [
    ({"_target_": "os.system"}, "<root>", "os.system"),
    ([{"_target_": "os.system"}], "[0]", "os.system"),
    ({"a": ({"x": 1}, {"_target_": "os.system"})}, "a[1]", "os.system"),
    ({"a": [[{"_target_": "torch.optim.AdamW"}, {"_target_": 7}]]}, "a[0][1]", "7"),
    ({"a": {"_target_": "torch.optim.AdamW", "inner": {"_target_": "os.system"}}}, "a.inner", "os.system"),
])
def test_the_key_path_of_a_refused_target(hparams, where, name):
    with pytest.raises(UnsafeCheckpointError) as err:
        check_targets(hparams)
    assert str(err.value).startswith(f"<hyper-parameters>: refusing to build {name} (hyper-parameter '{where}._target_'): ")


def test_hyper_parameters_without_targets_pass():
    for hparams in (None, {}, [], "torch.load", {"a": [1, {"b": "os.system"}]}, {"target": "os.system"}):
        check_targets(hparams)


def test_the_first_refused_target_is_the_one_named():
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to build os\.system \(hyper-parameter 'a\._target_'\)"):
        check_targets({"a": {"_target_": "os.system"}, "b": {"_target_": "builtins.open"}})


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_checkpoint(tmp_path / "nope.ckpt")
    assert str(err.value) == f"checkpoint not found: {tmp_path / 'nope.ckpt'}"
    (tmp_path / "folder.ckpt").mkdir()
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        load_checkpoint(str(tmp_path / "folder.ckpt"))


class _Code:
    def __reduce__(self):
        return (print, ("ran",))


def test_a_checkpoint_holding_code_is_refused_with_how_to_resave_it(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"x": _Code()}, path)
    with pytest.raises(UnsafeCheckpointError) as err:
        load_checkpoint(path)
    assert str(err.value).startswith(
        f"{path}: refusing to load: it holds Python objects other than tensors and plain containers, which "
        f"torch.load(weights_only=True) does not execute (a crafted file can run code when unpickled). "
        f"Re-save it as a plain state dict (torch.save(model.state_dict(), ...)). Details: ")
    assert isinstance(err.value.__cause__, Exception)


def test_both_hyper_parameter_sets_are_checked_unless_told_not_to(tmp_path):
    path = tmp_path / "dm.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"optimizer": {"_target_": "torch.optim.AdamW"}},
                "datamodule_hyper_parameters": {"source": {"_target_": "seqaware.io.write_jsonl"}}}, path)
    with pytest.raises(UnsafeCheckpointError) as err:
        load_checkpoint(path)
    assert str(err.value).startswith(f"{path} (datamodule_hyper_parameters): refusing to build seqaware.io.write_jsonl "
                                     f"(hyper-parameter 'source._target_')")
    torch.save({"hyper_parameters": {"net": {"_target_": "os.system"}}}, path)
    with pytest.raises(UnsafeCheckpointError, match=re.escape(f"{path} (hyper_parameters): refusing to build os.system")):
        load_checkpoint(str(path))
    assert load_checkpoint(path, check_hparams=False)["hyper_parameters"]["net"]["_target_"] == "os.system"


def test_a_plain_tensor_file_loads_on_the_cpu_or_where_asked(tmp_path):
    path = tmp_path / "w.pt"
    torch.save(torch.arange(3.0), path)
    assert torch.equal(load_checkpoint(path), torch.arange(3.0))
    torch.save({"w": torch.ones(2)}, path)
    assert load_checkpoint(path, map_location="meta")["w"].device.type == "meta"
    assert load_checkpoint(path)["w"].device.type == "cpu"


def test_the_writer_replaces_a_checkpoint_in_one_step(tmp_path):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.zeros(1)}, "global_step": 1}, path)
    io.save_checkpoint({"state_dict": {"w": torch.ones(1)}, "global_step": 2}, str(path))
    loaded = io.load_checkpoint(path)
    assert loaded["global_step"] == 2 and torch.equal(loaded["state_dict"]["w"], torch.ones(1))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert io.load_checkpoint(path, weights_only=True)["global_step"] == 2
    assert io.load_checkpoint(path, map_location="meta")["state_dict"]["w"].device.type == "meta"


def test_the_writer_refuses_what_it_cannot_honour(tmp_path):
    io = AtomicCheckpointIO()
    with pytest.raises(TypeError) as err:
        io.save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"bucket": "b"})
    assert str(err.value) == "AtomicCheckpointIO does not support storage_options, got {'bucket': 'b'}"
    assert not (tmp_path / "x.ckpt").exists()
    io.save_checkpoint({"global_step": 1}, tmp_path / "x.ckpt")
    with pytest.raises(UnsafeCheckpointError) as err:
        io.load_checkpoint(tmp_path / "x.ckpt", weights_only=False)
    assert str(err.value) == f"{tmp_path / 'x.ckpt'}: seqaware loads checkpoints with weights_only=True only"


def test_the_writer_reads_through_the_target_check(tmp_path):
    path = tmp_path / "x.ckpt"
    AtomicCheckpointIO().save_checkpoint({"hyper_parameters": {"net": {"_target_": "builtins.open"}}}, path)
    with pytest.raises(UnsafeCheckpointError, match=r"\(hyper_parameters\): refusing to build builtins\.open"):
        AtomicCheckpointIO().load_checkpoint(path)


def test_a_checkpoint_written_on_a_gpu_resumes_on_the_cpu(tmp_path, monkeypatch):
    """Resuming reads every tensor onto the CPU first (Lightning moves the module afterwards), so a checkpoint
    written on a GPU machine resumes on a CPU-only one."""
    import torch.serialization

    path = tmp_path / "gpu.ckpt"
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")   # as a GPU run writes it
    torch.save({"state_dict": {"w": torch.ones(2)}, "global_step": 3}, path)
    monkeypatch.undo()
    loaded = AtomicCheckpointIO().load_checkpoint(path)
    assert loaded["state_dict"]["w"].device.type == "cpu" and torch.equal(loaded["state_dict"]["w"], torch.ones(2))


class _WritesOnLoad:
    """Unpickling this creates ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_crafted_checkpoint_is_refused_even_where_torchs_safe_default_is_turned_off(tmp_path, monkeypatch):
    """``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (set to read old pickles elsewhere) changes torch.load's default only:
    the project asks for weights_only=True itself, so nothing in the file runs."""
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": _WritesOnLoad(marker)}, path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UnsafeCheckpointError, match="refusing to load"):
        load_checkpoint(path)
    with pytest.raises(UnsafeCheckpointError, match="refusing to load"):
        AtomicCheckpointIO().load_checkpoint(path)
    assert not marker.exists()
