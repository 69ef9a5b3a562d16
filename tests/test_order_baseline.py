"""The pairwise baseline: antisymmetric scores, decoders, and it actually learns to order steps."""
from __future__ import annotations

import itertools

import pytest
import torch

import train
from decoders import PAIRWISE_DECODERS
from decoders.pairwise import borda_order, decode_pairwise, greedy_order
from seqaware.models.order_baseline import PairwiseOrderModel
from seqaware.modules.sequencing import pairwise_targets


def _batch(b=3, s=4, length=6, size=16, vocab=50):
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[0, 3] = False
    gold = torch.stack([torch.randperm(s, generator=g) for _ in range(b)])
    gold[0] = torch.tensor([2, 0, 1, -1])
    return {"input_ids": torch.randint(1, vocab, (b, s, length), generator=g), "attention_mask": torch.ones(b, s, length, dtype=torch.long),
            "pixel_values": torch.randn(b, s, 3, size, size, generator=g), "image_mask": mask.clone(), "step_mask": mask, "gold": gold}


def test_pair_logits_are_antisymmetric_and_targets_match_gold():
    batch = _batch()
    model = PairwiseOrderModel(vocab_size=50, dim=16, cnn_width=8).eval()
    logits = model(batch)
    torch.testing.assert_close(logits, -logits.transpose(1, 2))
    targets, mask = pairwise_targets(batch["gold"], batch["step_mask"])
    assert int(mask[0].sum()) == 3 * 2 and int(mask[1].sum()) == 4 * 3
    # instance 0: order 2, 0, 1 -> step 2 before 0 and 1; 0 before 1
    assert targets[0, 2, 0] == 1 and targets[0, 2, 1] == 1 and targets[0, 0, 1] == 1 and targets[0, 1, 0] == 0


def test_decoders_recover_a_consistent_order_and_respect_padding():
    order = [3, 0, 2, 1]
    logits = torch.zeros(1, 5, 5)
    for i, j in itertools.permutations(range(4), 2):
        logits[0, i, j] = 4.0 if order.index(i) < order.index(j) else -4.0
    mask = torch.tensor([[True, True, True, True, False]])
    assert greedy_order(logits, mask) == [order] == borda_order(logits, mask)
    for name in PAIRWISE_DECODERS:  # every registered pairwise decoder, through the module's entry point
        assert decode_pairwise(name, logits, mask) == [order]
    with pytest.raises(ValueError) as err:
        decode_pairwise("nope", logits, mask)
    assert str(err.value) == f"unknown pairwise decoder 'nope'; registered: {', '.join(PAIRWISE_DECODERS)}"


def test_model_decoder_takes_every_pairwise_decoder_and_refuses_the_pointer_ones(compose_train):
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    cfg = compose_train("experiment=order_baseline")
    assert cfg.model.decoder == "pairwise_greedy"
    assert {"pairwise_greedy", "borda", "topological", "exact"} <= set(PAIRWISE_DECODERS)
    for name in PAIRWISE_DECODERS:
        cfg.model.decoder = name
        assert instantiate(cfg.model).decoder == name
    fitting = ", ".join(PAIRWISE_DECODERS)
    for name, reason in (("greedy", "model.decoder=greedy needs a pointer network, which this model does not have"),
                         ("viterbi", "model.decoder=viterbi is not a registered decoder")):
        cfg.model.decoder = name
        with pytest.raises(InstantiationException) as err:
            instantiate(cfg.model)
        assert str(err.value.__cause__) == f"{reason}; decoders that fit this model: {fitting}"


def test_loss_goes_down_on_a_fixed_batch():
    torch.manual_seed(0)
    batch = _batch()
    model = PairwiseOrderModel(vocab_size=50, dim=32, cnn_width=8, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    targets, mask = pairwise_targets(batch["gold"], batch["step_mask"])
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch)[mask], targets[mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.3 * losses[0]


@pytest.mark.slow
def test_baseline_beats_random_on_synthetic(compose_train):
    """A short CPU run on a small synthetic world orders unseen test procedures far above chance."""
    cfg = compose_train("experiment=order_baseline", "data.source.num_train=160", "data.source.num_test=40",
                        "trainer.max_epochs=5", "data.collator.image_size=64", "data.source.image_size=64")
    metrics = train.run(cfg)
    # random 3-5 step orders: single-reference PMR about 1/24 on average, tau about 0
    assert metrics["test/single/pmr"] > 0.3
    assert metrics["test/single/tau"] > 0.5
