"""scripts/studies/pretrain_convergence.py: reading a run's logs into the convergence table (no training here)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("pretrain_convergence", ROOT / "scripts" / "studies" / "pretrain_convergence.py")
conv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conv)


def test_validation_rows_and_test_metrics_are_read_from_the_logs(tmp_path):
    log = tmp_path / "metrics.csv"
    log.write_text("epoch,step,train/loss,val/isp_acc,val/smrm_acc,val/smrm_num_candidates\n"
                   "0,9,5.0,,,\n0,49,,0.5,0.02,80\n0,59,4.0,,,\n1,99,,0.75,0.1,90\n")
    rows = conv.read_validations(log)
    assert [r["step"] for r in rows] == [49, 99]
    assert rows[-1] == {"val/isp_acc": 0.75, "val/smrm_acc": 0.1, "val/smrm_num_candidates": 90.0, "step": 99.0}
    out = "noise\nTEST_METRICS_JSON {\"test/isp_acc\": 0.8}\nmore noise\n"
    assert conv.test_metrics(out) == {"test/isp_acc": 0.8}
    assert conv.test_metrics("no metrics here") == {}
    with pytest.raises(SystemExit, match="no CSV log"):
        conv.read_validations(tmp_path / "missing.csv")


def test_objective_step_counts_follow_the_turn_taking_schedule():
    counts = conv.objective_steps("mlm_isp_smrm", 300, seed=42)
    assert counts["mlm"] == 300 and counts["isp"] + counts["smrm"] == 300
    assert 100 < counts["isp"] < 200
    assert conv.objective_steps("isp_pisp", 10, seed=0).keys() <= {"isp", "pisp"}
    # the run's model.objectives.always: SMRM at every step, ISP / PISP take turns
    counts = conv.objective_steps("all", 300, seed=42, always=["mlm", "smrm"])
    assert counts["mlm"] == counts["smrm"] == 300 and counts["isp"] + counts["pisp"] == 300


def test_run_specs_and_table():
    assert conv.parse_run("clipvil_pretrain:mlm_isp") == ("clipvil_pretrain", "mlm_isp")
    with pytest.raises(SystemExit, match="EXPERIMENT:OBJECTIVES"):
        conv.parse_run("clipvil_pretrain")
    row = {"experiment": "e", "objectives": "mlm_smrm", "objective": "smrm", "val_acc": 0.1, "test_acc": None,
           "chance": 1 / 90, "steps": 300, "batch_size": 16, "objective_steps": 140, "val_curve": [0.02, 0.1],
           "wall_s": 61.2}
    table = conv.markdown([row])
    assert table.splitlines()[2] == "| e | mlm_smrm | SMRM | 0.100 | - | 0.011 | 300 x 16 (140) | 0.02 0.10 | 61 s |"


def test_batch_size_comes_from_the_runs_saved_config(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("data:\n  batch_size: 16\nmodel:\n  objectives:\n    always: [mlm, smrm]\n")
    assert conv.run_batch_size(tmp_path) == 16
    assert conv.run_always(tmp_path) == ["mlm", "smrm"]
    with pytest.raises(SystemExit, match="no saved Hydra config"):
        conv.run_batch_size(tmp_path / "elsewhere")
