"""Readers of the ISO-Bench, RecipeQA, WikiHow and ROC releases: every output field, every option and every
problem message (``file:line: record: field: reason``) a user fixes a file from."""
from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from data_modules.adapters import AdapterOptionError, run_adapter
from seqaware.procedure import ProcedureFormatError
from adapter_helpers import jsonl, mean_color

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


# ---------------------------------------------------------------- helpers
def png(path: Path, color=RED) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), color).save(path, format="PNG")
    return path


def problems(excinfo) -> list[str]:
    return [str(p) for p in excinfo.value.problems]


# ---------------------------------------------------------------- ISO-Bench export
ISO_FIELDS = {"id": "uid", "snippet": "plan", "image": "img", "label": "ans", "question": "q", "task": "rel",
              "k": "len", "split": "part", "procedure_id": "pid", "goal": "aim"}


def test_iso_instance_holds_every_mapped_field(tmp_path):
    png(tmp_path / "iso" / "i0.png", RED)
    png(tmp_path / "iso" / "i1.png", GREEN)
    path = jsonl(tmp_path / "iso" / "export.jsonl", [
        {"uid": 7, "plan": ["Mix.", "Bake."], "img": "i0.png", "ans": " Yes ", "aim": " Bake bread ", "q": "Which order?",
         "rel": " AFTER ", "len": "3", "part": "validation", "pid": 42},
        {"plan": "Serve.", "img": "i1.png", "ans": 0, "q": ["not", "text"]},
    ])
    out = tmp_path / "out"
    result = run_adapter("iso", path, out / "images", fields=ISO_FIELDS, split="test-golden")
    assert result.records_read == Counter({"instances": 2})
    a, b = result.tasks["iso"]
    assert a["image"].startswith("images/") and mean_color(out / a["image"]) == RED
    assert b["image"].startswith("images/") and mean_color(out / b["image"]) == GREEN
    assert {k: v for k, v in a.items() if k != "image"} == {
        "instance_id": "7", "procedure_id": "42", "split": "val", "goal": "Bake bread", "task": "after", "k": 3,
        "snippet_steps": None, "snippet": ["Mix.", "Bake."], "candidate_step": None, "label": "DEP",
        "question": "Which order?"}
    # defaults: id <file stem>-<line>, split from the option, k = snippet length, no task without a question text
    assert {k: v for k, v in b.items() if k != "image"} == {
        "instance_id": "export-2", "procedure_id": None, "split": "test-golden", "goal": None, "task": None, "k": 1,
        "snippet_steps": None, "snippet": ["Serve."], "candidate_step": None, "label": "NONDEP",
        "question": ["not", "text"]}


@pytest.mark.parametrize("question, task", [
    ("Must the shown step happen BEFORE the text?", "before"),
    ("Must it come after the steps?", "after"),
    ("Does it come before or after them?", None),       # both words: ambiguous
    ("Is the step shown part of the plan?", None),
    ("Before, before and BEFORE?", "before"),
])
def test_iso_task_is_read_from_the_question_when_not_given(tmp_path, question, task):
    png(tmp_path / "i.png")
    path = jsonl(tmp_path / "x.jsonl", [{"snippet": ["A."], "image": "i.png", "label": "no", "question": question}])
    (inst,) = run_adapter("iso", path, None).tasks["iso"]
    assert inst["task"] == task
    assert inst["image"] == str((tmp_path / "i.png").resolve())   # no out_images: the source path is kept
    assert inst["split"] == "test"                                 # the default split option


@pytest.mark.parametrize("label, expected", [
    ("yes", "DEP"), ("No", "NONDEP"), ("DEP", "DEP"), ("nondep", "NONDEP"), (True, "DEP"), ("false", "NONDEP"),
    (1, "DEP"), ("0", "NONDEP"), ("Maybe", "NONDEP"), (" SURE ", "DEP"),
])
def test_iso_labels_option_extends_the_default_mapping_case_insensitively(tmp_path, label, expected):
    png(tmp_path / "i.png")
    path = jsonl(tmp_path / "x.jsonl", [{"snippet": "A.", "image": "i.png", "label": label}])
    result = run_adapter("iso", path, None, labels={"MAYBE": "NONDEP", "sure": "DEP"})
    assert [i["label"] for i in result.tasks["iso"]] == [expected]


@pytest.mark.parametrize("options, message", [
    ({"labels": {"maybe": "UNSURE", "y": "dep"}}, "option labels: values ['UNSURE', 'dep'] are not ISO labels ['DEP', 'NONDEP']"),
    ({"unreadable_image": "ignore"}, "option unreadable_image='ignore': expected one of ['error', 'skip']"),
    ({"split": "holdout"}, "option split='holdout': expected train, val, test or test-<suffix>"),
])
def test_iso_bad_options_name_the_option(tmp_path, options, message):
    path = jsonl(tmp_path / "x.jsonl", [{"snippet": "A.", "image": "i.png", "label": "yes"}])
    with pytest.raises(AdapterOptionError) as excinfo:
        run_adapter("iso", path, None, **options)
    assert str(excinfo.value) == message


ISO_OK = {"uid": "q", "plan": ["A."], "img": "i.png", "ans": "yes"}


@pytest.mark.parametrize("change, problem", [
    ({"plan": []}, "plan: must be a non-empty string or list of non-empty strings"),
    ({"plan": ["A.", " "]}, "plan: must be a non-empty string or list of non-empty strings"),
    ({"plan": ["A.", 3]}, "plan: must be a non-empty string or list of non-empty strings"),
    ({"plan": "  "}, "plan: must be a non-empty string or list of non-empty strings"),
    ({"plan": 5}, "plan: must be a non-empty string or list of non-empty strings"),
    ({"plan": {"text": "A."}}, "plan: must be a non-empty string or list of non-empty strings"),
    ({"ans": "perhaps"}, "ans: label 'perhaps' is not mapped to DEP/NONDEP (option labels)"),
    ({"part": "dev"}, "part: unknown split 'dev'"),
    ({"part": "Test"}, "part: unknown split 'Test'"),
    ({"rel": "during"}, "rel: task 'during' is not 'before' or 'after'"),
    ({"aim": 5}, "aim: must be a non-empty string"),
    ({"aim": "  "}, "aim: must be a non-empty string"),
    ({"img": None}, "img: missing field"),
    ({"len": "three"}, "len: k 'three' is not a positive integer"),
    ({"len": 0}, "len: k 0 is not a positive integer"),
    ({"len": -2}, "len: k -2 is not a positive integer"),
    ({"len": 2.5}, "len: k 2.5 is not a positive integer"),
    ({"len": "2.0"}, "len: k '2.0' is not a positive integer"),
    ({"len": True}, "len: k True is not a positive integer"),
    ({"len": [2]}, "len: k [2] is not a positive integer"),
])
def test_iso_bad_record_is_reported_with_file_line_id_and_mapped_field(tmp_path, change, problem):
    png(tmp_path / "i.png")
    path = jsonl(tmp_path / "x.jsonl", [{**ISO_OK, "uid": "ok"}, {**ISO_OK, **change}])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("iso", path, None, fields=ISO_FIELDS)
    assert problems(excinfo) == [f"{path}:2: q: {problem}"]


def test_iso_valid_tasks_and_splits_are_accepted(tmp_path):
    png(tmp_path / "i.png")
    records = [{**ISO_OK, "uid": f"q{i}", "rel": rel, "part": part}
               for i, (rel, part) in enumerate([("before", "train"), ("After", "test-human"), (" BEFORE", "val"),
                                                 ("after", "validation")])]
    result = run_adapter("iso", jsonl(tmp_path / "x.jsonl", records), None, fields=ISO_FIELDS)
    assert [(i["task"], i["split"]) for i in result.tasks["iso"]] == [
        ("before", "train"), ("after", "test-human"), ("before", "val"), ("after", "val")]


@pytest.mark.parametrize("k, expected", [(1, 1), (2, 2), (3.0, 3), (" 4 ", 4), ("12", 12), (None, 1)])
def test_iso_k_is_a_positive_integer_defaulting_to_the_snippet_length(tmp_path, k, expected):
    png(tmp_path / "i.png")
    result = run_adapter("iso", jsonl(tmp_path / "x.jsonl", [{**ISO_OK, "len": k}]), None, fields=ISO_FIELDS)
    assert [i["k"] for i in result.tasks["iso"]] == [expected]


def test_iso_duplicate_ids_name_the_first_occurrence(tmp_path):
    png(tmp_path / "i.png")
    path = jsonl(tmp_path / "x.jsonl", [ISO_OK, {**ISO_OK, "uid": "other"}, ISO_OK, ISO_OK])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("iso", path, None, fields=ISO_FIELDS)
    assert problems(excinfo) == [f"{path}:3: q: uid: duplicate id (first seen at {path}:1)",
                                 f"{path}:4: q: uid: duplicate id (first seen at {path}:1)"]


def test_iso_unreadable_image_error_and_skip(tmp_path):
    png(tmp_path / "i.png")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    path = jsonl(tmp_path / "x.jsonl", [ISO_OK, {**ISO_OK, "uid": "bad", "img": "broken.png"}])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("iso", path, tmp_path / "out" / "images", fields=ISO_FIELDS)
    (message,) = problems(excinfo)
    assert message.startswith(f"{path}:2: bad: img: cannot read image {tmp_path / 'broken.png'}")
    result = run_adapter("iso", path, tmp_path / "out" / "images", fields=ISO_FIELDS, unreadable_image="skip")
    assert [i["instance_id"] for i in result.tasks["iso"]] == ["q"]
    assert result.dropped == Counter({"unreadable image": 1})
    assert result.records_read == Counter({"instances": 2})


def test_iso_url_images_are_read_from_the_url_root_mirror(tmp_path):
    png(tmp_path / "mirror" / "media" / "a.png", BLUE)
    path = jsonl(tmp_path / "x.jsonl", [{**ISO_OK, "img": "https://example.org/media/a.png"}])
    out = tmp_path / "out"
    result = run_adapter("iso", path, out / "images", fields=ISO_FIELDS, url_root=str(tmp_path / "mirror"))
    assert mean_color(out / result.tasks["iso"][0]["image"]) == BLUE
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("iso", path, out / "images", fields=ISO_FIELDS)
    assert problems(excinfo) == [f"{path}:1: q: img: image URL https://example.org/media/a.png has no local copy "
                                 "(downloads are off; set option url_root to a local mirror)"]


# ---------------------------------------------------------------- RecipeQA
def recipe(rid, bodies, **extra):
    return {"recipe_id": rid, "context": [{"id": str(i), "body": b} for i, b in enumerate(bodies)], **extra}


def recipeqa_src(tmp_path, train=(), val=(), test=(), images=()) -> Path:
    """A RecipeQA folder: ``new_splits/<split>-acl22.json`` and ``images`` = [(original split, file name, color)]."""
    src = tmp_path / "recipeqa"
    for split, records in (("train", train), ("val", val), ("test", test)):
        if records:
            (src / "new_splits").mkdir(parents=True, exist_ok=True)
            (src / "new_splits" / f"{split}-acl22.json").write_text(json.dumps({"data": list(records)}))
    for original, name, color in images:
        png(src / "images" / "images-qa" / original / "images-qa" / name, color)
    return src


def test_recipeqa_procedure_fields_images_and_root(tmp_path):
    src = recipeqa_src(tmp_path, train=[recipe("r1", ["Mix.", "Bake.", "Eat."], title="Cake")],
                       val=[recipe(9, ["Boil.", "Serve."])],
                       images=[("train", "r1_0.png", RED), ("test", "r1_1_0.png", GREEN), ("val", "r1_1.png", BLUE),
                               ("val", "r1_2_3.png", RED), ("train", "r1_2_10.png", GREEN)])
    # not images, or not <recipe>_<step>[_<k>]: ignored
    folder = src / "images" / "images-qa" / "train" / "images-qa"
    for name in ("notes.txt", "r1_0.json", "r1_cover.jpg", "7.png", "Thumbs.db", "r1_1_x.png"):
        (folder / name).write_bytes(b"not an image")
    out = tmp_path / "out"
    result = run_adapter("recipeqa", src, out / "images")
    assert result.records_read == Counter({"train": 1, "val": 1})
    assert result.dropped == Counter()
    (r1,) = result.splits["train"]
    (r9,) = result.splits["val"]
    assert (r1.id, r1.split, r1.title, r1.category, r1.alternatives, r1.dag) == ("r1", "train", "Cake", ["recipe"], None, None)
    assert (r9.id, r9.split, r9.title, r9.category, r9.alternatives) == ("9", "val", "", ["recipe"], None)
    assert r1.meta == {"source": "recipeqa", "step_ids": ["0", "1", "2"]}
    assert [s.text for s in r1.steps] == ["Mix.", "Bake.", "Eat."]
    # images copied into out_images; <id>_<step> beats <id>_<step>_<k>, else the smallest k (numerically)
    assert all(len(s.images) == 1 and s.images[0].startswith("images/") for s in r1.steps)
    assert [mean_color(r1.image_path(i)) for i in range(3)] == [RED, BLUE, RED]
    assert r1.image_path(0) == out / r1.steps[0].images[0]
    assert [s.images for s in r9.steps] == [[], []]


def test_recipeqa_without_out_images_keeps_source_paths(tmp_path):
    src = recipeqa_src(tmp_path, test=[recipe("r1", ["A.", "B."])], images=[("test", "r1_1_2.png", RED)])
    (proc,) = run_adapter("recipeqa", src, None).splits["test"]
    assert [s.images for s in proc.steps] == [[], [str((src / "images/images-qa/test/images-qa/r1_1_2.png").resolve())]]


def test_recipeqa_duplicates_short_recipes_and_min_steps_are_counted(tmp_path):
    src = recipeqa_src(tmp_path, train=[
        recipe("r1", ["A.", "B.", "C."]), recipe("r1", ["A."]), recipe("r1", ["A.", "B."]),   # repeats: kept once
        recipe("r2", ["A."]), recipe("r3", ["A.", "B."]), recipe("r4", []),
    ])
    result = run_adapter("recipeqa", src, None)
    assert [p.id for p in result.splits["train"]] == ["r1", "r3"]
    assert result.dropped == Counter({"duplicate recipe": 2, "too few steps": 2})
    assert result.records_read == Counter({"train": 6})
    result = run_adapter("recipeqa", src, None, min_steps=3)
    assert [p.id for p in result.splits["train"]] == ["r1"]
    assert result.dropped == Counter({"duplicate recipe": 2, "too few steps": 3})
    result = run_adapter("recipeqa", src, None, min_steps=1)       # a procedure needs 2 steps whatever min_steps says
    assert [p.id for p in result.splits["train"]] == ["r1", "r3"]


def test_recipeqa_alternatives_from_multiref_gt(tmp_path):
    src = recipeqa_src(tmp_path, test=[recipe("r1", ["A.", "B.", "C."], multiref_gt=[[1, 2, 3], [1, 3, 2], [3, 1, 2]])])
    (proc,) = run_adapter("recipeqa", src, None).splits["test"]
    assert proc.alternatives == [[0, 2, 1], [2, 0, 1]]


@pytest.mark.parametrize("record, problem", [
    (["r1"], "?: record: expected a JSON object, got list"),
    ({"context": []}, "?: recipe_id: missing field"),
    ({"recipe_id": "", "context": []}, "?: recipe_id: missing field"),
    ({"recipe_id": "r1"}, "r1: context: missing field"),
    ({"recipe_id": "r1", "context": {"id": "0"}}, "r1: context: must be a list of steps"),
    ({"recipe_id": "r1", "context": [{"id": "0", "body": "A."}, "B."]}, "r1: context[1].id: missing field"),
    ({**recipe("r1", ["A.", "B."]), "multiref_gt": [[0, 1, 1]]},
     "r1: multiref_gt: order 0 [0, 1, 1] is not a permutation of the 2 steps"),
    ({**recipe("r1", ["A.", "B."]), "multiref_gt": "0 1"}, "r1: multiref_gt: must be a non-empty list of orders (lists of step indices)"),
    (recipe("r1", [" ", "B."]), "r1: steps[0]: step has neither text nor image"),
])
def test_recipeqa_bad_record_is_reported_with_position_and_field(tmp_path, record, problem):
    src = recipeqa_src(tmp_path, test=[recipe("ok", ["A.", "B."]), record])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("recipeqa", src, None)
    extra = [f"{src / 'new_splits' / 'test-acl22.json'}:2: r1: context[1].body: missing field"] if "context[1].id" in problem else []
    assert problems(excinfo) == [f"{src / 'new_splits' / 'test-acl22.json'}:2: {problem}", *extra]


def test_recipeqa_every_bad_file_is_reported(tmp_path):
    src = recipeqa_src(tmp_path, train=[recipe("r1", ["A.", "B."])])
    (src / "new_splits" / "val-acl22.json").write_text('{"data": [\n {"recipe_id": \n')
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("recipeqa", src, None)
    (message,) = problems(excinfo)
    assert message.startswith(f"{src / 'new_splits' / 'val-acl22.json'}:3: ?: json: not valid JSON")


def test_recipeqa_unreadable_image_error_and_skip(tmp_path):
    src = recipeqa_src(tmp_path, train=[recipe("r1", ["A.", "B."]), recipe("r2", ["C.", "D."])],
                       images=[("train", "r1_0.png", RED), ("val", "r2_0.png", GREEN)])
    broken = src / "images" / "images-qa" / "val" / "images-qa" / "r2_1_4.jpg"
    broken.write_bytes(b"not an image")
    path = src / "new_splits" / "train-acl22.json"
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("recipeqa", src, tmp_path / "out" / "images")
    (message,) = problems(excinfo)
    assert message.startswith(f"{path}:2: r2: context[1].image: cannot read image {broken}")
    result = run_adapter("recipeqa", src, tmp_path / "out" / "images", unreadable_image="skip")
    assert [p.id for p in result.splits["train"]] == ["r1"]
    assert result.dropped == Counter({"unreadable image": 1})


def test_recipeqa_bad_source_and_options(tmp_path):
    (tmp_path / "file.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as excinfo:
        run_adapter("recipeqa", tmp_path / "file.json", None)
    assert str(excinfo.value) == f"recipeqa: src must be the RecipeQA folder, got {tmp_path / 'file.json'}"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as excinfo:
        run_adapter("recipeqa", tmp_path / "empty", None)
    assert str(excinfo.value) == f"recipeqa: no {{train,val,test}}-acl22.json under {tmp_path / 'empty'}"
    with pytest.raises(AdapterOptionError) as excinfo:
        run_adapter("recipeqa", tmp_path / "empty", None, unreadable_image="warn")
    assert str(excinfo.value) == "option unreadable_image='warn': expected one of ['error', 'skip']"


# ---------------------------------------------------------------- WikiHow
def step(headline="H.", text="T.", bullets=(), image=None):
    return {"step_headline": headline, "step_text": {"text": text, "bullet_points": list(bullets)},
            "step_assets": {} if image is None else {"image-large": image}}


def article(url, *sections, **extra):
    """``sections``: step counts (plain steps) or lists of step objects."""
    return {"url": url, "title": f"How to {url}",
            "sections": [{"steps": [step(f"H{i}.") for i in range(s)] if isinstance(s, int) else s} for s in sections],
            **extra}


def test_wikihow_procedure_fields_text_images_and_root(tmp_path):
    png(tmp_path / "src" / "img" / "a.png", RED)
    steps = [
        {"step_headline": " Mix. ", "step_text": {"text": " Stir well. ", "bullet_points": [" Use a spoon. ", 3, None, " "]},
         "step_assets": {"image-large": " img/a.png "}},
        {"step_text": "Just text.", "step_assets": "img/a.png"},                       # text as a string; assets not an object
        {"step_headline": None, "step_text": None, "step_assets": {"image-large": " ", "image-src-1": "img/a.png"}},
        {"step_headline": "Serve.", "step_assets": ["img/a.png"]},
    ]
    path = jsonl(tmp_path / "src" / "wikihow-acl22-train.jsonl", [
        {"url": "u1", "categories": "Food > Cooking/ Baking | Cakes", "sections": [{"steps": steps}]},
        {"url": "u2", "title": "Tea", "category": ["Drinks", 7], "sections": [{"steps": [step(), step()]}]},
    ])
    out = tmp_path / "out"
    result = run_adapter("wikihow", path.parent, out / "images")
    assert result.records_read == Counter({"train": 2})
    u1, u2 = result.splits["train"]
    assert (u1.id, u1.split, u1.title, u1.category, u1.alternatives, u1.dag) == (
        "u1#0", "train", "", ["Food", "Cooking", "Baking", "Cakes"], None, None)
    assert (u2.id, u2.title, u2.category) == ("u2#0", "Tea", ["Drinks", "7"])
    assert u1.meta == {"source": "wikihow", "url": "u1", "section": 0}
    assert [s.text for s in u1.steps] == ["Mix. Stir well. Use a spoon.", "Just text.", "", "Serve."]
    assert [len(s.images) for s in u1.steps] == [1, 0, 1, 0]
    assert u1.steps[0].images[0].startswith("images/")
    assert u1.image_path(0) == out / u1.steps[0].images[0]
    assert mean_color(u1.image_path(2)) == RED


def test_wikihow_sections_too_short_are_counted_and_later_sections_kept(tmp_path):
    path = jsonl(tmp_path / "wikihow-train.json", [article("u1", 1, 2, 0, 3), article("u2", 2)])
    result = run_adapter("wikihow", path, None)
    assert [p.id for p in result.splits["train"]] == ["u1#1", "u1#3", "u2#0"]
    assert [p.meta["section"] for p in result.splits["train"]] == [1, 3, 0]
    assert result.dropped == Counter({"too few steps": 2})
    assert result.records_read == Counter({"train": 2})
    assert [p.id for p in run_adapter("wikihow", path, None, min_steps=3).splits["train"]] == ["u1#3"]


def test_wikihow_unreadable_image_skip_drops_only_that_section(tmp_path):
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    path = jsonl(tmp_path / "wikihow-dev.json", [article("u1", [step(), step(image="broken.jpg")], 2)])
    result = run_adapter("wikihow", path, tmp_path / "out" / "images", unreadable_image="skip")
    assert [p.id for p in result.splits["val"]] == ["u1#1"]
    assert result.dropped == Counter({"unreadable image": 1})


def test_wikihow_splits_from_file_names_and_jsonl_files(tmp_path):
    for name in ("wikihow-acl22-train.jsonl", "wikihow-acl22-dev.json", "wikihow-val.json", "test.jsonl",
                 "human-test.json"):
        jsonl(tmp_path / name, [article(name, 2)])
    result = run_adapter("wikihow", tmp_path, None)
    assert {k: sorted(p.id for p in v) for k, v in result.splits.items()} == {
        "train": ["wikihow-acl22-train.jsonl#0"], "val": ["wikihow-acl22-dev.json#0", "wikihow-val.json#0"],
        "test": ["test.jsonl#0"], "test-human": ["human-test.json#0"]}
    assert result.records_read == Counter({"train": 1, "val": 2, "test": 1, "test-human": 1})


def test_wikihow_bad_sources_and_options(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError) as excinfo:
        run_adapter("wikihow", tmp_path / "empty", None)
    assert str(excinfo.value) == f"wikihow: no .json files in {tmp_path / 'empty'}"
    path = jsonl(tmp_path / "articles.json", [article("u1", 2)])
    with pytest.raises(AdapterOptionError) as excinfo:
        run_adapter("wikihow", path, None)
    assert str(excinfo.value) == f"wikihow: cannot tell the split of {path} from its name (needs train, dev or test)"
    with pytest.raises(AdapterOptionError) as excinfo:
        run_adapter("wikihow", path, None, unreadable_image="drop")
    assert str(excinfo.value) == "option unreadable_image='drop': expected one of ['error', 'skip']"


@pytest.mark.parametrize("record, found", [
    (["u1"], ["?: record: expected a JSON object, got list"]),
    ({"sections": []}, ["?: url: missing field"]),
    ({"url": "", "sections": []}, ["?: url: missing field"]),
    ({"url": 5, "sections": []}, ["?: url: missing field"]),
    ({"url": "u1", "sections": {"steps": []}}, ["u1: sections: must be a list"]),
    ({"url": "u1", "sections": ["Mix.", {"steps": [step(), "Bake."]}, {"steps": [step(), step()]}, {"steps": None}]},
     ["u1: sections[0].steps: must be a list of step objects", "u1: sections[1].steps: must be a list of step objects",
      "u1: sections[3].steps: must be a list of step objects"]),
    (article("u1", 2, 3, multiref_gt=[[1, 0]]), ["u1#1: multiref_gt: order 0 [1, 0] is not a permutation of the 3 steps"]),
    (article("u1", [step(headline=" ", text=""), step()], [step(headline=None, text=None), step()]),
     ["u1#0: steps[0]: step has neither text nor image", "u1#1: steps[0]: step has neither text nor image"]),
])
def test_wikihow_bad_article_is_reported_with_line_record_and_field(tmp_path, record, found):
    path = jsonl(tmp_path / "wikihow-test.json", [article("ok", 2), record])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("wikihow", path, None)
    assert problems(excinfo) == [f"{path}:2: {f}" for f in found]


def test_wikihow_multiref_gt_is_checked_against_every_section(tmp_path):
    path = jsonl(tmp_path / "wikihow-test.json", [article("u1", 3, 3, multiref_gt=[[0, 1, 2], [0, 1]])])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("wikihow", path, None)
    assert problems(excinfo) == [f"{path}:1: u1#{s}: multiref_gt: order 1 [0, 1] is not a permutation of the 3 steps"
                                 for s in (0, 1)]


def resplit_src(tmp_path, train=6, dev=4, human=1) -> Path:
    """One article (one 2-step section) per leaf category ``Top > Leaf<i>``."""
    src = tmp_path / "wh"
    arts = [article(f"u{i}", 2, **{"category path": ["Top", "Mid", f"Leaf{i}", "X"]}) for i in range(train + dev + human)]
    jsonl(src / "wikihow-train.json", arts[:train])
    jsonl(src / "wikihow-dev.json", arts[train:train + dev])
    jsonl(src / "wikihow-human-test.json", arts[train + dev:])
    return src


def test_wikihow_resplit_sizes_follow_the_fractions_of_the_whole_pool(tmp_path):
    src = resplit_src(tmp_path)
    result = run_adapter("wikihow", src, None, resplit_by_category=True, resplit_fractions=[0.5, 0.3, 0.2], seed=5)
    sizes = {k: len(v) for k, v in result.splits.items()}
    # 10 train+val procedures in 10 categories: test 2, val 3, the rest train; the golden set is left alone
    assert sizes == {"train": 5, "val": 3, "test": 2, "test-human": 1}
    assert [p.id for p in result.splits["test-human"]] == ["u10#0"]
    assert all(p.split == name for name, procs in result.splits.items() for p in procs)
    assert sorted(p.id for v in result.splits.values() for p in v) == sorted(f"u{i}#0" for i in range(11))
    # all to train; the default seed is 0
    assert {k: len(v) for k, v in run_adapter("wikihow", src, None, resplit_by_category=True,
                                              resplit_fractions=[1, 0, 0]).splits.items()} == {"train": 10, "test-human": 1}
    default = run_adapter("wikihow", src, None, resplit_by_category=True)
    seeded = run_adapter("wikihow", src, None, resplit_by_category=True, seed=0)
    other = run_adapter("wikihow", src, None, resplit_by_category=True, seed=1)
    ids = lambda r: {k: [p.id for p in v] for k, v in r.splits.items()}   # noqa: E731
    assert ids(default) == ids(seeded) != ids(other)
    assert {k: len(v) for k, v in default.splits.items()} == {"train": 8, "val": 1, "test": 1, "test-human": 1}


def test_wikihow_resplit_keeps_each_category_level_in_one_split(tmp_path):
    src = resplit_src(tmp_path)
    whole = run_adapter("wikihow", src, None, resplit_by_category=True, category_level=2)
    assert {k: len(v) for k, v in whole.splits.items()} == {"test": 10, "test-human": 1}   # one shared Top > Mid


@pytest.mark.parametrize("fractions", [[0.5, 0.5], [1.2, -0.1, -0.1], [0.5, 0.3, 0.3], [0.25, 0.25, 0.25, 0.25]])
def test_wikihow_resplit_fractions_must_be_three_non_negative_numbers_summing_to_1(tmp_path, fractions):
    with pytest.raises(AdapterOptionError) as excinfo:
        run_adapter("wikihow", resplit_src(tmp_path), None, resplit_by_category=True, resplit_fractions=fractions)
    assert str(excinfo.value) == f"option resplit_fractions={fractions}: 3 non-negative numbers summing to 1"


# ---------------------------------------------------------------- ROC / SIND
def tsv(path: Path, *lines: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def roc_folder(tmp_path) -> Path:
    src = tmp_path / "roc"
    tsv(src / "dev.tsv", "d1 . <eos> d2 .", "only one .", "", "d3 . <eos> d4 .")
    tsv(src / "train.tsv", "t1 . <eos> t2 .", "t3 . <eos>  <eos> t4 .", "t5 . <eos> t6 . <eos> t7 .")
    tsv(src / "held" / "test.tsv", "x1 . <eos> x2 .")
    (src / "notes.txt").write_text("not a story file")
    return src


def test_roc_adapter_reads_every_tsv_with_its_split_and_counts(tmp_path):
    src = roc_folder(tmp_path)
    result = run_adapter("roc", src, None)
    assert {k: [p.id for p in v] for k, v in result.splits.items()} == {
        "val": ["dev-1", "dev-4"], "test": ["test-1"], "train": ["train-1", "train-3"]}
    assert [s.text for s in result.splits["train"][1].steps] == ["t5 .", "t6 .", "t7 ."]
    assert result.records_read == Counter({"dev.tsv": 3, "test.tsv": 1, "train.tsv": 3})   # blank lines are not records
    assert result.dropped == Counter({"bad line": 2})


def test_roc_adapter_options_split_max_stories_and_bad_lines(tmp_path):
    src = roc_folder(tmp_path)
    forced = run_adapter("roc", src, None, split="test-sind")
    assert list(forced.splits) == ["test-sind"] and len(forced.splits["test-sind"]) == 5
    first = run_adapter("roc", src, None, max_stories=1)
    assert [p.id for p in first.all_procedures()] == ["dev-1", "test-1", "train-1"]
    assert first.records_read == Counter({"dev.tsv": 1, "test.tsv": 1, "train.tsv": 1})
    one = run_adapter("roc", src / "train.tsv", None)
    assert [p.id for p in one.splits["train"]] == ["train-1", "train-3"]
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("roc", src, None, bad_lines="error")
    assert problems(excinfo) == [   # every bad line of every file, in file-name order
        f"{src / 'dev.tsv'}:2: dev-2: steps: a story needs at least 2 sentences separated by ' <eos> ', got 1",
        f"{src / 'train.tsv'}:2: train-2: steps: sentence 1 is empty"]
    with pytest.raises(AdapterOptionError) as excinfo:
        run_adapter("roc", src, None, bad_lines="warn")
    assert str(excinfo.value) == "option bad_lines='warn': expected one of ['error', 'skip']"


def test_roc_adapter_bad_sources(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as excinfo:
        run_adapter("roc", tmp_path / "empty", None)
    assert str(excinfo.value) == f"roc: no .tsv files in {tmp_path / 'empty'}"
    path = tsv(tmp_path / "stories.tsv", "a . <eos> b .")
    with pytest.raises(AdapterOptionError) as excinfo:
        run_adapter("roc", path, None)
    assert str(excinfo.value) == f"roc: cannot tell the split of {path} from its name; set option split=..."
    assert [p.id for p in run_adapter("roc", path, None, split="train").splits["train"]] == ["stories-1"]


def test_read_roc_records_meta_reasons_and_logs_skipped_lines(tmp_path, caplog):
    from data_modules.adapters.roc import read_roc

    path = tmp_path / "sind.tsv"
    path.write_bytes("café . <eos> b .\n  \na . <eos> b . <eos> \n<eos>\nc . <eos> d .\n".encode())
    with caplog.at_level(logging.WARNING, logger="data_modules.adapters.roc"):
        procs = read_roc(path, "val")
    assert [(p.id, p.split, p.meta, p.origin) for p in procs] == [
        ("sind-1", "val", {"source": "roc", "file": "sind.tsv", "line": 1}, (str(path), 1)),
        ("sind-5", "val", {"source": "roc", "file": "sind.tsv", "line": 5}, (str(path), 5))]
    assert procs[0].steps[0].text == "café ."
    assert caplog.messages == [f"{path}: skipped 2 bad line(s) (fewer than 2 sentences or an empty sentence)"]
    with pytest.raises(ProcedureFormatError) as excinfo:
        read_roc(path, "val", bad_lines="error")
    assert problems(excinfo) == [f"{path}:3: sind-3: steps: sentence 2 is empty",
                                 f"{path}:4: sind-4: steps: sentence 0 is empty"]
    dropped = Counter({"bad line": 1})
    read_roc(path, "val", dropped=dropped)
    assert dropped == Counter({"bad line": 3})                          # added to what was there
    assert read_roc(path, "val", max_stories=0) == []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="data_modules.adapters.roc"):
        read_roc(path, "val", max_stories=1)
    assert caplog.messages == []
    with pytest.raises(FileNotFoundError) as excinfo:
        read_roc(tmp_path / "nope.tsv", "train")
    assert str(excinfo.value) == f"ROC file not found: {tmp_path / 'nope.tsv'}"
    with pytest.raises(FileNotFoundError):
        read_roc(tmp_path, "train")                                     # a folder is not a story file


@pytest.mark.parametrize("bad_lines", ["skip", "error"])
def test_read_roc_bytes_that_are_not_utf8_are_errors_naming_file_line_and_column(tmp_path, bad_lines):
    from data_modules.adapters.roc import read_roc

    path = tmp_path / "sind.tsv"
    path.write_bytes(b"a . <eos> b .\n" + "café . <eos> ".encode() + b"na\xefve .\n"   # column in characters: é is one
                     b"one sentence \xff\n\xe2\x80 . <eos> x .\nc . <eos> d .\n")
    with pytest.raises(ProcedureFormatError) as excinfo:   # whatever bad_lines says: a byte is never replaced
        read_roc(path, "train", bad_lines=bad_lines)
    assert problems(excinfo) == [
        f"{path}:2: sind-2: steps[1].text: not valid UTF-8 (byte 0xef at column 16); save the file as UTF-8",
        f"{path}:3: sind-3: steps[0].text: not valid UTF-8 (byte 0xff at column 14); save the file as UTF-8",
        f"{path}:4: sind-4: steps[0].text: not valid UTF-8 (byte 0xe2 at column 1); save the file as UTF-8"]


@pytest.mark.parametrize("kwargs, message", [
    ({"train_path": ""}, "data.train_path: the ROC source needs a train file"),
    ({"val_fraction": 1.0}, "option val_fraction=1.0: must be in [0, 1)"),
    ({"val_fraction": -0.1}, "option val_fraction=-0.1: must be in [0, 1)"),
    ({"test_fraction": 1}, "option test_fraction=1: must be in [0, 1)"),
    ({"val_fraction": 0.5, "test_fraction": 0.5}, "held-out fractions {'val': 0.5, 'test': 0.5} leave no training stories"),
    ({"val_fraction": 0.7, "test_fraction": 0.4}, "held-out fractions {'val': 0.7, 'test': 0.4} leave no training stories"),
])
def test_roc_source_bad_options_name_the_option(tmp_path, kwargs, message):
    from data_modules.adapters.roc import roc_source

    path = tsv(tmp_path / "train.tsv", "a . <eos> b .")
    with pytest.raises(AdapterOptionError) as excinfo:
        roc_source(**{"train_path": str(path), **kwargs})
    assert str(excinfo.value) == message


def test_roc_source_held_out_slices_keep_file_order_and_round_sizes(tmp_path):
    from data_modules.adapters.roc import roc_source

    path = tsv(tmp_path / "train.tsv", *[f"s{w} a . <eos> s{w} b ." for w in "abcdefghij"])
    splits = roc_source(str(path), val_fraction=0.26, test_fraction=0.14, seed=4)
    assert {k: len(v) for k, v in splits.items()} == {"train": 6, "val": 3, "test": 1}
    for name, procs in splits.items():
        lines = [p.meta["line"] for p in procs]
        assert lines == sorted(lines) and all(p.split == name for p in procs)
    # no slice at all: everything is train
    none = roc_source(str(path), val_fraction=0.0, test_fraction=0.0)
    assert {k: [p.id for p in v] for k, v in none.items()} == {"train": [f"train-{i}" for i in range(1, 11)],
                                                               "val": [], "test": []}
    # both files given: nothing is cut from train
    other = tsv(tmp_path / "other.tsv", "o . <eos> p .")
    more = tsv(tmp_path / "more.tsv", "q . <eos> r .")
    given = roc_source(str(path), val_path=str(other), test_path=str(more), bad_lines="error", max_stories=4)
    assert {k: [p.id for p in v] for k, v in given.items()} == {
        "train": ["train-1", "train-2", "train-3", "train-4"], "val": ["other-1"], "test": ["more-1"]}
    assert [p.split for p in given["val"] + given["test"]] == ["val", "test"]


def test_roc_source_passes_bad_lines_and_max_stories_to_every_file(tmp_path):
    from data_modules.adapters.roc import roc_source

    train = tsv(tmp_path / "train.tsv", "a . <eos> b .", "c . <eos> d .")
    bad = tsv(tmp_path / "bad.tsv", "one sentence .", "e . <eos> f .", "g . <eos> h .")
    for kwargs in ({"val_path": str(bad)}, {"test_path": str(bad)}, {"extra_train_paths": [str(bad)]}):
        with pytest.raises(ProcedureFormatError) as excinfo:
            roc_source(str(train), bad_lines="error", **kwargs)
        assert problems(excinfo) == [f"{bad}:1: bad-1: steps: a story needs at least 2 sentences separated by "
                                     "' <eos> ', got 1"]
    test = tsv(tmp_path / "test.tsv", "one sentence .", "i . <eos> j .", "k . <eos> l .")
    extra = tsv(tmp_path / "extra.tsv", "one sentence .", "m . <eos> n .", "o . <eos> p .")
    split = roc_source(str(train), val_path=str(bad), test_path=str(test), extra_train_paths=[str(extra)], max_stories=1)
    assert {k: [p.id for p in v] for k, v in split.items()} == {"train": ["train-1", "extra-2"], "val": ["bad-2"],
                                                                "test": ["test-2"]}


def test_roc_source_leaves_out_held_out_stories_in_any_surface_form_counted_by_file(tmp_path, caplog):
    from data_modules.adapters.roc import roc_source

    train = tsv(tmp_path / "train.tsv", "a . <eos> b .")
    val = tsv(tmp_path / "val.tsv", "Same  Story . <eos> two .", "it was 5 o'clock . <eos> done .")
    test = tsv(tmp_path / "test.tsv", "it was n't me . <eos> i 'm sure .")
    extra = tsv(tmp_path / "extra.tsv", "same story. <eos>   TWO .", "new . <eos> one .", "It wasn't me. <eos> I'm  sure!")
    more = tsv(tmp_path / "more.tsv", "Same <eos> story two", "it was 0 o ' clock <eos> done", "other . <eos> one .")
    with caplog.at_level(logging.WARNING, logger="data_modules.adapters.roc"):
        split = roc_source(str(train), val_path=str(val), test_path=str(test), extra_train_paths=[str(extra), str(more)])
    assert [p.id for p in split["train"]] == ["train-1", "extra-2", "more-3"]
    assert [p.id for p in split["val"] + split["test"]] == ["val-1", "val-2", "test-1"]
    assert caplog.messages == [
        f"data.extra_train_paths[0]={extra}: left out 2 training stories that are validation or test stories",
        f"data.extra_train_paths[1]={more}: left out 2 training stories that are validation or test stories"]


def test_roc_source_leaves_a_copy_of_a_held_out_slice_story_out_of_the_train_file(tmp_path, caplog):
    from data_modules.adapters.roc import roc_source

    # 11 stories, seed 0: the permutation is [4 6 7 2 0 3 5 10 9 8 1], so val is line 5 and test line 7;
    # line 11 is line 5 again in another surface form
    train = tsv(tmp_path / "train.tsv", *[f"s{w} a . <eos> s{w} b ." for w in "abcdefghij"], "SE a.<eos>Se  B.")
    with caplog.at_level(logging.WARNING, logger="data_modules.adapters.roc"):
        split = roc_source(str(train))
    assert {k: [p.id for p in v] for k, v in split.items()} == {
        "train": [f"train-{i}" for i in (1, 2, 3, 4, 6, 8, 9, 10)], "val": ["train-5"], "test": ["train-7"]}
    assert caplog.messages == [f"data.train_path={train}: left out 1 training stories that are validation or test stories"]


@pytest.mark.parametrize("a, b", [
    ("Don't stop . <eos> It was 5 o'clock .", "do n't stop. <eos> it  was 0 o ' clock !"),
    ("a . <eos> b .", "A.<eos>B"),
    ("a b . <eos> c .", "a . <eos> b c ."),            # sentence breaks do not count either
    ("caf\u00e9 .", "cafe\u0301 ."),                   # composed and decomposed é (NFKC)
])
def test_story_key_equal_for_surface_forms_of_one_story(a, b):
    from data_modules.adapters.roc import SEPARATOR, story_key
    from seqaware.procedure import Procedure, Step

    def story(line):
        return Procedure(id="x", steps=[Step(text=s.strip()) for s in line.split(SEPARATOR)])

    assert story_key(story(a)) == story_key(story(b))
    assert story_key(story(a)) != story_key(story(a + " <eos> more ."))
    assert story_key(story("do stop . <eos> x .")) != story_key(story("do n't stop . <eos> x ."))

