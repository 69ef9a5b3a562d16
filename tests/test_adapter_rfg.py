"""English Recipe Flow Graph adapter (``rfg``): every problem message a user fixes a ``.list``/``.flow`` pair
from, the procedure's title and meta, the counts of recipes read and dropped, and the seeded random split.
The sentence/step DAGs and the basic option errors are in tests/test_adapters.py."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from data_modules.adapters import run_adapter
from data_modules.tasks.teo import stratified_split
from seqaware.procedure import ProcedureFormatError
from test_adapters import RFG_EDGES, RFG_TOKENS, write_rfg
from test_adapter_readers import problems

LIST_FIELDS = "expected 'STEP SENT CHAR_OFFSET TOKEN POS NER_TAG'"
FLOW_FIELDS = "expected 'SRC_STEP SRC_SENT SRC_OFF LABEL TGT_STEP TGT_SENT TGT_OFF'"


def append(path: Path, *lines: str) -> None:
    with open(path, "a") as handle:
        handle.write("".join(line + "\n" for line in lines))


# RFG_TOKENS fill lines 1-10 of R.list and RFG_EDGES lines 1-5 of R.flow; the bad lines come after them. Two
# bad lines per case: every bad line is reported in one pass, not just the first.
@pytest.mark.parametrize("unit, list_lines, flow_lines, expected", [
    ("sentence", ["4 1 0", "4 1"], [],
     ["{L}:11: R: list: " + LIST_FIELDS + ", got 3 field(s)", "{L}:12: R: list: " + LIST_FIELDS + ", got 2 field(s)"]),
    ("sentence", ["4 x 0 Stir NN1 O", "y 1 0 Stir NN1 O", "4 1 z Stir NN1 O"], [],
     ["{L}:11: R: list: STEP, SENT and CHAR_OFFSET must be integers, got ['4', 'x', '0']",
      "{L}:12: R: list: STEP, SENT and CHAR_OFFSET must be integers, got ['y', '1', '0']",
      "{L}:13: R: list: STEP, SENT and CHAR_OFFSET must be integers, got ['4', '1', 'z']"]),
    ("sentence", ["1 1 20 more NN1 O", "1 2 30 again NN1 O"], [],
     ["{L}:11: R: list: tokens of sentence (1, 1) are not contiguous",
      "{L}:12: R: list: tokens of sentence (1, 2) are not contiguous"]),
    ("step", ["1 3 0 late NN1 O", "2 2 0 again NN1 O"], [],
     ["{L}:11: R: list: tokens of step (1,) are not contiguous",
      "{L}:12: R: list: tokens of step (2,) are not contiguous"]),
    ("sentence", [], ["1 1 1 t 2 1", "1 1 1 t 2 1 1 extra"],
     ["{F}:6: R: flow: " + FLOW_FIELDS + ", got 6 field(s)", "{F}:7: R: flow: " + FLOW_FIELDS + ", got 8 field(s)"]),
    ("sentence", [], ["1 x 1 t 2 1 1", "1 1 1 t two 1 1"],
     ["{F}:6: R: flow: step and sentence numbers must be integers, got ['1', 'x', '1', 't', '2', '1', '1']",
      "{F}:7: R: flow: step and sentence numbers must be integers, got ['1', '1', '1', 't', 'two', '1', '1']"]),
    ("sentence", ["4 1 0"], ["1 1 1 t 2 1"],     # problems of both files of a recipe, list first
     ["{L}:11: R: list: " + LIST_FIELDS + ", got 3 field(s)", "{F}:6: R: flow: " + FLOW_FIELDS + ", got 6 field(s)"]),
])
def test_bad_lines_are_all_reported_with_file_line_recipe_and_reason(tmp_path, unit, list_lines, flow_lines, expected):
    write_rfg(tmp_path, "R", RFG_TOKENS, RFG_EDGES)
    append(tmp_path / "R.list", *list_lines)
    append(tmp_path / "R.flow", *flow_lines)
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("rfg", tmp_path, unit=unit)
    assert problems(excinfo) == [e.format(L=tmp_path / "R.list", F=tmp_path / "R.flow") for e in expected]


def test_missing_flow_file_is_a_problem_of_the_whole_recipe(tmp_path):
    write_rfg(tmp_path, "R", RFG_TOKENS, RFG_EDGES)
    (tmp_path / "R.flow").unlink()
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("rfg", tmp_path)
    assert problems(excinfo) == [f"{tmp_path / 'R.list'}: R: flow: missing flow file {tmp_path / 'R.flow'}"]


def test_list_lines_need_no_pos_or_ner_tags(tmp_path):
    write_rfg(tmp_path, "R", RFG_TOKENS, RFG_EDGES)
    append(tmp_path / "R.list", "4 1 0 Serve", "4 1 6 warm")
    (proc,) = run_adapter("rfg", tmp_path).splits["test"]
    assert [s.text for s in proc.steps] == ["Heat oven .", "Mix flour .", "Add eggs", "Bake .", "Serve warm"]


@pytest.mark.parametrize("unit, meta", [
    # all 5 flow edges refer to known sentences (the one inside sentence 0 counts too)
    ("sentence", {"source": "rfg", "unit": "sentence", "num_flow_edges": 5, "backward_edges": [[2, 1]]}),
    ("step", {"source": "rfg", "unit": "step", "num_flow_edges": 5, "backward_edges": [[1, 0]]}),
])
def test_procedure_meta_records_source_unit_flow_edges_and_backward_edges(tmp_path, unit, meta):
    write_rfg(tmp_path, "R", RFG_TOKENS, RFG_EDGES)
    (proc,) = run_adapter("rfg", tmp_path, unit=unit).splits["test"]
    assert proc.meta == meta and proc.split == "test"


@pytest.mark.parametrize("stem, title", [
    ("Almond_and_apple_cake_recipe__All_recipes_UK", "Almond and apple cake"),
    ("Fish_pie", "Fish pie"),
    ("Cake", "Cake"),
])
def test_title_is_the_stem_without_the_site_suffix_and_underscores(tmp_path, stem, title):
    write_rfg(tmp_path, stem, RFG_TOKENS, RFG_EDGES)
    (proc,) = run_adapter("rfg", tmp_path / f"{stem}.list").splits["test"]
    assert (proc.id, proc.title) == (stem, title)


def test_recipes_read_and_dropped_are_counted(tmp_path):
    write_rfg(tmp_path, "A", [(1, 1, 0, "Only"), (1, 1, 5, "one")], [])               # one sentence: too few steps
    write_rfg(tmp_path, "B", [(1, 1, 0, "Boil"), (1, 2, 0, "Drain")], [(1, 2, 0, "t", 1, 1, 0)])   # one STEP
    write_rfg(tmp_path, "C", RFG_TOKENS, RFG_EDGES)
    by_sentence = run_adapter("rfg", tmp_path)
    assert [p.id for p in by_sentence.splits["test"]] == ["B", "C"]
    assert by_sentence.records_read == Counter({"recipes": 3})
    assert by_sentence.dropped == Counter({"too few steps": 1, "backward edge": 2})
    by_step = run_adapter("rfg", tmp_path, unit="step")
    assert [p.id for p in by_step.splits["test"]] == ["C"]
    assert by_step.records_read == Counter({"recipes": 3})
    assert by_step.dropped == Counter({"too few steps": 2, "backward edge": 1})


@pytest.mark.parametrize("kind", ["empty", "only flow files"])
def test_a_folder_without_list_files_names_the_folder(tmp_path, kind):
    src = tmp_path / "rfg"
    src.mkdir()
    if kind == "only flow files":
        (src / "R.flow").write_text("1 1 1 t 2 1 1\n")
    with pytest.raises(FileNotFoundError) as excinfo:
        run_adapter("rfg", src)
    assert str(excinfo.value) == f"rfg: no .list files in {src}"


def recipes_of_two_lengths(folder: Path) -> None:
    """10 recipes: 6 with the 4 sentences of RFG_TOKENS, 4 with 3 sentences."""
    for i in range(6):
        write_rfg(folder, f"L{i}", RFG_TOKENS, RFG_EDGES)
    for i in range(4):
        write_rfg(folder, f"S{i}", RFG_TOKENS[:8], RFG_EDGES[:3])


def split_ids(splits) -> dict[str, list[str]]:
    return {name: sorted(p.id for p in procs) for name, procs in splits.items()}


@pytest.mark.parametrize("options, seed", [
    ({"fractions": [0.6, 0.2, 0.2], "seed": 3}, 3),
    ({"fractions": [0.6, 0.2, 0.2], "seed": 0}, 0),
    ({"fractions": [0.6, 0.2, 0.2]}, 0),          # default seed: 0, as in configs/data/rfg.yaml
    ({}, 0),                                       # default fractions 0.8 / 0.1 / 0.1
])
def test_random_split_is_the_seeded_stratified_split(tmp_path, options, seed):
    recipes_of_two_lengths(tmp_path)
    fixed = run_adapter("rfg", tmp_path).splits["test"]
    expected = stratified_split(fixed, fractions=options.get("fractions", (0.8, 0.1, 0.1)), seed=seed)
    result = run_adapter("rfg", tmp_path, split="random", **options)
    assert split_ids(result.splits) == split_ids(expected)
    assert all(p.split == name for name, procs in result.splits.items() for p in procs)


def test_random_split_depends_on_the_seed(tmp_path):
    recipes_of_two_lengths(tmp_path)
    splits = {seed: split_ids(run_adapter("rfg", tmp_path, split="random", fractions=[0.6, 0.2, 0.2], seed=seed).splits)
              for seed in (0, 3)}
    assert splits[0] != splits[3]
    assert {k: len(v) for k, v in splits[0].items()} == {k: len(v) for k, v in splits[3].items()} == {
        "train": 6, "val": 2, "test": 2}
