"""The pairwise TEO encoder head: CaT-Bench reading and answer mapping (its experiments' runs: tests/test_train.py)."""
from __future__ import annotations

import json

import pytest

from data_modules.adapters.catbench import read_catbench


def _question(**over):
    q = {"plan_idx": 0, "question_idx": 1, "question_type": "dependent_real_before", "direction": "before",
         "binary_question": "Must Step 1 happen before Step 3?", "steps": ["mix flour", "add eggs", "bake it"],
         "first_step_idx": 0, "second_step_idx": 2, "label": "yes", "efg_recipe_id": "Cake"}
    q.update(over)
    return q


def test_catbench_questions_are_presented_by_direction(tmp_path):
    path = tmp_path / "q.jsonl"
    twin = _question(question_type="dependent_real_after", direction="after", label="No")
    path.write_text("\n".join(json.dumps(q) for q in [_question(), twin]) + "\n")
    before, after = read_catbench(path)
    assert (before["text_a"], before["text_b"], before["answer"]) == ("mix flour", "bake it", "yes")
    # "Must step 3 happen after step 1?" is asked about the pair presented the other way round
    assert (after["text_a"], after["text_b"], after["answer"]) == ("bake it", "mix flour", "no")
    assert before["plan"] == "Cake"


@pytest.mark.parametrize("line, message", [
    ("{not json", "q.jsonl:1: ?: json:"),
    (json.dumps({k: v for k, v in _question().items() if k != "label"}), "q.jsonl:1: plan 0 question 1: label: missing field"),
    (json.dumps(_question(second_step_idx=9)), "q.jsonl:1: plan 0 question 1: second_step_idx: 9 is not a step index"),
    (json.dumps(_question(direction="sideways")), "q.jsonl:1: plan 0 question 1: direction: 'sideways' is not one of"),
])
def test_bad_catbench_lines_name_file_record_and_field(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message.replace("?", r"\?")):
        read_catbench(path)


@pytest.mark.shared_data
def test_shared_catbench_sample_keeps_every_gold_label(shared_data):
    items = read_catbench(shared_data / "catbench" / "test_questions_sample.jsonl")
    raw = [json.loads(line) for line in (shared_data / "catbench" / "test_questions_sample.jsonl").read_text().splitlines()]
    assert len(items) == len(raw) == 1404
    # CaT-Bench reuses a question number for the four questions of a step pair: the ids must not
    # (evaluation keeps one record per id; with the number alone 1,404 questions scored as 478)
    assert len({i["pair_id"] for i in items}) == 1404
    assert [i["answer"] for i in items] == [q["label"] for q in raw]
