"""hparams=wu2022: the recipe facts of Wu et al. 2022 (Table 11, sec. 5.2 and the authors' released scripts),
composed with the fine-tuning and pretraining experiments (their fast_dev_runs under both precisions are in
tests/test_train.py)."""
from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from test_train import TINY_EXTRA


def test_wu2022_optimizer_schedule_and_clipping(compose_train):
    for stage, lr, epochs, warmup in (("finetune_multimodal", 5e-6, 10, 100), ("finetune_text", 5e-6, 5, 100),
                                      ("finetune_image", 5e-6, 5, 100), ("pretrain", 1e-5, 5, 1000)):
        cfg = compose_train("experiment=berson_finetune", "hparams=wu2022", f"stage={stage}")
        opt = OmegaConf.to_container(cfg.model.optimizer, resolve=True)
        assert opt == {"_target_": "torch.optim.AdamW", "lr": lr, "weight_decay": 0.0, "eps": 1e-8, "fused": True}
        sched = OmegaConf.to_container(cfg.model.scheduler, resolve=True)
        assert sched == {"_target_": "transformers.get_linear_schedule_with_warmup",
                         "num_warmup_steps": warmup, "warmup_ratio": None, "interval": "step"}
        assert cfg.trainer.max_epochs == epochs and cfg.trainer.max_steps == -1
        assert cfg.trainer.gradient_clip_val == 1.0 and cfg.trainer.gradient_clip_algorithm == "norm"
        assert cfg.trainer.accumulate_grad_batches == 1 and cfg.data.batch_size == 4


def test_wu2022_one_lr_for_every_parameter_and_wu2022_reference_selection(compose_train):
    plain = compose_train("experiment=berson_finetune")
    assert plain.model.head_lr == 1e-3 and plain.model.reference_selection == "joint"
    cfg = compose_train("experiment=berson_finetune", "hparams=wu2022")
    assert cfg.model.head_lr is None and cfg.model.reference_selection == "wu2022"
    assert compose_train("experiment=berson_roc", "hparams=wu2022").model.head_lr is None
    # the user can still choose on the command line
    cfg = compose_train("experiment=order_baseline", "hparams=wu2022", "model.reference_selection=joint")
    assert cfg.model.reference_selection == "joint"


def test_wu2022_pretraining_composes_with_the_paper_pisp(compose_train):
    cfg = compose_train("experiment=clip_image_pretrain", "hparams=wu2022")
    assert cfg.stage == "pretrain" and cfg.model.optimizer.lr == 1e-5
    assert cfg.model.scheduler.num_warmup_steps == 1000 and cfg.trainer.gradient_clip_val == 1.0
    assert cfg.model.objectives.pisp.max_patches is None  # M ~ U[1, w] (sec. 4.2.2)
    assert "reference_selection" not in cfg.model
    assert cfg.model.head_lr is None  # one lr for every parameter, objective heads included (Table 11)


def test_pretraining_freezes_the_visual_backbone_and_wu2022_trains_it(compose_train):
    """seqaware's pretraining default freezes the visual tower (cached features); the authors trained
    it, which hparams=wu2022 restores; fine-tuning trains it either way."""
    for experiment in ("clipvil_pretrain", "clip_image_pretrain"):
        assert compose_train(f"experiment={experiment}").model.encoder.visual.trainable is False
    assert compose_train("experiment=clipvil_pretrain", "hparams=wu2022").model.encoder.visual.trainable is True
    assert compose_train("experiment=berson_finetune").model.encoder.visual.trainable is True


def test_pretraining_defaults_that_let_the_swap_objectives_learn_and_the_paper_preset(compose_train):
    """seqaware's pretraining: 2-step sub-sequences, step embedding at std 0.1, MLM and SMRM at every
    step (ISP / PISP take turns); hparams=wu2022: MLM alone at every step (Eq. 1), 5-step stories."""
    for experiment in ("clipvil_pretrain", "visualbert_pretrain", "clip_image_pretrain"):
        cfg = compose_train(f"experiment={experiment}")
        assert cfg.data.view.max_steps == 2 and cfg.data.view.min_steps == 2 and cfg.model.encoder.step_init_std == 0.1
        assert list(cfg.model.objectives.always) == ["mlm", "smrm"]
    for experiment in ("clipvil_pretrain", "visualbert_pretrain", "clip_image_pretrain", "roberta_pretrain"):
        paper = compose_train(f"experiment={experiment}", "hparams=wu2022")
        # the authors' scripts: --max_story_length 5, --min_story_length at its default 5 (whole stories, not 2-5 steps)
        assert paper.data.view.min_steps == paper.data.view.max_steps == 5
    assert list(paper.model.objectives.always) == ["mlm"]
    assert "min_steps" not in compose_train("experiment=berson_finetune", "hparams=wu2022").data.view
    module = instantiate(compose_train("experiment=clipvil_pretrain", "objectives=all", *TINY_EXTRA["clipvil_pretrain"]).model)
    assert module.schedule.always == ("mlm", "smrm") and module.schedule.rotating == ("isp", "pisp")


def _built_schedule(scheduler_cfg, steps: float):
    """What configure_optimizers builds (AdamW at lr 1e-3) from ``model.scheduler`` (a dict or a composed
    config) for a run of ``steps`` optimizer steps."""
    from seqaware.modules.base import SeqawareModule

    if not isinstance(scheduler_cfg, dict):
        scheduler_cfg = OmegaConf.to_container(scheduler_cfg, resolve=True)
    module = SeqawareModule()
    module.weight = torch.nn.Parameter(torch.zeros(1))
    module.hparams.update(optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3}, scheduler=scheduler_cfg)
    module._trainer = type("Steps", (), {"estimated_stepping_batches": steps})()
    return module.configure_optimizers()


def _lrs(built, steps: int) -> list[float]:
    """The lr of each of ``steps`` optimizer steps under the optimizer and scheduler ``built``."""
    optimizer, scheduler = built["optimizer"], built["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_image_only_pretraining_warms_up_decays_and_clips_and_wu2022_keeps_its_step_count(compose_train):
    """clip_image_pretrain: linear warm-up over 10% of any run, linear decay to 0, gradient norm clipped
    at 1.0 (the authors' recipe with the warm-up as a fraction); the multimodal pretraining experiments
    keep a constant lr without clipping; hparams=wu2022: the authors' 1000 warm-up steps for every one."""
    cfg = compose_train("experiment=clip_image_pretrain")
    assert cfg.trainer.gradient_clip_val == 1.0 and cfg.trainer.gradient_clip_algorithm == "norm"
    built = _built_schedule(cfg.model.scheduler, 600)
    assert built["lr_scheduler"]["interval"] == "step"
    lrs = _lrs(built, 600)
    assert lrs[0] == 0.0 and lrs.index(max(lrs)) == 60 and lrs[-1] == pytest.approx(1e-3 / 540)
    for experiment in ("clipvil_pretrain", "visualbert_pretrain"):
        cfg = compose_train(f"experiment={experiment}")
        assert cfg.model.scheduler is None and cfg.trainer.gradient_clip_val is None
    for experiment in ("clip_image_pretrain", "clipvil_pretrain"):
        paper = compose_train(f"experiment={experiment}", "hparams=wu2022")
        scheduler = _built_schedule(paper.model.scheduler, 5000)["lr_scheduler"]["scheduler"]
        assert scheduler.lr_lambdas[0](500) == 0.5 and scheduler.lr_lambdas[0](1000) == 1.0  # 1000 warm-up steps
    # the constant lr of the other pretraining experiments
    cfg = compose_train("experiment=clip_image_pretrain", "model.scheduler=null", "trainer.gradient_clip_val=null")
    assert cfg.model.scheduler is None and cfg.trainer.gradient_clip_val is None


def test_a_decaying_schedule_on_an_unbounded_run_is_a_clear_error(compose_train):
    cfg = compose_train("experiment=clip_image_pretrain")
    with pytest.raises(ValueError, match="no bound.*trainer.max_steps=-1 and trainer.max_epochs=-1"):
        _built_schedule(cfg.model.scheduler, float("inf"))


def test_wu2022_berson_finetune_one_lr_and_the_authors_reference_rule(compose_train):
    """The module the preset builds (its fast_dev_run, under both precisions, is in
    tests/test_train.py's experiment x preset x precision matrix)."""
    cfg = compose_train("experiment=berson_finetune", "hparams=wu2022", *TINY_EXTRA["berson_finetune"])
    model = instantiate(cfg.model)
    groups = model.param_groups()
    assert all("lr" not in group for group in groups)  # every group takes the optimizer's lr 5e-6
    assert cfg.model.optimizer.lr == 5e-6 and cfg.model.head_lr is None
    # Wu et al. fine-tune BERSON's head as released, not seqaware's
    assert cfg.model.decoder.variant == "paper" and model.decoder.variant == "paper"
    plain = compose_train("experiment=berson_finetune", *TINY_EXTRA["berson_finetune"])
    assert plain.model.decoder.variant == "ours"
    # Wu et al. fine-tune every pretrained layer; seqaware draws the layers it adds afresh
    assert (cfg.model.encoder.ckpt_new_layers, plain.model.encoder.ckpt_new_layers) == ("keep", "fresh")
    pre = compose_train("experiment=clipvil_pretrain", "hparams=wu2022")
    assert pre.model.optimizer.lr == 1e-5 and pre.model.head_lr is None   # Table 11: one lr for pretraining too
    assert model.test_metrics.reference_selection == "wu2022"
    assert cfg.model.optimizer.fused is True and cfg.trainer.gradient_clip_val == 1.0  # the pair that crashed on bf16


def test_reference_selection_reaches_the_module_metrics(compose_train):
    cfg = compose_train("experiment=order_baseline", "model.reference_selection=wu2022", "model.net.dim=16")
    model = instantiate(cfg.model)
    assert model.val_metrics.reference_selection == model.test_metrics.reference_selection == "wu2022"
    assert model.hparams.reference_selection == "wu2022"


def test_wu2022_linear_warmup_then_decay_on_the_optimizer(compose_train):
    """The preset's scheduler as configure_optimizers builds it: lr rises linearly over the warm-up, then decays to 0."""
    from hydra.utils import get_class

    cfg = compose_train("experiment=order_baseline", "hparams=wu2022", "stage=finetune_text")
    sched_cfg = OmegaConf.to_container(cfg.model.scheduler, resolve=True)
    sched_cfg.pop("interval")
    assert sched_cfg.pop("warmup_ratio") is None  # seqaware's key (a fraction), off: the preset's step count applies
    opt_cfg = OmegaConf.to_container(cfg.model.optimizer, resolve=True)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = get_class(opt_cfg.pop("_target_"))([param], **opt_cfg)
    scheduler = instantiate(sched_cfg, optimizer=optimizer, num_training_steps=300)
    lrs = []
    for _ in range(300):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == 0.0 and lrs[50] == pytest.approx(2.5e-6) and lrs[100] == pytest.approx(5e-6)
    assert lrs[200] == pytest.approx(2.5e-6) and lrs[299] == pytest.approx(5e-6 / 200)


@pytest.mark.parametrize("ratio, warmup", [(0.1, 20), (0.0, 0), (0.051, 11)])
def test_warmup_ratio_is_a_fraction_of_the_run(ratio, warmup):
    """``model.scheduler.warmup_ratio`` warms up over ceil(ratio x the run's optimizer steps), then
    decays linearly to 0 at the last step (what the pretraining experiments use for any max_steps)."""
    built = _built_schedule({"_target_": "transformers.get_linear_schedule_with_warmup", "warmup_ratio": ratio,
                             "interval": "step"}, 200)
    lrs = _lrs(built, 200)
    assert max(lrs) == pytest.approx(1e-3) and lrs.index(max(lrs)) == warmup
    assert lrs[-1] == pytest.approx(1e-3 / (200 - warmup))


def test_warmup_ratio_with_a_step_count_or_a_schedule_without_warmup_is_a_clear_error():
    for sched in ({"_target_": "transformers.get_linear_schedule_with_warmup", "warmup_ratio": 0.1,
                   "num_warmup_steps": 5},
                  {"_target_": "torch.optim.lr_scheduler.StepLR", "warmup_ratio": 0.1, "step_size": 10}):
        with pytest.raises(ValueError, match="warmup_ratio"):
            _built_schedule(sched, 200)


def _collate_one_step(cfg, tmp_path, text: str):
    """The composed data config's collator on one procedure of two steps (the first with ``text``, both
    with a 64-px image): its batch."""
    from PIL import Image

    from data_modules.views import ViewItem
    from seqaware.procedure import Step

    Image.new("RGB", (64, 64), (200, 30, 30)).save(tmp_path / "step.png")
    steps = [Step(text=text, images=["step.png"]), Step(text="Second step.", images=["step.png"])]
    item = ViewItem("p", steps, [0, 1], [0, 1], [[0, 1]], None, [], str(tmp_path))
    return instantiate(cfg.data).collator([item])


@pytest.mark.parametrize("experiment", ["clipvil_pretrain", "visualbert_pretrain", "berson_finetune"])
def test_wu2022_input_limits_are_the_papers(compose_train, tmp_path, experiment):
    """Sec. 5.2: 60 word pieces per step, 224 x 224 images (7 x 7 = 49 CLIP patches), whatever the
    experiment's own (CPU-sized) limits are."""
    words = " ".join(f"word{i}" for i in range(100))  # a 100-word, 1-sentence step: far over 60 word pieces
    paper = _collate_one_step(compose_train(f"experiment={experiment}", "hparams=wu2022"), tmp_path, words)
    assert paper["input_ids"].shape[-1] == 60 and int(paper["attention_mask"][0, 0].sum()) == 60  # [CLS] + 58 + [SEP]
    assert paper["pixel_values"].shape[-2:] == (224, 224)
    plain = _collate_one_step(compose_train(f"experiment={experiment}"), tmp_path, words)
    assert plain["pixel_values"].shape[-2:] == (128, 128)  # the experiments' CPU-sized images
    if experiment != "berson_finetune":
        assert plain["input_ids"].shape[-1] == 24


def test_wu2022_224px_images_give_49_visual_tokens(compose_train):
    """7 x 7 = 49 tokens per 224-px image (sec. 5.2) from the offline backbone the preset composes with."""
    cfg = compose_train("experiment=clipvil_pretrain", "hparams=wu2022", *TINY_EXTRA["clipvil_pretrain"][:1])
    encoder = instantiate(cfg.model.encoder)
    feats, patch_mask = encoder.visual_features(torch.zeros(1, 3, cfg.data.collator.image_size, cfg.data.collator.image_size))
    assert feats.shape[1] == 49 and (patch_mask is None or bool(patch_mask.all()))


def test_wu2022_pretraining_is_eq1_one_objective_per_mini_batch_beside_mlm(compose_train):
    """Eq. 1 (sec. 4.2.4): L = L_MLM + L_obj with obj drawn per mini-batch: over many steps every step has
    MLM and exactly one other objective, each about equally often; seqaware's default also runs SMRM at
    every step (ISP alone rotates)."""
    from collections import Counter

    def draws(*overrides):
        module = instantiate(compose_train("experiment=clipvil_pretrain", *overrides, *TINY_EXTRA["clipvil_pretrain"]).model)
        return [module.schedule.draw(step) for step in range(3000)]

    paper = draws("hparams=wu2022")
    assert all(len(d) == 2 and d[0] == "mlm" for d in paper)
    counts = Counter(d[1] for d in paper)
    assert set(counts) == {"isp", "smrm"} and abs(counts["isp"] / 3000 - 0.5) < 0.04, counts
    paper_all = draws("hparams=wu2022", "objectives=all")
    counts = Counter(d[1] for d in paper_all)
    assert all(len(d) == 2 for d in paper_all) and set(counts) == {"isp", "pisp", "smrm"}
    assert all(abs(c / 3000 - 1 / 3) < 0.04 for c in counts.values()), counts
    assert all(d == ("mlm", "smrm", "isp") for d in draws())  # seqaware's default: MLM + SMRM, ISP alone rotates


def test_the_pretraining_and_fine_tuning_defaults_and_what_wu2022_keeps_of_them(compose_train):
    """The defaults docs/results/label_efficiency.md measured: pretraining at encoder lr 2e-5 with the new layers and
    heads at 1e-3 (the image-only recipe keeps its measured one lr of 1e-4); BERSON fine-tuned from a pretraining run
    draws its own step embedding. hparams=wu2022: one lr everywhere (Table 11)."""
    for experiment in ("clipvil_pretrain", "visualbert_pretrain", "roberta_pretrain"):
        m = compose_train(f"experiment={experiment}").model
        assert (m.optimizer.lr, m.head_lr) == (2e-5, 1e-3), experiment
        assert compose_train(f"experiment={experiment}", "hparams=wu2022").model.head_lr is None
    m = compose_train("experiment=clip_image_pretrain").model
    assert (m.optimizer.lr, m.head_lr) == (1e-4, None)
    assert compose_train("experiment=berson_finetune").model.encoder.ckpt_new_layers == "fresh"
