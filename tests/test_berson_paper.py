"""BERSON's head as released (``model.decoder.variant=paper``): each point of docs/protocols/berson.md on a
hand-computed case, the switches, MPNet's pair format and the training-order option of the recipe."""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from decoders.berson import (VARIANTS, AttentionPool, BersonDecoder, BersonState, BertSumEncoder, pair_index,
                             valid_pairs)
from seqaware.encoders.base import pack_steps
from seqaware.modules.berson import with_separators
from seqaware.modules.sequencing import pairwise_targets
from tests.test_berson import TINY_BERT, _batch

H = 8


def paper(**kwargs) -> BersonDecoder:
    torch.manual_seed(0)
    return BersonDecoder(H, paragraph_heads=2, dropout=0.0, variant="paper", **kwargs).eval()


def ours(**kwargs) -> BersonDecoder:
    torch.manual_seed(0)
    return BersonDecoder(H, paragraph_heads=2, dropout=0.0, **kwargs).eval()


def random_state(decoder: BersonDecoder, mask: torch.Tensor, seed: int = 0) -> BersonState:
    g = torch.Generator().manual_seed(seed)
    b, i, j = pair_index(mask)
    vecs = [torch.randn(len(b), H, generator=g) for _ in range(3)]
    with torch.no_grad():
        return decoder.encode(*vecs, (b, i, j), mask)


# ---------------------------------------------------------------------------------------------- switches
def test_the_variants_set_every_switch_and_a_switch_given_wins():
    assert set(VARIANTS["ours"]) == set(VARIANTS["paper"])
    d = paper()
    assert d.options == {**VARIANTS["paper"], "pool_dropout": 0.0}   # None: the decoder's dropout
    assert ours().options == VARIANTS["ours"]
    mixed = paper(relation="tanh", loss_norm="pooled")
    assert mixed.relation_kind == "tanh" and mixed.loss_norm == "pooled" and mixed.pointer_inputs == "sentences"


def test_an_unknown_variant_or_switch_value_names_the_key():
    with pytest.raises(ValueError) as err:
        BersonDecoder(H, paragraph_heads=2, variant="bersonn")
    assert str(err.value) == "model.decoder.variant must be one of ['ours', 'paper'], got 'bersonn'"
    with pytest.raises(ValueError) as err:
        BersonDecoder(H, paragraph_heads=2, relation="probs")
    assert str(err.value) == "model.decoder.relation must be one of ['tanh', 'cls_probs'], got 'probs'"


# ---------------------------------------------------------------------------------------------- pools
def test_pools_include_the_closing_separator_of_each_segment():
    """BERSON's select masks: segment 0 = positions 1..sep_0, segment 1 = sep_0 + 1..sep_1 (both [SEP]s in)."""
    # [CLS] a1 a2 [SEP] b1 [SEP] [PAD]: text_step as pack_steps gives it
    fusion = {"text_step": torch.tensor([[-1, 0, 0, -1, 1, -1, -1]]),
              "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 0]])}
    assert with_separators(fusion).tolist() == [[-1, 0, 0, 0, 1, 1, -1]]
    # <s> a </s></s> b b </s> (MPNet / RoBERTa): both middle separators close a
    fusion = {"text_step": torch.tensor([[-1, 0, -1, -1, 1, 1, -1]]), "attention_mask": torch.ones(1, 7, dtype=torch.long)}
    assert with_separators(fusion).tolist() == [[-1, 0, 0, 0, 1, 1, 1]]


def _pool_inputs(module, batch):
    """The (states, segments) BERSON's token pool sees for the first chunk of pairs of ``batch``."""
    seen = {}
    original = module.decoder.pool_pair_segments
    module.decoder.pool_pair_segments = lambda states, seg: seen.setdefault("args", (states, seg)) and original(states, seg)
    with torch.no_grad():
        module.encode(batch)
    return seen["args"]


def test_the_module_pools_each_step_with_its_separator_only_in_the_paper_variant():
    from seqaware.modules.berson import BersonModule

    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text", "config": TINY_BERT,
               "tokenizer": "offline:minilm"}
    batch = _batch("text", n_steps=(2,))
    segs = {}
    for variant in ("ours", "paper"):
        torch.manual_seed(0)
        module = BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3},
                              decoder={"paragraph_heads": 4, "dropout": 0.0, "variant": variant}).eval()
        _, segs[variant] = _pool_inputs(module, batch)
    ids = batch["input_ids"][0, 0]
    n0 = int(batch["attention_mask"][0, 0].sum()) - 2          # step 0's word pieces (without [CLS], [SEP])
    n1 = int(batch["attention_mask"][0, 1].sum()) - 2
    first = segs["paper"][0].tolist()                           # the pair (0, 1): [CLS] s0 [SEP] s1 [SEP]
    assert first[: 3 + n0 + n1 + 1] == [-1] + [0] * (n0 + 1) + [1] * (n1 + 1)
    assert segs["ours"][0].tolist()[: 3 + n0 + n1 + 1] == [-1] + [0] * n0 + [-1] + [1] * n1 + [-1]
    assert int(ids[0]) != int(ids[n0 + 1])                      # sanity: [CLS] and [SEP] differ


def test_token_attention_dropout_drops_weights_only_in_training():
    pool = AttentionPool(H, "mlp", dropout=0.5)
    x, mask = torch.randn(3, 5, H), torch.ones(3, 5, dtype=torch.bool)
    pool.eval()
    expected = pool(x, mask)
    torch.manual_seed(1)
    pool.train()
    dropped = pool(x, mask)
    assert not torch.allclose(dropped, expected)
    assert paper().token_pool.dropout is None                                   # dropout 0: no layer
    assert BersonDecoder(H, paragraph_heads=2, variant="paper").token_pool.dropout.p == 0.1   # BERT's hidden_dropout_prob


def test_the_step_score_is_one_linear_layer():
    """BERSON's linear_in_2: softmax over the 2(n-1) pair-specific vectors of w^T x."""
    pool = paper().pair_pool
    assert pool.proj is None and pool.score.bias is None
    x = torch.randn(4, 6, H)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]] * 4).bool()
    w = pool.score.weight[0]
    weights = torch.softmax((x[:, :4] @ w), dim=-1)
    torch.testing.assert_close(pool(x, mask), torch.einsum("bt,bth->bh", weights, x[:, :4]))
    assert ours().pair_pool.proj is not None                     # ours: w^T tanh(W x)


# ---------------------------------------------------------------------------------------------- paragraph encoder
def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def test_paragraph_encoder_is_bertsums_first_layer_without_input_layernorm_and_gelu():
    enc = paper(paragraph_ff=16).paragraph
    assert isinstance(enc, BertSumEncoder)
    first, second = enc.layers
    assert isinstance(first.input_norm, nn.Identity) and isinstance(second.input_norm, nn.LayerNorm)
    assert second.input_norm.eps == 1e-6 and first.ff_norm.eps == 1e-6 and enc.norm.eps == 1e-6
    assert first.w1.out_features == 16
    # one real step: attention over a single key is the value path, out(W_v q + b_v), whatever the scores
    x = torch.randn(1, 3, H)
    padding = torch.tensor([[False, True, True]])
    for layer, q in ((first, x), (second, second.input_norm(x))):
        attn = layer.attn
        v = F.linear(q, attn.in_proj_weight[2 * H:], attn.in_proj_bias[2 * H:])
        y = x + attn.out_proj(v)
        expected = y + layer.w2(_gelu_tanh(layer.w1(layer.ff_norm(y))))
        torch.testing.assert_close(layer(x, padding)[:, 0], expected[:, 0], rtol=1e-5, atol=1e-5)


def test_ours_keeps_the_pre_norm_relu_paragraph_encoder():
    enc = ours().paragraph
    assert isinstance(enc, nn.TransformerEncoder) and enc.layers[0].norm_first
    assert enc.layers[0].activation_relu_or_gelu == 1   # ReLU


# ---------------------------------------------------------------------------------------------- relation vector
def test_relation_vector_is_cls_and_the_before_after_probabilities():
    d = paper()
    mask = torch.tensor([[1, 1, 1, 0]]).bool()
    b, i, j = pair_index(mask)
    g = torch.Generator().manual_seed(0)
    first, second, cls = (torch.randn(len(b), H, generator=g) for _ in range(3))
    with torch.no_grad():
        state = d.encode(first, second, cls, (b, i, j), mask)
        two = d.pair_head(cls)                                            # (pairs, 2): class 1 = "i before j"
    assert state.relations.shape == (1, 4, 4, H + 2) and d.relation_size == H + 2
    for k in range(len(b)):
        r = state.relations[0, i[k], j[k]]
        torch.testing.assert_close(r[:H], cls[k])
        torch.testing.assert_close(r[H:], torch.softmax(two[k], -1))
        torch.testing.assert_close(state.pair_logits[0, i[k], j[k]], two[k, 1] - two[k, 0])
    assert float(state.relations[0, 3].abs().sum()) == 0.0 and float(state.relations[0, 1, 1].abs().sum()) == 0.0
    assert ours().relation_size == H


def test_the_two_way_pairwise_loss_is_the_cross_entropy_of_the_release():
    d = paper()
    mask = torch.ones(2, 3, dtype=torch.bool)
    state = random_state(d, mask)
    gold = torch.tensor([[2, 0, 1], [0, 1, 2]])
    targets, _ = pairwise_targets(gold, mask)
    terms = d.loss_terms(state, gold, targets)
    # the two logits [-d/2, d/2] have the same softmax as [l0, l1] when d = l1 - l0
    logits2 = torch.stack([torch.zeros_like(state.pair_logits), state.pair_logits], -1)
    valid = valid_pairs(mask)
    ce = F.cross_entropy(logits2[valid], targets[valid].long(), reduction="sum")
    torch.testing.assert_close(terms["pair_bce"].sum(), ce)


# ---------------------------------------------------------------------------------------------- summaries
def _summary_probe(decoder: BersonDecoder) -> BersonDecoder:
    """Keys = the forward summary alone: the base key and every other key projection zeroed, forward = identity."""
    with torch.no_grad():
        for lin in (decoder.key, decoder.key_last, decoder.key_second, decoder.key_backward):
            lin.weight.zero_()
            if lin.bias is not None:
                lin.bias.zero_()
        decoder.key_forward.weight.copy_(torch.eye(H, decoder.relation_size))
    return decoder


@pytest.mark.parametrize("variant, divisor", [("paper", 5.0), ("ours", 1.0)])
def test_forward_summary_divisor_at_five_steps_after_three_picks(variant, divisor):
    """n = 5, t = 3 (steps 0, 1, 2 pointed): candidate 3's forward summary sums r(3, 4), its only other unpointed
    step; BERSON divides by the n = 5 slots, ours by the 1 other unpointed step."""
    d = _summary_probe((paper if variant == "paper" else ours)(relation="tanh"))
    mask = torch.ones(1, 5, dtype=torch.bool)
    R = torch.randn(1, 5, 5, H) * valid_pairs(mask)[..., None]
    state = BersonState(torch.zeros(1, 5, H), torch.zeros(1, H), R, torch.zeros(1, 5, 5), mask, torch.zeros(1, 5, H))
    unpointed = torch.tensor([[[False, False, False, True, True]]])
    last, second = torch.tensor([[2]]), torch.tensor([[1]])
    keys = d._keys(state, last, second, unpointed)[0, 0]
    torch.testing.assert_close(keys[3], R[0, 3, 4] / divisor)
    torch.testing.assert_close(keys[4], R[0, 4, 3] / divisor)


def test_summaries_divide_by_the_instance_steps_not_the_padded_slots():
    d = _summary_probe(paper(relation="tanh"))
    mask = torch.tensor([[1, 1, 1, 0, 0]]).bool()
    R = torch.randn(1, 5, 5, H) * valid_pairs(mask)[..., None]
    state = BersonState(torch.zeros(1, 5, H), torch.zeros(1, H), R, torch.zeros(1, 5, 5), mask, torch.zeros(1, 5, H))
    keys = d._keys(state, torch.tensor([[-1]]), torch.tensor([[-1]]), mask[:, None])[0, 0]
    torch.testing.assert_close(keys[0], (R[0, 0, 1] + R[0, 0, 2]) / 3)


# ---------------------------------------------------------------------------------------------- pointer
def test_pointer_starts_from_the_paragraph_mean_a_zero_cell_and_a_zero_input():
    d = paper()
    mask = torch.tensor([[1, 1, 1, 0]]).bool()
    state = random_state(d, mask)
    h, c = d._initial(state, 3)
    torch.testing.assert_close(h, state.paragraph.expand(3, H))
    assert float(c.abs().sum()) == 0.0
    torch.testing.assert_close(state.paragraph[0], state.context[0, :3].mean(0))
    assert "start" not in dict(d.named_parameters()) and float(d.start.abs().sum()) == 0.0
    assert d.init_h is None and d.key.in_features == 2 * H and d.query.bias is not None
    # the first distribution: LSTM(0, (paragraph, 0)), keys W [s_j; p_j] + nothing else (no pick yet)
    h1, _ = d.cell(torch.zeros(1, H), (state.paragraph, torch.zeros(1, H)))
    fwd = torch.einsum("k,jkh->jh", mask[0].float(), state.relations[0]) / 3
    bwd = torch.einsum("k,kjh->jh", mask[0].float(), state.relations[0]) / 3
    key = d.key(torch.cat([state.sentences[0], state.context[0]], -1)) + d.key_forward(fwd) + d.key_backward(bwd)
    logits = d.score(torch.tanh(key + d.query(h1))).squeeze(-1)[:3]
    with torch.no_grad():
        got = d.pointer_log_probs(state, torch.tensor([[1, 0, 2, -1]]))[0, 0, :3]
    torch.testing.assert_close(got, torch.log_softmax(logits, -1), rtol=1e-5, atol=1e-5)


def test_pointer_inputs_are_the_step_vectors_before_the_paragraph_encoder():
    mask = torch.ones(1, 4, dtype=torch.bool)
    gold = torch.tensor([[2, 0, 3, 1]])
    for make, reads in ((paper, True), (ours, False)):
        d = make()
        state = random_state(d, mask)
        moved = BersonState(**{**state.__dict__, "sentences": state.sentences + 1.0})
        with torch.no_grad():
            a, b = d.pointer_log_probs(state, gold), d.pointer_log_probs(moved, gold)
        assert (not torch.allclose(a, b)) == reads
    s = random_state(paper(), mask)
    torch.testing.assert_close(s.sentences, paper().pair_pool(  # the pooled step vectors, unencoded
        *_per_step(paper(), mask)))


def _per_step(d: BersonDecoder, mask: torch.Tensor):
    """The pair-specific vectors random_state gives each step, as encode gathers them."""
    g = torch.Generator().manual_seed(0)
    b, i, j = pair_index(mask)
    first, second, _ = (torch.randn(len(b), H, generator=g) for _ in range(3))
    B, n = mask.shape
    grid = torch.zeros(2, B, n, n, H)
    grid[0, b, i, j], grid[1, b, i, j] = first, second
    valid = valid_pairs(mask)
    return torch.cat([grid[0], grid[1].transpose(1, 2)], 2), torch.cat([valid, valid.transpose(1, 2)], 2)


def test_greedy_and_beam_agree_with_teacher_forcing_in_the_paper_variant():
    d = paper()
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2]).bool()
    state = random_state(d, mask, seed=2)
    greedy = d.greedy(state)
    assert d.beam_search(state, width=1) == greedy
    assert [sorted(o) for o in d.beam_search(state, width=16)] == [[0, 1, 2, 3, 4], [0, 1, 2]]


def _trained_size(decoder: BersonDecoder, seed: int = 0) -> BersonDecoder:
    """Every weight of ``decoder`` from N(0, 1): a fresh head's (BERT's N(0, 0.02) in the paper variant) are so
    small that the pointer's inputs cannot change a pick; a trained head's can."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in decoder.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return decoder


@pytest.mark.parametrize("make", [paper, ours], ids=["paper", "ours"])
def test_each_greedy_pick_is_the_teacher_forced_argmax_on_a_head_of_trained_size(make):
    """Greedy decoding feeds the pointer what teacher forcing feeds it after each pick (the step vector in the
    paper variant, the paragraph state in ours): every greedy pick is the argmax of the teacher-forced
    distribution given the picks before it, and beam search of width 1 is greedy decoding."""
    d = _trained_size(make())
    mask = torch.tensor([[1] * 7, [1] * 6 + [0], [1] * 5 + [0] * 2, [1] * 7, [1] * 4 + [0] * 3, [1] * 6 + [0]]).bool()
    state = random_state(d, mask, seed=3)
    orders = d.greedy(state)
    assert [sorted(o) for o in orders] == [list(range(int(k))) for k in mask.sum(1)]
    gold = torch.tensor([o + [-1] * (mask.shape[1] - len(o)) for o in orders])
    with torch.no_grad():
        logp = d.pointer_log_probs(state, gold)
    assert [[int(logp[b, t].argmax()) for t in range(len(o))] for b, o in enumerate(orders)] == orders
    assert d.beam_search(state, width=1) == orders


# ---------------------------------------------------------------------------------------------- loss
def test_pointer_loss_is_divided_by_n_minus_one_per_instance_then_averaged():
    d = paper()
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2]).bool()
    state = random_state(d, mask, seed=1)
    gold = torch.tensor([[3, 1, 4, 0, 2], [2, 0, 1, -1, -1]])
    targets, _ = pairwise_targets(gold, mask)
    with torch.no_grad():
        logp = d.pointer_log_probs(state, gold)
        losses = d.loss(state, gold, targets)
    nll = [-sum(float(logp[b, t, gold[b, t]]) for t in range(n)) for b, n in enumerate((5, 3))]
    assert abs(float(logp[0, 4, gold[0, 4]])) < 1e-6          # the last pick is forced: log 1
    expected_pointer = (nll[0] / 4 + nll[1] / 2) / 2
    assert float(losses["pointer_loss"]) == pytest.approx(expected_pointer, rel=1e-5)
    bce = F.binary_cross_entropy_with_logits(state.pair_logits, targets, reduction="none") * valid_pairs(mask)
    expected_pair = (float(bce[0].sum()) / 20 + float(bce[1].sum()) / 6) / 2
    assert float(losses["pair_loss"]) == pytest.approx(expected_pair, rel=1e-5)
    assert float(losses["loss"]) == pytest.approx(expected_pointer + 0.6 * expected_pair, rel=1e-5)
    pooled = ours().loss(random_state(ours(), mask, seed=1), gold, targets)   # ours: NLL over all 8 real steps
    with torch.no_grad():
        o = ours()
        s = random_state(o, mask, seed=1)
        lp = o.pointer_log_probs(s, gold)
    total = -sum(float(lp[b, t, gold[b, t]]) for b, n in enumerate((5, 3)) for t in range(n))
    assert float(pooled["pointer_loss"]) == pytest.approx(total / 8, rel=1e-5)


def test_the_modules_training_loss_is_the_per_instance_mean_of_the_decoders_outputs():
    """BersonModule's training loss under ``loss_norm=instance`` (the paper variant's), recomputed by hand from the
    decoder's teacher-forced log-probabilities and pair logits on instances of 5, 3 and 4 steps: each instance's
    NLL / (n - 1) and BCE / (n (n - 1)), averaged over the instances, the pair term weighted by lambda = 0.6."""
    from seqaware.modules.berson import BersonModule

    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text", "config": TINY_BERT,
               "tokenizer": "offline:minilm"}
    torch.manual_seed(0)
    module = BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3},
                          decoder={"paragraph_heads": 4, "dropout": 0.0, "variant": "paper"}).eval()
    assert module.decoder.loss_norm == "instance"
    batch = _batch("text", n_steps=(5, 3, 4))
    gold, mask = batch["gold"], batch["step_mask"]
    with torch.no_grad():
        losses = module._losses(batch)[0]
        state = module.encode(batch)
        logp = module.decoder.pointer_log_probs(state, gold).double()
    targets, _ = pairwise_targets(gold, mask)
    sizes = [int(k) for k in mask.sum(1)]
    assert sizes == [5, 3, 4]
    nll = [-sum(logp[b, t, int(gold[b, t])] for t in range(n)) for b, n in enumerate(sizes)]
    bce = F.binary_cross_entropy_with_logits(state.pair_logits.double(), targets.double(), reduction="none")
    bce = (bce * valid_pairs(mask)).sum((1, 2))
    pointer = sum(nll[b] / (n - 1) for b, n in enumerate(sizes)) / 3
    pair = sum(bce[b] / (n * (n - 1)) for b, n in enumerate(sizes)) / 3
    assert float(losses["pointer_loss"]) == pytest.approx(float(pointer), rel=1e-6)
    assert float(losses["pair_loss"]) == pytest.approx(float(pair), rel=1e-6)
    assert float(losses["loss"]) == pytest.approx(float(pointer + 0.6 * pair), rel=1e-6)
    # the pooled normalisation (ours) differs on these instances: the check can tell the two apart
    pooled_pointer = sum(nll) / sum(sizes)
    assert abs(float(pooled_pointer) / float(pointer) - 1) > 0.05


def test_bert_initialisation_of_the_head():
    torch.manual_seed(0)
    d = BersonDecoder(384, paragraph_heads=8, variant="paper")
    w = torch.cat([d.key_forward.weight.flatten(), d.key.weight.flatten(), d.paragraph.layers[0].w1.weight.flatten()])
    assert float(w.std()) == pytest.approx(0.02, rel=0.05) and abs(float(w.mean())) < 1e-3
    assert float(d.key.bias.abs().sum()) == 0.0 and float(d.pair_head.bias.abs().sum()) == 0.0
    assert float(d.paragraph.layers[0].attn.in_proj_weight.std()) == pytest.approx(0.02, rel=0.05)
    assert ours().key.weight.std() > 0.1                         # PyTorch's default: U(+-1/sqrt(fan_in))


def test_module_trains_the_paper_head_end_to_end():
    from seqaware.modules.berson import BersonModule

    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text", "config": TINY_BERT,
               "tokenizer": "offline:minilm"}
    torch.manual_seed(0)
    module = BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3},
                          decoder={"paragraph_heads": 4, "dropout": 0.0, "variant": "paper"})
    batch = _batch("text")
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
    module.train()
    first = None
    for _ in range(25):
        opt.zero_grad()
        loss = module._losses(batch)[0]["loss"]
        loss.backward()
        opt.step()
        first = float(loss) if first is None else first
    assert float(loss) < 0.5 * first
    module.eval()
    with torch.no_grad():
        orders = module.decode(module.encode(batch))
    gold = [[int(g) for g in row if g >= 0] for row in batch["gold"]]
    assert orders == gold


# ---------------------------------------------------------------------------------------------- MPNet pairs
def mpnet_tokenizer(folder):
    """An MPNet tokenizer on MiniLM's vocabulary (its <s>, </s> added at 30522, 30523; MPNet-base's is this
    vocabulary plus the same specials), saved where TextEncoder can load it."""
    from transformers import MPNetTokenizer

    from seqaware.pretrained import load_tokenizer

    vocab_file = os.path.join(load_tokenizer("offline:minilm").name_or_path, "vocab.txt")
    with open(vocab_file, encoding="utf-8") as f:
        vocab = {line.rstrip("\n"): k for k, line in enumerate(f)}
    tok = MPNetTokenizer(vocab=vocab, unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]")
    tok.save_pretrained(str(folder))
    return tok


def test_mpnet_pairs_are_packed_as_its_tokenizer_packs_a_pair(tmp_path):
    from seqaware.encoders.text import special_token_ids

    tok = mpnet_tokenizer(tmp_path)
    ids = special_token_ids(tok)
    assert ids["pair_sep_id"] == tok.sep_token_id
    a, b = "put the cup on the table.", "pour the tea."
    steps = tok([a, b], padding=True, return_tensors="pt")
    packed = pack_steps(steps["input_ids"][None], steps["attention_mask"][None], None, ids["cls_token_id"],
                        ids["pad_token_id"], pair_sep_id=ids["pair_sep_id"])
    expected = tok(a, b)["input_ids"]                                  # <s> a </s></s> b </s>
    assert packed["input_ids"][0].tolist() == expected
    n_a = len(tok(a)["input_ids"]) - 2
    assert packed["text_step"][0].tolist() == [-1] + [0] * n_a + [-1, -1] + [1] * (len(expected) - n_a - 4) + [-1]
    from seqaware.pretrained import load_tokenizer

    bert = load_tokenizer("offline:minilm")
    assert special_token_ids(bert)["pair_sep_id"] is None                 # BERT: [CLS] a [SEP] b [SEP]
    steps = bert([a, b], padding=True, return_tensors="pt")
    packed = pack_steps(steps["input_ids"][None], steps["attention_mask"][None], None, bert.cls_token_id, bert.pad_token_id)
    assert packed["input_ids"][0].tolist() == bert(a, b)["input_ids"]


def test_a_tiny_random_mpnet_encodes_berson_pairs_in_its_own_format(tmp_path):
    """BERSON's pairwise encoding on a tiny random MPNet whose tokenizer packs <s> a </s></s> b </s>: the encoder
    sees exactly the tokenizer's pair ids, and the paper head trains on them."""
    from conftest import TINY_MPNET
    from data_modules.collate import StepCollator
    from data_modules.views import SequencingView
    from seqaware.modules.berson import BersonModule
    from seqaware.procedure import Procedure, Step

    tok = mpnet_tokenizer(tmp_path)
    config = {k: v if k == "model_type" else float(v) if "." in v else int(v)           # the override string as a dict
              for k, v in (item.split(":") for item in TINY_MPNET.strip("{}").split(","))}
    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text", "config": config,
               "tokenizer": str(tmp_path)}
    torch.manual_seed(0)
    module = BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3},
                          decoder={"paragraph_heads": 4, "dropout": 0.0, "variant": "paper"})
    assert module.encoder.pair_sep_id == tok.sep_token_id
    texts = ["wake up.", "brush your teeth.", "eat breakfast."]
    view = SequencingView([Procedure(id="p", steps=[Step(text=t) for t in texts])], seed=0)
    batch = StepCollator(tokenizer=tok, use_images=False)([view[0]])
    seen = []
    forward = module.encoder.forward
    module.encoder.forward = lambda fi: seen.append(fi["input_ids"]) or forward(fi)
    loss = module._losses(batch)[0]["loss"]
    loss.backward()
    assert torch.isfinite(loss)
    presented = [texts[batch["meta"][0]["step_index"][p]] for p in range(3)]
    pairs = [(a, b) for a in range(3) for b in range(3) if a != b]
    for row, (a, b) in zip(seen[0], pairs):
        expected = tok(presented[a], presented[b])["input_ids"]
        assert row[: len(expected)].tolist() == expected


# ---------------------------------------------------------------------------------------------- training order
def test_reshuffle_train_false_keeps_each_training_story_in_one_order(tmp_path):
    from data_modules.views import SequencingView
    from seqaware.procedure import Procedure, Step

    procs = [Procedure(id=f"s{k}", steps=[Step(text=f"sentence {c}") for c in "abcde"]) for k in range(20)]
    once = SequencingView(procs, seed=0, reshuffle=False)
    every = SequencingView(procs, seed=0, reshuffle=True)
    orders = {}
    for name, view in (("once", once), ("every", every)):
        orders[name] = [[view[k, epoch].step_index for k in range(20)] for epoch in range(3)]
    assert orders["once"][0] == orders["once"][1] == orders["once"][2]
    assert orders["every"][0] != orders["every"][1]


def test_the_datamodule_passes_reshuffle_train_to_the_training_view_only():
    from data_modules.datamodule import ProcedureDataModule

    for flag in (True, False):
        dm = ProcedureDataModule(lambda: {}, tokenizer=None, reshuffle_train=flag)
        assert dm._view("train", []).reshuffle is flag
        assert dm._view("val", []).reshuffle is False and dm._view("test", []).reshuffle is False


# ---------------------------------------------------------------------------------------------- the recipe
def test_the_paper_recipe_is_the_release_and_composes_with_mpnet_joint_and_extra_files(compose_train):
    cfg = compose_train("experiment=berson_roc", "hparams=berson_roc_paper", tiny=False)
    m, d, t = cfg.model, cfg.data, cfg.trainer
    assert (m.decoder.variant, m.decoder.lambda_pair, m.decoder.paragraph_layers, m.decoder.paragraph_heads,
            m.decoder.paragraph_ff, m.decoder.dropout) == ("paper", 0.6, 2, 8, 3072, 0.1)
    assert (m.optimizer.lr, m.optimizer.weight_decay, m.optimizer.eps, m.head_lr) == (2e-5, 0.0, 1e-8, None)
    assert m.scheduler._target_ == "transformers.get_linear_schedule_with_warmup" and m.scheduler.num_warmup_steps == 0
    assert (m.decoding, m.beam_size, m.pair_encoding) == ("beam", 16, "pairwise")
    assert (d.batch_size, d.reshuffle_train, d.collator.max_tokens) == (4, False, 37)
    assert (t.max_epochs, t.gradient_clip_val) == (2, 1.0)
    assert t.precision == "32-true"            # run.sh passes no --fp16: the release trains in fp32
    cfg = compose_train("experiment=berson_roc", "hparams=berson_roc_paper", "backbones=base", "model.pair_encoding=joint",
                        "data.extra_train_paths=[extra.tsv]", "trainer=gpu", tiny=False)
    assert cfg.trainer.precision == "32-true"  # trainer=gpu's bf16-mixed does not override the preset
    assert cfg.model.encoder.name_or_path == "offline:mpnet" and cfg.data.tokenizer == "offline:mpnet"
    assert cfg.model.pair_encoding == "joint" and list(cfg.data.extra_train_paths) == ["extra.tsv"]
    assert cfg.model.decoder.variant == "paper" and cfg.data.batch_size == 4
