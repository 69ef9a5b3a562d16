"""scripts/studies/roc_table.py: the ROC table on one GPU in one command, checked here on the CPU at toy size.

The pieces (the runs' commands composed against the real configs, the order of the runs, the forecast's arithmetic,
the budget's refusal, a folder of another command refused) are fast; the whole path on a tiny random MPNet and 42
stories (timing, forecast, runs, table; a run cut by SIGTERM, the same command resuming it and reusing the rest, a
third time reusing everything) is one slow test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

from scripts.studies import roc_table  # noqa: E402
from scripts.studies.roc_table import forecast, plan, run_overrides, timing_overrides  # noqa: E402
from seqaware import run_reuse  # noqa: E402
from seqaware.config import compose_train as compose  # noqa: E402

TIMING = {"warmup_steps": 5, "warmup_s": 10.0, "steps": 20, "seconds": 2.0, "s_per_step": 0.1, "val_batches": 4,
          "val_s": 2.0, "s_per_eval_batch": 0.5, "overhead_s": 20.0, "batches_per_epoch": 267,
          "splits": {"train": 37602, "val": 982, "test": 1963}}


def test_the_runs_go_seeds_outermost_every_row_its_own_seeds():
    assert plan([0, 1, 2], [0], list(roc_table.ROWS)) == [("roc_base", 0), ("berson_paper", 0), ("roc_base", 1),
                                                           ("roc_base", 2)]
    assert plan([1], [0, 1], ["berson_paper"]) == [("berson_paper", 0), ("berson_paper", 1)]


@pytest.mark.parametrize("row, hparams, encoding, budget", [("roc_base", "roc_base", "joint", 8192),
                                                             ("berson_paper", "berson_roc_paper_large", "pairwise", 65536)])
def test_each_run_is_its_recipes_command_in_its_own_folder(tmp_path, row, hparams, encoding, budget):
    overrides = run_overrides(row, 2, "gpu", tmp_path, ["model.beam_size=4"])
    assert overrides[:2] == ["experiment=berson_roc", f"hparams={hparams}"] and overrides[-1] == "model.beam_size=4"
    cfg = compose(overrides)
    assert (cfg.run_name, cfg.paths.log_dir, cfg.seed) == (f"{row}-seed2", str(tmp_path), 2)
    assert (cfg.model.pair_encoding, cfg.data.batch_tokens, cfg.backbones.text) == (encoding, budget, "offline:mpnet")
    assert [p.endswith("/roc/train_extra.tsv") for p in cfg.data.extra_train_paths] == [True]
    assert (cfg.trainer.accelerator, cfg.trainer.precision, cfg.test, cfg.model.beam_size) == ("gpu", "bf16-mixed",
                                                                                                True, 4)
    assert roc_table.run_dir(tmp_path, "roc_base-seed2") == tmp_path / "berson_roc" / "runs" / "roc_base-seed2"


def test_the_timing_run_trains_the_rows_data_for_a_few_steps_and_times_one_validation(tmp_path):
    overrides = timing_overrides("roc_base", "gpu", tmp_path, 5, 20, 4, ["trainer.max_steps=99", "model.beam_size=4"])
    cfg = compose(overrides)
    run = compose(run_overrides("roc_base", 0, "gpu", tmp_path, ["trainer.max_steps=99", "model.beam_size=4"]))
    assert cfg.data == run.data and cfg.model == run.model                      # the real run's data and model
    assert (cfg.trainer.max_steps, cfg.trainer.max_epochs, cfg.trainer.val_check_interval) == (25, -1, 25)
    assert (cfg.trainer.limit_val_batches, cfg.trainer.num_sanity_val_steps, cfg.test) == (4, 0, False)
    assert (cfg.run_name, cfg.paths.log_dir) == ("roc_base", str(tmp_path / "timing"))
    assert cfg.callbacks.step_clock.path == str(tmp_path / "timing" / "roc_base.json")
    assert (cfg.callbacks.step_clock.warmup_steps, cfg.callbacks.step_clock.steps) == (5, 20)


def test_the_forecast_adds_start_up_the_first_steps_the_timed_pace_and_the_evaluations(tmp_path):
    cfg = compose(run_overrides("roc_base", 0, "gpu", tmp_path, []))
    # 4 epochs of 267 steps; 2 validations an epoch of ceil(982 / 64) = 16 batches, the test ceil(1963 / 64) = 31
    assert forecast(cfg, TIMING) == {"steps": 1068, "left": 1068, "s_per_step": 0.1, "train_s": 116.3, "validations": 8,
                                     "eval_s": 79.5, "overhead_s": 20.0, "total_s": 215.8}
    # resumed after 534 steps: the start-up and first steps again, half the validations, the test
    assert forecast(cfg, TIMING, done=534) == {"steps": 1068, "left": 534, "s_per_step": 0.1, "train_s": 62.9,
                                               "validations": 4, "eval_s": 47.5, "overhead_s": 20.0, "total_s": 130.4}
    paper = compose(run_overrides("berson_paper", 0, "gpu", tmp_path, ["trainer.max_steps=100"]))
    assert forecast(paper, {**TIMING, "batches_per_epoch": 286})["steps"] == 100     # max_steps caps the recipe
    assert forecast(paper, {**TIMING, "batches_per_epoch": 286}, done=100)["total_s"] == 20.0 + 31 * 0.5


def _fake_timings(out: Path, trainer: str, extra: list[str]) -> Path:
    """step_times.json as a timing on this machine would have written it (no training)."""
    machine = roc_table.machine_info(trainer)["machine"]
    entries = {row: {**TIMING, "overrides": timing_overrides(row, trainer, out, 5, 20, 4, extra), "machine": machine}
               for row in roc_table.ROWS}
    path = out / "step_times.json"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries))
    return path


def test_a_forecast_over_the_budget_runs_nothing_and_says_so(tmp_path, capsys):
    out = tmp_path / "out"
    timings = _fake_timings(tmp_path / "elsewhere", "cpu", [])              # another command's (--step-times)
    code = roc_table.main(["--seeds", "0", "1", "--trainer", "cpu", "--out", str(out), "--budget-s", "300",
                           "--step-times", str(timings)])
    assert code == 2
    printed = capsys.readouterr()
    # roc_base 215.8 s a run, BERSON's 2 epochs of 267 steps: 20 + 10 + 529 x 0.1 + (4 x 16 + 31) x 0.5 = 130.4 s
    assert "roc_base-seed0: 1068 of 1068 steps x 0.1000 s + start-up 20 s + 8 validations and the test 80 s = 216 s" \
        in printed.out
    assert "total 562 s of runs, 562 s with the timing" in printed.out and "step times reused" in printed.out
    assert "the forecast (562 s) is over --budget-s 300: nothing run (--budget-s 0 runs it anyway)" in printed.err
    assert not (out / "berson_roc").exists() and not (out / "logs").exists()
    report = json.loads((out / "roc_table.json").read_text())
    assert [r["status"] for r in report["runs"]] == ["to run"] * 3 and report["forecast_total_s"] == pytest.approx(562.0)
    assert report["machine"]["machine"] == roc_table.machine_info("cpu")["machine"]


def test_timings_of_other_overrides_or_another_machine_are_not_reused(tmp_path):
    out = tmp_path / "out"
    path = _fake_timings(out, "cpu", ["model.beam_size=4"])
    entries = json.loads(path.read_text())
    entries["berson_paper"]["machine"] = "another machine"
    path.write_text(json.dumps(entries))
    args = roc_table.argparse.Namespace(out=out, step_times=None, trainer="cpu", warmup_steps=5, timed_steps=20,
                                        val_batches=4)
    calls = []
    roc_table_train = roc_table.train
    try:
        roc_table.train = lambda overrides, log: calls.append(overrides) or (1, 0.0)      # a timing run that fails
        with pytest.raises(SystemExit, match=r"^timing berson_paper: train.py exited 1"):
            roc_table.time_rows(args, list(roc_table.ROWS), ["model.beam_size=4"], entries["roc_base"]["machine"])
    finally:
        roc_table.train = roc_table_train
    assert [c[1] for c in calls] == ["hparams=berson_roc_paper_large"]           # roc_base's timing was reused


def test_a_folder_holding_a_run_of_other_overrides_is_refused(tmp_path):
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("- experiment=berson_roc\n- seed=1\n")
    run_reuse.check_same_job(folder, ["experiment=berson_roc", "seed=1"])
    with pytest.raises(SystemExit, match=r"holds a run made with other overrides than this command's:\n  that run: "
                                         r"experiment=berson_roc seed=1\n  this one: experiment=berson_roc seed=2\n"):
        run_reuse.check_same_job(folder, ["experiment=berson_roc", "seed=2"])


def test_a_cut_runs_steps_come_from_its_last_checkpoint_and_the_logged_perf_from_its_csv(tmp_path):
    import torch

    from seqaware.profiling import logged_perf

    folder = tmp_path / "run"
    (folder / "csv").mkdir(parents=True)
    (folder / "csv" / "metrics.csv").write_text("epoch,perf/mfu,perf/tokens_per_s,step,train/loss,val/pmr\n"
                                                "0,0.2,1000,9,0.5,\n0,0.4,3000,19,0.4,\n0,,,19,,0.3\n")
    assert roc_table.steps_done(folder) == 0                                    # no last.ckpt: starts afresh
    (folder / "checkpoints").mkdir()
    torch.save({"global_step": 23, "state_dict": {"w": torch.zeros(3)}}, folder / "checkpoints" / "last.ckpt")
    assert roc_table.steps_done(folder) == 23
    assert logged_perf(folder) == pytest.approx({"mfu": 0.3, "tokens_per_s": 2000.0})


# ---------------------------------------------------------------- the whole command at toy size
@pytest.mark.slow  # about 6 train.py processes on a tiny random MPNet: 1-2 min on a 2-core CPU
def test_the_whole_command_at_toy_size_resumes_a_cut_run_and_reuses_finished_ones(tmp_path):
    from test_gpu_roc import write_roc
    from test_weight_parts import tiny_mpnet_folder

    mpnet = tiny_mpnet_folder(tmp_path / "mpnet")
    write_roc(tmp_path / "data" / "roc")                    # 33 training stories (dev's 21 + 12), 3 val, 6 test
    out = tmp_path / "out"
    # SIGTERM at step 3 of the first run that reaches it (roc_base seed 0: 4 epochs of one 8,192-token batch; the
    # timing runs stop at step 2, BERSON's recipe at 2): what a user's kill or a scheduler's preemption does
    cmd = [sys.executable, "scripts/studies/roc_table.py", "--seeds", "0", "1", "--paper-seeds", "0", "--trainer", "cpu",
           "--out", str(out), "--budget-s", "0", "--warmup-steps", "1", "--timed-steps", "1", "--val-batches", "1", "--",
           f"backbones.text={mpnet}", f"backbones.tokenizer={mpnet}", f"paths.shared_data_dir={tmp_path / 'data'}",
           f"paths.cache_dir={tmp_path / 'cache'}", "data.eval_batch_size=3", "model.beam_size=2",
           "trainer.num_sanity_val_steps=0", "+callbacks.cut._target_=preempt_helpers.SignalAtStep",
           "+callbacks.cut.step=3", f"+callbacks.cut.marker={tmp_path / 'signalled'}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}

    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert first.returncode == 143, first.stdout[-3000:] + first.stderr[-3000:]
    assert "forecast on " in first.stdout and "roc_base-seed0: 4 of 4 steps" in first.stdout
    assert "stopped by a signal during roc_base-seed0" in first.stderr
    seed0 = out / "berson_roc" / "runs" / "roc_base-seed0"
    assert (seed0 / "checkpoints" / "last.ckpt").is_file() and json.loads((seed0 / "run.json").read_text())[
        "status"] == "interrupted"
    timings = json.loads((out / "step_times.json").read_text())
    assert set(timings) == {"roc_base", "berson_paper"}
    assert all(t["s_per_step"] > 0 and t["s_per_eval_batch"] > 0 and t["batches_per_epoch"] == 1 for t in timings.values())
    assert timings["roc_base"]["splits"] == {"train": 33, "val": 3, "test": 6}

    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)   # the same command
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "roc_base: step times reused" in second.stdout and "berson_paper: step times reused" in second.stdout
    assert "roc_base-seed0: 1 of 4 steps" in second.stdout                         # the forecast knows what is left
    assert "resuming run" in (seed0 / "train.log").read_text()
    report = json.loads((out / "roc_table.json").read_text())
    assert [(r["row"], r["seed"], r["status"]) for r in report["runs"]] == [
        ("roc_base", 0, "tested"), ("berson_paper", 0, "tested"), ("roc_base", 1, "tested")]
    assert set(report["stats"]) == {"roc_base", "berson_paper"} and report["stats"]["roc_base"]["seeds"] == [0, 1]
    assert all(0.0 <= r["metrics"]["test/pmr"] <= 1.0 and r["wall_s"] > 0 for r in report["runs"])
    assert report["runs"][0]["forecast"]["left"] == 4                              # the first part's forecast kept
    logs = {p.name: p.read_text().count("==> ") for p in (out / "logs").iterdir()}
    assert logs == {"timing-roc_base.log": 1, "timing-berson_paper.log": 1, "roc_base-seed0.log": 2,
                    "berson_paper-seed0.log": 1, "roc_base-seed1.log": 1}

    third = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert third.stdout.count("finished, reused") == 3 and "total 0 s of runs" in third.stdout
    assert {p.name: p.read_text().count("==> ") for p in (out / "logs").iterdir()} == logs   # nothing ran again
    table = (out / "roc_table.md").read_text()
    assert "the test slice (6 stories)" in table and roc_table.machine_info("cpu")["machine"] in table
    assert "| `roc_base` | `hparams=roc_base` | 0 1 |" in table and "| `berson_paper` | `hparams=berson_roc_paper_large" in table
    assert json.loads((out / "roc_table.json").read_text())["stats"] == report["stats"]
    assert "ROC_TABLE_JSON " in third.stdout
