"""Loading a user's file never runs code: weights_only=True everywhere, allow-listed _target_ only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from seqaware.checkpoint_io import (ALLOWED_FUNCTIONS, AtomicCheckpointIO, UnsafeCheckpointError, check_targets,
                                    load_checkpoint)

ROOT = Path(__file__).resolve().parents[1]


class _RunsOnLoad:
    """Unpickling this creates ``marker``: the file a crafted checkpoint would write."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_malicious_encoder_pt_is_refused_without_running_code(tmp_path):
    from seqaware.encoders.checkpoint import read_state

    marker = tmp_path / "pwned"
    path = tmp_path / "encoder.pt"
    torch.save({"embed.weight": torch.zeros(2), "payload": _RunsOnLoad(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match=r"encoder\.pt.*refusing to load"):
        read_state(path)
    assert not marker.exists(), "unpickling the encoder file ran a callable"


def test_plain_encoder_state_dict_still_loads(tmp_path):
    from seqaware.encoders.checkpoint import read_state

    path = tmp_path / "encoder.pt"
    torch.save({"embed.weight": torch.ones(2)}, path)
    assert torch.equal(read_state(path)["embed.weight"], torch.ones(2))


def _checkpoint_with_net(tmp_path: Path, net: dict) -> Path:
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.6", "hyper_parameters": {
        "net": net, "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3}, "scheduler": None,
        "decoder": "pairwise_greedy"}}, path)
    return path


def test_load_from_checkpoint_refuses_builtins_open_target(tmp_path):
    from seqaware.modules.sequencing import PairwiseSequencingModule

    marker = tmp_path / "pwned"
    path = _checkpoint_with_net(tmp_path, {"_target_": "builtins.open", "file": str(marker), "mode": "w"})
    with pytest.raises(UnsafeCheckpointError, match=r"evil\.ckpt.*builtins\.open.*'net\._target_'"):
        PairwiseSequencingModule.load_from_checkpoint(path)
    assert not marker.exists(), "load_from_checkpoint built builtins.open from the checkpoint"


def test_resume_path_refuses_unsafe_targets_too(tmp_path):
    path = _checkpoint_with_net(tmp_path, {"_target_": "os.system", "command": "true"})
    with pytest.raises(UnsafeCheckpointError, match="os.system"):
        AtomicCheckpointIO().load_checkpoint(path)


def test_attribute_path_to_torch_load_is_refused_before_the_crafted_file_is_unpickled(tmp_path):
    """``seqaware.checkpoint_io.torch.load`` starts with an allowed package name but *is* torch.load: the
    target is judged by the object it resolves to, and the file it would unpickle is never opened."""
    from seqaware.modules.sequencing import PairwiseSequencingModule

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"payload": _RunsOnLoad(marker)}, evil)  # weights_only=False would create `marker`
    path = _checkpoint_with_net(tmp_path, {"_target_": "seqaware.checkpoint_io.torch.load", "f": str(evil),
                                           "weights_only": False})
    with pytest.raises(UnsafeCheckpointError,
                       match=r"(?s)evil\.ckpt.*seqaware\.checkpoint_io\.torch\.load.*'net\._target_'.*function torch"):
        PairwiseSequencingModule.load_from_checkpoint(path)
    assert not marker.exists(), "load_from_checkpoint unpickled the crafted file"


def test_a_plain_function_of_the_project_is_refused(tmp_path):
    """``seqaware.io.write_jsonl`` is defined in seqaware but is a function, not a class: refused, nothing written."""
    from seqaware.modules.sequencing import PairwiseSequencingModule

    out = tmp_path / "written.jsonl"
    path = _checkpoint_with_net(tmp_path, {"_target_": "seqaware.io.write_jsonl", "path": str(out),
                                           "records": [{"a": 1}]})
    with pytest.raises(UnsafeCheckpointError, match=r"seqaware\.io\.write_jsonl.*'net\._target_'.*not a class"):
        PairwiseSequencingModule.load_from_checkpoint(path)
    assert not out.exists(), "load_from_checkpoint called seqaware.io.write_jsonl"


@pytest.mark.parametrize("route", ["load_from_checkpoint", "resume"])
def test_project_classes_that_act_on_files_are_refused_before_construction(tmp_path, route):
    """Classes of the project that are no torch.nn.Module are not what hyper-parameters hold: OutputCache
    truncates its file after the last newline when built (a one-line token file without a trailing newline is
    emptied), ImageStore creates its folder.  Both routes that read a checkpoint refuse them first, naming the key."""
    from seqaware.modules.sequencing import PairwiseSequencingModule

    tokens = tmp_path / "tokens.txt"
    tokens.write_text("a precious line without a newline")
    folder = tmp_path / "made_by_a_checkpoint"
    for target, kwargs in (("seqaware.vlm.runner.OutputCache", {"path": str(tokens)}),
                           ("data_modules.adapters.common.ImageStore", {"out_images": str(folder)})):
        path = _checkpoint_with_net(tmp_path, {"_target_": target, **kwargs})
        with pytest.raises(UnsafeCheckpointError, match=rf"{re.escape(target)} \(hyper-parameter 'net\._target_'\).*"
                                                        r"not a torch\.nn\.Module"):
            if route == "resume":
                AtomicCheckpointIO().load_checkpoint(path)
            else:
                PairwiseSequencingModule.load_from_checkpoint(path)
    assert tokens.read_text() == "a precious line without a newline" and not folder.exists()


@pytest.mark.parametrize("target", [
    "torch.load", "torch.hub.load", "torch.optimizer_hack", "subprocess.Popen", "builtins.open", "os.system",
    "transformers.AutoModel.from_pretrained", "pytorch_lightning.Trainer_x", "pytorch_lightning.Trainer",
    "seqaware.checkpoint_io.torch.load",        # a third-party function reached through a project module
    "seqaware.checkpoint_io.os.system",
    "seqaware.modules.base.instantiate",         # hydra's instantiate, re-exported
    "seqaware.io.write_jsonl", "seqaware.io.atomic_open", "data_modules.sources.synthetic_source",  # project functions
    "seqaware.runs.write_state",
    "seqaware.modules.base.nn.Linear",           # a torch class outside torch.optim
    "torch.nn.Linear", "torch.optim.AdamW.step",  # a method of an allowed class
    "seqaware.vlm.runner.OutputCache", "data_modules.adapters.common.ImageStore",  # project classes, no modules
    "seqaware.metrics.ordering.np.random.Generator",
    "torch.optim.swa_utils.AveragedModel",       # a torch.optim class that is no optimiser or scheduler
    "hydra.utils.get_class", "seqaware.no_such_module.Thing", "seqaware..io", "",
])
def test_targets_outside_the_rule_are_refused(target):
    with pytest.raises(UnsafeCheckpointError, match=r"'model\.layers\[0\]\._target_'"):
        check_targets({"model": {"layers": [{"_target_": target}]}})


def test_a_non_string_target_is_refused():
    with pytest.raises(UnsafeCheckpointError, match="dotted name"):
        check_targets({"net": {"_target_": ["torch", "load"]}})


@pytest.mark.parametrize("target", [
    "seqaware.modules.sequencing.PairwiseSequencingModule", "seqaware.models.order_baseline.PairwiseOrderModel",
    "decoders.berson.BersonDecoder", "seqaware.encoders.text.TextEncoder",
    "torch.optim.AdamW", "torch.optim.lr_scheduler.StepLR", "seqaware.encoders.create_encoder",
    "transformers.get_linear_schedule_with_warmup",  # the alias resolves to transformers.optimization's function
    "seqaware.checkpoint_io.torch.optim.AdamW",       # a path through a module, to an allowed class
])
def test_project_classes_optimisers_and_listed_factories_are_allowed(target):
    check_targets({"net": {"_target_": target}})


def test_every_experiment_model_config_passes_the_rule():
    """What a checkpoint's hyper-parameters hold is the model config (modules save their init args):
    every experiment's, and those the hparams presets give, pass the rule."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from seqaware.config import to_plain

    seen = set()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            # every experiment; every hparams preset (they swap optimisers / schedules) on a pretraining
            # and a fine-tuning experiment
            runs = [[f"experiment={p.stem}"] for p in sorted((ROOT / "configs" / "experiment").glob("*.yaml"))]
            runs += [[f"experiment={e}", f"hparams={p.stem}"] for e in ("clipvil_pretrain", "berson_finetune")
                     for p in sorted((ROOT / "configs" / "hparams").glob("*.yaml"))]
            for overrides in runs:
                model = to_plain(compose("train.yaml", overrides=[*overrides, "paths.output_dir=/run"]).model)
                model.pop("_target_")  # the module class itself: what load_from_checkpoint is called on
                check_targets(model, " ".join(overrides))
                seen.update(re.findall(r"'_target_': '([\w.]+)'", str(model)))
    finally:
        GlobalHydra.instance().clear()
    assert {"torch.optim.AdamW", "seqaware.encoders.create_encoder", "transformers.get_linear_schedule_with_warmup"} <= seen
    assert "transformers.optimization.get_linear_schedule_with_warmup" in ALLOWED_FUNCTIONS


def test_every_torch_load_in_the_project_is_weights_only():
    offenders = []
    for path in [*ROOT.glob("*.py"), *(p for d in ("seqaware", "decoders", "data_modules", "scripts")
                                       for p in (ROOT / d).rglob("*.py"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "torch.load(" in line and "weights_only=True" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_a_written_checkpoint_loads_with_weights_only(tmp_path):
    path = tmp_path / "ok.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(1)}, "hyper_parameters": {
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.1}}}, path)
    assert load_checkpoint(path)["hyper_parameters"]["optimizer"]["lr"] == 0.1
    assert not list(tmp_path.glob("*.tmp"))
