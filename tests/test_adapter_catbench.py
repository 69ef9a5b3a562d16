"""CaT-Bench questions (``catbench`` adapter and :func:`read_catbench`, the TEO heads' and
``scripts/tools/catbench_eval.py``'s reader): the exact ``file:line: plan P question Q: field: reason`` line of
every bad question, every bad line of a file reported in one pass, and the question ids (``pair_id``)
that answers files are matched by and that tell the twin questions of a step pair apart.
Plans, pairs and the sample file are in tests/test_adapters.py, tests/test_adapter_contracts.py,
tests/test_bad_input.py and tests/test_prepare_data.py."""
from __future__ import annotations

import pytest

from adapter_helpers import jsonl
from data_modules.adapters import run_adapter
from data_modules.adapters.catbench import read_catbench
from seqaware.procedure import ProcedureFormatError
from test_adapter_contracts import cat_q, problem_lines

GOOD = cat_q(0, 0, 0, 2, "yes")  # plan 0: steps S1. S2. S3.
NOT_STEPS = "must be a list of non-empty step strings, got a list with a non-string or empty step"


def without(record: dict, *fields: str) -> dict:
    return {k: v for k, v in record.items() if k not in fields}


def problems(read, path) -> list[str]:
    with pytest.raises(ProcedureFormatError) as excinfo:
        read(path)
    return problem_lines(excinfo)


def convert(path):
    return run_adapter("catbench", path)


# Line 1 of each file is GOOD; the bad question is line 2.  reader: the problems read_catbench reports
# (it needs only the pair fields, not plan_idx / question_idx / question_type), adapter: those of convert.
BAD = {
    "blank step": (dict(cat_q(0, 1, 0, 2, "yes"), steps=["S1.", "  ", "S3."]),
                   [f"plan 0 question 1: steps: {NOT_STEPS}"], [f"plan 0 question 1: steps: {NOT_STEPS}"]),
    "empty step": (dict(cat_q(0, 1, 0, 1, "yes"), steps=["S1.", ""]),
                   [f"plan 0 question 1: steps: {NOT_STEPS}"], [f"plan 0 question 1: steps: {NOT_STEPS}"]),
    "number as a step": (dict(cat_q(0, 1, 0, 1, "yes"), steps=["S1.", 2, "S3."]),
                         [f"plan 0 question 1: steps: {NOT_STEPS}"], [f"plan 0 question 1: steps: {NOT_STEPS}"]),
    "index one past the last step": (
        cat_q(0, 1, 0, 3, "yes"),
        ["plan 0 question 1: second_step_idx: 3 is not a step index of the 3 steps (an integer 0..2)"],
        ["plan 0 question 1: second_step_idx: 3 is not a step index of the 3 steps (an integer 0..2)"]),
    "first index one past the last step": (
        cat_q(0, 1, 3, 0, "yes"),
        ["plan 0 question 1: first_step_idx: 3 is not a step index of the 3 steps (an integer 0..2)"],
        ["plan 0 question 1: first_step_idx: 3 is not a step index of the 3 steps (an integer 0..2)"]),
    "a step against itself": (cat_q(0, 1, 1, 1, "no"), ["plan 0 question 1: second_step_idx: equals first_step_idx"],
                              ["plan 0 question 1: second_step_idx: equals first_step_idx"]),
    "plan_idx a string": (dict(cat_q(0, 1, 0, 1, "yes"), plan_idx="P7"), [],
                          ["plan P7 question 1: plan_idx: 'P7' is not an integer"]),
    "plan_idx a boolean": (dict(cat_q(0, 1, 0, 1, "yes"), plan_idx=True), [],
                           ["plan True question 1: plan_idx: True is not an integer"]),
    "no plan_idx, bad label": (without(cat_q(0, 1, 0, 1, "maybe"), "plan_idx"),
                               ["plan ? question 1: label: 'maybe' is not one of ['yes', 'no']"],
                               ["plan ? question 1: plan_idx: missing field"]),
    "no question_idx, bad direction": (dict(without(cat_q(0, 1, 0, 1, "no"), "question_idx"), direction="later"),
                                       ["plan 0 question ?: direction: 'later' is not one of ['before', 'after']"],
                                       ["plan 0 question ?: question_idx: missing field"]),
    "a missing field stops the checks of its question": (
        dict(cat_q(4, 1, 2, 2, "Yes?"), direction=None, plan_idx=4.0),
        ["plan 4.0 question 1: direction: missing field"],
        ["plan 4.0 question 1: direction: missing field"]),
    "every value problem of one question": (
        dict(cat_q(4, 1, 2, 2, "Yes?"), direction="sideways", plan_idx=4.0),
        ["plan 4.0 question 1: second_step_idx: equals first_step_idx",
         "plan 4.0 question 1: label: 'Yes?' is not one of ['yes', 'no']",
         "plan 4.0 question 1: direction: 'sideways' is not one of ['before', 'after']"],
        ["plan 4.0 question 1: second_step_idx: equals first_step_idx",
         "plan 4.0 question 1: label: 'Yes?' is not one of ['yes', 'no']",
         "plan 4.0 question 1: direction: 'sideways' is not one of ['before', 'after']",
         "plan 4.0 question 1: plan_idx: 4.0 is not an integer"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_question_is_reported_exactly(tmp_path, case):
    bad, reader, adapter = BAD[case]
    path = jsonl(tmp_path / "q.jsonl", [GOOD, bad])
    assert problems(convert, path) == [f"{path}:2: {p}" for p in adapter]
    if reader:
        assert problems(read_catbench, path) == [f"{path}:2: {p}" for p in reader]
    else:  # what only the adapter requires
        assert len(read_catbench(path)) == 2


def test_read_catbench_reports_every_bad_line_of_a_file(tmp_path):
    """A bad question or a repeat does not stop the reading: every later line is still checked."""
    path = jsonl(tmp_path / "q.jsonl", [GOOD, cat_q(0, 1, 0, 1, "maybe"), GOOD, cat_q(0, 2, 0, 9, "no"),
                                        cat_q(0, 3, 1, 2, "no"), cat_q(0, 1, 0, 1, "maybe")])
    assert problems(read_catbench, path) == [
        f"{path}:2: plan 0 question 1: label: 'maybe' is not one of ['yes', 'no']",
        f"{path}:3: plan 0 question 0: question_idx: question 0-dependent_real_before-0 (plan, type, number) "
        f"repeats {path}:1",
        f"{path}:4: plan 0 question 2: second_step_idx: 9 is not a step index of the 3 steps (an integer 0..2)",
        f"{path}:6: plan 0 question 1: label: 'maybe' is not one of ['yes', 'no']",
    ]


def test_convert_reports_a_repeat_once_and_every_later_line(tmp_path):
    """A repeated question is reported as a repeat (naming the first line), not also as a plan whose steps
    differ; the lines after it are still checked."""
    path = jsonl(tmp_path / "q.jsonl", [GOOD, cat_q(0, 0, 0, 1, "yes", steps=("X.", "Y.")), cat_q(0, 1, 0, 7, "no"),
                                        cat_q(0, 2, 0, 1, "no", steps=("X.", "Y."))])
    assert problems(convert, path) == [
        f"{path}:2: plan 0 question 0: question_idx: question 0-dependent_real_before-0 (plan, type, number) "
        f"repeats {path}:1",
        f"{path}:3: plan 0 question 1: second_step_idx: 7 is not a step index of the 3 steps (an integer 0..2)",
        f"{path}:4: plan 0 question 2: steps: differ from the steps of plan 0 first seen at {path}:1",
    ]


def test_read_catbench_items_are_exact(tmp_path):
    """The item of a full CaT-Bench question: presented pair (``after`` swaps it), gold answer, the plan."""
    path = jsonl(tmp_path / "q.jsonl", [
        cat_q(3, 5, 2, 0, " No ", qtype="nondependent_real_after", title="Tea", efg_recipe_id="R3"),
        dict(cat_q(1, 0, 0, 1, "YES", steps=("A.", "B.")), direction=" Before"),
    ])
    assert read_catbench(path) == [
        {"pair_id": "3-nondependent_real_after-5", "text_a": "S1.", "text_b": "S3.", "direction": "after",
         "answer": "no", "plan": "R3", "question_type": "nondependent_real_after", "steps": ["S1.", "S2.", "S3."],
         "first": 2, "second": 0, "plan_idx": 3, "title": "Tea", "line": 1},
        {"pair_id": "1-dependent_real_before-0", "text_a": "A.", "text_b": "B.", "direction": "before",
         "answer": "yes", "plan": None, "question_type": "dependent_real_before", "steps": ["A.", "B."],
         "first": 0, "second": 1, "plan_idx": 1, "title": None, "line": 2},
    ]


def test_read_catbench_ids_of_questions_without_catbench_numbering(tmp_path):
    """Only the pair fields given: the direction and the step pair stand in for the question type, the line
    for the question number and ``?`` for the plan, so two questions about the same pair are both kept."""
    pair = {"steps": ["A.", "B.", "C."], "first_step_idx": 0, "second_step_idx": 1, "label": "yes"}
    path = jsonl(tmp_path / "q.jsonl", [
        dict(pair, direction="before"),
        dict(pair, direction=" After ", first_step_idx=2, second_step_idx=0, label="no"),
        dict(pair, direction="BEFORE", question_type=""),
    ])
    items = read_catbench(path)
    assert [(i["pair_id"], i["text_a"], i["text_b"], i["direction"], i["answer"], i["question_type"], i["plan_idx"])
            for i in items] == [
        ("?-before-0-1-L1", "A.", "B.", "before", "yes", None, None),
        ("?-after-2-0-L2", "A.", "C.", "after", "no", None, None),
        ("?-before-0-1-L3", "A.", "B.", "before", "yes", "", None),
    ]


def test_read_catbench_repeat_without_plan_idx_names_both_lines(tmp_path):
    q = without(cat_q(0, 5, 0, 1, "yes"), "plan_idx")
    path = jsonl(tmp_path / "q.jsonl", [q, dict(q, question_type="dependent_real_after", direction="after"), q])
    assert problems(read_catbench, path) == [
        f"{path}:3: plan ? question 5: question_idx: question ?-dependent_real_before-5 (plan, type, number) "
        f"repeats {path}:1"]


def test_read_catbench_missing_or_empty_file_names_the_config_key(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(FileNotFoundError) as excinfo:
        read_catbench(missing)
    assert str(excinfo.value) == f"data.eval_path: no such file: {missing}"
    with pytest.raises(FileNotFoundError) as excinfo:
        read_catbench(str(missing), "data.train_path")
    assert str(excinfo.value) == f"data.train_path: no such file: {missing}"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError) as excinfo:
        read_catbench(empty)
    assert str(excinfo.value) == f"data.eval_path={empty}: the file holds no CaT-Bench questions"
    with pytest.raises(ValueError) as excinfo:
        read_catbench(empty, "data.extra_eval_paths.val")
    assert str(excinfo.value) == f"data.extra_eval_paths.val={empty}: the file holds no CaT-Bench questions"
