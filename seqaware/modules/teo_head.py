"""A 3-way pairwise TEO head (before / after / independent) on a sequence encoder.

The cheap baseline beyond MATEO: the pair ``[CLS] step_A [SEP] step_B [SEP]`` (BERT segments 0/1)
runs through a sequence encoder (~100M parameters or less) and a linear head on [CLS] classifies
the relation, so an encoder can be compared with an 8B VLM on the same TEO metrics.

Validation: TEO consistency accuracy, per-class F1 and baselines on the original + swapped sets
(:mod:`seqaware.metrics.teo`).  Test: TEO sets again, or CaT-Bench yes/no questions
(``meta[*]["set"] == "catbench"``): accuracy, dependent F1 (the ``yes`` class) and macro F1 beside
the trivial baselines.  Test predictions are kept in :attr:`test_predictions` for ``train.py``.

Under DDP the records of every rank are gathered and each presentation counted once
(:func:`~seqaware.modules.base.gather_unique`, key ``(set, pair_id)``) before scoring, so the logged
metrics and the predictions file are those of one process.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn

from seqaware.encoders.base import SequenceEncoder, pack_steps, pair_segment_ids
from seqaware.metrics.classification import binary_rows, format_table, twin_consistency
from seqaware.metrics.teo import TEO_LABELS, predicted_pair_rows, teo_table
from seqaware.modules.base import GatheredEvalMixin, SeqawareModule, as_container, gather_unique

log = logging.getLogger(__name__)

BINARY_COLUMNS = (("accuracy", "accuracy"), ("f1_yes", "dependent F1"), ("macro_f1", "macro F1"),
                  ("twin_consistency", "twin consistency"), ("n", "n"))
# what an evaluation logs: <stage>/teo_<key> on TEO sets, <stage>/catbench_<key> and <stage>/majority_<key> on CaT-Bench
TEO_KEYS = ("consistency_accuracy", "macro_f1", "f1_before", "f1_after", "f1_independent")
CATBENCH_KEYS = ("accuracy", "f1_yes", "macro_f1", "twin_consistency")
MAJORITY_KEYS = ("accuracy", "f1_yes", "macro_f1")


class TeoHeadModule(GatheredEvalMixin, SeqawareModule):
    """Sequence encoder + dropout + ``Linear(H, 3)`` trained with cross-entropy on TEO pairs.

    Frozen parts (eval mode while the rest trains, see :class:`~seqaware.modules.base.SeqawareModule`):
    the visual backbone's BatchNorm layers (``freeze_bn``, the default) and the whole visual backbone
    with ``trainable: false``; nothing else (every Dropout of the encoder and the head trains).
    """

    half_precision_ready = True  # trainer.precision=bf16-true (float32 master weights): tests/test_master_weights.py
    monitor = "val/teo_consistency_accuracy"   # the best checkpoint: the highest consistency accuracy on TEO pairs
    monitor_mode = "max"

    def __init__(self, encoder: dict, optimizer: dict, scheduler: Optional[dict] = None, dropout: float = 0.1,
                 head_lr: Optional[float] = None):
        super().__init__()
        self.save_hyperparameters({"encoder": as_container(encoder), "optimizer": as_container(optimizer),
                                   "scheduler": as_container(scheduler), "dropout": dropout, "head_lr": head_lr})
        self.encoder: SequenceEncoder = instantiate(self.hparams.encoder)
        if not self.encoder.uses_text:
            raise ValueError("the TEO head reads step texts: use a text or multimodal encoder (model.encoder)")
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.encoder.hidden_size, len(TEO_LABELS)))
        self._eval_records: dict[str, list[dict[str, Any]]] = {"val": [], "test": []}
        self.test_predictions: list[dict] = []
        self.test_rows: dict[str, dict[str, Any]] = {}

    def param_groups(self) -> list[dict]:
        head = {"params": list(self.head.parameters())}
        if self.hparams.head_lr is not None:
            head["lr"] = float(self.hparams.head_lr)
        return [{"params": [p for p in self.encoder.parameters() if p.requires_grad]}, head]

    def forward(self, batch: dict) -> torch.Tensor:
        fusion = pack_steps(batch["input_ids"], batch["attention_mask"], None,
                            self.encoder.cls_token_id, self.encoder.pad_token_id)
        if self.encoder.modality == "text":  # BERT sentence-pair segments
            fusion["token_type_ids"] = pair_segment_ids(fusion)
        return self.head(self.encoder(fusion).cls)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self(batch)
        loss = F.cross_entropy(logits.float(), batch["labels"])  # float32 under bf16-true too
        n = len(batch["meta"])
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/acc", (logits.argmax(-1) == batch["labels"]).float().mean(), batch_size=n)
        return loss

    def _eval_step(self, stage: str, batch: dict) -> None:
        logits = self(batch)
        losses = F.cross_entropy(logits.float(), batch["labels"], ignore_index=-100, reduction="none").tolist()
        labelled = (batch["labels"] >= 0).tolist()
        for item, k, loss, has_label in zip(batch["meta"], logits.argmax(-1).tolist(), losses, labelled):
            self._eval_records[stage].append({"item": item, "pred": TEO_LABELS[k], "loss": loss if has_label else None})

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def _report(self, stage: str) -> dict[str, dict[str, Any]]:
        records = gather_unique(self._eval_records[stage], key=lambda r: (r["item"].get("set", ""), r["item"]["pair_id"]))
        self._eval_records[stage] = []
        losses = [r["loss"] for r in records if r["loss"] is not None]
        if losses:  # the mean cross-entropy over the split's labelled pairs
            self.log(f"{stage}/loss", sum(losses) / len(losses), sync_dist=False)
        self.log(f"{stage}/n", float(len(records)), sync_dist=False)  # presentations scored, each once
        outputs = [(r["item"], r["pred"]) for r in records]
        catbench = [(item, pred) for item, pred in outputs if item.get("set") == "catbench"]
        if catbench:
            gold = [item["answer"] for item, _ in catbench]
            # "before" questions are presented (first, second), "after" ones (second, first)
            answers = ["yes" if pred == item["direction"] else "no" for item, pred in catbench]
            rows = binary_rows(gold, {"teo head": answers})
            # the before / after twins of a step pair: answered alike? (not guaranteed for a pair head)
            twins = [(item.get("plan_idx"), item.get("plan"), item.get("first"), item.get("second")) for item, _ in catbench]
            rows["teo head"].update(twin_consistency(twins, answers))
            self.log_dict({f"{stage}/catbench_{k}": float(rows["teo head"][k]) for k in CATBENCH_KEYS})
            majority = next(name for name in rows if name.startswith("majority"))
            self.log_dict({f"{stage}/majority_{k}": float(rows[majority][k]) for k in MAJORITY_KEYS})
            if stage == "test":
                self.test_predictions = [{"id": item["pair_id"], "direction": item["direction"], "first": item.get("first"),
                                          "second": item.get("second"), "pred_relation": pred,
                                          "answer": ans, "gold": item["answer"]}
                                         for (item, pred), ans in zip(catbench, answers)]
            log.info("%s CaT-Bench questions:\n%s", stage, format_table(rows, BINARY_COLUMNS))
            return rows
        original = [(item["pair"], pred) for item, pred in outputs if item.get("set") == "original"]
        swapped = [(item["pair"], pred) for item, pred in outputs if item.get("set") == "swapped"]
        # consistency needs both presentations of a pair: with limit_*_batches some may be unseen
        rows, kept_original, kept_swapped = predicted_pair_rows(original, swapped, "teo head")
        if len(kept_original) < len(original) or len(kept_swapped) < len(swapped):
            log.warning("%s: %d of %d pairs were seen in both presentations; scoring those only",
                        stage, len(kept_original), max(len(original), len(swapped)))
        original, swapped = kept_original, kept_swapped
        if not rows:
            return {}
        ours = rows["teo head"]
        self.log_dict({f"{stage}/teo_{k}": float(ours[k]) for k in TEO_KEYS})
        self.log(f"{stage}/majority_consistency_accuracy", float(rows["majority"]["consistency_accuracy"]))
        if stage == "test":
            self.test_predictions = [{"id": p["pair_id"], "pred": y, "gold": p["label"]} for p, y in original + swapped]
        log.info("%s TEO pairs:\n%s", stage, teo_table(rows))
        return rows

    _log_eval = _report  # GatheredEvalMixin scores each epoch with it (the test rows land in test_rows)

    def validation_metrics(self) -> list[str]:
        """``val/loss``, ``val/n``, then on TEO pairs ``val/teo_*`` and the majority row's consistency, on
        CaT-Bench questions ``val/catbench_*`` and ``val/majority_*`` (:meth:`_report`)."""
        names = ["loss", "n", *(f"teo_{k}" for k in TEO_KEYS), "majority_consistency_accuracy",
                 *(f"catbench_{k}" for k in CATBENCH_KEYS), *(f"majority_{k}" for k in MAJORITY_KEYS)]
        return [f"val/{name}" for name in names]
