"""Task views and the collator: permutations, references, masks, length policy, missing images."""
from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from data_modules.collate import StepCollator, StepTokens, first_sentences
from data_modules.images import ImageLoadError
from data_modules.sampling import EpochSampler
from data_modules.views import PretrainingView, SequencingView
from seqaware.pretrained import load_tokenizer
from seqaware.procedure import Procedure, Step


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("offline:minilm")


def _proc(pid: str, n: int, root, dag=None, alternatives=None, image=True) -> Procedure:
    steps = [Step(text=f"Step {pid} number {i}. Second sentence. Third!", images=["img.png"] if image else [],
                  boxes=[[0, 0, 8, 4]], box_labels=["x"]) for i in range(n)]
    return Procedure(id=pid, steps=steps, split="train", category=["cat"], dag=dag, alternatives=alternatives, root=str(root))


@pytest.fixture
def root(tmp_path):
    Image.new("RGB", (16, 8), "blue").save(tmp_path / "img.png")
    return tmp_path


def test_sequencing_view_permutation_and_references(root):
    # 0 -> 2, 1 -> 2, 3 independent: linear extensions = orders of {0,1,3} with 2 after 0 and 1
    proc = _proc("a", 4, root, dag=[(0, 2), (1, 2)])
    view = SequencingView([proc], seed=3)
    item = view[0]
    assert sorted(item.step_index) == [0, 1, 2, 3]
    # gold[k] is the input position of authored step k
    assert [item.step_index[p] for p in item.gold] == [0, 1, 2, 3]
    expected = [list(p) for p in itertools.permutations(range(4))
                if p.index(2) > p.index(0) and p.index(2) > p.index(1)]
    assert item.references[0] == [0, 1, 2, 3]
    assert sorted(map(tuple, item.references)) == sorted(map(tuple, expected))
    # evaluation permutation is fixed; training reshuffles per epoch but is reproducible
    assert view[(0, 5)].step_index == item.step_index
    train = SequencingView([proc], seed=3, reshuffle=True)
    perms = {tuple(train[(0, e)].step_index) for e in range(20)}
    assert len(perms) > 3
    # the permutation of epoch 7 is a pure function of (seed, procedure id, epoch): a view built
    # afresh (another process, a resumed run) gives the same one, and it is the documented draw
    # default_rng([crc32, adler32] of "3\x1fa\x1f7").permutation(4), derived here independently
    key = "3\x1fa\x1f7".encode()
    expected_perm = np.random.default_rng([zlib.crc32(key), zlib.adler32(key)]).permutation(4).tolist()
    fresh = SequencingView([_proc("a", 4, root, dag=[(0, 2), (1, 2)])], seed=3, reshuffle=True)
    assert train[(0, 7)].step_index == expected_perm == fresh[(0, 7)].step_index
    assert sorted(expected_perm) == [0, 1, 2, 3]


def test_gold_is_the_inverse_permutation_hand_checked(root, monkeypatch):
    """With a known permutation, every field of the item is checked by hand."""
    import data_modules.views.sequencing as views

    class Fixed:
        def permutation(self, n):
            return np.array([2, 0, 3, 1])

    monkeypatch.setattr(views, "_rng", lambda *keys: Fixed())
    proc = _proc("h", 4, root, dag=[(0, 1)])
    item = SequencingView([proc])[0]
    assert item.step_index == [2, 0, 3, 1]            # input position p shows authored step perm[p]
    # authored step 0 is at position 1, step 1 at 3, step 2 at 0, step 3 at 2
    assert item.gold == [1, 3, 0, 2]
    assert [s.text.split()[3] for s in item.steps] == ["2.", "0.", "3.", "1."]
    assert item.dag == (4, [(0, 1)])


def test_max_steps_boundary(root):
    """Exactly max_steps steps is kept whole; one more is truncated (or skipped)."""
    exact, over = _proc("exact", 5, root, dag=[(3, 4)]), _proc("over", 6, root, dag=[(3, 4), (4, 5)])
    view = SequencingView([exact, over], max_steps=5)
    assert view.truncated == 1 and view.dropped == {"fewer_than_2_steps": 0, "too_long": 0}
    assert sorted(view[0].step_index) == [0, 1, 2, 3, 4] and view[0].dag == (5, [(3, 4)])
    assert sorted(view[1].step_index) == [0, 1, 2, 3, 4] and view[1].dag == (5, [(3, 4)])
    skip = SequencingView([exact, over], max_steps=5, too_long="skip")
    assert [p.id for p in skip.procedures] == ["exact"] and skip.dropped["too_long"] == 1
    # 2 steps is the smallest procedure kept; 1 is dropped
    two = SequencingView([_proc("two", 2, root), _proc("one", 1, root)], max_steps=2)
    assert [p.id for p in two.procedures] == ["two"] and two.dropped["fewer_than_2_steps"] == 1
    with pytest.raises(ValueError, match="data.view.max_steps must be >= 2, got 1"):
        SequencingView([exact], max_steps=1)
    with pytest.raises(ValueError, match="data.view.too_long must be 'truncate' or 'skip', got 'cut'"):
        SequencingView([exact], too_long="cut")
    pre = PretrainingView([exact], max_steps=5, min_steps=5)
    assert [pre[(0, e)].step_index for e in range(3)] == [[0, 1, 2, 3, 4]] * 3
    with pytest.raises(ValueError, match=r"need 2 <= data.view.min_steps <= data.view.max_steps, got 6, 5"):
        PretrainingView([exact], max_steps=5, min_steps=6)


def test_collator_values_hand_computed(root, tokenizer):
    """Pixels of a known colour, gold padding and the max_steps guard, against hand-computed values."""
    proc = _proc("c", 2, root)
    item = SequencingView([proc])[0]
    coll = StepCollator(tokenizer, max_steps=2, image_size=4, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
    batch = coll([item])
    # img.png is pure blue (0, 0, 255): (x / 255 - 0.5) / 0.5 = -1, -1, +1 at every pixel
    assert batch["pixel_values"].shape == (1, 2, 3, 4, 4)
    assert torch.equal(batch["pixel_values"][0, 0, :, 2, 2], torch.tensor([-1.0, -1.0, 1.0]))
    assert batch["gold"].tolist() == [item.gold] and sorted(item.gold) == [0, 1]
    assert batch["num_steps"].tolist() == [2]
    # text: at most 5 sentences, and [CLS] ... [SEP] around the word pieces
    ids = batch["input_ids"][0, item.step_index.index(0)]
    expected = tokenizer("Step c number 0. Second sentence. Third!")["input_ids"]
    assert ids[: len(expected)].tolist() == expected
    long_item = SequencingView([_proc("d", 3, root)], max_steps=3)[0]
    with pytest.raises(ValueError, match="instance with 3 steps exceeds data.collator.max_steps=2"):
        coll([long_item])
    with pytest.raises(ValueError, match="data.collator.missing_image must be 'error' or 'blank', got 'skip'"):
        StepCollator(tokenizer, missing_image="skip")
    with pytest.raises(ValueError, match=r"data.collator.use_text=true needs a tokenizer \(data.tokenizer\)"):
        StepCollator(None)


def test_explicit_alternatives_are_references(root):
    proc = _proc("b", 3, root, alternatives=[[1, 0, 2]])
    assert SequencingView([proc])[0].references == [[0, 1, 2], [1, 0, 2]]


def test_length_policy(root, caplog):
    procs = [_proc("one", 1, root), _proc("long", 7, root, dag=[(0, 6), (1, 2)]), _proc("ok", 3, root)]
    trunc = SequencingView(procs, max_steps=5, too_long="truncate")
    assert len(trunc) == 2 and trunc.dropped["fewer_than_2_steps"] == 1 and trunc.truncated == 1
    long_item = trunc[0]
    assert len(long_item.steps) == 5
    assert long_item.dag == (5, [(1, 2)])  # the edge to the dropped step 6 is gone
    skip = SequencingView(procs, max_steps=5, too_long="skip")
    assert len(skip) == 1 and skip.dropped == {"fewer_than_2_steps": 1, "too_long": 1}
    assert "dropped" in caplog.text


def test_pretraining_view_windows(root):
    view = PretrainingView([_proc("p", 5, root, dag=[(0, 1), (1, 4)])], max_steps=4, min_steps=2)
    lengths = set()
    for epoch in range(30):
        item = view[(0, epoch)]
        lengths.add(len(item.steps))
        assert item.gold == list(range(len(item.steps)))
        assert item.step_index == list(range(item.step_index[0], item.step_index[0] + len(item.steps)))
    assert lengths == {2, 3, 4}


def test_pretraining_view_sub_sampled_steps_keep_their_order_and_the_dag(root):
    """contiguous=False: any 2..4 of the 5 steps, kept in authored order, with the DAG restricted to
    them (0 -> 1 -> 4 gives 0 -> 4 when step 1 is left out); every pair of steps is drawn, not only
    neighbours; the draw is a function of (seed, epoch, index)."""
    proc = _proc("p", 5, root, dag=[(0, 1), (1, 4)])
    view = PretrainingView([proc], max_steps=4, min_steps=2, contiguous=False)
    pairs, gaps = set(), set()
    for epoch in range(200):
        item = view[(0, epoch)]
        kept = item.step_index
        assert kept == sorted(kept) and len(set(kept)) == len(kept) and 2 <= len(kept) <= 4
        assert item.gold == list(range(len(kept)))
        expected = {(kept.index(a), kept.index(b)) for a, b in [(0, 1), (1, 4), (0, 4)]
                    if a in kept and b in kept and not (a == 0 and b == 4 and 1 in kept)}
        assert set(map(tuple, item.dag[1])) == expected
        if len(kept) == 2:
            pairs.add(tuple(kept))
        gaps.update(b - a for a, b in zip(kept, kept[1:]))
        assert view[(0, epoch)].step_index == kept
    assert len(pairs) == 10 and max(gaps) >= 3  # all C(5, 2) pairs, some far apart


def test_collator_shapes_and_masks(root, tokenizer):
    items = [SequencingView([_proc("a", 3, root)])[0], SequencingView([_proc("b", 5, root)])[0]]
    coll = StepCollator(tokenizer, max_tokens=12, image_size=32, max_boxes=2)
    batch = coll(items)
    assert batch["input_ids"].shape[:2] == (2, 5) and batch["input_ids"].shape[2] <= 12
    assert batch["step_mask"].tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    assert batch["pixel_values"].shape == (2, 5, 3, 32, 32)
    assert batch["image_mask"].tolist() == batch["step_mask"].tolist()
    assert batch["gold"][0, 3:].tolist() == [-1, -1]
    assert batch["boxes"].shape == (2, 5, 2, 4)
    assert torch.allclose(batch["boxes"][0, 0, 0], torch.tensor([0.0, 0.0, 0.5, 0.5]))
    assert batch["box_mask"][0, 0].tolist() == [True, False]
    # padded step slots have no real tokens beyond [CLS] [SEP]
    assert batch["attention_mask"][0, 4].sum() == 2


def test_decoded_image_cache_gives_the_same_pixels_decodes_once_and_stays_in_budget(tmp_path, tokenizer, monkeypatch):
    """data.collator.image_cache_mb: the batch is bit for bit the uncached one (and the transform's own
    output), a cached image is not opened again, and the least recently used image leaves first."""
    import data_modules.collate as collate_module
    from data_modules.images import ImageTransform

    rng = np.random.default_rng(0)
    names = [f"img{k}.png" for k in range(4)]
    for name in names:
        Image.fromarray(rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)).save(tmp_path / name)
    proc = Procedure(id="c", steps=[Step(text=f"s{k}.", images=[name]) for k, name in enumerate(names)],
                     split="train", root=str(tmp_path))
    item = SequencingView([proc])[0]
    opened: list[str] = []
    real_open = collate_module.open_rgb
    monkeypatch.setattr(collate_module, "open_rgb", lambda path: opened.append(str(path)) or real_open(path))
    plain = StepCollator(tokenizer, image_size=16, image_cache_mb=0)
    cached = StepCollator(tokenizer, image_size=16)
    expected = plain([item])["pixel_values"]
    transform = ImageTransform(16)
    for s, k in enumerate(item.step_index):
        assert torch.equal(expected[0, s], transform(Image.open(tmp_path / names[k]).convert("RGB")))
    assert len(opened) == 4
    for _ in range(3):
        assert torch.equal(cached([item])["pixel_values"], expected)
    assert len(opened) == 4 + 4                                    # the cached collator opened each image once
    one = 16 * 16 * 3                                              # bytes of one cached image
    small = StepCollator(tokenizer, image_size=16, image_cache_mb=2.5 * one / 2 ** 20)   # room for two
    assert torch.equal(small([item])["pixel_values"], expected)
    assert len(small._decoded) == 2 and small._decoded_bytes == 2 * one
    last_two = [str(tmp_path / names[k]) for k in item.step_index[-2:]]
    assert list(small._decoded) == last_two
    with pytest.raises(ValueError, match="image_cache_mb"):
        StepCollator(tokenizer, image_cache_mb=-1)


def test_step_tokens_equal_the_tokenizer_and_tokenise_each_text_once(tokenizer):
    texts = ["Whisk the eggs. Add salt! Fold in flour? Rest it.", "", "Whisk the eggs. Add salt! Fold in flour? Rest it.",
             "word " * 80, "Chop the onions finely.", "Café crème, naïve façade."]
    calls = []

    def counting(batch, **kwargs):
        calls.append(list(batch))
        return tokenizer(batch, **kwargs)

    counting.pad_token_id = tokenizer.pad_token_id
    tokens = StepTokens(counting)
    for max_tokens, max_sentences in [(12, 2), (60, 5), (12, 2)]:
        expected = tokenizer([first_sentences(t, max_sentences) for t in texts], padding="longest", truncation=True,
                             max_length=max_tokens, return_tensors="pt")
        for _ in range(2):  # the second epoch comes from the cache
            input_ids, attention_mask = tokens.batch(texts, max_tokens, max_sentences)
            assert torch.equal(input_ids, expected["input_ids"]) and torch.equal(attention_mask, expected["attention_mask"])
    assert [len(c) for c in calls] == [5, 5]   # each distinct text once per (max_tokens, max_sentences)
    assert tokens.ids(["Chop the onions finely."], 4) == [tokenizer("Chop the onions finely.", truncation=True, max_length=4)["input_ids"]]
    counting.padding_side = "left"   # a left-padding tokenizer pads on the left
    input_ids, attention_mask = tokens.batch(["Chop the onions finely.", ""], 60, 5)
    assert attention_mask.tolist()[1] == [0] * (input_ids.shape[1] - 2) + [1, 1]
    assert input_ids[1, -2:].tolist() == tokenizer("")["input_ids"]
    full = StepTokens(tokenizer, max_entries=1)   # beyond the cap texts are tokenised every time, still right
    assert full.batch(texts[:2], 60, 5)[0].tolist() == tokenizer(texts[:2], padding="longest")["input_ids"]


def test_the_views_declared_fields_reach_the_batch_stacked_or_as_lists(root):
    """Each declared ViewItem.meta key becomes a batch key: numbers a tensor (B,), tensors of one shape stacked,
    anything else the list of values; undeclared meta keys stay out."""
    items = [SequencingView([_proc(pid, 3, root)])[0] for pid in ("a", "b")]
    for k, item in enumerate(items):
        item.meta.update({"next": k + 1, "weight": 0.5 * k, "mask": torch.tensor([k, 1 - k]), "label": f"L{k}",
                          "ragged": [0] * (k + 1), "hidden": 7})
    collate = StepCollator(use_text=False, use_images=False, fields=("next", "weight", "mask", "label", "ragged"))
    batch = collate(items)
    assert batch["next"].dtype == torch.long and batch["next"].tolist() == [1, 2]
    assert batch["weight"].dtype == torch.float32 and batch["weight"].tolist() == [0.0, 0.5]
    assert batch["mask"].tolist() == [[0, 1], [1, 0]]
    assert batch["label"] == ["L0", "L1"] and batch["ragged"] == [[0], [0, 0]] and "hidden" not in batch
    assert "next" not in StepCollator(use_text=False, use_images=False)(items)   # nothing declared, nothing carried


def test_a_field_the_collator_fills_or_an_item_lacks_is_refused_naming_it(root):
    with pytest.raises(ValueError) as err:
        StepCollator(use_text=False, use_images=False, fields=("next", "gold"))
    assert str(err.value).startswith("the task view's fields ['gold'] name batch keys the collator fills itself; ")
    items = [SequencingView([_proc(pid, 3, root)])[0] for pid in ("a", "b")]
    items[0].meta["next"] = 1
    with pytest.raises(ValueError) as err:
        StepCollator(use_text=False, use_images=False, fields=("next",))(items)
    assert str(err.value) == ("the task view declares the field 'next', but the items of procedures ['b'] have no "
                              "such key in their meta")


def test_a_view_registers_only_as_a_task_view_subclass_with_a_task_and_field_names():
    from data_modules.views import VIEWS, TaskView, register_view

    class Nameless(TaskView):
        pass

    class BadFields(TaskView):
        task = "toy_bad_fields"
        fields = "next"   # a string, not a tuple of keys

    with pytest.raises(TypeError, match="register_view takes a TaskView subclass with its own task name"):
        register_view(Nameless)
    with pytest.raises(TypeError, match=r"fields must be a tuple of ViewItem.meta keys, got 'next'"):
        register_view(BadFields)
    assert "toy_bad_fields" not in VIEWS and VIEWS["sequencing"] is SequencingView and VIEWS["pretraining"] is PretrainingView


def test_text_cap_to_sentences():
    assert first_sentences("A b. C d! E f? G h.", 2) == "A b. C d!"


def test_missing_image_policies(root, tokenizer):
    proc = _proc("m", 3, root)
    proc.steps[1].images = ["gone.png"]
    item = SequencingView([proc])[0]
    with pytest.raises(ImageLoadError, match="gone.png"):
        StepCollator(tokenizer, image_size=16)([item])
    coll = StepCollator(tokenizer, image_size=16, missing_image="blank")
    batch = coll([item])
    assert coll.missing_images == 1
    assert batch["image_mask"][0].sum() == 2


def test_gif_gives_middle_frame(tmp_path, tokenizer):
    frames = [Image.new("RGB", (8, 8), c) for c in ("red", "green", "blue")]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:])
    proc = Procedure(id="g", steps=[Step(text="a", images=["anim.gif"]), Step(text="b")], root=str(tmp_path))
    batch = StepCollator(tokenizer, image_size=8, image_mean=(0, 0, 0), image_std=(1, 1, 1))([SequencingView([proc])[0]])
    pos = batch["meta"][0]["step_index"].index(0)
    pixel = batch["pixel_values"][0, pos, :, 4, 4]
    assert pixel[1] > 0.4 and pixel[0] < 0.1 and pixel[2] < 0.1  # green: the middle frame


def test_epoch_sampler_is_a_function_of_seed_and_epoch():
    a, b = EpochSampler(10, shuffle=True, seed=1), EpochSampler(10, shuffle=True, seed=1)
    a.set_epoch(3)
    b.set_epoch(3)
    assert list(a) == list(b) and all(e == 3 for _, e in a)
    b.set_epoch(4)
    assert [i for i, _ in a] != [i for i, _ in b]
    shards = [list(EpochSampler(5, shuffle=False, num_replicas=2, rank=r)) for r in range(2)]
    assert [i for i, _ in shards[0]] == [0, 2, 4] and [i for i, _ in shards[1]] == [1, 3, 0]


def _text_proc(pid: str, words: list[int]) -> Procedure:
    steps = [Step(text=" ".join(f"w{pid}{k}" for k in range(w))) for w in words]
    return Procedure(id=pid, steps=steps, split="train")


def test_text_length_is_what_a_joint_pass_packs(tokenizer):
    from seqaware.encoders.base import pack_steps
    coll = StepCollator(tokenizer, max_tokens=12, use_images=False)
    for k, words in enumerate([[1, 2, 3], [30, 1], [4, 4, 4, 4, 4], [0, 2]]):
        item = SequencingView([_text_proc(f"p{k}", words)])[0]
        batch = coll([item])
        packed = pack_steps(batch["input_ids"], batch["attention_mask"], batch["step_mask"],
                            tokenizer.cls_token_id, tokenizer.pad_token_id)
        assert coll.text_length(item) == int(packed["attention_mask"].sum())
    # hand-checked: [CLS] salt [SEP] pepper [SEP]; a 40-word step keeps 12 - 2 words + its [SEP]
    two = Procedure(id="t", steps=[Step(text="salt"), Step(text="pepper")], split="train")
    assert coll.text_length(SequencingView([two])[0]) == 5
    long = Procedure(id="l", steps=[Step(text=" ".join(["salt"] * 40)), Step(text="pepper")], split="train")
    assert coll.text_length(SequencingView([long])[0]) == 1 + 11 + 2
    assert StepCollator(None, use_text=False, use_images=False).text_length(item) == 2


def test_bucket_by_length_groups_training_batches_and_keeps_every_instance(tokenizer):
    from data_modules.datamodule import ProcedureDataModule
    rng = np.random.default_rng(0)
    procs = [_text_proc(f"p{k}", [int(w) for w in rng.integers(1, 25, size=3)]) for k in range(24)]
    source = lambda: {"train": procs, "val": procs[:6]}  # noqa: E731
    kwargs = dict(source=source, tokenizer="offline:minilm", view={"max_steps": 5},
                  collator={"max_tokens": 16, "use_images": False}, batch_size=4, eval_batch_size=4, seed=3)
    plain = ProcedureDataModule(**kwargs)
    bucketed = ProcedureDataModule(**kwargs, bucket_by_length=True, bucket_factor=100)  # one sorting window
    for dm in (plain, bucketed):
        dm.setup("fit")
    lengths = {p.id: bucketed.collator.text_length(bucketed.datasets["train"][i]) for i, p in enumerate(procs)}

    def epoch(dm, n):
        loader = dm.train_dataloader()
        loader.batch_sampler.set_epoch(n) if hasattr(loader.batch_sampler, "set_epoch") else loader.sampler.set_epoch(n)
        return [[m["id"] for m in batch["meta"]] for batch in loader]

    for n in (0, 1):
        batches = epoch(bucketed, n)
        assert sorted(i for b in batches for i in b) == sorted(lengths)  # every instance once per epoch
        spans = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches)
        assert all(hi <= nxt_lo for (_, hi), (nxt_lo, _) in zip(spans, spans[1:]))  # sorted runs of the window
    assert epoch(bucketed, 0) != epoch(bucketed, 1)  # still shuffled per epoch
    padded = {name: sum(len(b) * max(lengths[i] for i in b) for b in epoch(dm, 0))
              for name, dm in (("plain", plain), ("bucketed", bucketed))}
    assert padded["bucketed"] < padded["plain"]
    val = [[m["id"] for m in batch["meta"]] for batch in bucketed.val_dataloader()]
    assert [i for b in val for i in b] == [p.id for p in procs[:6]]  # evaluation keeps its order
