"""Step-order prediction (seqaware/objectives/sop.py) and the one order of corruptions that keeps every
objective's targets aligned (seqaware/objectives/base.py CORRUPTIONS, seqaware/objectives/corruption.py)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

import train
from conftest import tiny_pretrain
from seqaware.encoders.base import pack_steps
from seqaware.objectives import OBJECTIVES, Objective, register_objective
from seqaware.objectives.base import CORRUPTIONS, shallow_copy
from seqaware.objectives.corruption import corruption_order, cpu_generator
from seqaware.objectives.mlm import IGNORE_INDEX
from seqaware.objectives.sop import StepOrderPrediction
from test_pretraining import config_error, evaluate_tiny, read_metrics, tiny_module, toy_batch, toy_world, train_tiny

CLS, SEP, PAD, OPEN = 101, 102, 0, 103


def per_step_ids(lengths: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, S, L) per-step tokenisations ``[CLS] w... [SEP]`` with ``lengths[b][s]`` words (0: no step)."""
    B, S = len(lengths), max(len(row) for row in lengths)
    L = 2 + max(n for row in lengths for n in row)
    ids = torch.full((B, S, L), PAD)
    mask = torch.zeros(B, S, L, dtype=torch.long)
    steps = torch.zeros(B, S, dtype=torch.bool)
    for b, row in enumerate(lengths):
        for s, n in enumerate(row):
            if n:
                words = [1000 + 100 * s + i for i in range(n)]
                ids[b, s, :n + 2] = torch.tensor([CLS, *words, SEP])
                mask[b, s, :n + 2] = 1
                steps[b, s] = True
    return ids, mask, steps


def fusion_of(ids, mask, steps, pair_sep_id=None) -> dict:
    fusion = pack_steps(ids, mask, steps, CLS, PAD, pair_sep_id=pair_sep_id)
    S = ids.shape[1]
    fusion["visual_feats"] = torch.arange(S, dtype=torch.float).view(1, S, 1, 1).expand(ids.shape[0], S, 2, 3).clone()
    fusion["visual_mask"] = steps.clone()
    return fusion


@pytest.mark.parametrize("pair_sep_id", [None, OPEN])
def test_a_swap_is_the_packing_of_the_steps_in_the_swapped_order(pair_sep_id):
    """Whole steps trade places: tokens, step indices and images; separators stay as the packing puts them
    (``[CLS] a [SEP] b [SEP]`` and MPNet's ``<s> a </s></s> b </s>``)."""
    lengths = [[2, 3, 1], [1, 4, 0], [3, 2, 2]]
    ids, mask, steps = per_step_ids(lengths)
    fusion = fusion_of(ids, mask, steps, pair_sep_id)
    objective = StepOrderPrediction(8, delta=1.0)
    seen = set()
    for seed in range(12):
        got, targets = objective.corrupt(fusion, cpu_generator(seed))
        assert targets["sop_labels"].tolist() == [1, 1, 1]
        for b in range(len(lengths)):
            first, second = targets["sop_steps"][b].tolist()
            assert second == first + 1  # neighbours (every step here has text)
            seen.add((b, first))
            perm = list(range(ids.shape[1]))
            perm[first], perm[second] = second, first
            expected = fusion_of(ids[b:b + 1, perm], mask[b:b + 1, perm], steps[b:b + 1, perm], pair_sep_id)
            T = expected["input_ids"].shape[1]
            for key in ("input_ids", "attention_mask", "text_step"):
                assert got[key][b, :T].tolist() == expected[key][0].tolist(), (seed, b, key)
                assert not got["attention_mask"][b, T:].any()
            assert got["visual_feats"][b, :, 0, 0].tolist() == [float(p) for p in perm]
            assert got["visual_mask"][b].tolist() == steps[b, perm].tolist()
    # every neighbouring pair of every sample was drawn (sample 1 has 2 steps: one pair)
    assert seen == {(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)}


def test_no_swap_leaves_the_input_alone_and_one_step_is_never_swapped():
    ids, mask, steps = per_step_ids([[2, 3, 1], [4, 0, 0]])
    fusion = fusion_of(ids, mask, steps)
    got, targets = StepOrderPrediction(8, delta=0.0).corrupt(fusion, cpu_generator(0))
    assert targets["sop_labels"].tolist() == [0, 0] and targets["sop_steps"].tolist() == [[-1, -1], [-1, -1]]
    for key, value in fusion.items():
        assert torch.equal(got[key], value), key
    for seed in range(20):
        _, targets = StepOrderPrediction(8, delta=1.0).corrupt(fusion, cpu_generator(seed))
        assert targets["sop_labels"].tolist() == [1, 0]


def test_swaps_and_pairs_are_drawn_uniformly():
    ids, mask, steps = per_step_ids([[2, 1, 3, 2]])
    fusion = fusion_of(ids, mask, steps)
    objective = StepOrderPrediction(8, delta=0.5)
    draws = [objective.corrupt(fusion, cpu_generator(seed))[1] for seed in range(600)]
    swapped = [int(t["sop_steps"][0, 0]) for t in draws if t["sop_labels"][0] == 1]
    assert 255 <= len(swapped) <= 345, len(swapped)
    counts = Counter(swapped)
    assert set(counts) == {0, 1, 2} and all(len(swapped) / 3 * 0.75 < c < len(swapped) / 3 * 1.25 for c in counts.values()), counts


def test_steps_without_text_are_skipped_and_their_neighbours_swapped():
    """A step with no text between two that have some: the pair is the two steps with text."""
    ids, mask, steps = per_step_ids([[2, 1, 3]])
    mask[0, 1] = 0  # step 1 is real (it has an image) but no text
    fusion = fusion_of(ids, mask, steps)
    for seed in range(10):
        got, targets = StepOrderPrediction(8, delta=1.0).corrupt(fusion, cpu_generator(seed))
        assert targets["sop_steps"].tolist() == [[0, 2]]
        assert got["input_ids"][0, :8].tolist() == [CLS, 1200, 1201, 1202, SEP, 1000, 1001, SEP]
        assert got["text_step"][0, :8].tolist() == [-1, 0, 0, 0, -1, 2, 2, -1]
        assert got["visual_feats"][0, :, 0, 0].tolist() == [2.0, 1.0, 0.0]


# ------------------------------------------------------------------------------------------ order of corruptions

def test_moves_come_before_masks_whatever_the_set_order():
    module = tiny_module(objectives=["mlm", "smrm", "isp", "sop"])
    assert corruption_order(module.objectives, ("mlm", "smrm", "isp", "sop")) == ["sop", "isp", "mlm", "smrm"]
    assert list(CORRUPTIONS) == ["step_order", "images", "patches", "tokens", "regions"]
    assert {name: sorted(type(o).corrupts) for name, o in module.objectives.items()} == {
        "mlm": ["tokens"], "smrm": ["regions"], "isp": ["images"], "sop": ["step_order"]}


@pytest.mark.parametrize("generator_scope", ["rank", "sample"])
def test_mlm_labels_are_the_tokens_under_them_after_the_steps_moved(generator_scope):
    """MLM with SOP: put the labels back into the masked positions and the input is exactly SOP's
    output alone -- the labels are the tokens at their new places. SMRM's clean pass sees the
    swapped steps (text and images) without any mask."""
    torch.manual_seed(0)
    module = tiny_module(objectives=["mlm", "sop", "smrm"], generator_scope=generator_scope).eval()
    module.objectives["sop"].delta = 1.0
    batch = toy_batch(6, 3, toy_world())
    batch["step_mask"][2, -1] = False
    fusion = module.fusion(batch)
    seen = {}
    module._clean_pass = lambda reference: seen.setdefault("ref", reference) and module.encoder(reference)
    corrupted, targets, _, _ = module._forward_group(batch, ("mlm", "sop", "smrm"), 4, fusion)
    moved, sop_targets = module._corrupt("sop", fusion, batch, 4)
    assert sop_targets["sop_labels"].tolist() == [1] * 6
    assert not torch.equal(moved["input_ids"], fusion["input_ids"])
    labels = targets["mlm_labels"]
    assert (labels != IGNORE_INDEX).any()
    restored = torch.where(labels != IGNORE_INDEX, labels, corrupted["input_ids"])
    assert torch.equal(restored, moved["input_ids"])
    assert torch.equal(corrupted["text_step"], moved["text_step"])
    reference = seen["ref"]
    assert torch.equal(reference["input_ids"], moved["input_ids"])
    assert torch.equal(reference["visual_feats"], moved["visual_feats"])
    assert not torch.equal(corrupted["visual_feats"], moved["visual_feats"])  # SMRM masked after the move


def test_an_objective_must_say_what_it_corrupts_and_stay_inside_it():
    @register_objective
    class Silent(Objective):
        name = "silent"
        modalities = frozenset({"text"})
        target_layout = {"silent_labels": ("sample", None)}

        def __init__(self, hidden_size: int):
            super().__init__()
            self.head = torch.nn.Linear(hidden_size, 2)

        def corrupt(self, batch, generator):
            corrupted = shallow_copy(batch)
            corrupted["text_step"] = batch["text_step"].flip(1)  # a step-order change, declared as tokens
            return corrupted, {"silent_labels": torch.zeros(batch["input_ids"].shape[0], dtype=torch.long)}

    try:
        with config_error(r"objective 'silent' \(.*Silent\) does not declare what it corrupts: set its class "
                          r"attribute `corrupts` to a set of \['step_order', 'images', 'patches', 'tokens', 'regions'\]"):
            tiny_module(["mlm", "silent"], loss_normalization="local")
        Silent.corrupts = frozenset({"token"})
        with config_error(r"objective 'silent': unknown corruption kinds \['token'\]"):
            tiny_module(["mlm", "silent"], loss_normalization="local")
        Silent.corrupts = frozenset({"tokens"})
        module = tiny_module(["mlm", "silent"], loss_normalization="local")
        batch = toy_batch(2, 0, toy_world())
        with pytest.raises(ValueError, match=r"objective 'silent' changed the fusion entries \['text_step'\], which its "
                                             r"declared corruptions \['tokens'\] do not cover"):
            module._forward_group(batch, ("mlm", "silent"), 0)
    finally:
        OBJECTIVES.pop("silent", None)


# ------------------------------------------------------------------------------------------ learning and configs

@pytest.mark.slow  # ~10 s
def test_tiny_sop_learns_the_step_order():
    """The toy world's step texts name their stage: SOP leaves chance (0.5) within 120 steps, beside MLM."""
    module, drawn = train_tiny(["mlm", "sop"], 120)
    assert set(drawn) == {"sop"}  # MLM always on, SOP the one rotating objective
    mean = evaluate_tiny(module, ("sop",))
    assert mean["sop_acc"] > 0.8 and mean["mlm_acc"] > 0.3, mean


def test_text_only_pretraining_with_sop_through_train_py(compose_train):
    cfg = compose_train("experiment=roberta_pretrain", "objectives=mlm_sop", "trainer.max_steps=2",
                        "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1",
                        "trainer.log_every_n_steps=1", *tiny_pretrain())
    assert list(cfg.model.objectives.enabled) == ["mlm", "sop"] and cfg.model.objectives.sop.delta == 0.5
    assert train.run(cfg) is not None
    logged = {k for row in read_metrics(Path(cfg.paths.output_dir)) for k, v in row.items() if v}
    assert {"train/sop_loss", "val/sop_acc", "val/sop_chance", "test/sop_acc", "test/mlm_acc"} <= logged
