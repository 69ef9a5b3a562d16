"""``prepare_dataset``: the prepared folder a user trains and evaluates from (split files, images/,
tasks/, conversion.json) and the option errors that stop a conversion before anything is written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_modules.adapters import AdapterOptionError
from data_modules.adapters.prepare import prepare_dataset
from data_modules.tasks.iso import iso_instances
from seqaware.procedure import ProcedureFormatError, read_procedures
from adapter_helpers import jsonl, mean_color
from test_adapter_readers import BLUE, GREEN, RED, article, png, step
from test_adapters import RFG_EDGES, RFG_TOKENS, write_rfg

COLORS = [RED, GREEN, BLUE, RED]


def wikihow_with_images(tmp_path) -> Path:
    """A WikiHow folder: one train and one dev article of 4 steps, every step with its own image."""
    src = tmp_path / "wikihow"
    for i, color in enumerate(COLORS):
        png(src / "img" / f"s{i}.png", color)
    steps = [step(f"Step {i}.", image=f"img/s{i}.png") for i in range(4)]
    jsonl(src / "wikihow-acl22-train.jsonl", [article("cake", steps)])
    jsonl(src / "wikihow-acl22-dev.jsonl", [article("tea", steps)])
    return src


def test_prepare_dataset_writes_splits_images_tasks_and_conversion_record(tmp_path):
    src = wikihow_with_images(tmp_path)
    out = tmp_path / "prepared"
    iso_options = {"min_steps": 3, "ks": [2], "max_candidates": 1}
    result, instances = prepare_dataset("wikihow", src, out, tasks=["iso", "teo"], options={"min_steps": 2},
                                        task_options={"iso": iso_options}, progress=False)
    # split files: the procedures, their images copied under out/images and referenced relative to out
    train = read_procedures(out / "train.jsonl")
    val = read_procedures(out / "val.jsonl")
    assert [p.id for p in train] == ["cake#0"] and [p.id for p in val] == ["tea#0"]
    for proc in train + val:
        assert all(len(s.images) == 1 and s.images[0].startswith("images/") for s in proc.steps)
        assert [mean_color(out / s.images[0]) for s in proc.steps] == COLORS
    assert len(list((out / "images").iterdir())) > 0
    # the task options reach their builder (by default a 4-step plan is too short for ISO)
    assert all(iso_instances(p) == [] for p in result.all_procedures())
    expected_iso = [inst for procs in result.splits.values() for p in procs for inst in iso_instances(p, **iso_options)]
    assert expected_iso and instances == {"iso": expected_iso, "teo": []}   # no DAG: no TEO pairs
    assert [json.loads(line) for line in (out / "tasks" / "iso.jsonl").read_text().splitlines()] == expected_iso
    assert (out / "tasks" / "teo.jsonl").read_text() == ""
    assert all(mean_color(out / inst["image"]) in COLORS for inst in expected_iso)
    assert json.loads((out / "conversion.json").read_text()) == {
        "dataset": "wikihow", "src": str(src.resolve()), "options": {"min_steps": 2},
        "tasks": {"iso": len(expected_iso), "teo": 0}, "task_options": {"iso": iso_options},
        "records_read": {"train": 1, "val": 1}, "dropped": {}, "splits": {"train": 1, "val": 1}}


def test_prepare_dataset_removes_an_images_folder_left_empty(tmp_path):
    src = tmp_path / "wikihow"
    jsonl(src / "wikihow-test.jsonl", [article("u1", 3)])
    out = tmp_path / "out"
    prepare_dataset("wikihow", src, out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["conversion.json", "test.jsonl"]
    assert [p.id for p in read_procedures(out / "test.jsonl")] == ["u1#0"]


def test_prepare_dataset_creates_out_with_its_parents(tmp_path):
    write_rfg(tmp_path / "rfg", "R0", RFG_TOKENS, RFG_EDGES)
    out = tmp_path / "runs" / "data" / "rfg"
    prepare_dataset("rfg", tmp_path / "rfg", out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["conversion.json", "test.jsonl"]
    record = json.loads((out / "conversion.json").read_text())
    assert (record["src"], record["splits"], record["tasks"]) == (str((tmp_path / "rfg").resolve()), {"test": 1}, {})


def test_prepare_dataset_records_path_options_as_strings(tmp_path):
    png(tmp_path / "mirror" / "media" / "a.png", BLUE)
    src = jsonl(tmp_path / "iso.jsonl", [{"snippet": ["Mix.", "Bake."], "image": "https://example.org/media/a.png",
                                          "label": "yes"}])
    out = tmp_path / "out"
    _, instances = prepare_dataset("iso", src, out, options={"url_root": tmp_path / "mirror"}, progress=False)
    (inst,) = instances["iso"]
    assert inst["label"] == "DEP" and mean_color(out / inst["image"]) == BLUE
    record = json.loads((out / "conversion.json").read_text())
    assert (record["options"], record["tasks"], record["splits"]) == ({"url_root": str(tmp_path / "mirror")}, {"iso": 1}, {})


def catbench_questions(tmp_path) -> Path:
    q = {"plan_idx": 3, "question_idx": 7, "question_type": "dependent_real_before", "direction": "before",
         "steps": ["Cut.", "Cook."], "first_step_idx": 0, "second_step_idx": 1, "label": "yes"}
    return jsonl(tmp_path / "q.jsonl", [q])


@pytest.mark.parametrize("dataset, tasks, task_options, message", [
    ("rfg", ("teo",), {"iso": {"ks": [2]}, "coherence": {}},
     "task options given for task(s) ['coherence', 'iso'] that were not requested (tasks: ['teo'])"),
    ("rfg", (), {"teo": {"pairs": "reduction"}}, "task options given for task(s) ['teo'] that were not requested (tasks: [])"),
    ("catbench", ["catbench"], None, "task 'catbench' is already provided by the catbench adapter; do not request it again"),
])
def test_prepare_dataset_option_errors_write_nothing(tmp_path, dataset, tasks, task_options, message):
    if dataset == "rfg":
        write_rfg(tmp_path / "rfg", "R0", RFG_TOKENS, RFG_EDGES)
        src = tmp_path / "rfg"
    else:
        src = catbench_questions(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(AdapterOptionError) as excinfo:
        prepare_dataset(dataset, src, out, tasks=tasks, task_options=task_options, progress=False)
    assert str(excinfo.value) == message
    assert not out.exists()


def test_prepare_dataset_rejects_a_procedure_in_two_splits_naming_the_source(tmp_path):
    src = tmp_path / "wikihow"
    jsonl(src / "train.jsonl", [article("u1", 2), article("u2", 2)])
    jsonl(src / "test.jsonl", [article("u1", 2)])
    out = tmp_path / "out"
    with pytest.raises(ProcedureFormatError) as excinfo:
        prepare_dataset("wikihow", src, out, progress=False)
    assert [str(p) for p in excinfo.value.problems] == [f"{src}: u1#0: id: in both the test and the train split"]
    assert not list(out.glob("*.jsonl")) and not (out / "conversion.json").exists()
