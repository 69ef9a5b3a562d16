"""The LightningDataModule: procedures -> task view -> batches."""
from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from data_modules.collate import StepCollator
from data_modules.images import check_procedure_images
from data_modules.sampling import SplitLoaders, epoch_loader
from data_modules.views import VIEWS
from seqaware.config import argument_hints, check_values
from seqaware.pretrained import load_tokenizer
from seqaware.procedure import Procedure, ProcedureFormatError

log = logging.getLogger(__name__)

TOKEN_COUNTS = ("joint", "pairwise")   # data.batch_tokens_count


class ProcedureDataModule(SplitLoaders, pl.LightningDataModule):
    """Builds a task view of each split and batches it with :class:`StepCollator`.

    Args:
        source: callable returning ``{split: [Procedure]}`` (see :mod:`data_modules.sources`).
        task: the registered task view (:data:`data_modules.views.VIEWS`): ``sequencing`` (shuffled steps,
            order targets), ``pretraining`` (ordered sub-sequences), or any other registered one.
        tokenizer: name or path of a Hugging Face tokenizer (``offline:minilm`` by default); None
            for image-only models.
        view: keyword arguments of the view (``max_steps``, ``too_long``, ...).
        collator: keyword arguments of :class:`StepCollator`; it also carries the view's ``fields`` into the batch.
        batch_size / eval_batch_size: per-process batch sizes.
        num_workers: DataLoader workers (0 = load in the main process).
        seed: seeds shuffling (per epoch) and the evaluation permutations.
        train_path / val_path / test_path: when set, passed on to the source (file-based sources
            such as ``jsonl`` and ``roc``), so users write ``data.train_path=...``.
        extra_train_paths: more files whose records only ever join the training split (``roc``:
            ``train_extra.tsv``), passed on to a source that takes them; a non-empty list for a source
            that does not is an error naming the key. A plain string or path is one file.
        allow_outside_images: accept image paths that resolve outside the data folder (the folder
            of the procedures file); rejected by default.
        verify_images: decode every image of every split in ``setup`` (before the first step), so
            a corrupt image is reported up front instead of crashing an epoch. Only when images
            are used and ``collator.missing_image=error``.
        image_check_cache: folder remembering images that decoded (path + size + mtime), so the
            check costs a ``stat`` per image the second time; None: no cache.
        bucket_by_length: group training batches by length
            (:class:`~data_modules.sampling.LengthBucketBatchSampler` over
            :meth:`StepCollator.text_length`, the packed text tokens of each instance): less padding
            for encoders that pad a batch to its longest instance (a joint pass over a story, a step
            pair); the batches' order stays shuffled per epoch.  Validation and test are not bucketed.
            Lengths are measured once, on each instance as epoch 0 draws it (exact for the sequencing
            view, whose steps only change order; a proxy for pretraining sub-sequences).
        bucket_factor: batches per sorting window of the bucketing sampler.
        batch_tokens: training batches of at most this many tokens per process instead of ``batch_size``
            instances (:class:`~data_modules.sampling.TokenBudgetBatchSampler`: shuffled, never sorted by
            length, the same number of batches every epoch; about ``longest instance / batch_tokens`` of the
            budget left unused).  None: ``batch_size`` instances.  Not with ``bucket_by_length``.
        batch_tokens_count: what an instance's tokens are: ``joint`` (its steps packed into one sequence,
            :meth:`StepCollator.text_length`: a joint BERSON pass, pretraining) or ``pairwise`` (its n(n-1) step
            pairs, :meth:`StepCollator.pair_tokens`: BERSON's pairwise encoding).  Counted once, on each
            instance as epoch 0 draws it.
        reshuffle_train: sequencing: a new permutation of each training procedure's steps every epoch
            (default); False: one per procedure, drawn once from ``(seed, id)`` and kept for every epoch
            (BERSON's release shuffles each story once when it builds its features).
        train_subset: keep ``k`` training procedures (label-efficiency runs, ``scripts/studies/label_efficiency.py``):
            the first ``k`` of one permutation of the training split drawn from ``seed``, in their file
            order, so the subsets of one seed are nested (k = 8 lies inside k = 32). None: all of them.
        train_subset_seed: the seed of that permutation (default: ``seed``): one labelled set for runs of several
            seeds, which then differ only in their initialisation and batch order.
    """

    def __init__(self, source: Callable[[], dict[str, list[Procedure]]], task: str = "sequencing",
                 tokenizer: str | None = "offline:minilm", view: dict | None = None, collator: dict | None = None,
                 batch_size: int = 16, eval_batch_size: int | None = None, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False, seed: int = 0,
                 train_path: str | None = None, val_path: str | None = None, test_path: str | None = None,
                 allow_outside_images: bool = False, verify_images: bool = True, image_check_cache: str | None = None,
                 bucket_by_length: bool = False, bucket_factor: int = 50,
                 extra_train_paths: Sequence[str] | None = None, reshuffle_train: bool = True,
                 train_subset: int | None = None,
                 train_subset_seed: int | None = None, batch_tokens: int | None = None, batch_tokens_count: str = "joint"):
        super().__init__()
        if batch_tokens is not None and (isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int)
                                         or batch_tokens < 1):
            raise ValueError(f"data.batch_tokens must be a positive number of tokens or null, got {batch_tokens!r}")
        if batch_tokens_count not in TOKEN_COUNTS:
            raise ValueError(f"data.batch_tokens_count must be one of {list(TOKEN_COUNTS)}, got {batch_tokens_count!r}")
        if batch_tokens is not None and bucket_by_length:
            raise ValueError("data.batch_tokens and data.bucket_by_length=true: a token budget takes the shuffled "
                             "order as it comes, bucketing sorts it by length; set one of them")
        self.batch_tokens, self.batch_tokens_count = batch_tokens, batch_tokens_count
        if train_subset is not None and (isinstance(train_subset, bool) or not isinstance(train_subset, int)
                                         or train_subset < 1):
            raise ValueError(f"data.train_subset must be a positive number of training procedures or null, "
                             f"got {train_subset!r}")
        self.train_subset = train_subset
        self.train_subset_seed = train_subset_seed
        self.view_class = VIEWS.lookup(task, "data.task")
        self.source = source
        self.task = task
        self.tokenizer_name = tokenizer
        self.view_kwargs = dict(view or {})
        self.collator_kwargs = dict(collator or {})
        # a null (or text) where the view / collator takes a number fails here, naming the key, not at the
        # first comparison of an epoch (data.view.max_steps=null); train.py checks data.* itself the same way
        check_values(self.view_kwargs, argument_hints(self.view_class), "data.view", self.view_class.__name__)
        check_values(self.collator_kwargs, argument_hints(StepCollator), "data.collator", StepCollator.__name__)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.seed = seed
        self.source_paths = {k: v for k, v in
                             {"train_path": train_path, "val_path": val_path, "test_path": test_path}.items() if v is not None}
        if extra_train_paths:
            if isinstance(extra_train_paths, (str, os.PathLike)):
                # `data.extra_train_paths=PATH` without brackets reaches us as a plain string: it is one file
                # (never one path per character). Taken as one file rather than refused: there is no other
                # thing the user can have meant, so a refusal would only make them type the brackets.
                extra_train_paths = [extra_train_paths]
            func = getattr(source, "func", source)
            if "extra_train_paths" not in inspect.signature(func).parameters:
                raise ValueError(f"data.extra_train_paths: the data source {describe_source(source, {}, 'train')} "
                                 "takes no extra training files (the roc source does)")
            self.source_paths["extra_train_paths"] = [str(p) for p in extra_train_paths]
        self.allow_outside_images = allow_outside_images
        self.verify_images = verify_images
        self.image_check_cache = image_check_cache
        self.image_check_counts: dict[str, int] = {}
        self.reshuffle_train = bool(reshuffle_train)
        self.bucket_by_length = bool(bucket_by_length)
        self.bucket_factor = int(bucket_factor)
        self._train_lengths: list[int] | None = None
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
            kwargs["fields"] = self.view_class.fields
            self._collator = StepCollator(tokenizer=self.tokenizer, **kwargs)
        return self._collator

    def _read_source(self) -> dict[str, list[Procedure]]:
        return self.source(**self.source_paths)

    def prepare_data(self) -> None:
        self._read_source()  # generate / convert / cache once, on rank 0

    def _view(self, split: str, procedures: list[Procedure]):
        return self.view_class.build(procedures, split, seed=self.seed, reshuffle_train=self.reshuffle_train,
                                     **self.view_kwargs)

    def describe_split(self, split: str) -> str:
        """Where a split comes from, as the config key a user sets (for error messages)."""
        return describe_source(self.source, self.source_paths, split)

    def _check_images(self, splits: dict[str, list[Procedure]]) -> None:
        use_images = self.collator_kwargs.get("use_images", True)
        decode = (self.verify_images and use_images and self.collator_kwargs.get("missing_image", "error") == "error")
        procedures = [p for procs in splits.values() for p in procs]
        hint = " (set data.collator.missing_image=blank to use a blank image instead)"
        problems, self.image_check_counts = check_procedure_images(
            procedures, self.image_check_cache, allow_outside=self.allow_outside_images, decode=decode, decode_hint=hint)
        if decode:
            log.info("image check: %s", self.image_check_counts)
        if problems:
            raise ProcedureFormatError(problems)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        splits = self._read_source()
        if self.train_subset is not None:
            splits = {**splits, "train": self._subset(splits.get("train", []))}
        self._check_images(splits)
        for split, procedures in splits.items():
            view = self._view(split, procedures)
            if len(view) == 0:
                dropped = f" (read {len(procedures)}, dropped {view.dropped})" if procedures else ""
                raise ValueError(f"{self.describe_split(split)}: the {split} split has no instances{dropped}; "
                                 f"a run cannot {'train' if split == 'train' else 'evaluate'} on an empty split")
            self.datasets[split] = view
        log.info("data: %s", {k: len(v) for k, v in self.datasets.items()})

    def _subset(self, procedures: list[Procedure]) -> list[Procedure]:
        """``train_subset`` training procedures: a prefix of one seeded permutation, in file order."""
        k = self.train_subset
        if k > len(procedures):
            raise ValueError(f"data.train_subset={k}: {self.describe_split('train')} has only {len(procedures)} "
                             "training procedures")
        seed = self.seed if self.train_subset_seed is None else self.train_subset_seed
        generator = torch.Generator().manual_seed(int(seed))
        keep = sorted(torch.randperm(len(procedures), generator=generator)[:k].tolist())
        log.info("data.train_subset=%d: %d of the %d training procedures (seed %d)", k, k, len(procedures), seed)
        return [procedures[i] for i in keep]

    def _loader(self, split: str, shuffle: bool, batch_size: int) -> DataLoader:
        if split not in self.datasets:
            raise ValueError(f"the data source gave no '{split}' split (it has {sorted(self.datasets)}); "
                             f"set data.{split}_path or the source's {split} data")
        lengths = None
        budget = self.batch_tokens if split == "train" else None
        if (self.bucket_by_length or budget) and split == "train":
            if self._train_lengths is None:  # tokenises every step text once (the collator keeps the ids)
                view = self.datasets[split]
                count = self.collator.pair_tokens if budget and self.batch_tokens_count == "pairwise" else \
                    self.collator.text_length
                self._train_lengths = [count(view[i]) for i in range(len(view))]
            lengths = self._train_lengths
        loader = epoch_loader(self.datasets[split], batch_size=batch_size, shuffle=shuffle, seed=self.seed,
                              trainer=self.trainer, collate_fn=self.collator, lengths=lengths,
                              bucket_factor=self.bucket_factor, num_workers=self.num_workers,
                              pin_memory=self.pin_memory, persistent_workers=self.persistent_workers,
                              batch_tokens=budget)
        if budget:
            sampler = loader.batch_sampler
            log.info("data.batch_tokens=%d (%s tokens): %d batches an epoch (%d per process) of %.1f training "
                     "instances on average, %.1f%% of the budget unused", budget, self.batch_tokens_count,
                     sampler.count, len(sampler), sampler.mean_batch_size, 100 * sampler.padding)
        return loader


def describe_source(source: Any, paths: dict[str, str], split: str) -> str:
    """``data.train_path=FILE``, ``data.source.src=FOLDER`` or the source's name, for messages."""
    if f"{split}_path" in paths:
        return f"data.{split}_path={paths[f'{split}_path']}"
    keywords = getattr(source, "keywords", {}) or {}
    if keywords.get("src"):
        return f"data.source.src={keywords['src']} ({split} split)"
    name = getattr(getattr(source, "func", source), "__name__", type(source).__name__)
    return f"data.source ({name}, {split} split)"


def check_fit_saw_batches(trainer: pl.Trainer, datamodule: pl.LightningDataModule) -> None:
    """Raise naming the training data when ``trainer.fit`` completed no training batch.

    Testing such a model would report metrics of an untrained network as if it had been trained.
    A fit resumed from a finished checkpoint counts the batches of the run it resumes.
    """
    describe = getattr(datamodule, "describe_split", None)
    train_data = describe("train") if describe else f"the train split of {type(datamodule).__name__}"
    done = trainer.fit_loop.epoch_loop.batch_progress.total.completed
    if done == 0:
        raise RuntimeError(f"the fit saw no training batch ({train_data}); check that split, "
                           f"trainer.limit_train_batches={trainer.limit_train_batches} and "
                           f"trainer.max_epochs={trainer.max_epochs} / trainer.max_steps={trainer.max_steps}")
