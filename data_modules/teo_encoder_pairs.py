"""TEO pairs for pairwise encoder heads (``experiment=teo_head_rfg``): step A and step B as a
sentence pair, a 3-way label, and CaT-Bench yes/no questions as the test set.

* train: :func:`data_modules.tasks.teo.teo_training_pairs` of the train procedures (dependent pairs
  in both presentations, independent pairs once);
* val: the original and swapped sets of the val procedures (:func:`teo_eval_sets`), scored with
  TEO consistency accuracy;
* test: CaT-Bench questions (``eval_path``, JSON lines; ``label`` yes/no kept as gold).  A question
  about (first, second) with direction ``before`` is presented as (first, second) and answered yes
  when the head says ``before``; with direction ``after`` as (second, first), yes when it says
  ``after``.  Plans of the evaluation file are removed from training by default
  (``exclude_eval_plans``: r-FG recipe ids = ``efg_recipe_id``), so no test recipe is trained on.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from data_modules.adapters.catbench import read_catbench
from data_modules.collate import StepTokens
from data_modules.sampling import KeyedList, SplitLoaders, epoch_loader
from data_modules.tasks.teo import teo_eval_sets, teo_options, teo_training_pairs, twin_presentations
from seqaware.metrics.teo import TEO_LABEL_ID
from seqaware.pretrained import load_tokenizer
from seqaware.procedure import Procedure

log = logging.getLogger(__name__)


def _pair_item(pair: dict[str, Any], set_name: str) -> dict[str, Any]:
    return {"pair_id": pair["pair_id"], "text_a": pair["step_a"]["text"] or "", "text_b": pair["step_b"]["text"] or "",
            "label": pair["label"], "set": set_name, "pair": pair}


class PairCollator:
    """Tokenises both steps of each pair: ``input_ids`` / ``attention_mask`` (N, 2, L), ``labels`` (N,)."""

    def __init__(self, tokenizer: Any, max_tokens: int = 60, max_sentences: int = 5):
        self.tokenizer = tokenizer
        self.tokens = StepTokens(tokenizer)
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        texts = [t for it in items for t in (it["text_a"], it["text_b"])]
        input_ids, attention_mask = self.tokens.batch(texts, self.max_tokens, self.max_sentences)
        n = len(items)
        return {"input_ids": input_ids.view(n, 2, -1), "attention_mask": attention_mask.view(n, 2, -1),
                "labels": torch.tensor([TEO_LABEL_ID.get(it.get("label"), -100) for it in items]),
                "meta": items}


class TeoEncoderPairsDataModule(SplitLoaders, pl.LightningDataModule):
    """Procedures with DAGs -> TEO pair batches for an encoder head; CaT-Bench questions for testing.

    Args:
        source: callable returning ``{split: [Procedure]}`` (e.g. the r-FG adapter source).
        eval_path: CaT-Bench questions JSONL (the test set); None tests on the test procedures' TEO sets.
        exclude_eval_plans: drop procedures whose id is a plan of ``eval_path`` from train/val.
        tokenizer, max_tokens, max_sentences: text handling (per step).
        batch_size / eval_batch_size, num_workers, seed.
        teo: ``{pairs: edges | reduction}``: which DAG edges give ``before`` pairs
            (:func:`data_modules.tasks.teo.teo_pairs`; ``edges`` is MATEO sec. 5.2).
    """

    def __init__(self, source: Callable[[], dict[str, list[Procedure]]], eval_path: Optional[str] = None,
                 exclude_eval_plans: bool = True, tokenizer: str = "offline:minilm", max_tokens: int = 60,
                 max_sentences: int = 5, batch_size: int = 32, eval_batch_size: int = 64, num_workers: int = 0,
                 seed: int = 0, teo: Optional[dict] = None):
        super().__init__()
        self.pair_rule = teo_options(teo)
        self.source = source
        self.eval_path = eval_path
        self.exclude_eval_plans = exclude_eval_plans
        self.tokenizer_name = tokenizer
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_workers, self.seed = num_workers, seed
        self.items: dict[str, list[dict[str, Any]]] = {}
        self.eval_sets: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self._collator: Optional[PairCollator] = None

    @property
    def collator(self) -> PairCollator:
        if self._collator is None:
            self._collator = PairCollator(load_tokenizer(self.tokenizer_name), self.max_tokens, self.max_sentences)
        return self._collator

    def prepare_data(self) -> None:
        self.source()

    def _splits_and_questions(self) -> tuple[dict[str, list[Procedure]], Optional[list[dict[str, Any]]]]:
        """The source's procedures per split (plans of ``eval_path`` removed with ``exclude_eval_plans``)
        and the CaT-Bench questions of ``eval_path`` (None without one)."""
        splits = self.source()
        questions = read_catbench(self.eval_path) if self.eval_path else None
        held_out = {q["plan"] for q in questions or [] if q["plan"]} if self.exclude_eval_plans else set()
        dropped = 0
        for name in ("train", "val", "test"):
            procs = [p for p in splits.get(name, []) if p.id not in held_out]
            dropped += len(splits.get(name, [])) - len(procs)
            splits[name] = procs
        if dropped:
            log.info("teo pairs: %d procedures that are plans of %s left out of training/validation", dropped, self.eval_path)
        return splits, questions

    def setup(self, stage: Optional[str] = None) -> None:
        if self.items:
            return
        splits, questions = self._splits_and_questions()
        self.items["train"] = [_pair_item(p, "train") for p in teo_training_pairs(splits["train"], seed=self.seed,
                                                                                      pairs=self.pair_rule)]
        for name in ("val", "test"):
            sets = teo_eval_sets(splits.get(name, []), self.pair_rule)
            self.eval_sets[name] = sets
            # each pair next to its swapped presentation, so a partial pass (limit_val_batches) scores whole pairs
            self.items[name] = [_pair_item(p, s) for s, p in twin_presentations(sets)]
        if questions is not None:
            self.items["test"] = [dict(q, set="catbench") for q in questions]
        for name, items in self.items.items():
            if not items:
                raise ValueError(f"teo pairs: the {name} split has no pairs (do its procedures have DAGs?)")
        log.info("teo pairs: %s", {k: len(v) for k, v in self.items.items()})

    def _loader(self, split: str, shuffle: bool, batch_size: int) -> DataLoader:
        return epoch_loader(KeyedList(self.items[split], name=f"{split} TEO pairs"), batch_size=batch_size,
                            shuffle=shuffle, seed=self.seed, trainer=self.trainer, collate_fn=self.collator,
                            num_workers=self.num_workers)
