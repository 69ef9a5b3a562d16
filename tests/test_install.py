"""The three packages import from the repo root and when pip-installed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMPORTS = "import seqaware.procedure, seqaware.dag, seqaware.metrics.ordering, decoders.pairwise, data_modules.datamodule"


@pytest.mark.slow  # a fresh interpreter importing torch + transformers: ~10-17 s
def test_imports_from_repo_root():
    res = subprocess.run([sys.executable, "-c", IMPORTS], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_imports_when_pip_installed(tmp_path):
    target = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
                          "--target", str(target), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    check = IMPORTS + "; import seqaware; assert seqaware.__file__.startswith(%r), seqaware.__file__" % str(target)
    res = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
