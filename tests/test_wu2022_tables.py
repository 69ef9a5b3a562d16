"""scripts/studies/wu2022_tables.py: the paper-layout summary (hand-computed) and a tiny end-to-end run that
resumes by reusing finished runs."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("wu2022_tables", ROOT / "scripts" / "studies" / "wu2022_tables.py")
tables = importlib.util.module_from_spec(spec)
sys.modules["wu2022_tables"] = tables  # its dataclasses look their module up there
spec.loader.exec_module(tables)


def _metrics(acc, pmr, lcs=3.0, lcstr=2.0, tau=0.5, dist=1.0):
    return {"test/acc": acc, "test/pmr": pmr, "test/lcs": lcs, "test/lcstr": lcstr, "test/tau": tau, "test/dist": dist}


def test_summary_is_mean_and_sample_std_in_the_papers_units():
    summary = tables.summarise({"clipvil/N": [_metrics(0.5, 0.2), _metrics(0.7, 0.4)],
                                "clipvil/Y": [_metrics(0.9, 0.6, tau=0.8)]})
    assert summary["clipvil/N/pmr"] == {"mean": pytest.approx(30.0), "std": pytest.approx(14.142136), "n": 2}
    assert summary["clipvil/N/acc"]["mean"] == pytest.approx(60.0)  # percent, as in Table 2
    assert summary["clipvil/N/lcs"] == {"mean": 3.0, "std": 0.0, "n": 2}  # Lq unscaled
    assert summary["clipvil/Y/tau"] == {"mean": 0.8, "std": 0.0, "n": 1}
    text = tables.table(summary, 2)
    lines = text.splitlines()
    assert lines[0].startswith("| Modality | Encoder, pretraining | Acc↑ | PMR↑ | Lq↑ | Lr↑ | τ↑ | Dist↓")
    assert lines[2] == "| Multimodal | CLIP-ViL N | 60.00 ± 14.14 | 30.00 ± 14.14 | 3.00 ± 0.00 | 2.00 ± 0.00 | 0.50 ± 0.00 | 1.00 ± 0.00 |"
    assert lines[3].startswith("|  | CLIP-ViL Y | 90.00 | 60.00 |")  # one seed: no std; the group is printed once
    assert tables.table(summary, 3).count("\n") == 1  # no Table 3 row was run


def test_each_encoders_y_minus_n_is_seed_matched_with_its_interval():
    # PMR points Y - N per seed: +10, +20, -6 -> mean 8, sd 13.114877, t(0.975, 2) = 4.302653
    n = [_metrics(0.5, p) for p in (0.20, 0.30, 0.40)]
    y = [_metrics(0.5, p) for p in (0.30, 0.50, 0.34)]
    gaps = tables.gaps({"clipvil/N": n, "clipvil/Y": y, "text/N": n}, [1, 2, 3])
    assert list(gaps) == ["clipvil/Y-N/pmr"]  # text has no Y row: no gap
    gap = gaps["clipvil/Y-N/pmr"]
    assert (gap["n"], gap["wins"]) == (3, 2) and gap["mean"] == pytest.approx(8.0)
    half = 4.302653 * 13.114877 / 3 ** 0.5
    assert (gap["low"], gap["high"]) == (pytest.approx(8.0 - half, abs=1e-4), pytest.approx(8.0 + half, abs=1e-4))
    assert gap["text"] == "+8.00 ± 13.11 (95% CI [-24.58, +40.58]; Y > N on 2 of 3 seeds)"


def test_every_row_names_a_known_objective_set_and_rows_are_validated(capsys):
    from seqaware.objectives import OBJECTIVE_SETS

    for row in tables.ROWS:
        for override in row.pretrain or ():
            if override.startswith("objectives="):
                assert override.split("=", 1)[1] in OBJECTIVE_SETS, row.key
    assert {r.key for r in tables.ROWS if r.table == 3} == {
        "image/isp", "image/isp_pisp", "clipvil/mlm", "clipvil/mlm_isp", "clipvil/mlm_smrm", "clipvil/mlm_isp_pisp",
        "clipvil/mlm_isp_smrm"}
    with pytest.raises(SystemExit):
        tables.main(["--rows", "clipvil/X"])
    assert "unknown rows ['clipvil/X']" in capsys.readouterr().err


TINY = ["data.source.num_train=16", "data.source.num_val=4", "data.source.num_test=5", "data.source.image_size=64",
        "data.collator.image_size=64", "data.batch_size=4", "data.eval_batch_size=8", "data.num_workers=0",
        "model.encoder.config={model_type: bert, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
        "intermediate_size: 64, vocab_size: 30522, max_position_embeddings: 256}",
        "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "logger=csv",
        "callbacks.progress_bar.refresh_rate=0"]


def test_a_row_that_repeats_another_reuses_its_runs(tmp_path, monkeypatch, capsys):
    """Table 3's MLM + ISP + SMRM is clipvil_pretrain's default objective set: the CLIP-ViL Y runs, run once."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("train", overrides=["experiment=clipvil_pretrain"])
    aliased = tables.ROW_BY_KEY["clipvil/mlm_isp_smrm"]
    assert aliased.same_as == "clipvil/Y"
    assert cfg.model.objectives.enabled == aliased.pretrain[-1].split("=", 1)[1]  # the alias holds
    assert tables.ROW_BY_KEY["clipvil/Y"].pretrain == ("experiment=clipvil_pretrain",)
    calls = []
    monkeypatch.setattr(tables, "_train", _fake_train(calls))
    assert tables.main(["--seeds", "1", "--out", str(tmp_path), "--rows", "clipvil/Y", "clipvil/mlm_isp_smrm"]) == 0
    assert [log for log, _ in calls] == ["pretrain.log", "finetune.log"]  # one pretraining, one fine-tuning
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["clipvil-Y"]
    out = capsys.readouterr().out
    assert "clipvil/mlm_isp_smrm (Table 3: MLM + ISP + SMRM, the runs of clipvil/Y)" in out
    summary = json.loads(out.splitlines()[-1][len(tables.MARKER):])
    assert summary["clipvil/mlm_isp_smrm/pmr"] == summary["clipvil/Y/pmr"]


def test_text_rows_pretrain_the_encoder_their_fine_tuning_loads(tmp_path, monkeypatch):
    """On the synthetic worlds text/N fine-tunes the single-stream encoder without images; text/Y must
    pretrain that encoder (roberta_pretrain's plain text encoder has no step embedding: its encoder.pt did
    not load), and on ROCStories both stages use the plain text encoder."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    calls = []
    monkeypatch.setattr(tables, "_train", _fake_train(calls))
    tables.run_row(tables.ROW_BY_KEY["text/Y"], 1, tmp_path / "hard", "synthetic_hard", [])
    tables.run_row(tables.ROW_BY_KEY["text/Y"], 1, tmp_path / "roc", "roc", [])
    encoders = []
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        for _, overrides in calls:
            cfg = compose("train", overrides=[o for o in overrides if not o.startswith("model.encoder.ckpt=")])
            encoders.append(OmegaConf.to_container(cfg.model.encoder, resolve=True))
    pre, ft, roc_pre, roc_ft = encoders
    for a, b in ((pre, ft), (roc_pre, roc_ft)):
        # init / trainability, and what fine-tuning keeps of the layers pretraining added (ckpt_new_layers)
        same = {k for k in set(a) | set(b) if k not in ("step_init_std", "visual", "ckpt_new_layers")}
        assert {k: a.get(k) for k in same} == {k: b.get(k) for k in same}
    assert ft["modality"] == "text" and ft["step_embedding"] is True and roc_ft["name"] == "text"
    assert (pre["ckpt_new_layers"], ft["ckpt_new_layers"]) == ("keep", "fresh")   # the added layers drawn afresh
    assert calls[0][1][0] == "experiment=clipvil_pretrain" and calls[2][1][0] == "experiment=roberta_pretrain"


def test_a_relative_and_an_absolute_out_name_the_same_runs(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(tables, "_train", _fake_train(calls))
    monkeypatch.chdir(tmp_path)
    row = tables.ROW_BY_KEY["clipvil/Y"]
    tables.run_row(row, 1, Path("o"), "synthetic_hard", [])
    assert calls[1][1][-1] == f"model.encoder.ckpt={tmp_path / 'o/clipvil-Y/seed1/pretrain/encoder.pt'}"
    tables.run_row(row, 1, tmp_path / "o", "synthetic_hard", [])
    assert len(calls) == 2   # both runs reused


@pytest.mark.slow  # four tiny train.py runs (two rows of two stages): about 40 s on 2 cores
def test_tiny_tables_run_then_resume_without_training(tmp_path, cache_dir):
    out = tmp_path / "tables"
    cmd = [sys.executable, str(ROOT / "scripts" / "studies" / "wu2022_tables.py"), "--seeds", "1", "--out", str(out), "--jobs", "2",
           "--rows", "clipvil/Y", "text/Y", "--", f"paths.cache_dir={cache_dir}", *TINY]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert (out / "clipvil-Y" / "seed1" / "pretrain" / "encoder.pt").is_file()
    assert "Table 2 (ours; synthetic_hard" in first.stdout and "| Multimodal | CLIP-ViL Y |" in first.stdout
    line = [x for x in first.stdout.splitlines() if x.startswith(tables.MARKER)][-1]
    summary = json.loads(line[len(tables.MARKER):])
    assert set(summary) == {f"{row}/{m}" for row in ("clipvil/Y", "text/Y")
                            for m, _, _ in tables.METRICS}
    assert 0.0 <= summary["clipvil/Y/pmr"]["mean"] <= 100.0 and summary["clipvil/Y/pmr"]["n"] == 1
    # the same command again: every run is reused, nothing trains, the same figures come out
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert " s\n" not in again.stdout  # no "<run>: N s" line: no train.py process ran
    assert [x for x in again.stdout.splitlines() if x.startswith(tables.MARKER)][-1] == line


def _fake_train(calls):
    """A stand-in for ``train.py``: records the overrides and writes what a finished run leaves."""
    def train(overrides, run_dir, log_name):
        calls.append((log_name, list(overrides)))
        (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
        (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        if log_name == "pretrain.log":
            (run_dir / "encoder.pt").write_bytes(b"")
            (run_dir / "run.json").write_text(json.dumps({"status": "finished"}))
        else:
            (run_dir / "test_metrics.json").write_text(json.dumps(_metrics(0.5, 0.25)))
    return train


def test_pretraining_budget_comes_before_the_users_overrides_and_finetune_overrides_reach_finetuning_only(
        tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(tables, "_train", _fake_train(calls))
    row = {r.key: r for r in tables.ROWS}["text/Y"]
    budget = tuple(tables.pretrain_budget(600, 16))
    metrics = tables.run_row(row, 3, tmp_path, "roc", ["trainer.max_steps=7"], budget,
                             ("trainer.limit_test_batches=2",))
    assert metrics["test/pmr"] == 0.25
    (pre_log, pre), (ft_log, ft) = calls
    assert pre_log == "pretrain.log" and ft_log == "finetune.log"
    assert pre == ["experiment=roberta_pretrain", "trainer.max_steps=600", "trainer.max_epochs=-1",
                   "data.batch_size=16", "seed=3", "data=roc", "trainer.max_steps=7"]  # the user's comes last: it wins
    assert ft[0] == "experiment=berson_roc"  # ROCStories fine-tunes with its own experiment
    assert ft[-1] == f"model.encoder.ckpt={tmp_path / 'text-Y' / 'seed3' / 'pretrain' / 'encoder.pt'}"
    assert "trainer.limit_test_batches=2" in ft and "trainer.limit_test_batches=2" not in pre
    tables.run_row({r.key: r for r in tables.ROWS}["text/N"], 3, tmp_path / "hard", "synthetic_hard", [])
    assert calls[-1][1][:2] == ["experiment=berson_finetune", "modality=text"]  # the synthetic worlds' fine-tuning
    # the finished runs are reused: nothing trains again
    calls.clear()
    assert tables.run_row(row, 3, tmp_path, "roc", ["trainer.max_steps=7"], budget,
                          ("trainer.limit_test_batches=2",)) == metrics
    assert calls == []
    # ... also without the encoder (runs copied back from another machine leave encoder.pt behind)
    (tmp_path / "text-Y" / "seed3" / "pretrain" / "encoder.pt").unlink()
    assert tables.run_row(row, 3, tmp_path, "roc", ["trainer.max_steps=7"], budget,
                          ("trainer.limit_test_batches=2",)) == metrics
    assert calls == []
    # but a fine-tuning that has not finished needs its encoder: the pretraining runs again
    (tmp_path / "text-Y" / "seed3" / "finetune" / "test_metrics.json").unlink()
    tables.run_row(row, 3, tmp_path, "roc", ["trainer.max_steps=7"], budget, ("trainer.limit_test_batches=2",))
    assert [log for log, _ in calls] == ["pretrain.log", "finetune.log"]


def test_a_folder_made_with_other_overrides_is_an_error_not_reused(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(tables, "_train", _fake_train(calls))
    row = {r.key: r for r in tables.ROWS}["clipvil/Y"]
    tables.run_row(row, 1, tmp_path, "synthetic_hard", [], tuple(tables.pretrain_budget(100, 4)))
    with pytest.raises(SystemExit) as err:  # the same folder, another pretraining budget
        tables.run_row(row, 1, tmp_path, "synthetic_hard", [], tuple(tables.pretrain_budget(600, 16)))
    message = str(err.value)
    assert str(tmp_path / "clipvil-Y" / "seed1" / "pretrain") in message
    assert "trainer.max_steps=100" in message and "trainer.max_steps=600" in message and "another --out" in message
    with pytest.raises(ValueError, match="must be positive"):
        tables.pretrain_budget(0, 16)


def test_jobs_run_each_row_and_seed_once_concurrently_with_the_same_tables(tmp_path, monkeypatch, capsys):
    import threading
    import time

    running, peak, ran, lock = [0], [0], [], threading.Lock()

    def fake_run_row(row, seed, out, data, overrides, budget, finetune_only):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            ran.append((row.key, seed))
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return _metrics(50.0 + seed, 0.1 * seed + (0.5 if row.pretrain else 0.0))

    monkeypatch.setattr(tables, "run_row", fake_run_row)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    rows = ["clipvil/N", "clipvil/Y", "clipvil/mlm_isp_smrm", "text/N"]
    outputs = []
    for jobs in ("1", "4"):
        ran.clear(), peak.__setitem__(0, 0)
        assert tables.main(["--seeds", "1", "2", "--out", str(tmp_path), "--rows", *rows, "--jobs", jobs]) == 0
        outputs.append(capsys.readouterr().out.splitlines()[-1])
        assert sorted(ran) == sorted((r, s) for r in ("clipvil/N", "clipvil/Y", "text/N") for s in (1, 2))  # the alias: once
        assert ran[:2] == [("clipvil/Y", 1), ("clipvil/Y", 2)]  # the runs that pretrain start first
        assert peak[0] == int(jobs)
    assert outputs[0] == outputs[1]  # the same table whatever the parallelism
    assert tables.thread_env(1) == {}
    assert tables.thread_env(4, cpus=16) == {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}
    assert tables.thread_env(14, cpus=2)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert tables.thread_env(4, cpus=16)["OMP_NUM_THREADS"] == "3"  # the user's setting wins
    with pytest.raises(SystemExit):
        tables.main(["--jobs", "0"])
    # a failed run stops the script: no run starts after it (the one running beside it finishes)
    def failing_run_row(row, seed, *args):
        with lock:
            ran.append((row.key, seed))
        if (row.key, seed) == ("clipvil/Y", 1):
            time.sleep(0.1)  # the second job has started beside it
            raise SystemExit("train.py failed")
        time.sleep(0.2)
        return _metrics(50.0, 0.5)

    monkeypatch.setattr(tables, "run_row", failing_run_row)
    for jobs, expected in (("1", [("clipvil/Y", 1)]), ("2", [("clipvil/Y", 1), ("clipvil/Y", 2)])):
        ran.clear()
        with pytest.raises(SystemExit, match="train.py failed"):
            tables.main(["--seeds", "1", "2", "--out", str(tmp_path), "--rows", *rows, "--jobs", jobs])
        assert sorted(ran) == expected


def test_text_only_data_runs_the_text_rows_only(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(tables, "run_row", lambda row, seed, out, data, overrides, budget, finetune_only: ran.append(
        (row.key, seed, data, budget, finetune_only)) or _metrics(0.5, 0.2))
    assert tables.main(["--data", "roc", "--seeds", "1", "--out", str(tmp_path), "--pretrain-steps", "50",
                        "--pretrain-override", "trainer.val_check_interval=10",
                        "--finetune-override", "trainer.limit_test_batches=2"]) == 0
    budget = ("trainer.max_steps=50", "trainer.max_epochs=-1", "data.batch_size=16", "trainer.val_check_interval=10")
    assert ran == [(key, 1, "roc", budget, ("trainer.limit_test_batches=2",)) for key in ("text/Y", "text/N")]  # pretraining rows first
    assert "Table 2 (ours; roc," in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tables.main(["--data", "roc", "--rows", "text/N", "clipvil/N"])
    assert "data=roc is text-only: its rows are text/N text/Y" in capsys.readouterr().err
