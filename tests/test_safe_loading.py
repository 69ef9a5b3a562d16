"""Loading a user's file never runs code: weights_only=True everywhere, allow-listed _target_ only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from seqaware.checkpoint_io import (ALLOWED_TARGETS, AtomicCheckpointIO, UnsafeCheckpointError, check_targets,
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
        "decoder": "greedy"}}, path)
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


@pytest.mark.parametrize("target", ["torch.load", "torch.hub.load", "torch.optimizer_hack", "subprocess.Popen",
                                    "transformers.AutoModel.from_pretrained", "pytorch_lightning.Trainer_x"])
def test_targets_outside_the_allow_list_are_refused(target):
    with pytest.raises(UnsafeCheckpointError):
        check_targets({"model": {"layers": [{"_target_": target}]}})


def test_get_class_path_is_checked():
    check_targets({"_target_": "hydra.utils.get_class", "path": "transformers.models.qwen3.modeling_qwen3.Qwen3DecoderLayer"})
    with pytest.raises(UnsafeCheckpointError, match="get_class"):
        check_targets({"_target_": "hydra.utils.get_class", "path": "subprocess.Popen"})


def test_every_target_the_configs_use_is_allowed():
    seen = set()
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        for node in yaml.safe_load_all(path.read_text()):
            check_targets(node, path)  # raises naming the file
        seen.update(re.findall(r"_target_:\s*([\w.]+)", path.read_text()))
    assert {"torch.optim.AdamW", "seqaware.encoders.create_encoder", "transformers.get_linear_schedule_with_warmup"} <= seen
    assert "seqaware" in ALLOWED_TARGETS


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
