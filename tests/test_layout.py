"""The shape of the code (issue #54): no source file is over 600 lines; tests are not counted. The packages keep
their layers (issue #63): scripts -> data_modules -> seqaware -> decoders -> registry, no import upwards.

Under mutmut the check is deselected (``[tool.mutmut]`` in pyproject.toml): ``mutants/`` holds the mutated
copies of the files, which are much longer.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("seqaware", "decoders", "data_modules", "scripts", "hydra_plugins")
MAX_LINES = 600
LAYERS = ("scripts", "data_modules", "seqaware", "decoders", "registry")   # each imports only itself and later ones


def files_over(limit: int, root: Path = ROOT) -> list[str]:
    """``path: N lines`` of each Python file at the top of ``root`` or under :data:`SOURCE_DIRS` with more than
    ``limit`` lines, in path order."""
    files = sorted([*root.glob("*.py"), *(p for d in SOURCE_DIRS for p in (root / d).rglob("*.py"))])
    return [f"{path.relative_to(root).as_posix()}: {n} lines" for path in files
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > limit]


def test_no_source_file_is_over_600_lines():
    over = files_over(MAX_LINES)
    assert not over, f"over {MAX_LINES} lines (split them by concern): " + ", ".join(over)


def test_the_check_counts_every_source_file_and_no_test(tmp_path):
    for name, lines in (("train.py", 601), ("scripts/tool.py", 700), ("seqaware/modules/head.py", 600),
                        ("data_modules/synthetic/scenes.py", 650), ("tests/test_big.py", 900), ("docs/x.py", 900)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n" * lines, encoding="utf-8")
    assert files_over(MAX_LINES, tmp_path) == ["data_modules/synthetic/scenes.py: 650 lines",
                                               "scripts/tool.py: 700 lines", "train.py: 601 lines"]
    real = [line.split(":")[0] for line in files_over(0)]                 # the checkout's own files are read
    assert {"train.py", "data_modules/synthetic/scenes.py", "scripts/studies/paper_tables.py"} <= set(real)
    assert not any(name.startswith("tests/") for name in real)


def upward_imports(root: Path = ROOT) -> list[str]:
    """``path:line imports module`` for every import (at the top of a file or inside a function) from a package of
    :data:`LAYERS` to one before it."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    found = []
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                found += [f"{path.relative_to(root).as_posix()}:{node.lineno} imports {name}" for name in names
                          if rank.get(name.split(".")[0], len(LAYERS)) < rank[package]]
    return found


def test_no_package_imports_one_above_it():
    assert upward_imports() == []


def test_the_layer_check_finds_an_import_upwards_inside_a_function(tmp_path):
    for package in LAYERS:
        (tmp_path / package).mkdir()
    (tmp_path / "seqaware" / "ok.py").write_text("import decoders\nfrom registry import Registry\n", encoding="utf-8")
    (tmp_path / "decoders" / "bad.py").write_text("def f():\n    from seqaware.io import atomic_open\n", encoding="utf-8")
    (tmp_path / "registry" / "bad.py").write_text("import data_modules.views, os\n", encoding="utf-8")
    assert upward_imports(tmp_path) == ["decoders/bad.py:2 imports seqaware.io",
                                        "registry/bad.py:1 imports data_modules.views"]
