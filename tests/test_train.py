"""train.py end to end on tiny synthetic data: every experiment's fast_dev_run (one table), resume, predictions."""
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
from conftest import TINY_BERT, tiny_pretrain

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))

SEQUENCING = ("acc", "pmr", "dist", "lcs", "lcstr", "tau")
TEO = ("teo_consistency_accuracy", "majority_consistency_accuracy")
CATBENCH = ("catbench_accuracy", "catbench_f1_yes", "catbench_macro_f1", "catbench_twin_consistency")
RATES = {"acc", "pmr", *TEO, *CATBENCH}
TINY_PLAN_HEAD = [f"model.encoder.config={TINY_BERT}", "model.encoder.config.max_position_embeddings=512",  # 512-token plan windows
                  "model.step_dim=16", "model.pair_hidden=16", "model.step_heads=2"]


def _pretraining_run(*objectives: str):
    def check(cfg, metrics):
        assert cfg.data.task == "pretraining" and cfg.stage == "pretrain"
        assert "train/loss" in metrics  # one step: MLM (when enabled) + the one objective drawn for it
        for name in objectives:  # evaluation runs every enabled objective
            assert f"val/{name}_loss" in metrics and 0.0 <= metrics[f"test/{name}_acc"] <= 1.0, (name, sorted(metrics))
        assert (Path(cfg.paths.output_dir) / "encoder.pt").is_file()
    return check


def _plan_head_rfg(cfg, metrics):
    assert metrics["test/catbench_twin_consistency"] == 1.0  # mirrored logits: the twins always agree
    lines = (Path(cfg.paths.output_dir) / "predictions_test.jsonl").read_text().splitlines()
    assert len({json.loads(line)["id"] for line in lines}) == len(lines) == int(metrics["test/n"])


def _plan_head_catbench(cfg, metrics):
    assert metrics["test/catbench_twin_consistency"] == metrics["test/all_pairs/catbench_twin_consistency"] == 1.0
    assert metrics["test/n"] == 748 and metrics["test/all_pairs/n"] == 1404      # the paper's questions, then all pairs
    assert 0.0 <= metrics["test/lr_baseline_macro_f1"] <= 1.0 and "test/cv_macro_f1_mean" in metrics
    out = Path(cfg.paths.output_dir)
    cv = json.loads((out / "cv_results.json").read_text())
    assert list(cv["rows"]) == ["defaults", "logistic regression"] and cv["winner_name"] == "defaults"
    assert len(cv["rows"]["defaults"]["folds"]) == 3 and cv["winner"] in cv["settings"]
    lines = [json.loads(line) for line in (out / "predictions_test.jsonl").read_text().splitlines()]
    assert len({(p["set"], p["id"]) for p in lines}) == len(lines) == 748 + 1404


def _teo_lora(cfg, metrics):
    assert cfg.callbacks.model_checkpoint.monitor == "val/teo_consistency_accuracy"
    assert metrics["test/teo_num_pairs"] >= 1 and "val/teo_consistency_accuracy" in metrics


# Every shipped experiment: the overrides that keep its fast_dev_run tiny (on top of conftest's tiny
# world), the test metrics it must report, and what else a user relies on.
SMOKE = {
    "order_baseline": ([], SEQUENCING, None),
    "berson_finetune": (["data.collator.image_size=64", "model.beam_size=4"], SEQUENCING, None),
    "berson_roc": (["data.source.max_stories=60", "data.eval_batch_size=8"], SEQUENCING, None),
    "roberta_pretrain": (tiny_pretrain(), (), _pretraining_run("mlm")),
    "clipvil_pretrain": (tiny_pretrain(), (), _pretraining_run("mlm", "isp", "smrm")),
    "visualbert_pretrain": (tiny_pretrain(), (), _pretraining_run("mlm", "isp", "smrm")),
    "clip_image_pretrain": (tiny_pretrain(), (), _pretraining_run("isp", "pisp", "smrm")),
    "teo_head_rfg": (["data.batch_size=8"], CATBENCH, None),
    "teo_head_synthetic": (["data.batch_size=8"], TEO, None),
    "teo_plan_head_rfg": (TINY_PLAN_HEAD, CATBENCH, _plan_head_rfg),
    "teo_plan_head_catbench": ([f"model.encoder.config={TINY_BERT}", "model.members=1", "model.cv_grid=[{}]",
                                "data.cv_folds=3", "data.eval_batch_size=32"],  # fast_dev_run tests one batch: all 26 test plans
                               CATBENCH, _plan_head_catbench),
    "teo_plan_head_synthetic": (TINY_PLAN_HEAD, TEO, lambda cfg, m: 0.05 <= m["test/threshold"] <= 0.95),
    "teo_lora_internvl": (["model=internvl_tiny"], ("teo_consistency_accuracy",), _teo_lora),
    "teo_lora_modalities": (["model=internvl_tiny", "data.modality=text"], ("teo_consistency_accuracy",), _teo_lora),
    "teo_lora_synthetic": (["data.eval_batch_size=4"], ("teo_consistency_accuracy",), _teo_lora),
}
# slow: the full suite (CI) runs them; the fast loop (-m "not slow") skips the longest smoke runs
MARKS = {"berson_roc": [pytest.mark.shared_data, pytest.mark.slow], "berson_finetune": [pytest.mark.slow],
         "teo_lora_modalities": [pytest.mark.slow], "teo_head_rfg": [pytest.mark.shared_data, pytest.mark.slow],
         "teo_plan_head_rfg": [pytest.mark.shared_data], "teo_plan_head_catbench": [pytest.mark.shared_data],
         "clipvil_pretrain": [pytest.mark.slow],
         "visualbert_pretrain": [pytest.mark.slow], "clip_image_pretrain": [pytest.mark.slow],
         "teo_lora_synthetic": [pytest.mark.slow]}
# extra overrides beyond the tiny world (test_wu2022_preset reuses them)
TINY_EXTRA = {name: overrides for name, (overrides, _, _) in SMOKE.items()}


def test_every_shipped_experiment_has_a_smoke_run():
    assert sorted(SMOKE) == EXPERIMENTS, "add the new experiment to SMOKE (or remove the stale entry)"


@pytest.mark.parametrize("experiment", [pytest.param(e, marks=MARKS.get(e, [])) for e in sorted(SMOKE)])
def test_fast_dev_run_every_experiment(compose_train, experiment, caplog):
    overrides, keys, check = SMOKE[experiment]
    caplog.set_level(logging.INFO, logger="seqaware.train")
    cfg = compose_train(f"experiment={experiment}", "trainer.fast_dev_run=true", *overrides)
    metrics = train.run(cfg)
    for key in keys:
        assert f"test/{key}" in metrics, (key, sorted(metrics))
        if key in RATES:
            assert 0.0 <= metrics[f"test/{key}"] <= 1.0, key
    assert all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values()), metrics
    assert "testing the current weights" in caplog.text  # fast_dev_run saves no checkpoint
    if check is not None:
        assert check(cfg, metrics) is not False


def test_mistyped_key_fails_with_hydras_error(compose_train):
    with pytest.raises((ConfigCompositionException, ConfigAttributeError, ConfigKeyError)):
        compose_train("experiment=order_baseline", "trainer.max_epochz=3")
    with pytest.raises(ConfigCompositionException):
        compose_train("experiment=order_baseline", "model=not_a_model")


@pytest.mark.slow  # 3 s; fast loop budget: the full suite (CI) runs it
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


@pytest.mark.slow  # 6 s for both; fast loop budget: the full suite (CI) runs it
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
