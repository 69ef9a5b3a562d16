"""Every module trains in train mode: during fit's training steps (also those after a validation
loop) every submodule is in train mode except the frozen parts its docstring names.

``from_pretrained`` returns modules in eval mode and Lightning >= 2.2 keeps the mode it finds, so
without :meth:`SeqawareModule.on_fit_start` a fine-tuned MiniLM trains with every Dropout off.
"""
from __future__ import annotations

import pytest
import pytorch_lightning as pl
from torch import nn

import train

# one training step, one validation, two more steps: the steps after the validation see the modes
# Lightning restores when the validation loop ends
SHORT_FIT = ["test=false", "trainer.max_epochs=1", "trainer.max_steps=3", "trainer.limit_train_batches=3",
             "trainer.val_check_interval=1", "trainer.check_val_every_n_epoch=1", "trainer.limit_val_batches=1",
             "trainer.fast_dev_run=false", "callbacks.model_checkpoint=null"]
TINY_BERT = ("{model_type:bert,hidden_size:32,num_hidden_layers:1,num_attention_heads:2,intermediate_size:64,"
             "vocab_size:30522,max_position_embeddings:128,hidden_dropout_prob:0.1,attention_probs_dropout_prob:0.1}")


class ModeRecorder(pl.Callback):
    """The names of the submodules in eval mode at every training step, and validations so far."""

    def __init__(self):
        self.steps: list[tuple[int, frozenset[str]]] = []
        self.validations = 0
        self.dropouts_training: list[int] = []

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validations += 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        modules = dict(pl_module.named_modules())
        self.steps.append((self.validations, frozenset(n for n, m in modules.items() if not m.training)))
        self.dropouts_training.append(sum(isinstance(m, nn.Dropout) and m.training and m.p > 0 for m in modules.values()))


def batchnorm_names(module: nn.Module) -> frozenset[str]:
    """The BatchNorm layers and their children (timm's ``BatchNormAct2d`` holds its activation)."""
    names = [n for n, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return frozenset(n for n, _ in module.named_modules() if any(n == b or n.startswith(b + ".") for b in names))


def fit_and_record(compose_train, *overrides: str) -> tuple[ModeRecorder, pl.LightningModule]:
    cfg = compose_train(*overrides, *SHORT_FIT)
    datamodule, module, trainer = train.build(cfg)
    recorder = ModeRecorder()
    trainer.callbacks.append(recorder)
    trainer.fit(module, datamodule=datamodule)
    assert len(recorder.steps) == 3 and recorder.steps[-1][0] >= 1, recorder.steps  # steps after a validation
    return recorder, module


# experiment -> (extra overrides, frozen parts: a function of the module giving the names in eval mode)
EXPERIMENTS = {
    # MiniLM (from_pretrained) + EfficientNet-Lite0: the backbone's BatchNorm layers stay in eval (freeze_bn)
    "berson_finetune": (["data.collator.image_size=64", "model.beam_size=2", "data.batch_size=4",
                         "data.eval_batch_size=4"], batchnorm_names),
    "berson_roc": (["data.source.max_stories=40", "data.batch_size=4", "data.eval_batch_size=4"], lambda m: frozenset()),
    "teo_head_synthetic": (["data.batch_size=8", "data.eval_batch_size=8"], lambda m: frozenset()),
    "teo_head_rfg": (["data.batch_size=8", "data.eval_batch_size=8"], lambda m: frozenset()),
    "order_baseline": (["data.collator.image_size=32", "data.batch_size=4", "model.net.dim=32"], lambda m: frozenset()),
}
NEEDS_SHARED = {"berson_roc", "teo_head_rfg"}
SLOW = {"berson_roc", "berson_finetune", "teo_head_rfg", "teo_head_synthetic"}  # BERSON: 30-45 s on a shared 2-core CPU (every step pair); TEO heads: 4-7 s (order_baseline stays in the fast loop)


def _param(experiment: str):
    marks = [pytest.mark.shared_data] * (experiment in NEEDS_SHARED) + [pytest.mark.slow] * (experiment in SLOW)
    return pytest.param(experiment, marks=marks)


@pytest.mark.parametrize("experiment", [_param(e) for e in EXPERIMENTS])
def test_fine_tuning_trains_in_train_mode(compose_train, experiment):
    extra, frozen = EXPERIMENTS[experiment]
    recorder, module = fit_and_record(compose_train, f"experiment={experiment}", *extra)
    expected = frozen(module)
    if experiment == "berson_finetune":
        assert len(expected) > 10  # EfficientNet-Lite0's BatchNorm layers: the frozen part exists
    for validations, in_eval in recorder.steps:
        assert in_eval == expected, (validations, sorted(in_eval - expected)[:5], sorted(expected - in_eval)[:5])
    assert min(recorder.dropouts_training) > 0  # the encoder's / head's dropouts are on


@pytest.mark.parametrize("trainable", [True, pytest.param(False, marks=pytest.mark.slow)])  # fast loop: the trainable case
def test_pretraining_keeps_batchnorm_frozen(compose_train, trainable):
    """A trainable backbone trains with its BatchNorm layers in eval mode; the pretraining default
    (a frozen backbone) keeps the whole backbone in eval mode; every other module trains."""
    recorder, module = fit_and_record(compose_train, "experiment=clipvil_pretrain", "objectives=mlm_isp",
                                      f"model.encoder.config={TINY_BERT}", "data.collator.image_size=64",
                                      "data.batch_size=4", "data.eval_batch_size=4",
                                      f"backbones.visual.trainable={str(trainable).lower()}")
    if trainable:
        expected = batchnorm_names(module)
    else:
        expected = frozenset(n for n, _ in module.named_modules()
                             if n == "encoder.visual" or n.startswith("encoder.visual."))
    assert expected
    for _, in_eval in recorder.steps:
        assert in_eval == expected
    assert min(recorder.dropouts_training) > 0


@pytest.mark.slow  # 2.8 s; fast loop budget: the full suite (CI) runs it
def test_lora_trains_whole_network_in_train_mode(compose_train):
    """LoRA: the frozen base is frozen by requires_grad, not by eval mode (PEFT / HF Trainer behaviour);
    the LoRA dropouts train; a base left in eval mode by from_pretrained goes to train mode."""
    cfg = compose_train("experiment=teo_lora_internvl", "model=internvl_tiny", "trainer.precision=32-true",
                        "data.modality=text", "data.batch_size=4", "data.max_train_pairs=12", "data.eval_batch_size=8",
                        "data.max_eval_pairs=4", "model.lora.dropout=0.1", *SHORT_FIT)
    datamodule, module, trainer = train.build(cfg)
    module.model.eval()  # as a real checkpoint comes out of from_pretrained
    recorder = ModeRecorder()
    trainer.callbacks.append(recorder)
    trainer.fit(module, datamodule=datamodule)
    assert len(recorder.steps) == 3 and recorder.steps[-1][0] >= 1
    for _, in_eval in recorder.steps:
        assert in_eval == frozenset()
    lora_dropouts = [m for n, m in module.named_modules() if "lora_dropout" in n and isinstance(m, nn.Dropout)]
    assert lora_dropouts and min(recorder.dropouts_training) >= len(lora_dropouts)


def test_declared_frozen_modules_stay_in_eval_after_train():
    from seqaware.modules.base import SeqawareModule

    class Net(SeqawareModule):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
            self.norm = nn.BatchNorm1d(2)

        def frozen_modules(self):
            return [self.norm]

    net = Net().eval()
    net.on_fit_start()
    assert net.training and net.body.training and net.body[1].training and not net.norm.training
    net.eval()
    assert not net.body[1].training  # eval still means eval everywhere
