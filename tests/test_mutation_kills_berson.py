"""BERSON's decoder (decoders/berson.py) where mutation testing found behaviour no test pinned (docs/mutation.md):
each case is computed by hand from the decoder's own parts on a small instance."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from decoders.berson import BersonDecoder, BertSumLayer, pair_index, valid_pairs
from seqaware.modules.sequencing import pairwise_targets

H = 8


def decoder(**kwargs) -> BersonDecoder:
    torch.manual_seed(0)
    return BersonDecoder(H, paragraph_heads=2, dropout=0.0, **kwargs).eval()


def state_of(d: BersonDecoder, mask: torch.Tensor, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, i, j = pair_index(mask)
    vecs = [torch.randn(len(b), H, generator=g) for _ in range(3)]
    with torch.no_grad():
        return d.encode(*vecs, (b, i, j), mask)


# ---------------------------------------------------------------------------------------------- BertSum layer
def test_bertsum_layers_drop_attention_weights_with_the_decoders_dropout():
    layer = BertSumLayer(H, 2, 16, dropout=0.25, first=False)
    assert layer.attn.dropout == 0.25 and layer.drop.p == 0.25 and layer.ff_drop1.p == 0.25


def test_bertsum_feed_forward_is_the_tanh_gelu_to_float_precision():
    torch.manual_seed(0)
    layer = BertSumLayer(H, 2, 16, dropout=0.0, first=True).eval()
    with torch.no_grad():
        layer.w1.weight.mul_(8.0)    # pre-activations of a few units, where tanh-GELU and exact GELU differ by ~1e-4
    x = torch.randn(1, 1, H)
    padding = torch.tensor([[False]])
    attn = layer.attn
    v = F.linear(x, attn.in_proj_weight[2 * H:], attn.in_proj_bias[2 * H:])
    y = x + attn.out_proj(v)          # one key: attention is the value path
    pre = layer.w1(layer.ff_norm(y))
    tanh_gelu = 0.5 * pre * (1 + torch.tanh(math.sqrt(2 / math.pi) * (pre + 0.044715 * pre ** 3)))
    expected = y + layer.w2(tanh_gelu)
    with torch.no_grad():
        got = layer(x, padding)
    assert (got - expected).abs().max() < 1e-6
    assert (y + layer.w2(F.gelu(pre)) - expected).abs().max() > 1e-5   # the case tells the two apart


# ---------------------------------------------------------------------------------------------- loss
def test_the_loss_of_one_instance_is_its_own_mean_and_logs_the_pair_accuracy():
    d = decoder(variant="paper")            # loss_norm=instance: one instance counts 1
    mask = torch.ones(1, 4, dtype=torch.bool)
    state = state_of(d, mask, seed=2)
    gold = torch.tensor([[2, 0, 3, 1]])
    targets, _ = pairwise_targets(gold, mask)
    with torch.no_grad():
        logp = d.pointer_log_probs(state, gold)
        losses = d.loss(state, gold, targets)
    nll = -sum(float(logp[0, t, gold[0, t]]) for t in range(4))
    bce = F.binary_cross_entropy_with_logits(state.pair_logits, targets, reduction="none") * valid_pairs(mask)
    assert float(losses["pointer_loss"]) == pytest.approx(nll / 3, rel=1e-5)
    assert float(losses["pair_loss"]) == pytest.approx(float(bce.sum()) / 12, rel=1e-5)
    correct = ((state.pair_logits > 0) == (targets > 0.5)) & valid_pairs(mask)
    assert set(losses) == {"loss", "pointer_loss", "pair_loss", "pair_acc"}
    assert float(losses["pair_acc"]) == pytest.approx(int(correct.sum()) / 12)
    assert 0 < int(correct.sum()) < 12       # neither 0 nor 1: a product and a ratio differ
