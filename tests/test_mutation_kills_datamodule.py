"""The data module (data_modules/datamodule.py) where mutation testing found behaviour no fast test pinned
(docs/mutation.md): ``data.train_subset`` of 1 and of the whole split, on a source without a training split, its
error naming the file and its log line; the token budget (``data.batch_tokens``) refused unless a whole number,
applying to training batches only, and the line that reports its batches (docs/running.md quotes it)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from data_modules.datamodule import ProcedureDataModule
from data_modules.sampling import TokenBudgetBatchSampler
from seqaware.procedure import Procedure, Step


def _proc(pid: str, n: int, split: str = "train") -> Procedure:
    return Procedure(id=pid, steps=[Step(text=f"step {i} of {pid}") for i in range(n)], split=split)


def _dm(splits, **kwargs) -> ProcedureDataModule:
    """Without text, an instance's (joint) tokens are its steps: lengths a test can count by hand."""
    options = dict(tokenizer=None, verify_images=False, collator={"use_text": False, "use_images": False})
    options.update(kwargs)
    return ProcedureDataModule(lambda **paths: splits, **options)


# ------------------------------------------------------------------------------ data.train_subset
def test_a_train_subset_of_one_procedure_is_accepted_and_keeps_one():
    dm = _dm({}, train_subset=1, seed=0)
    assert len(dm._subset([_proc(f"p{i}", 2) for i in range(4)])) == 1


def test_a_train_subset_as_large_as_the_split_keeps_every_procedure_in_file_order():
    procedures = [_proc(f"p{i}", 2) for i in range(4)]
    dm = _dm({}, train_subset=4, seed=3)
    assert [p.id for p in dm._subset(procedures)] == ["p0", "p1", "p2", "p3"]


def test_a_train_subset_larger_than_the_split_names_the_training_file():
    dm = _dm({}, train_subset=5, train_path="/data/train.jsonl")
    with pytest.raises(ValueError) as err:
        dm._subset([_proc(f"p{i}", 2) for i in range(4)])
    assert str(err.value) == "data.train_subset=5: data.train_path=/data/train.jsonl has only 4 training procedures"


def test_a_train_subset_of_a_source_without_a_training_split_says_it_has_none():
    dm = _dm({"val": [_proc("v0", 3, "val")]}, train_subset=1)
    with pytest.raises(ValueError, match=r"^data.train_subset=1: data.source \(<lambda>, train split\) has only 0 "
                                         r"training procedures$"):
        dm.setup("fit")


@pytest.mark.parametrize("subset_seed, logged", [(None, 3), (7, 7)])
def test_the_train_subset_is_logged_with_k_the_split_size_and_the_seed_it_was_drawn_with(caplog, subset_seed, logged):
    """The line scripts/studies/label_efficiency.py's own test reads to check which k a fine-tuning saw."""
    dm = _dm({}, train_subset=2, seed=3, train_subset_seed=subset_seed)
    with caplog.at_level(logging.INFO, logger="data_modules.datamodule"):
        dm._subset([_proc(f"p{i}", 2) for i in range(5)])
    assert caplog.messages == [f"data.train_subset=2: 2 of the 5 training procedures (seed {logged})"]


# ------------------------------------------------------------------------------ data.batch_tokens
SPLITS = {"train": [_proc(f"t{i}", 3) for i in range(6)] + [_proc(f"u{i}", 5) for i in range(2)],
          "val": [_proc(f"v{i}", 4, "val") for i in range(3)]}
"""Training: 6 x 3 + 2 x 5 = 28 tokens, the longest 5; validation: 3 procedures."""


@pytest.mark.parametrize("budget", [512.5, "512", True])
def test_a_token_budget_that_is_not_a_whole_number_is_refused_naming_the_key(budget):
    with pytest.raises(ValueError) as err:
        _dm({}, batch_tokens=budget)
    assert str(err.value) == f"data.batch_tokens must be a positive number of tokens or null, got {budget!r}"


def test_a_token_budget_cuts_training_batches_only_evaluation_keeps_eval_batch_size_instances():
    dm = _dm(SPLITS, batch_tokens=12, eval_batch_size=2)
    dm.setup("fit")
    assert isinstance(dm.train_dataloader().batch_sampler, TokenBudgetBatchSampler)
    val = dm.val_dataloader()
    assert not isinstance(val.batch_sampler, TokenBudgetBatchSampler)
    assert [[m["id"] for m in batch["meta"]] for batch in val] == [["v0", "v1"], ["v2"]]   # 2 a batch, in order


def test_the_token_budget_line_reports_batches_per_epoch_and_per_process_mean_size_and_unused_budget(caplog):
    """ceil(28 / (12 - 5)) = 4 batches, on 2 processes 2 each, 8 / 4 = 2.0 instances a batch, and
    1 - 28 / (4 x 12) = 41.7% of the budget unused."""
    dm = _dm(SPLITS, batch_tokens=12)
    dm.setup("fit")
    dm.trainer = SimpleNamespace(world_size=2, global_rank=0)
    with caplog.at_level(logging.INFO, logger="data_modules.datamodule"):
        caplog.clear()   # setup's own "data: ..." line is captured too when another test left this logger at INFO
        dm.train_dataloader()
    assert caplog.messages == ["data.batch_tokens=12 (joint tokens): 4 batches an epoch (2 per process) of 2.0 "
                               "training instances on average, 41.7% of the budget unused"]
