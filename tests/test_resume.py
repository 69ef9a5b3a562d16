"""Runs a researcher can trust: one folder per run, preemption, resume in place or from another folder."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from seqaware import runs
from seqaware.io import parse_test_metrics, read_test_metrics

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
TINY = ["experiment=order_baseline", "trainer.max_epochs=2", "data.batch_size=4", "model.net.dim=32",
        "data.collator.image_size=32"]  # 24 training procedures: 6 batches per epoch


def _short(compose_train, *extra):
    return compose_train(*TINY, *extra)


def _signal_at(step: int, marker: Path, signum: str = "SIGTERM") -> list[str]:
    return ["+callbacks.preempt_test._target_=preempt_helpers.SignalAtStep", f"+callbacks.preempt_test.step={step}",
            f"+callbacks.preempt_test.marker={marker}", f"+callbacks.preempt_test.signum={signum}"]


# ------------------------------------------------------------------------------------ run folders
def _hydra_run_dir(*overrides: str) -> str:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose(config_name="train.yaml", overrides=list(overrides), return_hydra_config=True)
            return str(cfg.hydra.run.dir)
    finally:
        GlobalHydra.instance().clear()


def test_two_runs_started_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    for var in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "RANK", "SLURM_PROCID", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(runs.time, "strftime", lambda fmt, *a: "2026-01-01_00-00-00")  # the same second
    first = _hydra_run_dir(f"paths.log_dir={tmp_path}")
    second = _hydra_run_dir(f"paths.log_dir={tmp_path}")
    assert first != second
    assert Path(first).is_dir() and Path(second).is_dir()  # reserved when named
    assert Path(first).parent == tmp_path / "train" / "runs"
    # a forced name clash: the folder made first is never handed out again
    tokens = iter(["aaaaaa", "aaaaaa", "bbbbbb"])
    monkeypatch.setattr(runs.secrets, "token_hex", lambda n: next(tokens))
    a, b = runs.new_run_dir(str(tmp_path / "p")), runs.new_run_dir(str(tmp_path / "p"))
    assert (Path(a).name, Path(b).name) == ("2026-01-01_00-00-00_aaaaaa", "2026-01-01_00-00-00_bbbbbb")


def test_run_name_and_job_ids_name_the_folder(tmp_path, monkeypatch):
    for var in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "RANK", "SLURM_PROCID", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert _hydra_run_dir(f"paths.log_dir={tmp_path}", "run_name=exp1") == str(tmp_path / "train" / "runs" / "exp1")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # every rank of the job and its requeue: one folder
    assert runs.new_run_dir(str(tmp_path)) == str(tmp_path / "slurm-4242")
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(RuntimeError, match="run_name"):
        runs.new_run_dir(str(tmp_path))


# -------------------------------------------------------------------------- in-place resume
def _csv_rows(path: Path) -> list[dict]:
    """The rows of a metrics.csv, without empty cells (the header grows when new keys are logged)."""
    with open(path, newline="") as fh:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(fh)]


@pytest.mark.slow  # two fits with W&B offline: about 15 s
def test_sigterm_then_same_command_resumes_keeps_csv_rows_and_wandb_run(compose_train, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    extra = ["logger=many_loggers", "+logger.wandb._target_=pytorch_lightning.loggers.WandbLogger",
             "+logger.wandb.project=seqaware", f"+logger.wandb.save_dir={tmp_path / 'run'}", "+logger.wandb.offline=true",
             *_signal_at(4, tmp_path / "signalled")]
    cfg = _short(compose_train, "test=false", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1", *extra)
    with pytest.raises(SystemExit) as stop:
        train.run(cfg)
    out = Path(cfg.paths.output_dir)
    assert stop.value.code == 128 + 15
    state = runs.read_state(out)
    assert state["status"] == "interrupted" and Path(state["checkpoint"]).name == "last.ckpt"
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4  # mid epoch 1
    rows_before = _csv_rows(out / "csv" / "metrics.csv")
    assert rows_before and "val/pmr" in rows_before[0]  # epoch 0's validation

    train.run(cfg)  # the same command again
    rows_after = _csv_rows(out / "csv" / "metrics.csv")
    assert rows_after[: len(rows_before)] == rows_before, "resuming deleted earlier metrics.csv rows"
    assert len(rows_after) > len(rows_before)
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    # offline-run-<YYYYmmdd_HHMMSS>-<run id>; W&B appends "-1" when both runs start in the same second
    wandb_runs = sorted(re.fullmatch(r"offline-run-\d{8}_\d{6}-([a-z0-9]+)(?:-\d+)?", p.name).group(1)
                        for p in (out / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2 and len(set(wandb_runs)) == 1, f"the resumed run opened a new W&B run: {wandb_runs}"
    assert runs.read_state(out)["status"] == "finished"


def test_finished_run_folder_is_refused_and_left_alone(compose_train, capsys):
    cfg = _short(compose_train, "trainer.max_epochs=1", "trainer.limit_train_batches=1", "trainer.limit_val_batches=1")
    train.run(cfg)
    out = Path(cfg.paths.output_dir)
    printed = parse_test_metrics(capsys.readouterr().out)
    assert read_test_metrics(out) == printed and "test/pmr" in printed
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    with pytest.raises(runs.RunFinishedError, match=rf"{out}.*finished run.*run_name="):
        train.run(cfg)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_test_metrics_are_printed_once(compose_train, capsys):
    cfg = _short(compose_train, "trainer.fast_dev_run=true")
    train.run(cfg)
    stdout = capsys.readouterr().out
    assert stdout.count("TEST_METRICS_JSON") == 1 and stdout.count("test/pmr:") == 1  # no second Lightning table
    assert json.loads((Path(cfg.paths.output_dir) / "test_metrics.json").read_text()) == parse_test_metrics(stdout)


def test_orphan_temporary_files_are_removed_at_start(compose_train):
    cfg = _short(compose_train, "trainer.fast_dev_run=true")
    out = Path(cfg.paths.output_dir)
    orphan = out / "checkpoints" / ".last.ckpt.k3j2x.tmp"  # what atomic_open leaves when killed mid-save
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"half a checkpoint")
    keep = out / "notes.tmp"  # not one of ours
    keep.write_text("x")
    train.run(cfg)
    assert not orphan.exists() and keep.exists()


# ------------------------------------------------------------------ resume from another folder
@pytest.mark.slow  # three short fits: about 13 s
def test_resume_from_another_folder_keeps_best_checkpoint_tracking(compose_train, tmp_path):
    """lr=0: every epoch scores the same, so the best checkpoint stays epoch 0's (ties do not replace it)."""
    frozen = ["model.optimizer.lr=0.0", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
              "trainer.limit_test_batches=1"]
    straight = _short(compose_train, *frozen, f"paths.output_dir={tmp_path / 'straight'}")
    train.run(straight)
    tested_straight = runs.read_state(tmp_path / "straight")["tested_checkpoint"]
    assert Path(tested_straight).name == "best_epoch_000.ckpt"

    first = _short(compose_train, *frozen, "trainer.max_epochs=1", f"paths.output_dir={tmp_path / 'a'}")
    train.run(first)
    resumed = _short(compose_train, *frozen, f"ckpt_path={tmp_path / 'a' / 'checkpoints' / 'last.ckpt'}",
                     f"paths.output_dir={tmp_path / 'b'}")
    train.run(resumed)
    tested = runs.read_state(tmp_path / "b")["tested_checkpoint"]
    assert tested == str(tmp_path / "b" / "checkpoints" / "best_epoch_000.ckpt"), tested
    assert read_test_metrics(tmp_path / "b") == read_test_metrics(tmp_path / "straight")
    assert (tmp_path / "a" / "checkpoints" / "best_epoch_000.ckpt").is_file()  # the source run is left as it was


# ----------------------------------------------------------- end to end, as a user runs it
@pytest.mark.slow  # two launches of train.py: about 30 s on an idle 2-core machine
def test_sigterm_mid_epoch_then_rerun_equals_uninterrupted_run(compose_train, tmp_path, cache_dir):
    from conftest import TINY_SYNTHETIC

    straight = _short(compose_train, f"paths.output_dir={tmp_path / 'straight'}")  # the uninterrupted run
    train.run(straight)
    straight_dir = tmp_path / "straight"

    base = [sys.executable, str(ROOT / "train.py"), *TINY, f"paths.cache_dir={cache_dir}",
            f"paths.log_dir={tmp_path / 'logs'}", "callbacks.progress_bar.refresh_rate=0", "run_name=interrupted",
            *[f"data.source.{k}={v}" for k, v in TINY_SYNTHETIC.items()],
            *_signal_at(3, tmp_path / "signalled")]  # after step 3 of 6: mid epoch 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.run(base, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert first.returncode == 128 + 15, first.stderr[-3000:]
    assert "re-run the same command" in first.stderr
    run_dir = tmp_path / "logs" / "order_baseline" / "runs" / "interrupted"
    assert not list(run_dir.rglob("*.tmp"))
    second = subprocess.run(base, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)  # same command
    assert second.returncode == 0, second.stderr[-3000:]

    assert parse_test_metrics(second.stdout) == read_test_metrics(run_dir) == read_test_metrics(straight_dir)
    tested = Path(runs.read_state(run_dir)["tested_checkpoint"])
    tested_straight = Path(runs.read_state(straight_dir)["tested_checkpoint"])
    assert tested.name == tested_straight.name and tested.parent == run_dir / "checkpoints"
    a, b = torch.load(tested, weights_only=True), torch.load(tested_straight, weights_only=True)
    for key, value in b["state_dict"].items():
        torch.testing.assert_close(a["state_dict"][key], value, rtol=0, atol=0, msg=key)
    assert _csv_rows(run_dir / "csv" / "metrics.csv") == _csv_rows(straight_dir / "csv" / "metrics.csv")
