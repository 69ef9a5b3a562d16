"""One sampling scheme for every data module: (seed, epoch) order, DDP shards, exact resume."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hydra.utils import instantiate

from data_modules.sampling import EpochSampler, KeyedList, LengthBucketBatchSampler, epoch_loader


def _keys(loader, epoch: int) -> list:
    sampler = loader.batch_sampler if isinstance(loader.batch_sampler, LengthBucketBatchSampler) else loader.sampler
    sampler.set_epoch(epoch)
    return list(sampler)


def test_epoch_loader_order_is_a_function_of_seed_and_epoch_and_ranks_partition_it():
    data = KeyedList(list(range(11)))
    one = epoch_loader(data, batch_size=4, shuffle=True, seed=5)
    again = epoch_loader(data, batch_size=4, shuffle=True, seed=5)
    assert _keys(one, 3) == _keys(again, 3)  # a fresh loader (a resumed run) replays the epoch
    assert [i for i, _ in _keys(one, 0)] != [i for i, _ in _keys(one, 1)]
    ranks = [epoch_loader(data, batch_size=4, shuffle=True, seed=5, trainer=SimpleNamespace(world_size=2, global_rank=r))
             for r in range(2)]
    shards = [[i for i, _ in _keys(loader, 2)] for loader in ranks]
    assert len(shards[0]) == len(shards[1]) == 6  # 11 items, padded by one repeat
    assert sorted(set(shards[0]) | set(shards[1])) == list(range(11))
    assert [i for i, _ in _keys(one, 2)] == [i for pair in zip(*shards) for i in pair][:11]


def test_epoch_loader_buckets_by_length_when_given_lengths():
    data = KeyedList(list(range(20)))
    loader = epoch_loader(data, batch_size=4, shuffle=True, seed=1, lengths=list(range(20)), bucket_factor=5)
    assert isinstance(loader.batch_sampler, LengthBucketBatchSampler)
    batches = _keys(loader, 0)
    assert sorted(i for b in batches for i, _ in b) == list(range(20))
    assert next(iter(loader)).tolist() == [i for i, _ in batches[0]]  # the loader reads what the sampler keys


@pytest.mark.parametrize("experiment", ["order_baseline", "teo_head_synthetic", "teo_plan_head_synthetic",
                                        "teo_lora_synthetic"])
def test_every_data_module_shards_and_replays_its_epochs(compose_train, experiment):
    """Each data module's loaders use the shared samplers: DDP-sharded, epoch-seeded, resumable."""
    cfg = compose_train(f"experiment={experiment}")
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    for world in (1, 2):
        dm.trainer = SimpleNamespace(world_size=world, global_rank=world - 1)
        train = dm.train_dataloader()
        sampler = train.batch_sampler if isinstance(train.batch_sampler, LengthBucketBatchSampler) else train.sampler
        assert isinstance(sampler, (EpochSampler, LengthBucketBatchSampler))
        assert sampler.num_replicas == world and sampler.rank == world - 1
        assert _keys(train, 1) == _keys(dm.train_dataloader(), 1)
        val = dm.val_dataloader()
        assert isinstance(val.sampler, EpochSampler) and not val.sampler.shuffle
        assert val.sampler.num_replicas == world
