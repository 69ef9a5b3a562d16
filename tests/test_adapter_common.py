"""Reading JSON sources, shared by every JSON adapter (:func:`iter_json_records`, :func:`iter_files`):
blank lines inside a JSON-lines file, a non-UTF-8 first line, a pretty-printed single record, the line
of a bad byte in a JSON document, and a missing source.  The other helpers of
``data_modules.adapters.common`` are in tests/test_adapters.py and tests/test_adapter_contracts.py."""
from __future__ import annotations

import json

import pytest

from adapter_helpers import jsonl
from data_modules.adapters import run_adapter
from data_modules.adapters.common import ProblemLog, iter_files, iter_json_records
from test_adapter_contracts import cat_q


def read(path):
    log = ProblemLog()
    records = list(iter_json_records(path, log))
    return records, [str(p) for p in log.problems]


def test_json_lines_with_blank_lines_keep_every_record_and_its_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a"}\n\n   \n{"id": "b"}\n\t\n{"id": "c"}\n')
    assert read(path) == ([(1, {"id": "a"}), (4, {"id": "b"}), (6, {"id": "c"})], [])


def test_non_utf8_first_line_is_reported_and_the_other_lines_read(tmp_path):
    """A bad byte in the first line does not stop the file from being read as JSON lines."""
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"id": "a", "text": "cr\xe8me"}\n{"id": "b"}\n')
    assert read(path) == ([(2, {"id": "b"})],
                          [f"{path}:1: a: text: not valid UTF-8 (byte 0xe8 at byte 24 of the line); save the file as UTF-8"])


def test_non_utf8_byte_of_a_document_is_reported_at_its_line(tmp_path):
    """The line counts every newline of the file, a leading empty line included."""
    path = tmp_path / "q.json"
    path.write_bytes(b'\n[\n {"id": "caf\xe9"}\n]\n')
    assert read(path) == ([], [f"{path}:3: ?: text: not valid UTF-8 (byte 0xe9); save the file as UTF-8"])


def test_pretty_printed_object_is_one_record(tmp_path):
    record = {"id": "r1", "data": "not a list", "steps": ["a", "b"]}
    path = tmp_path / "one.json"
    path.write_text(json.dumps(record, indent=2))
    assert read(path) == ([(1, record)], [])


def test_a_json_file_holding_one_pretty_printed_question_is_read(tmp_path):
    """Through an adapter: a ``.json`` file with a single CaT-Bench question written with indentation."""
    question = cat_q(0, 0, 0, 1, "yes")
    (tmp_path / "one.json").write_text(json.dumps(question, indent=1))
    pairs = run_adapter("catbench", tmp_path / "one.json").tasks["catbench"]
    assert [(p["pair_id"], p["a"], p["b"], p["label"]) for p in pairs] == [("catbench-0-dependent_real_before-0", 0, 1, "yes")]


def test_missing_source_names_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as excinfo:
        iter_files(missing, (".jsonl",))
    assert str(excinfo.value) == f"no such file or folder: {missing}"
    with pytest.raises(FileNotFoundError) as excinfo:
        run_adapter("catbench", missing)
    assert str(excinfo.value) == f"catbench: no such file or folder: {missing}"


def test_iter_files_of_a_file_and_of_a_folder(tmp_path):
    one = jsonl(tmp_path / "d" / "b.jsonl", [{}])
    jsonl(tmp_path / "d" / "sub" / "a.json", [{}])
    (tmp_path / "d" / "notes.txt").write_text("x\n")
    assert iter_files(one, (".json",)) == [one]
    assert iter_files(tmp_path / "d", (".jsonl", ".json")) == [one, tmp_path / "d" / "sub" / "a.json"]
