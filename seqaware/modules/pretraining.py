"""Lightning module for sequence-aware pretraining (Wu et al., ACL 2022, sec. 4; ``experiment=*_pretrain``).

Wiring only: a single-stream sequence encoder (:mod:`seqaware.encoders`), the enabled objectives
(:mod:`seqaware.objectives`) and their turn-taking schedule.

One training step
    1. ``fusion_input(encoder, batch)`` packs the step texts and runs the visual backbone once per
       step image.
    2. The schedule draws the objectives of this global step: the always-on ones
       (``model.objectives.always``: MLM in Wu et al.'s Eq. 1, MLM and SMRM by default) plus one of
       the other enabled objectives, from ``(schedule_seed, global_step)`` only, so every DDP rank
       draws the same one.
    3. Each drawn objective corrupts the fusion input in turn, in one order whatever the set
       (:data:`~seqaware.objectives.base.CORRUPTIONS`, declared by each objective's ``corrupts``):
       the moves first (SOP's step order, ISP's images, PISP's patches), then the masks (MLM's
       tokens, SMRM's regions), so every objective's targets stay aligned; an objective that changes
       an entry it did not declare raises.  One encoder forward over the corrupted input serves all
       of them, and SMRM also gets a no-grad pass over the input after the moves and before the
       masks, for its targets.
    4. ``loss`` = the sum of the drawn objectives' losses (``L_MLM + L_obj`` in Eq. 1).

Randomness of the corruption (``generator_scope``)
    ``rank`` (default): one CPU generator per ``(schedule_seed, global_step, objective, rank)``
    corrupts the whole local batch at once (fully vectorised; results depend on the DDP layout).
    ``sample``: every sample is corrupted with its own CPU ``torch.Generator`` seeded by
    ``(schedule_seed, global_step, objective, procedure id, first step index)``.  Each sample is
    first cut to its own length (its tokens, its steps) so the draw depends on nothing else in the
    batch: the corruption is the same whatever the batch composition, the number of ranks or the
    device -- a 2-rank DDP step equals the 1-process step on the same global batch (tested), and a
    run resumed on another number of GPUs sees the same corruption.  This costs a Python loop over
    the samples of the corruption (the encoder still runs batched): measured on an H100 at the
    paper size, batch 32 bf16, 294 vs 218 ms per step (scripts/bench/bench_pretrain.py).

Evaluation (validation / test)
    Always seeded per sample, by ``"eval"`` instead of the step, whatever ``generator_scope``: every
    evaluation sees the same corruption and a sequence's corruption does not depend on its batch.
    Each objective reports per-sequence sums (:meth:`~seqaware.objectives.base.Objective.sample_stats`);
    at the end of the epoch the records of every rank are gathered, each sequence kept once
    (distributed samplers pad with repeats), and ``<stage>/<obj>_loss`` / ``_acc`` are the split's
    summed target losses / hits over its number of targets (``<stage>/n`` sequences): the same on 1
    and N processes.  The exception is SMRM with ``vocab_scope: batch`` or ``global``, whose
    candidates are the regions of the (per-device) batch by design.

DDP
    ``loss_normalization: global`` rescales each objective's mean loss on a rank by
    ``world_size * n_rank / n_global`` (n = masked tokens for MLM, samples for ISP/PISP, masked
    patches for SMRM, summed over ranks with one small all-reduce), so the gradient DDP averages is
    exactly the gradient of the global-batch mean.  ``local`` keeps the per-rank means.
    Heads of objectives not drawn at a step get no gradient, which DDP's reducer would reject; we
    add ``0 * sum(unused head parameters)`` to the loss instead of ``find_unused_parameters=True``
    (that flag costs an extra graph traversal every step and hides real bugs).

Checkpoints
    The encoder is built from its config inside the module (``_recursive_: false``), so
    ``PretrainingModule.load_from_checkpoint(path)`` needs nothing else.  At the end of ``fit``,
    rank 0 writes ``<run folder>/encoder.pt`` (atomically): the encoder's state dict only (no
    objective heads), from the best checkpoint of the monitored validation loss when there is one
    (``export_weights: best``), else the final weights.  Fine-tuning loads it with
    ``model.encoder.ckpt=<run folder>/encoder.pt``.
    ``model.encoder.visual_ckpt`` initialises the encoder's visual tower from an image-only
    pretraining run's ``encoder.pt`` (two-stage pipeline: ``clip_image_pretrain`` first, then
    ``clipvil_pretrain model.encoder.visual_ckpt=...``). Both load in
    :func:`seqaware.encoders.create_encoder`, the one loading path of every module.

Frozen parts: BatchNorm layers anywhere in the encoder (ResNet/EfficientNet visual backbones)
stay in eval mode with frozen affine parameters when ``freeze_batchnorm`` (pretraining batches of
4 sequences give useless batch statistics), and a visual backbone with ``trainable: false``; every
other submodule is in train mode during fit (:class:`~seqaware.modules.base.SeqawareModule`).
"""
from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Optional

import torch
from hydra.utils import instantiate
from torch import nn

from seqaware.encoders.base import SequenceEncoder, fusion_input
from seqaware.encoders.contract import EncoderOutput
from seqaware.encoders.packing import check_packable
from seqaware.io import atomic_open
from seqaware.runs import best_checkpoint
from seqaware.modules.base import GatheredEvalMixin, SeqawareModule, as_container, gather_unique, global_share, world_size
from seqaware.objectives import OBJECTIVES, Objective, ObjectiveSchedule, build_objective, check_objectives
from seqaware.objectives.corruption import (check_corruption, corrupt_per_sample, corruption_kinds, corruption_order,
                                             cpu_generator, moves, stable_seed)

log = logging.getLogger(__name__)

GENERATOR_SCOPES = ("sample", "rank")
NORMALIZATIONS = ("global", "local")
EXPORTS = ("best", "last")

def freeze_batchnorm_layers(module: nn.Module) -> list[nn.Module]:
    """Every BatchNorm layer of ``module``, put in eval mode with its affine parameters frozen.

    Called from :meth:`PretrainingModule.frozen_modules` (so at every ``train()``) so that
    Lightning's switching between train and eval never re-enables batch statistics.
    """
    layers = [sub for sub in module.modules() if isinstance(sub, nn.modules.batchnorm._BatchNorm)]
    for sub in layers:
        sub.eval()
        for p in sub.parameters(recurse=False):
            p.requires_grad_(False)
    return layers


def chance_table(values: dict[str, float], stage: str, names: tuple[str, ...]) -> str:
    """Each objective's accuracy beside its chance level (``eval_metrics`` values), as markdown."""
    lines = [f"| objective | {stage} acc | chance | x chance |", "|---|---:|---:|---:|"]
    for name in names:
        acc, chance = values.get(f"{stage}/{name}_acc"), values.get(f"{stage}/{name}_chance")
        if acc is None or chance is None:
            continue
        ratio = f"{acc / chance:.1f}" if chance > 0 else "-"
        lines.append(f"| {name.upper()} | {acc:.3f} | {chance:.4g} | {ratio} |")
    return "\n".join(lines)


class PretrainingModule(GatheredEvalMixin, SeqawareModule):
    """Sequence-aware pretraining of a single-stream encoder (see the module docstring).

    Args:
        encoder: encoder config (``_target_`` + arguments, normally :func:`seqaware.encoders.create_encoder`,
            whose ``ckpt`` / ``visual_ckpt`` initialise it from earlier runs' ``encoder.pt``).
        optimizer / scheduler: as in :class:`~seqaware.modules.base.SeqawareModule`.
        objectives: ``enabled`` (an ``OBJECTIVE_SETS`` name of Wu et al. Table 3, or a list) and one
            entry of keyword arguments per objective (``mlm: {mask_prob: 0.15}``, ``smrm: {...}``);
            see ``configs/objectives/``.
        visual: the older spelling ``{ckpt: PATH}`` of ``encoder.visual_ckpt``, accepted from configs
            and checkpoints written before it moved.
        schedule_seed: seeds the objective turn-taking and the corruption.
        generator_scope: ``sample`` | ``rank`` (see the module docstring).
        loss_normalization: ``global`` | ``local`` (see the module docstring).
        freeze_batchnorm: keep BatchNorm layers in eval mode with frozen affine parameters.
        clean_pass_eval: SMRM's clean no-grad target pass runs without dropout.
        export_weights: ``best`` (best monitored checkpoint) | ``last`` weights go to ``encoder_file``.
        encoder_file: file name of the exported encoder state dict in the run folder.
        compile: ``true`` runs the encoder under ``torch.compile``, a dict passes its keys to it
            (``{mode: max-autotune, dynamic: false}``); ``false`` (default) runs it eagerly
            (:meth:`~seqaware.modules.base.SeqawareModule.compile_encoder`).
        packed: ``true`` runs the encoder's transformer on the real text + visual tokens only
            (:mod:`seqaware.encoders.packing`; BERT / MiniLM, RoBERTa, MPNet): the same losses and gradients
            within float rounding, no parameters of its own; ``false`` (default) the padded batch.
        head_lr: learning rate of the randomly initialised parts: the objectives' heads and the
            encoder's new layers (:meth:`~seqaware.encoders.base.SequenceEncoder.new_parameters`:
            visual projection, step embedding, ...); null: ``optimizer.lr`` for every parameter, as in
            Wu et al. (one lr, Table 11). A tied MLM decoder is the word embedding matrix and keeps
            the encoder's lr.
        tie_lm_head / wandb_samples: accepted from configs and checkpoints written before they
            moved: ``tie_lm_head`` (when set) becomes the default of every objective whose
            ``from_encoder`` takes it (``model.objectives.mlm.tie_lm_head``); the W&B sample table is
            the callback ``callbacks.pretrain_samples`` (:class:`seqaware.callbacks.PretrainingSampleTable`),
            so ``wandb_samples`` has no effect here.

    The module never names an objective: each enabled one is built by its class
    (:meth:`~seqaware.objectives.base.Objective.from_encoder`), says what its loss averages over
    (``loss_count``) and how its targets are laid out (``target_layout``).
    """

    half_precision_ready = True  # trainer.precision=bf16-true (float32 master weights): tests/test_master_weights.py
    monitor = "val/loss"         # the best checkpoint (exported as encoder.pt): the lowest validation loss
    monitor_mode = "min"

    def __init__(self, encoder: dict, optimizer: dict, objectives: Optional[dict] = None,
                 scheduler: Optional[dict] = None, visual: Optional[dict] = None, schedule_seed: int = 0,
                 generator_scope: str = "rank", loss_normalization: str = "global", tie_lm_head: Optional[bool] = None,
                 freeze_batchnorm: bool = True, clean_pass_eval: bool = True, export_weights: str = "best",
                 encoder_file: str = "encoder.pt", wandb_samples: Optional[int] = None,
                 head_lr: Optional[float] = None, compile: bool | dict = False, packed: bool = False):
        super().__init__()
        if not objectives or not objectives.get("enabled"):
            raise ValueError("model.objectives.enabled is not set: pick an objective set with objectives=NAME "
                             "(a file of configs/objectives/; python train.py --help lists them) or list the "
                             "objectives, model.objectives.enabled=[NAME,...] (seqaware.objectives.OBJECTIVES)")
        for name, value, allowed in (("generator_scope", generator_scope, GENERATOR_SCOPES),
                                     ("loss_normalization", loss_normalization, NORMALIZATIONS),
                                     ("export_weights", export_weights, EXPORTS)):
            if value not in allowed:
                raise ValueError(f"model.{name} must be one of {allowed}, got {value!r}")
        self.save_hyperparameters({
            "encoder": as_container(encoder), "optimizer": as_container(optimizer),
            "objectives": as_container(objectives), "scheduler": as_container(scheduler),
            "visual": as_container(visual), "schedule_seed": schedule_seed, "generator_scope": generator_scope,
            "loss_normalization": loss_normalization,
            "freeze_batchnorm": freeze_batchnorm, "clean_pass_eval": clean_pass_eval,
            "export_weights": export_weights, "encoder_file": encoder_file, "head_lr": head_lr,
            "compile": as_container(compile), "packed": bool(packed)})
        if head_lr is not None and not float(head_lr) > 0:
            raise ValueError(f"model.head_lr must be a positive learning rate or null, got {head_lr!r}")

        enc_cfg = dict(self.hparams.encoder)
        old_visual = (visual or {}).get("ckpt")
        if old_visual:  # model.visual.ckpt, before it became model.encoder.visual_ckpt
            if (visual or {}).get("module", "visual") != "visual" or enc_cfg.get("visual_ckpt"):
                raise ValueError("model.visual.ckpt is the older spelling of model.encoder.visual_ckpt; set only "
                                 "model.encoder.visual_ckpt (the visual tower is the encoder's 'visual' module)")
            enc_cfg["visual_ckpt"] = old_visual
        self.encoder: SequenceEncoder = instantiate(enc_cfg, _recursive_=False) if "_target_" in enc_cfg else None
        if not isinstance(self.encoder, SequenceEncoder):
            raise ValueError(f"model.encoder must build a seqaware SequenceEncoder, got {type(self.encoder).__name__}")
        for key in ("visual_ckpt", "ckpt"):
            if enc_cfg.get(key):
                log.info("initialised the encoder (%s) from %s", key, enc_cfg[key])

        obj_cfg = dict(self.hparams.objectives)
        enabled = obj_cfg.pop("enabled")
        always = obj_cfg.pop("always", None)
        self.objective_names = check_objectives(enabled if isinstance(enabled, str) else list(enabled),
                                                self.encoder.modality)
        self.objectives = nn.ModuleDict({name: self._build_objective(name, dict(obj_cfg.get(name) or {}), tie_lm_head)
                                         for name in self.objective_names})
        for objective in self.objectives.values():
            corruption_kinds(objective)  # an objective that does not say what it corrupts is refused here
        uncounted = [n for n, obj in self.objectives.items() if type(obj).loss_count is Objective.loss_count]
        if loss_normalization == "global" and uncounted:
            raise ValueError(f"model.loss_normalization=global needs each objective's loss_count (what its mean loss "
                             f"averages over); {uncounted} define none: add it to the class or set "
                             "model.loss_normalization=local")
        self.schedule = ObjectiveSchedule(list(self.objective_names), seed=schedule_seed, always=always)
        self.generator_scope = generator_scope
        self.loss_normalization = loss_normalization
        self.clean_pass_eval = clean_pass_eval
        self.freeze_bn = freeze_batchnorm
        if freeze_batchnorm:
            n = len(freeze_batchnorm_layers(self.encoder))
            if n:
                log.info("froze %d BatchNorm layers of the encoder", n)
        if packed:   # model.packed: the transformer on the real tokens only (seqaware/encoders/packing.py)
            check_packable(self.encoder)
            self.encoder.packed = True
        self.compile_encoder(as_container(compile))
        embeddings = getattr(self.encoder, "word_embeddings", None)
        if not self.encoder.uses_text and isinstance(embeddings, nn.Embedding):
            # an image-only encoder never reads its text model's word embeddings: without a gradient
            # DDP's reducer would wait for them forever
            embeddings.weight.requires_grad_(False)
        self._eval_records: dict[str, list[dict]] = {"val": [], "test": []}  # per-sequence sums, see _eval_step
        # train mode from construction on (outside a Trainer too); fit starts in train mode anyway
        # (SeqawareModule.on_fit_start), BatchNorm and frozen backbones staying in eval mode
        self.train(True)

    # ------------------------------------------------------------------ construction
    def param_groups(self) -> list[dict]:
        """One group of every trainable parameter, or, with ``head_lr``, the pretrained ones at
        ``optimizer.lr`` and the new ones (objective heads, the encoder's new layers) at ``head_lr``."""
        if self.hparams.get("head_lr") is None:
            return super().param_groups()
        trainable = [p for p in self.parameters() if p.requires_grad]
        encoder_ids = {id(p) for p in self.encoder.parameters()}
        new_ids = {id(p) for p in self.encoder.new_parameters()}
        new_ids |= {id(p) for p in self.objectives.parameters() if id(p) not in encoder_ids}  # tied decoder: encoder's
        old = [p for p in trainable if id(p) not in new_ids]
        new = [p for p in trainable if id(p) in new_ids]
        return [{"params": old}, {"params": new, "lr": float(self.hparams.head_lr)}]

    def _build_objective(self, name: str, kwargs: dict, tie_lm_head: Optional[bool]) -> nn.Module:
        from_encoder = OBJECTIVES[name].from_encoder
        if tie_lm_head is not None and "tie_lm_head" in inspect.signature(from_encoder).parameters:
            kwargs.setdefault("tie_lm_head", tie_lm_head)  # the module-level option of earlier configs
        return build_objective(name, self.encoder, **kwargs)

    def frozen_modules(self) -> list[nn.Module]:
        """The encoder's BatchNorm layers when ``freeze_batchnorm`` (see the module docstring)."""
        return freeze_batchnorm_layers(self.encoder) if self.freeze_bn else []

    # ------------------------------------------------------------------ corruption + losses
    def _sample_keys(self, batch: dict) -> list[str]:
        return [f"{m['id']}@{m['step_index'][0] if m.get('step_index') else 0}" for m in batch["meta"]]

    def _corrupt(self, name: str, fusion: dict, batch: dict, when: Any,
                 per_sample: Optional[bool] = None) -> tuple[dict, dict]:
        """Corrupt ``fusion`` for objective ``name`` at ``when`` (a global step or ``"eval"``);
        ``per_sample`` (default: ``generator_scope == "sample"``) seeds each sample by its id."""
        objective = self.objectives[name]
        seed = self.hparams.schedule_seed
        if per_sample is None:
            per_sample = self.generator_scope == "sample"
        if not per_sample:
            return objective.corrupt(fusion, cpu_generator(stable_seed(seed, when, name, self.global_rank)))
        seeds = [stable_seed(seed, when, name, key) for key in self._sample_keys(batch)]
        lengths = (fusion["attention_mask"].sum(1) if "attention_mask" in fusion
                   else torch.zeros(len(seeds), dtype=torch.long))
        return corrupt_per_sample(objective, fusion, lengths, batch["step_mask"].sum(1), seeds)

    def _clean_pass(self, fusion: dict) -> EncoderOutput:
        """No-grad encoder pass over the uncorrupted input (SMRM targets), without dropout."""
        was_training = self.training
        if self.clean_pass_eval and was_training:
            self.encoder.eval()
        try:
            with torch.no_grad():
                return self.encoder(fusion)
        finally:
            if self.clean_pass_eval and was_training:
                self.train(True)

    def fusion(self, batch: dict) -> dict[str, torch.Tensor]:
        """The encoder's fusion input of a collated batch.

        A batch that already carries ``visual_feats (B, S, P, D)`` (features cached by a frozen
        backbone, e.g. detector regions the collator attaches with ``data.collator.region_features``)
        skips the visual backbone; otherwise :func:`seqaware.encoders.base.fusion_input` runs it once
        per step image (see :func:`seqaware.encoders.base.step_visual_features`).
        """
        return fusion_input(self.encoder, batch)

    def _world(self) -> int:
        return world_size()

    def _weights(self, names: list[str], fusion: dict, targets: dict) -> dict[str, torch.Tensor]:
        """Per-objective factor turning the rank's mean loss into its share of the global-batch mean."""
        device = next(iter(targets.values())).device
        if self.loss_normalization == "local" or self._world() == 1:
            return {n: torch.ones((), device=device) for n in names}
        counts = [self.objectives[n].loss_count(targets).to(device).float() for n in names]
        return dict(zip(names, global_share(torch.stack(counts))))

    def _forward_group(self, batch: dict, names: tuple[str, ...], when: Any, fusion: Optional[dict] = None,
                       per_sample: Optional[bool] = None) -> tuple[dict, dict, EncoderOutput, dict[str, dict]]:
        """Corrupt with every objective of ``names``, run the encoder once (and the clean pass when
        an objective needs it). Returns the corrupted input, the targets, the outputs and each
        objective's extra ``forward`` arguments."""
        clean = fusion if fusion is not None else self.fusion(batch)
        corrupted, targets = clean, {}
        # one order whatever the set (seqaware.objectives.base.CORRUPTIONS): the objectives that move
        # content (steps, images, patches) first, then those that mask it (tokens, regions), so MLM's
        # labels are the tokens where the moved steps put them; the clean pass (SMRM's targets) sees
        # the input after every move and before any mask
        reference = clean
        for name in corruption_order(self.objectives, names):
            before = corrupted
            corrupted, tgt = self._corrupt(name, corrupted, batch, when, per_sample=per_sample)
            check_corruption(self.objectives[name], before, corrupted)
            if moves(self.objectives[name]):
                reference = corrupted
            targets.update(tgt)
        outputs = self.encoder(corrupted)
        if any(self.objectives[n].needs_clean_pass for n in names):
            clean_out = self._clean_pass(reference)
        kwargs: dict[str, dict] = {}
        for name in names:
            objective = self.objectives[name]
            kwargs[name] = {}
            if objective.needs_clean_pass:
                kwargs[name]["target_states"] = objective.select_target_states(clean_out)
                kwargs[name]["generator"] = cpu_generator(stable_seed(self.hparams.schedule_seed, when, name,
                                                                      "shuffle", self.global_rank))
        return corrupted, targets, outputs, kwargs

    def compute_losses(self, batch: dict, names: tuple[str, ...], when: Any,
                       fusion: Optional[dict] = None) -> tuple[torch.Tensor, dict, dict]:
        """Corrupt with every objective of ``names``, one encoder forward, their losses.

        Returns the total loss, the logs (``<obj>_loss``, ``<obj>_acc``, ...) and a dict with the
        corrupted input, targets and outputs (used for the W&B sample table).
        """
        corrupted, targets, outputs, kwargs = self._forward_group(batch, names, when, fusion)
        weights = self._weights(list(names), corrupted, targets)
        total = outputs.cls.new_zeros(())
        logs: dict[str, torch.Tensor] = {}
        for name in names:
            loss, obj_logs = self.objectives[name](outputs, targets, **kwargs[name])
            total = total + weights[name] * loss
            logs.update(obj_logs)
        return total, logs, dict(corrupted=corrupted, targets=targets, outputs=outputs)

    def _unused_heads_term(self, used: tuple[str, ...]) -> torch.Tensor:
        """``0 * sum`` of the parameters of objectives not run this step (keeps DDP's reducer happy)."""
        params = [p for name, obj in self.objectives.items() if name not in used
                  for p in obj.parameters() if p.requires_grad]
        if not params:
            return torch.zeros((), device=self.device)
        return sum(p.sum() for p in params) * 0.0

    # ------------------------------------------------------------------ Lightning hooks
    def on_before_optimizer_step(self, optimizer) -> None:
        """Drop the (all-zero) gradients of the heads whose objective was not drawn at this step.

        The ``0 * sum`` term of :meth:`_unused_heads_term` only serves DDP's reducer. Left as zero
        tensors, those gradients would still make AdamW update the heads from their stale momentum
        (about ten times their last step in total) and decay them; with ``None`` the optimiser skips
        them, so a head moves only at the steps its objective takes part in.
        """
        self.release_undrawn_heads(self.schedule.draw(self.global_step))
        super().on_before_optimizer_step(optimizer)  # half precision: to the float32 master weights

    def release_undrawn_heads(self, drawn: tuple[str, ...]) -> None:
        """Set to ``None`` the gradients of the objective heads not in ``drawn`` (see
        :meth:`on_before_optimizer_step`)."""
        for name, obj in self.objectives.items():
            if name not in drawn:
                for p in obj.parameters():
                    p.grad = None

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        names = self.schedule.draw(self.global_step)
        loss, logs, _ = self.compute_losses(batch, names, self.global_step)
        loss = loss + self._unused_heads_term(names)
        n = len(batch["meta"])
        # synced: the logged value is the global-batch loss (one scalar all-reduce per step)
        self.log("train/loss", loss, prog_bar=True, batch_size=n, sync_dist=True)
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, batch_size=n)
        return loss

    def _eval_groups(self) -> list[tuple[str, ...]]:
        """The objective groups every evaluation runs: each rotating objective with the
        always-on ones (MLM), or the always-on ones alone."""
        always, rotating = self.schedule.always, self.schedule.rotating
        return [always + (name,) for name in rotating] or [always]

    def _eval_step(self, stage: str, batch: dict, batch_idx: int) -> Optional[dict]:
        """Every enabled objective on the same batch (each with MLM when enabled); keeps, per
        sequence, the sums of each objective's per-target losses, hits and counts.

        The corruption is always seeded per sample by ``"eval"`` and the sequence's id (whatever
        ``generator_scope``): every evaluation pass sees the same corruption, and a sequence's
        corruption does not depend on the batch it falls in or on the number of processes.

        Returns, for the first batch, ``{"samples": {objectives, corrupted, targets, outputs}}`` of
        the first objective group (what :class:`seqaware.callbacks.PretrainingSampleTable` shows).
        """
        fusion = self.fusion(batch)
        keys = self._sample_keys(batch)
        rows: list[dict[str, float]] = [{} for _ in keys]
        samples = None
        for g, group in enumerate(self._eval_groups()):
            corrupted, targets, outputs, kwargs = self._forward_group(batch, group, "eval", fusion, per_sample=True)
            for name in group:
                stats = self.objectives[name].sample_stats(outputs, targets, **kwargs[name])
                for stat, values in stats.items():
                    for row, value in zip(rows, values.tolist()):
                        row[f"{g}/{name}/{stat}"] = value
            if batch_idx == 0 and g == 0:
                samples = {"objectives": group, "corrupted": corrupted, "targets": targets, "outputs": outputs}
        self._eval_records[stage].extend({"id": key, "stats": row} for key, row in zip(keys, rows))
        return {"samples": samples} if batch_idx == 0 else None

    def eval_metrics(self, records: list[dict], stage: str) -> dict[str, float]:
        """Split-level metrics from per-sequence records (each sequence once).

        ``<stage>/<obj>_loss`` and ``_acc`` (and extras such as ``smrm_num_candidates``) are sums
        over every target of the split divided by the number of targets, averaged over the groups
        the objective ran in (MLM runs in each); ``<stage>/<obj>_chance`` is the accuracy without
        learning (:meth:`~seqaware.objectives.base.Objective.chance`: 1 / vocabulary for MLM, the
        better constant answer for ISP / PISP, 1 / candidates for SMRM); ``<stage>/loss`` is the mean over groups of the
        group's summed objective losses (the training loss in expectation); ``<stage>/n`` counts
        the sequences.
        """
        totals: dict[str, float] = {}
        for rec in records:
            for key, value in rec["stats"].items():
                totals[key] = totals.get(key, 0.0) + value
        per_name: dict[str, list[float]] = {}
        group_losses: list[float] = []
        for g, group in enumerate(self._eval_groups()):
            group_loss = 0.0
            for name in group:
                count = totals.get(f"{g}/{name}/count", 0.0)
                for stat in sorted({k.split("/", 2)[2] for k in totals if k.startswith(f"{g}/{name}/")} - {"count"}):
                    value = totals[f"{g}/{name}/{stat}"] / count if count else 0.0
                    label = {"correct": "acc"}.get(stat, stat)
                    per_name.setdefault(f"{name}_{label}", []).append(value)
                    if stat == "loss":
                        group_loss += value
            group_losses.append(group_loss)
        values = {f"{stage}/{k}": sum(v) / len(v) for k, v in per_name.items()}
        for name, objective in self.objectives.items():
            stats = {k[len(name) + 1:]: values[f"{stage}/{k}"] for k in per_name if k.startswith(f"{name}_")}
            chance = objective.chance(stats) if "acc" in stats else None
            if chance is not None:
                values[f"{stage}/{name}_chance"] = float(chance)
        values[f"{stage}/loss"] = sum(group_losses) / len(group_losses)
        values[f"{stage}/n"] = float(len(records))
        return values

    def validation_metrics(self) -> list[str]:
        """``val/loss``, ``val/n`` and each enabled objective's ``_loss``, ``_acc`` and ``_chance``
        (:meth:`eval_metrics`; an objective's extra statistics are logged too but not listed)."""
        stats = [f"{name}_{stat}" for name in self.objectives for stat in ("loss", "acc", "chance")]
        return ["val/loss", "val/n", *(f"val/{k}" for k in stats)]

    def _log_eval(self, stage: str) -> None:
        # distributed samplers pad the last rank's share with repeats: each sequence counts once
        records = gather_unique(self._eval_records[stage], key=lambda r: r["id"])
        self._eval_records[stage] = []
        if records:  # every rank holds the same records, hence the same values: nothing to reduce
            values = self.eval_metrics(records, stage)
            self.log_dict(values, sync_dist=False)
            if stage == "test" and (self._trainer is None or self.trainer.is_global_zero):
                print("\n" + chance_table(values, stage, tuple(self.objectives)), flush=True)  # after the progress bar

    def validation_step(self, batch: dict, batch_idx: int) -> Optional[dict]:
        return self._eval_step("val", batch, batch_idx)

    def test_step(self, batch: dict, batch_idx: int) -> Optional[dict]:
        return self._eval_step("test", batch, batch_idx)

    # ------------------------------------------------------------------ export
    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        """The encoder's weights only (no objective heads), on CPU; under ``bf16-true`` the float32
        master weights."""
        state = self.full_precision_state_dict()
        return {k[len("encoder."):]: v.detach().cpu() for k, v in state.items() if k.startswith("encoder.")}

    def on_fit_end(self) -> None:
        """Rank 0 writes ``<run folder>/<encoder_file>`` for ``model.encoder.ckpt=`` (atomic)."""
        if not self.trainer.is_global_zero or self.trainer.sanity_checking:
            return
        state, source = self.encoder_state_dict(), "final weights"
        best = best_checkpoint(self.trainer) if self.hparams.export_weights == "best" else None
        if best is not None:
            blob = torch.load(best, map_location="cpu", weights_only=True)
            state = {k[len("encoder."):]: v for k, v in blob["state_dict"].items() if k.startswith("encoder.")}
            source = f"best checkpoint {best}"
        path = Path(self.trainer.default_root_dir) / self.hparams.encoder_file
        with atomic_open(path, "wb") as handle:
            torch.save(state, handle)
        log.info("wrote the encoder weights (%s) to %s: fine-tune with model.encoder.ckpt=%s", source, path, path)
