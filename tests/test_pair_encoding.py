"""BERSON's pair encodings (``model.pair_encoding``): ``pairwise`` (n(n-1) encoder passes, the default)
and ``joint`` (one pass per procedure, pair states from step states; seqaware/encoders/steps.py)."""
from __future__ import annotations

import pytest
import torch

from decoders import PAIRWISE_DECODERS
from seqaware.encoders.base import pack_steps
from seqaware.encoders.steps import alternating_segments, encode_steps, step_windows
from seqaware.objectives.base import EncoderOutput
from test_berson import _batch as berson_batch
from test_berson import _module
from test_encoders import TINY_ENCODERS, fake_batch


def _batch(modality: str, n_steps=(5, 3)):
    """Shuffled procedures of ``n_steps`` steps of different lengths (no truncation), collated."""
    return berson_batch(modality, n_steps, ragged=True)


def _joint(modality: str = "text", **kwargs):
    return _module(modality, pair_encoding="joint", pair_dropout=0.0, **kwargs)


def _context_free(module) -> None:
    """Token state = word embedding: a step's state is the mean of its own word embeddings in any window."""
    emb = module.encoder.word_embeddings

    def forward(fusion):
        states = emb(fusion["input_ids"])
        return EncoderOutput(cls=states[:, 0], text_states=states)
    module.encoder.forward = forward  # type: ignore[method-assign]


def test_joint_states_have_the_pairwise_shapes_and_masks_for_mixed_lengths():
    batch = _batch("text", n_steps=(5, 3, 2))
    joint, pairwise = _joint().eval(), _module("text").eval()
    with torch.no_grad():
        a, b = joint.encode(batch), pairwise.encode(batch)
        steps = encode_steps(joint.encoder, batch, 512)
    mask = batch["step_mask"]
    assert steps.shape == (3, 5, 32) and torch.equal(steps.abs().sum(-1) > 0, mask)   # padding slots: 0
    for name in ("context", "paragraph", "relations", "pair_logits", "step_mask"):
        assert getattr(a, name).shape == getattr(b, name).shape, name
    valid = mask[:, :, None] & mask[:, None, :] & ~torch.eye(5, dtype=torch.bool)
    assert torch.equal(a.relations.abs().sum(-1) > 0, valid)                          # padding / diagonal: 0
    assert torch.equal(a.pair_logits != 0, valid)
    assert not a.context[~mask].any() and a.context[mask].abs().sum(-1).gt(0).all()


def test_hand_set_pair_scores_decode_to_the_same_order_through_both_paths():
    batch = _batch("text", n_steps=(6, 4))
    gold = batch["gold"]
    rank = torch.full(gold.shape, 99)                        # rank[b, step] = its place in the gold order
    for k, row in enumerate(gold.tolist()):
        for place, step in enumerate(s for s in row if s >= 0):
            rank[k, step] = place
    scores = (rank[:, None, :] - rank[:, :, None]).float()  # > 0: i before j
    orders = {}
    for name, module in (("joint", _joint()), ("pairwise", _module("text"))):
        with torch.no_grad():
            state = module.eval().encode(batch)
        state.pair_logits = scores * (state.pair_logits != 0)   # the pairs the state marks valid, hand-set
        orders[name] = {dec: fn(state.pair_logits, state.step_mask) for dec, fn in PAIRWISE_DECODERS.items()}
    expected = [[s for s in row if s >= 0] for row in gold.tolist()]
    for dec in PAIRWISE_DECODERS:
        assert orders["joint"][dec] == orders["pairwise"][dec] == expected, dec


def test_pointer_decoders_run_on_the_joint_state():
    module = _joint(decoding="beam", beam_size=4).eval()
    batch = _batch("text", n_steps=(5, 3))
    with torch.no_grad():
        state = module.encode(batch)
        beam, greedy = module.decode(state), module.decoder.greedy(state)
    assert [sorted(o) for o in beam] == [sorted(o) for o in greedy] == [list(range(5)), list(range(3))]
    assert module.decoder.beam_search(state, 1) == greedy


def test_a_tiny_joint_run_learns():
    module = _joint().train()
    batch = _batch("text", n_steps=(5, 4))
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss = module._losses(batch)[0]["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses


def test_multi_reference_targets_train_under_joint():
    from test_berson import _dag_batch

    module = _joint(multi_reference_targets=True).train()
    loss = module._losses(_dag_batch())[0]["loss"]
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


def test_windowing_takes_every_step_once_and_keeps_its_state():
    module = _joint(joint_max_tokens=40).eval()
    _context_free(module)
    n = 12
    batch = _batch("text", n_steps=(n, 3))
    lengths = (batch["attention_mask"].sum(-1) - 1)[0, :n].tolist()
    windows = step_windows(lengths, 39)
    assert len(windows) > 1                                                   # the budget forces windows
    assert [i for _, _, s, e in windows for i in range(s, e)] == list(range(n))  # each step owned once, in order
    assert all(sum(lengths[start:end]) <= 39 for start, end, _, _ in windows)
    calls = []
    forward = module.encoder.forward
    module.encoder.forward = lambda fusion: calls.append(fusion["input_ids"].shape[0]) or forward(fusion)  # type: ignore[method-assign]
    with torch.no_grad():
        windowed = encode_steps(module.encoder, batch, 40)
        whole = encode_steps(module.encoder, batch, 512)
    assert calls == [len(windows) + 1, 2]                                      # one pass: every window of the batch
    torch.testing.assert_close(windowed, whole)
    emb = module.encoder.word_embeddings
    for k in range(n):                                                        # the mean of the step's own word pieces
        ids = batch["input_ids"][0, k][batch["attention_mask"][0, k].bool()][1:-1]
        torch.testing.assert_close(windowed[0, k], emb(ids).mean(0))


def test_windows_respect_the_step_embedding_table():
    windows = step_windows([3] * 20, 1000, max_steps=6)
    assert all(e - s <= 6 for s, e, _, _ in windows)
    assert [i for _, _, s, e in windows for i in range(s, e)] == list(range(20))
    assert step_windows([3] * 5, 1000, max_steps=6) == [(0, 5, 0, 5)]
    module = _joint("multimodal").eval()                                      # step embedding table of 4 steps
    module.encoder.max_steps = 4
    with torch.no_grad():
        state = module.encode(_batch("multimodal", n_steps=(9, 3)))
    assert state.context.shape[:2] == (2, 9)


def test_a_step_over_the_budget_names_the_config_key():
    module = _joint(joint_max_tokens=4).eval()
    with pytest.raises(ValueError, match="model.joint_max_tokens"):
        module.encode(_batch("text", n_steps=(3,)))


@pytest.mark.parametrize("name", sorted(TINY_ENCODERS))
def test_every_encoder_kind_trains_under_joint(name):
    from seqaware.modules.berson import BersonModule

    torch.manual_seed(0)
    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": name, **TINY_ENCODERS[name]}
    module = BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3},
                          decoder={"paragraph_heads": 4, "dropout": 0.0}, pair_encoding="joint").train()
    batch = fake_batch()                                     # a step without image, a padding step, boxes
    batch["gold"] = torch.tensor([[2, 0, 1], [1, 0, -1]])
    batch["meta"] = [{}, {}]
    loss = module._losses(batch)[0]["loss"]
    loss.backward()
    assert torch.isfinite(loss)
    grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    assert any(n.startswith("encoder.") and g.abs().sum() > 0 for n, g in grads.items())
    assert any(n.startswith("pair_states.") for n in grads)
    if module.encoder.uses_images and getattr(module.encoder, "visual", None) is not None:
        assert any(n.startswith("encoder.visual") and g.abs().sum() > 0 for n, g in grads.items())


def test_alternating_segments_mark_every_other_step():
    # two procedures: steps of 2, 1, 2 word pieces and of 1, 1 ([CLS] w [SEP] per step, right-padded)
    ids = torch.tensor([[[101, 7, 8, 102], [101, 9, 102, 0], [101, 10, 11, 102]],
                        [[101, 12, 102, 0], [101, 13, 102, 0], [0, 0, 0, 0]]])
    mask = (ids > 0).long()
    packed = pack_steps(ids, mask, torch.tensor([[1, 1, 1], [1, 1, 0]]), 101, 0)
    assert packed["input_ids"].tolist() == [[101, 7, 8, 102, 9, 102, 10, 11, 102], [101, 12, 102, 13, 102, 0, 0, 0, 0]]
    types = alternating_segments(packed["text_step"], packed["attention_mask"])
    assert types.tolist() == [[0, 0, 0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 0, 0, 0, 0]]   # a [SEP] goes with its step
    module = _joint(joint_segments="alternating").eval()
    seen = []
    forward = module.encoder.forward
    module.encoder.forward = lambda fusion: seen.append(fusion) or forward(fusion)  # type: ignore[method-assign]
    batch = _batch("text", n_steps=(5, 3))
    with torch.no_grad():
        alternating = encode_steps(module.encoder, batch, 512, segments="alternating")
        plain = encode_steps(module.encoder, batch, 512)
        module.encode(batch)
    assert torch.equal(seen[0]["token_type_ids"], alternating_segments(seen[0]["text_step"], seen[0]["attention_mask"]))
    assert "token_type_ids" not in seen[1] and torch.equal(seen[2]["token_type_ids"], seen[0]["token_type_ids"])
    assert seen[0]["token_type_ids"].max() == 1 and not torch.allclose(alternating, plain)
    with pytest.raises(ValueError, match="model.joint_segments=alternating needs .* a text-only encoder"):
        _joint("multimodal", joint_segments="alternating")
    with pytest.raises(ValueError, match="model.joint_segments=alternating needs model.pair_encoding=joint"):
        _module("text", joint_segments="alternating")
    with pytest.raises(ValueError, match="text-only encoder with two token types"):
        encode_steps(_joint("multimodal").encoder, _batch("multimodal"), 512, segments="alternating")
    with pytest.raises(ValueError, match="model.joint_segments"):
        _joint(joint_segments="interval")


def test_segments_are_refused_when_the_module_is_built_for_a_model_without_two_token_types():
    """MPNet embeds no token types (RoBERTa one): BERT4SO's segments cannot be honoured, so building the module
    fails naming the key, instead of training with the option silently ignored."""
    from seqaware.modules.berson import BersonModule
    from test_encoders import TINY_MPNET_CFG

    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text", "config": TINY_MPNET_CFG,
               "tokenizer": "offline:minilm", "name_or_path": "offline:mpnet"}
    with pytest.raises(ValueError, match=r"model.joint_segments=alternating needs a text model with two token types.*"
                                         r"'offline:mpnet' has 0.*set model.joint_segments=none"):
        BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3},
                     pair_encoding="joint", joint_segments="alternating")
    module = BersonModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3}, pair_encoding="joint")
    batch = _batch("text")
    with torch.no_grad():
        assert torch.isfinite(encode_steps(module.encoder, batch, 512)).all()


def test_pairwise_stays_the_default_and_has_no_pair_module():
    module = _module("text")
    assert module.pair_encoding == "pairwise" and module.pair_states is None
    assert not any(k.startswith("pair_states") for k in module.state_dict())


def test_a_bad_pair_encoding_is_named():
    with pytest.raises(ValueError, match="model.pair_encoding"):
        _module("text", pair_encoding="bad")
    with pytest.raises(ValueError, match="model.joint_max_tokens"):
        _module("text", pair_encoding="joint", joint_max_tokens=1)


def test_test_views_permute_each_procedure_by_its_id_and_keep_padding():
    from seqaware.modules.berson import view_permutations

    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    perms = view_permutations(["a", "b"], mask, 4)
    assert perms.shape == (4, 2, 5) and torch.equal(perms[0], torch.arange(5).repeat(2, 1))
    for k in range(1, 4):
        assert sorted(perms[k, 0].tolist()) == list(range(5))
        assert sorted(perms[k, 1, :3].tolist()) == [0, 1, 2] and perms[k, 1, 3:].tolist() == [3, 4]
    assert len({tuple(perms[k, 0].tolist()) for k in range(4)}) > 1
    # a procedure's views do not depend on its batch
    alone = view_permutations(["b"], mask[1:], 4)
    assert torch.equal(alone[:, 0], perms[:, 1])


def test_test_views_keep_the_proposal_with_the_best_summed_log_probability():
    """An independent vote: every view's proposal re-scored by the teacher-forced pointer NLL of
    ``_loss_terms`` on an explicitly re-ordered batch."""
    from seqaware.modules.berson import view_permutations

    batch = _batch("text", n_steps=(5, 4, 3))
    module = _joint(decoding="beam", beam_size=3, test_views=3).eval()
    with torch.no_grad():
        voted = module.decode_views(batch, module.encode(batch))
        perms = view_permutations([m["id"] for m in batch["meta"]], batch["step_mask"], 3)
        views = []
        for k in range(3):
            shown = {key: (torch.stack([v[b, perms[k, b]] for b in range(len(v))])
                           if key in ("input_ids", "attention_mask") else v) for key, v in batch.items()}
            views.append(shown)
        proposals = [[] for _ in range(3)]
        for k, shown in enumerate(views):
            for b, order in enumerate(module.decode(module.encode(shown))):
                proposals[b].append([int(perms[k, b, p]) for p in order])

        @torch.no_grad()
        def nll(b: int, order: list[int]) -> float:
            total = 0.0
            for k, shown in enumerate(views):
                slot = {int(p): v for v, p in enumerate(perms[k, b].tolist())}
                gold = torch.full_like(shown["gold"], -1)
                gold[b, :len(order)] = torch.tensor([slot[p] for p in order])
                for other in range(len(gold)):  # other rows: any valid order (their NLL is not read)
                    if other != b:
                        gold[other] = shown["gold"][other]
                t, _ = module._loss_terms(dict(shown, gold=gold))
                total += float(t["pointer_nll"][b])
            return total

    for b in range(3):
        assert sorted(voted[b]) == list(range(len(voted[b]))) and voted[b] in proposals[b]
        assert nll(b, voted[b]) == pytest.approx(min(nll(b, c) for c in proposals[b]), abs=1e-4)
    single = _joint(decoding="beam", beam_size=3).eval()
    single.load_state_dict(module.state_dict())
    with torch.no_grad():
        assert single.decode(single.encode(batch)) == [proposals[b][0] for b in range(3)]


@pytest.mark.parametrize("decoding", sorted(PAIRWISE_DECODERS))
def test_test_views_average_pair_scores_in_the_input_positions(decoding):
    batch = _batch("text", n_steps=(6, 4))
    rank = torch.full(batch["gold"].shape, 99)              # rank[b, position] = its place in the gold order
    for k, row in enumerate(batch["gold"].tolist()):
        for place, step in enumerate(s for s in row if s >= 0):
            rank[k, step] = place
    batch["rank"] = rank                                    # a per-step tensor: every view re-orders it
    module = _joint(decoding=decoding, test_views=4).eval()
    encode = module.encode

    def hand_set(shown):
        state = encode(shown)
        r = shown["rank"].float()
        state.pair_logits = (r[:, None, :] - r[:, :, None]) * (state.pair_logits != 0)
        return state
    module.encode = hand_set  # type: ignore[method-assign]
    with torch.no_grad():
        orders = module.decode_views(batch, module.encode(batch))
    assert orders == [[s for s in row if s >= 0] for row in batch["gold"].tolist()]


def test_test_views_need_the_joint_encoding():
    with pytest.raises(ValueError, match="model.test_views"):
        _module("text", test_views=2)
    with pytest.raises(ValueError, match="model.test_views"):
        _joint(test_views=0)


# ---------------------------------------------------------------- the joint window: text + image tokens of a step
def test_the_visual_tokens_of_a_step_image_for_each_encoder_kind(tmp_path):
    """One count for the setup check and encode_steps: P per image slot and the real tokens of a step's image."""
    from types import SimpleNamespace

    from seqaware.encoders import create_encoder
    from seqaware.encoders.base import step_visual_features
    from seqaware.encoders.regions import RegionFeatureCache
    from seqaware.encoders.steps import image_tokens, visual_slot_tokens
    from seqaware.procedure import Step

    collator = SimpleNamespace(max_boxes=4, use_images=True, transform=SimpleNamespace(size=64), region_cache=None)
    batch = fake_batch()                                                  # 64-px images, up to 4 boxes
    vit = create_encoder("clipvil", **TINY_ENCODERS["clipvil"])          # 64 px, 16-px patches: CLS + 16
    cnn = create_encoder("clipvil", **dict(TINY_ENCODERS["visualbert"],   # EfficientNet grid at 64 px: 2 x 2
                                           visual=dict(TINY_ENCODERS["visualbert"]["visual"], freeze_bn=False)))
    boxes = create_encoder("visualbert", **TINY_ENCODERS["visualbert"])  # whole image + max_boxes (4) regions
    detector = create_encoder("visualbert", config=TINY_ENCODERS["text"]["config"], tokenizer="offline:minilm",
                              visual=None, visual_feature_dim=8)
    cnn.train()             # the probe that counts P must not move a training CNN's BatchNorm statistics
    before = {k: v.clone() for k, v in cnn.visual.state_dict().items()}
    assert [visual_slot_tokens(e, collator) for e in (vit, cnn, boxes, detector)] == [17, 4, 5, 5]
    assert all(torch.equal(v, before[k]) for k, v in cnn.visual.state_dict().items()) and cnn.visual.training
    with torch.no_grad():   # what the encoders give the collated batch
        assert [step_visual_features(e, batch)[0].shape[2] for e in (vit, cnn, boxes)] == [17, 4, 5]

    image, two_boxes = Step(text="a", images=["a.png"]), Step(text="b", images=["b.png"], boxes=[[0, 0, 4, 4]] * 2)
    five_boxes, no_image = Step(text="c", images=["c.png"], boxes=[[0, 0, 4, 4]] * 5), Step(text="d")
    assert [image_tokens(vit, collator, s, None, 17) for s in (image, two_boxes, no_image)] == [17, 17, 0]
    assert [image_tokens(boxes, collator, s, None, 5) for s in (image, two_boxes, five_boxes, no_image)] == [1, 3, 5, 0]
    collator.region_cache = RegionFeatureCache(tmp_path / "regions", max_regions=4)
    (tmp_path / "regions").mkdir()
    torch.save({"image_feature": torch.zeros(8), "features": torch.zeros(2, 8), "boxes": torch.zeros(2, 4)},
               collator.region_cache.file(tmp_path / "a.png"))
    assert image_tokens(detector, collator, image, str(tmp_path), 5) == 3          # the file's 2 regions + the image
    assert image_tokens(detector, collator, image, str(tmp_path), 5, read=False) == 5   # unread: the most it may give
    collator.use_images = False
    assert image_tokens(vit, collator, image, None, 17) == 0


def test_step_lengths_pack_text_without_its_cls_and_images_per_slot_or_per_image():
    from seqaware.encoders import create_encoder
    from seqaware.encoders.steps import step_lengths

    text, visual = torch.tensor([5, 3, 0]), torch.tensor([4, 0, 0])   # the last slot: padding
    kwargs = dict(TINY_ENCODERS["clipvil"], step_embedding=False)
    per_image = create_encoder("clipvil", visual_positions="image", **kwargs)
    sequence = create_encoder("clipvil", visual_positions="sequence", **kwargs)
    only_text = create_encoder("text", **TINY_ENCODERS["text"])
    only_images = create_encoder("image", **TINY_ENCODERS["image"])
    assert step_lengths(per_image, text, visual, 4).tolist() == [8, 2, 0]
    assert step_lengths(sequence, text, visual, 4).tolist() == [8, 6, 4]    # every slot's P positions
    assert step_lengths(only_text, text, visual, 4).tolist() == [4, 2, 0]
    assert step_lengths(only_images, text, visual, 4).tolist() == [4, 0, 0]


class _FirstStep(Exception):
    """Raised by the first training step: the setup checks let the run through."""


def test_the_joint_window_check_counts_a_multimodal_steps_image_tokens(compose_train, monkeypatch):
    """joint_max_tokens=20 holds 19 tokens after [CLS]: every step's text fits (the tiny world's longest packs to
    18), text + the 4 grid tokens of its 64-px image do not.  The multimodal run is refused when the fit starts,
    naming the procedure, step, split and keys; the text-only encoder with the same setting reaches its first step."""
    import re

    import train
    from conftest import TINY_BERT

    def first_step(*args, **kwargs):
        raise _FirstStep
    monkeypatch.setattr(type(_module("text")), "training_step", first_step)
    overrides = ["experiment=berson_finetune", "model.pair_encoding=joint", "model.joint_max_tokens=20",
                 f"model.encoder.config={TINY_BERT}", "data.collator.image_size=64", "trainer.max_steps=2"]
    datamodule, model, trainer = train.build(compose_train(*overrides))
    with pytest.raises(ValueError) as err:
        trainer.fit(model, datamodule=datamodule)
    said = re.fullmatch(
        r"model\.joint_max_tokens=20: step (\d) of procedure '(.+)' \((train|val|test) split\) packs to (\d+) tokens "
        r"and a window holds 19 after its \[CLS\] \((\d+) text \+ 4 visual tokens of its image; the encoder's "
        r"positions allow 128\): raise model\.joint_max_tokens or lower data\.collator\.max_tokens \(now 60\) or "
        r"data\.collator\.image_size \(now 64: 4 visual tokens per image\)", str(err.value))
    assert said, str(err.value)
    k, pid, split, total, text = said.groups()
    step = next(p for p in datamodule.datasets[split].procedures if p.id == pid).steps[int(k)]
    assert step.images and int(text) == len(datamodule.collator.tokens.ids([step.text], 60, 5)[0]) - 1
    assert int(text) <= 19 < int(total) == int(text) + 4
    datamodule, model, trainer = train.build(compose_train(*overrides, "modality=text"))
    with pytest.raises(_FirstStep):
        trainer.fit(model, datamodule=datamodule)


def test_the_joint_window_check_covers_image_only_encoders(compose_train):
    """Image-only: a window of joint_max_tokens=4 holds 3 tokens after [CLS], a 64-px image gives 4 grid tokens."""
    import train

    overrides = ["experiment=berson_finetune", "model.pair_encoding=joint", "model.joint_max_tokens=4",
                 "data.collator.image_size=64", "trainer.max_steps=2", "modality=image"]
    datamodule, model, trainer = train.build(compose_train(*overrides))
    with pytest.raises(ValueError) as err:
        trainer.fit(model, datamodule=datamodule)
    assert str(err.value).startswith("model.joint_max_tokens=4: step 0 of procedure ")
    assert str(err.value).endswith("packs to 4 tokens and a window holds 3 after its [CLS] (4 visual tokens of its "
                                   "image; the encoder's positions allow 512): raise model.joint_max_tokens or lower "
                                   "data.collator.image_size (now 64: 4 visual tokens per image)")


def test_the_joint_window_check_names_the_step_and_counts_only_real_images():
    """Text-only: the text key alone.  Multimodal (CLS + 16 ViT patches of a 64-px image): a step without an
    image takes its text alone; the first step whose text + image tokens break the window is named."""
    from types import SimpleNamespace

    from data_modules.collate import StepCollator
    from data_modules.views import SequencingView
    from seqaware.pretrained import load_tokenizer
    from seqaware.procedure import Procedure, Step

    words = "one two three four five six seven eight nine ten"
    procs = [Procedure(id="p0", steps=[Step(text=words), Step(text="a b", images=["x.png"])]),
             Procedure(id="p1", steps=[Step(text="short"), Step(text="a b c d", images=["y.png"])])]
    collator = StepCollator(load_tokenizer("offline:minilm"), image_size=64)
    dm = SimpleNamespace(collator=collator, datasets={"val": SequencingView(procs)})
    with pytest.raises(ValueError) as err:
        _joint(joint_max_tokens=11)._check_joint_budget(dm)        # 10 words + [SEP]: 11 > 10 after [CLS]
    assert str(err.value) == (
        "model.joint_max_tokens=11: step 0 of procedure 'p0' (val split) packs to 11 tokens and a window holds 10 "
        "after its [CLS] (the encoder's positions allow 128): raise model.joint_max_tokens or lower "
        "data.collator.max_tokens (now 60)")
    _joint(joint_max_tokens=12)._check_joint_budget(dm)            # fits
    _joint("multimodal", joint_max_tokens=23)._check_joint_budget(dm)   # 22 after [CLS]: p0's 10 words have no image
    with pytest.raises(ValueError) as err:
        _joint("multimodal", joint_max_tokens=22)._check_joint_budget(dm)
    assert str(err.value) == (
        "model.joint_max_tokens=22: step 1 of procedure 'p1' (val split) packs to 22 tokens and a window holds 21 "
        "after its [CLS] (5 text + 17 visual tokens of its image; the encoder's positions allow 128): raise "
        "model.joint_max_tokens or lower data.collator.max_tokens (now 60) or data.collator.image_size (now 64: 17 "
        "visual tokens per image)")
