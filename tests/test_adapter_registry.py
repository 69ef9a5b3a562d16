"""The adapter registry: the message a user gets for a source that is not there."""
from __future__ import annotations

import pytest

from data_modules.adapters import run_adapter


@pytest.mark.parametrize("dataset, options", [("rfg", {}), ("wikihow", {"min_steps": 3}), ("roc", {"split": "train"})])
def test_run_adapter_missing_source_names_the_adapter_and_the_path(tmp_path, dataset, options):
    missing = tmp_path / "release" / "nowhere"
    with pytest.raises(FileNotFoundError) as excinfo:
        run_adapter(dataset, missing, tmp_path / "out" / "images", **options)
    assert str(excinfo.value) == f"{dataset}: no such file or folder: {missing}"
    assert not (tmp_path / "out").exists()
