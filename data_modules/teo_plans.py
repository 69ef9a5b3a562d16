"""Whole plans for plan-aware TEO models (``experiment=teo_plan_head_rfg``): one item per plan, all
of its pairs scored from one encoding of the plan.

* train: the plan's steps and its training pairs as :func:`data_modules.tasks.teo.teo_training_pairs`
  builds them (MATEO sec. 5.4: every dependent pair in both presentations, ``before`` and
  ``after``, independent pairs once; which pairs are dependent follows ``data.teo.pairs``: every
  directed edge by default, MATEO sec. 5.2, or the transitive reduction's);
* val / test procedures: the plan's original and swapped TEO sets (:func:`teo_eval_sets`);
* test with ``eval_path``: CaT-Bench questions (read by
  :func:`data_modules.adapters.catbench.read_catbench`) grouped by plan: the model sees the
  question's ``steps`` list as the plan and answers every question of it.

Procedures, held-out CaT-Bench plans and the options are those of
:class:`~data_modules.teo_encoder_pairs.TeoEncoderPairsDataModule`, which this module extends.

Encoding a plan (:class:`PlanCollator`): each step is tokenised on its own (``[CLS] text [SEP]``,
at most ``max_step_tokens`` word pieces and ``max_sentences`` sentences, as the pair collator
does); the model packs the steps of a *window* into one sequence ``[CLS] s_i [SEP] s_i+1 [SEP] ...``
(:func:`seqaware.encoders.base.pack_steps`).  A plan that fits ``max_tokens`` is one window; a
longer one is cut into windows of whole steps (:func:`seqaware.encoders.steps.step_windows`, one home
with BERSON's joint pair encoding), each step *owned* by exactly
one window in which it has as much context on both sides as fits.  No step is ever dropped and the
step indices the model sees are the plan's own, so the asked-about steps keep their positions.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Optional

import torch

from data_modules.collate import StepTokens
from data_modules.tasks.teo import teo_eval_sets, teo_pairs, teo_training_pairs, twin_presentations
from data_modules.teo_encoder_pairs import TeoEncoderPairsDataModule
from seqaware.metrics.teo import TEO_LABEL_ID
from seqaware.encoders.steps import step_windows
from seqaware.pretrained import load_tokenizer
from seqaware.procedure import Procedure

log = logging.getLogger(__name__)


class PlanCollator:
    """Plans -> step tokens in windows, pair labels, pair records.

    Batch keys:

    * ``input_ids`` / ``attention_mask`` (W, S_w, L): every window of every plan of the batch, each
      step tokenised on its own with its special tokens (right-padded; empty slots all padding);
    * ``window_step`` (W, S_w) long: the batch-wide index of the step in each slot (plan ``k``'s
      step ``i`` is ``offset_k + i``), -1 for empty slots;
    * ``window_owner`` (W, S_w) bool: the slot's window owns that step (its states are taken from it);
    * ``num_steps`` (B,) long; ``labels`` (B, S, S) long: the TEO label id of presentation ``(a, b)``
      (``before`` / ``after`` / ``independent``) or -100 where no training pair says anything
      (also the diagonal and padding);
    * ``meta``: the items (``plan_id``, ``steps``, ``pairs`` to score: dicts with ``a``, ``b`` and
      what the module reports).
    """

    def __init__(self, tokenizer: Any, max_tokens: int = 512, max_step_tokens: int = 60, max_sentences: int = 5):
        if max_step_tokens > max_tokens:
            raise ValueError(f"data.max_step_tokens={max_step_tokens} must not exceed data.max_tokens={max_tokens} "
                             "(a window must hold at least one whole step)")
        self.tokenizer = tokenizer
        self.tokens = StepTokens(tokenizer)
        self.max_tokens = max_tokens
        self.max_step_tokens = max_step_tokens
        self.max_sentences = max_sentences

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        windows: list[list[list[int]]] = []  # per window: token ids of each step
        slots: list[list[tuple[int, bool]]] = []  # per window: (batch-wide step index, owned)
        offset = 0
        for item in items:
            ids = self.tokens.ids(item["steps"], self.max_step_tokens, self.max_sentences)
            # packed, a step adds its tokens without its own [CLS]; the window adds one [CLS]
            for start, end, own_start, own_end in step_windows([len(x) - 1 for x in ids], self.max_tokens - 1):
                windows.append([ids[i] for i in range(start, end)])
                slots.append([(offset + i, own_start <= i < own_end) for i in range(start, end)])
            offset += len(ids)
        W = len(windows)
        S = max(len(w) for w in windows)
        L = max(len(x) for w in windows for x in w)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((W, S, L), pad, dtype=torch.long)
        attention_mask = torch.zeros((W, S, L), dtype=torch.long)
        window_step = torch.full((W, S), -1, dtype=torch.long)
        window_owner = torch.zeros((W, S), dtype=torch.bool)
        for w, (steps, slot) in enumerate(zip(windows, slots)):
            for s, (ids, (index, owned)) in enumerate(zip(steps, slot)):
                input_ids[w, s, :len(ids)] = torch.tensor(ids)
                attention_mask[w, s, :len(ids)] = 1
                window_step[w, s] = index
                window_owner[w, s] = owned
        n_max = max(len(item["steps"]) for item in items)
        labels = torch.full((len(items), n_max, n_max), -100, dtype=torch.long)
        for k, item in enumerate(items):
            for a, b, label in item.get("labels", ()):
                labels[k, a, b] = TEO_LABEL_ID[label]
        return {"input_ids": input_ids, "attention_mask": attention_mask, "window_step": window_step,
                "window_owner": window_owner, "num_steps": torch.tensor([len(item["steps"]) for item in items]),
                "labels": labels, "meta": items}


def plan_item(procedure: Procedure, split: str, seed: int = 0, pairs: str = "edges") -> dict[str, Any]:
    """One plan: its step texts, training labels (train) or the original + swapped pairs to score
    (``pairs``: the pair rule of :func:`data_modules.tasks.teo.teo_pairs`)."""
    item: dict[str, Any] = {"plan_id": procedure.id, "steps": [s.text or "" for s in procedure.steps]}
    if split == "train":
        item["labels"] = [(p["a"], p["b"], p["label"]) for p in teo_training_pairs([procedure], seed=seed, pairs=pairs)]
    else:
        item["pairs"] = [dict(p, set=name) for name, p in twin_presentations(teo_eval_sets([procedure], pairs))]
        # validation also reports the loss on the same labels the model is trained on
        item["labels"] = [(p["a"], p["b"], p["label"]) for p in item["pairs"]]
    return item


def catbench_plan_items(questions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CaT-Bench questions (:func:`~data_modules.adapters.catbench.read_catbench` items) grouped into
    plans: one item per distinct ``steps`` list, its questions as the pairs to score (``a`` / ``b`` =
    ``first`` / ``second``)."""
    plans: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for q in questions:
        plans[tuple(q["steps"])].append(q)
    items = []
    for steps, qs in plans.items():
        plan_id = f"catbench:{qs[0].get('plan') or qs[0].get('plan_idx')}:{len(items)}"
        items.append({"plan_id": plan_id, "steps": list(steps),
                      "pairs": [dict(q, set="catbench", plan_id=plan_id, a=q["first"], b=q["second"]) for q in qs]})
    return items


class TeoPlansDataModule(TeoEncoderPairsDataModule):
    """Procedures with DAGs -> batches of whole plans; CaT-Bench questions grouped by plan for testing.

    Args (besides those of :class:`~data_modules.teo_encoder_pairs.TeoEncoderPairsDataModule`):
        max_tokens: word pieces per encoder window (``[CLS]`` + whole steps); longer plans are windowed.
        max_step_tokens: word pieces per step, its ``[CLS]`` / ``[SEP]`` included (the rest is cut).
        batch_size / eval_batch_size: plans per batch.
    """

    def __init__(self, *args: Any, max_step_tokens: int = 60, **kwargs: Any):
        kwargs.setdefault("max_tokens", 512)
        super().__init__(*args, **kwargs)
        self.max_step_tokens = max_step_tokens

    @property
    def collator(self) -> PlanCollator:  # type: ignore[override]
        if self._collator is None:
            self._collator = PlanCollator(load_tokenizer(self.tokenizer_name), self.max_tokens, self.max_step_tokens,
                                          self.max_sentences)
        return self._collator

    def setup(self, stage: Optional[str] = None) -> None:
        if self.items:
            return
        splits, questions = self._splits_and_questions()
        with_pairs = {name: [p for p in procs if teo_pairs(p, self.pair_rule)] for name, procs in splits.items()}
        self.items["train"] = [plan_item(p, "train", self.seed, self.pair_rule) for p in with_pairs["train"]]
        for name in ("val", "test"):
            self.eval_sets[name] = teo_eval_sets(with_pairs.get(name, []), self.pair_rule)
            self.items[name] = [plan_item(p, name, pairs=self.pair_rule) for p in with_pairs.get(name, [])]
        if questions is not None:
            self.items["test"] = catbench_plan_items(questions)
        for name, items in self.items.items():
            if not items:
                raise ValueError(f"teo plans: the {name} split has no plan with TEO pairs (do its procedures have DAGs?)")
        log.info("teo plans: %s plans; pairs to score: %s", {k: len(v) for k, v in self.items.items()},
                 {k: sum(len(i.get("pairs", i.get("labels", []))) for i in v) for k, v in self.items.items()})
