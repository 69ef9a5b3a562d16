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
from conftest import TINY_BERT, TINY_MPNET, tiny_pretrain
from seqaware.metrics.ordering import order_keys

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))

SEQUENCING = order_keys()  # every sequencing metric (seqaware.metrics.ordering.SEQUENCING_METRICS)
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
# world: a 1-layer 32-wide random BERT where the experiment would load MiniLM, few generated tokens), the
# test metrics it must report, and what else a user relies on.
TINY_TEXT = [f"model.encoder.config={TINY_BERT}"]
SHORT_ANSWERS = ["model.max_new_tokens=4"]  # generation is most of a LoRA smoke run; the metrics need no parsed answer
SMOKE = {
    "order_baseline": ([], SEQUENCING, None),
    "berson_finetune": (["data.collator.image_size=64", "model.beam_size=4", *TINY_TEXT], SEQUENCING, None),
    "berson_roc": (["data.source.max_stories=60", "data.eval_batch_size=8", *TINY_TEXT], SEQUENCING, None),
    "roberta_pretrain": (tiny_pretrain(), (), _pretraining_run("mlm")),
    "clipvil_pretrain": (tiny_pretrain(), (), _pretraining_run("mlm", "isp", "smrm")),
    "visualbert_pretrain": (tiny_pretrain(), (), _pretraining_run("mlm", "isp", "smrm")),
    "clip_image_pretrain": (tiny_pretrain(), (), _pretraining_run("isp", "pisp", "smrm")),
    "teo_head_rfg": (["data.batch_size=8", *TINY_TEXT], CATBENCH, None),
    "teo_head_synthetic": (["data.batch_size=8", *TINY_TEXT], TEO, None),
    "teo_plan_head_rfg": (TINY_PLAN_HEAD, CATBENCH, _plan_head_rfg),
    "teo_plan_head_catbench": ([f"model.encoder.config={TINY_BERT}", "model.members=1", "model.cv_grid=[{}]",
                                "data.cv_folds=3", "data.eval_batch_size=32"],  # fast_dev_run tests one batch: all 26 test plans
                               CATBENCH, _plan_head_catbench),
    "teo_plan_head_synthetic": (TINY_PLAN_HEAD, TEO, lambda cfg, m: 0.05 <= m["test/threshold"] <= 0.95),
    "teo_lora_internvl": (["model=internvl_tiny", *SHORT_ANSWERS], ("teo_consistency_accuracy",), _teo_lora),
    "teo_lora_modalities": (["model=internvl_tiny", "data.modality=text", *SHORT_ANSWERS], ("teo_consistency_accuracy",), _teo_lora),
    "teo_lora_synthetic": (["data.batch_size=1", "data.eval_batch_size=2", *SHORT_ANSWERS], ("teo_consistency_accuracy",), _teo_lora),
}
# slow: the full suite (CI) runs them; the fast loop (-m "not slow") skips the longest smoke runs
MARKS = {"berson_roc": [pytest.mark.shared_data, pytest.mark.slow], "berson_finetune": [pytest.mark.slow],
         "teo_lora_modalities": [pytest.mark.slow], "teo_head_rfg": [pytest.mark.shared_data, pytest.mark.slow],
         "teo_plan_head_rfg": [pytest.mark.shared_data], "teo_plan_head_catbench": [pytest.mark.shared_data],
         "clipvil_pretrain": [pytest.mark.slow],
         "visualbert_pretrain": [pytest.mark.slow], "clip_image_pretrain": [pytest.mark.slow],
         "teo_lora_synthetic": [pytest.mark.slow]}
# Options of a shipped experiment that fast-dev-run too (defaults only, both precisions): name -> (experiment,
# overrides on top of its SMOKE entry, marks of the 32-true run; bf16-mixed is slow as the base experiment's runs).
VARIANTS = {"berson_finetune_joint": ("berson_finetune", ["model.pair_encoding=joint"], []),  # one pass per procedure: cheap
            # the joint path's options: BERT4SO segments, 3 test views (voted in test_step), length buckets
            "berson_roc_joint_options": ("berson_roc", ["model.pair_encoding=joint", "model.joint_segments=alternating",
                                                        "model.test_views=3", "data.bucket_by_length=true"],
                                         [pytest.mark.shared_data]),
            # a base-size encoder's code paths on a tiny random MPNet (no token types, no SDPA kernel): BERSON's
            # pairwise and joint encodings, the TEO encoder heads, text pretraining
            "berson_roc_mpnet": ("berson_roc", [f"model.encoder.config={TINY_MPNET}"], [pytest.mark.shared_data]),
            "berson_roc_joint_mpnet": ("berson_roc", [f"model.encoder.config={TINY_MPNET}", "model.pair_encoding=joint"],
                                       [pytest.mark.shared_data]),
            "teo_head_synthetic_mpnet": ("teo_head_synthetic", [f"model.encoder.config={TINY_MPNET}"], []),
            "teo_plan_head_synthetic_mpnet": ("teo_plan_head_synthetic", [f"model.encoder.config={TINY_MPNET}"], []),
            "roberta_pretrain_mpnet": ("roberta_pretrain", [f"model.encoder.config={TINY_MPNET}"], []),
            "berson_finetune_mpnet": ("berson_finetune", [f"model.encoder.config={TINY_MPNET}"], [pytest.mark.slow]),
            # BERSON's head as released (docs/protocols/berson.md) on both pair encodings
            "berson_finetune_paper": ("berson_finetune", ["model.decoder.variant=paper"], []),
            "berson_finetune_paper_joint": ("berson_finetune", ["model.decoder.variant=paper", "model.pair_encoding=joint"],
                                            [])}
# extra overrides beyond the tiny world (test_wu2022_preset reuses them)
TINY_EXTRA = {name: overrides for name, (overrides, _, _) in SMOKE.items()}
# Every preset (configs/hparams/) and the experiments it is made for: each pair fast-dev-runs too.
PRESETS = {
    "wu2022": ("order_baseline", "berson_finetune", "berson_roc", "roberta_pretrain", "clipvil_pretrain",
               "visualbert_pretrain", "clip_image_pretrain"),
    # the InternVL3.5-8B recipe; teo_lora_synthetic has its own (lr 1e-3, 3 epochs) and shares their module
    "mateo": ("teo_lora_internvl", "teo_lora_modalities"),
    "mateo_fast": ("teo_lora_internvl", "teo_lora_modalities"),
    "roc_joint": ("berson_roc",),
    "roc_joint_large": ("berson_roc",),
    "roc_base": ("berson_roc",),
    "roc_base_b16": ("berson_roc",),
    "berson_roc_paper": ("berson_roc",),
    "berson_roc_paper_large": ("berson_roc",),
    "catbench_base": ("teo_plan_head_catbench",),
    "catbench_finetune": ("teo_plan_head_catbench",),
}
# On top of SMOKE's: the preset's 5-image pretraining sequences need more than the 4 patches of a 64-px grid
# for SMRM's masks to stay below 50% overlap (sec. 4.2.3; 16 at 128 px); the preset's own 224 px give 49.
PRESET_EXTRA = {"wu2022": ["data.collator.image_size=128"],
                # the base presets' code paths without the 400 MB: a tiny random MPNet with MiniLM's tokenizer, and
                # MiniLM's real weights under the name of the closure head's extra feature set
                # (test_base_presets_with_the_real_mpnet runs them on the real weights where installed)
                "roc_base": [f"model.encoder.config={TINY_MPNET}", "backbones.tokenizer=offline:minilm"],
                "roc_base_b16": [f"model.encoder.config={TINY_MPNET}", "backbones.tokenizer=offline:minilm"],
                "catbench_base": ["model.extra_features.mpnet=offline:minilm", "data.rfg_path=null"],
                # (catbench_finetune fine-tunes MPNet-base at every step: 50 s a step on 2 CPU cores, so the real
                # weights are not run here; catbench_base's test loads them)
                "catbench_finetune": [f"model.encoder.config={TINY_MPNET}", "backbones.tokenizer=offline:minilm",
                                      "data.rfg_path=null"]}
# Both precisions, forced: CI may run on a CPU without fast bf16, where auto_precision (berson_*, teo_head_*)
# picks 32-true and a bf16-only failure (fused AdamW + clipping under bf16-mixed, hparams=wu2022) would
# pass unseen; bf16 autocast runs on any x86 CPU, only slower. Precision-free params: the fast loop keeps
# the plain fp32 run of the cheap experiments, the full suite (CI) runs the whole matrix.
PRECISIONS = ("32-true", "bf16-mixed")


def _matrix():
    for experiment in sorted(SMOKE):
        for preset in (None, *[name for name, experiments in PRESETS.items() if experiment in experiments]):
            for precision in PRECISIONS:
                marks = list(MARKS.get(experiment, []))
                if (preset or precision != "32-true") and pytest.mark.slow not in marks:
                    marks.append(pytest.mark.slow)
                yield pytest.param(experiment, preset, precision, marks=marks,
                                   id=f"{experiment}-{preset or 'defaults'}-{precision}")
    for name, (experiment, _, fp32_marks) in sorted(VARIANTS.items()):
        for precision in PRECISIONS:
            marks = list(fp32_marks) if precision == "32-true" else list(MARKS.get(experiment, [pytest.mark.slow]))
            yield pytest.param(name, None, precision, marks=marks, id=f"{name}-defaults-{precision}")


def test_every_shipped_experiment_and_preset_has_a_smoke_run():
    assert sorted(SMOKE) == EXPERIMENTS, "add the new experiment to SMOKE (or remove the stale entry)"
    presets = sorted(p.stem for p in (ROOT / "configs" / "hparams").glob("*.yaml"))
    assert sorted(PRESETS) == presets, "add the new preset to PRESETS with the experiments it is made for"
    assert all(e in SMOKE for experiments in PRESETS.values() for e in experiments)


@pytest.mark.parametrize("experiment, preset, precision", list(_matrix()))
def test_fast_dev_run_every_experiment_preset_and_precision(compose_train, experiment, preset, precision, caplog):
    experiment, variant = VARIANTS.get(experiment, (experiment, [], []))[:2]
    overrides, keys, check = SMOKE[experiment]
    overrides = [*overrides, *variant]
    caplog.set_level(logging.INFO, logger="seqaware.train")
    cfg = compose_train(f"experiment={experiment}", *([f"hparams={preset}"] if preset else []), "trainer.fast_dev_run=true",
                        *overrides, *PRESET_EXTRA.get(preset, []), f"trainer.precision={precision}")
    metrics = train.run(cfg)
    for key in keys:
        assert f"test/{key}" in metrics, (key, sorted(metrics))
        if key in RATES:
            assert 0.0 <= metrics[f"test/{key}"] <= 1.0, key
    assert all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values()), metrics
    assert "testing the current weights" in caplog.text  # fast_dev_run saves no checkpoint
    if check is not None:
        assert check(cfg, metrics) is not False


@pytest.mark.mpnet
@pytest.mark.slow
@pytest.mark.shared_data
@pytest.mark.parametrize("experiment, preset, overrides", [
    ("berson_roc", "roc_base", ["data.source.max_stories=40", "data.eval_batch_size=8", "model.beam_size=2"]),
    ("berson_roc", "berson_roc_paper", ["backbones=base", "data.source.max_stories=40", "data.eval_batch_size=8",
                                        "model.beam_size=2"]),
    ("teo_plan_head_catbench", "catbench_base", ["model.members=1", "data.cv_folds=2", "data.eval_batch_size=32",
                                                 "data.rfg_path=null",
                                                 "trainer.max_epochs=3",
                                                 "model.cv_grid=[{features: encoder},{features: mpnet},{features: encoder+mpnet}]"]),
], ids=["roc_base", "berson_roc_paper", "catbench_base"])
def test_base_presets_with_the_real_mpnet(compose_train, experiment, preset, overrides):
    """The base presets on the real all-mpnet-base-v2 weights: BERSON's one-pass recipe takes a step and tests;
    the closure head cross-validates MiniLM, MPNet and both side by side (768 + 384 features)."""
    cfg = compose_train(f"experiment={experiment}", f"hparams={preset}", "trainer.fast_dev_run=true", *overrides)
    assert cfg.model.encoder.name_or_path == "offline:mpnet" or cfg.model.extra_features.mpnet == "offline:mpnet"
    if preset == "berson_roc_paper":   # pairwise encoding in the real tokenizer's pair format, <s> a </s></s> b </s>
        from seqaware.encoders.text import special_token_ids
        from seqaware.pretrained import load_tokenizer
        tok = load_tokenizer("offline:mpnet")
        assert special_token_ids(tok)["pair_sep_id"] == tok.sep_token_id
    metrics = train.run(cfg)
    assert all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values()), metrics
    if experiment == "teo_plan_head_catbench":
        cv = json.loads((Path(cfg.paths.output_dir) / "cv_results.json").read_text())
        assert list(cv["rows"]) == ["features=encoder", "features=mpnet", "features=encoder+mpnet", "logistic regression"]
        assert cv["winner"]["features"] in ("encoder", "mpnet", "encoder+mpnet")
    else:
        assert 0.0 <= metrics["test/pmr"] <= 1.0


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
    assert list(record["metrics"]) == list(order_keys())
    for key in order_keys():
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


def test_teo_pairs_read_prepared_jsonl_with_the_documented_override(compose_train, tiny_synthetic_dir):
    """The JSONL override written in configs/data/teo_pairs.yaml works as written (D = the folder)."""
    from hydra.utils import instantiate

    doc = (ROOT / "configs" / "data" / "teo_pairs.yaml").read_text()
    line = next(line for line in doc.splitlines() if "data.train_path=D/train.jsonl" in line)
    overrides = [o.replace("D/", f"{tiny_synthetic_dir}/") for o in line.lstrip("# ").split()]
    cfg = compose_train("experiment=teo_lora_internvl", "model=internvl_tiny", "data.modality=text", *overrides)
    datamodule = instantiate(cfg.data)
    assert datamodule.source.func.__name__ == "jsonl_source"
    datamodule.setup("fit")
    assert len(datamodule.datasets["train"]) > 0 and len(datamodule.datasets["val"]) > 0


def _main(monkeypatch, *args: str):
    """``python train.py ARGS`` in this process (Hydra's entry point, command line and all); returns
    what ``main`` returns to a sweeper. --config-path: imported, train.py would look for its configs
    as a Python package."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "train.py"), f"--config-path={ROOT / 'configs'}", *args])
    return train.main()


@pytest.mark.slow  # two tiny InternVL fits and tests
@pytest.mark.parametrize("limit, returned", [("trainer.max_steps=1", True), ("trainer.limit_val_batches=0", False)],
                         ids=["ends_before_the_first_validation", "validation_off"])
def test_optimized_metric_of_a_short_run_and_of_a_run_without_validation(tmp_path, cache_dir, monkeypatch, limit, returned):
    """teo_lora_* returns optimized_metric to sweepers. trainer.max_steps below the first validation still
    validates once at the end (FitLimits): a value. With validation off nothing logs it: the run is tested
    and finished, main returns None with a warning (exit code 0)."""
    from conftest import TINY_SYNTHETIC

    returned_values = []  # what main hands a sweeper (Hydra's decorated main itself returns None)
    real = train.optimized_value

    def optimized_value(cfg, metrics):
        returned_values.append(real(cfg, metrics))
        return returned_values[-1]

    monkeypatch.setattr(train, "optimized_value", optimized_value)
    _main(monkeypatch, "experiment=teo_lora_internvl", "model=internvl_tiny", "trainer=cpu",
                  "trainer.precision=32-true", "data.modality=text", "trainer.max_steps=1", limit, "data.max_train_pairs=8",
                  "data.max_eval_pairs=2", "data.eval_batch_size=2", "model.max_new_tokens=4",
                  "trainer.num_sanity_val_steps=0", f"paths.cache_dir={cache_dir}",
                  f"hydra.run.dir={tmp_path / 'run'}", "callbacks.progress_bar.refresh_rate=0",
                  *[f"data.source.{k}={v}" for k, v in TINY_SYNTHETIC.items()])
    log_text = (tmp_path / "run" / "train.log").read_text()
    [value] = returned_values
    if returned:
        assert 0.0 <= value <= 1.0 and "was not logged" not in log_text
    else:
        assert value is None
        assert ("optimized_metric=val/teo_consistency_accuracy was not logged, so this run returns no value to a sweeper "
                "(logged: train/loss). Was validation off (trainer.limit_val_batches=0), or does the model log it under "
                "another name?") in log_text
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"
    assert (tmp_path / "run" / "test_metrics.json").is_file()


def _tiny_world(tmp_path, cache_dir, **source) -> list[str]:
    """Command-line overrides of a tiny ``_main`` run in ``tmp_path/run`` (conftest's world, ``source`` on top)."""
    from conftest import TINY_SYNTHETIC

    return [f"paths.cache_dir={cache_dir}", f"hydra.run.dir={tmp_path / 'run'}", "callbacks.progress_bar.refresh_rate=0",
            "trainer.precision=32-true", "trainer.limit_test_batches=1",
            *[f"data.source.{k}={v}" for k, v in {**TINY_SYNTHETIC, **source}.items()]]


def _fit_steps(monkeypatch) -> list[int]:
    """The global step each fit of ``train.py`` in this test ended at."""
    steps = []

    def check(trainer, datamodule):
        steps.append(trainer.global_step)
        return real(trainer, datamodule)

    real = train.check_fit_saw_batches
    monkeypatch.setattr(train, "check_fit_saw_batches", check)
    return steps


def test_max_steps_alone_on_the_command_line_is_reached(tmp_path, cache_dir, monkeypatch):
    """berson_finetune's 1 epoch of 2 batches (6 procedures, batches of 4) would stop trainer.max_steps=3 at step 2:
    max_steps alone on the command line raises max_epochs and the run trains 3 steps."""
    steps = _fit_steps(monkeypatch)
    _main(monkeypatch, "experiment=berson_finetune", "trainer.max_steps=3", *SMOKE["berson_finetune"][0],
          "modality=text", *_tiny_world(tmp_path, cache_dir, num_train=6))  # text: the limits are the same, the steps cheaper
    assert steps == [3]
    log_text = (tmp_path / "run" / "train.log").read_text()
    assert ("trainer.max_steps=3 is on the command line and trainer.max_epochs is not: the config's "
            "trainer.max_epochs=1 is raised to 3 so that the run trains 3 steps") in log_text
    assert "will not be reached" not in log_text
    state = json.loads((tmp_path / "run" / "run.json").read_text())
    assert state["status"] == "finished" and Path(state["tested_checkpoint"]).name == "best_epoch_000.ckpt"


def test_max_steps_that_max_epochs_cuts_short_is_warned_about_at_the_start(tmp_path, cache_dir, monkeypatch):
    """Both limits on the command line: both stay, and the run says at its start that max_epochs ends it at step 2."""
    steps = _fit_steps(monkeypatch)
    _main(monkeypatch, "experiment=order_baseline", "trainer.max_steps=10", "trainer.max_epochs=1", "data.batch_size=4",
          "model.net.dim=32", "data.collator.image_size=32", *_tiny_world(tmp_path, cache_dir, num_train=8))
    assert steps == [2]
    log_text = (tmp_path / "run" / "train.log").read_text()
    assert ("trainer.max_steps=10 will not be reached: trainer.max_epochs=1 x 2 training batches per epoch (8 training "
            "samples at batch size 4) stops the run at step 2; raise trainer.max_epochs or set it to -1") in log_text
    assert "is on the command line" not in log_text


def test_a_pretraining_run_shorter_than_its_validation_interval_exports_its_best_encoder(compose_train, caplog):
    """trainer.max_steps=4 of a pretraining experiment (trainer.val_check_interval=50) validates once at its end:
    ModelCheckpoint keeps that best checkpoint, encoder.pt is exported from it and the test uses it."""
    cfg = compose_train("experiment=clipvil_pretrain", *tiny_pretrain(), "trainer.max_steps=4", "trainer.limit_test_batches=1")
    with caplog.at_level(logging.INFO):
        train.run(cfg)
    out = Path(cfg.paths.output_dir)
    best = out / "checkpoints" / "best_epoch_000.ckpt"
    assert torch.load(best, weights_only=True)["global_step"] == 4
    assert ("this fit ends after training batch 4 (trainer.max_steps), before its first validation (after batch 50: "
            "trainer.val_check_interval=50, trainer.check_val_every_n_epoch=None): it validates once at its end, so the "
            "best checkpoint is kept and tested") in caplog.text
    assert f"wrote the encoder weights (best checkpoint {best})" in caplog.text
    assert f"testing the best checkpoint {best}" in caplog.text and "no best checkpoint was saved" not in caplog.text
    assert json.loads((out / "run.json").read_text())["tested_checkpoint"] == str(best)


@pytest.mark.slow  # two tiny pretraining + fine-tuning pairs: about 30 s
def test_readme_main_job_runs_twice_in_one_clone(tmp_path, cache_dir, monkeypatch):
    """The README's first command as written (parsed from README.md), with tiny-size overrides appended
    to each stage, run twice: the second run is a new pair of runs, and its fine-tuning starts from the
    second pretraining's encoder (latest:clipvil_pretrain/encoder.pt), not the first's."""
    import shlex

    from conftest import TINY_SYNTHETIC

    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("pip install -r requirements.txt && python train.py"))
    stages = [shlex.split(part) for part in line.split(" && ")[1:]]
    assert [s[:2] for s in stages] == [["python", "train.py"]] * 2, line
    tiny = [f"paths.log_dir={tmp_path / 'logs'}", f"paths.cache_dir={cache_dir}", "callbacks.progress_bar.refresh_rate=0",
            f"model.encoder.config={TINY_BERT}", "data.collator.image_size=64", "trainer.max_steps=2",
            "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1",
            "data.eval_batch_size=4", *[f"data.source.{k}={v}" for k, v in TINY_SYNTHETIC.items()]]
    for _ in range(2):
        for stage in stages:  # `python train.py ARGS`, in this process (4 launches would import torch 4 times)
            _main(monkeypatch, *stage[2:], *tiny)
    pretrain = sorted((tmp_path / "logs" / "clipvil_pretrain" / "runs").iterdir())
    finetune = sorted((tmp_path / "logs" / "berson_finetune" / "runs").iterdir())  # date_time_id: in start order
    assert len(pretrain) == len(finetune) == 2
    for first, second in (pretrain, finetune):
        assert json.loads((first / "run.json").read_text())["status"] == "finished"
        assert json.loads((second / "run.json").read_text())["status"] == "finished"
    used = [json.loads((run / "run.json").read_text())["resolved"]["model.encoder.ckpt"] for run in finetune]
    assert used == [str(run / "encoder.pt") for run in pretrain]
