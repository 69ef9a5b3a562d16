"""BERSON and the other order decoders: pair construction, pointer validity, decoder agreement."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from decoders import DECODERS, PAIRWISE_DECODERS
from decoders.berson import BersonDecoder, pair_index
from decoders.exact import MAX_EXACT_STEPS, exact_order, exact_order_single
from seqaware.modules.berson import state_rows
from seqaware.modules.sequencing import pairwise_targets, reference_targets

H = 32


def _random_state(decoder: BersonDecoder, step_mask: torch.Tensor, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, i, j = pair_index(step_mask)
    vecs = [torch.randn(len(b), H, generator=g) for _ in range(3)]
    return decoder.encode(*vecs, (b, i, j), step_mask), vecs, (b, i, j)


def _is_permutation(order: list[int], n: int) -> bool:
    return sorted(order) == list(range(n))


@pytest.fixture
def decoder() -> BersonDecoder:
    torch.manual_seed(0)
    return BersonDecoder(H, paragraph_heads=4, dropout=0.0).eval()


MASK = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5]).bool()


def test_pairs_are_all_ordered_pairs_with_precedence_labels():
    b, i, j = pair_index(MASK)
    for inst, n in enumerate([7, 4, 2]):
        got = sorted(zip(i[b == inst].tolist(), j[b == inst].tolist()))
        assert got == sorted(itertools.permutations(range(n), 2))  # n(n-1) ordered pairs, no self pairs
    gold = torch.tensor([[3, 0, 6, 1, 5, 2, 4], [2, 0, 3, 1, -1, -1, -1], [1, 0, -1, -1, -1, -1, -1]])
    targets, mask = pairwise_targets(gold, MASK)
    for inst in range(3):
        order = [g for g in gold[inst].tolist() if g >= 0]
        place = {step: k for k, step in enumerate(order)}
        for a, c in itertools.permutations(order, 2):
            assert targets[inst, a, c] == float(place[a] < place[c])
            assert mask[inst, a, c]
    assert int(mask.sum()) == 7 * 6 + 4 * 3 + 2 * 1


def test_pointer_decoders_return_permutations_and_width_one_beam_is_greedy(decoder):
    for seed in range(5):
        state, _, _ = _random_state(decoder, MASK, seed)
        greedy = decoder.greedy(state)
        assert [len(o) for o in greedy] == [7, 4, 2]
        assert all(_is_permutation(o, n) for o, n in zip(greedy, [7, 4, 2]))  # never repeats a step
        assert decoder.beam_search(state, width=1) == greedy
        beam = decoder.beam_search(state, width=16)
        assert all(_is_permutation(o, n) for o, n in zip(beam, [7, 4, 2]))
    assert DECODERS["greedy"](decoder, state, 16) == decoder.greedy(state)
    assert DECODERS["beam"](decoder, state, 3) == decoder.beam_search(state, width=3)


def test_pointer_and_pairwise_decoders_have_unique_names_and_declare_what_they_need():
    assert {"greedy", "beam"} <= set(DECODERS.names(needs="pointer"))
    assert {"pairwise_greedy", "borda", "topological", "exact"} <= set(PAIRWISE_DECODERS)
    assert DECODERS.where("greedy") == "decoders.berson:pointer_greedy"
    assert DECODERS.where("pairwise_greedy") == "decoders.pairwise:greedy_order"


@pytest.mark.parametrize("name", DECODERS.names(needs="pointer"))
def test_every_pointer_decoder_returns_permutations(decoder, name):
    state, _, _ = _random_state(decoder, MASK, seed=1)
    orders = DECODERS[name](decoder, state, 4)
    assert [len(o) for o in orders] == [7, 4, 2]
    assert all(_is_permutation(o, n) for o, n in zip(orders, [7, 4, 2]))


def _sequence_log_prob(decoder, state, b, order):
    gold = torch.full((1, state.step_mask.shape[1]), -1)
    gold[0, : len(order)] = torch.tensor(order)
    sub = state_rows(state, torch.tensor([b]))
    logp = decoder.pointer_log_probs(sub, gold)[0]
    return float(sum(logp[t, order[t]] for t in range(len(order))))


def test_beam_search_finds_the_most_probable_order_of_small_instances(decoder):
    mask = torch.tensor([[1] * 5, [1] * 4 + [0]]).bool()
    state, _, _ = _random_state(decoder, mask, seed=3)
    beam = decoder.beam_search(state, width=120)  # 5! = 120: exhaustive
    for b, n in enumerate([5, 4]):
        scores = {perm: _sequence_log_prob(decoder, state, b, list(perm)) for perm in itertools.permutations(range(n))}
        best = max(scores, key=scores.get)
        assert beam[b] == list(best)
        assert scores[tuple(beam[b])] >= scores[tuple(decoder.greedy(state)[b])] - 1e-6


def test_exact_decoder_matches_brute_force():
    rng = np.random.default_rng(0)
    for n in range(1, 8):
        for _ in range(3):
            lp = np.log(rng.uniform(0.01, 0.99, size=(n, n)))
            brute = max(itertools.permutations(range(n)),
                        key=lambda o: sum(lp[o[a], o[c]] for a in range(n) for c in range(a + 1, n)))
            assert exact_order_single(lp) == list(brute)
    with pytest.raises(ValueError, match="at most"):
        exact_order_single(np.zeros((MAX_EXACT_STEPS + 1, MAX_EXACT_STEPS + 1)))


@pytest.mark.parametrize("name", sorted(PAIRWISE_DECODERS))
def test_pairwise_decoders_recover_a_consistent_order(name):
    # logits from a known order: every decoder must return it exactly
    n = 6
    true = [4, 1, 5, 0, 3, 2]
    place = {s: k for k, s in enumerate(true)}
    logits = torch.tensor([[3.0 * np.sign(place[j] - place[i]) for j in range(n)] for i in range(n)])[None]
    mask = torch.ones(1, n, dtype=torch.bool)
    assert PAIRWISE_DECODERS[name](logits, mask) == [true]
    noisy = logits + torch.randn(3, n, n)
    padded = torch.ones(3, n, dtype=torch.bool)
    padded[1, 4:] = False
    for order, k in zip(PAIRWISE_DECODERS[name](noisy, padded), [6, 4, 6]):
        assert _is_permutation(order, k)


def test_topological_sort_breaks_cycles_deterministically():
    # a 3-cycle 0 -> 1 -> 2 -> 0 with different confidences
    logits = torch.zeros(1, 3, 3)
    for a, c, v in [(0, 1, 4.0), (1, 2, 1.0), (2, 0, 2.0)]:
        logits[0, a, c], logits[0, c, a] = v, -v
    mask = torch.ones(1, 3, dtype=torch.bool)
    first = PAIRWISE_DECODERS["topological"](logits, mask)
    assert first == PAIRWISE_DECODERS["topological"](logits.clone(), mask)
    # the weakest incoming edges belong to step 2 (only 1 -> 2 at P = sigmoid(1)): the cycle opens there
    assert first == [[2, 0, 1]]


def test_exact_decoder_on_pairwise_logits_beats_or_ties_others():
    torch.manual_seed(1)
    logits = torch.randn(4, 6, 6)
    mask = torch.ones(4, 6, dtype=torch.bool)
    from decoders.pairwise import pair_log_probs

    lp = pair_log_probs(logits, mask)
    score = lambda b, o: float(sum(lp[b, o[a], o[c]] for a in range(6) for c in range(a + 1, 6)))
    exact = exact_order(logits, mask)
    for name in PAIRWISE_DECODERS:
        for b, order in enumerate(PAIRWISE_DECODERS[name](logits, mask)):
            assert score(b, exact[b]) >= score(b, order) - 1e-6


def test_berson_loss_goes_down_and_recovers_the_gold_order(decoder):
    decoder.train()
    gold = torch.tensor([[3, 0, 6, 1, 5, 2, 4], [2, 0, 3, 1, -1, -1, -1], [1, 0, -1, -1, -1, -1, -1]])
    targets, _ = pairwise_targets(gold, MASK)
    _, vecs, index = _random_state(decoder, MASK)
    vecs = [v.requires_grad_() for v in vecs]
    opt = torch.optim.Adam(list(decoder.parameters()) + vecs, lr=1e-2)
    losses = []
    for _ in range(60):
        out = decoder.loss(decoder.encode(*vecs, index, MASK), gold, targets)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(float(out["loss"]))
    assert losses[-1] < 0.2 * losses[0]
    decoder.eval()
    state = decoder.encode(*vecs, index, MASK)
    expected = [[g for g in row if g >= 0] for row in gold.tolist()]
    assert decoder.greedy(state) == expected
    assert decoder.beam_search(state, 4) == expected


def test_twenty_step_procedure_decodes(decoder):
    mask = torch.ones(2, 20, dtype=torch.bool)
    state, _, (b, _, _) = _random_state(decoder, mask)
    assert len(b) == 2 * 380
    for order in decoder.beam_search(state, 16) + decoder.greedy(state):
        assert _is_permutation(order, 20)


# ---------------------------------------------------------------- the Lightning module over real encoders
TINY_BERT = dict(model_type="bert", vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=128, type_vocab_size=2)
TINY_VIT = dict(name="clip_vit_b32", vision_cfg=dict(width=64, layers=1, head_width=32, image_size=64, patch_size=16))


def _module(modality: str, **kwargs):
    from seqaware.modules.berson import BersonModule

    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text" if modality == "text" else "clipvil",
               "config": TINY_BERT, "tokenizer": "offline:minilm"}
    if modality != "text":
        encoder.update(visual=TINY_VIT, modality=modality)
    torch.manual_seed(0)
    return BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3},
                        decoder={"paragraph_heads": 4, "dropout": 0.0}, **kwargs)


def _batch(modality: str, n_steps=(5, 3), ragged: bool = False):
    """Shuffled procedures of ``n_steps`` steps, collated; random images unless text.  ``ragged``: steps of
    different lengths and no step cap (every step kept)."""
    from data_modules.collate import StepCollator
    from data_modules.views import SequencingView
    from seqaware.pretrained import load_tokenizer
    from seqaware.procedure import Procedure, Step

    def text(i: int, k: int) -> str:
        return f"step {i} of procedure {k} with " + ("some words " * (i % 3) if ragged else "some words")

    procs = [Procedure(id=f"p{k}", steps=[Step(text=text(i, k)) for i in range(n)]) for k, n in enumerate(n_steps)]
    caps = {"max_steps": max(n_steps)} if ragged else {}
    view = SequencingView(procs, seed=0, **caps)
    collate = StepCollator(tokenizer=load_tokenizer("offline:minilm"), image_size=64,
                           use_text=modality != "image", use_images=False, **caps)
    batch = collate([view[k] for k in range(len(procs))])
    if modality != "text":
        g = torch.Generator().manual_seed(0)
        B, S = batch["step_mask"].shape
        batch["pixel_values"] = torch.randn(B, S, 3, 64, 64, generator=g)
        batch["image_mask"] = batch["step_mask"].clone()
    return batch


@pytest.mark.parametrize("modality", ["text", "multimodal", "image"])
def test_pair_chunks_do_not_change_the_result(modality):
    batch = _batch(modality)
    small, large = _module(modality, pair_chunk=3).eval(), _module(modality, pair_chunk=1000).eval()
    large.load_state_dict(small.state_dict())
    with torch.no_grad():
        a, b = small.encode(batch), large.encode(batch)
    torch.testing.assert_close(a.context, b.context, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.pair_logits, b.pair_logits, rtol=1e-4, atol=1e-5)
    assert small.decode(a) == large.decode(b)
    assert [len(o) for o in small.decode(a)] == [5, 3]


def test_activation_checkpointing_gives_the_same_gradients():
    batch = _batch("multimodal")
    plain, ckpt = _module("multimodal", pair_chunk=4), _module("multimodal", pair_chunk=4, checkpoint_chunks=True)
    ckpt.load_state_dict(plain.state_dict())
    grads = []
    for m in (plain, ckpt):
        m.train()
        for mod in m.modules():  # deterministic forward: no dropout
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
        m.zero_grad()
        m._losses(batch)[0]["loss"].backward()
        grads.append({k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-6)


def test_text_pairs_use_bert_segments_and_images_are_encoded_once_per_step(monkeypatch):
    module = _module("multimodal").eval()
    batch = _batch("multimodal")
    calls = []
    original = module.encoder.visual_features
    monkeypatch.setattr(module.encoder, "visual_features", lambda px, *a: calls.append(px.shape[0]) or original(px, *a))
    with torch.no_grad():
        module.encode(batch)
    assert calls == [batch["step_mask"].numel()]  # one backbone call over the B * S step images, not per pair
    text = _module("text").eval()
    seen = {}
    forward = text.encoder.forward
    monkeypatch.setattr(text.encoder, "forward", lambda fi: seen.update(fi) or forward(fi))
    with torch.no_grad():
        text.encode(_batch("text", n_steps=(2,)))
    types, steps = seen["token_type_ids"], seen["text_step"]
    assert bool((types[steps == 0] == 0).all()) and bool((types[steps == 1] == 1).all())


def test_decoding_choice_is_validated():
    from seqaware.modules.berson import PROVIDES

    fitting = DECODERS.names(needs=set(PROVIDES))  # BERSON has a pointer network and pairwise logits
    assert {"beam", "greedy", "pairwise_greedy", "borda", "topological", "exact"} <= set(fitting)
    with pytest.raises(ValueError) as err:
        _module("text", decoding="viterbi")
    assert str(err.value) == ("model.decoding=viterbi is not a registered decoder; decoders that fit this model: "
                              + ", ".join(fitting))
    for name in fitting:
        module = _module("text", decoding=name).eval()
        with torch.no_grad():
            orders = module.decode(module.encode(_batch("text")))
        assert [sorted(o) for o in orders] == [list(range(5)), list(range(3))]


@pytest.mark.parametrize("new_layers_lr, lrs", [("encoder", [1e-3, 5e-3]), ("head", [1e-3, 5e-3]),
                                                  (2e-4, [1e-3, 5e-3, 2e-4])])
def test_new_layers_lr_puts_the_layers_the_encoder_adds_in_their_group(new_layers_lr, lrs):
    module = _module("multimodal", head_lr=5e-3, pair_encoding="joint", new_layers_lr=new_layers_lr)
    groups = module.param_groups()
    assert [g.get("lr", 1e-3) for g in groups] == lrs
    new = {id(p) for p in module.encoder.new_parameters()}
    assert new and sum(len(g["params"]) for g in groups) == len([p for p in module.parameters() if p.requires_grad])
    home = {"encoder": 0, "head": 1}.get(new_layers_lr, 2)
    assert {id(p) for p in groups[home]["params"]} >= new
    assert not any(id(p) in new for i, g in enumerate(groups) if i != home for p in g["params"])
    with pytest.raises(ValueError, match="model.new_layers_lr must be encoder, head or a positive learning rate, got 'fast'"):
        _module("text", new_layers_lr="fast")


def test_model_compile_puts_the_encoder_alone_under_torch_compile_and_keeps_the_checkpoint_keys():
    """``model.compile`` (the GPU speed switch of ``hparams=roc_base``): the encoder runs compiled, the BERSON network
    eagerly, and the state dict is the eager module's, so checkpoints load either way.  That a compiled encoder
    trains like the eager one: tests/test_master_weights.py (the same SeqawareModule.compile_encoder)."""
    eager, compiled = _module("text", pair_encoding="joint"), _module("text", pair_encoding="joint",
                                                                      compile={"dynamic": True})
    assert compiled.hparams.compile == {"dynamic": True} and eager.hparams.compile is False
    assert compiled.encoder._compiled_call_impl is not None and eager.encoder._compiled_call_impl is None
    assert compiled.decoder._compiled_call_impl is None and compiled.pair_states._compiled_call_impl is None
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    compiled.load_state_dict(eager.state_dict())
    with pytest.raises(ValueError, match=r"^model.compile must be true, false or a dict of torch.compile's arguments, "
                                         r"got 'yes'$"):
        _module("text", compile="yes")


@pytest.mark.parametrize("overrides, inference_mode", [
    (("experiment=berson_roc",), True),
    (("experiment=berson_roc", "model.compile={dynamic:true}"), False),
    (("experiment=berson_roc", "model.compile=true"), False),
    (("experiment=clipvil_pretrain", "model.compile=true"), False),
    (("experiment=teo_head_synthetic",), True),                        # a module without the switch
])
def test_a_compiled_encoder_is_evaluated_under_no_grad_so_the_test_reuses_its_graph(compose_train, overrides,
                                                                                      inference_mode):
    """Lightning evaluates under torch.inference_mode by default; its inference tensors fail the guards of the
    graph the fit's validation compiled, so a compiled run's test compiled the encoder a third time (seen with
    TORCH_LOGS=recompiles; about a minute for MPNet-base on a GPU).  With ``model.compile`` the trainer evaluates
    under no_grad."""
    assert compose_train(*overrides).trainer.inference_mode is inference_mode


def test_single_stream_encoder_text_ablation_has_no_visual_part():
    from seqaware.encoders import create_encoder

    enc = create_encoder("clipvil", modality="text", config=TINY_BERT, tokenizer="offline:minilm", visual=TINY_VIT)
    assert enc.visual is None and enc.visual_proj is None and not enc.uses_images
    assert not any("visual" in name for name, _ in enc.named_parameters())
    module = _module("text")
    module.encoder = enc
    module.decoder = type(module.decoder)(enc.hidden_size, paragraph_heads=4)
    with torch.no_grad():
        orders = module.eval().decode(module.encode(_batch("text")))
    assert [sorted(o) for o in orders] == [list(range(5)), list(range(3))]


def test_gradients_are_bitwise_repeatable_with_threads():
    """BERSON's backward is repeatable bit for bit on a multi-threaded CPU. Each step's image features
    feed 2(n-1) pairs, and the pointer reads the relation grid at repeated (instance, step) places.
    Gathered by advanced indexing (``IndexBackward0``), those gradients were added with parallel
    atomic adds, in an order that depends on thread timing: two fine-tuning runs of one seed drifted
    apart (the README's main job printed Acc 0.978 / 0.980). The graph must hold no such gather; the
    race itself shows only on an idle multi-core CPU, so the gradients are compared as well."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))
    try:
        module = _module("multimodal").train()
        batch = _batch("multimodal", n_steps=(8, 8, 8, 7))

        def backward():
            module.zero_grad(set_to_none=True)
            torch.manual_seed(1)  # the same dropout masks (attention dropout is no nn.Dropout module)
            loss = module._losses(batch)[0]["loss"]
            loss.backward(retain_graph=True)
            return loss, {k: p.grad.clone() for k, p in module.named_parameters() if p.grad is not None}

        loss, first = backward()
        nodes, stack = set(), [loss.grad_fn]
        while stack:
            fn = stack.pop()
            if fn is not None and fn not in nodes:
                nodes.add(fn)
                stack.extend(f for f, _ in fn.next_functions)
        assert "IndexBackward0" not in {type(fn).__name__ for fn in nodes}
        assert any(k.startswith("encoder.visual") for k in first)
        for _ in range(2):
            again = backward()[1]
            assert [k for k in first if not torch.equal(first[k], again[k])] == []
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- multi-reference targets (model.multi_reference_targets)
def _dag_batch():
    """Two procedures of the synthetic kind: two independent chains 0->1, 2->3 (6 valid orders) and a
    single chain of 3 steps (one order); shuffled into their input positions by the evaluation view."""
    from data_modules.collate import StepCollator
    from data_modules.views import SequencingView
    from seqaware.pretrained import load_tokenizer
    from seqaware.procedure import Procedure, Step

    procs = [Procedure(id="chains", steps=[Step(text=f"chain step {i}") for i in range(4)], dag=[(0, 1), (2, 3)]),
             Procedure(id="line", steps=[Step(text=f"line step {i}") for i in range(3)], dag=[(0, 1), (1, 2)])]
    view = SequencingView(procs, seed=3)
    collate = StepCollator(tokenizer=load_tokenizer("offline:minilm"), image_size=64, use_text=True, use_images=False)
    return collate([view[0], view[1]])


def _linear_extensions(n, edges):
    return [p for p in itertools.permutations(range(n)) if all(p.index(a) < p.index(b) for a, b in edges)]


def test_reference_targets_accept_every_order_the_dag_allows():
    batch = _dag_batch()
    next_ok, fixed = reference_targets(batch["gold"], batch["step_mask"], batch["meta"])
    assert next_ok.shape == fixed.shape == (2, 4, 4)
    for b, (n, edges) in enumerate([(4, [(0, 1), (2, 3)]), (3, [(0, 1), (1, 2)])]):
        perm = batch["meta"][b]["step_index"]            # input position -> original step
        orders = _linear_extensions(n, edges)            # brute force, independent of the view's enumeration
        assert len(batch["meta"][b]["references"]) == len(orders)
        for t in range(n):  # after the authored prefix 0..t-1, any order continuing it may put its t-th step next
            allowed = {o[t] for o in orders if list(o[:t]) == list(range(t))}
            assert {perm[j] for j in range(n) if next_ok[b, t, j]} == allowed
        for i, j in itertools.product(range(n), range(n)):
            agree = len({o.index(perm[i]) < o.index(perm[j]) for o in orders}) == 1
            assert bool(fixed[b, i, j]) == agree
    # the hand example: after step 0 of the two chains, 1 (its chain) or 2 (the other chain's head)
    inv = {orig: p for p, orig in enumerate(batch["meta"][0]["step_index"])}
    assert next_ok[0, 1].nonzero().flatten().tolist() == sorted([inv[1], inv[2]])
    assert bool(fixed[0, inv[0], inv[1]]) and not fixed[0, inv[0], inv[3]] and not fixed[0, inv[1], inv[2]]
    # padding rows of the short instance hold only their (padding) gold slot
    assert next_ok[1, 3].sum() == 1
    bad = [dict(m) for m in batch["meta"]]
    bad[1]["references"] = [[2, 1, 0]]
    with pytest.raises(ValueError, match="'line': its first reference"):
        reference_targets(batch["gold"], batch["step_mask"], bad)


def test_multi_reference_pointer_nll_is_the_mass_on_any_valid_next_step(decoder):
    batch = _dag_batch()
    gold, mask = batch["gold"], batch["step_mask"]
    state, _, _ = _random_state(decoder, mask, seed=1)
    targets, _ = pairwise_targets(gold, mask)
    next_ok, fixed = reference_targets(gold, mask, batch["meta"])
    logp = decoder.pointer_log_probs(state, gold).detach().double()
    multi = decoder.loss_terms(state, gold, targets, next_ok, fixed)
    authored = decoder.loss_terms(state, gold, targets)
    for b in range(2):
        n = int(mask[b].sum())
        expected = -sum(np.log(sum(np.exp(float(logp[b, t, j])) for j in range(n) if next_ok[b, t, j])) for t in range(n))
        assert float(multi["pointer_nll"][b]) == pytest.approx(expected, rel=1e-5)
    # one order (the chain): the same loss as BERSON's; two chains: less (more mass is right), fewer pairs
    assert float(multi["pointer_nll"][1]) == pytest.approx(float(authored["pointer_nll"][1]), rel=1e-6)
    assert float(multi["pointer_nll"][0]) < float(authored["pointer_nll"][0])
    assert multi["pairs"].tolist() == [4, 6] and authored["pairs"].tolist() == [12, 6]   # 2 chain pairs x 2 directions
    one_hot = torch.zeros_like(next_ok).scatter_(2, gold.clamp(min=0)[..., None], True)
    same = decoder.loss_terms(state, gold, targets, one_hot)
    assert torch.allclose(same["pointer_nll"], authored["pointer_nll"])


def test_module_trains_on_multi_reference_targets_with_finite_gradients():
    batch = _dag_batch()
    module = _module("text", multi_reference_targets=True)
    module.train()
    losses, _ = module._losses(batch)
    losses["loss"].backward()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    other = _module("text")  # the same initial weights, BERSON's targets
    module.eval(), other.eval()  # no dropout: the same pointer distributions
    with torch.no_grad():
        multi, authored = module._losses(batch)[0], other._losses(batch)[0]
    assert float(multi["pointer_loss"]) < float(authored["pointer_loss"])
    assert module.hparams.multi_reference_targets is True


def test_every_validation_metric_berson_logs_is_one_a_checkpoint_can_monitor():
    """The monitor check (seqaware/monitor.py) accepts only what ``validation_metrics()`` lists: BERSON's losses
    (``val/pointer_loss``, ``val/pair_loss``, ``val/pair_acc``) must be among them, or monitoring one is refused."""
    import pytorch_lightning as pl

    module = _module("text")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    loader = torch.utils.data.DataLoader([_batch("text")], batch_size=None)
    trainer.validate(module, dataloaders=loader, verbose=False)
    logged = {k for k in trainer.callback_metrics if k.startswith("val/")}
    assert {"val/pointer_loss", "val/pair_loss", "val/pair_acc", "val/loss", "val/pmr"} <= logged
    assert logged <= set(module.validation_metrics())
