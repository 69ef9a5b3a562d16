"""A plan-aware TEO head: every step pair of a plan scored from one encoding of the whole plan.

The bare pair head (:mod:`seqaware.modules.teo_head`) reads two steps as a sentence pair and never
sees the plan.  This model reads it:

1. **Token level.**  The plan's steps are packed into ``[CLS] s_0 [SEP] s_1 [SEP] ...`` and run
   through the sequence encoder (MiniLM by default) once; plans longer than ``data.max_tokens`` are
   encoded in windows of whole steps (:func:`seqaware.encoders.steps.step_windows`), each step taken
   from the one window that owns it.  A step's embedding is the mean of its token states (the
   pooling all-MiniLM-L6-v2 was trained with), so every step is seen with the text around it.
2. **Step level.**  A small transformer over the plan's step embeddings, with sinusoidal
   step-index positions (Vaswani et al., 2017), gives contextual step states ``h_i``; positions are
   step indices, so no plan is cut whatever its length.
3. **Pairs.**  An MLP on ``[h_a, h_b, h_a * h_b, h_a - h_b, position features of (a, b)]``
   (``(b - a) / n``, ``a / n``, ``b / n``, the sign of ``b - a`` and ``1 / |b - a|``) gives the
   before / after / independent logits ``f(a, b)`` of every ordered pair.  With ``mirror`` (the
   default) the answer is ``(f(a, b) + P f(b, a)) / 2``, ``P`` swapping the before and after logits,
   so the pair presented the other way round gets exactly the swapped logits: the two presentations
   of a pair are answered consistently by construction.

Decision rule.  ``p_dep = p(before) + p(after)``; a pair is dependent when ``p_dep >= threshold``,
and then ``before`` if ``p(before) > p(after)`` (ties: ``before`` when ``a < b``), else
``independent``.  With ``threshold: val`` the threshold is chosen at every validation epoch on the
validation pairs' yes/no question "does step b depend on step a?" (original presentations: gold yes
for ``before``, no for ``independent``), maximising macro F1 (:func:`seqaware.metrics.classification.choose_threshold`),
and stored in the ``decision_threshold`` buffer, so a checkpoint carries the threshold of its own
validation; a number fixes it.  ``class_weights`` (before, after, independent) weight the
cross-entropy.

Evaluation.  TEO sets (original + swapped presentations): consistency accuracy, per-class F1 and the
majority row (:func:`seqaware.metrics.teo.teo_rows`), plus the yes/no question above
(``val/pair_*``).  CaT-Bench (Lal et al., EMNLP 2024) questions: "Must step *second* happen after
step *first*?" and "Must step *first* happen before step *second*?" (``first < second``) are both
answered yes when the model says the pair ``(first, second)`` is ``before`` (step *second* depends on
step *first*); accuracy, precision / recall / F1 of "yes", macro F1 (:func:`binary_rows`, with the
always-yes / always-no rows) and twin consistency (:func:`twin_consistency`).  Records of every
rank are gathered and each question counted once (:func:`gather_unique`).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn

from seqaware.encoders.base import SequenceEncoder, pack_steps
from seqaware.encoders.steps import pair_features, scatter_steps, step_means
from seqaware.metrics.classification import binary_rows, choose_threshold, format_table, initial_threshold, twin_consistency
from seqaware.metrics.teo import SWAPPED_LABEL, TEO_LABEL_ID, TEO_LABELS, predicted_pair_rows, teo_table
from seqaware.modules.base import GatheredEvalMixin, SeqawareModule, as_container, gather_unique

log = logging.getLogger(__name__)

SWAP = [TEO_LABEL_ID[SWAPPED_LABEL[label]] for label in TEO_LABELS]  # class ids with before <-> after: [1, 0, 2]
NUM_POSITION_FEATURES = 5
CATBENCH_COLUMNS = (("accuracy", "accuracy"), ("precision", "P yes"), ("recall", "R yes"), ("f1_yes", "dependent F1"),
                    ("macro_f1", "macro F1"), ("twin_consistency", "twin consistency"), ("n", "n"))
# what an evaluation logs, (logged name, row key): <stage>/pair_* (the yes/no question) and <stage>/teo_* on TEO sets,
# <stage>/catbench_* and <stage>/majority_* on CaT-Bench questions
PAIR_KEYS = (("accuracy", "accuracy"), ("f1_yes", "f1"), ("macro_f1", "macro_f1"))
TEO_KEYS = ("consistency_accuracy", "consistency_dependent", "macro_f1", "f1_before", "f1_after", "f1_independent")
CATBENCH_KEYS = (("accuracy", "accuracy"), ("precision_yes", "precision"), ("recall_yes", "recall"), ("f1_yes", "f1"),
                 ("macro_f1", "macro_f1"), ("twin_consistency", "twin_consistency"))
MAJORITY_KEYS = (("accuracy", "accuracy"), ("f1_yes", "f1"), ("macro_f1", "macro_f1"))


def sinusoidal_positions(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embeddings (Vaswani et al., 2017, sec. 3.5) of integer ``positions`` (any shape) -> (..., dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions.float()[..., None] * freqs
    out = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return F.pad(out, (0, dim - 2 * half))


def pair_position_features(num_steps: torch.Tensor, size: int) -> torch.Tensor:
    """(B, S, S, 5) features of presentation (a, b) in a plan of n steps: (b - a) / n, a / n, b / n,
    sign(b - a), 1 / |b - a| (0 on the diagonal)."""
    idx = torch.arange(size, device=num_steps.device, dtype=torch.float32)
    a, b = idx[:, None].expand(size, size), idx[None, :].expand(size, size)
    n = num_steps.float().clamp(min=1)[:, None, None]
    diff = (b - a)[None]
    inv = torch.where(diff != 0, 1.0 / diff.abs().clamp(min=1), torch.zeros_like(diff))
    return torch.stack([diff / n, a[None] / n, b[None] / n, diff.sign().expand_as(diff / n), inv.expand_as(diff / n)], -1)


def mirror_logits(logits: torch.Tensor) -> torch.Tensor:
    """``(f(a, b) + P f(b, a)) / 2`` for (B, S, S, 3) logits: the result at (b, a) is the result at
    (a, b) with before and after swapped."""
    return (logits + logits.transpose(1, 2)[..., SWAP]) / 2


def relations(probs: torch.Tensor, a: Sequence[int], b: Sequence[int], threshold: float) -> list[str]:
    """The decision rule of the module docstring for (N, 3) probabilities of presentations (a, b)."""
    out = []
    for (p_before, p_after, _), ai, bi in zip(probs.tolist(), a, b):
        if p_before + p_after < threshold:
            out.append("independent")
        elif p_before != p_after:
            out.append("before" if p_before > p_after else "after")
        else:
            out.append("before" if ai < bi else "after")
    return out


class TeoPlanHeadModule(GatheredEvalMixin, SeqawareModule):
    """Plan encoder (sequence encoder + step transformer) + pair MLP, trained with cross-entropy on
    every labelled presentation of each plan of the batch.

    Args:
        encoder: sequence encoder config (``configs/encoder/*``); ``encoder_trainable: false`` freezes it.
        step_dim, step_layers, step_heads, pair_hidden, dropout: sizes of the step transformer and pair MLP.
        mirror: tie the two presentations of a pair (``final(b, a) = P final(a, b)``).
        threshold: ``val`` (choose on validation, see the module docstring) or a number in (0, 1).
        threshold_metric: what the validation threshold maximises (a key of ``binary_report``).
        class_weights: cross-entropy weights of (before, after, independent), or None.
        optimizer, scheduler, head_lr: as for every seqaware module (``head_lr``: everything but the encoder).

    Frozen parts: the encoder when ``encoder_trainable`` is false (and what it freezes itself).
    """

    monitor = "val/pair_macro_f1"   # the best checkpoint: macro F1 of "does step b depend on step a?" (validation pairs)
    monitor_mode = "max"

    def __init__(self, encoder: dict, optimizer: dict, scheduler: Optional[dict] = None, encoder_trainable: bool = True,
                 step_dim: int = 256, step_layers: int = 2, step_heads: int = 4, pair_hidden: int = 256,
                 dropout: float = 0.1, mirror: bool = True, threshold: Any = "val", threshold_metric: str = "macro_f1",
                 class_weights: Optional[Sequence[float]] = None, head_lr: Optional[float] = None):
        super().__init__()
        initial = initial_threshold(threshold, "val")
        if class_weights is not None and len(class_weights) != len(TEO_LABELS):
            raise ValueError(f"model.class_weights needs {len(TEO_LABELS)} weights (before, after, independent), got {class_weights!r}")
        self.save_hyperparameters({
            "encoder": as_container(encoder), "optimizer": as_container(optimizer), "scheduler": as_container(scheduler),
            "encoder_trainable": encoder_trainable, "step_dim": step_dim, "step_layers": step_layers,
            "step_heads": step_heads, "pair_hidden": pair_hidden, "dropout": dropout, "mirror": mirror,
            "threshold": threshold, "threshold_metric": threshold_metric,
            "class_weights": list(class_weights) if class_weights is not None else None, "head_lr": head_lr})
        self.encoder: SequenceEncoder = instantiate(self.hparams.encoder)
        if self.encoder.modality != "text":
            raise ValueError("the plan TEO head packs step texts: use a text encoder (model.encoder: text)")
        if not encoder_trainable:
            for p in self.encoder.parameters():
                p.requires_grad_(False)
        self.step_proj = nn.Sequential(nn.Linear(self.encoder.hidden_size, step_dim), nn.LayerNorm(step_dim))
        layer = nn.TransformerEncoderLayer(step_dim, step_heads, dim_feedforward=2 * step_dim, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.step_encoder = nn.TransformerEncoder(layer, step_layers, enable_nested_tensor=False) if step_layers else None
        self.pair_mlp = nn.Sequential(nn.Linear(4 * step_dim + NUM_POSITION_FEATURES, pair_hidden), nn.GELU(),
                                      nn.Dropout(dropout), nn.Linear(pair_hidden, len(TEO_LABELS)))
        self.register_buffer("decision_threshold", torch.tensor(initial))
        if class_weights is not None:
            self.register_buffer("class_weights", torch.tensor([float(w) for w in class_weights]), persistent=False)
        else:
            self.class_weights = None
        self._eval_records: dict[str, list[dict[str, Any]]] = {"val": [], "test": []}
        self.test_predictions: list[dict] = []
        self.test_rows: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ model
    def frozen_modules(self) -> list[nn.Module]:
        return [] if self.hparams.encoder_trainable else list(self.encoder.modules())

    def param_groups(self) -> list[dict]:
        head = [p for name, p in self.named_parameters() if not name.startswith("encoder.")]
        group = {"params": head}
        if self.hparams.head_lr is not None:
            group["lr"] = float(self.hparams.head_lr)
        groups = [group]
        encoder = [p for p in self.encoder.parameters() if p.requires_grad]
        if encoder:
            groups.insert(0, {"params": encoder})
        return groups

    def step_embeddings(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean token state of every step, from the window that owns it: (B, S, H) and the step mask (B, S)
        (:func:`~seqaware.encoders.steps.step_means`, :func:`~seqaware.encoders.steps.scatter_steps`)."""
        slot_used = batch["window_step"] >= 0
        fusion = pack_steps(batch["input_ids"], batch["attention_mask"], slot_used,
                            self.encoder.cls_token_id, self.encoder.pad_token_id)
        tokens = self.encoder(fusion).text_states                               # (W, T, H)
        local = fusion["text_step"]                                            # slot of each token, -1: CLS/SEP/pad
        slot = local.clamp(min=0)
        index = batch["window_step"].gather(1, slot)                           # batch-wide step index
        owned = batch["window_owner"].gather(1, slot) & (local >= 0)
        num_steps = batch["num_steps"].to(tokens.device)
        steps = step_means(tokens, index, owned, int(num_steps.sum()))
        return scatter_steps(steps, num_steps)

    def forward(self, batch: dict) -> torch.Tensor:
        """(B, S, S, 3) before / after / independent logits of every presentation (a, b)."""
        steps, mask = self.step_embeddings(batch)
        return self.pair_logits(steps, mask, batch["num_steps"])

    def pair_logits(self, steps: torch.Tensor, mask: torch.Tensor, num_steps: torch.Tensor) -> torch.Tensor:
        """Step embeddings (B, S, H) + step mask (B, S) -> (B, S, S, 3) pair logits (steps 2 and 3 of
        the module docstring)."""
        S = steps.shape[1]
        h = self.step_proj(steps) + sinusoidal_positions(torch.arange(S, device=steps.device), self.hparams.step_dim)
        if self.step_encoder is not None:
            h = self.step_encoder(h, src_key_padding_mask=~mask)
        ha = h[:, :, None, :].expand(-1, -1, S, -1)
        hb = h[:, None, :, :].expand(-1, S, -1, -1)
        feats = torch.cat([pair_features(ha, hb), pair_position_features(num_steps.to(h.device), S)], -1)
        logits = self.pair_mlp(feats)
        return mirror_logits(logits) if self.hparams.mirror else logits

    # ------------------------------------------------------------------ steps
    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        labels = labels.to(logits.device)
        keep = labels >= 0
        if not bool(keep.any()):
            return logits.sum() * 0.0
        return F.cross_entropy(logits[keep].float(), labels[keep], weight=self.class_weights)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self(batch)
        loss = self._loss(logits, batch["labels"])
        keep = batch["labels"] >= 0
        n = int(keep.sum())
        self.log("train/loss", loss, prog_bar=True, batch_size=max(n, 1))
        self.log("train/acc", (logits.argmax(-1)[keep] == batch["labels"][keep]).float().mean(), batch_size=max(n, 1))
        return loss

    def _eval_step(self, stage: str, batch: dict) -> None:
        logits = self(batch).float()
        probs = logits.softmax(-1)
        labels = batch["labels"].to(logits.device)
        losses = F.cross_entropy(logits.permute(0, 3, 1, 2), labels, ignore_index=-100, reduction="none")
        for k, item in enumerate(batch["meta"]):
            pairs = item["pairs"]
            a = torch.tensor([p["a"] for p in pairs], device=logits.device)
            b = torch.tensor([p["b"] for p in pairs], device=logits.device)
            has_label = (labels[k, a, b] >= 0).tolist()
            for pair, p, loss, labelled in zip(pairs, probs[k, a, b].tolist(), losses[k, a, b].tolist(), has_label):
                self._eval_records[stage].append({"pair": pair, "probs": p, "loss": loss if labelled else None})

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    # ------------------------------------------------------------------ reports
    def _relations(self, records: list[dict]) -> list[str]:
        if not records:
            return []
        probs = torch.tensor([r["probs"] for r in records])
        return relations(probs, [r["pair"]["a"] for r in records], [r["pair"]["b"] for r in records],
                         float(self.decision_threshold))

    def _report(self, stage: str) -> dict[str, dict[str, Any]]:
        records = gather_unique(self._eval_records[stage], key=lambda r: (r["pair"].get("set", ""), r["pair"]["pair_id"]))
        self._eval_records[stage] = []
        losses = [r["loss"] for r in records if r["loss"] is not None]
        if losses:
            self.log(f"{stage}/loss", sum(losses) / len(losses), sync_dist=False)
        self.log(f"{stage}/n", float(len(records)), sync_dist=False)
        catbench = [r for r in records if r["pair"].get("set") == "catbench"]
        if catbench:
            return self._report_catbench(stage, catbench)
        return self._report_teo(stage, records)

    def _report_teo(self, stage: str, records: list[dict]) -> dict[str, dict[str, Any]]:
        original = [r for r in records if r["pair"]["set"] == "original"]
        swapped = [r for r in records if r["pair"]["set"] == "swapped"]
        if not original:
            return {}
        # the yes/no question "does step b depend on step a?" on the original presentations
        gold = ["yes" if r["pair"]["label"] == "before" else "no" for r in original]
        p_dep = [r["probs"][0] + r["probs"][1] for r in original]
        if stage == "val" and self.hparams.threshold == "val":
            tau, _ = choose_threshold(gold, p_dep, metric=self.hparams.threshold_metric)
            self.decision_threshold.fill_(tau)
        self.log(f"{stage}/threshold", float(self.decision_threshold), sync_dist=False)
        rel_original, rel_swapped = self._relations(original), self._relations(swapped)
        answers = ["yes" if y != "independent" else "no" for y in rel_original]
        binary = binary_rows(gold, {"plan head": answers})["plan head"]
        self.log_dict({f"{stage}/pair_{k}": float(binary[key]) for k, key in PAIR_KEYS}, sync_dist=False)
        rows, orig, swap = predicted_pair_rows([(r["pair"], y) for r, y in zip(original, rel_original)],
                                               [(r["pair"], y) for r, y in zip(swapped, rel_swapped)], "plan head")
        if len(orig) < len(original):
            log.warning("%s: %d of %d pairs were seen in both presentations; TEO scores use those only",
                        stage, len(orig), len(original))
        if not rows:
            return {}
        ours = rows["plan head"]
        self.log_dict({f"{stage}/teo_{k}": float(ours[k]) for k in TEO_KEYS}, sync_dist=False)
        self.log(f"{stage}/majority_consistency_accuracy", float(rows["majority"]["consistency_accuracy"]), sync_dist=False)
        if stage == "test":
            self.test_predictions = [{"id": p["pair_id"], "pred": y, "gold": p["label"]} for p, y in orig + swap]
        log.info("%s TEO pairs (threshold %.2f):\n%s", stage, float(self.decision_threshold), teo_table(rows))
        return rows

    def _report_catbench(self, stage: str, records: list[dict]) -> dict[str, dict[str, Any]]:
        rel = self._relations(records)
        # first < second in CaT-Bench: both questions of a pair are "yes" when (first, second) is "before"
        answers = ["yes" if y == "before" else "no" for y in rel]
        gold = [r["pair"]["answer"] for r in records]
        rows = binary_rows(gold, {"plan head": answers})
        keys = [(r["pair"]["plan_id"], r["pair"]["first"], r["pair"]["second"]) for r in records]
        for name, row in rows.items():
            given = answers if name == "plan head" else [name.split()[-1].strip("()")] * len(records)
            row.update(twin_consistency(keys, given))
        ours = rows["plan head"]
        self.log_dict({f"{stage}/catbench_{k}": float(ours[key]) for k, key in CATBENCH_KEYS}, sync_dist=False)
        majority = next(name for name in rows if name.startswith("majority"))
        self.log_dict({f"{stage}/majority_{k}": float(rows[majority][key]) for k, key in MAJORITY_KEYS}, sync_dist=False)
        self.log(f"{stage}/threshold", float(self.decision_threshold), sync_dist=False)
        if stage == "test":
            self.test_predictions = [
                {"id": r["pair"]["pair_id"], "direction": r["pair"]["direction"], "first": r["pair"]["first"],
                 "second": r["pair"]["second"], "p_dependent": r["probs"][0] + r["probs"][1], "pred_relation": y,
                 "answer": ans, "gold": r["pair"]["answer"]}
                for r, y, ans in zip(records, rel, answers)]
        log.info("%s CaT-Bench questions (threshold %.2f):\n%s", stage, float(self.decision_threshold),
                 format_table(rows, CATBENCH_COLUMNS))
        return rows

    _log_eval = _report  # GatheredEvalMixin scores each epoch with it (the test rows land in test_rows)

    def validation_metrics(self) -> list[str]:
        """``val/loss``, ``val/n``, ``val/threshold``, then on TEO sets ``val/pair_*``, ``val/teo_*`` and the majority
        row's consistency, on CaT-Bench questions ``val/catbench_*`` and ``val/majority_*`` (:meth:`_report`)."""
        names = ["loss", "n", "threshold", *(f"pair_{k}" for k, _ in PAIR_KEYS), *(f"teo_{k}" for k in TEO_KEYS),
                 "majority_consistency_accuracy", *(f"catbench_{k}" for k, _ in CATBENCH_KEYS),
                 *(f"majority_{k}" for k, _ in MAJORITY_KEYS)]
        return [f"val/{name}" for name in names]
