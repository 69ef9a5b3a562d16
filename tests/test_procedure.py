"""Procedure data model: round trip, validation messages, and the validation script."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from seqaware.procedure import Procedure, ProcedureFormatError, Step, read_procedures, write_procedures

ROOT = Path(__file__).resolve().parents[1]


def _good(i: int, **extra) -> dict:
    rec = {"id": f"p{i}", "split": "train", "title": "t", "category": ["a", "b"],
           "steps": [{"text": "Mix the flour.", "images": []}, {"text": "Bake it.", "images": ["img.png"]},
                     {"text": "Serve.", "images": []}],
           "dag": [[0, 1], [1, 2]]}
    rec.update(extra)
    return rec


@pytest.fixture
def folder(tmp_path) -> Path:
    Image.new("RGB", (8, 8), "red").save(tmp_path / "img.png")
    return tmp_path


def _write(folder: Path, lines: list) -> Path:
    path = folder / "procs.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_round_trip(folder):
    proc = Procedure(id="x", split="val", title="T", category=["c"], dag=[(0, 1)], alternatives=[[1, 0]],
                     steps=[Step(text="a", images=["img.png"], boxes=[[0, 0, 4, 4]], box_labels=["thing"]), Step(text="b")],
                     meta={"k": 1})
    path = folder / "out.jsonl"
    write_procedures(path, [proc])
    back = read_procedures(path)[0]
    assert back.to_dict() == proc.to_dict()
    assert back.image_path(0) == folder / "img.png"
    assert back.image_path(1) is None


def test_valid_file_reads(folder):
    path = _write(folder, [_good(1), _good(2, split="test-golden")])
    procs = read_procedures(path)
    assert [p.id for p in procs] == ["p1", "p2"]
    assert procs[0].dag == [(0, 1), (1, 2)]


def _steps(*steps) -> list:
    return [{"text": "a"}, *steps]


BAD_CASES = {
    # every rule of seqaware.procedure.validate_record: (bad record, record id, exact message after the id)
    "not an object": (lambda: [1, 2], "?", "record: expected a JSON object, got list"),
    "missing field": (lambda: {k: v for k, v in _good(1).items() if k != "split"}, "p1", "split: missing field"),
    "id not a string": (lambda: _good(1, id=[1]), "[1]", "id: must be a string"),
    "steps not a list": (lambda: _good(1, steps="a. b.", dag=None), "p1", "steps: must be a list"),
    "step not an object": (lambda: _good(1, steps=_steps("b"), dag=None), "p1",
                           "steps[1]: must be an object with text and/or images"),
    "text not a string": (lambda: _good(1, steps=_steps({"text": 3, "images": ["img.png"]}), dag=None), "p1", "steps[1].text: must be a string"),
    "images not a list": (lambda: _good(1, steps=_steps({"text": "b", "images": "img.png"}), dag=None), "p1",
                          "steps[1].images: must be a list of paths"),
    "no text no image": (lambda: _good(1, steps=[{"text": "a"}, {"text": "  ", "images": []}], dag=None), "p1",
                         "steps[1]: step has neither text nor image"),
    "image missing": (lambda: _good(1, steps=_steps({"text": "b", "images": ["nope.png"]}), dag=None), "p1",
                      "steps[1].images[0]: image file not found: {folder}/nope.png"),
    "bad boxes": (lambda: _good(1, steps=_steps({"text": "b", "boxes": [[0, 0, 1]]}), dag=None), "p1",
                  "steps[1].boxes: must be a list of [x0, y0, x1, y1] boxes"),
    "box of 5 numbers": (lambda: _good(1, steps=_steps({"text": "b", "boxes": [[0, 0, 1, 1], [0, 0, 1, 1, 9]]}), dag=None),
                         "p1", "steps[1].boxes: must be a list of [x0, y0, x1, y1] boxes"),
    "box coordinate not a number": (lambda: _good(1, steps=_steps({"text": "b", "boxes": [[0, 0, "1", 1]]}), dag=None),
                                    "p1", "steps[1].boxes: must be a list of [x0, y0, x1, y1] boxes"),
    "box coordinate a boolean": (lambda: _good(1, steps=_steps({"text": "b", "boxes": [[0, 0, True, 1]]}), dag=None),
                                 "p1", "steps[1].boxes: must be a list of [x0, y0, x1, y1] boxes"),
    "boxes not a list of boxes": (lambda: _good(1, steps=_steps({"text": "b", "boxes": [0, 0, 1, 1]}), dag=None),
                                  "p1", "steps[1].boxes: must be a list of [x0, y0, x1, y1] boxes"),
    "box labels count": (lambda: _good(1, steps=_steps({"text": "b", "boxes": [[0, 0, 1, 1]], "box_labels": []}), dag=None),
                         "p1", "steps[1].box_labels: 0 labels for 1 boxes"),
    "dag not pairs": (lambda: _good(1, dag=[[0, 1, 2]]), "p1", "dag: must be a list of [from, to] step-index pairs"),
    "dag edge not ints": (lambda: _good(1, dag=[[0, "1"]]), "p1", "dag[0]: edge [0, '1'] must join two step indices"),
    "unknown step": (lambda: _good(1, dag=[[0, 7]]), "p1", "dag[0]: edge [0, 7] points to an unknown step (procedure has 3 steps)"),
    "self loop": (lambda: _good(1, dag=[[1, 1]]), "p1", "dag[0]: edge [1, 1] is a self loop"),
    "cyclic dag": (lambda: _good(1, dag=[[0, 1], [1, 2], [2, 0]]), "p1", "dag: cyclic DAG: 0 -> 1 -> 2 -> 0"),
    "one step": (lambda: _good(1, steps=[{"text": "a"}], dag=None), "p1", "steps: a procedure needs at least 2 steps, got 1"),
    "unknown split": (lambda: _good(1, split="training"), "p1",
                      "split: unknown split 'training' (expected train, val or test, optionally with a -suffix)"),
    "alternatives not a list": (lambda: _good(1, alternatives="0 1 2"), "p1", "alternatives: must be a list of orders"),
    "bad alternative": (lambda: _good(1, alternatives=[[0, 0, 1]]), "p1",
                        "alternatives[0]: must be a permutation of the 3 step indices"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_record_is_rejected_with_its_message(folder, case):
    make, record_id, expected = BAD_CASES[case]
    path = _write(folder, [_good(0), make()])
    with pytest.raises(ProcedureFormatError) as err:
        read_procedures(path)
    assert [str(p) for p in err.value.problems] == [f"{path}:2: {record_id}: {expected.format(folder=folder)}"]


def test_boxes_at_the_limits_are_valid(folder):
    """Integer and float coordinates, and as many labels as boxes, are accepted."""
    ok = _good(1, steps=_steps({"text": "b", "boxes": [[0, 0, 1, 1], [0.5, 0.5, 2.5, 3]], "box_labels": ["x", "y"]}), dag=None)
    assert read_procedures(_write(folder, [ok]))[0].steps[1].boxes == [[0, 0, 1, 1], [0.5, 0.5, 2.5, 3]]


def test_duplicate_id_and_bad_json(folder):
    path = _write(folder, [_good(1), "{not json", _good(1)])
    with pytest.raises(ProcedureFormatError) as err:
        read_procedures(path)
    lines = [str(p) for p in err.value.problems]
    assert any(line.startswith(f"{path}:2: ?: json: ") for line in lines)
    assert any(line.startswith(f"{path}:3: p1: id: duplicate id (first seen at {path}:1)") for line in lines)


@pytest.mark.parametrize("ending", ["\n", "\r\n", ""])
def test_a_line_cut_short_is_reported_at_its_end(folder, ending):
    """A record cut off mid-line (an interrupted write) names the column after its last character, whatever the
    line ending, not column 1 of a line that does not exist."""
    path = folder / "cut.jsonl"
    path.write_bytes(b'{"id": "p1", "steps": [' + ending.encode())
    with pytest.raises(ProcedureFormatError) as err:
        read_procedures(path)
    assert [str(p) for p in err.value.problems] == [f"{path}:1: ?: json: not valid JSON: Expecting value (column 24)"]


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "tools" / "validate_procedures.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_validate_script_exit_codes_and_every_problem_listed(folder):
    good = _write(folder, [_good(1), _good(2)])
    ok = _script(str(good))
    assert ok.returncode == 0, ok.stderr
    assert "OK: 2 procedure(s)" in ok.stdout

    bad_lines = [_good(1), "[1, 2", make_cycle := _good(2, dag=[[0, 1], [1, 0]]),
                 _good(3, split="dev", steps=[{"text": "x"}])]
    assert make_cycle
    bad = folder / "bad.jsonl"
    bad.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in bad_lines) + "\n")
    res = _script(str(bad))
    assert res.returncode == 1
    err = res.stderr
    assert f"{bad}:2: ?: json: " in err
    assert f"{bad}:3: p2: dag: cyclic DAG" in err
    assert f"{bad}:4: p3: split: unknown split 'dev'" in err
    assert f"{bad}:4: p3: steps: a procedure needs at least 2 steps" in err


def test_validate_script_duplicates_across_files(folder):
    a = folder / "a.jsonl"
    b = folder / "b.jsonl"
    a.write_text(json.dumps(_good(1)) + "\n")
    b.write_text(json.dumps(_good(1)) + "\n")
    res = _script(str(folder))
    assert res.returncode == 1
    assert f"{b}:1: p1: id: duplicate id (first seen at {a}:1)" in res.stderr
