"""The objectives' order of corruptions (seqaware/objectives/corruption.py, PretrainingModule._forward_group) where
mutation testing found behaviour no test pinned (docs/mutation.md): where an objective that corrupts nothing runs,
the refusal naming the undeclared class's module, a fusion given to the group used as it is, and the seed of SMRM's
candidate shuffle."""
from __future__ import annotations

import pytest
import torch

from seqaware.objectives.corruption import corruption_kinds, corruption_order, cpu_generator, stable_seed
from test_pretraining import tiny_module, toy_batch, toy_world


class _Declared:
    """What the order reads of an objective: its class's ``corrupts`` and its name."""

    corrupts = None

    def __init__(self, name: str):
        self.name = name


def _objective(name: str, corrupts):
    return type(f"Obj_{name}", (_Declared,), {"corrupts": corrupts})(name)


def test_an_objective_that_corrupts_nothing_runs_before_every_move_and_mask():
    objectives = {"sop": _objective("sop", {"step_order"}), "probe": _objective("probe", set()),
                  "mlm": _objective("mlm", {"tokens"}), "isp": _objective("isp", {"images"})}
    # the probe reads the input as the batch gave it, before any step moved
    assert corruption_order(objectives, ["mlm", "sop", "probe", "isp"]) == ["probe", "sop", "isp", "mlm"]
    assert corruption_order(objectives, ["sop", "probe"]) == ["probe", "sop"]


def test_an_objective_that_does_not_say_what_it_corrupts_is_refused_naming_its_class():
    silent = _objective("silent", None)
    with pytest.raises(ValueError) as err:
        corruption_kinds(silent)
    assert str(err.value) == (
        f"objective 'silent' ({__name__}.Obj_silent) does not declare what it corrupts: set its class attribute "
        "`corrupts` to a set of ['step_order', 'images', 'patches', 'tokens', 'regions'] (an empty set if it "
        "corrupts nothing)")


@pytest.fixture(scope="module")
def module():
    torch.manual_seed(0)
    return tiny_module(objectives=["mlm", "smrm"]).eval()


def test_a_fusion_given_to_the_group_is_corrupted_as_it_is(module, monkeypatch):
    batch = toy_batch(2, 0, toy_world())
    fusion = module.fusion(batch)
    fusion["visual_feats"] = fusion["visual_feats"] + 5.0        # not what the batch would give again
    monkeypatch.setattr(module, "fusion", lambda batch: pytest.fail("the fusion was computed again"))
    corrupted, targets, _, _ = module._forward_group(batch, ("mlm",), 3, fusion)
    assert corrupted["visual_feats"] is fusion["visual_feats"]   # MLM masks tokens only
    restored = torch.where(targets["mlm_labels"] >= 0, targets["mlm_labels"], corrupted["input_ids"])
    assert torch.equal(restored, fusion["input_ids"])


def test_smrms_candidate_shuffle_has_a_generator_of_its_own_for_each_step(module):
    """The shuffle that breaks score ties in SMRM's accuracy: seeded by (schedule_seed, step, objective, "shuffle",
    rank), so a step's accuracy is reproducible and its draws are not those of the step's corruption generator."""
    batch = toy_batch(2, 0, toy_world())

    def shuffle(step):
        *_, kwargs = module._forward_group(batch, ("mlm", "smrm"), step)
        assert set(kwargs) == {"mlm", "smrm"} and "generator" not in kwargs["mlm"]
        return kwargs["smrm"]["generator"]

    seed = module.hparams.schedule_seed
    for step in (3, 4):
        expected = cpu_generator(stable_seed(seed, step, "smrm", "shuffle", module.global_rank))
        assert torch.equal(shuffle(step).get_state(), expected.get_state())
    assert not torch.equal(shuffle(3).get_state(), shuffle(4).get_state())
    corruption = cpu_generator(stable_seed(seed, 3, "smrm", module.global_rank))   # what _corrupt draws from
    assert not torch.equal(shuffle(3).get_state(), corruption.get_state())
