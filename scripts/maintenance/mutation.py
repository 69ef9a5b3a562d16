"""Mutation testing of the code results and runs depend on (issue #44): run mutmut over that scope
and print, per module, how many mutants the fast tests kill.

    python scripts/maintenance/mutation.py run                 # mutmut over SCOPE, then the table
    python scripts/maintenance/mutation.py run --only 'seqaware.runs.*'
    python scripts/maintenance/mutation.py run --only 'registry.*' --tests tests/test_registry.py --max-children 1
    python scripts/maintenance/mutation.py report --survivors  # the table of the last run, and each survivor's name

``run`` runs the mutants without a result, the survivors and those no test reached (tests may have been added);
killed mutants keep their result until their code changes, or until the test command of ``[tool.mutmut]`` changes
(mutmut then forgets every result, and ``run`` gives it the whole scope: :func:`config_changed`).  ``--rerun`` runs
everything again.  An ``--only``
pattern that matches no mutant stops the script (exit 2) naming it and the modules or mutant names it could
have meant (:func:`unmatched`).

mutmut reads the rest of its setup from ``[tool.mutmut]`` in pyproject.toml (which files it mutates,
the test command); it works in ``mutants/`` (git-ignored).  ``mutmut show NAME`` prints a survivor as
a diff.  Whole modules are in scope, except the TEO heads, where only the threshold and
model-selection functions are (the rest of those files are networks the training tests cover), and the
pretraining module and its objectives, where only the order of corruptions is.  ``--tests`` narrows the tests
mutmut draws from to some files (:data:`MUTMUT_WITH_TESTS`).
See docs/mutation.md.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# mutmut names a mutant ``<module>.x_<function>__mutmut_<k>`` (methods: ``x\u01c1<Class>\u01c1<method>``)
SCOPE = (
    "seqaware.metrics.*",
    "seqaware.runs.*",
    "seqaware.launch.*",
    "seqaware.checkpoint_io.*",
    "data_modules.adapters.*",
    "data_modules.datamodule.*",
    "scripts.tools.catbench_eval.*",
    "scripts.studies.paper_tables.*",
    "scripts.studies.paper_tables_*.*",   # its parts: schema, published, render, ours
    # TEO heads: the decision rule, threshold choice and cross-validated model selection
    "seqaware.modules.teo_plan_head.x_relations__mutmut_*",
    "seqaware.modules.teo_plan_head.x\u01c1TeoPlanHeadModule\u01c1_relations__mutmut_*",
    "seqaware.modules.teo_plan_head.x\u01c1TeoPlanHeadModule\u01c1_report_teo__mutmut_*",
    "seqaware.modules.teo_plan_head.x\u01c1TeoPlanHeadModule\u01c1_report_catbench__mutmut_*",
    "seqaware.modules.teo_closure_selection.x_fold_scores__mutmut_*",
    "seqaware.modules.teo_closure_selection.x_summarise__mutmut_*",
    "seqaware.modules.teo_closure_baseline.x_blend_probs__mutmut_*",
    "seqaware.modules.teo_closure_head.x\u01c1TeoClosureHeadModule\u01c1_configured_setting__mutmut_*",
    "seqaware.modules.teo_closure_head.x\u01c1TeoClosureHeadModule\u01c1setup__mutmut_*",
    "seqaware.modules.teo_closure_head.x\u01c1TeoClosureHeadModule\u01c1_cross_validate__mutmut_*",
    "seqaware.modules.teo_closure_head.x\u01c1TeoClosureHeadModule\u01c1on_test_epoch_end__mutmut_*",
    # issue #61 item 6: pretrained weights (and the text models by name that moved out of pretrained.py), config
    # resolvers, the BERSON decoder, the registry class
    "seqaware.pretrained.*",
    "seqaware.text_models.*",
    "seqaware.config.*",
    "decoders.berson.*",
    "registry.*",
    # the objectives' corruption order: moves before masks, each objective changing only what it declares
    "seqaware.objectives.corruption.x_corruption_kinds__mutmut_*",
    "seqaware.objectives.corruption.x_corruption_order__mutmut_*",
    "seqaware.objectives.corruption.x_moves__mutmut_*",
    "seqaware.objectives.corruption.x_check_corruption__mutmut_*",
    "seqaware.modules.pretraining.x\u01c1PretrainingModule\u01c1_forward_group__mutmut_*",
)

# ``run --tests``: mutmut with its test selection narrowed to the given test files (its first pass records which of
# them reach each function; a mutant then runs those that reach it).  mutmut has no option for it: set it in its
# config.  The files are left out of the fingerprint by which mutmut forgets every result when its test selection
# changes: a file added later has only its tests' first pass run (mutmut finds new tests itself), and the survivors
# run again against them, instead of every mutant.
MUTMUT_WITH_TESTS = ("import sys\n"
                     "from mutmut.configuration import Config, config\n"
                     "cut = sys.argv.index('--')\n"
                     "fingerprint = config().config_fingerprint()\n"
                     "config().pytest_add_cli_args_test_selection.extend(sys.argv[1:cut])\n"
                     "Config.config_fingerprint = lambda self: fingerprint\n"
                     "from mutmut.__main__ import cli\n"
                     "cli(sys.argv[cut + 1:], prog_name='mutmut')\n")

def results(folder: Path | None = None, scope: tuple[str, ...] = SCOPE) -> dict[str, dict[str, int | None]]:
    """``module -> {mutant name: exit code}`` for the mutants in ``scope``, read from mutmut's ``.meta`` files
    (in ``folder``, default ``mutants/``)."""
    folder = ROOT / "mutants" if folder is None else folder
    out: dict[str, dict[str, int | None]] = {}
    for meta in sorted(folder.rglob("*.py.meta")):
        module = ".".join(meta.relative_to(folder).with_suffix("").with_suffix("").parts)
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        picked = {k: v for k, v in codes.items() if any(fnmatch.fnmatchcase(k, p) for p in scope)}
        if picked:
            out[module] = picked
    return out


def mutated_modules() -> list[str]:
    """The modules mutmut mutates: the ``.py`` files under ``source_paths`` that ``only_mutate`` of
    ``[tool.mutmut]`` in pyproject.toml names (fnmatch, as mutmut matches them), as dotted names."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    files = {path.relative_to(ROOT) for source in config["source_paths"] for path in (ROOT / source).rglob("*.py")}
    return sorted(".".join(f.with_suffix("").parts) for f in files
                  if any(fnmatch.fnmatch(f.as_posix(), g) for g in config["only_mutate"]))


def unmatched(patterns: list[str], mutmut_generates: bool, after_run: bool = False) -> str | None:
    """Why some ``--only`` patterns can match no mutant (one line each), or None.

    A pattern is refused when no mutant of the last run (``mutants/``) matches it and its fixed beginning (up to
    the first ``*``, ``?`` or ``[``) is the beginning of no mutant name of a module mutmut mutates.  When it could
    name a mutant of such a module that the last run does not hold (a function added since), it passes only if
    mutmut is about to generate the mutants (``mutmut_generates``: a first run, or ``--rerun``), and is refused
    otherwise, listing the mutant names that module has (``after_run``: mutmut has just generated them all)."""
    all_codes = results(scope=("*",))
    names = [name for codes in all_codes.values() for name in codes]
    modules: list[str] | None = None
    lines = []
    for pattern in patterns:
        if any(fnmatch.fnmatchcase(name, pattern) for name in names):
            continue
        if modules is None:
            modules = sorted(set(mutated_modules()) | set(all_codes))
        head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
        could = [m for m in modules if head.startswith(f"{m}.x") or f"{m}.x".startswith(head)]
        if not could:
            lines.append(f"--only {pattern!r} matches no mutant: a mutant is named MODULE.x_FUNCTION__mutmut_N "
                         f"(a method: MODULE.x\u01c1CLASS\u01c1METHOD__mutmut_N), and mutmut mutates the modules "
                         f"{', '.join(modules)}")
        elif names and not mutmut_generates:
            prefixes = tuple(f"{m}." for m in could)
            functions = sorted({name.split("__mutmut_")[0] for name in names if name.startswith(prefixes)})
            shown = ", ".join(functions[:12]) + (f" and {len(functions) - 12} more" if len(functions) > 12 else "")
            since = "" if after_run else (f" (a function added since: 'run --rerun --only {pattern}' has mutmut "
                                          "generate its mutants)")
            lines.append(f"--only {pattern!r} matches no mutant of the last run ({ROOT / 'mutants'}); the mutant names "
                         f"it could match start with {shown or 'nothing: the run holds no mutant of ' + ', '.join(could)}"
                         f"{since}")
    return "\n".join(lines) or None


def config_changed() -> bool:
    """Whether mutmut will forget every result at its next run: the pytest arguments or the test selection of
    ``[tool.mutmut]`` differ from those of the last run (``mutants/mutmut-stats.json``).  mutmut then resets every
    mutant but runs only those it is given, so :func:`main` gives it the whole scope."""
    import contextlib

    try:
        old = json.loads((ROOT / "mutants" / "mutmut-stats.json").read_text())["config_fingerprint"]
    except (OSError, ValueError, KeyError):
        return False
    from mutmut.configuration import _load_config

    with contextlib.chdir(ROOT):   # mutmut reads pyproject.toml in the working directory
        new = _load_config().config_fingerprint()
    return any(old.get(group) != new[group] for group in ("test_execution", "test_selection"))


def summary(codes: dict[str, int | None]) -> dict[str, int]:
    """Counts of one module's mutants by mutmut's own status names: ``mutants``, ``tested``, ``killed``
    (a test failed or the mutant ran out of time, as mutmut scores them), ``survived``, ``no_tests`` (no
    test covers the function) and ``other`` (suspicious, segfault, skipped)."""
    from mutmut.stats import status_by_exit_code

    tally = Counter(status_by_exit_code[c] for c in codes.values())
    killed = tally["killed"] + tally["timeout"]
    other = sum(n for status, n in tally.items() if status not in ("killed", "timeout", "survived", "no tests", "not checked"))
    return {"mutants": len(codes), "tested": len(codes) - tally["not checked"], "killed": killed,
            "survived": tally["survived"], "no_tests": tally["no tests"], "other": other}


def table(by_module: dict[str, dict[str, int | None]]) -> str:
    lines = ["| module | mutants | tested | killed | survived | no test | other | killed / tested |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for module, codes in by_module.items():
        s = summary(codes)
        share = f"{100 * s['killed'] / s['tested']:.1f}%" if s["tested"] else "-"
        lines.append(f"| `{module}` | {s['mutants']} | {s['tested']} | {s['killed']} | {s['survived']} | "
                     f"{s['no_tests']} | {s['other']} | {share} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("run", "report"))
    parser.add_argument("--only", nargs="+", metavar="PATTERN",
                        help="mutant-name patterns (fnmatch) to run or report instead of the whole scope")
    parser.add_argument("--survivors", action="store_true", help="also list the surviving mutants")
    parser.add_argument("--rerun", action="store_true",
                        help="run every mutant in scope again, not only the survivors and those without a result")
    parser.add_argument("--max-children", type=int, default=None, help="parallel mutants (mutmut's default: CPUs)")
    parser.add_argument("--tests", nargs="+", metavar="PATH",
                        help="test files (pytest paths) mutmut draws from instead of every fast test; a mutant only "
                             "another test would kill counts as surviving. A file added at a later run has its new "
                             "tests' coverage recorded and the survivors run again; a file left out does not undo "
                             "the kills of its tests (delete mutants/ or use --rerun for that)")
    parser.add_argument("--deselect", action="append", metavar="NODEID",
                        help="leave one test out of mutmut's selection, as --tests adds files (e.g. a test that fails "
                             "on the checkout for a reason of its own: mutmut needs every selected test to pass)")
    args = parser.parse_args(argv)
    scope = tuple(args.only) if args.only else SCOPE
    if args.only:
        generates = args.command == "run" and (args.rerun or not (ROOT / "mutants").is_dir())
        problem = unmatched(args.only, mutmut_generates=generates)
        if problem:
            print(problem, file=sys.stderr)
            return 2
    if args.command == "run":
        extra = ["--max-children", str(args.max_children)] if args.max_children else []
        names = list(scope)
        forgets = (ROOT / "mutants").is_dir() and not args.rerun and config_changed()
        if forgets:
            print("the test command of [tool.mutmut] changed since the last run: mutmut forgets every result, so every "
                  "mutant in scope runs", file=sys.stderr)
        if (ROOT / "mutants").is_dir() and not args.rerun and not forgets:
            # mutmut re-runs every mutant it is given by name: give it those without a result yet, the survivors
            # and those no test reached (tests may have been added since); a killed mutant stays killed until its
            # code changes, and then mutmut forgets its result itself
            from mutmut.stats import status_by_exit_code

            names = [name for codes in results(scope=scope).values() for name, code in codes.items()
                     if status_by_exit_code[code] in ("not checked", "survived", "no tests")]
            if not names:
                print("every mutant in scope is killed (--rerun runs them all again)", file=sys.stderr)
        # one thread per mutant process: mutmut runs one per CPU already
        env = {**os.environ, **{var: "1" for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}
        if names:
            selection = [*(args.tests or []), *(f"--deselect={node}" for node in args.deselect or [])]
            mutmut = ([sys.executable, "-c", MUTMUT_WITH_TESTS, *selection, "--"] if selection
                      else [sys.executable, "-m", "mutmut"])
            code = subprocess.call([*mutmut, "run", *extra, *names], cwd=ROOT, env=env)
            # mutmut has generated every mutant now: a pattern that still matches none is named (mutmut itself
            # stops with an AssertionError when no pattern matches)
            problem = unmatched(args.only, False, after_run=True) if args.only and results(scope=("*",)) else None
            if problem:
                print(problem, file=sys.stderr)
                return 2
            if code:
                return code
    by_module = results(scope=scope)
    if not by_module:
        print(f"no mutants in {ROOT / 'mutants'} match {list(scope)}: run 'python scripts/maintenance/mutation.py run' first",
              file=sys.stderr)
        return 1
    print(table(by_module))
    if args.survivors:
        for codes in by_module.values():
            for name, code in codes.items():
                if code == 0:  # mutmut: the tests passed
                    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
