"""train.py end to end on tiny synthetic data: every experiment's fast_dev_run, resume, predictions."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

import train

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))
# experiments whose own test module runs their fast_dev_run (other tasks, other metrics)
COVERED_ELSEWHERE = {
    "clipvil_pretrain": "test_pretraining.py", "visualbert_pretrain": "test_pretraining.py",
    "roberta_pretrain": "test_pretraining.py", "clip_image_pretrain": "test_pretraining.py",
    "teo_lora_internvl": "test_teo_lora.py", "teo_lora_modalities": "test_teo_lora.py",
    "teo_lora_synthetic": "test_teo_lora.py",
    "teo_head_rfg": "test_teo_head.py", "teo_head_synthetic": "test_teo_head.py",
    "teo_plan_head_rfg": "test_teo_plan_head.py", "teo_plan_head_synthetic": "test_teo_plan_head.py",
}
# extra overrides that keep an experiment tiny beyond conftest's tiny synthetic world
TINY_EXTRA = {
    "berson_roc": ["data.source.max_stories=60", "data.eval_batch_size=8"],
    "berson_finetune": ["data.collator.image_size=64", "model.beam_size=4"],
}
SEQUENCING = [pytest.param(e, marks=pytest.mark.shared_data) if e == "berson_roc" else e
              for e in EXPERIMENTS if e not in COVERED_ELSEWHERE]


@pytest.mark.parametrize("experiment", SEQUENCING)
def test_fast_dev_run_every_experiment(compose_train, experiment, caplog):
    cfg = compose_train(f"experiment={experiment}", "trainer.fast_dev_run=true", *TINY_EXTRA.get(experiment, []))
    metrics = train.run(cfg)
    for key in ("acc", "pmr", "dist", "lcs", "lcstr", "tau"):  # the keys every sequencing experiment reports
        assert f"test/{key}" in metrics
    assert 0.0 <= metrics["test/pmr"] <= 1.0
    assert "testing the current weights" in caplog.text  # fast_dev_run saves no checkpoint


@pytest.mark.parametrize("experiment", sorted(COVERED_ELSEWHERE))
def test_other_experiments_have_their_fast_dev_run_elsewhere(experiment):
    if experiment not in EXPERIMENTS:
        pytest.fail(f"COVERED_ELSEWHERE lists {experiment!r} but configs/experiment/{experiment}.yaml does not exist")
    source = (ROOT / "tests" / COVERED_ELSEWHERE[experiment]).read_text()
    assert f"experiment={experiment}" in source or f'"{experiment}"' in source


def test_mistyped_key_fails_with_hydras_error(compose_train):
    with pytest.raises((ConfigCompositionException, ConfigAttributeError, ConfigKeyError)):
        compose_train("experiment=order_baseline", "trainer.max_epochz=3")
    with pytest.raises(ConfigCompositionException):
        compose_train("experiment=order_baseline", "model=not_a_model")


def test_wu2022_preset_rows(compose_train):
    cfg = compose_train("experiment=order_baseline", "hparams=wu2022")
    assert cfg.model.optimizer._target_ == "torch.optim.AdamW" and cfg.model.optimizer.weight_decay == 0.0  # tests/test_wu2022_preset.py
    assert cfg.model.optimizer.lr == 5e-6 and cfg.trainer.max_epochs == 10 and cfg.data.batch_size == 4
    cfg = compose_train("experiment=order_baseline", "hparams=wu2022", "stage=pretrain")
    assert cfg.model.optimizer.lr == 1e-5 and cfg.trainer.max_epochs == 5
    cfg = compose_train("experiment=order_baseline", "hparams=wu2022", "stage=finetune_text")
    assert cfg.model.optimizer.lr == 5e-6 and cfg.trainer.max_epochs == 5
    # Wu et al.: no step-index embedding; the visual tokens' positions run over the images instead
    plain = compose_train("experiment=clipvil_pretrain")
    assert plain.model.encoder.step_embedding is True and plain.model.encoder.visual_positions == "image"
    cfg = compose_train("experiment=clipvil_pretrain", "hparams=wu2022")
    assert cfg.model.encoder.step_embedding is False and cfg.model.encoder.visual_positions == "sequence"
    assert "encoder" not in compose_train("experiment=order_baseline", "hparams=wu2022").model


def _short_run(compose_train, *extra):
    return compose_train("experiment=order_baseline", "trainer.max_epochs=2", "trainer.limit_train_batches=2",
                         "trainer.limit_val_batches=1", "data.batch_size=4", "model.net.dim=32",
                         "data.collator.image_size=32", *extra)


def test_fit_test_writes_best_checkpoint_and_predictions(compose_train, caplog):
    caplog.set_level(logging.INFO, logger="seqaware.train")
    cfg = _short_run(compose_train)
    metrics = train.run(cfg)
    out = Path(cfg.paths.output_dir)
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert "testing the best checkpoint" in caplog.text
    lines = (out / cfg.predictions_file).read_text().splitlines()
    assert len(lines) == 8  # tiny test split
    record = json.loads(lines[0])
    assert sorted(record["pred"]) == sorted(record["gold"]) and record["references"][0] == record["gold"]
    assert set(record["metrics"]) == {"acc", "pmr", "dist", "lcs", "lcstr", "tau"}
    for key in ("acc", "pmr", "dist", "lcs", "lcstr", "tau"):
        assert f"test/{key}" in metrics
    assert (out / "csv" / "metrics.csv").is_file()


def test_resume_is_exact(compose_train, tmp_path):
    """2 epochs straight == 1 epoch, stop, resume from last.ckpt for the 2nd epoch."""
    full = _short_run(compose_train, "test=false")
    train.run(full)
    straight = torch.load(Path(full.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)

    first = _short_run(compose_train, "test=false", "trainer.max_epochs=1", f"paths.output_dir={tmp_path / 'a'}")
    train.run(first)
    ckpt = tmp_path / "a" / "checkpoints" / "last.ckpt"
    resumed_cfg = _short_run(compose_train, "test=false", f"ckpt_path={ckpt}", f"paths.output_dir={tmp_path / 'b'}")
    train.run(resumed_cfg)
    resumed = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=True)

    assert resumed["global_step"] == straight["global_step"] == 4
    for key, value in straight["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][key], value, rtol=0, atol=0, msg=key)


def test_checkpoint_loads_on_its_own(compose_train):
    from seqaware.modules.sequencing import PairwiseSequencingModule

    cfg = _short_run(compose_train, "test=false", "trainer.max_epochs=1")
    train.run(cfg)
    model = PairwiseSequencingModule.load_from_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")
    assert model.net.modality == "multimodal"


@pytest.mark.slow
def test_main_entry_point_runs_as_a_script(tmp_path, cache_dir):
    from conftest import TINY_SYNTHETIC

    over = [f"data.source.{k}={v}" for k, v in TINY_SYNTHETIC.items()]
    cmd = [sys.executable, str(ROOT / "train.py"), "experiment=order_baseline", "trainer.max_epochs=1",
           f"paths.cache_dir={cache_dir}", f"hydra.run.dir={tmp_path / 'run'}", "data.collator.image_size=32", *over]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "test/pmr:" in res.stdout
    assert (tmp_path / "run" / "predictions_test.jsonl").is_file()


@pytest.mark.parametrize("logger", ["tensorboard", "wandb"])
def test_other_loggers(compose_train, logger, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    extra = ["logger.wandb.offline=true"] if logger == "wandb" else []
    # not fast_dev_run: Lightning swaps the loggers for a dummy under it
    cfg = compose_train("experiment=order_baseline", f"logger={logger}", "trainer.max_epochs=1", "trainer.limit_train_batches=1",
                        "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", *extra)
    train.run(cfg)
    out = Path(cfg.paths.output_dir)
    if logger == "wandb":
        runs = list(out.glob("wandb/offline-run-*"))
        assert len(runs) == 1, "expected exactly one offline W&B run"
        assert list(runs[0].glob("*.wandb")), "the offline run holds no data"
    else:
        assert list((out / "tensorboard").rglob("events.out.tfevents.*"))


@pytest.mark.slow
def test_ddp_two_cpu_processes_one_run_folder(tmp_path, cache_dir):
    """2-process gloo DDP: one run folder, one predictions file holding every test procedure once."""
    from conftest import TINY_SYNTHETIC

    over = [f"data.source.{k}={v}" for k, v in TINY_SYNTHETIC.items()]
    logs = tmp_path / "logs"
    cmd = [sys.executable, str(ROOT / "train.py"), "experiment=order_baseline", "trainer=ddp", "trainer.accelerator=cpu",
           "trainer.devices=2", "trainer.max_epochs=1", "data.batch_size=4", "data.collator.image_size=32",
           f"paths.cache_dir={cache_dir}", f"paths.log_dir={logs}", "callbacks.progress_bar.refresh_rate=0", *over]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    runs = list((logs / "order_baseline" / "runs").iterdir())
    assert len(runs) == 1, runs
    preds = [json.loads(line) for line in (runs[0] / "predictions_test.jsonl").read_text().splitlines()]
    assert len(preds) == TINY_SYNTHETIC["num_test"] == len({p["id"] for p in preds})
    assert res.stdout.count("TEST_METRICS_JSON") == 1
