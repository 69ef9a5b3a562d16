"""``trainer.precision=bf16-true`` with float32 master weights (seqaware.master_weights, SeqawareModule) and
the pretraining speed switch ``model.compile``: the GPU switches of docs/results/performance.md, checked on
the CPU for what they must not change.

* bfloat16 parameters alone lose updates below their resolution; the masters keep them.
* A few Lightning steps in ``bf16-true`` follow the ``bf16-mixed`` default within bfloat16's rounding.
* Checkpoints and ``encoder.pt`` hold float32 weights, and a resumed ``bf16-true`` run equals the
  uninterrupted one exactly.
* ``model.compile=true`` trains like the eager encoder.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn

from seqaware.master_weights import MasterWeights
from test_pretraining import tiny_module, toy_batch, toy_world


def test_masters_keep_updates_that_bfloat16_rounds_away():
    plain = nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    kept = nn.Parameter(torch.ones(64, dtype=torch.bfloat16))
    sgd_plain = torch.optim.SGD([plain], lr=1e-3)
    masters, groups = MasterWeights.for_param_groups([{"params": [kept], "lr": 1e-3}])
    sgd_kept = torch.optim.SGD(groups, lr=0.5)  # the group's own lr wins
    masters.attach(sgd_kept)
    for _ in range(10):
        for p in (plain, kept):
            p.grad = torch.ones_like(p)
        sgd_plain.step()
        masters.grads_to_master()
        assert kept.grad is None  # consumed: nothing accumulates into the next step
        sgd_kept.step()
    # 1 - 1e-3 rounds back to 1 in bfloat16 (its spacing below 1 is 2^-8): the plain parameter never moved
    assert torch.equal(plain, torch.ones_like(plain))
    master = masters.master(kept)
    assert master.dtype == torch.float32
    torch.testing.assert_close(master, torch.full((64,), 0.99), rtol=0, atol=1e-6)
    assert torch.equal(kept.detach(), master.to(torch.bfloat16))  # the module holds the master's rounding


def test_a_parameter_without_gradient_leaves_its_master_alone():
    a = nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    b = nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    full = nn.Parameter(torch.ones(3))  # already float32: its own master
    masters, groups = MasterWeights.for_param_groups([{"params": [a, b, full]}])
    assert masters.master(full) is full and len(masters) == 2
    opt = torch.optim.AdamW(groups, lr=0.1)
    masters.attach(opt)
    a.grad, b.grad, full.grad = torch.ones_like(a), None, torch.ones_like(full)
    masters.grads_to_master()
    opt.step()
    assert masters.master(b).grad is None
    assert torch.equal(b.detach(), torch.ones(3, dtype=torch.bfloat16))  # skipped, not decayed
    assert (a.detach() < 1).all() and (full.detach() < 1).all()


def test_masters_start_from_the_float32_source_and_check_shapes():
    p = nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    exact = torch.tensor([1.0 + 2 ** -12, -3.0])  # not representable in bfloat16
    masters, _ = MasterWeights.for_param_groups([{"params": [p]}], {id(p): exact})
    assert torch.equal(masters.master(p), exact)
    with pytest.raises(ValueError, match="shape"):
        MasterWeights.for_param_groups([{"params": [p]}], {id(p): torch.zeros(3)})


# ---------------------------------------------------------------- Lightning: bf16-true against bf16-mixed
STEPS = 6


class _Losses(pl.Callback):
    def __init__(self):
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def _loader(batches: int = STEPS, seed: int = 0):
    world = toy_world()
    data = [toy_batch(8, 7000 + seed * 100 + k, world, offset=8 * k) for k in range(batches)]
    return torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)


def _module(**kwargs):
    torch.manual_seed(0)
    module = tiny_module("all", hidden=32, generator_scope="rank", **kwargs)
    return module


def _fit(module, precision: str, max_steps: int = STEPS, ckpt_path=None, callbacks=(), root=None, batches: int = STEPS):
    if root is None:  # the module writes encoder.pt into the trainer's root folder at fit end
        import tempfile

        root = tempfile.mkdtemp(prefix="master-weights-")
    losses = _Losses()
    trainer = pl.Trainer(accelerator="cpu", devices=1, precision=precision, max_steps=max_steps, max_epochs=-1,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=bool(callbacks), callbacks=[losses, *callbacks],
                         default_root_dir=root, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=_loader(batches), ckpt_path=ckpt_path)
    return trainer, losses.losses


def _weights(module) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in module.full_precision_state_dict().items() if v.is_floating_point()}


def _updates_apart(module, reference) -> float:
    """``|update - reference update| / |reference update|`` over every float weight (the update: the weights
    after the fit minus the common initial ones)."""
    start = _weights(_module())
    a, b = _weights(module), _weights(reference)
    assert a.keys() == b.keys() == start.keys()
    du = torch.cat([(a[k] - start[k]).flatten() for k in sorted(start)])
    dr = torch.cat([(b[k] - start[k]).flatten() for k in sorted(start)])
    return float((du - dr).norm() / dr.norm())


def test_bf16_true_trains_like_bf16_mixed():
    mixed, true = _module(), _module()
    _, mixed_losses = _fit(mixed, "bf16-mixed")
    trainer, true_losses = _fit(true, "bf16-true")
    # the module computed in bfloat16, the optimizer updated float32 copies of every trainable parameter
    trainable = [p for p in true.parameters() if p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.bfloat16}
    assert len(true.master_weights) == len(trainable)
    assert {p.dtype for g in trainer.optimizers[0].param_groups for p in g["params"]} == {torch.float32}
    # the same losses and weights within bfloat16's rounding (a step's loss is ~10; bf16 resolves 3 digits)
    assert len(true_losses) == len(mixed_losses) == STEPS
    torch.testing.assert_close(torch.tensor(true_losses), torch.tensor(mixed_losses), rtol=2e-2, atol=0)
    # the whole update (every weight's change) differs from bf16-mixed's by about as much as bf16-mixed's
    # differs from float32's: bfloat16 rounding, not a different optimisation (measured: 1.0% and 0.9%)
    fp32 = _module()
    _fit(fp32, "32-true")
    true_vs_mixed, mixed_vs_fp32 = _updates_apart(true, mixed), _updates_apart(mixed, fp32)
    assert true_vs_mixed < 0.05 and true_vs_mixed < 2.5 * mixed_vs_fp32, (true_vs_mixed, mixed_vs_fp32)
    # the half-precision parameters hold the masters' rounding
    for p in trainable:
        assert torch.equal(p.detach(), true.master_weights.master(p).to(torch.bfloat16))


def test_bf16_true_checkpoints_are_float32_and_resume_exactly(tmp_path):
    # epochs of 2 batches: the checkpoint of step 2 ends an epoch (a plain DataLoader cannot resume mid-epoch;
    # the project's data modules can, tests/test_resume.py)
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1, save_last=False)
    straight = _module()
    _fit(straight, "bf16-true", max_steps=4, callbacks=[every], root=tmp_path, batches=2)
    blob = torch.load(tmp_path / "ckpt" / "epoch=0-step=2.ckpt", map_location="cpu", weights_only=True)
    floats = {k: v.dtype for k, v in blob["state_dict"].items() if v.is_floating_point()}
    assert set(floats.values()) == {torch.float32}, floats
    exported = straight.encoder_state_dict()
    assert {v.dtype for v in exported.values() if v.is_floating_point()} == {torch.float32}

    resumed = _module()
    _fit(resumed, "bf16-true", max_steps=4, ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=2.ckpt"),
         callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt2", save_top_k=0)], root=tmp_path / "2", batches=2)
    a, b = _weights(resumed), _weights(straight)
    assert a.keys() == b.keys()
    for key in b:
        assert torch.equal(a[key], b[key]), key  # the float32 masters, bit for bit
    assert torch.equal(resumed.encoder.word_embeddings.weight, straight.encoder.word_embeddings.weight)


def test_bf16_mixed_keeps_no_master_weights():
    module = _module()
    trainer, _ = _fit(module, "bf16-mixed", max_steps=1)
    assert module.master_weights is None
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    assert trainer.optimizers[0].param_groups[0]["params"][0] is next(p for p in module.parameters() if p.requires_grad)


@pytest.mark.slow
def test_compiled_encoder_trains_like_the_eager_one():
    eager, compiled = _module(), _module(compile={"dynamic": False})
    assert compiled.hparams.compile == {"dynamic": False}
    _, eager_losses = _fit(eager, "32-true", max_steps=3)
    _, compiled_losses = _fit(compiled, "32-true", max_steps=3)
    torch.testing.assert_close(torch.tensor(compiled_losses), torch.tensor(eager_losses), rtol=1e-4, atol=1e-4)
    # compiling in place keeps the state dict's keys (checkpoints load either way); the fused kernels round
    # differently, and Adam turns that into a few per-mille of the update
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    assert _updates_apart(compiled, eager) < 5e-3


# ---------------------------------------------------------------- the experiments under bf16-true
@pytest.mark.parametrize("experiment", ["clipvil_pretrain", "visualbert_pretrain", "teo_head_synthetic",
                                        "teo_lora_synthetic"])
def test_experiments_that_take_bf16_true_fast_dev_run_in_it(compose_train, experiment):
    import train
    from test_train import SMOKE

    overrides, keys, _ = SMOKE[experiment]
    cfg = compose_train(f"experiment={experiment}", "trainer.fast_dev_run=true", *overrides,
                        "trainer.precision=bf16-true")
    metrics = train.run(cfg)
    assert all(f"test/{key}" in metrics for key in keys), sorted(metrics)
    assert all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values()), metrics
    if experiment == "clipvil_pretrain":
        # encoder.pt holds float32 weights: the trained ones' masters and the frozen visual tower unrounded
        state = torch.load(Path(cfg.paths.output_dir) / "encoder.pt", weights_only=True)
        floats = {k: v for k, v in state.items() if v.is_floating_point()}
        assert {v.dtype for v in floats.values()} == {torch.float32}
        frozen = [v for k, v in floats.items() if k.startswith("visual.")]
        assert frozen and any(not torch.equal(v, v.bfloat16().float()) for v in frozen)


def test_modules_written_for_autocast_refuse_bf16_true_naming_the_key(compose_train):
    import train
    from test_train import SMOKE

    cfg = compose_train("experiment=order_baseline", "trainer.fast_dev_run=true", *SMOKE["order_baseline"][0],
                        "trainer.precision=bf16-true")
    with pytest.raises(ValueError, match=r"trainer.precision=bf16-true: .*use trainer.precision=bf16-mixed"):
        train.run(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["teo_lora_synthetic", "teo_head_synthetic"])
def test_lora_and_encoder_head_losses_in_bf16_true_follow_bf16_mixed(compose_train, experiment, tmp_path):
    """The LoRA step (and the TEO encoder head) with the same switch: 4 training steps, the logged losses of
    bf16-true within bfloat16's rounding of bf16-mixed's."""
    import csv

    import train
    from test_train import SMOKE

    losses = {}
    for precision in ("bf16-mixed", "bf16-true"):
        out = tmp_path / precision
        cfg = compose_train(f"experiment={experiment}", *SMOKE[experiment][0], "trainer.max_steps=4",
                            "trainer.max_epochs=-1", "trainer.log_every_n_steps=1", "trainer.limit_val_batches=0",
                            "trainer.limit_test_batches=1", f"trainer.precision={precision}", f"paths.output_dir={out}")
        train.run(cfg)
        with open(out / "csv" / "metrics.csv") as handle:
            losses[precision] = [float(r["train/loss"]) for r in csv.DictReader(handle) if r.get("train/loss")]
    assert len(losses["bf16-true"]) == len(losses["bf16-mixed"]) == 4, losses
    torch.testing.assert_close(torch.tensor(losses["bf16-true"]), torch.tensor(losses["bf16-mixed"]), rtol=3e-2, atol=1e-2)
