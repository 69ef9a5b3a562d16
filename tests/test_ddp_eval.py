"""Distributed evaluation counts each instance once: the gather helper, the global-batch loss share,
and train.py testing one checkpoint on 1 and on 2 gloo processes (an odd test split) alike."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seqaware.io import parse_test_metrics
from seqaware.metrics.ordering import corpus_order_metrics, order_keys
from seqaware.modules.base import gather_unique, global_mean, global_share

ROOT = Path(__file__).resolve().parents[1]


def test_gather_unique_one_process_keeps_first_of_each_key_sorted():
    records = [{"id": "c", "v": 1}, {"id": "a", "v": 2}, {"id": "c", "v": 3}, {"id": "b", "v": 4}]
    assert gather_unique(records, key=lambda r: r["id"]) == [{"id": "a", "v": 2}, {"id": "b", "v": 4}, {"id": "c", "v": 1}]
    assert gather_unique([], key=lambda r: r["id"]) == []


def test_global_share_one_process_is_the_local_mean():
    assert torch.equal(global_share(torch.tensor([3, 0])), torch.ones(2))
    assert global_mean(torch.tensor(6.0), torch.tensor(4)).item() == 1.5


def _two_ranks(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        # 9 instances on 2 ranks: rank 1's share is padded with a repeat of instance 0 (DistributedSampler)
        shard = [0, 2, 4, 6, 8] if rank == 0 else [1, 3, 5, 7, 0]
        records = [{"id": f"p{i}", "rank": rank} for i in shard]
        merged = gather_unique(records, key=lambda r: r["id"])
        # rank 0 holds 3 pairs with loss sum 6 (mean 2), rank 1 one pair with loss sum 4 (mean 4):
        # the global mean is (6 + 4) / 4 = 2.5, the mean of the rank means (2 + 4) / 2 = 3
        local_sum, local_count = (torch.tensor(6.0), torch.tensor(3)) if rank == 0 else (torch.tensor(4.0), torch.tensor(1))
        share = global_share(local_count).item()
        mean = global_mean(local_sum, local_count)
        total = mean.clone()
        dist.all_reduce(total)  # what DDP's gradient averaging does: the mean of the ranks' values
        with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
            json.dump({"ids": [r["id"] for r in merged], "p0_rank": merged[0]["rank"], "share": share,
                       "averaged": total.item() / 2}, fh)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two spawned interpreters: 10-80 s on a shared 2-core CPU
def test_gather_unique_and_global_share_on_two_gloo_processes(tmp_path):
    mp.spawn(_two_ranks, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["ids"] == [f"p{i}" for i in range(9)]  # each once, the same list on both ranks
        assert got["p0_rank"] == 0  # the padded repeat on rank 1 is dropped, not the original
        assert got["share"] == pytest.approx([1.5, 0.5][rank])  # 3 * 2 / 4 and 1 * 2 / 4
        assert got["averaged"] == pytest.approx(2.5)  # (1.5 * 2 + 0.5 * 4) / 2, not 3


# ------------------------------------------------------------------ train.py, 1 vs 2 processes

def _tiny_data(num_test: int) -> list[str]:
    from conftest import TINY_SYNTHETIC

    world = dict(TINY_SYNTHETIC, num_test=num_test)
    return [f"data.source.{k}={v}" for k, v in world.items()]


TINY_BASELINE = ["experiment=order_baseline", "data.collator.image_size=32", "model.net.dim=32", "data.batch_size=4",
                 "data.eval_batch_size=2", "data.num_workers=0", "logger=csv", "callbacks.progress_bar.refresh_rate=0"]


def _test_checkpoint(ckpt: Path, run_dir: Path, cache_dir: Path, devices: int) -> tuple[dict, list[dict]]:
    trainer = (["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"] if devices == 2
               else ["trainer.accelerator=cpu", "trainer.devices=1"])
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY_BASELINE, *trainer, "train=false", f"ckpt_path={ckpt}",
           f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run_dir}", *_tiny_data(9)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_dir.parent, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    metrics = parse_test_metrics(res.stdout)
    assert metrics is not None, res.stdout[-2000:]
    preds = [json.loads(line) for line in (run_dir / "predictions_test.jsonl").read_text().splitlines()]
    return metrics, preds


@pytest.mark.slow
def test_two_processes_test_a_checkpoint_exactly_like_one(compose_train, cache_dir, tmp_path):
    """9 test procedures: 2 ranks get 5 each (one repeat). Logged metrics == 1 process == predictions file."""
    import train

    cfg = compose_train(*TINY_BASELINE, *_tiny_data(9), "trainer.max_epochs=1", "trainer.limit_train_batches=2",
                        "trainer.limit_val_batches=1", "test=false")
    train.run(cfg)
    ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    one, preds_one = _test_checkpoint(ckpt, tmp_path / "one", cache_dir, devices=1)
    two, preds_two = _test_checkpoint(ckpt, tmp_path / "two", cache_dir, devices=2)

    assert one["test/n"] == two["test/n"] == 9.0
    assert len(preds_two) == 9 == len({p["id"] for p in preds_two})
    assert preds_two == preds_one
    for key in (f"test/{k}" for k in order_keys()):   # every sequencing metric
        assert two[key] == one[key], key
    # the logged metrics are those of the predictions file
    from_file = corpus_order_metrics([p["pred"] for p in preds_two], [p["references"] for p in preds_two])
    for key in ("acc", "pmr", "tau", "n"):
        assert two[f"test/{key}"] == pytest.approx(float(from_file[key]), rel=1e-6), key  # logged as float32
    # the loss: the BCE over every pair of the split / the number of pairs; per-pair values may
    # differ in the last bits between batch compositions (padding), not more
    assert two["test/loss"] == pytest.approx(one["test/loss"], rel=1e-6)
    assert set(two) == set(one)


TINY_PRETRAIN = ["experiment=clipvil_pretrain", "objectives=all", "model.objectives.smrm.vocab_scope=sequence",
                 "model.encoder.config={model_type: bert, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
                 "intermediate_size: 64, vocab_size: 30522, max_position_embeddings: 256}",
                 "data.collator.image_size=32", "data.batch_size=4", "data.eval_batch_size=2", "data.num_workers=0",
                 "logger=csv", "callbacks.progress_bar.refresh_rate=0"]


@pytest.mark.slow  # a 1-step fit, then the test split on 1 and on 2 processes: about 60 s
def test_two_processes_evaluate_a_pretraining_checkpoint_exactly_like_one(compose_train, cache_dir, tmp_path):
    """9 test procedures on 2 ranks (one padded repeat), generator_scope=rank: every objective's
    test metric is its sum over the split's targets / their number, each sequence once, and the
    corruption is seeded per sequence, so 2 processes log what 1 logs (SMRM with a per-sequence
    vocabulary: with vocab_scope=batch the candidates are the batch's regions by design)."""
    import train

    cfg = compose_train(*TINY_PRETRAIN, *_tiny_data(9), "trainer.max_steps=1", "trainer.val_check_interval=1",
                        "trainer.limit_val_batches=1", "test=false")
    train.run(cfg)
    ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    results = {}
    for devices in (1, 2):
        trainer = (["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"] if devices == 2
                   else ["trainer.accelerator=cpu", "trainer.devices=1"])
        cmd = [sys.executable, str(ROOT / "train.py"), *TINY_PRETRAIN, *trainer, "train=false", f"ckpt_path={ckpt}",
               f"paths.cache_dir={cache_dir}", f"hydra.run.dir={tmp_path / str(devices)}", *_tiny_data(9)]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
        assert res.returncode == 0, res.stderr[-4000:]
        results[devices] = parse_test_metrics(res.stdout)
        assert results[devices] is not None, res.stdout[-2000:]
    one, two = results[1], results[2]
    assert one["test/n"] == two["test/n"] == 9.0  # 10 sequences ran on 2 ranks
    assert set(one) == set(two)
    for name in ("mlm", "isp", "pisp", "smrm"):
        # hits / targets: exact unless a float tie flips between batch paddings
        assert two[f"test/{name}_acc"] == pytest.approx(one[f"test/{name}_acc"], abs=1e-6), name
        assert two[f"test/{name}_loss"] == pytest.approx(one[f"test/{name}_loss"], rel=1e-5), name
    assert two["test/smrm_num_candidates"] == pytest.approx(one["test/smrm_num_candidates"], rel=1e-6)
    assert two["test/loss"] == pytest.approx(one["test/loss"], rel=1e-5)


# ------------------------------------------------------------------ the ordering mixin, one process

def test_ordering_eval_counts_a_padded_repeat_once_and_loss_is_sum_over_count():
    """A distributed sampler's repeat (here: instance "a" again in the last batch) is scored once;
    the logged loss is the split's summed loss / its pair count, the predictions are the records."""
    from seqaware.modules.base import OrderingEvalMixin, SeqawareModule

    class Probe(OrderingEvalMixin, SeqawareModule):
        def __init__(self):
            super().__init__()
            self._init_eval()
            self.logged: dict[str, float] = {}

        def log_dict(self, values, **kwargs):
            self.logged.update(values)

    def meta(pid, step_index):
        return {"id": pid, "category": ["c"], "step_index": step_index, "references": [[0, 1, 2]], "dag": None}

    probe = Probe()
    probe.on_test_epoch_start()
    # "a": input positions hold steps [2, 0, 1]; predicting positions [1, 2, 0] gives [0, 1, 2] (exact)
    # "b": input positions hold steps [0, 1, 2]; predicting [1, 0, 2] gives [1, 0, 2] (not exact)
    batch1 = {"meta": [meta("b", [0, 1, 2]), meta("a", [2, 0, 1])]}
    probe._record_orders("test", batch1, [[1, 0, 2], [1, 2, 0]],
                         losses={"loss": (torch.tensor([4.0, 2.0]), torch.tensor([6, 2]))})
    batch2 = {"meta": [meta("a", [2, 0, 1])]}  # the padded repeat
    probe._record_orders("test", batch2, [[1, 2, 0]], losses={"loss": (torch.tensor([2.0]), torch.tensor([2]))})
    probe.on_test_epoch_end()
    assert probe.logged["test/n"] == 2.0  # not 3
    assert probe.logged["test/pmr"] == 0.5  # not 2/3
    assert probe.logged["test/loss"] == pytest.approx((4.0 + 2.0) / (6 + 2))  # not 8 / 10
    assert [p["id"] for p in probe.test_predictions] == ["a", "b"]
    assert [p["pred"] for p in probe.test_predictions] == [[0, 1, 2], [1, 0, 2]]
    assert [p["metrics"]["pmr"] for p in probe.test_predictions] == [1.0, 0.0]


@pytest.mark.parametrize("rule", ["joint", "wu2022"])
def test_prediction_records_score_against_the_reference_the_split_metrics_chose(rule):
    """A multi-reference instance predicted in a valid order other than the authored one is exact in the
    predictions file too (it was scored against the authored order only, so the file's PMR column
    disagreed with test/pmr); each record names the reference it was scored against."""
    from seqaware.modules.base import OrderingEvalMixin, SeqawareModule

    class Probe(OrderingEvalMixin, SeqawareModule):
        def __init__(self):
            super().__init__()
            self._init_eval(rule)
            self.logged: dict[str, float] = {}

        def log_dict(self, values, **kwargs):
            self.logged.update(values)

    two_chains = [[0, 1, 2, 3], [0, 2, 1, 3], [2, 0, 1, 3], [0, 2, 3, 1], [2, 0, 3, 1], [2, 3, 0, 1]]  # 0->1, 2->3
    meta = [{"id": "multi", "category": ["c"], "step_index": [0, 1, 2, 3], "references": two_chains, "dag": None},
            {"id": "single", "category": ["c"], "step_index": [0, 1, 2], "references": [[0, 1, 2]], "dag": None}]
    probe = Probe()
    probe.on_test_epoch_start()
    probe._record_orders("test", {"meta": meta}, [[2, 0, 3, 1], [1, 0, 2]])
    probe.on_test_epoch_end()
    multi, single = probe.test_predictions
    assert multi["gold"] == [0, 1, 2, 3] and multi["reference"] == 4
    assert multi["metrics"]["pmr"] == 1.0 and multi["metrics"]["acc"] == 1.0 and multi["metrics"]["tau"] == 1.0
    assert single["reference"] == 0 and single["metrics"]["pmr"] == 0.0
    for key in ("pmr", "acc", "tau", "dist"):  # the file's columns average to the logged split metrics
        assert probe.logged[f"test/{key}"] == pytest.approx((multi["metrics"][key] + single["metrics"][key]) / 2)
