"""scripts/mutation.py: the per-module table of a mutmut run, and which mutants a new run is given."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("mutmut")   # a developer tool (requirements-dev.txt)

from scripts import mutation  # noqa: E402

CODES = {  # mutmut's exit codes: 1 killed, -24 timeout (scored as killed), 0 survived, 33 no test, None not run
    "seqaware.runs.x_a__mutmut_1": 1,
    "seqaware.runs.x_a__mutmut_2": -24,
    "seqaware.runs.x_a__mutmut_3": 0,
    "seqaware.runs.x_b__mutmut_1": 33,
    "seqaware.runs.x_b__mutmut_2": None,
}


@pytest.fixture
def mutants(tmp_path, monkeypatch):
    folder = tmp_path / "mutants"
    (folder / "seqaware").mkdir(parents=True)
    (folder / "seqaware" / "runs.py.meta").write_text(json.dumps({"exit_code_by_key": CODES}))
    (folder / "seqaware" / "modules").mkdir()
    (folder / "seqaware" / "modules" / "teo_plan_head.py.meta").write_text(json.dumps({"exit_code_by_key": {
        "seqaware.modules.teo_plan_head.x_relations__mutmut_1": 0,          # in scope
        "seqaware.modules.teo_plan_head.x_sinusoidal_positions__mutmut_1": 0,   # a network part: out of scope
    }}))
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    return folder


def test_the_table_counts_each_modules_mutants_by_mutmuts_status(mutants):
    by_module = mutation.results(mutants)
    assert list(by_module) == ["seqaware.modules.teo_plan_head", "seqaware.runs"]
    assert list(by_module["seqaware.modules.teo_plan_head"]) == ["seqaware.modules.teo_plan_head.x_relations__mutmut_1"]
    assert mutation.summary(by_module["seqaware.runs"]) == {"mutants": 5, "tested": 4, "killed": 2, "survived": 1,
                                                           "no_tests": 1, "other": 0}
    table = mutation.table(by_module).splitlines()
    assert table[-1] == "| `seqaware.runs` | 5 | 4 | 2 | 1 | 1 | 0 | 50.0% |"


def test_a_run_gives_mutmut_the_unfinished_the_surviving_and_the_untested_mutants(mutants, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(mutation.subprocess, "call", lambda args, **kwargs: calls.append((args, kwargs["env"])) or 0)
    assert mutation.main(["run", "--only", "seqaware.runs.*"]) == 0
    (args, env), = calls
    assert args[1:4] == ["-m", "mutmut", "run"]
    assert args[4:] == ["seqaware.runs.x_a__mutmut_3", "seqaware.runs.x_b__mutmut_1", "seqaware.runs.x_b__mutmut_2"]
    assert env["OMP_NUM_THREADS"] == "1"
    assert "| `seqaware.runs` | 5 | 4 | 2 | 1 | 1 | 0 | 50.0% |" in capsys.readouterr().out
    calls.clear()
    mutation.main(["run", "--only", "seqaware.runs.*", "--rerun"])
    assert calls[0][0][4:] == ["seqaware.runs.*"]


def test_report_without_a_run_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    assert mutation.main(["report"]) == 1
    assert "run 'python scripts/mutation.py run' first" in capsys.readouterr().err
