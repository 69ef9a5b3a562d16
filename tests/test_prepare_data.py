"""scripts/tools/prepare_data.py + scripts/tools/dataset_stats.py, and the adapters on the real shared data."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from data_modules.adapters import run_adapter
from data_modules.adapters.roc import read_roc
from data_modules.tasks.teo import teo_class_counts, teo_eval_sets
from seqaware import dag as dag_utils
from seqaware.procedure import read_procedures

ROOT = Path(__file__).resolve().parents[1]


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def distinct_sentences(list_path: Path) -> int:
    """Independent count: distinct (STEP, SENT) pairs of the non-comment lines of a .list file."""
    pairs = set()
    for raw in list_path.read_bytes().splitlines():
        fields = raw.split()
        if fields and not raw.lstrip().startswith(b"#"):
            pairs.add((int(fields[0]), int(fields[1])))
    return len(pairs)


def load_script(name: str):
    """Import a script from scripts/ as a module (in-process: no interpreter start-up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prepare_data_bad_input_exits_nonzero_with_message(tmp_path, capsys):
    src = tmp_path / "q.jsonl"
    src.write_text('{"plan_idx": 0}\n')
    main = load_script("prepare_data").main
    assert main(["catbench", "--src", str(src), "--out", str(tmp_path / "out")]) == 1
    assert f"{src}:1: plan 0 question ?: question_idx: missing field" in capsys.readouterr().err
    assert not (tmp_path / "out" / "test.jsonl").exists()
    assert main(["catbench", "--src", str(src), "--out", str(tmp_path / "out"), "--option", "nokey"]) == 1
    assert "--option 'nokey': expected key=value" in capsys.readouterr().err


def test_prepare_data_catbench_steps_string_is_reported_not_split_into_characters(tmp_path, capsys):
    q = {"plan_idx": 3, "question_idx": 7, "question_type": "dependent_real_before", "direction": "before",
         "steps": "Cut. Cook.", "first_step_idx": 0, "second_step_idx": 1, "label": "yes"}
    src = tmp_path / "q.jsonl"
    src.write_text(json.dumps(q) + "\n" + json.dumps(dict(q, question_idx=8, steps=["Cut.", "Cook."], first_step_idx=1.0)) + "\n")
    assert load_script("prepare_data").main(["catbench", "--src", str(src), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"{src}:1: plan 3 question 7: steps: must be a list of non-empty step strings, got a str" in err
    assert f"{src}:2: plan 3 question 8: first_step_idx: 1.0 is not a step index of the 2 steps (an integer 0..1)" in err
    assert not (tmp_path / "out" / "test.jsonl").exists()


def test_prepare_data_roc_reports_bytes_that_are_not_utf8_by_file_line_and_column(tmp_path, capsys):
    src = tmp_path / "roc"
    src.mkdir()
    (src / "dev.tsv").write_bytes(b"a . <eos> b .\nc . <eos> d\x92 .\n")
    (src / "train.tsv").write_bytes(b"\xff . <eos> f .\n")
    assert load_script("prepare_data").main(["roc", "--src", str(src), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"{src / 'dev.tsv'}:2: dev-2: steps[1].text: not valid UTF-8 (byte 0x92 at column 12); save the file as UTF-8" in err
    assert f"{src / 'train.tsv'}:1: train-1: steps[0].text: not valid UTF-8 (byte 0xff at column 1); save the file as UTF-8" in err
    assert not (tmp_path / "out" / "train.jsonl").exists()


def test_prepare_data_options_tasks_and_dataset_stats_in_process(tmp_path, capsys):
    from test_adapters import RFG_EDGES, RFG_TOKENS, write_rfg

    for i in range(4):
        write_rfg(tmp_path / "rfg", f"R{i}", RFG_TOKENS, RFG_EDGES)
    out = tmp_path / "out"
    argv = ["rfg", "--src", str(tmp_path / "rfg"), "--out", str(out), "--tasks", "teo,iso",
            "--option", "split=random", "--option", "fractions=[0.5, 0.25, 0.25]", "--task-option", "iso.label_by=dag"]
    assert load_script("prepare_data").main(argv) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["test.jsonl", "train.jsonl", "val.jsonl"]
    conversion = json.loads((out / "conversion.json").read_text())
    assert conversion["options"] == {"split": "random", "fractions": [0.5, 0.25, 0.25]}
    assert conversion["dropped"] == {"backward edge": 4} and conversion["tasks"] == {"teo": 48, "iso": 0}
    # each recipe: before 0->3, 1->2; independent pairs (0,1), (0,2), (1,3), (2,3): 2 + 4 original, x2 presentations
    assert re.search(r"\nall\s+8\s+8\s+32\n", printed)
    assert "dropped: backward edge: 4" in printed
    assert load_script("dataset_stats").main([str(out), "--tasks", "teo"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [l for l in printed.splitlines()[1:] if "task iso" not in l]
    assert load_script("dataset_stats").main([str(out), "--tasks", "coherence"]) == 1
    assert "task file not found" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.shared_data
def test_prepare_data_rfg_r100_and_dataset_stats(shared_data, tmp_path):
    src = shared_data / "rfg" / "r-100"
    out = tmp_path / "rfg"
    proc = run_script("scripts/tools/prepare_data.py", "rfg", "--src", str(src), "--out", str(out), "--tasks", "teo")
    assert proc.returncode == 0, proc.stderr
    backward = int(re.search(r"backward edge: (\d+)", proc.stdout).group(1))
    assert backward > 0
    procedures = read_procedures(out / "test.jsonl")
    assert len(procedures) == 100
    expected = {p.stem: distinct_sentences(p) for p in src.glob("*.list")}
    assert {p.id: p.num_steps for p in procedures} == expected
    assert all(dag_utils.is_acyclic(p.num_steps, p.dag) for p in procedures)
    assert all(a < b for p in procedures for a, b in p.dag)
    assert sum(len(p.meta["backward_edges"]) for p in procedures) == backward
    # TEO pairs written by the script equal the builder's, and every class occurs
    pairs = [json.loads(line) for line in (out / "tasks" / "teo.jsonl").read_text().splitlines()]
    sets = teo_eval_sets(procedures)
    assert teo_class_counts(pairs) == teo_class_counts(sets["original"] + sets["swapped"])
    counts = teo_class_counts(sets["original"])
    assert counts["before"] > 0 and counts["independent"] > 0 and counts["after"] == 0
    # printed class counts: before, after, independent (original + swapped presentations)
    assert re.search(rf"\ntest\s+{counts['before']}\s+{counts['before']}\s+{2 * counts['independent']}\n", proc.stdout)
    stats = run_script("scripts/tools/dataset_stats.py", str(out))
    assert stats.returncode == 0, stats.stderr
    # the same table (after the title line)
    assert stats.stdout.splitlines()[1:] == proc.stdout.splitlines()[1:]


@pytest.mark.shared_data
def test_rfg_units_are_the_catbench_steps(shared_data):
    rfg = {p.id: p for p in run_adapter("rfg", shared_data / "rfg" / "r-100").all_procedures()}
    cat = run_adapter("catbench", shared_data / "catbench" / "test_questions_sample.jsonl")
    plans = cat.splits["test"]
    assert len(plans) == 13
    for plan in plans:   # one CaT-Bench step = one r-FG sentence
        assert plan.num_steps == rfg[plan.meta["efg_recipe_id"]].num_steps


@pytest.mark.shared_data
def test_catbench_sample_keeps_gold_labels(shared_data):
    path = shared_data / "catbench" / "test_questions_sample.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    result = run_adapter("catbench", path)
    pairs = result.tasks["catbench"]
    assert len(pairs) == 1404
    assert [p["label"] for p in pairs] == [r["label"] for r in rows]
    assert [(p["a"], p["b"], p["question_type"]) for p in pairs] == \
        [(r["first_step_idx"], r["second_step_idx"], r["question_type"]) for r in rows]


@pytest.mark.shared_data
def test_read_roc_dev(shared_data):
    stories = read_roc(shared_data / "roc" / "dev.tsv", "test", bad_lines="error")
    assert len(stories) == 9816
    assert all(s.num_steps == 5 for s in stories)
    assert stories[0].id == "dev-1" and stories[0].steps[0].text.startswith("one day , i was driving")


def test_prepare_data_rejects_an_id_in_two_splits(tmp_path, capsys):
    from data_modules.adapters.common import AdapterResult
    from data_modules.adapters.prepare import check_ids_across_splits
    from seqaware.procedure import Procedure, ProcedureFormatError, Step

    result = AdapterResult()
    for pid, split in (("a", "train"), ("b", "train"), ("a", "test"), ("b", "test-human"), ("c", "val")):
        result.add(Procedure(id=pid, split=split, steps=[Step(text="x"), Step(text="y")]))
    with pytest.raises(ProcedureFormatError) as err:
        check_ids_across_splits(result, tmp_path / "src")
    assert [str(p) for p in err.value.problems] == [f"{tmp_path / 'src'}: a: id: in both the train and the test split",
                                                    f"{tmp_path / 'src'}: b: id: in both the train and the test-human split"]
