"""Run folders (seqaware.runs) and the DDP job helpers of seqaware.launch, called directly on small inputs.

What a user relies on: the folder a run gets, the lock that keeps two processes out of one folder, the state
file ``run.json``, which checkpoint a re-run resumes from, ``latest:TASK/FILE``, and the metrics rows a resumed
run keeps.  No training here: see test_resume.py for the end-to-end runs."""
from __future__ import annotations

import csv
import json
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from seqaware import checkpoint_io, launch, run_reuse, runs  # noqa: F401  (rehome reads checkpoints through it)

JOB_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "TORCHELASTIC_RUN_ID", "RANK",
            "SLURM_PROCID", "LOCAL_RANK")


@pytest.fixture
def no_job(monkeypatch):
    """A process started on its own: no launcher variables, a plain command line."""
    for var in JOB_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    return monkeypatch


# ------------------------------------------------------------------------------ best checkpoint
def test_best_checkpoint_is_the_first_monitoring_callbacks_written_best(tmp_path):
    best = tmp_path / "best.ckpt"
    best.write_bytes(b"x")
    other = tmp_path / "other.ckpt"
    other.write_bytes(b"x")
    unmonitored = SimpleNamespace(monitor=None, best_model_path=str(other))
    not_written = SimpleNamespace(monitor="val/acc", best_model_path=str(tmp_path / "gone.ckpt"))
    none_yet = SimpleNamespace(monitor="val/acc", best_model_path="")
    no_best_kept = SimpleNamespace(monitor="val/acc")   # a Checkpoint callback that tracks no best file
    monitoring = SimpleNamespace(monitor="val/loss", best_model_path=str(best))
    second = SimpleNamespace(monitor="val/acc", best_model_path=str(other))
    trainer = SimpleNamespace(checkpoint_callbacks=[unmonitored, not_written, none_yet, no_best_kept, monitoring, second])
    assert runs.best_checkpoint(trainer) == str(best)
    assert runs.best_checkpoint(SimpleNamespace(checkpoint_callbacks=[unmonitored, not_written, none_yet])) is None
    assert runs.best_checkpoint(SimpleNamespace(checkpoint_callbacks=[SimpleNamespace()])) is None


# ------------------------------------------------------------------------------ folder names
@pytest.mark.parametrize("name", ["exp1", "lr=1e-4_seed-2.v1", "a+b,c@d", "9", "A.b"])
def test_a_run_name_of_one_folder_component_is_kept(name):
    assert runs.check_run_name(name) == name


def test_a_run_name_is_used_as_text():
    assert runs.check_run_name(42) == "42"


@pytest.mark.parametrize("name", ["exp/1", "..", "a..b", ".hidden", "-x", "_x", "x.", "x y", "", "é"])
def test_a_run_name_that_is_not_one_folder_name_is_refused_with_the_rule(name):
    with pytest.raises(ValueError) as err:
        runs.check_run_name(name)
    assert str(err.value) == (
        f"run_name={name!r} is not a folder name: use letters, digits and . _ - = + , @, starting with a letter or "
        f"digit (no '/', no '..'). The run folder is <paths.log_dir>/<task_name>/runs/<run_name>; to write somewhere "
        f"else set hydra.run.dir=PATH")


@pytest.mark.parametrize("env, rank", [
    ({}, 0),
    ({"RANK": "3", "SLURM_PROCID": "2", "LOCAL_RANK": "1"}, 3),
    ({"SLURM_PROCID": "2", "LOCAL_RANK": "1"}, 2),
    ({"LOCAL_RANK": "1"}, 1),
    ({"RANK": "", "SLURM_PROCID": "5"}, 5),          # set but empty: the next launcher variable
    ({"RANK": "abc", "LOCAL_RANK": "4"}, 4),         # not a number: the next one
    ({"RANK": "abc"}, 0),
])
def test_process_rank_reads_the_launchers_variables_in_order(no_job, env, rank):
    for var, value in env.items():
        no_job.setenv(var, value)
    assert runs.process_rank() == rank


@pytest.mark.parametrize("env, job", [
    ({}, None),
    ({"SLURM_JOB_ID": "4242"}, "slurm-4242"),
    ({"SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4200", "SLURM_ARRAY_TASK_ID": "7"}, "slurm-4200_7"),
    ({"SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4200"}, "slurm-4243"),
    ({"SLURM_JOB_ID": "4243", "SLURM_ARRAY_TASK_ID": "7"}, "slurm-4243"),
    ({"SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "abc"}, "slurm-4242"),
    ({"SLURM_JOB_ID": "", "TORCHELASTIC_RUN_ID": "abc"}, "torchrun-abc"),
    ({"TORCHELASTIC_RUN_ID": "none"}, None),          # torchrun without --rdzv-id
    ({"TORCHELASTIC_RUN_ID": ""}, None),
])
def test_the_job_id_every_rank_shares(no_job, env, job):
    for var, value in env.items():
        no_job.setenv(var, value)
    assert runs.distributed_job_id() == job


@pytest.mark.parametrize("run_name", [None, "", "null", "None"])
def test_a_fresh_run_gets_a_new_timestamped_folder_reserved_at_once(no_job, tmp_path, run_name):
    parent = tmp_path / "logs" / "train" / "runs"   # made when missing
    folder = Path(runs.new_run_dir(str(parent), run_name))
    assert folder.parent == parent and folder.is_dir() and not any(folder.iterdir())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_[0-9a-f]{6}", folder.name), folder.name
    second = Path(runs.new_run_dir(str(parent), run_name))   # the parent exists now: another folder beside it
    assert second.parent == parent and second.is_dir() and second != folder


def test_a_name_clash_draws_another_suffix(no_job, tmp_path):
    no_job.setattr(runs.time, "strftime", lambda fmt, *a: "2026-01-01_00-00-00")   # the same second
    tokens = iter(["aaaaaa", "aaaaaa", "bbbbbb"])
    no_job.setattr(runs.secrets, "token_hex", lambda n: next(tokens))
    first, second = runs.new_run_dir(str(tmp_path)), runs.new_run_dir(str(tmp_path))
    assert (first, second) == (str(tmp_path / "2026-01-01_00-00-00_aaaaaa"), str(tmp_path / "2026-01-01_00-00-00_bbbbbb"))


def test_a_named_run_or_a_job_names_the_folder_without_making_it(no_job, tmp_path):
    assert runs.new_run_dir(str(tmp_path), "exp1") == str(tmp_path / "exp1")
    with pytest.raises(ValueError, match="run_name='a/b' is not a folder name"):
        runs.new_run_dir(str(tmp_path), "a/b")
    no_job.setenv("RANK", "1")  # a named run needs no job id, whatever the rank
    assert runs.new_run_dir(str(tmp_path), "exp1") == str(tmp_path / "exp1")
    no_job.setenv("TORCHELASTIC_RUN_ID", "r7")
    assert runs.new_run_dir(str(tmp_path)) == str(tmp_path / "torchrun-r7")
    assert list(tmp_path.iterdir()) == []


def test_a_lone_nonzero_rank_is_told_to_name_the_run(no_job, tmp_path):
    no_job.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError) as err:
        runs.new_run_dir(str(tmp_path / "p"))
    assert str(err.value) == (
        "this process is a non-zero rank started without a shared job id (SLURM_JOB_ID or torchrun --rdzv-id): set "
        "run_name=NAME (or hydra.run.dir=PATH) so every rank uses one folder")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("argv, printing", [
    (["--cfg", "job"], True), (["-c", "job"], True), (["--cfg=job"], True), (["--help"], True), (["-h"], True),
    (["--hydra-help"], True), (["--info"], True), (["-i"], True), (["seed=1", "--info", "all"], True),
    (["seed=1"], False), ([], False), (["--cfgx"], False), (["run_name=--cfg"], False),
])
def test_printing_the_config_or_help_reserves_no_folder(no_job, tmp_path, argv, printing):
    # argv[0] is the script, never a flag (a script path that looks like one must not count)
    no_job.setattr(sys, "argv", ["--cfg" if not printing else "train.py", *argv])
    folder = Path(runs.new_run_dir(str(tmp_path / "runs")))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_[0-9a-f]{6}", folder.name)
    assert folder.is_dir() is not printing
    assert (tmp_path / "runs").exists() is not printing


# ------------------------------------------------------------------------------ lock
def test_the_run_lock_keeps_a_second_holder_out_until_released(tmp_path):
    folder = tmp_path / "logs" / "run"   # made when missing
    with runs.RunLock(folder) as lock:
        assert lock.path == folder / "run.lock"
        text = (folder / "run.lock").read_text()
        assert re.fullmatch(rf"pid {os.getpid()} on {re.escape(socket.gethostname())} since "
                            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}\n", text), text
        with pytest.raises(runs.RunLockedError) as err:
            runs.RunLock(folder).__enter__()
        assert str(err.value) == (
            f"{folder} is in use by another process ({text.strip()}): two runs never share a folder. Wait for it to "
            f"end, or start this run in another folder (another run_name, or none for a fresh one)")
    assert (folder / "run.lock").exists()   # never deleted
    with runs.RunLock(folder):               # released: the next run gets it
        pass


def test_a_lock_file_left_by_an_older_holder_is_overwritten(tmp_path):
    (tmp_path / "run.lock").write_text("pid 1 on elsewhere since long ago, with a much longer line than ours\n")
    with runs.RunLock(tmp_path):
        assert (tmp_path / "run.lock").read_text().startswith(f"pid {os.getpid()} on ")
        assert "elsewhere" not in (tmp_path / "run.lock").read_text()


@pytest.mark.parametrize("content, holder", [(b"", "?"), (b"  \n", "?"), (b"pid 9 \xff\xfe on h\n", "pid 9 \ufffd\ufffd on h")])
def test_a_locked_folder_names_its_holder_as_well_as_it_can(tmp_path, content, holder):
    import fcntl

    (tmp_path / "run.lock").write_bytes(content)
    fd = os.open(tmp_path / "run.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(runs.RunLockedError, match=re.escape(f"{tmp_path} is in use by another process ({holder}): ")):
            with runs.RunLock(tmp_path):
                pass
    finally:
        os.close(fd)


def test_the_lock_file_is_a_plain_file_others_may_read(tmp_path):
    umask = os.umask(0o022)
    try:
        with runs.RunLock(tmp_path):
            assert (tmp_path / "run.lock").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(umask)


def test_leaving_the_lock_twice_is_harmless(tmp_path):
    lock = runs.RunLock(tmp_path)
    lock.__enter__()
    lock.__exit__(None, None, None)
    lock.__exit__(None, None, None)
    with runs.RunLock(tmp_path):
        pass


# ------------------------------------------------------------------------------ run state
def test_run_state_merges_updates_drops_keys_and_stamps_the_time(tmp_path):
    assert runs.read_state(tmp_path) == {}
    first = runs.write_state(tmp_path, status="running", wandb_id="abc", resumed_from="x.ckpt")
    assert first["status"] == "running" and first["wandb_id"] == "abc"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", first["updated_at"])
    second = runs.write_state(tmp_path, drop=("resumed_from", "not_there"), status="finished", finished_at="t1")
    assert second == runs.read_state(tmp_path)
    assert {k: v for k, v in second.items() if k != "updated_at"} == {"status": "finished", "wandb_id": "abc",
                                                                    "finished_at": "t1"}
    text = (tmp_path / "run.json").read_text()
    assert text == json.dumps(second, indent=1, sort_keys=True)
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]   # written atomically: no temporary left


def test_a_broken_state_file_names_itself(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(ValueError) as err:
        runs.read_state(tmp_path)
    assert re.fullmatch(re.escape(f"{tmp_path / 'run.json'} is not valid JSON (") + r".+"
                        + re.escape("); delete it to resume this run folder"), str(err.value))


def test_a_folder_named_run_json_is_no_state(tmp_path):
    (tmp_path / "run.json").mkdir()
    assert runs.read_state(tmp_path) == {}


def test_orphan_temporaries_of_an_interrupted_save_are_removed(tmp_path, caplog):
    (tmp_path / "checkpoints").mkdir()
    orphans = [tmp_path / ".run.json.abc.tmp", tmp_path / "checkpoints" / ".last.ckpt.x1.tmp"]
    keep = [tmp_path / "notes.tmp", tmp_path / ".hidden", tmp_path / "checkpoints" / "last.ckpt"]
    for path in orphans + keep:
        path.write_text("x")
    (tmp_path / ".dir.tmp").mkdir()
    with caplog.at_level(logging.INFO, logger="seqaware.runs"):
        removed = runs.clean_orphans(tmp_path)
    assert sorted(removed) == sorted(orphans)
    assert not any(p.exists() for p in orphans) and all(p.exists() for p in keep) and (tmp_path / ".dir.tmp").is_dir()
    assert caplog.messages == [f"removed 2 temporary file(s) of an interrupted save: {[str(p) for p in removed]}"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqaware.runs"):
        assert runs.clean_orphans(tmp_path) == []
        assert runs.clean_orphans(tmp_path / "missing") == []
    assert "removed" not in caplog.text


def test_a_finished_run_is_refused_with_what_to_do(tmp_path):
    assert runs.check_not_finished(tmp_path) == {}
    runs.write_state(tmp_path, status="interrupted")
    assert runs.check_not_finished(tmp_path)["status"] == "interrupted"
    runs.write_state(tmp_path, status="finished", finished_at="2026-11-21T10:00:00+0000")
    before = (tmp_path / "run.json").read_text()
    with pytest.raises(runs.RunFinishedError) as err:
        runs.check_not_finished(str(tmp_path))
    assert str(err.value) == (
        f"{tmp_path} holds a finished run (finished 2026-11-21T10:00:00+0000; test metrics in "
        f"{tmp_path / 'test_metrics.json'}). Nothing was changed. Start a new run in a new folder: leave out "
        f"hydra.run.dir / run_name, or set run_name=OTHER_NAME; to continue training it, use "
        f"ckpt_path={tmp_path / 'checkpoints' / 'last.ckpt'} with a new run folder and a larger trainer.max_epochs.")
    assert (tmp_path / "run.json").read_text() == before
    runs.write_state(tmp_path, drop=("finished_at",))
    with pytest.raises(runs.RunFinishedError, match=r"holds a finished run \(finished \?; "):
        runs.check_not_finished(tmp_path)


# ------------------------------------------------------------------------------ prepare
def _last(run_dir: Path) -> Path:
    last = run_dir / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True, exist_ok=True)
    last.write_bytes(b"ckpt")
    return last


def test_prepare_starts_from_ckpt_path_in_a_fresh_folder(no_job, tmp_path):
    plan = runs.prepare(str(tmp_path), "other/last.ckpt")
    assert plan == runs.RunPlan(run_dir=tmp_path, ckpt_path="other/last.ckpt", resumed_in_place=False, state={},
                                csv_rows=[])
    assert runs.prepare(tmp_path, None) == runs.RunPlan(run_dir=tmp_path)


def test_prepare_resumes_the_folders_own_last_checkpoint_first(no_job, tmp_path, caplog):
    last = _last(tmp_path)
    runs.write_state(tmp_path, status="interrupted")
    with caplog.at_level(logging.INFO, logger="seqaware.runs"):
        plan = runs.prepare(tmp_path, str(tmp_path / "elsewhere.ckpt"))
    assert (plan.ckpt_path, plan.resumed_in_place, plan.state["status"]) == (str(last), True, "interrupted")
    assert caplog.messages == [
        f"the run folder has its own {last}: resuming from it (ckpt_path={tmp_path / 'elsewhere.ckpt'} was the start "
        f"of this run)", f"resuming run {tmp_path} from {last}"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqaware.runs"):
        plan = runs.prepare(tmp_path, str(last))   # the same file: nothing to explain
    assert (plan.ckpt_path, plan.resumed_in_place) == (str(last), True)
    assert caplog.messages == [f"resuming run {tmp_path} from {last}"]
    assert runs.prepare(tmp_path, None).ckpt_path == str(last)


def test_prepare_for_testing_only_keeps_ckpt_path(no_job, tmp_path):
    _last(tmp_path)
    plan = runs.prepare(tmp_path, "given.ckpt", train=False)
    assert (plan.ckpt_path, plan.resumed_in_place) == ("given.ckpt", False)


def test_prepare_refuses_a_finished_run_and_only_rank_0_cleans(no_job, tmp_path):
    orphan = tmp_path / ".last.ckpt.x.tmp"
    orphan.write_text("x")
    no_job.setenv("RANK", "1")
    runs.prepare(tmp_path, None)
    assert orphan.exists()
    no_job.setenv("RANK", "0")
    runs.prepare(tmp_path, None)
    assert not orphan.exists()
    runs.write_state(tmp_path, status="finished")
    _last(tmp_path)
    with pytest.raises(runs.RunFinishedError):
        runs.prepare(tmp_path, None)


# ------------------------------------------------------------------------------ rehome
KEY = "ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max'}"


def _tracked_run(folder: Path, missing: tuple[str, ...] = (), save_last: bool = True) -> tuple[Path, dict]:
    """A run folder whose last.ckpt holds a ModelCheckpoint state tracking best/kth/top-k checkpoints."""
    ck = folder / "checkpoints"
    ck.mkdir(parents=True)
    names = ("best_epoch_002.ckpt", "best_epoch_001.ckpt", "best_epoch_000.ckpt")
    for name in names:
        if name not in missing:
            (ck / name).write_bytes(name.encode())
    state = {"dirpath": str(ck), "monitor": "val/acc", "best_model_score": torch.tensor(0.9),
             "best_model_path": str(ck / names[0]), "kth_best_model_path": str(ck / names[2]),
             "last_model_path": str(ck / "last.ckpt") if save_last else "", "kth_value": torch.tensor(0.5),
             "best_k_models": {str(ck / n): torch.tensor(v) for n, v in zip(names, (0.9, 0.7, 0.5))}}
    torch.save({"global_step": 12, "callbacks": {KEY: state, "EarlyStopping{}": {"wait_count": 1}}}, ck / "last.ckpt")
    return ck / "last.ckpt", state


def test_resuming_another_runs_checkpoint_copies_what_it_tracked(tmp_path, caplog):
    source, old = _tracked_run(tmp_path / "a")
    new_ck = tmp_path / "b" / "checkpoints"
    other_callback = SimpleNamespace(state_key="EarlyStopping{}", dirpath=None)
    with caplog.at_level(logging.INFO, logger="seqaware.runs"):
        resumed = runs.rehome_checkpoint(str(source), [other_callback, SimpleNamespace(state_key=KEY, dirpath=str(new_ck))],
                                         tmp_path / "b")
    assert resumed == str(new_ck / "last.ckpt")
    assert sorted(p.name for p in new_ck.iterdir()) == ["best_epoch_000.ckpt", "best_epoch_001.ckpt",
                                                        "best_epoch_002.ckpt", "last.ckpt"]
    for name in ("best_epoch_000.ckpt", "best_epoch_001.ckpt", "best_epoch_002.ckpt"):
        assert (new_ck / name).read_bytes() == name.encode()
        assert (tmp_path / "a" / "checkpoints" / name).is_file()   # the source run is left as it was
    ckpt = torch.load(new_ck / "last.ckpt", weights_only=True)
    state = ckpt["callbacks"][KEY]
    assert state["dirpath"] == str(new_ck)
    assert state["best_model_path"] == str(new_ck / "best_epoch_002.ckpt")
    assert state["kth_best_model_path"] == str(new_ck / "best_epoch_000.ckpt")
    assert state["last_model_path"] == str(new_ck / "last.ckpt")
    assert {k: float(v) for k, v in state["best_k_models"].items()} == pytest.approx(
        {str(new_ck / "best_epoch_002.ckpt"): 0.9, str(new_ck / "best_epoch_001.ckpt"): 0.7,
         str(new_ck / "best_epoch_000.ckpt"): 0.5})
    assert float(state["best_model_score"]) == pytest.approx(0.9) and state["monitor"] == "val/acc"
    assert ckpt["callbacks"]["EarlyStopping{}"] == {"wait_count": 1} and ckpt["global_step"] == 12
    assert torch.load(source, weights_only=True)["callbacks"][KEY]["dirpath"] == old["dirpath"]
    assert caplog.messages == [
        f"resuming {source} in {tmp_path / 'b'} with its best-checkpoint tracking (copied into {new_ck})"]


def test_the_resumed_checkpoint_itself_is_not_reported_missing(tmp_path, caplog):
    """Its last.ckpt is tracked too (last_model_path) and is written into the new folder, not copied."""
    source, _ = _tracked_run(tmp_path / "a")
    new_ck = tmp_path / "b" / "checkpoints"
    with caplog.at_level(logging.WARNING, logger="seqaware.runs"):
        runs.rehome_checkpoint(source, [SimpleNamespace(state_key=KEY, dirpath=str(new_ck))], tmp_path / "b")
    assert not caplog.records


def test_a_tracked_checkpoint_found_nowhere_is_named(tmp_path, caplog):
    source, _ = _tracked_run(tmp_path / "a", missing=("best_epoch_001.ckpt",), save_last=False)
    new_ck = tmp_path / "b" / "checkpoints"
    new_ck.mkdir(parents=True)
    (new_ck / "best_epoch_000.ckpt").write_bytes(b"already here")   # never overwritten
    with caplog.at_level(logging.WARNING, logger="seqaware.runs"):
        runs.rehome_checkpoint(source, [SimpleNamespace(state_key=KEY, dirpath=str(new_ck))], tmp_path / "b")
    lost = str(tmp_path / "a" / "checkpoints" / "best_epoch_001.ckpt")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{source}: the checkpoint(s) {[lost]} that {KEY} tracked (best_model_path, best_k_models) are neither where "
        f"the run left them, nor beside it, nor in {new_ck}: 'best' now ranks only what is left and what this run "
        f"saves from here on, and the test may use a later checkpoint. Copy them into {new_ck} to keep them"]
    assert (new_ck / "best_epoch_000.ckpt").read_bytes() == b"already here"
    state = torch.load(new_ck / "last.ckpt", weights_only=True)["callbacks"][KEY]
    assert {k: float(v) for k, v in state["best_k_models"].items()} == pytest.approx(   # the lost one is not ranked
        {str(new_ck / "best_epoch_002.ckpt"): 0.9, str(new_ck / "best_epoch_000.ckpt"): 0.5})
    assert state["best_model_path"] == str(new_ck / "best_epoch_002.ckpt")


@pytest.mark.parametrize("mode", ["max", None])   # None: a callback without a mode; read from the recorded scores
def test_a_lost_best_checkpoint_leaves_the_best_of_what_is_left(tmp_path, caplog, mode):
    """The tracked best is gone everywhere: the state names the best file that is left (val/acc 0.7), so the
    resumed run tests a file that exists, never the current weights for want of one; the k-th best stays."""
    source, _ = _tracked_run(tmp_path / "a", missing=("best_epoch_002.ckpt",))
    new_ck = tmp_path / "b" / "checkpoints"
    with caplog.at_level(logging.WARNING, logger="seqaware.runs"):
        runs.rehome_checkpoint(source, [SimpleNamespace(state_key=KEY, dirpath=str(new_ck), mode=mode)], tmp_path / "b")
    assert len(caplog.records) == 1 and "best_epoch_002.ckpt" in caplog.records[0].getMessage()
    state = torch.load(new_ck / "last.ckpt", weights_only=True)["callbacks"][KEY]
    assert state["best_model_path"] == str(new_ck / "best_epoch_001.ckpt")
    assert float(state["best_model_score"]) == pytest.approx(0.7)
    assert state["kth_best_model_path"] == str(new_ck / "best_epoch_000.ckpt") and float(state["kth_value"]) == 0.5
    assert sorted(state["best_k_models"]) == [str(new_ck / "best_epoch_000.ckpt"), str(new_ck / "best_epoch_001.ckpt")]


def test_a_state_whose_every_tracked_checkpoint_is_lost_tracks_nothing(tmp_path):
    """Nothing left to rank: the resumed callback saves the next checkpoint it scores, as a fresh one would."""
    source, _ = _tracked_run(tmp_path / "a", missing=("best_epoch_002.ckpt", "best_epoch_001.ckpt", "best_epoch_000.ckpt"),
                             save_last=False)
    new_ck = tmp_path / "b" / "checkpoints"
    runs.rehome_checkpoint(source, [SimpleNamespace(state_key=KEY, dirpath=str(new_ck), mode="max")], tmp_path / "b")
    state = torch.load(new_ck / "last.ckpt", weights_only=True)["callbacks"][KEY]
    assert (state["best_model_path"], state["best_model_score"], state["kth_best_model_path"], state["best_k_models"]) == (
        "", None, "", {})


def test_a_source_folder_moved_or_copied_elsewhere_gives_its_checkpoints_from_beside_ckpt_path(tmp_path, caplog):
    """ckpt_path=<a folder copied from another machine, or moved>/checkpoints/last.ckpt: its state names the
    files where the run left them, which no longer exist; they are beside ckpt_path, and are copied from there."""
    _tracked_run(tmp_path / "a")
    (tmp_path / "a").rename(tmp_path / "copied")
    source = tmp_path / "copied" / "checkpoints" / "last.ckpt"
    new_ck = tmp_path / "b" / "checkpoints"
    with caplog.at_level(logging.WARNING, logger="seqaware.runs"):
        resumed = runs.rehome_checkpoint(source, [SimpleNamespace(state_key=KEY, dirpath=str(new_ck))], tmp_path / "b")
    assert not caplog.records
    assert sorted(p.name for p in new_ck.iterdir()) == ["best_epoch_000.ckpt", "best_epoch_001.ckpt",
                                                        "best_epoch_002.ckpt", "last.ckpt"]
    assert (new_ck / "best_epoch_002.ckpt").read_bytes() == b"best_epoch_002.ckpt"
    state = torch.load(resumed, weights_only=True)["callbacks"][KEY]
    assert state["best_model_path"] == str(new_ck / "best_epoch_002.ckpt")
    assert float(state["best_model_score"]) == pytest.approx(0.9)
    assert state["last_model_path"] == str(new_ck / "last.ckpt")


def test_a_moved_run_folder_points_its_tracking_at_the_new_place(tmp_path, caplog):
    _tracked_run(tmp_path / "a")
    (tmp_path / "a").rename(tmp_path / "b")
    new_ck = tmp_path / "b" / "checkpoints"
    with caplog.at_level(logging.WARNING, logger="seqaware.runs"):
        resumed = runs.rehome_checkpoint(new_ck / "last.ckpt", [SimpleNamespace(state_key=KEY, dirpath=str(new_ck))],
                                         tmp_path / "b")
    assert resumed == str(new_ck / "last.ckpt") and not caplog.records
    state = torch.load(new_ck / "last.ckpt", weights_only=True)["callbacks"][KEY]
    assert state["dirpath"] == str(new_ck) and state["best_model_path"] == str(new_ck / "best_epoch_002.ckpt")


def test_a_checkpoint_already_in_place_is_resumed_as_it_is(tmp_path):
    source, _ = _tracked_run(tmp_path / "a")
    before = source.read_bytes()
    ck = tmp_path / "a" / "checkpoints"
    for callbacks in ([SimpleNamespace(state_key=KEY, dirpath=str(ck))],            # same folder
                      [SimpleNamespace(state_key=KEY, dirpath=None)],               # no folder of its own
                      [SimpleNamespace(state_key=KEY)],
                      [SimpleNamespace(state_key="ModelCheckpoint{'monitor': 'other'}", dirpath=str(tmp_path / "c"))],
                      [SimpleNamespace(dirpath=str(tmp_path / "c"))], []):
        assert runs.rehome_checkpoint(source, callbacks, tmp_path / "c") == str(source)
    assert source.read_bytes() == before and not (tmp_path / "c").exists()


def test_every_callback_whose_folder_changed_is_rehomed(tmp_path):
    """A callback that writes to a fixed folder keeps it; the next one, in the run folder, still moves."""
    shared, old = tmp_path / "shared", tmp_path / "a"
    shared.mkdir()
    old.mkdir()
    (old / "best.ckpt").write_text("best")
    fixed_key = "ModelCheckpoint{'monitor': 'val/loss'}"
    torch.save({"callbacks": {fixed_key: {"dirpath": str(shared), "best_model_path": ""},
                              KEY: {"dirpath": str(old), "best_model_path": str(old / "best.ckpt")}}}, old / "r.ckpt")
    run_dir = tmp_path / "runs" / "new"   # made when missing, though its callbacks write elsewhere
    new = tmp_path / "elsewhere"
    out = runs.rehome_checkpoint(old / "r.ckpt", [SimpleNamespace(state_key=fixed_key, dirpath=str(shared)),
                                                  SimpleNamespace(state_key=KEY, dirpath=str(new))], run_dir)
    assert out == str(run_dir / "checkpoints" / "last.ckpt")
    states = torch.load(out, weights_only=True)["callbacks"]
    assert states[fixed_key]["dirpath"] == str(shared)
    assert states[KEY] == {"dirpath": str(new), "best_model_path": str(new / "best.ckpt")}
    assert (new / "best.ckpt").read_text() == "best"


def test_a_state_naming_only_its_best_and_kth_files_gets_them_copied(tmp_path):
    old, new = tmp_path / "a", tmp_path / "b" / "checkpoints"
    old.mkdir()
    for name in ("best.ckpt", "kth.ckpt"):
        (old / name).write_text(name)
    torch.save({"callbacks": {KEY: {"dirpath": str(old), "best_model_path": str(old / "best.ckpt"),
                                    "kth_best_model_path": str(old / "kth.ckpt")}}}, old / "resume.ckpt")
    out = runs.rehome_checkpoint(old / "resume.ckpt", [SimpleNamespace(state_key=KEY, dirpath=str(new))], tmp_path / "b")
    assert sorted(p.name for p in new.iterdir()) == ["best.ckpt", "kth.ckpt", "last.ckpt"]
    assert torch.load(out, weights_only=True)["callbacks"][KEY] == {
        "dirpath": str(new), "best_model_path": str(new / "best.ckpt"), "kth_best_model_path": str(new / "kth.ckpt")}


def test_a_state_without_a_folder_is_left_alone(tmp_path):
    path = tmp_path / "x.ckpt"
    torch.save({"callbacks": {KEY: {"best_model_path": "p"}, "other": 3}}, path)
    assert runs.rehome_checkpoint(path, [SimpleNamespace(state_key=KEY, dirpath=str(tmp_path / "n")),
                                         SimpleNamespace(state_key="other", dirpath=str(tmp_path / "n"))],
                                  tmp_path / "r") == str(path)
    torch.save({"state_dict": {}}, path)   # no callback states at all
    assert runs.rehome_checkpoint(path, [SimpleNamespace(state_key=KEY, dirpath=str(tmp_path / "n"))],
                                  tmp_path / "r") == str(path)
    assert not (tmp_path / "n").exists() and not (tmp_path / "r").exists()


def test_a_state_tracking_nothing_yet_just_moves_its_folder(tmp_path):
    path = tmp_path / "a" / "last.ckpt"
    path.parent.mkdir()
    torch.save({"callbacks": {KEY: {"dirpath": str(tmp_path / "a"), "best_model_path": "", "best_k_models": {}}}}, path)
    out = runs.rehome_checkpoint(path, [SimpleNamespace(state_key=KEY, dirpath=str(tmp_path / "b" / "ck"))],
                                 tmp_path / "b")
    assert out == str(tmp_path / "b" / "checkpoints" / "last.ckpt")
    assert torch.load(out, weights_only=True)["callbacks"][KEY] == {"dirpath": str(tmp_path / "b" / "ck"),
                                                                    "best_model_path": "", "best_k_models": {}}


def test_resuming_from_the_best_checkpoint_itself_copies_it_so_the_test_finds_it(tmp_path, caplog):
    """ckpt_path=<run>/checkpoints/best_epoch_002.ckpt: the file it resumes is the best it tracks; it lands in
    the new folder under its own name too (not only as last.ckpt), so 'best' is still a file to test."""
    _, state = _tracked_run(tmp_path / "a")
    best = tmp_path / "a" / "checkpoints" / "best_epoch_002.ckpt"
    torch.save({"global_step": 12, "callbacks": {KEY: state}}, best)
    new_ck = tmp_path / "b" / "checkpoints"
    with caplog.at_level(logging.WARNING, logger="seqaware.runs"):
        resumed = runs.rehome_checkpoint(best, [SimpleNamespace(state_key=KEY, dirpath=str(new_ck))], tmp_path / "b")
    assert not caplog.records
    assert resumed == str(new_ck / "last.ckpt")
    assert (new_ck / "best_epoch_002.ckpt").read_bytes() == best.read_bytes()
    assert torch.load(resumed, weights_only=True)["callbacks"][KEY]["best_model_path"] == str(new_ck / "best_epoch_002.ckpt")


# ------------------------------------------------------------------------------ the checkpoint a test-only run tests
def test_a_test_only_run_of_a_last_checkpoint_tests_the_best_beside_it(tmp_path):
    source, _ = _tracked_run(tmp_path / "a")
    best = tmp_path / "a" / "checkpoints" / "best_epoch_002.ckpt"
    assert runs.checkpoint_to_test(source, [SimpleNamespace(state_key=KEY, monitor="val/acc")]) == (
        str(best), f"testing the best checkpoint {best} (val/acc 0.9000) that the run of ckpt_path={source} tracked, not "
                   "ckpt_path itself (to test its own weights, pass a copy under another name than last.ckpt)")
    assert runs.checkpoint_to_test(source, [])[0] == str(best)     # a config without the same callback: any monitored one


def test_a_test_only_run_finds_the_best_beside_a_moved_run_and_never_outside_it(tmp_path):
    source, _ = _tracked_run(tmp_path / "a")
    (tmp_path / "a").rename(tmp_path / "moved")
    moved = tmp_path / "moved" / "checkpoints"
    assert runs.checkpoint_to_test(moved / "last.ckpt", [])[0] == str(moved / "best_epoch_002.ckpt")
    copy = tmp_path / "elsewhere" / "last.ckpt"                      # taken out of its folder: its own weights
    copy.parent.mkdir()
    copy.write_bytes((moved / "last.ckpt").read_bytes())
    assert runs.checkpoint_to_test(copy, []) == (
        str(copy), f"testing ckpt_path={copy} itself: the best checkpoint its run tracked (best_epoch_002.ckpt, "
                   "val/acc 0.9000) is not beside it")


@pytest.mark.parametrize("name", ["last_weights.ckpt", "step_12.ckpt", "last.ckpt.bak"])
def test_a_test_only_run_of_a_file_not_named_last_ckpt_tests_exactly_that_file(tmp_path, name):
    """Only last.ckpt stands for its run's best; a copy of it under another name, or a checkpoint saved at some step,
    beside the best is tested as given (how to test a last checkpoint's own weights)."""
    source, _ = _tracked_run(tmp_path / "a")
    copy = source.parent / name
    copy.write_bytes(source.read_bytes())                            # records best_epoch_002.ckpt, which lies beside it
    assert runs.checkpoint_to_test(copy, [SimpleNamespace(state_key=KEY, monitor="val/acc")]) == (
        str(copy), f"testing ckpt_path={copy} as given (only a file named last.ckpt stands for the best checkpoint its "
                   "run tracked; this one's run tracked best_epoch_002.ckpt, val/acc 0.9000)")


def test_a_test_only_run_of_a_best_checkpoint_tests_that_file(tmp_path):
    _, state = _tracked_run(tmp_path / "a")
    best = tmp_path / "a" / "checkpoints" / "best_epoch_001.ckpt"   # saved when it was the best: it names itself
    torch.save({"callbacks": {KEY: dict(state, best_model_path=str(best), best_model_score=torch.tensor(0.7))}}, best)
    assert runs.checkpoint_to_test(best, []) == (
        str(best), f"testing ckpt_path={best}, the best checkpoint its run tracked (val/acc 0.7000)")


def test_a_test_only_run_of_a_checkpoint_tracking_no_best_tests_it_as_given(tmp_path):
    path = tmp_path / "x.ckpt"
    last_only = "ModelCheckpoint{'monitor': None}"
    torch.save({"callbacks": {last_only: {"monitor": None, "best_model_path": str(path)},
                              KEY: {"monitor": "val/acc", "best_model_path": ""}}}, path)
    assert runs.checkpoint_to_test(path, [SimpleNamespace(state_key=KEY, monitor="val/acc")]) == (
        str(path), f"testing ckpt_path={path} as given (its run tracked no best checkpoint: no monitored validation "
                   "metric when it was saved)")


def test_the_test_prefers_the_state_of_the_callback_the_run_monitors_first(tmp_path):
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    other = "ModelCheckpoint{'monitor': 'val/loss', 'mode': 'min'}"
    for name in ("by_acc.ckpt", "by_loss.ckpt"):
        (ck / name).write_bytes(b"x")
    torch.save({"callbacks": {other: {"monitor": "val/loss", "best_model_path": str(ck / "by_loss.ckpt")},
                              KEY: {"monitor": "val/acc", "best_model_path": str(ck / "by_acc.ckpt")}}}, ck / "last.ckpt")
    assert runs.checkpoint_to_test(ck / "last.ckpt", [SimpleNamespace(state_key=KEY, monitor="val/acc")])[0] == str(
        ck / "by_acc.ckpt")
    assert runs.checkpoint_to_test(ck / "last.ckpt", [])[0] == str(ck / "by_loss.ckpt")  # none given: the first saved


# ------------------------------------------------------------------------------ latest:TASK/FILE
def _finished(folder: Path, finished_at: str | None, status: str = "finished", files: tuple[str, ...] = ("enc.pt",)):
    folder.mkdir(parents=True)
    state = {"status": status}
    if finished_at is not None:
        state["finished_at"] = finished_at
    (folder / "run.json").write_text(json.dumps(state))
    for name in files:
        (folder / name).write_text(name)
    return folder


def test_latest_skips_runs_without_the_file_and_reads_sweep_jobs(tmp_path):
    task = tmp_path / "pre"
    newest = _finished(task / "runs" / "newest", "2026-11-23T00:00:00+0000", files=())
    sweep = _finished(task / "multiruns" / "2026-11-22_00-00-00" / "3", "2026-11-22T00:00:00+0000")
    _finished(task / "runs" / "old", "2026-11-20T00:00:00+0000")
    _finished(task / "runs" / "crashed", "2026-11-24T00:00:00+0000", status="failed")
    (task / "runs" / "no_state").mkdir()
    (task / "runs" / "stray.json").write_text("{}")
    assert runs.finished_runs(tmp_path, "pre") == [newest, sweep, task / "runs" / "old"]
    assert runs.resolve_latest("latest:pre/enc.pt", str(tmp_path)) == str(sweep / "enc.pt")
    (newest / "enc.pt").mkdir()   # a folder of that name is no file
    assert runs.resolve_latest("latest:pre/enc.pt", tmp_path) == str(sweep / "enc.pt")
    sub = _finished(task / "runs" / "sub", "2026-11-25T00:00:00+0000", files=())
    (sub / "export").mkdir()
    (sub / "export" / "enc.pt").write_text("x")
    assert runs.resolve_latest("latest:pre/export/enc.pt", tmp_path) == str(sub / "export" / "enc.pt")
    assert runs.finished_runs(tmp_path, "nothing") == []


@pytest.mark.parametrize("value", ["latest:", "latest:task", "latest:task/", "latest:/enc.pt", "latest:.t/enc.pt",
                                   "latest:t//enc.pt", "other:t/enc.pt", "latest:t x/enc.pt"])
def test_a_malformed_latest_value_shows_the_form(tmp_path, value):
    with pytest.raises(ValueError) as err:
        runs.resolve_latest(value, tmp_path)
    assert str(err.value) == f"{value!r}: expected latest:TASK/FILE, e.g. latest:clipvil_pretrain/encoder.pt"


def test_no_finished_run_holding_the_file_says_where_it_looked(tmp_path):
    _finished(tmp_path / "pre" / "runs" / "r", "t", files=())
    with pytest.raises(FileNotFoundError) as err:
        runs.resolve_latest("latest:pre/enc.pt", tmp_path)
    assert str(err.value) == (
        f"latest:pre/enc.pt: no finished run of task 'pre' under {tmp_path / 'pre'} holds enc.pt (1 finished run(s) "
        f"there). Run that stage first (e.g. python train.py experiment=pre), or give the file's path")


def test_latest_values_anywhere_in_a_config_are_replaced(tmp_path, caplog):
    from omegaconf import OmegaConf

    run = _finished(tmp_path / "pre" / "runs" / "r", "t", files=("enc.pt", "head.pt"))
    cfg = OmegaConf.create({"a": {"b": [{"c": "latest:pre/head.pt"}, "plain", 3]}, "d": "latest:pre/enc.pt",
                            "e": "no latest:pre/enc.pt", "f": None, "g": "${d}"})
    OmegaConf.set_struct(cfg, True)
    with caplog.at_level(logging.INFO, logger="seqaware.runs"):
        found = runs.resolve_latest_values(cfg, tmp_path)
    assert found == {"a.b.0.c": str(run / "head.pt"), "d": str(run / "enc.pt")}
    assert OmegaConf.to_container(cfg, resolve=True) == {
        "a": {"b": [{"c": str(run / "head.pt")}, "plain", 3]}, "d": str(run / "enc.pt"), "e": "no latest:pre/enc.pt",
        "f": None, "g": str(run / "enc.pt")}
    assert f"d=latest:pre/enc.pt: {run / 'enc.pt'}" in caplog.messages
    assert runs.resolve_latest_values(OmegaConf.create({"x": 1}), tmp_path) == {}
    with pytest.raises(FileNotFoundError, match="latest:pre/none.pt"):
        runs.resolve_latest_values(OmegaConf.create({"x": ["latest:pre/none.pt"]}), tmp_path)


# ------------------------------------------------------------------------------ metrics rows
def test_checkpoint_step_reads_the_global_step(tmp_path):
    torch.save({"global_step": 7, "state_dict": {}}, tmp_path / "a.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "b.ckpt")
    assert runs.checkpoint_step(tmp_path / "a.ckpt") == 7
    assert runs.checkpoint_step(str(tmp_path / "b.ckpt")) == 0


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(header)
        out.writerows(rows)


def test_metrics_rows_before_the_resumed_step_are_read(tmp_path):
    path = tmp_path / "metrics.csv"
    assert runs.read_csv_rows(path) == ([], [])
    _write_csv(path, ["epoch", "step", "train/loss"], [["0", "1", "0.5"], ["0", "2.0", "0.4"], ["0", "", "0.3"],
                                                       ["1", "3", "0.2"]])
    header, rows = runs.read_csv_rows(str(path))
    assert header == ["epoch", "step", "train/loss"] and [r["train/loss"] for r in rows] == ["0.5", "0.4", "0.3", "0.2"]
    assert [r["train/loss"] for r in runs.read_csv_rows(path, before_step=3)[1]] == ["0.5", "0.4", "0.3"]
    assert [r["train/loss"] for r in runs.read_csv_rows(path, before_step=2)[1]] == ["0.5", "0.3"]
    assert [r["train/loss"] for r in runs.read_csv_rows(path, before_step=0)[1]] == ["0.3"]
    _write_csv(path, ["epoch", "val/acc"], [["0", "0.5"]])   # no step column: every row kept
    assert runs.read_csv_rows(path, before_step=0) == (["epoch", "val/acc"], [{"epoch": "0", "val/acc": "0.5"}])
    path.write_text("")
    assert runs.read_csv_rows(path) == ([], [])


def test_restored_rows_are_kept_when_the_resumed_run_logs_more(tmp_path, caplog):
    from pytorch_lightning.loggers import CSVLogger

    header = ["epoch", "step", "train/loss"]
    rows = [{"epoch": "0", "step": "1", "train/loss": "0.5"}, {"epoch": "0", "step": "2", "train/loss": "0.4"}]
    logger = CSVLogger(tmp_path, name="", version="")
    other = SimpleNamespace(experiment=None)   # not a CSVLogger: left alone
    with caplog.at_level(logging.INFO, logger="seqaware.runs"):
        runs.restore_csv_rows([other, logger], header, rows)
    assert caplog.messages == [f"kept 2 rows of {logger.experiment.metrics_file_path}"]
    logger.log_metrics({"train/loss": 0.25, "epoch": 1}, step=3)
    logger.log_metrics({"val/acc": 0.75, "epoch": 1}, step=3)   # a new column: the file is rewritten
    logger.save()
    with open(logger.experiment.metrics_file_path, newline="") as fh:
        got = [{k: v for k, v in r.items() if v != ""} for r in csv.DictReader(fh)]
    assert got == [*rows, {"epoch": "1", "step": "3", "train/loss": "0.25"}, {"epoch": "1", "step": "3", "val/acc": "0.75"}]


def test_restored_rows_keep_a_header_that_is_not_sorted(tmp_path):
    from pytorch_lightning.loggers import CSVLogger

    header = ["step", "b", "a"]
    logger = CSVLogger(tmp_path, name="", version="")
    runs.restore_csv_rows([logger], header, [{"step": "1", "b": "2", "a": "3"}])
    logger.log_metrics({"a": 4}, step=2)
    logger.save()
    with open(logger.experiment.metrics_file_path, newline="") as fh:
        got = [{k: v for k, v in r.items() if v != ""} for r in csv.DictReader(fh)]
    assert got == [{"step": "1", "b": "2", "a": "3"}, {"step": "2", "a": "4"}]


def test_no_rows_to_restore_leaves_the_logger_alone(tmp_path):
    from pytorch_lightning.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="", version="")
    runs.restore_csv_rows([logger], ["step"], [])
    assert not Path(logger.experiment.metrics_file_path).exists()


# ------------------------------------------------------------------------------ DDP job helpers
@pytest.fixture
def watchdog():
    """Lightning's watchdog thread over the given rank processes (never acting: it sleeps); detached afterwards."""
    from lightning_fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    started, procs = [], []

    def start(*codes_or_sleeps):
        ranks = []
        for spec in codes_or_sleeps:
            code = f"import time; time.sleep({spec[1]})" if isinstance(spec, tuple) else f"raise SystemExit({spec})"
            ranks.append(subprocess.Popen([sys.executable, "-c", code]))
        observer = _ChildProcessObserver(main_pid=os.getpid(), child_processes=list(ranks), sleep_period=3600)
        observer.start()
        started.append(observer)
        procs.extend(ranks)
        return ranks

    yield start
    for observer in started:
        observer._child_processes = []
    for proc in procs:
        proc.kill()
        proc.wait()


def test_release_waits_for_every_rank_and_reports_its_exit_code(watchdog):
    ranks = watchdog(0, 3)
    for proc in ranks:
        proc.wait()
    assert launch.release_ddp_ranks() == {1: 0, 2: 3}
    assert launch.release_ddp_ranks() == {}   # released once: nothing left to wait for


def test_release_kills_the_ranks_of_a_failed_job_at_once(watchdog):
    rank1, rank2 = watchdog(("sleep", 60), 0)
    rank2.wait()
    assert launch.release_ddp_ranks(kill=True, timeout_s=30) == {1: -9, 2: 0}


def test_a_rank_still_running_after_the_timeout_is_killed(watchdog, caplog):
    (rank1,) = watchdog(("sleep", 60))
    with caplog.at_level(logging.ERROR, logger="seqaware.launch"):
        assert launch.release_ddp_ranks(timeout_s=0.2) == {1: -9}
    assert f"DDP rank 1 (pid {rank1.pid}) still runs 0 s after this job ended: killing it" in caplog.text


def test_a_job_outside_a_sweep_is_left_as_it_is(monkeypatch, watchdog):
    monkeypatch.setattr(launch, "pin_ddp_relaunch", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    (rank1,) = watchdog(3)
    rank1.wait()
    with launch.ddp_sweep_job() as pinned:
        assert pinned is False
        os.environ["WORLD_SIZE"] = "2"
    assert os.environ["LOCAL_RANK"] == "0" and os.environ["WORLD_SIZE"] == "2"   # nothing reset, nothing raised
    monkeypatch.delenv("WORLD_SIZE")


def test_a_sweep_job_puts_back_the_variables_it_found(monkeypatch, watchdog):
    monkeypatch.setattr(launch, "pin_ddp_relaunch", lambda: True)
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("NODE_RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    (rank1,) = watchdog(0)
    rank1.wait()
    with launch.ddp_sweep_job(rank_timeout_s=30) as pinned:
        assert pinned is True
        os.environ.update(MASTER_PORT="40000", NODE_RANK="1", WORLD_SIZE="2")
    assert (os.environ["MASTER_PORT"], os.environ["NODE_RANK"], "WORLD_SIZE" in os.environ) == ("29500", "0", False)


def test_a_failed_job_raises_its_own_error_not_its_ranks(monkeypatch, watchdog):
    monkeypatch.setattr(launch, "pin_ddp_relaunch", lambda: True)
    (rank1,) = watchdog(5)
    rank1.wait()
    with pytest.raises(KeyError, match="the job's own error"):
        with launch.ddp_sweep_job():
            raise KeyError("the job's own error")


def test_failed_ranks_are_listed_with_their_codes(monkeypatch, watchdog):
    monkeypatch.setattr(launch, "pin_ddp_relaunch", lambda: True)
    ranks = watchdog(0, 4, 0)
    for proc in ranks:
        proc.wait()
    with pytest.raises(RuntimeError) as err:
        with launch.ddp_sweep_job():
            pass
    assert str(err.value) == ("DDP ranks of this job exited with a failure (rank: exit code) {2: 4}; see their logs "
                              "(train_ddp_process_<rank>.log) in the run folder")


def test_the_slurm_environment_keeps_lightnings_requeue_off(monkeypatch):
    from lightning_fabric.plugins.environments import SLURMEnvironment

    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    assert launch.slurm_environment() is None
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "seqaware", "SLURM_JOB_ID": "123"}.items():
        monkeypatch.setenv(key, value)
    env = launch.slurm_environment()
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue is False
    assert launch.slurm_environment(auto_requeue=True).auto_requeue is True


def test_split_overrides_cuts_at_the_first_separator():
    assert launch.split_overrides(["a", "--", "b", "--", "c"]) == (["a"], ["b", "--", "c"])
    assert launch.split_overrides(["--", "seed=1"]) == ([], ["seed=1"])
    assert launch.split_overrides([]) == ([], [])


def test_a_rank_of_a_job_that_succeeded_is_waited_for_not_killed(watchdog):
    (rank1,) = watchdog(("sleep", 0.3))
    assert launch.release_ddp_ranks(timeout_s=30) == {1: 0}


@pytest.fixture
def hydra_job(monkeypatch, tmp_path):
    """A Hydra config of one multirun job (``launcher`` names the launcher plugin), made current."""
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    def make(launcher: str, mode=RunMode.MULTIRUN):
        cfg = OmegaConf.structured({"hydra": HydraConf})
        with open_dict(cfg):
            cfg.hydra.mode = mode
            cfg.hydra.launcher = {"_target_": launcher}
            cfg.hydra.run.dir = str(tmp_path / "outputs" / "first_job")
            cfg.hydra.runtime.output_dir = str(tmp_path / "sweep" / "1")
            cfg.hydra.overrides.task = ["seed=4", "trainer=ddp"]
        monkeypatch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)  # restored afterwards
        HydraConfig.instance().set_config(cfg)
        return HydraConfig

    monkeypatch.setattr(sys, "argv", ["train.py", "-m", "seed=3,4", "trainer=ddp"])
    return make


def test_a_basic_launcher_job_relaunches_its_ranks_into_itself(hydra_job, tmp_path, caplog):
    hydra = hydra_job(launch.BASIC_LAUNCHER)
    with caplog.at_level(logging.DEBUG, logger="seqaware.launch"):
        assert launch.pin_ddp_relaunch() is True
    assert sys.argv == ["train.py", "seed=4", "trainer=ddp", "hydra.mode=RUN"]
    assert hydra.get().run.dir == str(tmp_path / "sweep" / "1")
    assert caplog.messages == [f"DDP ranks > 0 will re-run this job in {tmp_path / 'sweep' / '1'}: "
                               f"['seed=4', 'trainer=ddp', 'hydra.mode=RUN']"]


@pytest.mark.parametrize("launcher, multirun", [
    ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher", True),
    (launch.BASIC_LAUNCHER, False),
])
def test_other_launchers_and_single_runs_are_left_alone(hydra_job, tmp_path, launcher, multirun):
    from hydra.types import RunMode

    hydra = hydra_job(launcher, RunMode.MULTIRUN if multirun else RunMode.RUN)
    assert launch.pin_ddp_relaunch() is False
    assert sys.argv == ["train.py", "-m", "seed=3,4", "trainer=ddp"]
    assert hydra.get().run.dir == str(tmp_path / "outputs" / "first_job")


def test_without_hydra_nothing_is_pinned(monkeypatch):
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
    monkeypatch.setattr(sys, "argv", ["train.py", "-m", "seed=1,2"])
    assert launch.pin_ddp_relaunch() is False
    assert sys.argv == ["train.py", "-m", "seed=1,2"]


# ---------------------------------------------------------------- reusing a run folder (the study scripts)
def _hydra_folder(run_dir: Path, overrides: list[str], edit=None) -> None:
    """What Hydra writes into a run folder: the overrides and the composed config (``edit``: changed first)."""
    from omegaconf import OmegaConf

    from seqaware.config import compose_train

    cfg = compose_train(overrides)
    if edit is not None:
        edit(cfg)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))


def test_a_folder_of_the_same_overrides_and_config_is_reused(tmp_path):
    overrides = ["experiment=berson_finetune", "seed=3", "trainer.max_steps=7"]
    _hydra_folder(tmp_path / "run", overrides)
    run_reuse.check_same_job(tmp_path / "run", overrides)
    run_reuse.check_same_job(tmp_path / "empty", overrides)                  # nothing run there yet
    with pytest.raises(SystemExit, match=r"holds a run made with other overrides than this command's:\n  that run: "
                                         r"experiment=berson_finetune seed=3 trainer.max_steps=7\n  this one: "
                                         r"experiment=berson_finetune seed=4 trainer.max_steps=7\n"):
        run_reuse.check_same_job(tmp_path / "run", ["experiment=berson_finetune", "seed=4", "trainer.max_steps=7"])


def test_the_same_overrides_over_a_changed_default_are_refused_key_by_key(tmp_path):
    """The hole the override list left: ``model.encoder.ckpt_new_layers`` went from ``order`` to ``fresh`` in
    berson_finetune's config, and the same command reused the ``order`` runs as if they were ``fresh``."""
    from omegaconf import open_dict

    from seqaware.config import compose_train

    overrides = ["experiment=berson_finetune", "seed=3"]

    def then(cfg):
        with open_dict(cfg):
            cfg.model.encoder.ckpt_new_layers = "order"                   # the default when that run was made
            cfg.model.optimizer.lr = 1e-4
            cfg.model.retired_option = 5                                   # an option since removed
            del cfg.trainer["max_epochs"]                                  # one added since (the old run lacks it)
    _hydra_folder(tmp_path / "old", overrides, then)
    with pytest.raises(SystemExit) as err:
        run_reuse.check_same_job(tmp_path / "old", overrides)
    lines = str(err.value).splitlines()
    assert lines[0] == (f"{tmp_path / 'old'} holds a run made with the same overrides, but they compose to another "
                        "config now (a default changed since it ran):")
    assert lines[1:-1] == ["  model.encoder.ckpt_new_layers: that run 'order', now "
                           "'${oc.select:wu2022.ckpt_new_layers,fresh}'",
                           f"  model.optimizer.lr: that run 0.0001, now {compose_train(overrides).model.optimizer.lr!r}",
                           "  model.retired_option: that run 5, now '<absent>'"]
    assert lines[-1] == "pick another --out, or remove the folder to run it again"


def test_a_value_written_another_way_that_resolves_the_same_is_no_difference(tmp_path):
    from omegaconf import OmegaConf

    overrides = ["experiment=berson_finetune"]
    _hydra_folder(tmp_path / "run", overrides, lambda cfg: setattr(cfg.model.encoder, "ckpt_new_layers", "fresh"))
    run_reuse.check_same_job(tmp_path / "run", overrides)                    # 'fresh' == ${oc.select:...,fresh} here
    then = OmegaConf.create({"a": 1, "b": {"c": "x", "d": [1, 2]}, "gone": 0})
    now = OmegaConf.create({"a": 1, "b": {"c": "${z}", "d": [1, 3]}, "z": "x", "new": 7})
    assert run_reuse.config_differences(then, now) == [("b.d", [1, 2], [1, 3]), ("gone", 0, "<absent>")]
