"""The LightningDataModule: procedures -> task view -> batches."""
from __future__ import annotations

import logging
from typing import Any, Callable

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from data_modules.collate import StepCollator
from data_modules.views import EpochSampler, PretrainingView, SequencingView
from seqaware.pretrained import load_tokenizer
from seqaware.procedure import Procedure

log = logging.getLogger(__name__)

TASKS = ("sequencing", "pretraining")


class ProcedureDataModule(pl.LightningDataModule):
    """Builds a task view of each split and batches it with :class:`StepCollator`.

    Args:
        source: callable returning ``{split: [Procedure]}`` (see :mod:`data_modules.sources`).
        task: ``sequencing`` (shuffled steps, order targets) or ``pretraining`` (ordered sub-sequences).
        tokenizer: name or path of a Hugging Face tokenizer (``offline:minilm`` by default); None
            for image-only models.
        view: keyword arguments of the view (``max_steps``, ``too_long``, ...).
        collator: keyword arguments of :class:`StepCollator`.
        batch_size / eval_batch_size: per-process batch sizes.
        num_workers: DataLoader workers (0 = load in the main process).
        seed: seeds shuffling (per epoch) and the evaluation permutations.
        train_path / val_path / test_path: when set, passed on to the source (file-based sources
            such as ``jsonl`` and ``roc``), so users write ``data.train_path=...``.
    """

    def __init__(self, source: Callable[[], dict[str, list[Procedure]]], task: str = "sequencing",
                 tokenizer: str | None = "offline:minilm", view: dict | None = None, collator: dict | None = None,
                 batch_size: int = 16, eval_batch_size: int | None = None, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False, seed: int = 0,
                 train_path: str | None = None, val_path: str | None = None, test_path: str | None = None):
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"data.task must be one of {TASKS}, got {task!r}")
        self.source = source
        self.task = task
        self.tokenizer_name = tokenizer
        self.view_kwargs = dict(view or {})
        self.collator_kwargs = dict(collator or {})
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.seed = seed
        self.source_paths = {k: v for k, v in
                             {"train_path": train_path, "val_path": val_path, "test_path": test_path}.items() if v is not None}
        self.datasets: dict[str, torch.utils.data.Dataset] = {}
        self._tokenizer = None
        self._collator: StepCollator | None = None

    @property
    def tokenizer(self):
        if self._tokenizer is None and self.tokenizer_name:
            self._tokenizer = load_tokenizer(self.tokenizer_name)
        return self._tokenizer

    @property
    def vocab_size(self) -> int | None:
        return None if self.tokenizer is None else len(self.tokenizer)

    @property
    def collator(self) -> StepCollator:
        if self._collator is None:
            kwargs = dict(self.collator_kwargs)
            kwargs.setdefault("max_steps", self.view_kwargs.get("max_steps", 5))
            kwargs.setdefault("use_text", self.tokenizer_name is not None)
            self._collator = StepCollator(tokenizer=self.tokenizer, **kwargs)
        return self._collator

    def _read_source(self) -> dict[str, list[Procedure]]:
        return self.source(**self.source_paths)

    def prepare_data(self) -> None:
        self._read_source()  # generate / convert / cache once, on rank 0

    def _view(self, split: str, procedures: list[Procedure]):
        kwargs = dict(self.view_kwargs)
        if self.task == "sequencing":
            return SequencingView(procedures, seed=self.seed, reshuffle=(split == "train"), name=f"{split} sequencing", **kwargs)
        kwargs.pop("too_long", None)
        kwargs.pop("reference_limit", None)
        return PretrainingView(procedures, seed=self.seed, name=f"{split} pretraining", **kwargs)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        splits = self._read_source()
        for split, procedures in splits.items():
            self.datasets[split] = self._view(split, procedures)
        log.info("data: %s", {k: len(v) for k, v in self.datasets.items()})

    def _loader(self, split: str, shuffle: bool, batch_size: int) -> DataLoader:
        if split not in self.datasets:
            raise ValueError(f"the data source gave no '{split}' split (it has {sorted(self.datasets)})")
        replicas, rank = 1, 0
        if self.trainer is not None:
            replicas, rank = self.trainer.world_size, self.trainer.global_rank
        dataset = self.datasets[split]
        sampler = EpochSampler(len(dataset), shuffle=shuffle, seed=self.seed, num_replicas=replicas, rank=rank)
        return DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, collate_fn=self.collator,
            num_workers=self.num_workers, pin_memory=self.pin_memory, persistent_workers=self.persistent_workers,
            # a private generator: creating a loader never consumes the global RNG (exact resume)
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True, self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False, self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False, self.eval_batch_size)
