"""The one sampling scheme of every data module: seeded per epoch, sharded under DDP, exactly resumable.

Every loader a data module returns comes from :func:`epoch_loader`. Its sampler yields
``(index, epoch)`` keys (:class:`EpochSampler`, :class:`LengthBucketBatchSampler` for batches of
similar length, or :class:`TokenBudgetBatchSampler` for batches of a token budget), so

* the order of an epoch is a pure function of ``(seed, epoch)``: Lightning calls ``set_epoch``
  before every epoch, also on resume, and the run resumed from a mid-epoch checkpoint sees the
  batches the uninterrupted run would have seen;
* datasets may draw per-item randomness from the key (the sequencing view's shuffled step order);
* under DDP each rank takes every ``world_size``-th item (or batch), padded by repeating the first
  ones like :class:`torch.utils.data.DistributedSampler`, so all ranks run the same number of
  steps (the token-budget sampler cuts a multiple of ``world_size`` batches instead, so nothing repeats);
* a run resumed mid-epoch skips the batches it trained on: the ``Preemption`` callback wraps a plain
  loader's sampler, and calls ``skip_batches`` of the batch samplers here.  Lightning sets the epoch on a
  loader's ``sampler`` and on its batch sampler's ``sampler`` only, so the batch samplers here take it through
  a ``sampler`` attribute of their own (without it, every epoch of a length-bucketed run was epoch 0's).
  Evaluation records are gathered and de-duplicated by id afterwards
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


class _EpochSetter:
    """A batch sampler's ``sampler`` attribute, there for Lightning: at each epoch's start it calls ``set_epoch`` on a
    loader's ``sampler`` and on its batch sampler's ``sampler``, never on the batch sampler itself."""

    def __init__(self, owner: "_EpochBatchSampler"):
        self.owner = owner

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)


class _EpochBatchSampler(Sampler[list[Key]]):
    """The batch samplers' shared part: ``(index, epoch)`` keys of the subclass's ``_batches()``, drawn when the
    pass starts (Lightning creates an epoch's iterator before it sets the epoch and before a resumed fit's
    ``on_train_start``), the epoch set through :attr:`sampler` too, and :meth:`skip_batches`."""

    epoch = 0
    _skip = 0

    @property
    def sampler(self) -> _EpochSetter:
        return _EpochSetter(self)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip_batches(self, count: int) -> None:
        """The next pass leaves out its first ``count`` batches (a run resumed mid-epoch: the ones it trained on
        before the stop); later passes are whole.  ``len`` stays the whole epoch's, as Lightning counts on it."""
        self._skip = int(count)

    def _batches(self) -> list[list[int]]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[Key]]:
        skip, self._skip = self._skip, 0
        epoch = self.epoch
        for batch in self._batches()[skip:]:
            yield [(i, epoch) for i in batch]


class LengthBucketBatchSampler(_EpochBatchSampler):
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

    def __len__(self) -> int:
        n = len(self.lengths)
        window = self.batch_size * self.bucket_factor
        if self.drop_last:
            count = sum(min(window, n - s) // self.batch_size for s in range(0, n, window))
        else:
            count = sum(-(-min(window, n - s) // self.batch_size) for s in range(0, n, window))
        return -(-count // self.num_replicas) if self.num_replicas > 1 else count


class TokenBudgetBatchSampler(_EpochBatchSampler):
    """Batches of at most ``max_tokens`` tokens in shuffled order, never sorted by length (``data.batch_tokens``).

    Per epoch: shuffle all indices with ``(seed, epoch)``, then cut the shuffled stream into ``count``
    consecutive batches of near-equal tokens: batch ``j`` starts at the first instance whose running total
    of ``lengths`` reaches ``j / count`` of the epoch's tokens.  ``count`` is the same every epoch:
    ``ceil(total / (max_tokens - longest))`` rounded up to a multiple of ``num_replicas``, so every batch
    holds less than ``total / count + longest <= max_tokens`` tokens whatever the order, every epoch has the
    same number of steps (the lr schedule counts the run's real steps) and the batches' mean fill,
    ``total / (count * max_tokens)``, is known before the first one (:attr:`padding`: the budget left
    unused; about ``longest / max_tokens``).  Under DDP rank ``r`` takes batches ``r, r + R, ...``: the
    same number on every rank, no instance twice.  A batch's tokens are within ``longest`` of
    ``total / count``, its instances ``len / count`` on average (:attr:`mean_batch_size`).
    """

    def __init__(self, lengths: Sequence[int], max_tokens: int, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0):
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        self.max_tokens, self.shuffle, self.seed = int(max_tokens), shuffle, int(seed)
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.epoch = 0
        if not len(self.lengths) or int(self.lengths.min()) < 1:
            raise ValueError("a token budget needs instances of at least one token each")
        self.total, self.longest = int(self.lengths.sum()), int(self.lengths.max())
        if self.max_tokens <= self.longest:
            raise ValueError(f"data.batch_tokens={self.max_tokens}: the longest training instance has {self.longest} "
                             f"tokens; raise data.batch_tokens (to at least {2 * self.longest})")
        count = -(-self.total // (self.max_tokens - self.longest))
        self.count = -(-count // self.num_replicas) * self.num_replicas
        if self.total < self.count * self.longest:   # a batch could come out empty
            raise ValueError(f"data.batch_tokens={self.max_tokens}: {self.total} training tokens in {self.count} "
                             f"batches ({self.num_replicas} process(es)) leave fewer than the longest instance "
                             f"({self.longest} tokens) a batch; raise data.batch_tokens (to at least "
                             f"{2 * self.longest}) or use data.batch_size")

    @property
    def mean_batch_size(self) -> float:
        return len(self.lengths) / self.count

    @property
    def padding(self) -> float:
        return 1.0 - self.total / (self.count * self.max_tokens)

    def _batches(self) -> list[list[int]]:
        n = len(self.lengths)
        order = torch.randperm(n, generator=_epoch_generator(self.seed, self.epoch)) if self.shuffle else torch.arange(n)
        running = torch.cat([torch.zeros(1, dtype=torch.long), self.lengths[order].cumsum(0)])
        # start of batch j: the first i with running[i] >= j * total / count (integers: no rounding)
        starts = torch.searchsorted(running * self.count, torch.arange(self.count + 1) * self.total).tolist()
        starts[-1] = n
        batches = [order[a:b].tolist() for a, b in zip(starts, starts[1:])]
        return batches[self.rank::self.num_replicas]

    def __len__(self) -> int:
        return self.count // self.num_replicas


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
                 persistent_workers: bool = False, batch_tokens: Optional[int] = None) -> DataLoader:
    """The DataLoader of one split under the scheme above.

    ``lengths`` (training only) groups batches by length with :class:`LengthBucketBatchSampler`, or with
    ``batch_tokens`` cuts batches of at most that many tokens (:class:`TokenBudgetBatchSampler`; then
    ``batch_size`` is not used).  The loader gets a private generator, so building one never consumes the
    global RNG.
    """
    replicas, rank = shard_of(trainer)
    common = {"collate_fn": collate_fn, "num_workers": num_workers, "pin_memory": pin_memory,
              "persistent_workers": persistent_workers and num_workers > 0,
              "generator": torch.Generator().manual_seed(int(seed))}
    if batch_tokens is not None:
        if lengths is None:
            raise ValueError("a token budget (batch_tokens) needs the instances' lengths")
        batch_sampler = TokenBudgetBatchSampler(lengths, batch_tokens, shuffle=shuffle, seed=seed,
                                                num_replicas=replicas, rank=rank)
        return DataLoader(dataset, batch_sampler=batch_sampler, **common)
    if lengths is not None:
        batch_sampler = LengthBucketBatchSampler(lengths, batch_size, bucket_factor, shuffle=shuffle, seed=seed,
                                                 num_replicas=replicas, rank=rank)
        return DataLoader(dataset, batch_sampler=batch_sampler, **common)
    sampler = EpochSampler(len(dataset), shuffle=shuffle, seed=seed, num_replicas=replicas, rank=rank)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **common)
