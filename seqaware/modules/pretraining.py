"""Lightning module for sequence-aware pretraining (Wu et al., ACL 2022, sec. 4; ``experiment=*_pretrain``).

Wiring only: a single-stream sequence encoder (:mod:`seqaware.encoders`), the enabled objectives
(:mod:`seqaware.objectives`) and their turn-taking schedule.

One training step
    1. ``fusion_input(encoder, batch)`` packs the step texts and runs the visual backbone once per
       step image.
    2. The schedule draws the objectives of this global step: MLM (when enabled) plus one of the
       other enabled objectives, from ``(schedule_seed, global_step)`` only, so every DDP rank draws
       the same one.
    3. Each drawn objective corrupts the fusion input in turn (MLM touches the token ids, ISP/PISP/
       SMRM the visual entries, so they compose); one encoder forward over the corrupted input
       serves all of them, and SMRM also gets a no-grad pass over the clean input for its targets.
    4. ``loss = L_MLM + L_obj``.

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
    paper size, batch 32 bf16, 294 vs 218 ms per step (scripts/bench_pretrain.py).

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
    ``visual.ckpt`` initialises the encoder's visual tower (submodule ``visual.module``) from an
    image-only pretraining run's ``encoder.pt`` (two-stage pipeline: ``clip_image_pretrain`` first,
    then ``clipvil_pretrain model.visual.ckpt=...``).

Frozen parts: BatchNorm layers anywhere in the encoder (ResNet/EfficientNet visual backbones)
stay in eval mode with frozen affine parameters when ``freeze_batchnorm`` (pretraining batches of
4 sequences give useless batch statistics), and a visual backbone with ``trainable: false``; every
other submodule is in train mode during fit (:class:`~seqaware.modules.base.SeqawareModule`).
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn

from seqaware.encoders.base import SequenceEncoder, fusion_input
from seqaware.encoders.checkpoint import load_encoder_checkpoint
from seqaware.io import atomic_open
from seqaware.modules.base import SeqawareModule, as_container, gather_unique, global_share, world_size
from seqaware.objectives import ObjectiveSchedule, build_objective, check_objectives
from seqaware.objectives.base import EncoderOutput, Objective
from seqaware.objectives.mlm import IGNORE_INDEX

log = logging.getLogger(__name__)

GENERATOR_SCOPES = ("sample", "rank")
NORMALIZATIONS = ("global", "local")
EXPORTS = ("best", "last")

# fusion-input entries by layout: "text" (B, T, ...) or "step" (B, S, ...); padding value
FUSION_LAYOUT: dict[str, tuple[str, Any]] = {
    "input_ids": ("text", None), "attention_mask": ("text", 0), "text_step": ("text", -1),
    "token_type_ids": ("text", 0), "visual_feats": ("step", 0.0), "visual_mask": ("step", False),
    "patch_mask": ("step", False),
}
# objective targets by layout: "sample" = (B, ...) independent of T and S
TARGET_LAYOUT: dict[str, tuple[str, Any]] = {
    "mlm_labels": ("text", IGNORE_INDEX),
    "isp_labels": ("sample", None), "isp_steps": ("sample", None),
    "pisp_labels": ("sample", None), "pisp_steps": ("sample", None), "pisp_num_patches": ("sample", None),
    "pisp_swapped": ("step", False),
    "smrm_mask": ("step", False),
}
# what an objective's mean loss averages over (for the exact global-batch loss under DDP)
LOSS_COUNTS: dict[str, Callable[[dict, dict], torch.Tensor]] = {
    "mlm": lambda fusion, t: (t["mlm_labels"] != IGNORE_INDEX).sum(),
    "isp": lambda fusion, t: torch.tensor(t["isp_labels"].shape[0], device=t["isp_labels"].device),
    "pisp": lambda fusion, t: torch.tensor(t["pisp_labels"].shape[0], device=t["pisp_labels"].device),
    "smrm": lambda fusion, t: t["smrm_mask"].sum(),
}


def stable_seed(*keys: Any) -> int:
    """A 63-bit seed from any printable keys, identical across processes and Python runs
    (``hash()`` of a string is salted per process, so it cannot be used)."""
    digest = hashlib.blake2b("\x1f".join(map(str, keys)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def cpu_generator(seed: int) -> torch.Generator:
    """A CPU generator: the same numbers on every device (objectives move their noise to the data)."""
    return torch.Generator().manual_seed(int(seed))


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


class TiedLMHead(nn.Module):
    """BERT-style MLM head whose output projection is the encoder's input embedding matrix.

    ``Linear(H, H) -> GELU -> LayerNorm -> x @ E^T + b``.  The embedding is referenced, not
    registered, so it appears once in the state dict (under the encoder).
    """

    def __init__(self, embedding: nn.Embedding, hidden_size: int, eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=eps)
        self.bias = nn.Parameter(torch.zeros(embedding.num_embeddings))
        self.__dict__["_embedding"] = embedding  # not a submodule: no duplicate in state_dict / optimiser

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(F.gelu(self.dense(states)))
        return F.linear(hidden, self._embedding.weight, self.bias)


def _slice_sample(tensors: dict, b: int, length: int, steps: int, layout: dict) -> dict:
    """Sample ``b`` of every entry, cut to its own ``length`` tokens and ``steps`` steps."""
    out = {}
    for key, value in tensors.items():
        kind = layout.get(key, ("sample", None))[0]
        row = value[b:b + 1]
        if kind == "text":
            row = row[:, :length]
        elif kind == "step":
            row = row[:, :steps]
        out[key] = row
    return out


def _pad_like(value: torch.Tensor, kind: str, fill: Any, template: Optional[torch.Tensor],
              T: int, S: int) -> torch.Tensor:
    """Pad a (1, t, ...) / (1, s, ...) sample back to the batch's T / S (template row or ``fill``)."""
    if kind == "sample":
        return value
    full = T if kind == "text" else S
    if value.shape[1] == full:
        return value
    if template is not None:
        out = template.clone()
    else:
        out = value.new_full((1, full, *value.shape[2:]), fill)
    out[:, :value.shape[1]] = value
    return out


def corrupt_per_sample(objective: Objective, fusion: dict, lengths: torch.Tensor, steps: torch.Tensor,
                       seeds: list[int]) -> tuple[dict, dict]:
    """Corrupt every sample on its own, cut to its real length, with the generator of its seed.

    ``lengths`` (B,) real tokens per sample (0 without text), ``steps`` (B,) real steps.  The
    pieces are padded back to the batch shape and concatenated; untouched entries are shared.
    """
    B = len(seeds)
    T = fusion["input_ids"].shape[1] if "input_ids" in fusion else 0
    S = fusion["visual_mask"].shape[1] if "visual_mask" in fusion else 0
    lengths_l, steps_l = lengths.tolist(), steps.tolist()
    parts_in: list[dict] = []
    parts_tgt: list[dict] = []
    changed: dict[str, None] = {}
    for b in range(B):  # the corruption only: a few small ops per sample (see the module docstring)
        sample = _slice_sample(fusion, b, lengths_l[b], steps_l[b], FUSION_LAYOUT)
        corrupted, targets = objective.corrupt(sample, cpu_generator(seeds[b]))
        changed.update({k: None for k, v in corrupted.items() if v is not sample.get(k)})
        parts_in.append(corrupted)
        parts_tgt.append(targets)
    out = dict(fusion)
    for key in changed:
        kind, fill = FUSION_LAYOUT.get(key, ("sample", None))
        out[key] = torch.cat([_pad_like(p[key], kind, fill, fusion[key][b:b + 1] if key in fusion else None, T, S)
                              for b, p in enumerate(parts_in)])
    targets = {}
    for key in parts_tgt[0]:
        if key not in TARGET_LAYOUT:
            raise ValueError(f"{objective.name}: target {key!r} has no entry in "
                             "seqaware.modules.pretraining.TARGET_LAYOUT (text/step/sample layout); add it "
                             "or use model.generator_scope=rank")
        kind, fill = TARGET_LAYOUT[key]
        targets[key] = torch.cat([_pad_like(p[key], kind, fill, None, T, S) for p in parts_tgt])
    return out, targets


class PretrainingModule(SeqawareModule):
    """Sequence-aware pretraining of a single-stream encoder (see the module docstring).

    Args:
        encoder: encoder config (``_target_`` + arguments, e.g. :class:`seqaware.encoders.text.TextEncoder`);
            an extra ``ckpt`` key initialises it from an earlier run's ``encoder.pt``.
        optimizer / scheduler: as in :class:`~seqaware.modules.base.SeqawareModule`.
        objectives: ``enabled`` (an ``OBJECTIVE_SETS`` name of Wu et al. Table 3, or a list) and one
            entry of keyword arguments per objective (``mlm: {mask_prob: 0.15}``, ``smrm: {...}``);
            see ``configs/objectives/``.
        visual: ``{ckpt: PATH, module: visual}`` initialise the encoder submodule ``module`` from
            an image-only run's ``encoder.pt`` (or Lightning checkpoint).
        schedule_seed: seeds the objective turn-taking and the corruption.
        generator_scope: ``sample`` | ``rank`` (see the module docstring).
        loss_normalization: ``global`` | ``local`` (see the module docstring).
        tie_lm_head: MLM head projects onto the encoder's word embeddings (BERT-style) when it
            exposes ``word_embeddings``; else a separate ``Linear``.
        freeze_batchnorm: keep BatchNorm layers in eval mode with frozen affine parameters.
        clean_pass_eval: SMRM's clean no-grad target pass runs without dropout.
        export_weights: ``best`` (best monitored checkpoint) | ``last`` weights go to ``encoder_file``.
        encoder_file: file name of the exported encoder state dict in the run folder.
        wandb_samples: rows of the W&B sample table logged at each validation (0: none).
    """

    def __init__(self, encoder: dict, optimizer: dict, objectives: Optional[dict] = None,
                 scheduler: Optional[dict] = None, visual: Optional[dict] = None, schedule_seed: int = 0,
                 generator_scope: str = "rank", loss_normalization: str = "global", tie_lm_head: bool = True,
                 freeze_batchnorm: bool = True, clean_pass_eval: bool = True, export_weights: str = "best",
                 encoder_file: str = "encoder.pt", wandb_samples: int = 4):
        super().__init__()
        if not objectives or not objectives.get("enabled"):
            raise ValueError("model.objectives.enabled is not set: pick an objective set with objectives=NAME "
                             "(configs/objectives/: mlm, mlm_isp, mlm_smrm, mlm_isp_pisp, mlm_isp_smrm, all, "
                             "isp, isp_pisp, isp_pisp_smrm)")
        for name, value, allowed in (("generator_scope", generator_scope, GENERATOR_SCOPES),
                                     ("loss_normalization", loss_normalization, NORMALIZATIONS),
                                     ("export_weights", export_weights, EXPORTS)):
            if value not in allowed:
                raise ValueError(f"model.{name} must be one of {allowed}, got {value!r}")
        self.save_hyperparameters({
            "encoder": as_container(encoder), "optimizer": as_container(optimizer),
            "objectives": as_container(objectives), "scheduler": as_container(scheduler),
            "visual": as_container(visual), "schedule_seed": schedule_seed, "generator_scope": generator_scope,
            "loss_normalization": loss_normalization, "tie_lm_head": tie_lm_head,
            "freeze_batchnorm": freeze_batchnorm, "clean_pass_eval": clean_pass_eval,
            "export_weights": export_weights, "encoder_file": encoder_file, "wandb_samples": wandb_samples})

        enc_cfg = dict(self.hparams.encoder)
        enc_ckpt = enc_cfg.pop("ckpt", None)
        self.encoder: SequenceEncoder = instantiate(enc_cfg, _recursive_=False) if "_target_" in enc_cfg else None
        if not isinstance(self.encoder, SequenceEncoder):
            raise ValueError(f"model.encoder must build a seqaware SequenceEncoder, got {type(self.encoder).__name__}")
        if enc_ckpt:
            load_encoder_checkpoint(self.encoder, enc_ckpt)
            log.info("loaded encoder weights from %s", enc_ckpt)
        visual = dict(self.hparams.visual or {})
        if visual.get("ckpt"):
            module = visual.get("module") or "visual"
            if not isinstance(getattr(self.encoder, module, None), nn.Module):
                raise ValueError(f"model.visual.ckpt: the encoder {type(self.encoder).__name__} has no visual tower "
                                 f"'{module}' (a text-only encoder?); set model.visual.module or drop the ckpt")
            load_encoder_checkpoint(self.encoder, visual["ckpt"], submodule=module)
            log.info("initialised the encoder's %s tower from %s", module, visual["ckpt"])

        obj_cfg = dict(self.hparams.objectives)
        enabled = obj_cfg.pop("enabled")
        self.objective_names = check_objectives(enabled if isinstance(enabled, str) else list(enabled),
                                                self.encoder.modality)
        self.objectives = nn.ModuleDict({name: self._build_objective(name, dict(obj_cfg.get(name) or {}))
                                         for name in self.objective_names})
        uncounted = [n for n in self.objective_names if n not in LOSS_COUNTS]
        if loss_normalization == "global" and uncounted:
            raise ValueError(f"model.loss_normalization=global needs LOSS_COUNTS entries (what the mean loss averages "
                             f"over) for {uncounted} in seqaware/modules/pretraining.py; or set it to local")
        self.schedule = ObjectiveSchedule(list(self.objective_names), seed=schedule_seed)
        self.generator_scope = generator_scope
        self.loss_normalization = loss_normalization
        self.clean_pass_eval = clean_pass_eval
        self.freeze_bn = freeze_batchnorm
        if freeze_batchnorm:
            n = len(freeze_batchnorm_layers(self.encoder))
            if n:
                log.info("froze %d BatchNorm layers of the encoder", n)
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
    def _build_objective(self, name: str, kwargs: dict) -> nn.Module:
        kwargs.setdefault("hidden_size", self.encoder.hidden_size)
        if name == "mlm":
            enc = self.encoder
            for attr in ("vocab_size", "mask_token_id", "special_token_ids"):
                if not hasattr(enc, attr):
                    raise ValueError(f"objective 'mlm' needs the encoder's {attr}; {type(enc).__name__} has none")
            if enc.mask_token_id < 0:
                raise ValueError(f"objective 'mlm': the tokenizer of {type(enc).__name__} has no mask token")
            kwargs.setdefault("vocab_size", enc.vocab_size)
            kwargs.setdefault("mask_token_id", enc.mask_token_id)
            kwargs.setdefault("special_token_ids", list(enc.special_token_ids))
            embeddings = getattr(enc, "word_embeddings", None)
            if self.hparams.tie_lm_head and isinstance(embeddings, nn.Embedding):
                kwargs.setdefault("lm_head", TiedLMHead(embeddings, enc.hidden_size))
        return build_objective(name, **kwargs)

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
        return dict(zip(names, global_share(torch.stack([LOSS_COUNTS[n](fusion, targets).to(device).float() for n in names]))))

    def _forward_group(self, batch: dict, names: tuple[str, ...], when: Any, fusion: Optional[dict] = None,
                       per_sample: Optional[bool] = None) -> tuple[dict, dict, EncoderOutput, dict[str, dict]]:
        """Corrupt with every objective of ``names``, run the encoder once (and the clean pass when
        an objective needs it). Returns the corrupted input, the targets, the outputs and each
        objective's extra ``forward`` arguments."""
        clean = fusion if fusion is not None else self.fusion(batch)
        corrupted, targets = clean, {}
        for name in names:
            corrupted, tgt = self._corrupt(name, corrupted, batch, when, per_sample=per_sample)
            targets.update(tgt)
        outputs = self.encoder(corrupted)
        if any(self.objectives[n].needs_clean_pass for n in names):
            clean_out = self._clean_pass(clean)
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
        drawn = self.schedule.draw(self.global_step)
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

    def _eval_step(self, stage: str, batch: dict, batch_idx: int) -> None:
        """Every enabled objective on the same batch (each with MLM when enabled); keeps, per
        sequence, the sums of each objective's per-target losses, hits and counts.

        The corruption is always seeded per sample by ``"eval"`` and the sequence's id (whatever
        ``generator_scope``): every evaluation pass sees the same corruption, and a sequence's
        corruption does not depend on the batch it falls in or on the number of processes.
        """
        fusion = self.fusion(batch)
        keys = self._sample_keys(batch)
        rows: list[dict[str, float]] = [{} for _ in keys]
        for g, group in enumerate(self._eval_groups()):
            corrupted, targets, outputs, kwargs = self._forward_group(batch, group, "eval", fusion, per_sample=True)
            for name in group:
                stats = self.objectives[name].sample_stats(outputs, targets, **kwargs[name])
                for stat, values in stats.items():
                    for row, value in zip(rows, values.tolist()):
                        row[f"{g}/{name}/{stat}"] = value
            if stage == "val" and batch_idx == 0 and g == 0:
                self._log_wandb_samples(batch, group, dict(corrupted=corrupted, targets=targets, outputs=outputs))
        self._eval_records[stage].extend({"id": key, "stats": row} for key, row in zip(keys, rows))

    def eval_metrics(self, records: list[dict], stage: str) -> dict[str, float]:
        """Split-level metrics from per-sequence records (each sequence once).

        ``<stage>/<obj>_loss`` and ``_acc`` (and extras such as ``smrm_num_candidates``) are sums
        over every target of the split divided by the number of targets, averaged over the groups
        the objective ran in (MLM runs in each); ``<stage>/loss`` is the mean over groups of the
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
        values[f"{stage}/loss"] = sum(group_losses) / len(group_losses)
        values[f"{stage}/n"] = float(len(records))
        return values

    def _log_eval(self, stage: str) -> None:
        # distributed samplers pad the last rank's share with repeats: each sequence counts once
        records = gather_unique(self._eval_records[stage], key=lambda r: r["id"])
        self._eval_records[stage] = []
        if records:  # every rank holds the same records, hence the same values: nothing to reduce
            self.log_dict(self.eval_metrics(records, stage), sync_dist=False)

    def on_validation_epoch_start(self) -> None:
        self._eval_records["val"] = []

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")

    def on_test_epoch_start(self) -> None:
        self._eval_records["test"] = []

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch, batch_idx)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch, batch_idx)

    # ------------------------------------------------------------------ W&B samples
    def _log_wandb_samples(self, batch: dict, names: tuple[str, ...], extra: dict) -> None:
        """A wandb.Table of a few sequences (step images + texts) and the objectives' outcomes.

        Only when a WandbLogger is attached, on rank 0 and outside sanity checking; the CSV and
        TensorBoard loggers never reach this code.
        """
        rows = int(self.hparams.wandb_samples)
        if rows <= 0 or self._trainer is None or not self.trainer.is_global_zero or self.trainer.sanity_checking:
            return
        from pytorch_lightning.loggers import WandbLogger

        loggers = [lg for lg in self.trainer.loggers if isinstance(lg, WandbLogger)]
        if not loggers:
            return
        import wandb

        table = wandb.Table(columns=self._sample_columns(names))
        for row in self._sample_rows(batch, names, extra, rows, wandb.Image):
            table.add_data(*row)
        for lg in loggers:
            lg.experiment.log({"val/samples": table, "trainer/global_step": self.global_step})

    def _sample_columns(self, names: tuple[str, ...]) -> list[str]:
        cols = ["id", "steps", "images", "text"]
        for name in names:
            cols += [f"{name}_target", f"{name}_prediction"]
        return cols

    @torch.no_grad()
    def _sample_rows(self, batch: dict, names: tuple[str, ...], extra: dict, rows: int,
                     image_cls: Callable) -> list[list]:
        """Table rows: id, step indices, the step images side by side, the step texts, outcomes."""
        outputs: EncoderOutput = extra["outputs"]
        targets = extra["targets"]
        B = min(rows, len(batch["meta"]))
        outcomes: dict[str, tuple[list[str], list[str]]] = {}
        for name in names:
            objective = self.objectives[name]
            if name in ("isp", "pisp"):
                pred = objective.head(outputs.cls[:B]).argmax(-1).tolist()
                gold = targets[f"{name}_labels"][:B].tolist()
                outcomes[name] = ([str(g) for g in gold], [str(p) for p in pred])
            elif name == "mlm":
                labels = targets["mlm_labels"][:B]
                where = labels != IGNORE_INDEX
                pred = torch.full_like(labels, IGNORE_INDEX)
                if where.any():
                    pred[where] = objective.lm_head(outputs.text_states[:B][where]).argmax(-1)
                tok = getattr(getattr(self.trainer, "datamodule", None), "tokenizer", None)
                decode = (lambda ids: tok.convert_ids_to_tokens(ids)) if tok is not None else (lambda ids: ids)
                outcomes[name] = ([" ".join(map(str, decode(labels[b][where[b]].tolist()))) for b in range(B)],
                                  [" ".join(map(str, decode(pred[b][where[b]].tolist()))) for b in range(B)])
            elif name == "smrm":
                masked = targets["smrm_mask"][:B].flatten(1).sum(1).tolist()
                outcomes[name] = ([f"{m} masked patches" for m in masked], ["" for _ in masked])
        texts = self._step_texts(batch, B)
        out = []
        for b in range(B):
            meta = batch["meta"][b]
            image = None
            if "pixel_values" in batch:
                n = int(batch["step_mask"][b].sum())
                strip = torch.cat(list(batch["pixel_values"][b, :n]), dim=-1)  # (3, H, n*W)
                strip = (strip - strip.amin()) / (strip.amax() - strip.amin()).clamp(min=1e-6)
                image = image_cls(strip.permute(1, 2, 0).float().cpu().numpy())
            row = [meta["id"], str(meta.get("step_index")), image, texts[b]]
            for name in names:
                gold, pred = outcomes.get(name, ([""] * B, [""] * B))
                row += [gold[b], pred[b]]
            out.append(row)
        return out

    def _step_texts(self, batch: dict, B: int) -> list[str]:
        tok = getattr(getattr(self.trainer, "datamodule", None), "tokenizer", None) if self._trainer else None
        if tok is None or "input_ids" not in batch:
            return [""] * B
        texts = []
        for b in range(B):
            n = int(batch["step_mask"][b].sum())
            texts.append(" | ".join(tok.batch_decode(batch["input_ids"][b, :n], skip_special_tokens=True)))
        return texts

    # ------------------------------------------------------------------ export
    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        """The encoder's weights only (no objective heads), on CPU."""
        return {k: v.detach().cpu() for k, v in self.encoder.state_dict().items()}

    def on_fit_end(self) -> None:
        """Rank 0 writes ``<run folder>/<encoder_file>`` for ``model.encoder.ckpt=`` (atomic)."""
        if not self.trainer.is_global_zero or self.trainer.sanity_checking:
            return
        state, source = self.encoder_state_dict(), "final weights"
        best = None
        if self.hparams.export_weights == "best":
            for cb in self.trainer.checkpoint_callbacks:
                if getattr(cb, "monitor", None) and getattr(cb, "best_model_path", "") and Path(cb.best_model_path).is_file():
                    best = cb.best_model_path
                    break
        if best is not None:
            blob = torch.load(best, map_location="cpu", weights_only=True)
            state = {k[len("encoder."):]: v for k, v in blob["state_dict"].items() if k.startswith("encoder.")}
            source = f"best checkpoint {best}"
        path = Path(self.trainer.default_root_dir) / self.hparams.encoder_file
        with atomic_open(path, "wb") as handle:
            torch.save(state, handle)
        log.info("wrote the encoder weights (%s) to %s: fine-tune with model.encoder.ckpt=%s", source, path, path)
