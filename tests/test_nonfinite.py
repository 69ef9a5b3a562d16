"""A NaN / inf loss or gradient stops the fit (run.json failed, nothing exported, no test) or, with
``callbacks.nonfinite_loss.action=skip``, skips the step: every module kind, both precisions."""
from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import train
from seqaware.callbacks import NonFiniteLoss
from seqaware.modules.finite import NonFiniteLossError, _guard
from test_train import SMOKE

BAD_STEP = 2   # the global step (metrics.csv's step column) whose loss is broken
# (experiment, extra overrides, marks of the fp32 NaN run): one experiment per module class
KINDS = {
    "pretraining": ("roberta_pretrain", ["trainer.val_check_interval=1"], []),
    "berson": ("berson_finetune", ["model.pair_encoding=joint", "modality=text", "data.eval_batch_size=4"], []),
    "order_baseline": ("order_baseline", [], []),
    "teo_head": ("teo_head_synthetic", [], []),
    "teo_plan_head": ("teo_plan_head_synthetic", [], []),
    "lora": ("teo_lora_synthetic", ["trainer.limit_val_batches=1"], [pytest.mark.slow]),
}
CHECKS = {"berson_finetune": "val/pmr"}


def _params():
    for kind, (_, _, marks) in KINDS.items():
        for precision in ("32-true", "bf16-mixed"):
            for value in ("nan", "inf"):
                if kind == "lora" and (precision == "32-true") != (value == "nan"):
                    continue  # 40 s a LoRA run on 2 cores: NaN under fp32, inf under bf16
                cheap = precision == "32-true" and value == "nan"
                yield pytest.param(kind, precision, value, marks=marks if cheap else [pytest.mark.slow],
                                   id=f"{kind}-{precision}-{value}")


class _Inject:
    """At training step ``BAD_STEP``: ``nan``: every Linear layer's output becomes NaN, so the real loss and its
    logged terms turn NaN; ``inf``: the loss the module returns (and the logged ``train/loss``) is scaled by
    inf; ``grad``: a finite loss whose gradient is inf."""

    def __init__(self, module: nn.Module, value: str, step: int = BAD_STEP):
        self.module, self.value, self.step = module, value, step
        self.fired = 0
        if value == "nan":
            for m in module.modules():
                if isinstance(m, nn.Linear):
                    m.register_forward_hook(self._linear)
        elif value == "grad":
            p = next(p for p in module.parameters() if p.requires_grad and p.dtype.is_floating_point)
            p.register_hook(lambda g: g * math.inf if self._now() else g)
        else:  # the module's own step inside its own guard, its loss and logged loss terms scaled by inf
            raw = type(module).training_step.__wrapped__

            def step(this, *args, **kwargs):
                out = raw(this, *args, **kwargs)
                if not self._now():
                    return out
                self.fired += 1
                this._finite_logs[:] = [(n, v * math.inf if "loss" in n else v, a, k) for n, v, a, k in this._finite_logs]
                return out * math.inf if isinstance(out, torch.Tensor) else {**out, "loss": out["loss"] * math.inf}
            module.training_step = types.MethodType(_guard(step), module)

    def _now(self) -> bool:
        return self.module.training and int(self.module.global_step) == self.step

    def _linear(self, _m, _inputs, out):
        if self._now() and isinstance(out, torch.Tensor):
            self.fired += 1
            return out * math.nan
        return out


@pytest.fixture
def inject(monkeypatch):
    """inject(value) -> the injectors made for every module fitted (installed when NonFiniteLoss sets up)."""
    made = []

    def install(value: str, action: str | None = None):
        original = NonFiniteLoss.setup

        def setup(self, trainer, pl_module, stage):
            if action is not None:
                self.action = action
            original(self, trainer, pl_module, stage)

        def on_train_start(self, trainer, pl_module):   # after setup: layers a module builds there are hooked too
            made.append(_Inject(pl_module, value))
        monkeypatch.setattr(NonFiniteLoss, "setup", setup)
        monkeypatch.setattr(NonFiniteLoss, "on_train_start", on_train_start, raising=False)
        return made
    return install


def _config(compose_train, kind: str, precision: str, *extra: str):
    experiment, overrides, _ = KINDS[kind]
    return compose_train(f"experiment={experiment}", *SMOKE[experiment][0], *overrides, "trainer.max_steps=4",
                         "trainer.max_epochs=4", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
                         "trainer.val_check_interval=1", "trainer.num_sanity_val_steps=0",
                         f"trainer.precision={precision}", *extra)


def _all_finite(path: Path) -> bool:
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return all(bool(t.isfinite().all()) for t in state.values() if t.dtype.is_floating_point)


@pytest.mark.parametrize("kind, precision, value", list(_params()))
def test_a_nonfinite_loss_stops_the_run_and_keeps_nothing_of_it(compose_train, inject, kind, precision, value):
    made = inject(value)
    cfg = _config(compose_train, kind, precision)
    out = Path(cfg.paths.output_dir)
    with pytest.raises(NonFiniteLossError) as err:
        train.run(cfg)
    assert made and made[0].fired, "the injection never ran"
    message = str(err.value)
    assert message.startswith(f"step {BAD_STEP}: non-finite training loss: ")
    assert "the returned loss = nan" in message or "the returned loss = inf" in message
    # the logged total names its last finite value, logged at the step before
    assert "train/loss = " in message and f"at step {BAD_STEP - 1})" in message, message
    state = json.loads((out / "run.json").read_text())
    assert state["status"] == "failed" and state["error"].startswith("NonFiniteLossError: step 2")
    assert not (out / "test_metrics.json").exists() and not (out / "predictions_test.jsonl").exists()
    assert not (out / "encoder.pt").exists() and not (out / "lora").exists()
    ckpts = sorted((out / "checkpoints").glob("*.ckpt"))
    assert ckpts, "the validations before the bad step saved checkpoints"
    for ckpt in ckpts:  # each from before the bad step, every weight finite
        assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] <= BAD_STEP
        assert _all_finite(ckpt), ckpt


@pytest.mark.parametrize("precision", ["32-true", pytest.param("bf16-mixed", marks=pytest.mark.slow)])
def test_an_inf_gradient_after_a_finite_loss_stops_the_run(compose_train, inject, precision):
    inject("grad")
    cfg = _config(compose_train, "order_baseline", precision)
    with pytest.raises(NonFiniteLossError, match=rf"^step {BAD_STEP}: non-finite gradient of \S+ after a finite loss"):
        train.run(cfg)
    assert json.loads((Path(cfg.paths.output_dir) / "run.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("value", ["nan", "grad"])
def test_skip_leaves_weights_and_optimizer_untouched_counts_and_finishes(compose_train, inject, value, caplog):
    inject(value, action="skip")
    cfg = _config(compose_train, "order_baseline", "32-true", "callbacks.nonfinite_loss.action=skip",
                  "trainer.log_every_n_steps=1")
    metrics = train.run(cfg)
    out = Path(cfg.paths.output_dir)
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    assert metrics["train/nonfinite_skips"] == 1.0 and "test/pmr" in metrics
    last = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 4 and last["nonfinite_skips"] == 1 and _all_finite(out / "checkpoints" / "last.ckpt")
    # 4 optimizer steps, one of which changed nothing: AdamW's per-parameter step counts say 3
    steps = {float(s["step"]) for s in last["optimizer_states"][0]["state"].values()}
    assert steps == {3.0}
    rows = (out / "csv" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    skips = [r.split(",")[header.index("train/nonfinite_skips")] for r in rows[1:]]
    assert [float(s) for s in skips if s] == [0.0, 0.0, 1.0, 1.0]


def test_a_mistyped_action_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"callbacks.nonfinite_loss.action must be one of \['stop', 'skip'\], got 'skp'"):
        NonFiniteLoss("skp")


def _closure_config(compose_train, tmp_path, *extra: str):
    from conftest import TINY_BERT
    from test_teo_closure_head import tiny_questions

    return compose_train("experiment=teo_plan_head_catbench", f"data.train_path={tiny_questions(tmp_path / 'val.jsonl', range(6))}",
                         f"data.eval_path={tiny_questions(tmp_path / 'test.jsonl', range(6, 8))}",
                         "~data.extra_eval_paths.all_pairs", "data.rfg_path=null", "data.cv_folds=3", "trainer.max_epochs=4",
                         f"model.encoder.config={TINY_BERT}", "model.members=1", "model.cv_grid=[{closure: max}]", *extra)


@pytest.mark.parametrize("action", ["stop", "skip"])
def test_the_closure_heads_cross_validation_fits_are_checked_too(compose_train, tmp_path, monkeypatch, action):
    """The closure head trains its cross-validation fits itself, in setup: a NaN loss there stops the run naming the
    fit and the step (or, with skip, leaves that update out)."""
    from seqaware.modules.teo_closure_network import ClosureEnsemble

    calls = []
    real = ClosureEnsemble.loss

    def loss(self, data):
        calls.append(1)
        out = real(self, data)
        return out * math.nan if len(calls) == 3 else out   # step 2 of the first fit
    monkeypatch.setattr(ClosureEnsemble, "loss", loss)
    cfg = _closure_config(compose_train, tmp_path, f"callbacks.nonfinite_loss.action={action}")
    out = Path(cfg.paths.output_dir)
    if action == "stop":
        with pytest.raises(NonFiniteLossError, match=r"^the cross-validation fit of setting 'closure=max' on fold 0 "
                                                     r"\(repeat 1\), step 2: non-finite training loss nan\. The run stops"):
            train.run(cfg)
        assert json.loads((out / "run.json").read_text())["status"] == "failed"
        assert not (out / "cv_results.json").exists() and not (out / "test_metrics.json").exists()
    else:
        metrics = train.run(cfg)
        assert json.loads((out / "run.json").read_text())["status"] == "finished" and "test/catbench_macro_f1" in metrics


@pytest.mark.parametrize("precision", ["32-true", pytest.param("bf16-mixed", marks=pytest.mark.slow)])
def test_the_closure_heads_own_training_step_stops_at_an_inf(compose_train, tmp_path, inject, precision):
    made = inject("inf")   # its heads are MemberLinear layers over cached features: no nn.Linear to turn NaN
    cfg = _closure_config(compose_train, tmp_path, "trainer.val_check_interval=1", "trainer.limit_val_batches=1",
                          f"trainer.precision={precision}")
    with pytest.raises(NonFiniteLossError, match=rf"^step {BAD_STEP}: non-finite training loss: the returned loss = inf"):
        train.run(cfg)
    assert made[0].fired and json.loads((Path(cfg.paths.output_dir) / "run.json").read_text())["status"] == "failed"
