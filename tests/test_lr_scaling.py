"""The learning rate for a larger batch (``model.lr_scaling``) and the presets that use it with token budgets."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import TINY_BERT
from data_modules.sampling import KeyedList, epoch_loader
from seqaware.lr_scaling import check_scaling, instances_per_step, lr_factor, scale_learning_rates


def test_the_rules_scale_by_the_square_root_or_linearly_in_the_instances_per_step():
    assert lr_factor({"rule": "sqrt", "reference_batch": 16}, 64) == 2.0
    assert lr_factor({"rule": "linear", "reference_batch": 16}, 64) == 4.0
    assert lr_factor({"rule": "sqrt", "reference_batch": 4}, 2) == math.sqrt(0.5)
    assert lr_factor(None, 1000) == 1.0 and lr_factor({}, 1000) == 1.0
    with pytest.raises(ValueError, match=r"^model.lr_scaling.rule must be one of \['sqrt', 'linear'\], got 'cube'$"):
        check_scaling({"rule": "cube", "reference_batch": 16})
    with pytest.raises(ValueError, match=r"^model.lr_scaling.reference_batch must be a positive number .* got 0$"):
        check_scaling({"rule": "sqrt", "reference_batch": 0})
    with pytest.raises(ValueError, match=r"^model.lr_scaling takes rule and reference_batch, not \['cap'\]$"):
        check_scaling({"rule": "sqrt", "reference_batch": 16, "cap": 4})


def test_the_instances_per_step_are_the_loaders_mean_batch_times_processes_and_accumulation():
    lengths = [(7 * i) % 23 + 3 for i in range(200)]
    budget = epoch_loader(KeyedList(list(range(200))), batch_size=8, shuffle=True, seed=0, lengths=lengths,
                          batch_tokens=120, trainer=SimpleNamespace(world_size=2, global_rank=1))
    trainer = SimpleNamespace(train_dataloader=budget, world_size=2, accumulate_grad_batches=3)
    assert instances_per_step(trainer) == pytest.approx(200 / 30 * 2 * 3)      # 30 batches of 200 over 2 ranks
    plain = epoch_loader(KeyedList(list(range(20))), batch_size=8, shuffle=True, seed=0)
    assert instances_per_step(SimpleNamespace(train_dataloader=plain, world_size=1, accumulate_grad_batches=1)) == 8
    opt, groups = {"lr": 1e-4}, [{"params": []}, {"params": [], "lr": 1e-3}]
    trainer = SimpleNamespace(train_dataloader=plain, world_size=2, accumulate_grad_batches=1)
    assert scale_learning_rates({"rule": "sqrt", "reference_batch": 4}, trainer, opt, groups) == 2.0   # 16 / 4
    assert opt == {"lr": 2e-4} and groups[0] == {"params": []} and groups[1]["lr"] == 2e-3
    assert scale_learning_rates(None, trainer, opt, groups) == 1.0 and opt == {"lr": 2e-4}


def _lr_rows(path: Path) -> list[dict[str, float]]:
    with open(path, newline="") as handle:
        return [{k: float(v) for k, v in row.items() if k.startswith("lr-") and v}
                for row in csv.DictReader(handle) if row.get("lr-AdamW/pg1")]


@pytest.mark.slow  # one short BERSON fit (tiny BERT, joint): about 15 s
def test_a_token_budget_fit_scales_every_lr_and_decays_over_the_steps_it_runs(compose_train, caplog):
    """Token-budget batches with the sqrt rule: every parameter group's lr is the config's x sqrt(mean stories per
    step / reference), the linear decay spans exactly the optimizer steps the fit runs (two epochs of the sampler's
    fixed count), and the checkpoint loads also without the key (a checkpoint written before it existed)."""
    import logging

    import train
    from seqaware.checkpoint_io import load_checkpoint
    from seqaware.modules.berson import BersonModule

    caplog.set_level(logging.INFO)
    cfg = compose_train("experiment=berson_finetune", "modality=text", "model.pair_encoding=joint",
                        f"model.encoder.config={TINY_BERT}", "model.beam_size=2", "data.batch_tokens=300",
                        "model.lr_scaling={rule: sqrt, reference_batch: 2}", "model.optimizer.lr=1e-3",
                        "model.head_lr=4e-3", "model.new_layers_lr=encoder",
                        "model.scheduler={_target_: transformers.get_linear_schedule_with_warmup, warmup_ratio: 0.0}",
                        "trainer.max_epochs=2", "trainer.max_steps=-1", "trainer.log_every_n_steps=1",
                        "trainer.limit_train_batches=null", "trainer.val_check_interval=null",
                        "trainer.check_val_every_n_epoch=1", "trainer.limit_val_batches=1")
    train.run(cfg)
    out = Path(cfg.paths.output_dir)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("data.batch_tokens=300"))
    batches, mean = int(line.split("): ")[1].split()[0]), float(line.split(" of ")[1].split()[0])
    assert batches >= 3
    factor = math.sqrt(24 / batches / 2)                                # 24 training procedures in `batches` batches
    assert f"every learning rate x {factor:.3f} (sqrt rule" in caplog.text and mean == pytest.approx(24 / batches, abs=0.05)
    rows = _lr_rows(out / "csv" / "metrics.csv")
    assert len(rows) == 2 * batches                                     # one row per optimizer step
    encoder, head = "lr-AdamW/pg1", "lr-AdamW/pg2"                      # the encoder's group, BERSON's network
    total = 2 * batches
    for step, row in enumerate(rows):                                   # peak x (1 - step / total): no step left over
        assert row[encoder] == pytest.approx(1e-3 * factor * (1 - step / total), rel=1e-6)
        assert row[head] == pytest.approx(4e-3 * factor * (1 - step / total), rel=1e-6)
    ckpt = load_checkpoint(out / "checkpoints" / "last.ckpt")
    assert ckpt["hyper_parameters"]["lr_scaling"] == {"rule": "sqrt", "reference_batch": 2}
    del ckpt["hyper_parameters"]["lr_scaling"]
    old = out / "before_lr_scaling.ckpt"
    torch.save(ckpt, old)
    assert BersonModule.load_from_checkpoint(old).hparams["lr_scaling"] is None


def test_the_presets_compose_their_batches_and_lr_rule(compose_train):
    """roc_base: roc_base_b16's recipe (the batch-16 recipe of every earlier roc_base figure, kept) in 8,192-token
    batches, unsorted, with the sqrt rule against 16 stories; BERSON's recipe in 65,536 pair-token batches against
    its 4; the MiniLM recipe's large-batch arm against roc_joint's 16."""
    b16 = compose_train("experiment=berson_roc", "hparams=roc_base_b16", tiny=False)
    assert (b16.data.batch_size, b16.data.batch_tokens, b16.data.bucket_by_length, b16.model.lr_scaling) == (16, None,
                                                                                                            True, None)
    assert (b16.model.optimizer.lr, b16.model.head_lr, b16.model.scheduler.warmup_ratio) == (3e-5, 1e-3, 0.06)
    assert (b16.trainer.max_epochs, b16.trainer.val_check_interval, b16.model.pair_encoding) == (4, 500, "joint")
    large = compose_train("experiment=berson_roc", "hparams=roc_base", tiny=False)
    assert (large.data.batch_tokens, large.data.batch_tokens_count, large.data.bucket_by_length) == (8192, "joint", False)
    assert dict(large.model.lr_scaling) == {"rule": "sqrt", "reference_batch": 16}
    assert (large.model.optimizer.lr, large.model.head_lr, large.model.scheduler.warmup_ratio) == (3e-5, 1e-3, 0.06)
    assert large.backbones.text == "offline:mpnet" and list(large.data.extra_train_paths) == list(b16.data.extra_train_paths)
    assert (large.trainer.max_epochs, large.trainer.val_check_interval, large.trainer.check_val_every_n_epoch) == (4, 0.5, 1)
    paper = compose_train("experiment=berson_roc", "hparams=berson_roc_paper_large", tiny=False)
    assert (paper.data.batch_tokens, paper.data.batch_tokens_count, paper.model.pair_encoding) == (65536, "pairwise",
                                                                                                   "pairwise")
    assert dict(paper.model.lr_scaling) == {"rule": "sqrt", "reference_batch": 4} and paper.model.decoder.variant == "paper"
    assert (paper.model.optimizer.lr, paper.model.head_lr, paper.model.scheduler.warmup_ratio) == (2e-5, None, 0.06)
    assert paper.model.scheduler.num_warmup_steps is None and paper.trainer.max_epochs == 2
    assert compose_train("experiment=berson_roc", "hparams=berson_roc_paper_large", "trainer=gpu",
                         tiny=False).trainer.precision == "bf16-mixed"
    release = compose_train("experiment=berson_roc", "hparams=berson_roc_paper", tiny=False)
    assert (release.data.batch_size, release.data.batch_tokens, release.model.lr_scaling) == (4, None, None)
    assert release.model.scheduler.num_warmup_steps == 0 and release.trainer.precision == "32-true"
    minilm = compose_train("experiment=berson_roc", "hparams=roc_joint_large", tiny=False)
    assert (minilm.data.batch_tokens, dict(minilm.model.lr_scaling)) == (8192, {"rule": "sqrt", "reference_batch": 16})
    # roc_joint's lr and warm-up, and its 3 epochs x 1.33 (the noise-scale rule, docs/results/large_batch.md)
    assert (minilm.model.optimizer.lr, minilm.trainer.max_epochs, minilm.model.scheduler.warmup_ratio) == (2e-4, 4, 0.1)
