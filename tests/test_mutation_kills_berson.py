"""BERSON's decoder (decoders/berson.py) where mutation testing found behaviour no test pinned (docs/mutation.md):
each case is computed by hand from the decoder's own parts on a small instance."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from torch import nn

from decoders.berson import AttentionPool, BersonDecoder, BertSumLayer, pair_index, valid_pairs
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


# ---------------------------------------------------------------------------------------------- attention pool
def test_attention_pooling_is_a_softmax_over_each_rows_masked_positions():
    torch.manual_seed(0)
    pool = AttentionPool(H)                       # additive attention by default: w^T tanh(W x)
    assert isinstance(pool.proj, nn.Linear) and pool.dropout is None
    x = torch.randn(2, 3, 5, H)
    mask = torch.rand(2, 3, 5) > 0.3
    mask[1, 2] = False                            # a row without any position
    with torch.no_grad():
        got = pool(x, mask)
        scores = pool.score(torch.tanh(pool.proj(x))).squeeze(-1)
    for b in range(2):
        for s in range(3):
            m = mask[b, s]
            if not m.any():
                assert not got[b, s].any()        # gives 0
                continue
            w = torch.softmax(scores[b, s][m], dim=0)
            torch.testing.assert_close(got[b, s], (w[:, None] * x[b, s][m]).sum(0))


def test_attention_pooling_keeps_a_bfloat16_models_dtype():
    torch.manual_seed(0)
    pool = AttentionPool(H, "linear").to(torch.bfloat16)     # precision=bf16-true: weights and inputs in bf16
    x = torch.randn(2, 4, H, dtype=torch.bfloat16)
    with torch.no_grad():
        out = pool(x, torch.ones(2, 4, dtype=torch.bool))
    assert out.dtype == torch.bfloat16 and pool.proj is None


# ---------------------------------------------------------------------------------------------- construction
@pytest.mark.parametrize("variant", ["ours", "paper"])
def test_the_token_pool_is_additive_and_the_feed_forward_four_times_the_hidden_size(variant):
    d = decoder(variant=variant)
    assert d.variant == variant
    assert isinstance(d.token_pool.proj, nn.Linear)          # w^T tanh(W x) in both variants
    if variant == "paper":
        assert all(layer.w1.out_features == 4 * H for layer in d.paragraph.layers)
    else:
        assert all(layer.linear1.out_features == 4 * H for layer in d.paragraph.layers)


def test_the_pointers_parameters_and_checkpoint_keys_per_variant():
    ours, paper = decoder(), decoder(variant="paper")
    assert ours.query.bias is None and paper.query.bias is not None              # BERSON's query_linear has a bias
    assert isinstance(ours.start, nn.Parameter) and "start" in ours.state_dict()   # a learnt first input
    assert not paper.start.any() and "start" not in paper.state_dict()             # BERSON: a zero constant, not saved
    assert ours.init_h is not None and paper.init_h is None


def test_ours_relation_vector_is_tanh_of_a_projection_of_the_pairs_cls_state():
    d = decoder()
    mask = torch.ones(1, 3, dtype=torch.bool)
    b, i, j = pair_index(mask)
    g = torch.Generator().manual_seed(10)
    first, second, cls = (3.0 * torch.randn(len(b), H, generator=g) for _ in range(3))
    with torch.no_grad():
        state = d.encode(first, second, cls, (b, i, j), mask)
        expected = torch.tanh(d.relation[0](cls))
    torch.testing.assert_close(state.relations[b, i, j], expected)
    assert not state.relations[0, [0, 1, 2], [0, 1, 2]].any()     # r(i, i) = 0


def test_a_hidden_size_the_heads_do_not_divide_is_refused():
    with pytest.raises(ValueError) as err:
        BersonDecoder(10, paragraph_heads=4)
    assert str(err.value) == "hidden size 10 is not divisible by paragraph_heads=4"


@pytest.mark.parametrize("variant", ["ours", "paper"])
def test_building_the_decoder_warns_nothing(variant):
    """PyTorch's pre-norm encoder cannot use nested tensors; asking for them (its default) warns at every model
    build that the request is ignored."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decoder(variant=variant)
    assert [str(w.message) for w in caught] == []


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


def test_a_two_step_instances_pointer_loss_is_its_first_picks_nll():
    """loss_norm=instance divides by n - 1 (the last pick is forced): by 1 for two steps."""
    d = decoder(variant="paper")
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()
    state = state_of(d, mask, seed=11)
    gold = torch.tensor([[1, 0, -1], [2, 0, 1]])
    targets, _ = pairwise_targets(gold, mask)
    with torch.no_grad():
        logp = d.pointer_log_probs(state, gold)
        norm = d.normalised(d.loss_terms(state, gold, targets))
    sums, counts = norm["pointer_loss"]
    assert counts.tolist() == [1, 1]
    torch.testing.assert_close(sums[0], -logp[0, 0, 1])
    torch.testing.assert_close(sums[1], -(logp[1, 0, 2] + logp[1, 1, 0] + logp[1, 2, 1]) / 2)


def test_the_loss_terms_are_per_instance():
    d = decoder()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]).bool()
    state = state_of(d, mask, seed=4)
    gold = torch.tensor([[2, 0, 3, 1], [1, 2, 0, -1]])
    targets, _ = pairwise_targets(gold, mask)
    with torch.no_grad():
        terms = d.loss_terms(state, gold, targets)
    correct = ((state.pair_logits > 0) == (targets > 0.5)) & valid_pairs(mask)
    assert terms["pair_correct"].tolist() == correct.sum((1, 2)).tolist()
    assert terms["pairs"].tolist() == [12, 6] and terms["steps"].tolist() == [4, 3]


# ---------------------------------------------------------------------------------------------- pointer
def test_a_pointer_row_with_no_candidate_left_is_uniform_not_nan():
    d = decoder()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    state = state_of(d, mask, seed=5)
    gold = torch.tensor([[2, 0, 3, 1], [1, 0, -1, -1]])
    with torch.no_grad():
        logp = d.pointer_log_probs(state, gold)
    assert torch.isfinite(logp[1, 2:]).all()        # after the short instance's last step
    torch.testing.assert_close(logp[1, 2:], torch.full((2, 4), -math.log(4)))
    assert torch.isinf(logp[1, 0, 2:]).all()         # padding is never a candidate


@pytest.mark.parametrize("variant", ["ours", "paper"])
def test_the_pointers_initial_state(variant):
    d = decoder(variant=variant)
    state = state_of(d, torch.ones(2, 3, dtype=torch.bool), seed=6)
    with torch.no_grad():
        h, c = d._initial(state, 2)
    h0 = state.paragraph if variant == "paper" else torch.tanh(d.init_h(state.paragraph))   # BERSON: the mean state
    torch.testing.assert_close(h, h0.repeat_interleave(2, 0))
    assert h.shape == (4, H) and not c.any()


def test_encoding_takes_pooled_vectors_in_another_dtype_than_the_cls_states():
    """Under autocast the pooled segment vectors and the [CLS] states may differ in dtype: the grid is float32."""
    d = decoder()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    b, i, j = pair_index(mask)
    g = torch.Generator().manual_seed(7)
    first, second, cls = (torch.randn(len(b), H, generator=g) for _ in range(3))
    first = first.bfloat16()
    with torch.no_grad():
        got = d.encode(first, second, cls, (b, i, j), mask)
        want = d.encode(first.float(), second, cls, (b, i, j), mask)
    assert got.relations.dtype == torch.float32
    torch.testing.assert_close(got.context, want.context)


def test_padding_changes_no_instances_encoding():
    """An instance padded to more step slots is encoded as it is alone; an instance of one step has its only
    state as the paragraph."""
    d = decoder()
    g = torch.Generator().manual_seed(9)
    short = torch.ones(1, 3, dtype=torch.bool)
    padded = torch.tensor([[1, 1, 1, 0, 0]]).bool()
    b, i, j = pair_index(short)
    vecs = [torch.randn(len(b), H, generator=g) for _ in range(3)]
    with torch.no_grad():
        alone = d.encode(*vecs, (b, i, j), short)
        among = d.encode(*vecs, pair_index(padded), padded)
    torch.testing.assert_close(among.context[:, :3], alone.context)
    torch.testing.assert_close(among.paragraph, alone.paragraph)
    assert not among.context[:, 3:].any()
    one = torch.tensor([[1, 0, 0]]).bool()
    empty = torch.zeros(0, H)
    with torch.no_grad():
        single = d.encode(empty, empty, empty, pair_index(one), one)
    torch.testing.assert_close(single.paragraph, single.context[:, 0])


# ---------------------------------------------------------------------------------------------- devices
@pytest.mark.parametrize("variant", ["ours", "paper"])
def test_the_decoder_makes_every_tensor_on_its_inputs_device(variant):
    """Checked on PyTorch's meta device (no GPU needed): a tensor made on the CPU instead of the inputs' device
    cannot meet them there."""
    d = decoder(variant=variant)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    b, i, j = pair_index(mask)
    g = torch.Generator().manual_seed(8)
    vecs = [torch.randn(len(b), H, generator=g).to("meta") for _ in range(3)]
    d = d.to("meta")
    state = d.encode(*vecs, (b.to("meta"), i.to("meta"), j.to("meta")), mask.to("meta"))
    assert state.context.device.type == "meta"
    gold = torch.tensor([[2, 0, 3, 1], [1, 0, -1, -1]], device="meta")
    terms = d.loss_terms(state, gold, torch.zeros(2, 4, 4, device="meta"))
    assert {k: (v.device.type, tuple(v.shape)) for k, v in terms.items()} == {
        k: ("meta", (2,)) for k in ("pointer_nll", "steps", "pair_bce", "pairs", "pair_correct")}
    for decode in (d.greedy, d.beam_search):   # they run to the end: only reading the orders out needs values
        with pytest.raises(RuntimeError, match=r"item\(\) cannot be called on meta tensors"):
            decode(state)
