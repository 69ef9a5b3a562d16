"""scripts/maintenance/mutation.py: the per-module table of a mutmut run, and which mutants a new run is given."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("mutmut")   # a developer tool (requirements-dev.txt)

from scripts.maintenance import mutation  # noqa: E402

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
    assert "run 'python scripts/maintenance/mutation.py run' first" in capsys.readouterr().err


# ---------------------------------------------------------------- --only PATTERN that matches no mutant
MUTATED = "seqaware.modules.teo_plan_head, seqaware.runs"   # what the fixture's pyproject.toml has mutmut mutate


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A checkout whose [tool.mutmut] mutates seqaware/runs.py and seqaware/modules/teo_plan_head.py (not io.py)."""
    (tmp_path / "seqaware" / "modules").mkdir(parents=True)
    for name in ("runs.py", "io.py", "modules/teo_plan_head.py"):
        (tmp_path / "seqaware" / name).write_text("")
    (tmp_path / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["seqaware/"]\n'
                                             'only_mutate = ["seqaware/runs.py", "seqaware/modules/*"]\n')
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    monkeypatch.setattr(mutation.subprocess, "call", lambda *a, **k: pytest.fail("mutmut was run"))
    return tmp_path


def test_the_mutated_modules_are_those_pyproject_names():
    modules = mutation.mutated_modules()
    assert {"seqaware.runs", "seqaware.checkpoint_io", "seqaware.metrics.iso", "data_modules.adapters.roc",
            "seqaware.modules.teo_plan_head", "scripts.tools.catbench_eval", "seqaware.pretrained", "seqaware.config",
            "decoders.berson", "registry.__init__", "seqaware.objectives.corruption"} <= set(modules)
    assert "seqaware.io" not in modules and "seqaware.modules.base" not in modules


@pytest.mark.parametrize("first_run", [True, False])
def test_a_pattern_that_names_no_mutated_module_is_refused_before_mutmut_runs(project, mutants, capsys, first_run):
    if first_run:
        import shutil

        shutil.rmtree(mutants)
    assert mutation.main(["run", "--only", "seqaware.runs.*", "seqaware.runz.*", "seqaware.io.*"]) == 2
    assert capsys.readouterr().err == "".join(
        f"--only {pattern!r} matches no mutant: a mutant is named MODULE.x_FUNCTION__mutmut_N (a method: "
        f"MODULE.x\u01c1CLASS\u01c1METHOD__mutmut_N), and mutmut mutates the modules {MUTATED}\n"
        for pattern in ("seqaware.runz.*", "seqaware.io.*"))


def test_a_pattern_that_matches_no_mutant_of_the_last_run_lists_those_it_could_mean(project, mutants, capsys):
    assert mutation.main(["run", "--only", "seqaware.runs.x_c*"]) == 2
    assert capsys.readouterr().err == (
        f"--only 'seqaware.runs.x_c*' matches no mutant of the last run ({project / 'mutants'}); the mutant names it "
        "could match start with seqaware.runs.x_a, seqaware.runs.x_b (a function added since: 'run --rerun --only "
        "seqaware.runs.x_c*' has mutmut generate its mutants)\n")
    assert mutation.main(["report", "--only", "seqaware.runs.x_c*"]) == 2      # report checks it the same way
    assert "matches no mutant of the last run" in capsys.readouterr().err


def test_with_rerun_mutmut_generates_the_mutants_and_a_pattern_still_unmatched_is_named(project, mutants, monkeypatch,
                                                                                       capsys):
    calls = []
    monkeypatch.setattr(mutation.subprocess, "call", lambda args, **kwargs: calls.append(args) or 1)  # mutmut: nothing matched
    assert mutation.main(["run", "--rerun", "--only", "seqaware.runs.x_c*"]) == 2
    assert calls[0][4:] == ["seqaware.runs.x_c*"]
    assert capsys.readouterr().err == (
        f"--only 'seqaware.runs.x_c*' matches no mutant of the last run ({project / 'mutants'}); the mutant names it "
        "could match start with seqaware.runs.x_a, seqaware.runs.x_b\n")


def test_on_a_first_run_a_pattern_of_a_mutated_module_goes_to_mutmut(project, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(mutation.subprocess, "call", lambda args, **kwargs: calls.append(args) or 0)
    assert mutation.main(["run", "--only", "seqaware.runs.x_c*", "*plan_head.x_relations*"]) == 1   # no meta: no table
    assert calls[0][4:] == ["seqaware.runs.x_c*", "*plan_head.x_relations*"]
    assert "run 'python scripts/maintenance/mutation.py run' first" in capsys.readouterr().err


def test_tests_narrow_the_tests_mutmut_draws_from_to_those_files(project, mutants, monkeypatch):
    calls = []
    monkeypatch.setattr(mutation.subprocess, "call", lambda args, **kwargs: calls.append((args, kwargs["cwd"])) or 0)
    assert mutation.main(["run", "--only", "seqaware.runs.*", "--max-children", "1",
                          "--tests", "tests/test_a.py", "tests/test_b.py"]) == 0
    (args, cwd), = calls
    assert cwd == project
    assert args[1:3] == ["-c", mutation.MUTMUT_WITH_TESTS]
    assert args[3:] == ["tests/test_a.py", "tests/test_b.py", "--", "run", "--max-children", "1",
                        "seqaware.runs.x_a__mutmut_3", "seqaware.runs.x_b__mutmut_1", "seqaware.runs.x_b__mutmut_2"]

    # what that command runs: mutmut's own command line, with those files added to [tool.mutmut]'s test selection
    import sys

    import mutmut.__main__ as mutmut_main
    from mutmut.configuration import Config, config, reset_config

    (project / "pyproject.toml").write_text((project / "pyproject.toml").read_text()
                                            + 'pytest_add_cli_args_test_selection = ["-m", "not slow"]\n')
    monkeypatch.chdir(project)
    reset_config()
    plain = config().config_fingerprint()
    seen = []
    monkeypatch.setattr(mutmut_main, "cli", lambda argv, prog_name: seen.append(
        (argv, prog_name, list(config().pytest_add_cli_args_test_selection), config().config_fingerprint())))
    monkeypatch.setattr(sys, "argv", ["-c", *args[3:]])
    monkeypatch.setattr(Config, "config_fingerprint", Config.config_fingerprint)   # the command replaces it
    reset_config()
    try:
        exec(mutation.MUTMUT_WITH_TESTS, {})
    finally:
        reset_config()
    # the files narrow the selection, but are no change of mutmut's configuration: results are kept when files
    # are added (mutmut records the new tests' coverage itself)
    assert seen == [(args[6:], "mutmut", ["-m", "not slow", "tests/test_a.py", "tests/test_b.py"], plain)]
    calls.clear()
    assert mutation.main(["run", "--only", "seqaware.runs.*", "--tests", "tests/test_a.py",
                          "--deselect", "tests/test_a.py::test_x", "--deselect", "tests/test_a.py::test_y"]) == 0
    assert calls[0][0][3:7] == ["tests/test_a.py", "--deselect=tests/test_a.py::test_x",
                                "--deselect=tests/test_a.py::test_y", "--"]


def test_after_a_change_of_the_test_command_every_mutant_in_scope_runs(project, mutants, monkeypatch, capsys):
    """mutmut forgets every result when the pytest arguments or test selection of [tool.mutmut] change, but runs
    only the mutants it is given: the run then gives it the whole scope, not the last run's survivors."""
    import contextlib

    from mutmut.configuration import _load_config

    with contextlib.chdir(project):
        fingerprint = _load_config().config_fingerprint()
    stats = mutants / "mutmut-stats.json"
    calls = []
    monkeypatch.setattr(mutation.subprocess, "call", lambda args, **kwargs: calls.append(args) or 0)
    stats.write_text(json.dumps({"config_fingerprint": fingerprint}))
    assert not mutation.config_changed()
    mutation.main(["run", "--only", "seqaware.runs.*"])
    assert calls[-1][4:] == ["seqaware.runs.x_a__mutmut_3", "seqaware.runs.x_b__mutmut_1", "seqaware.runs.x_b__mutmut_2"]
    for group in ("test_selection", "test_execution"):
        stats.write_text(json.dumps({"config_fingerprint": {**fingerprint, group: "0" * 12}}))
        assert mutation.config_changed()
        capsys.readouterr()
        mutation.main(["run", "--only", "seqaware.runs.*"])
        assert calls[-1][4:] == ["seqaware.runs.*"]
        assert "mutmut forgets every result, so every mutant in scope runs" in capsys.readouterr().err
    stats.write_text(json.dumps({"config_fingerprint": {**fingerprint, "timeout": "0" * 12}}))   # keeps the kills
    assert not mutation.config_changed()
