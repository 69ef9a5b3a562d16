"""data_modules.datamodule.ProcedureDataModule on small in-memory procedures: the options a user sets
(``data.*``) reach the source, the views, the collator and the loaders, and every error names the key to fix."""
from __future__ import annotations

import functools
import logging
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from data_modules.datamodule import ProcedureDataModule, check_fit_saw_batches, describe_source
from data_modules.sampling import EpochSampler, LengthBucketBatchSampler
from data_modules.views import VIEWS, PretrainingView, SequencingView
from seqaware.procedure import Procedure, ProcedureFormatError, Step


def _proc(pid: str, n: int, root=None, image: str | None = None, split: str = "train") -> Procedure:
    steps = [Step(text=f"step {i} of {pid}", images=[image] if image else []) for i in range(n)]
    return Procedure(id=pid, steps=steps, split=split, root=str(root) if root else None)


class Source:
    """A data source that records how it was called."""

    def __init__(self, splits):
        self.splits, self.calls = splits, []

    def __call__(self, **paths):
        self.calls.append(paths)
        return self.splits


def jsonl_like(train_path=None, val_path=None, test_path=None):
    return {}


def roc_like(train_path=None, val_path=None, test_path=None, extra_train_paths=None, src=None):
    return {}


def _dm(splits=None, **kwargs):
    splits = splits if splits is not None else {"train": [_proc(f"t{i}", 3) for i in range(5)],
                                                "val": [_proc(f"v{i}", 4) for i in range(3)]}
    options = dict(tokenizer=None, collator={"use_text": False, "use_images": False})
    options.update(kwargs)
    return ProcedureDataModule(Source(splits), **options)


# ------------------------------------------------------------------------------ options
def test_an_unknown_task_is_refused_naming_the_key_and_the_registered_views():
    with pytest.raises(ValueError) as err:
        ProcedureDataModule(Source({}), task="ordering")
    assert {"sequencing", "pretraining"} <= set(VIEWS)
    assert str(err.value) == f"unknown task view 'ordering' (data.task); registered: {', '.join(VIEWS.names())}"


@pytest.mark.parametrize("task", ["sequencing", "pretraining"])
def test_data_task_picks_the_registered_view(task):
    dm = _dm(task=task)
    dm.setup("fit")
    assert dm.view_class is VIEWS[task] and type(dm.datasets["train"]) is VIEWS[task]
    assert dm.datasets["val"].name == f"val {task}"


@pytest.mark.parametrize("kwargs, message", [
    ({"view": {"max_steps": None}}, "data.view.max_steps=null: SequencingView(max_steps=...) takes an integer, not null"),
    ({"view": {"too_long": None}}, "data.view.too_long=null: SequencingView(too_long=...) takes text, not null"),
    ({"task": "pretraining", "view": {"max_steps": 5, "min_steps": None}},
     "data.view.min_steps=null: PretrainingView(min_steps=...) takes an integer, not null"),
    ({"collator": {"max_tokens": None}}, "data.collator.max_tokens=null: StepCollator(max_tokens=...) takes an integer, "
                                         "not null"),
    ({"collator": {"max_sentences": "five"}}, "data.collator.max_sentences='five': StepCollator(max_sentences=...) "
                                              "takes an integer, not text"),
], ids=["view.max_steps", "view.too_long", "view.min_steps", "collator.max_tokens", "collator.max_sentences"])
def test_a_null_or_text_option_of_the_view_or_collator_is_refused_naming_the_key(kwargs, message):
    """Refused when the data module is built, not at the first comparison of an epoch ('<' between None and int)."""
    with pytest.raises(ValueError) as err:
        ProcedureDataModule(Source({}), **kwargs)
    assert str(err.value) == message


def test_options_that_take_null_keep_it():
    dm = _dm(collator={"use_text": False, "use_images": False, "region_features": None},
             view={"max_steps": 4, "reference_limit": 10})
    dm.setup("fit")
    assert dm.collator.region_cache is None and dm.datasets["train"].max_steps == 4


def test_batch_sizes_and_worker_options_reach_the_loaders():
    dm = _dm(batch_size=2, num_workers=0, persistent_workers=True, pin_memory=True, seed=5)
    assert (dm.batch_size, dm.eval_batch_size, dm.persistent_workers) == (2, 2, False)  # no workers: none to keep
    dm.setup("fit")
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert (train.batch_size, val.batch_size, train.num_workers, train.pin_memory) == (2, 2, 0, True)
    assert isinstance(train.sampler, EpochSampler) and train.sampler.shuffle and train.sampler.seed == 5
    assert not val.sampler.shuffle and val.sampler.seed == 5
    assert train.collate_fn is dm.collator and val.collate_fn is dm.collator
    assert sum(len(b["meta"]) for b in train) == 5 and [len(b["meta"]) for b in val] == [2, 1]
    dm = _dm(batch_size=2, eval_batch_size=3, num_workers=2, persistent_workers=True)
    dm.setup("fit")
    assert (dm.eval_batch_size, dm.persistent_workers, dm.pin_memory) == (3, True, False)
    loader = dm.val_dataloader()
    assert (loader.batch_size, loader.num_workers, loader.persistent_workers, loader.pin_memory) == (3, 2, True, False)
    assert _dm(num_workers=2).persistent_workers is False


def test_the_defaults_batch_16_and_seed_0_with_minilm_text():
    dm = ProcedureDataModule(Source({"train": [_proc(f"t{i}", 3) for i in range(20)], "val": [_proc("v", 3)]}),
                             collator={"use_images": False})
    assert dm.image_check_counts == {} and dm.datasets == {}
    assert dm.vocab_size == 30522 and dm.collator.use_text is True   # offline:minilm
    dm.setup("fit")
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert (train.batch_size, val.batch_size, train.sampler.seed, train.num_workers, train.pin_memory) == (16, 16, 0, 0,
                                                                                                          False)
    assert [len(b["meta"]) for b in train] == [16, 4]


def test_one_worker_is_kept_between_epochs_when_asked():
    assert _dm(num_workers=1, persistent_workers=True).persistent_workers is True
    assert _dm(num_workers=1).persistent_workers is False


def test_bucketing_sorts_windows_of_50_batches_by_default():
    dm = _dm(bucket_by_length=True)
    dm.setup("fit")
    assert dm.train_dataloader().batch_sampler.bucket_factor == 50


def test_only_the_paths_a_user_set_reach_the_source():
    dm = _dm(train_path="a.jsonl", test_path="c.jsonl")
    dm.prepare_data()
    dm.setup("fit")
    assert dm.source.calls == [{"train_path": "a.jsonl", "test_path": "c.jsonl"}] * 2
    dm = _dm()
    dm.prepare_data()
    assert dm.source.calls == [{}]


def test_extra_training_files_go_to_a_source_that_takes_them():
    from pathlib import Path

    source = Source({})
    source.func = roc_like   # as a functools.partial exposes it
    dm = ProcedureDataModule(source, tokenizer=None, extra_train_paths=[Path("x.tsv"), "y.tsv"])
    dm.prepare_data()
    assert source.calls == [{"extra_train_paths": ["x.tsv", "y.tsv"]}]
    assert ProcedureDataModule(functools.partial(jsonl_like), tokenizer=None, extra_train_paths=[]).source_paths == {}


@pytest.mark.parametrize("given", ["x.tsv", "data/x.tsv"])
def test_an_extra_training_path_without_brackets_is_one_file_not_one_per_character(given):
    from pathlib import Path

    for value in (given, Path(given)):
        source = Source({})
        source.func = roc_like
        dm = ProcedureDataModule(source, tokenizer=None, extra_train_paths=value)
        dm.prepare_data()
        assert source.calls == [{"extra_train_paths": [given]}]
    assert ProcedureDataModule(functools.partial(roc_like), tokenizer=None, extra_train_paths="").source_paths == {}


def test_data_extra_train_paths_without_brackets_on_the_command_line_reads_that_file(compose_train, tmp_path):
    from hydra.utils import instantiate

    from test_adapter_readers import tsv

    train = tsv(tmp_path / "dev.tsv", *[f"s{w} a . <eos> s{w} b ." for w in "abcdefghij"])
    extra = tsv(tmp_path / "extra.tsv", "e . <eos> f .", "g . <eos> h .")
    cfg = compose_train("experiment=berson_roc", f"data.train_path={train}", f"data.extra_train_paths={extra}")
    assert cfg.data.extra_train_paths == str(extra)          # Hydra gives the plain string
    dm = instantiate(cfg.data)
    splits = dm.source(**dm.source_paths)
    assert [p.id for p in splits["train"]][-2:] == ["extra-1", "extra-2"]
    assert {k: len(v) for k, v in splits.items()} == {"train": 7 + 2, "val": 1, "test": 2}


def test_extra_training_files_for_a_source_without_them_are_refused():
    with pytest.raises(ValueError) as err:
        ProcedureDataModule(functools.partial(jsonl_like), tokenizer=None, extra_train_paths=["x.tsv"])
    assert str(err.value) == ("data.extra_train_paths: the data source data.source (jsonl_like, train split) takes no "
                              "extra training files (the roc source does)")
    with pytest.raises(ValueError, match="the data source data.source \\(jsonl_like, train split\\) takes no"):
        ProcedureDataModule(jsonl_like, tokenizer=None, extra_train_paths=["x.tsv"])


def test_no_tokenizer_means_no_text():
    dm = ProcedureDataModule(Source({}), tokenizer=None, view={"max_steps": 7})
    assert dm.tokenizer is None and dm.vocab_size is None
    assert (dm.collator.max_steps, dm.collator.use_text) == (7, False)
    assert dm.collator is dm.collator   # built once


def test_collator_options_win_over_what_the_view_implies():
    dm = ProcedureDataModule(Source({}), tokenizer=None, view={"max_steps": 7},
                             collator={"max_steps": 4, "use_images": False})
    assert (dm.collator.max_steps, dm.collator.use_images) == (4, False)
    assert ProcedureDataModule(Source({}), tokenizer=None).collator.max_steps == 5


def test_a_tokenizer_name_is_loaded_once_and_gives_the_vocabulary(monkeypatch):
    import data_modules.datamodule as datamodule

    loaded = []

    class Tok(list):
        pass

    def load(name):
        loaded.append(name)
        return Tok(range(11))

    monkeypatch.setattr(datamodule, "load_tokenizer", load)
    dm = ProcedureDataModule(Source({}), tokenizer="some/tokenizer", collator={"use_images": False})
    assert dm.vocab_size == 11 and dm.tokenizer is dm.tokenizer and loaded == ["some/tokenizer"]
    assert dm.collator.use_text is True and dm.collator.tokenizer is dm.tokenizer


# ------------------------------------------------------------------------------ views
def test_sequencing_views_reshuffle_only_the_training_split():
    dm = _dm({"train": [_proc("a", 4)], "val": [_proc("b", 4)]},
             view={"max_steps": 5, "too_long": "skip"}, seed=9)
    dm.setup("fit")
    train, val = dm.datasets["train"], dm.datasets["val"]
    assert isinstance(train, SequencingView) and isinstance(val, SequencingView)
    assert (train.reshuffle, val.reshuffle) == (True, False)
    assert (train.name, val.name) == ("train sequencing", "val sequencing")
    assert (train.seed, train.max_steps, train.too_long) == (9, 5, "skip")


def test_an_empty_split_is_an_error_naming_where_it_came_from():
    dm = _dm({"train": [_proc("a", 4)], "test": [_proc("c", 6)]}, view={"max_steps": 5, "too_long": "skip"},
             test_path="t.jsonl")
    with pytest.raises(ValueError) as err:
        dm.setup("test")
    assert str(err.value) == ("data.test_path=t.jsonl: the test split has no instances (read 1, dropped "
                              "{'fewer_than_2_steps': 0, 'too_long': 1}); a run cannot evaluate on an empty split")
    dm = _dm({"train": []})
    with pytest.raises(ValueError) as err:
        dm.setup("fit")
    assert str(err.value) == ("data.source (Source, train split): the train split has no instances; a run cannot train "
                              "on an empty split")


def test_pretraining_views_ignore_the_sequencing_only_options():
    dm = _dm({"train": [_proc("a", 4)], "val": [_proc("b", 3)]}, task="pretraining",
             view={"max_steps": 3, "too_long": "skip", "reference_limit": 10, "min_steps": 2}, seed=4)
    dm.setup("fit")
    train = dm.datasets["train"]
    assert isinstance(train, PretrainingView) and isinstance(dm.datasets["val"], PretrainingView)
    assert (train.name, dm.datasets["val"].name, train.seed, train.max_steps) == ("train pretraining",
                                                                                  "val pretraining", 4, 3)
    assert dm.view_kwargs["too_long"] == "skip"   # the user's options are left as they were


def test_pretraining_views_need_no_sequencing_options():
    dm = _dm({"train": [_proc("a", 4)]}, task="pretraining", view={"max_steps": 3})
    dm.setup("fit")
    assert dm.datasets["train"].max_steps == 3


def test_each_process_of_a_ddp_run_loads_its_share():
    dm = _dm(batch_size=1, eval_batch_size=1)
    dm.setup("fit")
    dm.trainer = SimpleNamespace(world_size=3, global_rank=1)
    assert [b["meta"][0]["id"] for b in dm.val_dataloader()] == ["v1"]
    assert len(list(dm.train_dataloader())) == 2


def test_setup_reads_the_source_once_and_logs_the_sizes(caplog):
    dm = _dm()
    with caplog.at_level(logging.INFO, logger="data_modules.datamodule"):
        dm.setup("fit")
        dm.setup("test")
    assert len(dm.source.calls) == 1
    assert {k: len(v) for k, v in dm.datasets.items()} == {"train": 5, "val": 3}
    assert "data: {'train': 5, 'val': 3}" in caplog.messages


def test_a_split_the_source_did_not_give_is_named_with_the_key():
    dm = _dm()
    dm.setup("fit")
    with pytest.raises(ValueError) as err:
        dm.test_dataloader()
    assert str(err.value) == ("the data source gave no 'test' split (it has ['train', 'val']); set data.test_path or "
                              "the source's test data")


def test_bucketing_measures_the_training_split_once_and_only_trains_bucketed(monkeypatch):
    dm = _dm(bucket_by_length=True, bucket_factor=7, batch_size=2, seed=3)
    dm.setup("fit")
    calls = []
    monkeypatch.setattr(type(dm.collator), "text_length", lambda self, item: calls.append(item.procedure_id) or 2)
    first = dm.train_dataloader()
    dm.train_dataloader()
    assert calls == ["t0", "t1", "t2", "t3", "t4"]   # each training instance, measured once
    sampler = first.batch_sampler
    assert isinstance(sampler, LengthBucketBatchSampler)
    assert (sampler.batch_size, sampler.bucket_factor, sampler.shuffle, sampler.seed) == (2, 7, True, 3)
    assert sampler.lengths.tolist() == [2] * 5
    assert isinstance(dm.val_dataloader().sampler, EpochSampler)
    plain = _dm(bucket_by_length=False)
    plain.setup("fit")
    assert isinstance(plain.train_dataloader().sampler, EpochSampler)


# ------------------------------------------------------------------------------ images
@pytest.fixture
def images(tmp_path):
    Image.new("RGB", (8, 8), "blue").save(tmp_path / "ok.png")
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    return tmp_path


def _image_dm(root, image, **kwargs):
    collator = {"use_text": False, "image_size": 8, **kwargs.pop("collator", {})}
    splits = {"train": [_proc("a", 2, root, image)], "val": [_proc("b", 2, root, "ok.png")]}
    return ProcedureDataModule(Source(splits), tokenizer=None, collator=collator, **kwargs)


def test_every_image_is_decoded_before_the_first_step(images, caplog):
    dm = _image_dm(images, "ok.png")
    with caplog.at_level(logging.INFO, logger="data_modules.datamodule"):
        dm.setup("fit")
    assert dm.image_check_counts == {"images": 4, "decoded": 1, "cached": 3}   # one file, decoded once
    assert "image check: {'images': 4, 'decoded': 1, 'cached': 3}" in caplog.messages


def test_a_corrupt_image_is_reported_with_the_blank_image_option(images):
    with pytest.raises(ProcedureFormatError) as err:
        _image_dm(images, "bad.png").setup("fit")
    lines = str(err.value).splitlines()
    assert len([line for line in lines if "image does not decode" in line]) == 2
    assert all(line.endswith("(set data.collator.missing_image=blank to use a blank image instead)")
               for line in lines if "image does not decode" in line)


@pytest.mark.parametrize("options", [{"verify_images": False}, {"collator": {"missing_image": "blank"}},
                                     {"collator": {"use_images": False}}])
def test_images_are_not_decoded_when_not_used_or_replaced_or_not_asked_for(images, options, caplog):
    dm = _image_dm(images, "bad.png", **options)
    with caplog.at_level(logging.INFO, logger="data_modules.datamodule"):
        dm.setup("fit")
    assert dm.image_check_counts == {"images": 4, "decoded": 0, "cached": 0}
    assert "image check" not in caplog.text


def test_an_image_outside_the_data_folder_needs_the_option(images, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "x.png"
    Image.new("RGB", (8, 8), "red").save(elsewhere)
    with pytest.raises(ProcedureFormatError, match="data.allow_outside_images=true"):
        _image_dm(images, str(elsewhere)).setup("fit")
    dm = _image_dm(images, str(elsewhere), allow_outside_images=True)
    dm.setup("fit")
    assert dm.image_check_counts["decoded"] == 2


def test_decoded_images_are_remembered_in_the_check_cache(images, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    _image_dm(images, "ok.png", image_check_cache=str(cache)).setup("fit")
    again = _image_dm(images, "ok.png", image_check_cache=str(cache))
    again.setup("fit")
    assert again.image_check_counts == {"images": 4, "decoded": 0, "cached": 4}


# ------------------------------------------------------------------------------ messages
@pytest.mark.parametrize("source, paths, split, text", [
    (jsonl_like, {"train_path": "a.jsonl"}, "train", "data.train_path=a.jsonl"),
    (jsonl_like, {"train_path": "a.jsonl"}, "val", "data.source (jsonl_like, val split)"),
    (functools.partial(roc_like, src="/data/roc"), {}, "test", "data.source.src=/data/roc (test split)"),
    (functools.partial(roc_like, src=""), {}, "test", "data.source (roc_like, test split)"),
    (functools.partial(roc_like), {}, "val", "data.source (roc_like, val split)"),
    (Source({}), {}, "train", "data.source (Source, train split)"),
    (SimpleNamespace(keywords=None, func=roc_like), {}, "train", "data.source (roc_like, train split)"),
])
def test_a_split_is_described_by_the_key_a_user_sets(source, paths, split, text):
    assert describe_source(source, paths, split) == text


def test_the_data_module_describes_its_own_splits():
    dm = ProcedureDataModule(functools.partial(roc_like, src="/d"), tokenizer=None, val_path="v.jsonl")
    assert (dm.describe_split("val"), dm.describe_split("train")) == ("data.val_path=v.jsonl",
                                                                      "data.source.src=/d (train split)")


def _trainer(done: int):
    progress = SimpleNamespace(total=SimpleNamespace(completed=done))
    return SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
                           limit_train_batches=0, max_epochs=3, max_steps=-1)


def test_a_fit_without_a_training_batch_is_an_error_naming_the_data():
    dm = ProcedureDataModule(functools.partial(jsonl_like), tokenizer=None, train_path="train.jsonl")
    check_fit_saw_batches(_trainer(1), dm)
    with pytest.raises(RuntimeError) as err:
        check_fit_saw_batches(_trainer(0), dm)
    assert str(err.value) == ("the fit saw no training batch (data.train_path=train.jsonl); check that split, "
                              "trainer.limit_train_batches=0 and trainer.max_epochs=3 / trainer.max_steps=-1")
    with pytest.raises(RuntimeError, match=r"^the fit saw no training batch \(the train split of SimpleNamespace\); "):
        check_fit_saw_batches(_trainer(0), SimpleNamespace())
