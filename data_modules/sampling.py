"""The one sampling scheme of every data module: seeded per epoch, sharded under DDP, exactly resumable.

Every loader a data module returns comes from :func:`epoch_loader`. Its sampler yields
``(index, epoch)`` keys (:class:`EpochSampler`, or :class:`LengthBucketBatchSampler` for batches of
similar length), so

* the order of an epoch is a pure function of ``(seed, epoch)``: Lightning calls ``set_epoch``
  before every epoch, also on resume, and the run resumed from a mid-epoch checkpoint sees the
  batches the uninterrupted run would have seen;
* datasets may draw per-item randomness from the key (the sequencing view's shuffled step order);
* under DDP each rank takes every ``world_size``-th item (or batch), padded by repeating the first
  ones like :class:`torch.utils.data.DistributedSampler`, so all ranks run the same number of
  steps.  Evaluation records are gathered and de-duplicated by id afterwards
  (:class:`seqaware.modules.base.GatheredEvalMixin`), so the padding never counts twice.

Lightning's own sampler replacement is off (``trainer.use_distributed_sampler: false``) because
these samplers shard themselves.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

Key = tuple[int, int]


def _pad_and_shard(items: list, num_replicas: int, rank: int) -> list:
    """Every ``num_replicas``-th entry from ``rank``, after padding by repeat to a multiple of ``num_replicas``."""
    if num_replicas <= 1 or not items:
        return items
    per_rank = -(-len(items) // num_replicas)
    items = items + items[: per_rank * num_replicas - len(items)]
    return items[rank::num_replicas]


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))


class EpochSampler(Sampler):
    """Yields ``(index, epoch)`` keys, shuffled per epoch from ``(seed, epoch)`` when ``shuffle``."""

    def __init__(self, size: int, shuffle: bool, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _indices(self) -> list[int]:
        if self.shuffle:
            indices = torch.randperm(self.size, generator=_epoch_generator(self.seed, self.epoch)).tolist()
        else:
            indices = list(range(self.size))
        return _pad_and_shard(indices, self.num_replicas, self.rank)

    def __iter__(self) -> Iterator[Key]:
        return iter([(i, self.epoch) for i in self._indices()])

    def __len__(self) -> int:
        if self.num_replicas > 1:
            return -(-self.size // self.num_replicas)
        return self.size


class LengthBucketBatchSampler(Sampler[list[Key]]):
    """Micro-batches of similar length, for less padding (the TEO LoRA ``mateo_fast`` preset).

    Per epoch: shuffle all indices with ``(seed, epoch)``; cut them into windows of
    ``batch_size * bucket_factor``; sort each window by length; cut windows into batches; shuffle
    the batch order. Under DDP each rank takes every ``num_replicas``-th batch (the batch list is
    padded by repeating its first batches so all ranks get the same count).
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, bucket_factor: int = 50, shuffle: bool = True,
                 drop_last: bool = False, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        if batch_size < 1 or bucket_factor < 1:
            raise ValueError(f"batch_size and bucket_factor must be >= 1, got {batch_size} and {bucket_factor}")
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        self.batch_size, self.bucket_factor = int(batch_size), int(bucket_factor)
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, int(seed)
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _batches(self) -> list[list[int]]:
        gen = _epoch_generator(self.seed, self.epoch)
        n = len(self.lengths)
        order = torch.randperm(n, generator=gen) if self.shuffle else torch.arange(n)
        window = self.batch_size * self.bucket_factor
        batches: list[list[int]] = []
        for start in range(0, n, window):
            chunk = order[start:start + window]
            chunk = chunk[torch.argsort(self.lengths[chunk], stable=True)]
            batches += [chunk[i:i + self.batch_size].tolist() for i in range(0, len(chunk), self.batch_size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]
        return _pad_and_shard(batches, self.num_replicas, self.rank)

    def __iter__(self) -> Iterator[list[Key]]:
        return iter([[(i, self.epoch) for i in batch] for batch in self._batches()])

    def __len__(self) -> int:
        n = len(self.lengths)
        window = self.batch_size * self.bucket_factor
        if self.drop_last:
            count = sum(min(window, n - s) // self.batch_size for s in range(0, n, window))
        else:
            count = sum(-(-min(window, n - s) // self.batch_size) for s in range(0, n, window))
        return -(-count // self.num_replicas) if self.num_replicas > 1 else count


class KeyedList(Dataset):
    """A list of items readable by ``i`` or by an ``(i, epoch)`` key (items without per-epoch randomness)."""

    def __init__(self, items: Sequence[Any], name: str = "items"):
        self.items = list(items)
        self.name = name

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: int | Key) -> Any:
        index = key[0] if isinstance(key, tuple) else key
        return self.items[int(index)]


class SplitLoaders:
    """The three Lightning loader hooks of a data module, each through its ``_loader(split, shuffle,
    batch_size)`` (which builds the loader with :func:`epoch_loader`): training shuffled per epoch
    with ``batch_size``, validation and test in order with ``eval_batch_size``."""

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True, self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False, self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False, self.eval_batch_size)


def shard_of(trainer: Any) -> tuple[int, int]:
    """``(world_size, global_rank)`` of the attached trainer; ``(1, 0)`` without one."""
    if trainer is None:
        return 1, 0
    return int(trainer.world_size), int(trainer.global_rank)


def epoch_loader(dataset: Dataset, *, batch_size: int, shuffle: bool, seed: int, trainer: Any = None,
                 collate_fn: Optional[Callable] = None, lengths: Optional[Sequence[int]] = None,
                 bucket_factor: int = 50, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False) -> DataLoader:
    """The DataLoader of one split under the scheme above.

    ``lengths`` (training only) groups batches by length with :class:`LengthBucketBatchSampler`.
    The loader gets a private generator, so building one never consumes the global RNG.
    """
    replicas, rank = shard_of(trainer)
    common = {"collate_fn": collate_fn, "num_workers": num_workers, "pin_memory": pin_memory,
              "persistent_workers": persistent_workers and num_workers > 0,
              "generator": torch.Generator().manual_seed(int(seed))}
    if lengths is not None:
        batch_sampler = LengthBucketBatchSampler(lengths, batch_size, bucket_factor, shuffle=shuffle, seed=seed,
                                                 num_replicas=replicas, rank=rank)
        return DataLoader(dataset, batch_sampler=batch_sampler, **common)
    sampler = EpochSampler(len(dataset), shuffle=shuffle, seed=seed, num_replicas=replicas, rank=rank)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **common)
