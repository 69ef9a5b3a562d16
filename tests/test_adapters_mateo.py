"""MATEO adapter: options, file discovery, splits, step / graph validation, the procedures it builds.

Every case is a small synthetic export written to tmp_path; problems are checked as the exact
``file:line: id: field: reason`` lines a user sees.
"""
from __future__ import annotations

import json
import sys
import types
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from data_modules.adapters import AdapterOptionError, run_adapter
from seqaware.procedure import ProcedureFormatError
from adapter_helpers import jsonl


# ---------------------------------------------------------------- helpers
def recipe(rid, n=2, **extra):
    """A valid MATEO row with ``n`` steps (ids 1..n, a chain 1 -> 2 -> ... via out_nodes), English and Italian text."""
    steps = [{"id": i, "image": None, "out_nodes": [i + 1] if i < n else [],
              "text_eng": f"step {i}", "text_it": f"passo {i}"} for i in range(1, n + 1)]
    row = {"id": rid, "title_eng": f"Recipe {rid}", "title_it": f"Ricetta {rid}", "steps": steps}
    row.update(extra)
    return row


def problems(src, **options) -> list[str]:
    """The problem lines of a conversion that must fail."""
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("mateo", src, None, **options)
    return [str(p) for p in excinfo.value.problems]


def png(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (255, 0, 0)).save(path, format="PNG")
    return path


# ---------------------------------------------------------------- options and files
@pytest.mark.parametrize("options, message", [
    ({"language": "fr"}, "option language='fr': expected one of ['en', 'it']"),
    ({"unreadable_image": "ignore"}, "option unreadable_image='ignore': expected one of ['error', 'skip']"),
])
def test_bad_options_name_the_option(tmp_path, options, message):
    jsonl(tmp_path / "train.jsonl", [recipe("r1")])
    with pytest.raises(AdapterOptionError) as excinfo:
        run_adapter("mateo", tmp_path, None, **options)
    assert str(excinfo.value) == message


def test_folder_without_exports_is_reported(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(FileNotFoundError) as excinfo:
        run_adapter("mateo", tmp_path, None)
    assert str(excinfo.value) == f"mateo: no .json, .jsonl or .parquet files in {tmp_path}"


def test_json_document_export_is_read(tmp_path):
    """A ``.json`` file holding a list of rows (not JSON lines) is an export too; its split comes from its name."""
    (tmp_path / "validation.json").write_text(json.dumps([recipe("v1"), recipe("v2", n=3)], indent=1))
    result = run_adapter("mateo", tmp_path, None)
    assert [p.id for p in result.splits["val"]] == ["v1", "v2"]
    assert result.records_read == Counter({"val": 2})


def test_bad_json_line_is_reported_with_the_others(tmp_path):
    path = jsonl(tmp_path / "train.jsonl", [recipe("ok"), "{not json", {"title_eng": "no id", "steps": []}])
    assert problems(path) == [
        f"{path}:2: ?: json: not valid JSON: Expecting property name enclosed in double quotes (column 2)",
        f"{path}:3: ?: id: missing field",
    ]


def test_record_that_is_not_an_object(tmp_path):
    path = jsonl(tmp_path / "train.jsonl", [recipe("ok"), "[1, 2]", '"just text"'])
    assert problems(path) == [
        f"{path}:2: ?: record: expected a JSON object, got list",
        f"{path}:3: ?: record: expected a JSON object, got str",
    ]


# ---------------------------------------------------------------- splits
def test_split_field_wins_over_the_file_name_and_validation_means_val(tmp_path):
    path = jsonl(tmp_path / "train.jsonl", [
        recipe("a"), recipe("b", split="test"), recipe("c", split="validation"), recipe("d", split="test-golden"),
        recipe("e"),
    ])
    result = run_adapter("mateo", path, None)
    assert {name: [p.id for p in procs] for name, procs in result.splits.items()} == {
        "train": ["a", "e"], "test": ["b"], "val": ["c"], "test-golden": ["d"]}
    assert all(p.split == name for name, procs in result.splits.items() for p in procs)
    assert result.records_read == Counter({"train": 2, "test": 1, "val": 1, "test-golden": 1})


def test_split_field_needed_when_the_file_name_has_none(tmp_path):
    path = jsonl(tmp_path / "recipes.jsonl", [recipe("a", split="validation"), recipe("b"), recipe("c", split="dev")])
    assert problems(path) == [
        f"{path}:2: b: split: no split field and no split in the file name recipes.jsonl",
        f"{path}:3: c: split: unknown split 'dev'",
    ]


# ---------------------------------------------------------------- steps
@pytest.mark.parametrize("steps, line", [
    (None, "steps: missing field"),
    ([], "steps: must be a non-empty list of steps"),
    ("boil the pasta", "steps: must be a non-empty list of steps"),
    ({"1": {"id": 1}}, "steps: must be a non-empty list of steps"),
])
def test_steps_must_be_a_non_empty_list(tmp_path, steps, line):
    row = recipe("r9")
    if steps is None:
        del row["steps"]
    else:
        row["steps"] = steps
    path = jsonl(tmp_path / "test.jsonl", [recipe("ok"), row])
    assert problems(path) == [f"{path}:2: r9: {line}"]


def test_every_bad_step_is_reported(tmp_path):
    """Steps without an id (or not objects), duplicate ids and non-string texts: all reported at once."""
    row = recipe("r1", n=3)
    row["steps"] = ["just text", {"text_eng": "no id"}, row["steps"][0], dict(row["steps"][1], id=1),
                    dict(row["steps"][2], text_eng=["not", "a", "string"])]
    path = jsonl(tmp_path / "test.jsonl", [row])
    assert problems(path) == [
        f"{path}:1: r1: steps[0].id: missing field",
        f"{path}:1: r1: steps[1].id: missing field",
        f"{path}:1: r1: steps[3].id: duplicate step id 1",
        f"{path}:1: r1: steps[4].text_eng: must be a string",
    ]


def test_text_checked_in_the_chosen_language(tmp_path):
    row = recipe("r1")
    row["steps"][1]["text_it"] = 42
    path = jsonl(tmp_path / "test.jsonl", [row])
    assert run_adapter("mateo", path, None).num_procedures == 1          # English text is fine
    assert problems(path, language="it") == [f"{path}:1: r1: steps[1].text_it: must be a string"]


def test_step_with_only_an_image_and_no_title(tmp_path):
    png(tmp_path / "img" / "a.png")
    row = recipe("r1")
    del row["title_eng"]
    row["steps"][0]["image"] = "img/a.png"
    del row["steps"][0]["text_eng"]
    path = jsonl(tmp_path / "train.jsonl", [row])
    (proc,) = run_adapter("mateo", path, None).splits["train"]
    assert proc.title == ""
    assert proc.steps[0].text is None and proc.steps[0].images == [str((tmp_path / "img" / "a.png").resolve())]
    assert proc.steps[1].text == "step 2" and proc.steps[1].images == []


def test_procedure_checks_name_the_source_line(tmp_path):
    """A one-step recipe or a step with neither text nor image is reported at the row it came from."""
    empty = recipe("r2")
    del empty["steps"][1]["text_eng"]
    path = jsonl(tmp_path / "test.jsonl", [recipe("ok"), recipe("r1", n=1), empty])
    assert problems(path) == [
        f"{path}:2: r1: steps: a procedure needs at least 2 steps, got 1",
        f"{path}:3: r2: steps[1]: step has neither text nor image",
    ]


# ---------------------------------------------------------------- the step graph
def test_built_procedure(tmp_path):
    png(tmp_path / "src" / "img" / "a.png")
    row = recipe("m1", n=3, graph={"10": [30], "20": ["30"], "30": None})
    for step, sid in zip(row["steps"], (10, 20, 30)):
        step["id"] = sid
    row["steps"][0]["image"] = "img/a.png"
    path = jsonl(tmp_path / "src" / "train.jsonl", [row])
    out = tmp_path / "out"
    (proc,) = run_adapter("mateo", path, out / "images", language="it").splits["train"]
    assert proc.id == "m1" and proc.split == "train" and proc.title == "Ricetta m1"
    assert [s.text for s in proc.steps] == ["passo 1", "passo 2", "passo 3"]
    assert proc.dag == [(0, 2), (1, 2)]
    assert proc.category == ["recipe"]
    assert proc.meta == {"source": "mateo", "step_ids": [10, 20, 30]}
    assert proc.root == str(out)
    (stored,) = proc.steps[0].images
    assert stored.startswith("images/") and proc.image_path(0) == out / stored
    assert (out / stored).read_bytes() == (tmp_path / "src" / "img" / "a.png").read_bytes()


def test_out_nodes_give_the_dag_when_there_is_no_graph(tmp_path):
    row = recipe("m2", n=4)
    row["steps"][0]["out_nodes"] = [2, 3]
    row["steps"][1]["out_nodes"] = [4]
    row["steps"][2]["out_nodes"] = None
    row["steps"][3]["out_nodes"] = []
    path = jsonl(tmp_path / "val.jsonl", [row])
    (proc,) = run_adapter("mateo", path, None).splits["val"]
    assert proc.dag == [(0, 1), (0, 2), (1, 3)]


def test_graph_must_be_a_mapping(tmp_path):
    path = jsonl(tmp_path / "test.jsonl", [recipe("g1", graph=[[1, 2]])])
    assert problems(path) == [f"{path}:1: g1: graph: must map step ids to lists of out-node ids"]


def test_every_bad_graph_entry_is_reported(tmp_path):
    path = jsonl(tmp_path / "test.jsonl", [
        recipe("g1", n=3, graph={"9": [1], "8": [2], "1": [7, 6], "2": "3", "3": {"x": 1}}),
    ])
    assert problems(path) == [
        f"{path}:1: g1: graph['9']: unknown step id '9'",
        f"{path}:1: g1: graph['8']: unknown step id '8'",
        f"{path}:1: g1: graph['1']: out-node 7 is not a step id of this recipe",
        f"{path}:1: g1: graph['1']: out-node 6 is not a step id of this recipe",
        f"{path}:1: g1: graph['2']: must be a list of out-node ids",
        f"{path}:1: g1: graph['3']: must be a list of out-node ids",
    ]


def test_bad_out_nodes_are_reported_against_the_steps(tmp_path):
    row = recipe("o1", n=3)
    row["steps"][0]["out_nodes"] = [5]
    row["steps"][1]["out_nodes"] = "3"
    cyc = recipe("o2", n=3)
    cyc["steps"][2]["out_nodes"] = [1]
    path = jsonl(tmp_path / "test.jsonl", [row, cyc])
    assert problems(path) == [
        f"{path}:1: o1: steps[].out_nodes['1']: out-node 5 is not a step id of this recipe",
        f"{path}:1: o1: steps[].out_nodes['2']: must be a list of out-node ids",
        f"{path}:2: o2: steps[].out_nodes: the step graph has a cycle: 1 -> 2 -> 3 -> 1 (step ids)",
    ]


# ---------------------------------------------------------------- parquet (pyarrow stood in by a stub)
@pytest.fixture
def fake_pyarrow(monkeypatch):
    """A stand-in ``pyarrow.parquet`` whose tables are the JSON list stored in the ``.parquet`` file."""
    class Table:
        def __init__(self, rows):
            self.rows = rows

        def to_pylist(self):
            return list(self.rows)

    parquet = types.ModuleType("pyarrow.parquet")
    parquet.read_table = lambda path: Table(json.loads(Path(path).read_text()))
    pyarrow = types.ModuleType("pyarrow")
    pyarrow.parquet = parquet
    monkeypatch.setitem(sys.modules, "pyarrow", pyarrow)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", parquet)


def test_parquet_rows_are_numbered_from_one(tmp_path, fake_pyarrow):
    (tmp_path / "train-00000-of-00001.parquet").write_text(json.dumps([recipe("p1"), recipe("p2", n=3)]))
    result = run_adapter("mateo", tmp_path, None)
    assert [p.id for p in result.splits["train"]] == ["p1", "p2"]
    bad = tmp_path / "test-00000-of-00001.parquet"
    bad.write_text(json.dumps([recipe("p3"), recipe("p4", n=1)]))
    assert problems(tmp_path) == [f"{bad}:2: p4: steps: a procedure needs at least 2 steps, got 1"]


def test_parquet_without_pyarrow_says_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "train-00000.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ImportError) as excinfo:
        run_adapter("mateo", tmp_path, None)
    assert str(excinfo.value) == (f"mateo: reading {path} needs pyarrow (pip install pyarrow), "
                                  "or export the dataset as JSON lines")
