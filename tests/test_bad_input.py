"""Bad input fails early and clearly (issue #20, item 5): one test per bad input.

Each test first builds the bad input and asserts the exact ``file:line: record id: field: reason``
message (or the config key named); the behaviour before these checks (silently accepted, or a bare
exception mid-run) fails every one of them.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from data_modules.adapters import run_adapter
from data_modules.adapters.catbench import read_catbench
from data_modules.datamodule import ProcedureDataModule, check_fit_saw_batches
from data_modules.images import check_procedure_images
from data_modules.sources import jsonl_source
from seqaware.pretrained import PretrainedUnavailableError, load_tokenizer
from seqaware.procedure import ProcedureFormatError, check_procedures_file, read_procedures

ROOT = Path(__file__).resolve().parents[1]


def record(pid: str, split: str = "train", images=("img.png", None)) -> dict:
    return {"id": pid, "split": split, "steps": [{"text": f"{pid} first.", "images": [images[0]] if images[0] else []},
                                                 {"text": f"{pid} second.", "images": [images[1]] if images[1] else []}]}


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.fixture
def data(tmp_path) -> Path:
    """A data folder with one good image."""
    folder = tmp_path / "data"
    folder.mkdir()
    Image.new("RGB", (8, 8), "red").save(folder / "img.png")
    return folder


def corrupt_png(path: Path) -> Path:
    """A PNG cut in half: the header opens (so an existence check passes), the pixels do not decode."""
    Image.new("RGB", (64, 64), "green").save(path)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return path


def problems_of(err) -> list[str]:
    return [str(p) for p in err.value.problems]


def validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "tools" / "validate_procedures.py"), *args],
                          capture_output=True, text=True, timeout=120)


def datamodule(**paths) -> ProcedureDataModule:
    """A text-free, image-using sequencing data module over JSONL files (no tokenizer needed)."""
    options = {k: v for k, v in paths.items() if not k.endswith("_path")}
    files = {k: str(v) for k, v in paths.items() if k.endswith("_path")}
    return ProcedureDataModule(functools.partial(jsonl_source), tokenizer=None,
                               collator={"use_text": False, "use_images": True, "image_size": 8}, **files, **options)


# ---------------------------------------------------------------- empty split / no training batch
def test_empty_training_file_is_an_error_naming_the_file_and_key(data):
    train = write_jsonl(data / "train.jsonl", [])
    test = write_jsonl(data / "test.jsonl", [record("t1", "test")])
    with pytest.raises(ProcedureFormatError) as err:
        jsonl_source(train_path=str(train), test_path=str(test))
    assert problems_of(err) == [f"{train}: data.train_path: the file holds no procedures: the train split is empty"]


def test_split_emptied_by_the_length_policy_is_an_error_naming_the_file(data):
    train = write_jsonl(data / "train.jsonl", [record("p1")])
    dm = datamodule(train_path=train, view={"max_steps": 2, "too_long": "skip"})
    dm.setup("fit")  # 2 steps = exactly max_steps: kept
    assert len(dm.datasets["train"]) == 1
    long = dict(record("p1"), steps=record("p1")["steps"] + [{"text": "third."}])
    write_jsonl(train, [long])
    with pytest.raises(ValueError, match=rf"data\.train_path={train}: the train split has no instances "
                                         r"\(read 1, dropped \{'fewer_than_2_steps': 0, 'too_long': 1\}\)"):
        datamodule(train_path=train, view={"max_steps": 2, "too_long": "skip"}).setup("fit")


class _Tiny:
    """A minimal LightningModule factory (a linear layer on random tensors)."""

    @staticmethod
    def make():
        import pytorch_lightning as pl
        import torch

        class Tiny(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch, _):
                return self.layer(batch[0]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

            def train_dataloader(self):
                data = torch.utils.data.TensorDataset(torch.ones(4, 2))
                return torch.utils.data.DataLoader(data, batch_size=2)

        return Tiny()


@pytest.mark.parametrize("limit, fails", [(0, True), (1, False)])
def test_fit_that_saw_no_training_batch_is_an_error(tmp_path, limit, fails):
    import pytorch_lightning as pl

    trainer = pl.Trainer(max_epochs=1, limit_train_batches=limit, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(_Tiny.make())
    described = SimpleNamespace(describe_split=lambda split: f"data.{split}_path=/x/{split}.jsonl")
    if fails:
        with pytest.raises(RuntimeError, match=r"the fit saw no training batch \(data\.train_path=/x/train\.jsonl\); "
                                               r".*trainer\.limit_train_batches=0"):
            check_fit_saw_batches(trainer, described)
    else:
        assert trainer.fit_loop.epoch_loop.batch_progress.total.completed == 1
        check_fit_saw_batches(trainer, described)


# ---------------------------------------------------------------- images: decoding, outside the data folder
def test_validator_decodes_every_image(data):
    corrupt_png(data / "bad.png")
    path = write_jsonl(data / "procs.jsonl", [record("p1"), record("p2", images=("img.png", "bad.png"))])
    res = validate(str(path))
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert lines[0].startswith(f"{path}:2: p2: steps[1].images[0]: image does not decode: {data / 'bad.png'}: ")
    assert lines[1] == "1 problem(s); 1 valid procedure(s) in 1 file(s)"
    assert validate("--no-decode", str(path)).returncode == 0  # the existence check alone lets it through


def test_training_decodes_every_image_before_the_first_step_with_a_cache(data, tmp_path):
    train = write_jsonl(data / "train.jsonl", [record("p1"), record("p2", images=("img.png", "img.png"))])
    cache = tmp_path / "image_check"
    dm = datamodule(train_path=train, image_check_cache=str(cache))
    dm.setup("fit")
    # three references to one file: decoded once, the other two found in the (in-memory) cache
    assert dm.image_check_counts == {"images": 3, "decoded": 1, "cached": 2}
    again = datamodule(train_path=train, image_check_cache=str(cache))
    again.setup("fit")
    assert again.image_check_counts == {"images": 3, "decoded": 0, "cached": 3}
    # the file changes (size and mtime): decoded again, and its corruption is found before training
    corrupt_png(data / "img.png")
    with pytest.raises(ProcedureFormatError) as err:
        datamodule(train_path=train, image_check_cache=str(cache)).setup("fit")
    found = problems_of(err)
    assert len(found) == 3
    assert found[0].startswith(f"{train}:1: p1: steps[0].images[0]: image does not decode: ")
    assert found[0].endswith("(set data.collator.missing_image=blank to use a blank image instead)")
    assert found[2].startswith(f"{train}:2: p2: steps[1].images[0]: image does not decode: ")
    # missing_image=blank: a bad image becomes a blank one at run time, so it is not a setup error
    blank = ProcedureDataModule(functools.partial(jsonl_source), tokenizer=None, train_path=str(train),
                                collator={"use_text": False, "image_size": 8, "missing_image": "blank"})
    blank.setup("fit")
    assert blank.image_check_counts == {"images": 3, "decoded": 0, "cached": 0}


@pytest.mark.parametrize("image", ["../../../../etc/hostname", "/etc/hostname", "sub/../../img.png"])
def test_image_outside_the_data_folder_is_rejected(data, image):
    path = write_jsonl(data / "procs.jsonl", [record("p1", images=("img.png", image))])
    expected = (f"{path}:1: p1: steps[1].images[0]: image path {image!r} resolves outside the data folder {data} "
                "(set data.allow_outside_images=true to allow it)")
    res = validate("--no-decode", str(path))
    assert res.returncode == 1 and res.stderr.splitlines()[0] == expected
    procs = read_procedures(path, check_images=False)
    problems, _ = check_procedure_images(procs, decode=False)
    assert [str(p) for p in problems] == [expected]


def test_allow_outside_images_accepts_an_image_elsewhere(data, tmp_path):
    elsewhere = tmp_path / "elsewhere.png"
    Image.new("RGB", (8, 8), "blue").save(elsewhere)
    train = write_jsonl(data / "train.jsonl", [record("p1", images=("img.png", str(elsewhere)))])
    with pytest.raises(ProcedureFormatError, match="data.allow_outside_images=true"):
        datamodule(train_path=train).setup("fit")
    dm = datamodule(train_path=train, allow_outside_images=True)
    dm.setup("fit")
    assert dm.image_check_counts["decoded"] == 2
    assert validate("--allow-outside-images", str(train)).returncode == 0


# ---------------------------------------------------------------- text, splits, ids
def test_non_utf8_text_is_reported_not_replaced(data):
    good = json.dumps(record("p1")).encode()
    bad = json.dumps(record("p2")).encode().replace(b"p2 second.", b"p2 caf\xe9.")
    path = data / "procs.jsonl"
    path.write_bytes(good + b"\n" + bad + b"\n")
    with pytest.raises(ProcedureFormatError) as err:
        read_procedures(path)
    offset = bad.index(b"\xe9") + 1
    assert problems_of(err) == [f"{path}:2: p2: steps[1].text: not valid UTF-8 (byte 0xe9 at byte {offset} of the line); "
                                "save the file as UTF-8"]


def test_record_of_another_split_in_the_train_file(data):
    train = write_jsonl(data / "train.jsonl", [record("p1"), record("p2", "test")])
    with pytest.raises(ProcedureFormatError) as err:
        jsonl_source(train_path=str(train))
    assert problems_of(err) == [f"{train}:2: p2: split: record says split 'test' but data.train_path holds the train split"]
    # a suffix is the same split; the validator takes the split from the file name
    test = write_jsonl(data / "test.jsonl", [record("t1", "test-golden"), record("t2", "val")])
    res = validate(str(test))
    assert res.returncode == 1
    assert res.stderr.splitlines()[0] == (f"{test}:2: t2: split: record says split 'val' but the file name "
                                          "'test.jsonl' holds the test split")
    assert len(res.stderr.splitlines()) == 2  # one problem + the summary: test-golden is fine in test.jsonl


def test_same_file_as_train_and_test(data):
    train = write_jsonl(data / "train.jsonl", [record("p1")])
    with pytest.raises(ProcedureFormatError) as err:
        jsonl_source(train_path=str(train), test_path=str(train))
    found = problems_of(err)
    assert found[0] == (f"{train}: data.test_path: the same file as data.train_path: "
                        "train and evaluation data must be distinct files")
    assert f"{train}:1: p1: split: record says split 'train' but data.test_path holds the test split" in found
    assert f"{train}:1: p1: id: duplicate id (first seen at {train}:1)" in found
    # data.source.check_splits=false: a deliberate overfitting check reads it anyway
    assert [p.id for p in jsonl_source(train_path=str(train), test_path=str(train), check_splits=False)["test"]] == ["p1"]


def test_ids_shared_between_train_val_and_test(data):
    train = write_jsonl(data / "train.jsonl", [record("p1"), record("p2")])
    val = write_jsonl(data / "val.jsonl", [record("v1", "val"), record("p2", "val")])
    test = write_jsonl(data / "test.jsonl", [record("p1", "test")])
    with pytest.raises(ProcedureFormatError) as err:
        jsonl_source(train_path=str(train), val_path=str(val), test_path=str(test))
    assert problems_of(err) == [f"{val}:2: p2: id: duplicate id (first seen at {train}:2)",
                                f"{test}:1: p1: id: duplicate id (first seen at {train}:1)"]
    res = validate(str(train), str(val), str(test))
    assert res.returncode == 1 and res.stderr.splitlines()[:2] == problems_of(err)


def test_missing_file_names_the_key_the_user_sets(data):
    with pytest.raises(FileNotFoundError, match=rf"^data\.val_path: no such file: {data / 'nope.jsonl'}$"):
        jsonl_source(train_path=str(write_jsonl(data / "train.jsonl", [record("p1")])), val_path=str(data / "nope.jsonl"))


def test_mistyped_local_folder_is_not_sent_to_the_hub(tmp_path):
    folder = tmp_path / "modles" / "roberta"
    with pytest.raises(PretrainedUnavailableError) as err:
        load_tokenizer(str(folder))
    message = str(err.value)
    assert message.startswith(f"backbones.tokenizer={str(folder)!r}: no such folder ({folder})")
    assert "huggingface-cli" not in message


# ---------------------------------------------------------------- CaT-Bench questions (adapter and TEO reader)
def question(**changes) -> dict:
    q = {"plan_idx": 0, "question_idx": 0, "question_type": "dependent_real_before", "direction": "before",
         "binary_question": "Must Step 1 happen before Step 2?", "steps": ["Cut.", "Cook.", "Serve."],
         "first_step_idx": 0, "second_step_idx": 1, "label": "yes", "efg_recipe_id": "r0"}
    q.update(changes)
    return q


CATBENCH_BAD = {
    "steps as a string": ({"steps": "Cut. Cook."},
                          "plan 0 question 1: steps: must be a list of non-empty step strings, got a str"),
    "non-integer index": ({"second_step_idx": "2"},
                          "plan 0 question 1: second_step_idx: '2' is not a step index of the 3 steps (an integer 0..2)"),
    "non-object line": ([0, 1], "?: record: expected a JSON object, got list"),
}


@pytest.mark.parametrize("case", sorted(CATBENCH_BAD))
def test_catbench_field_types_name_file_and_line(tmp_path, case):
    change, expected = CATBENCH_BAD[case]
    bad = question(question_idx=1, **change) if isinstance(change, dict) else change
    path = write_jsonl(tmp_path / "q.jsonl", [question(), bad])
    with pytest.raises(ProcedureFormatError) as err:
        read_catbench(path)
    assert problems_of(err) == [f"{path}:2: {expected}"]
    with pytest.raises(ProcedureFormatError) as err:
        run_adapter("catbench", path)
    assert problems_of(err) == [f"{path}:2: {expected}"]


def test_catbench_reader_keeps_good_questions(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [question(), question(question_idx=1, direction="After", label="No ",
                                                                       first_step_idx=2, second_step_idx=0)])
    items = read_catbench(path)
    # direction after: presented as (second, first)
    assert [(i["pair_id"], i["text_a"], i["text_b"], i["direction"], i["answer"]) for i in items] == [
        ("0-dependent_real_before-0", "Cut.", "Cook.", "before", "yes"),
        ("0-dependent_real_before-1", "Cut.", "Serve.", "after", "no")]


def test_catbench_reader_keeps_the_four_questions_of_one_number(tmp_path):
    """The twin before/after questions (and the non-dependent pair) share CaT-Bench's question_idx: all
    four are kept, so the metrics count every question; a true repeat is an error naming both lines."""
    four = [question(), question(question_type="dependent_real_after", direction="after"),
            question(question_type="nondependent_real_before", first_step_idx=1, second_step_idx=2, label="no"),
            question(question_type="nondependent_real_after", direction="after", first_step_idx=1, second_step_idx=2,
                     label="no")]
    items = read_catbench(write_jsonl(tmp_path / "q.jsonl", four))
    assert len({i["pair_id"] for i in items}) == 4
    path = write_jsonl(tmp_path / "dup.jsonl", [question(), question()])
    with pytest.raises(ProcedureFormatError) as err:
        read_catbench(path)
    assert problems_of(err) == [f"{path}:2: plan 0 question 0: question_idx: question 0-dependent_real_before-0 "
                                f"(plan, type, number) repeats {path}:1"]


def test_check_procedures_file_reports_every_problem_once(data):
    """All rules on one file: each bad line gives exactly its own message."""
    path = write_jsonl(data / "train.jsonl", [record("p1"), record("p1"), record("p3", "val"), "{oops"])
    _, found = check_procedures_file(path, expected_split="train", split_key="data.train_path")
    assert [str(p) for p in found] == [
        f"{path}:2: p1: id: duplicate id (first seen at {path}:1)",
        f"{path}:3: p3: split: record says split 'val' but data.train_path holds the train split",
        f"{path}:4: ?: json: not valid JSON: Expecting property name enclosed in double quotes (column 2)",
    ]


def test_catbench_non_utf8_line_is_reported(tmp_path):
    bad = json.dumps(question(question_idx=1)).encode().replace(b"Cook.", b"Cu\xefsez.")
    path = tmp_path / "q.jsonl"
    path.write_bytes(json.dumps(question()).encode() + b"\n" + bad + b"\n")
    with pytest.raises(ProcedureFormatError) as err:
        read_catbench(path)
    offset = bad.index(b"\xef") + 1
    assert problems_of(err) == [f"{path}:2: ?: steps[1]: not valid UTF-8 (byte 0xef at byte {offset} of the line); "
                                "save the file as UTF-8"]


def test_teo_pairs_check_images_before_the_first_step(data):
    from data_modules.teo_pairs import TeoPairsDataModule

    corrupt_png(data / "bad.png")
    train = write_jsonl(data / "train.jsonl", [dict(record("p1", images=("img.png", "bad.png")), dag=[[0, 1]])])
    make = functools.partial(TeoPairsDataModule, functools.partial(jsonl_source), train_path=str(train))
    with pytest.raises(ProcedureFormatError) as err:
        make(modality="image_text").setup("fit")
    assert problems_of(err)[0].startswith(f"{train}:1: p1: steps[1].images[0]: image does not decode: ")
    dm = make(modality="text")  # the text modality never opens the images
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 2  # the dependent pair 0 -> 1 in both presentations


def test_validator_reports_an_empty_file_and_a_file_given_twice(data):
    empty = write_jsonl(data / "val.jsonl", [])
    train = write_jsonl(data / "train.jsonl", [record("p1")])
    res = validate(str(train), str(empty), str(train))
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert lines[0] == (f"{train}: argument 3: the same file as argument 1: "
                        "train and evaluation data must be distinct files")
    assert f"{empty}: file: holds no procedures (an empty split)" in lines
    assert f"{train}:1: p1: id: duplicate id (first seen at {train}:1)" in lines


# ---------------------------------------------------------------- config errors before the first training step
@pytest.mark.parametrize("overrides, match", [
    (["experiment=berson_finetune", "model.pair_encoding=joint", "model.joint_max_tokens=6"],
     r"model.joint_max_tokens=6: step \d+ of procedure '.*' \(train split\) packs to \d+ tokens and a window holds 5"),
    (["experiment=berson_finetune", "model.decoding=exact", "data.view.max_steps=12"],
     r"model.decoding=exact handles at most 10 steps but data.view.max_steps=12"),
    (["experiment=order_baseline", "model.decoder=exact", "data.view.max_steps=11"],
     r"model.decoder=exact handles at most 10 steps but data.view.max_steps=11"),
], ids=["joint_max_tokens", "berson_exact", "baseline_exact"])
def test_config_errors_stop_before_the_first_step_naming_the_key(compose_train, monkeypatch, overrides, match):
    """Settings the data cannot honour are refused when the fit starts, not after a batch (or after training,
    with no test metrics): no training step runs."""
    import train
    from conftest import TINY_BERT

    tiny = [f"model.encoder.config={TINY_BERT}", "data.collator.image_size=64"] if "berson" in overrides[0] else []
    cfg = compose_train(*overrides, *tiny, "trainer.max_steps=2")
    datamodule, model, trainer = train.build(cfg)
    monkeypatch.setattr(type(model), "training_step", lambda *a, **k: pytest.fail("a training step ran"))
    with pytest.raises(ValueError, match=match):
        trainer.fit(model, datamodule=datamodule)


def test_joint_windows_respect_mpnet_positions_after_its_padding_index():
    """MPNet numbers positions from its padding index + 1, as RoBERTa does: a window never asks for a position
    past its table (a 40-position model holds 38 tokens)."""
    import torch

    from seqaware.encoders import create_encoder
    from seqaware.encoders.steps import encode_steps, position_limit
    from test_berson import _batch
    from test_encoders import TINY_MPNET_CFG

    enc = create_encoder("text", config=dict(TINY_MPNET_CFG, max_position_embeddings=40), tokenizer="offline:minilm").eval()
    assert position_limit(enc) == 38
    batch = _batch("text", (5, 3), ragged=True)
    with torch.no_grad():
        states = encode_steps(enc, batch, 512)       # longer than 38 tokens in all: windows of whole steps
    assert torch.isfinite(states).all()
