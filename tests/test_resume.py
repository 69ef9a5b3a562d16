"""Runs a researcher can trust: one folder per run, preemption, resume in place or from another folder."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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


@pytest.mark.parametrize("name", ["exp/1", "../x", "..", ".hidden", "a..b", "/abs", "x y", "a\\b"])
def test_run_name_must_be_one_folder_name(tmp_path, name):
    with pytest.raises(Exception, match=r"run_name=.* is not a folder name.*no '/', no '\.\.'"):
        _hydra_run_dir(f"paths.log_dir={tmp_path}", f"run_name='{name}'")
    assert not (tmp_path / "train" / "runs").exists() or not any((tmp_path / "train" / "runs").iterdir())
    assert not (tmp_path / "train" / "x").exists() and not (tmp_path / "x").exists()


def test_run_name_may_hold_dots_dashes_and_equals(tmp_path):
    name = "lr=1e-4_seed-2.v1"
    assert _hydra_run_dir(f"paths.log_dir={tmp_path}", f"run_name='{name}'") == str(tmp_path / "train" / "runs" / name)


def _hold_lock(folder: Path) -> subprocess.Popen:
    """Another process that runs in ``folder`` (holds its lock) until killed."""
    code = (f"import sys, time; from seqaware.runs import RunLock; lock = RunLock({str(folder)!r}).__enter__(); "
            f"print('locked', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_process_in_the_same_run_folder_is_refused_and_a_killed_one_blocks_nothing(compose_train):
    cfg = _short(compose_train, "trainer.fast_dev_run=true")
    out = Path(cfg.paths.output_dir)
    other = _hold_lock(out)
    try:
        with pytest.raises(runs.RunLockedError, match=rf"{out} is in use by another process \(pid {other.pid} on "):
            train.run(cfg)
        assert not (out / runs.RUN_STATE_FILE).exists() and not (out / "checkpoints").exists()
    finally:
        other.kill()  # SIGKILL: no clean-up runs in that process
        other.wait()
    train.run(cfg)  # the kernel released the killed process's lock
    assert runs.read_state(out)["status"] == "finished"
    with runs.RunLock(out):  # released at the end of the run
        pass


def test_ctrl_c_leaves_the_run_interrupted_and_resumable(compose_train, tmp_path):
    """A real SIGINT mid-fit (Lightning turns the KeyboardInterrupt into sys.exit(1))."""
    import signal

    cfg = _short(compose_train, "test=false", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
                 *_signal_at(3, tmp_path / "signalled", "SIGINT"))  # epoch 1: epoch 0's last.ckpt exists
    # Python's own Ctrl-C handler, as in a terminal: a shell starts background jobs (nohup ... &) with SIGINT ignored
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit):
            train.run(cfg)
    finally:
        signal.signal(signal.SIGINT, before)  # Lightning leaves SIGINT ignored
    out = Path(cfg.paths.output_dir)
    state = runs.read_state(out)
    assert state["status"] == "interrupted" and state["signal"] == 2
    assert state["checkpoint"] == str(out / "checkpoints" / "last.ckpt")
    train.run(cfg)  # the same command resumes and finishes
    assert runs.read_state(out)["status"] == "finished" and "error" not in runs.read_state(out)


def test_an_exception_leaves_the_run_failed_with_the_error(compose_train):
    cfg = _short(compose_train, "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
                 "+callbacks.fail._target_=preempt_helpers.FailAtStep", "+callbacks.fail.step=1",
                 "+callbacks.fail.message=bad batch 7")
    with pytest.raises(RuntimeError, match="bad batch 7"):
        train.run(cfg)
    state = runs.read_state(cfg.paths.output_dir)
    assert state["status"] == "failed" and state["error"] == "RuntimeError: bad batch 7" and state["failed_rank"] == 0


def test_a_failing_ddp_rank_records_the_failure_unless_rank_0_did(tmp_path, monkeypatch):
    """Under DDP a rank that raises takes rank 0 down (Lightning's watchdog kills it), so the rank writes
    ``failed`` itself -- but never over what rank 0 recorded."""
    out = tmp_path / "run"
    out.mkdir()
    runs.write_state(out, status="running")
    monkeypatch.setenv("RANK", "1")
    train._record_stop(out, RuntimeError("CUDA out of memory"), rank_zero=False)
    state = runs.read_state(out)
    assert (state["status"], state["error"], state["failed_rank"]) == ("failed", "RuntimeError: CUDA out of memory", 1)
    monkeypatch.setenv("RANK", "0")
    train._record_stop(out, ValueError("rank 0's own error"), rank_zero=True)
    assert runs.read_state(out)["error"] == "ValueError: rank 0's own error"
    monkeypatch.setenv("RANK", "1")
    train._record_stop(out, RuntimeError("Connection closed by peer"), rank_zero=False)  # a consequence, not the cause
    assert runs.read_state(out)["error"] == "ValueError: rank 0's own error"
    train._record_stop(out, SystemExit(0), rank_zero=True)  # a clean exit is no failure
    assert runs.read_state(out)["status"] == "failed"


def test_a_bad_config_value_fails_the_run_naming_the_key(compose_train):
    """trainer.max_steps=abc: an error naming the key before anything is built (Lightning's own is a bare
    TypeError '<' not supported between 'str' and 'int'), recorded in run.json."""
    cfg = _short(compose_train, "trainer.max_steps=abc")
    with pytest.raises(ValueError, match=r"trainer\.max_steps='abc': Trainer\(max_steps=\.\.\.\) takes an integer"):
        train.run(cfg)
    assert runs.read_state(cfg.paths.output_dir)["status"] == "failed"
    with pytest.raises(ValueError, match=r"data\.batch_size='x'"):
        train.build(_short(compose_train, "data.batch_size=x"))


@pytest.mark.parametrize("override, message", [
    ("trainer.max_steps=null", "trainer.max_steps=null: Trainer(max_steps=...) takes an integer, not null"),
    ("data.batch_size=null", "data.batch_size=null: ProcedureDataModule(batch_size=...) takes an integer, not null"),
    ("data.view.max_steps=null", "data.view.max_steps=null: SequencingView(max_steps=...) takes an integer, not null"),
    ("data.collator.max_sentences=null",
     "data.collator.max_sentences=null: StepCollator(max_sentences=...) takes an integer, not null"),
])
def test_a_null_that_would_break_a_comparison_stops_the_build_naming_the_key(compose_train, override, message):
    """null where the argument takes a number: one error naming the key while the run is built, not a
    TypeError ('<' not supported between 'NoneType' and 'int') at the first batch."""
    from hydra.errors import InstantiationException

    with pytest.raises((ValueError, InstantiationException)) as err:   # Hydra wraps what a constructor raises
        train.build(_short(compose_train, override))
    assert str(err.value).endswith(message) or f"ValueError('{message}')" in str(err.value), str(err.value)


# ------------------------------------------------------------------------------ latest:TASK/FILE
def _finished_run(root: Path, name: str, finished_at: str, status: str = "finished", file: str = "encoder.pt") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / file).write_text(name)
    runs.write_state(folder, status=status, finished_at=finished_at)
    return folder


def test_latest_orders_runs_by_their_recorded_finish_then_by_the_state_files_age(tmp_path):
    """The run that finished last wins even when its folder was copied or touched earlier (a file's
    time is only the tie-break, for runs that record the same finish); a state file that cannot be
    read is skipped without hiding the runs after it."""
    task = tmp_path / "t"
    late = _finished_run(task / "runs", "a_finished_late", "2026-11-21T10:00:00+0000")
    early = _finished_run(task / "runs", "b_finished_early", "2026-11-20T10:00:00+0000")
    twin = _finished_run(task / "runs", "c_same_finish", "2026-11-20T10:00:00+0000")
    broken = task / "runs" / "0_broken"
    broken.mkdir()
    (broken / runs.RUN_STATE_FILE).write_text("{not json")
    for folder, mtime in ((late, 1_000), (early, 3_000), (twin, 2_000)):
        os.utime(folder / runs.RUN_STATE_FILE, (mtime, mtime))
    assert runs.finished_runs(tmp_path, "t") == [late, early, twin]
    os.utime(twin / runs.RUN_STATE_FILE, (4_000, 4_000))
    assert runs.finished_runs(tmp_path, "t") == [late, twin, early]
    legacy = _finished_run(task / "runs", "d_no_finish_recorded", "")
    state = json.loads((legacy / runs.RUN_STATE_FILE).read_text())
    del state["finished_at"]
    (legacy / runs.RUN_STATE_FILE).write_text(json.dumps(state))
    assert runs.finished_runs(tmp_path, "t")[-1] == legacy   # no recorded finish: older than any that has one


def test_latest_names_the_newest_finished_run_of_a_task(tmp_path):
    task = tmp_path / "clipvil_pretrain"
    _finished_run(task / "runs", "old", "2026-11-20T10:00:00+0000")
    new = _finished_run(task / "multiruns" / "2026-11-21_00-00-00", "0", "2026-11-21T10:00:00+0000")  # a sweep job
    _finished_run(task / "runs", "newer_but_running", "", status="running")
    _finished_run(task / "runs", "newest_but_failed", "2026-11-22T10:00:00+0000", status="failed")
    assert runs.resolve_latest("latest:clipvil_pretrain/encoder.pt", tmp_path) == str(new / "encoder.pt")
    with pytest.raises(FileNotFoundError, match=r"latest:clipvil_pretrain/other\.pt: no finished run of task "
                                                r"'clipvil_pretrain' under " + re.escape(str(task)) + r" holds other\.pt \(2 finished"):
        runs.resolve_latest("latest:clipvil_pretrain/other.pt", tmp_path)
    with pytest.raises(FileNotFoundError, match="no finished run of task 'nothing'"):
        runs.resolve_latest("latest:nothing/encoder.pt", tmp_path)
    with pytest.raises(ValueError, match="expected latest:TASK/FILE"):
        runs.resolve_latest("latest:clipvil_pretrain", tmp_path)

    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"model": {"encoder": {"ckpt": "latest:clipvil_pretrain/encoder.pt", "name": "clipvil"}},
                            "other": ["latest:clipvil_pretrain/encoder.pt"]})
    OmegaConf.set_struct(cfg, True)
    assert runs.resolve_latest_values(cfg, tmp_path) == {"model.encoder.ckpt": str(new / "encoder.pt"),
                                                         "other.0": str(new / "encoder.pt")}
    assert cfg.model.encoder.ckpt == str(new / "encoder.pt") and cfg.other[0] == str(new / "encoder.pt")


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


@pytest.mark.slow  # three short fits: about 15 s
def test_resume_from_a_checkpoint_written_at_an_epochs_end_trains_the_next_epoch_whole(compose_train, tmp_path):
    """With validations inside the epoch (``val_check_interval`` 0.5, as the token-budget presets have), last.ckpt is
    written by the validation after an epoch's last batch, before Lightning closes the epoch, so it counts that
    epoch's batches as done; the resumed fit must train the next epoch from its first batch (it once skipped as
    many batches of it, so a run cut after an epoch-end validation trained nothing more) and end where the
    uninterrupted run ends, with the same weights."""
    half = "trainer.val_check_interval=0.5"
    straight = _short(compose_train, half, f"paths.output_dir={tmp_path / 'straight'}")     # 2 epochs of 6 batches
    train.run(straight)
    first = _short(compose_train, half, "trainer.max_epochs=1", f"paths.output_dir={tmp_path / 'a'}")
    train.run(first)
    resumed = _short(compose_train, half, f"ckpt_path={tmp_path / 'a' / 'checkpoints' / 'last.ckpt'}",
                     f"paths.output_dir={tmp_path / 'b'}")
    train.run(resumed)
    a = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 12
    for key, value in b["state_dict"].items():
        torch.testing.assert_close(a["state_dict"][key], value, rtol=0, atol=0, msg=key)


@pytest.mark.slow  # two short fits: about 10 s
def test_a_new_folder_from_a_moved_runs_last_checkpoint_tests_that_runs_best(compose_train, tmp_path):
    """ckpt_path=<a run folder moved or copied from another machine>/checkpoints/last.ckpt, a new run folder: its
    state names the best checkpoint where the run left it (gone); the one beside ckpt_path is copied in and tested
    (lr=0: epoch 1 ties and does not replace it), not the current weights."""
    import shutil

    frozen = ["model.optimizer.lr=0.0", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
              "trainer.limit_test_batches=1"]
    train.run(_short(compose_train, *frozen, "trainer.max_epochs=1", f"paths.output_dir={tmp_path / 'a'}"))
    shutil.move(tmp_path / "a", tmp_path / "copied")
    train.run(_short(compose_train, *frozen, f"ckpt_path={tmp_path / 'copied' / 'checkpoints' / 'last.ckpt'}",
                     f"paths.output_dir={tmp_path / 'b'}"))
    state = runs.read_state(tmp_path / "b")
    assert state["status"] == "finished"
    assert state["tested_checkpoint"] == str(tmp_path / "b" / "checkpoints" / "best_epoch_000.ckpt")
    assert read_test_metrics(tmp_path / "b") == read_test_metrics(tmp_path / "copied")


def test_a_new_folder_from_another_runs_checkpoint_tests_that_runs_best_and_says_so(compose_train, tmp_path, caplog):
    """ckpt_path= into a new run folder, without training (train=false, ckpt_path=<run>/last.ckpt) and with it
    (ckpt_path=<run>/<its best checkpoint>): both test the best checkpoint, and the log names it."""
    import logging

    frozen = ["model.optimizer.lr=0.0", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
              "trainer.limit_test_batches=1", "trainer.max_epochs=1"]
    train.run(_short(compose_train, *frozen, f"paths.output_dir={tmp_path / 'a'}"))
    source = tmp_path / "a" / "checkpoints"
    best = source / "best_epoch_000.ckpt"
    caplog.set_level(logging.INFO, logger="seqaware.train")
    caplog.clear()   # the first run's own "testing ..." is captured too once seqaware.train logs INFO (after test_launch)
    train.run(_short(compose_train, *frozen, "train=false", f"ckpt_path={source / 'last.ckpt'}",
                     f"paths.output_dir={tmp_path / 'c'}"))
    assert runs.read_state(tmp_path / "c")["tested_checkpoint"] == str(best)
    assert read_test_metrics(tmp_path / "c") == read_test_metrics(tmp_path / "a")
    [said] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("testing ")]
    assert said.startswith(f"testing the best checkpoint {best} (val/pmr ") and said.endswith(
        f") that the run of ckpt_path={source / 'last.ckpt'} tracked, not ckpt_path itself (to test its own weights, "
        "pass a copy under another name than last.ckpt)")
    caplog.clear()                                                   # ... and that is how: exactly the file given
    own = source / "last_weights.ckpt"
    own.write_bytes((source / "last.ckpt").read_bytes())
    train.run(_short(compose_train, *frozen, "train=false", f"ckpt_path={own}", f"paths.output_dir={tmp_path / 'd'}"))
    assert runs.read_state(tmp_path / "d")["tested_checkpoint"] == str(own)
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("testing ")] == [
        f"testing ckpt_path={own} as given (only a file named last.ckpt stands for the best checkpoint its run tracked; "
        "this one's run tracked best_epoch_000.ckpt, val/pmr " + said.split("(val/pmr ")[1].split(")")[0] + ")"]
    caplog.clear()
    train.run(_short(compose_train, *frozen, "trainer.max_epochs=2", f"ckpt_path={best}",
                     f"paths.output_dir={tmp_path / 'b'}"))
    assert runs.read_state(tmp_path / "b")["tested_checkpoint"] == str(tmp_path / "b" / "checkpoints" / "best_epoch_000.ckpt")
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("testing ")] == [
        f"testing the best checkpoint {tmp_path / 'b' / 'checkpoints' / 'best_epoch_000.ckpt'}"]


def test_a_test_only_run_without_a_checkpoint_says_it_tests_the_built_weights(caplog):
    from omegaconf import OmegaConf

    trainer = SimpleNamespace(checkpoint_callbacks=[])
    with caplog.at_level("WARNING", logger="seqaware.train"):
        assert train._checkpoint_to_test(OmegaConf.create({"train": False, "ckpt_path": None}), trainer) is None
    assert caplog.messages == [
        "train=false without ckpt_path: testing the current weights, those the model was built with (its "
        "initialisation and any checkpoint its config loads, e.g. model.encoder.ckpt); give "
        "ckpt_path=RUN/checkpoints/best_....ckpt to test a trained run"]


def test_resume_in_a_moved_run_folder_keeps_the_best_checkpoint(compose_train, tmp_path):
    """A run interrupted in folder a, then moved to b and re-run there: the best checkpoint (epoch 0's:
    lr=0 makes every epoch tie, and ties do not replace it) is still the one tested, from b."""
    import shutil

    frozen = ["model.optimizer.lr=0.0", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
              "trainer.limit_test_batches=1"]
    first = _short(compose_train, *frozen, f"paths.output_dir={tmp_path / 'a'}", *_signal_at(3, tmp_path / "signalled"))
    with pytest.raises(SystemExit):
        train.run(first)  # stopped in epoch 1, after epoch 0's validation
    assert (tmp_path / "a" / "checkpoints" / "best_epoch_000.ckpt").is_file()
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = _short(compose_train, *frozen, f"paths.output_dir={tmp_path / 'b'}", *_signal_at(3, tmp_path / "signalled"))
    train.run(moved)
    state = runs.read_state(tmp_path / "b")
    assert state["status"] == "finished"
    assert state["tested_checkpoint"] == str(tmp_path / "b" / "checkpoints" / "best_epoch_000.ckpt")
    assert not (tmp_path / "b" / "checkpoints" / "best_epoch_001.ckpt").exists()


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
