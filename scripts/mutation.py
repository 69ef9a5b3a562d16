"""Mutation testing of the code results and runs depend on (issue #44): run mutmut over that scope
and print, per module, how many mutants the fast tests kill.

    python scripts/mutation.py run                 # mutmut over SCOPE, then the table
    python scripts/mutation.py run --only 'seqaware.runs.*'
    python scripts/mutation.py report --survivors  # the table of the last run, and each survivor's name

``run`` runs the mutants without a result, the survivors and those no test reached (tests may have been added);
killed mutants keep their result until their code changes.  ``--rerun`` runs everything again.

mutmut reads the rest of its setup from ``[tool.mutmut]`` in pyproject.toml (which files it mutates,
the test command); it works in ``mutants/`` (git-ignored).  ``mutmut show NAME`` prints a survivor as
a diff.  Whole modules are in scope, except the TEO heads, where only the threshold and
model-selection functions are (the rest of those files are networks the training tests cover).
See docs/mutation.md.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# mutmut names a mutant ``<module>.x_<function>__mutmut_<k>`` (methods: ``x\u01c1<Class>\u01c1<method>``)
SCOPE = (
    "seqaware.metrics.*",
    "seqaware.runs.*",
    "seqaware.launch.*",
    "seqaware.checkpoint_io.*",
    "data_modules.adapters.*",
    "data_modules.datamodule.*",
    "scripts.catbench_eval.*",
    "scripts.paper_tables.*",
    # TEO heads: the decision rule, threshold choice and cross-validated model selection
    "seqaware.modules.teo_plan_head.x_relations__mutmut_*",
    "seqaware.modules.teo_plan_head.x\u01c1TeoPlanHeadModule\u01c1_relations__mutmut_*",
    "seqaware.modules.teo_plan_head.x\u01c1TeoPlanHeadModule\u01c1_report_teo__mutmut_*",
    "seqaware.modules.teo_plan_head.x\u01c1TeoPlanHeadModule\u01c1_report_catbench__mutmut_*",
    "seqaware.modules.teo_closure_head.x_fold_scores__mutmut_*",
    "seqaware.modules.teo_closure_head.x_summarise__mutmut_*",
    "seqaware.modules.teo_closure_head.x_blend_probs__mutmut_*",
    "seqaware.modules.teo_closure_head.x\u01c1TeoClosureHeadModule\u01c1_configured_setting__mutmut_*",
    "seqaware.modules.teo_closure_head.x\u01c1TeoClosureHeadModule\u01c1setup__mutmut_*",
    "seqaware.modules.teo_closure_head.x\u01c1TeoClosureHeadModule\u01c1_cross_validate__mutmut_*",
    "seqaware.modules.teo_closure_head.x\u01c1TeoClosureHeadModule\u01c1on_test_epoch_end__mutmut_*",
)

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
    args = parser.parse_args(argv)
    scope = tuple(args.only) if args.only else SCOPE
    if args.command == "run":
        extra = ["--max-children", str(args.max_children)] if args.max_children else []
        names = list(scope)
        if (ROOT / "mutants").is_dir() and not args.rerun:
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
            code = subprocess.call([sys.executable, "-m", "mutmut", "run", *extra, *names], cwd=ROOT, env=env)
            if code:
                return code
    by_module = results(scope=scope)
    if not by_module:
        print(f"no mutants in {ROOT / 'mutants'} match {list(scope)}: run 'python scripts/mutation.py run' first",
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
