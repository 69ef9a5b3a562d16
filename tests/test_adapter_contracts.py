"""Contracts of the adapter machinery a user relies on: exact instances, exact problem reports
(file:line: record id: field: reason), options honoured, the summary table and prepared folders."""
from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_modules.adapters import AdapterOptionError, run_adapter
from seqaware.procedure import ProcedureFormatError

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def png(path: Path, color=RED, size=(8, 6)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, format="PNG")
    return path


def problem_lines(excinfo) -> list[str]:
    """The problem lines of a ProcedureFormatError, after checking the count in its header."""
    header, *lines = str(excinfo.value).split("\n")
    assert header == f"{len(lines)} problem(s) in procedures:"
    return lines


# ---------------------------------------------------------------- COHERENCE export
COH_FIELDS = {"id": "doc", "text": "body", "candidates": "imgs", "gold": "answer", "difficulty": "level",
              "split": "part", "title": "head", "source": "corpus"}


@pytest.fixture
def coh_dir(tmp_path):
    src = tmp_path / "coh"
    for name, color in (("a", RED), ("b", GREEN), ("c", BLUE)):
        png(src / f"{name}.png", color)
    return src


def coh_run(path, out_images=None, **options):
    return run_adapter("coherence", path, out_images, fields=COH_FIELDS, **options)


COH_GOOD = {"doc": "g", "body": "A [IMG] B [IMG]", "imgs": ["a.png", "b.png"], "answer": [1, 0]}

COH_BAD = [
    # (record, problem after "<file>:1: ")
    ({**COH_GOOD, "body": 5}, "g: body: must be a string"),
    ({**COH_GOOD, "body": "no images here"}, "g: body: no image placeholder matching '\\\\[IMG\\\\]'"),
    ({**COH_GOOD, "imgs": "a.png,b.png"}, "g: imgs: must be a list of at least 2 images (one per placeholder)"),
    ({**COH_GOOD, "imgs": ["a.png"]}, "g: imgs: must be a list of at least 2 images (one per placeholder)"),
    ({**COH_GOOD, "answer": ["x", 1]}, "g: answer: ['x', 1] must give 2 distinct candidate indices (0-based, 2 candidates)"),
    ({**COH_GOOD, "answer": 3}, "g: answer: 3 must give 2 distinct candidate indices (0-based, 2 candidates)"),
    ({**COH_GOOD, "answer": [1]}, "g: answer: [1] must give 2 distinct candidate indices (0-based, 2 candidates)"),
    ({**COH_GOOD, "answer": [1, 1]}, "g: answer: [1, 1] must give 2 distinct candidate indices (0-based, 2 candidates)"),
    ({**COH_GOOD, "answer": [0, 2]}, "g: answer: [0, 2] must give 2 distinct candidate indices (0-based, 2 candidates)"),
    ({**COH_GOOD, "answer": [-1, 0]}, "g: answer: [-1, 0] must give 2 distinct candidate indices (0-based, 2 candidates)"),
    ({**COH_GOOD, "level": "extreme"}, "g: level: 'extreme' is not one of ['easy', 'medium', 'hard']"),
    ({**COH_GOOD, "part": "dev"}, "g: part: unknown split 'dev'"),
    ({**COH_GOOD, "head": "  "}, "g: head: must be a non-empty string"),
    ({**COH_GOOD, "head": 7}, "g: head: must be a non-empty string"),
    ({**COH_GOOD, "imgs": ["a.png", "", "b.png", None]}, "g: imgs[1]: empty candidate image"),
    ({**COH_GOOD, "imgs": ["a.png", "http://x.org/b.png"]},
     "g: imgs[1]: image URL http://x.org/b.png has no local copy (downloads are off; set option url_root to a local mirror)"),
    ({key: v for key, v in COH_GOOD.items() if key != "imgs"}, "g: imgs: missing field"),
    ({key: v for key, v in COH_GOOD.items() if key != "doc"} | {"body": 5}, "coh-1: body: must be a string"),
    ('"a string"', "?: record: expected a JSON object, got str"),
]


@pytest.mark.parametrize("record, problem", COH_BAD, ids=[p.split(": ", 2)[1] + "-" + str(i) for i, (_, p) in enumerate(COH_BAD)])
def test_coherence_bad_record_is_reported_exactly(coh_dir, record, problem):
    path = jsonl(coh_dir / "coh.jsonl", [record])
    with pytest.raises(ProcedureFormatError) as excinfo:
        coh_run(path, placeholder_pattern=r"\[IMG\]")
    assert problem_lines(excinfo) == [f"{path}:1: {problem}"]


def test_coherence_every_problem_of_a_record_and_duplicate_ids(coh_dir):
    path = jsonl(coh_dir / "coh.jsonl", [
        COH_GOOD,
        {**COH_GOOD, "level": "extreme", "part": "dev", "head": ""},
        {**COH_GOOD, "body": 1},
        {"doc": "h", "body": "no placeholder", "imgs": "x"},
    ])
    with pytest.raises(ProcedureFormatError) as excinfo:
        coh_run(path, placeholder_pattern=r"\[IMG\]")
    assert problem_lines(excinfo) == [
        f"{path}:2: g: level: 'extreme' is not one of ['easy', 'medium', 'hard']",
        f"{path}:2: g: part: unknown split 'dev'",
        f"{path}:2: g: head: must be a non-empty string",
        f"{path}:2: g: doc: duplicate id (first seen at {path}:1)",
        f"{path}:3: g: body: must be a string",
        f"{path}:4: h: body: no image placeholder matching '\\\\[IMG\\\\]'",
        f"{path}:4: h: imgs: must be a list of at least 0 images (one per placeholder)",
    ]


def test_coherence_instance_is_exact(coh_dir, tmp_path):
    path = jsonl(coh_dir / "coh.jsonl", [
        {"doc": 17, "body": "Peel. [IMG] Boil. [IMG]", "imgs": ["a.png", "b.png", "c.png"], "answer": [3, 1],
         "level": "Hard", "part": "validation", "head": "  Ginger Tea ", "corpus": 4},
        {"doc": "one", "body": "Only [IMG].", "imgs": ["c.png"], "answer": [1]},
    ])
    out = tmp_path / "out"
    result = coh_run(path, out / "images", placeholder_pattern=r"\[IMG\]", gold_base=1, split="test-x")
    first, second = result.tasks["coherence"]
    stem = first["candidates"][0].split("/")[1].rsplit("_", 1)[0]
    assert first == {
        "instance_id": "17", "procedure_id": "17", "split": "val", "text": "Peel. <image_1> Boil. <image_2>",
        "num_images": 2, "candidates": [f"images/{stem}_{j}.png" for j in range(3)], "gold": [2, 0],
        "distractors": [1], "difficulty": "hard", "title": "Ginger Tea", "source": "4",
    }
    assert [mean_color(out / c) for c in first["candidates"]] == [RED, GREEN, BLUE]
    # defaults: option split, difficulty from the number of placeholders, no title, no source key
    assert second == {
        "instance_id": "one", "procedure_id": "one", "split": "test-x", "text": "Only <image_1>.", "num_images": 1,
        "candidates": [second["candidates"][0]], "gold": [0], "distractors": [], "difficulty": None, "title": None,
    }
    assert result.records_read == Counter({"instances": 2}) and result.dropped == Counter()


@pytest.mark.parametrize("n, expected", [(1, "easy"), (2, "medium"), (3, "hard"), (4, "hard")])
def test_coherence_difficulty_bins_option(coh_dir, n, expected):
    path = jsonl(coh_dir / "coh.jsonl", [{"doc": "d", "body": "x [IMG]" * n, "imgs": ["a.png"] * n}])
    (inst,) = coh_run(path, placeholder_pattern=r"\[IMG\]",
                      difficulty_bins=[(1, 1), (2, 2), (3, None)]).tasks["coherence"]
    assert inst["difficulty"] == expected


@pytest.mark.parametrize("n, expected", [(1, None), (2, "easy"), (3, "easy"), (4, "medium"), (5, "medium"), (6, "hard")])
def test_coherence_default_difficulty_bins(coh_dir, n, expected):
    path = jsonl(coh_dir / "coh.jsonl", [{"doc": "d", "body": "x [IMG]" * n, "imgs": ["a.png"] * n}])
    (inst,) = coh_run(path, placeholder_pattern=r"\[IMG\]").tasks["coherence"]
    assert inst["difficulty"] == expected


def test_coherence_shuffle_without_gold_is_seeded_and_reproducible(coh_dir):
    """Without gold the candidates are shuffled by (seed, id): same seed, same order; another seed, another."""
    n = 8
    names = [f"p{i}.png" for i in range(n)]
    for i, name in enumerate(names):
        png(coh_dir / name, (30 * i, 0, 0))
    path = jsonl(coh_dir / "coh.jsonl", [{"doc": "d", "body": "[IMG]" * n, "imgs": names}])

    def order(**options):
        (inst,) = coh_run(path, placeholder_pattern=r"\[IMG\]", **options).tasks["coherence"]
        # candidates keep absolute source paths without out_images; gold[i] points at the i-th image
        assert [Path(inst["candidates"][g]).name for g in inst["gold"]] == names
        return [Path(c).name for c in inst["candidates"]]

    default = order()
    assert sorted(default) == sorted(names) and default != names
    assert order() == default == order(seed=0)
    assert order(seed=1) != default


def test_coherence_unreadable_candidate_error_and_skip(coh_dir, tmp_path):
    (coh_dir / "bad.png").write_bytes(b"not an image")
    path = jsonl(coh_dir / "coh.jsonl", [
        {"doc": "x", "body": "A [IMG]", "imgs": ["a.png", "bad.png"], "answer": [0]},
        {"doc": "y", "body": "A [IMG]", "imgs": ["b.png"]},
        {"doc": "z", "body": "A [IMG]", "imgs": ["bad.png"]},
    ])
    with pytest.raises(ProcedureFormatError) as excinfo:
        coh_run(path, tmp_path / "out" / "images", placeholder_pattern=r"\[IMG\]")
    lines = problem_lines(excinfo)
    assert [line.split(": cannot read image ")[0] for line in lines] == [f"{path}:1: x: imgs[1]", f"{path}:3: z: imgs[0]"]
    assert all(f"cannot read image {coh_dir / 'bad.png'}: " in line for line in lines)
    result = coh_run(path, tmp_path / "out" / "images", placeholder_pattern=r"\[IMG\]", unreadable_image="skip")
    assert [i["instance_id"] for i in result.tasks["coherence"]] == ["y"]
    assert result.dropped == Counter({"unreadable image": 2})
    assert len(list((tmp_path / "out" / "images").iterdir())) == 1   # only y's image: nothing of x is written


def test_coherence_reads_every_json_and_jsonl_file_of_a_folder(coh_dir, tmp_path):
    (coh_dir / "one.json").write_text(json.dumps({"data": [{**COH_GOOD, "doc": "j1"}, {**COH_GOOD, "doc": "j2"}]}, indent=1))
    jsonl(coh_dir / "sub" / "two.jsonl", [{**COH_GOOD, "doc": "l1", "imgs": ["../a.png", "../b.png"]}])
    (coh_dir / "notes.txt").write_text("not an export\n")
    result = coh_run(coh_dir, placeholder_pattern=r"\[IMG\]")
    assert [i["instance_id"] for i in result.tasks["coherence"]] == ["j1", "j2", "l1"]
    assert result.records_read == Counter({"instances": 3})
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as excinfo:
        coh_run(tmp_path / "empty")
    assert str(excinfo.value) == f"coherence: no .json or .jsonl files in {tmp_path / 'empty'}"


def test_coherence_url_candidates_read_from_the_local_mirror(coh_dir, tmp_path):
    mirror = tmp_path / "mirror"
    png(mirror / "img" / "g.png", GREEN)
    path = jsonl(coh_dir / "coh.jsonl", [{"doc": "u", "body": "A [IMG]", "imgs": ["https://host.org/img/g.png"]}])
    (inst,) = coh_run(path, tmp_path / "out" / "images", placeholder_pattern=r"\[IMG\]",
                      url_root=str(mirror)).tasks["coherence"]
    assert mean_color(tmp_path / "out" / inst["candidates"][0]) == GREEN


@pytest.mark.parametrize("options, message", [
    ({"unreadable_image": "ignore"}, "option unreadable_image='ignore': expected one of ['error', 'skip']"),
    ({"split": "dev"}, "option split='dev': expected train, val, test or test-<suffix>"),
    ({"placeholder_pattern": "[IMG"},
     "option placeholder_pattern='[IMG': not a regular expression (unterminated character set at position 0)"),
    ({"fields": {"answer": "a"}},
     "option fields: unknown key(s) ['answer']; valid keys: ['id', 'text', 'candidates', 'gold', 'difficulty', "
     "'split', 'source', 'title']"),
])
def test_coherence_option_errors_name_the_option(coh_dir, options, message):
    path = jsonl(coh_dir / "coh.jsonl", [COH_GOOD])
    with pytest.raises(AdapterOptionError) as excinfo:
        run_adapter("coherence", path, None, **options)
    assert str(excinfo.value) == message


# ---------------------------------------------------------------- summary table (report)
from data_modules.adapters.report import read_prepared, split_row, summary_table, task_class_counts  # noqa: E402
from seqaware.procedure import Procedure, Step, write_procedures  # noqa: E402


def proc(pid, n, images=(), dag=None, split="train"):
    return Procedure(pid, [Step(text=f"s{i}", images=["images/x.png"] if i in images else []) for i in range(n)],
                     split=split, dag=dag)


REPORT_SPLITS = {
    "extra": [],
    "test-human": [proc("p4", 1)],
    "val_a": [proc("p3", 4, (2,), [(0, 1), (1, 2), (2, 3)])],
    "train": [proc("p1", 3, (0, 1), [(0, 1), (0, 2)]), proc("p2", 2)],
}


def test_split_row_numbers():
    assert split_row(REPORT_SPLITS["train"]) == {
        "procedures": 2, "steps": 5, "steps/proc": 2.5, "image steps": 2, "with DAG": 1, "edges": 2, "branching": 2.0}
    assert split_row([]) == {"procedures": 0, "steps": 0, "steps/proc": None, "image steps": 0, "with DAG": 0,
                             "edges": None, "branching": None}


def test_summary_table_orders_splits_and_adds_an_all_row():
    """train, val*, test* first (in that order), other names after; branching pools the branching steps:
    all = (2 + 1 + 1 + 1) / 4 out-edges of the steps with any."""
    assert summary_table(REPORT_SPLITS) == "\n".join([
        "split       procedures  steps  steps/proc  image steps  with DAG  edges  branching",
        "----------  ----------  -----  ----------  -----------  --------  -----  ---------",
        "train                2      5        2.50            2         1      2       2.00",
        "val_a                1      4        4.00            1         1      3       1.00",
        "test-human           1      1        1.00            0         0      -          -",
        "extra                0      0           -            0         0      -          -",
        "all                  4     10        2.50            3         2      5       1.25",
        "dropped: nothing",
    ])


def test_summary_table_title_records_read_and_dropped():
    assert summary_table({"val": REPORT_SPLITS["val_a"]}, title="My data", records_read={"b": 2, "a": 1},
                         dropped={"z": 1, "b": 3}) == "\n".join([
        "My data",
        "split  procedures  steps  steps/proc  image steps  with DAG  edges  branching",
        "-----  ----------  -----  ----------  -----------  --------  -----  ---------",
        "val             1      4        4.00            1         1      3       1.00",
        "input records read: b: 2, a: 1 (total 3)",
        "dropped: b: 3, z: 1",
    ])


TEO_PAIRS = [{"label": "after", "split": "test"}, {"label": "before", "split": "train"}, {"label": "before", "split": "test"}]
COH_INSTANCES = [{"difficulty": "hard", "split": "val"}, {"difficulty": "easy", "split": "train"}, {"difficulty": "easy"},
                 {"difficulty": "medium", "split": "train"}]
ISO_INSTANCES = [{"label": "NONDEP", "split": "test", "difficulty": "x"}, {"label": "DEP", "split": "test"},
                 {"label": "DEP", "split": "test"}]
MIXED = [{"label": "weird", "split": "test"}, {"label": "after", "split": "train"}]


@pytest.mark.parametrize("name, instances, expected", [
    ("teo", TEO_PAIRS, {"train": {"before": 1, "after": 0, "independent": 0},
                        "test": {"before": 1, "after": 1, "independent": 0},
                        "all": {"before": 2, "after": 1, "independent": 0}}),
    # COHERENCE has no label: counted by difficulty; an instance without a split is under "?"
    ("coherence", COH_INSTANCES, {"train": {"easy": 1, "medium": 1}, "val": {"hard": 1}, "?": {"easy": 1},
                                  "all": {"easy": 2, "hard": 1, "medium": 1}}),
    ("iso", ISO_INSTANCES, {"test": {"DEP": 2, "NONDEP": 1}, "all": {"DEP": 2, "NONDEP": 1}}),
    # any task whose groups hold only TEO labels gets the three TEO classes
    ("catbench", TEO_PAIRS[:1], {"test": {"before": 0, "after": 1, "independent": 0},
                                 "all": {"before": 0, "after": 1, "independent": 0}}),
    ("pairs", MIXED, {"train": {"before": 0, "after": 1, "independent": 0}, "test": {"weird": 1},
                      "all": {"after": 1, "weird": 1}}),
])
def test_task_class_counts(name, instances, expected):
    counts = task_class_counts(name, instances)
    assert counts == expected
    assert list(counts) == list(expected)                           # splits in train, val, test, other order
    assert [list(v) for v in counts.values()] == [list(v) for v in expected.values()]   # classes in order


def test_task_class_counts_of_no_teo_pairs_still_lists_the_three_labels():
    assert task_class_counts("teo", []) == {"all": {"before": 0, "after": 0, "independent": 0}}
    assert task_class_counts("coherence", []) == {"all": {}}


def test_summary_table_task_class_tables():
    out = summary_table({"test": [proc("p", 2)], "train": [proc("q", 1)]},
                        tasks={"empty": [], "teo": TEO_PAIRS, "coherence": COH_INSTANCES, "pairs": MIXED})
    assert out == "\n".join([
        "split  procedures  steps  steps/proc  image steps  with DAG  edges  branching",
        "-----  ----------  -----  ----------  -----------  --------  -----  ---------",
        "train           1      1        1.00            0         0      -          -",
        "test            1      2        2.00            0         0      -          -",
        "all             2      3        1.50            0         0      -          -",
        "dropped: nothing",
        "task empty: 0 instances",
        "task teo: 3 instances (original + swapped presentations)",
        "split  before  after  independent",
        "-----  ------  -----  -----------",
        "train       1      0            0",
        "test        1      1            0",
        "all         2      1            0",
        "task coherence: 4 instances",
        "split  easy  hard  medium",
        "-----  ----  ----  ------",
        "train     1     0       1",
        "val       0     1       0",
        "?         1     0       0",
        "all       2     1       1",
        "task pairs: 2 instances",
        "split  before  after  independent  weird",
        "-----  ------  -----  -----------  -----",
        "train       0      1            0      0",
        "test        0      0            0      1",
        "all         0      1            0      1",
    ])


@pytest.fixture
def prepared(tmp_path):
    folder = tmp_path / "prep"
    png(folder / "images" / "x.png")
    write_procedures(folder / "train.jsonl", [proc("p1", 3, (0, 1), [(0, 1), (0, 2)])])
    write_procedures(folder / "val.jsonl", [proc("p2", 2, split="val")])
    (folder / "conversion.json").write_text(json.dumps({"dataset": "demo", "dropped": {"x": 1}}))
    jsonl(folder / "tasks" / "teo.jsonl", [{"label": "before", "text": "Crème brûlée"}, ""])
    jsonl(folder / "tasks" / "coherence.jsonl", [{"difficulty": "easy"}])
    (folder / "tasks" / "notes.txt").write_text("not a task\n")
    return folder


def test_read_prepared_reads_splits_conversion_and_every_task(prepared):
    splits, conversion, instances = read_prepared(prepared)
    assert {k: [p.id for p in v] for k, v in splits.items()} == {"train": ["p1"], "val": ["p2"]}
    assert splits["train"][0].dag == [(0, 1), (0, 2)]
    assert conversion == {"dataset": "demo", "dropped": {"x": 1}}
    assert instances == {"coherence": [{"difficulty": "easy"}], "teo": [{"label": "before", "text": "Crème brûlée"}]}
    assert list(instances) == ["coherence", "teo"]
    assert read_prepared(prepared, tasks=["teo"])[2] == {"teo": [{"label": "before", "text": "Crème brûlée"}]}


def test_read_prepared_checks_images_unless_told_not_to(prepared):
    (prepared / "images" / "x.png").unlink()
    (prepared / "conversion.json").unlink()
    with pytest.raises(ProcedureFormatError, match="images/x.png"):
        read_prepared(prepared)
    splits, conversion, _ = read_prepared(prepared, check_images=False)
    assert [p.id for p in splits["train"]] == ["p1"] and conversion == {}


def test_read_prepared_errors_name_the_file(prepared, tmp_path):
    with pytest.raises(FileNotFoundError) as excinfo:
        read_prepared(prepared, tasks=["iso"])
    assert str(excinfo.value) == f"task file not found: {prepared / 'tasks' / 'iso.jsonl'}"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as excinfo:
        read_prepared(tmp_path / "empty")
    assert str(excinfo.value) == f"no <split>.jsonl files in {tmp_path / 'empty'}"
    bad = prepared / "tasks" / "teo.jsonl"
    bad.write_text('{"label": "before"}\n{"label": \n')
    with pytest.raises(ValueError) as excinfo:
        read_prepared(prepared)
    assert str(excinfo.value) == f"{bad}:2: ?: json: not valid JSON: Expecting value"


# ---------------------------------------------------------------- shared machinery (common)
import hashlib  # noqa: E402

from data_modules.adapters.common import (  # noqa: E402
    ImageStore, check_split, decode_embedded, get_path, image_source, is_url, normalize_orders, slug,
    split_from_name,
)
from data_modules.images import ImageLoadError  # noqa: E402

NESTED = {"a": {"b": [10, 20, 30], "s": "xyz", "d": {"x": 1}}}


@pytest.mark.parametrize("dotted, expected", [("a.b.0", 10), ("a.b.2", 30), ("a.b.-1", 30), ("a.b.-3", 10),
                                              ("a.s", "xyz"), ("a.d.x", 1)])
def test_get_path_follows_keys_and_list_indices(dotted, expected):
    assert get_path(NESTED, dotted) == expected


@pytest.mark.parametrize("record, dotted, missing", [
    (NESTED, "a.c", "c"), (NESTED, "a.b.3", "3"), (NESTED, "a.b.-4", "-4"), (NESTED, "a.b.x", "x"),
    (NESTED, "a.b.X1", "X1"), (NESTED, "a.s.1", "1"), (NESTED, "a.s.x", "x"), (NESTED, "a.d.0", "0"), ("abc", "a", "a"),
])
def test_get_path_raises_key_error_naming_the_missing_part(record, dotted, missing):
    with pytest.raises(KeyError) as excinfo:
        get_path(record, dotted)
    assert excinfo.value.args == (missing,)


@pytest.mark.parametrize("name, split", [
    ("train.jsonl", "train"), ("trainset.json", "train"), ("wikihow_train_v2", "train"),
    ("dev.json", "val"), ("val.json", "val"), ("VALIDATION.jsonl", "val"), ("valid-2.txt", "val"),
    ("test.json", "test"), ("testset.json", "test"), ("Test-Human.jsonl", "test-human"), ("human_test", "test-human"),
    ("other.json", None), ("evaluation.json", None),
])
def test_split_from_name(name, split):
    assert split_from_name(name) == split


@pytest.mark.parametrize("orders, message", [
    ([[0, 1], "x"], "must be a non-empty list of orders (lists of step indices)"),
    ([], "must be a non-empty list of orders (lists of step indices)"),
    (5, "must be a non-empty list of orders (lists of step indices)"),
    ({"a": [0, 1]}, "must be a non-empty list of orders (lists of step indices)"),
    ([["a", 1]], "orders must hold integers (invalid literal for int() with base 10: 'a')"),
    ([[1, 2], [1, 1]], "order 1 [1, 1] is not a permutation of the 2 steps"),
])
def test_normalize_orders_errors(orders, message):
    with pytest.raises(ValueError) as excinfo:
        normalize_orders(orders, 2)
    assert str(excinfo.value) == message


def test_normalize_orders_keeps_distinct_alternatives():
    assert normalize_orders([[1, 2, 3], [2, 1, 3], [2, 1, 3], [3, 2, 1]], 3) == [[1, 0, 2], [2, 1, 0]]


def sha8(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]


@pytest.mark.parametrize("text, readable", [
    ("Hello, World!", "Hello_World"), ("._a.b-c_d._", "a.b-c_d"), ("  spaced out ", "spaced_out"),
    ("Crème brûlée", "Cr_me_br_l_e"), ("!!!", "x"), ("", "x"), ("a" * 70, "a" * 60), ("AbZ09", "AbZ09"), ("Xmas tree X", "Xmas_tree_X"),
])
def test_slug_is_file_name_safe_with_a_short_hash(text, readable):
    assert slug(text) == f"{readable}-{sha8(text)}"


def test_check_split_returns_the_split_name():
    assert [check_split(s) for s in ("train", "val", "test", "test-human", "test_2")] == \
        ["train", "val", "test", "test-human", "test_2"]


def test_decode_embedded():
    data = b"\x89PNG..."
    assert decode_embedded({"bytes": data}) == data
    assert decode_embedded(bytearray(data)) == data and isinstance(decode_embedded(bytearray(data)), bytes)
    assert decode_embedded([104, 105]) == b"hi"
    assert decode_embedded("aGVsbG8=") == b"hello"
    assert decode_embedded("aGVsbG8=!!") is None            # not strict base64: not an image
    assert decode_embedded({"bytes": None}) is None
    assert decode_embedded([1, "a"]) is None
    assert decode_embedded(5) is None


@pytest.mark.parametrize("value, expected", [("http://a.org/x.png", True), ("HTTPS://A.ORG/x", True),
                                             ("s3+x.y://b", True), ("a/b.png", False), ("1http://x", False),
                                             ("C:/x.png", False)])
def test_is_url(value, expected):
    assert is_url(value) is expected


def test_image_source_values(tmp_path):
    base = tmp_path / "export"
    mirror = tmp_path / "mirror"
    png(mirror / "X1" / "g.png")
    for empty in (None, "", {}, {"path": ""}, {"bytes": None, "path": None}):
        assert image_source(empty, base, None) is None
    assert image_source("a/b.png", base, None) == base / "a" / "b.png"
    assert image_source({"path": "a/b.png"}, base, None) == base / "a" / "b.png"
    assert image_source(str(tmp_path / "abs.png"), base, None) == tmp_path / "abs.png"
    assert image_source({"bytes": [1, 2]}, base, None) == b"\x01\x02"
    assert image_source(3.5, base, None) == "image value is not a path, URL or embedded bytes (float)"
    assert image_source("https://h.org/X1/g.png", base, mirror) == mirror / "X1" / "g.png"
    assert image_source("https://h.org/X1/none.png", base, mirror) == \
        f"image URL https://h.org/X1/none.png has no local copy at {mirror / 'X1' / 'none.png'}"
    assert image_source("https://h.org/X1/g.png", base, None) == (
        "image URL https://h.org/X1/g.png has no local copy (downloads are off; set option url_root to a local mirror)")


def image_bytes(fmt: str, color=RED, **save) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buf, format=fmt, **save)
    return buf.getvalue()


def apng_bytes() -> bytes:
    """An animated PNG whose frames are red, green, blue (the middle one is green)."""
    buf = io.BytesIO()
    frames = [Image.new("RGB", (8, 8), c) for c in (RED, GREEN, BLUE)]
    frames[0].save(buf, format="PNG", save_all=True, append_images=frames[1:])
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["bytes", "file"])
def test_image_store_copies_single_frame_jpeg_png_and_converts_the_rest(tmp_path, kind):
    store = ImageStore(tmp_path / "out" / "images")
    assert store.root == str(tmp_path / "out")
    sources = {"jpg": image_bytes("JPEG"), "png": image_bytes("PNG"), "bmp": image_bytes("BMP"),
               "apng": apng_bytes(), "gif": image_bytes("GIF")}
    stored = {}
    for name, data in sources.items():
        source = data
        if kind == "file":
            source = tmp_path / "src" / f"{name}.img"
            source.parent.mkdir(exist_ok=True)
            source.write_bytes(data)
        stored[name] = store.commit(store.prepare(source), f"s_{name}")
    assert stored == {"jpg": "images/s_jpg.jpg", "png": "images/s_png.png", "bmp": "images/s_bmp.jpg",
                      "apng": "images/s_apng.jpg", "gif": "images/s_gif.jpg"}
    out = tmp_path / "out"
    assert (out / stored["jpg"]).read_bytes() == sources["jpg"]          # byte for byte
    assert (out / stored["png"]).read_bytes() == sources["png"]
    for name in ("bmp", "apng", "gif"):
        with Image.open(out / stored[name]) as img:
            assert img.format == "JPEG"
    assert np.allclose(mean_color(out / stored["apng"]), GREEN, atol=2)   # the middle frame (JPEG: nearly exact)
    # converted images are JPEG quality 95: the same bytes as saving the decoded image at 95
    ref = io.BytesIO()
    Image.new("RGB", (8, 6), RED).save(ref, format="JPEG", quality=95)
    assert (out / stored["bmp"]).read_bytes() == ref.getvalue()


def test_image_store_without_output_folder(tmp_path):
    store = ImageStore(None)
    assert store.root is None
    path = png(tmp_path / "a" / ".." / "a.png")
    assert store.commit(store.prepare(path), "x") == str(path.resolve())
    with pytest.raises(ImageLoadError) as excinfo:
        store.prepare(image_bytes("PNG"))
    assert str(excinfo.value) == "embedded image bytes need an output image folder (out_images)"
    with pytest.raises(ImageLoadError) as excinfo:
        ImageStore(tmp_path / "o").prepare(b"not an image")
    assert str(excinfo.value).startswith("cannot read embedded image bytes: cannot identify image file")


# ---------------------------------------------------------------- prepared folders (prepare)
from data_modules.adapters.prepare import build_task  # noqa: E402
from data_modules.tasks.coherence import coherence_instances  # noqa: E402
from data_modules.tasks.iso import iso_instances  # noqa: E402
from data_modules.tasks.teo import teo_eval_sets  # noqa: E402
from adapter_helpers import jsonl, mean_color


def imaged(pid, n, dag, split):
    return Procedure(pid, [Step(text=f"{pid} step {i}", images=[f"images/{pid}_{i}.png"]) for i in range(n)],
                     split=split, dag=dag)


BUILD_SPLITS = {"train": [imaged("t0", 3, [(0, 1), (1, 2), (0, 2)], "train"), imaged("t1", 4, [(0, 1)], "train")],
                "test": [imaged("e0", 5, [(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)], "test")]}


def test_build_task_unknown_task_names_the_builders():
    with pytest.raises(AdapterOptionError) as excinfo:
        build_task("order", BUILD_SPLITS)
    assert str(excinfo.value) == "unknown task 'order'; tasks built from procedures: ['teo', 'iso', 'coherence']"


def test_build_task_teo_is_every_split_original_then_swapped_with_options():
    expected = []
    for procs in BUILD_SPLITS.values():
        sets = teo_eval_sets(procs, pairs="reduction")
        expected += sets["original"] + sets["swapped"]
    built = build_task("teo", BUILD_SPLITS, pairs="reduction")
    assert built == expected
    assert len(built) < len(build_task("teo", BUILD_SPLITS))     # the redundant edges are not pairs


def test_build_task_iso_and_coherence_cover_every_split_with_options():
    iso = build_task("iso", BUILD_SPLITS, ks=[2], min_steps=3)
    assert iso == [i for procs in BUILD_SPLITS.values() for p in procs for i in iso_instances(p, ks=[2], min_steps=3)]
    assert {i["procedure_id"] for i in iso} == {"t0", "t1", "e0"}
    coh = build_task("coherence", BUILD_SPLITS, source="Cooking")
    assert coh == coherence_instances(BUILD_SPLITS["train"], source="Cooking") + \
        coherence_instances(BUILD_SPLITS["test"], source="Cooking")
    assert [(i["procedure_id"], i["source"]) for i in coh] == [("t0", "Cooking"), ("t1", "Cooking"), ("e0", "Cooking")]


# ---------------------------------------------------------------- CaT-Bench
def cat_q(plan, q, first, second, label, steps=("S1.", "S2.", "S3."), qtype="dependent_real_before", **extra):
    return {"plan_idx": plan, "question_idx": q, "question_type": qtype,
            "direction": "before" if qtype.endswith("before") else "after",
            "binary_question": f"Must Step {first + 1} happen before Step {second + 1}?", "steps": list(steps),
            "first_step_idx": first, "second_step_idx": second, "label": label, **extra}


def test_catbench_folder_of_json_and_jsonl_gives_exact_plans_and_pairs(tmp_path):
    src = tmp_path / "catbench"
    src.mkdir()
    (src / "a.json").write_text(json.dumps([cat_q(2, 0, 0, 2, " Yes ", title="Tea", efg_recipe_id="R2")], indent=1))
    jsonl(src / "b.jsonl", [cat_q(1, 4, 1, 0, "no", steps=("A.", "B."), qtype="nondependent_real_after")])
    (src / "notes.txt").write_text("not questions\n")
    result = run_adapter("catbench", src, split="test-cat")
    assert {k: [p.to_dict() for p in v] for k, v in result.splits.items()} == {"test-cat": [
        {"id": "catbench-1", "split": "test-cat", "title": "", "category": ["recipe"],
         "steps": [{"text": "A.", "images": []}, {"text": "B.", "images": []}],
         "meta": {"source": "catbench", "plan_idx": 1, "efg_recipe_id": None}},
        {"id": "catbench-2", "split": "test-cat", "title": "Tea", "category": ["recipe"],
         "steps": [{"text": t, "images": []} for t in ("S1.", "S2.", "S3.")],
         "meta": {"source": "catbench", "plan_idx": 2, "efg_recipe_id": "R2"}},
    ]}
    assert result.tasks["catbench"] == [
        {"pair_id": "catbench-2-dependent_real_before-0", "procedure_id": "catbench-2", "split": "test-cat",
         "num_steps": 3, "a": 0, "b": 2, "label": "yes", "question_type": "dependent_real_before", "direction": "before",
         "question": "Must Step 1 happen before Step 3?", "step_a": {"text": "S1.", "images": []},
         "step_b": {"text": "S3.", "images": []}, "category": ["recipe"], "plan_idx": 2, "question_idx": 0,
         "efg_recipe_id": "R2"},
        {"pair_id": "catbench-1-nondependent_real_after-4", "procedure_id": "catbench-1", "split": "test-cat",
         "num_steps": 2, "a": 1, "b": 0, "label": "no", "question_type": "nondependent_real_after", "direction": "after",
         "question": "Must Step 2 happen before Step 1?", "step_a": {"text": "B.", "images": []},
         "step_b": {"text": "A.", "images": []}, "category": ["recipe"], "plan_idx": 1, "question_idx": 4,
         "efg_recipe_id": None},
    ]
    assert result.records_read == Counter({"questions": 2})


def test_catbench_reports_every_bad_line_and_every_differing_plan(tmp_path):
    path = jsonl(tmp_path / "q.jsonl", [
        cat_q(0, 0, 0, 2, "yes"),
        '{"plan_idx": 0,',
        cat_q(0, 1, 0, 1, "no", steps=("X.", "Y.")),
        cat_q(0, 2, 0, 1, "no", steps=("X.", "Z.")),
        cat_q(0, 3, 1, 2, "no"),
    ])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("catbench", path)
    bad_json, *lines = problem_lines(excinfo)
    assert bad_json.startswith(f"{path}:2: ?: json: not valid JSON: Expecting property name enclosed in double quotes")
    assert lines == [
        f"{path}:3: plan 0 question 1: steps: differ from the steps of plan 0 first seen at {path}:1",
        f"{path}:4: plan 0 question 2: steps: differ from the steps of plan 0 first seen at {path}:1",
    ]


def test_iter_json_records_reads_a_one_line_json_document(tmp_path):
    """``json.dump`` writes a record list on one line: that is a document, not one JSON-lines record."""
    from data_modules.adapters.common import ProblemLog, iter_json_records

    path = tmp_path / "export.json"
    path.write_text(json.dumps([{"id": "a"}, {"id": "b"}]))
    log = ProblemLog()
    assert list(iter_json_records(path, log)) == [(1, {"id": "a"}), (2, {"id": "b"})] and len(log) == 0
    path.write_text(json.dumps({"id": "a"}) + "\n" + json.dumps({"id": "b"}) + "\n")
    assert list(iter_json_records(path, log)) == [(1, {"id": "a"}), (2, {"id": "b"})] and len(log) == 0


def test_coherence_bad_json_line_is_reported_with_the_others(coh_dir):
    path = jsonl(coh_dir / "coh.jsonl", [COH_GOOD, '{"doc": "h", "body": ', {**COH_GOOD, "doc": "i", "body": 3}])
    with pytest.raises(ProcedureFormatError) as excinfo:
        coh_run(path, placeholder_pattern=r"\[IMG\]")
    bad_json, bad_body = problem_lines(excinfo)
    assert bad_json.startswith(f"{path}:2: ?: json: not valid JSON: Expecting value (column ")
    assert bad_body == f"{path}:3: i: body: must be a string"


def test_cache_key_is_stable_and_depends_on_what_a_conversion_depends_on(tmp_path):
    import os

    from data_modules.adapters import cache_key

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for p in (a, b):
        p.write_text("x\n")
        os.utime(p, ns=(10**18, 10**18))
    key = cache_key("rfg", a, {"split": "test", "fractions": [0.5, 0.5]}, ["teo"])
    assert len(key) == 16 and int(key, 16) >= 0
    assert cache_key("rfg", a, {"fractions": [0.5, 0.5], "split": "test"}, ["teo"]) == key    # option order
    assert cache_key("rfg", b, {"split": "test", "fractions": [0.5, 0.5]}, ["teo"]) != key    # another source
    assert cache_key("rfg", a, {"split": "val", "fractions": [0.5, 0.5]}, ["teo"]) != key
    assert cache_key("rfg", a, {"split": "test", "fractions": [0.5, 0.5]}, []) != key
    assert cache_key("rfg", a, {"out": tmp_path}, []) == cache_key("rfg", a, {"out": str(tmp_path)}, [])  # paths as text
