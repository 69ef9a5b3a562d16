"""scripts/studies/label_efficiency.py (N and Y against the number of labelled procedures) and data.train_subset."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from data_modules.datamodule import ProcedureDataModule
from scripts.studies import label_efficiency as le
from seqaware.procedure import Procedure, Step

ROOT = Path(__file__).resolve().parents[1]


def procedures(n: int) -> list[Procedure]:
    """``n`` two-step procedures of distinct texts (in letters: content keys write every digit as 0)."""
    word = lambda i: "".join(chr(97 + int(d)) for d in str(i))  # noqa: E731
    return [Procedure(id=f"p{i}", steps=[Step(text=f"step {word(i)} a"), Step(text=f"step {word(i)} b")],
                      split="train") for i in range(n)]


def subset_ids(k: int, seed: int, n: int = 40, subset_seed: int | None = None) -> list[str]:
    dm = ProcedureDataModule(lambda: {}, tokenizer=None, seed=seed, train_subset=k, train_subset_seed=subset_seed)
    return [p.id for p in dm._subset(procedures(n))]


def test_train_subset_is_seeded_nested_and_in_file_order():
    small, large = subset_ids(8, 1), subset_ids(32, 1)
    assert len(small) == 8 and len(large) == 32 and len(set(large)) == 32
    assert set(small) <= set(large)                       # nested across k for one seed
    assert large == sorted(large, key=lambda x: int(x[1:]))  # file order kept
    assert subset_ids(8, 1) == small and subset_ids(8, 2) != small  # seeded: the same again, another seed another


def test_train_subset_seed_holds_the_labelled_set_across_seeds():
    assert subset_ids(8, 2, subset_seed=1) == subset_ids(8, 5, subset_seed=1) == subset_ids(8, 1)
    assert subset_ids(8, 2, subset_seed=None) == subset_ids(8, 2) != subset_ids(8, 2, subset_seed=1)


def test_train_subset_errors_name_the_key():
    with pytest.raises(ValueError, match=r"data.train_subset must be a positive number of training procedures or "
                                         r"null, got 0"):
        ProcedureDataModule(lambda: {}, tokenizer=None, train_subset=0)
    with pytest.raises(ValueError, match="got True"):
        ProcedureDataModule(lambda: {}, tokenizer=None, train_subset=True)
    dm = ProcedureDataModule(lambda: {}, tokenizer=None, train_subset=50)
    with pytest.raises(ValueError, match=r"data.train_subset=50: .* has only 40 training procedures"):
        dm._subset(procedures(40))


def test_setup_keeps_k_training_procedures_and_every_evaluation_procedure():
    splits = {"train": procedures(20), "val": procedures(5), "test": procedures(7)}
    dm = ProcedureDataModule(lambda: splits, tokenizer=None, train_subset=6, verify_images=False,
                             collator={"use_text": False, "use_images": False})
    dm.setup("fit")
    assert (len(dm.datasets["train"]), len(dm.datasets["val"]), len(dm.datasets["test"])) == (6, 5, 7)


def test_procedure_key_is_the_content_text_in_any_surface_form_and_image_bytes(tmp_path):
    (tmp_path / "a.png").write_bytes(b"one")
    (tmp_path / "b.png").write_bytes(b"two")

    def proc(texts, image, pid="x"):
        return Procedure(id=pid, steps=[Step(text=t, images=[image]) for t in texts], split="test", root=str(tmp_path))

    base = le.procedure_key(proc(["Don't stop.", "Go on"], "a.png"))
    assert le.procedure_key(proc(["do n't stop .", "go on"], "a.png", pid="other")) == base
    assert le.procedure_key(proc(["Don't stop.", "Go on"], "b.png")) != base
    assert le.procedure_key(proc(["Do stop.", "Go on"], "a.png")) != base


def test_a_test_procedure_in_the_pretraining_pool_stops_the_script(monkeypatch, tmp_path):
    shared = procedures(3)
    splits = {"pre": {"train": shared[:2], "val": [], "test": shared[2:]},
              "ft": {"train": [], "test": [*procedures(6)[4:], shared[1]]}}
    monkeypatch.setattr(le, "run_splits", lambda run_dir: splits[run_dir.name])
    with pytest.raises(SystemExit, match=r"1 test procedures of .*ft are in the pretraining pool of .*pre: \['p1'\]"):
        le.check_no_leak(tmp_path / "pre", tmp_path / "ft")
    # the pretraining run's own test split (never read: test=false) is not its pool
    splits["ft"]["test"] = [shared[2]]
    assert le.check_no_leak(tmp_path / "pre", tmp_path / "ft") == 1


def test_a_test_procedure_in_the_pretraining_runs_validation_split_stops_the_script(monkeypatch, tmp_path):
    """The pretraining run validates on its val split: a fine-tuning test procedure there leaks too. Here the
    only overlap is between that split and the fine-tuning test split (a copy under another id: the check
    compares content)."""
    pre, ft = procedures(12)[:6], procedures(12)[6:]
    copy = Procedure(id="val-copy", steps=list(pre[4].steps), split="test")
    splits = {"pre": {"train": pre[:3], "val": pre[3:5], "test": pre[5:]},
              "ft": {"train": ft[:2], "val": ft[2:4], "test": [*ft[4:], copy]}}
    monkeypatch.setattr(le, "run_splits", lambda run_dir: splits[run_dir.name])
    with pytest.raises(SystemExit, match=r"1 test procedures of .*ft are in the pretraining pool of .*pre: "
                                         r"\['val-copy'\]$"):
        le.check_no_leak(tmp_path / "pre", tmp_path / "ft")
    splits["ft"]["test"] = ft[4:]
    assert le.check_no_leak(tmp_path / "pre", tmp_path / "ft") == 2


def test_table_gives_mean_std_every_seed_and_the_seed_matched_gap():
    results = {8: {"N": {1: {"test/pmr": 0.50, "test/acc": 0.7, "test/tau": 0.4},
                         2: {"test/pmr": 0.60, "test/acc": 0.8, "test/tau": 0.5}},
                   "Y": {1: {"test/pmr": 0.56, "test/acc": 0.8, "test/tau": 0.6},
                         2: {"test/pmr": 0.70, "test/acc": 0.9, "test/tau": 0.7}}}}
    info = {"command": "python scripts/studies/label_efficiency.py --world hard", "date": "2026-11-28", "machine": "cpu, 2 cores",
            "pretrain": ["experiment=clipvil_pretrain"], "pretrain_s": 60.0, "steps": 100, "batch_size": 4,
            "seeds": [1, 2], "test_n": 300, "runs": 4, "total_s": 600.0}
    text = le.markdown("hard", le.WORLDS["hard"], results, info)
    assert "| 8 | N | 55.00 ± 7.07 | 50.00, 60.00 | 75.00 | 0.450 |  |" in text
    # seed-matched gaps 6 and 10: mean 8, sd 2.83, t(0.975, 1) = 12.706 -> 8 +- 25.41
    assert ("| 8 | Y | 63.00 ± 9.90 | 56.00, 70.00 | 85.00 | 0.650 | +8.00 ± 2.83 (95% CI [-17.41, +33.41]; "
            "Y > N on 2 of 2 seeds) |") in text
    assert "one = 0.33 PMR points" in text and "CPU time of the curve: 10 min (4 fine-tuning runs + the pretrainings)" in text
    assert "seeds 1, 2 (fewer than 5)" in text
    assert "Pretraining (Y), one run per seed S: `experiment=clipvil_pretrain` (60 s in all)." in text


def test_a_curve_without_y_reports_no_pretraining_and_writes_pages_only_when_asked(monkeypatch, tmp_path, capsys):
    def fake_train(overrides, run_dir, log_name):
        assert not any(o.startswith("model.encoder.ckpt") for o in overrides) and log_name == "N.log"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "test_metrics.json").write_text(json.dumps({"test/pmr": 0.5, "test/acc": 0.6, "test/tau": 0.1}))

    monkeypatch.setattr(le, "_train", fake_train)
    monkeypatch.setattr(le, "run_splits", lambda run_dir: {"test": procedures(3)})
    monkeypatch.setattr(le, "machine", lambda: "cpu")
    monkeypatch.chdir(tmp_path)
    pages = le.ROOT / "docs" / "results" / "label_efficiency"
    committed = lambda: {p: p.read_bytes() for p in pages.rglob("*") if p.is_file()}  # noqa: E731
    before = committed()
    assert before
    assert le.main(["--world", "hard", "--ks", "8", "--seeds", "1", "2", "--arms", "N", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "| 8 | N | 50.00 ± 0.00 | 50.00, 50.00 |" in out and "Pretraining" not in out and "pretraining" not in out
    assert "CPU time of the curve: 0 min (2 fine-tuning runs)." in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]  # no results page anywhere
    assert committed() == before   # a toy run leaves the committed pages alone
    assert le.main(["--world", "hard", "--ks", "8", "--seeds", "1", "--arms", "N", "--out", str(tmp_path / "o"),
                    "--results", str(tmp_path / "pages")]) == 0
    assert sorted(p.name for p in (tmp_path / "pages").iterdir()) == ["hard.md", "hard.png"]


def _fake_runs(monkeypatch) -> list:
    """Replace every train.py run of the script by a folder holding what a finished run leaves (the overrides,
    ``encoder.pt`` and a finished ``run.json`` for a pretraining, ``test_metrics.json`` for a fine-tuning);
    returns the list each run is appended to as ``(log_name, run_dir, overrides)``."""
    calls = []

    def fake_train(overrides, run_dir, log_name):
        calls.append((log_name, run_dir, overrides))
        (run_dir / ".hydra").mkdir(parents=True)
        (run_dir / ".hydra" / "overrides.yaml").write_text(json.dumps(overrides))
        if log_name == "pretrain.log":
            (run_dir / "encoder.pt").write_bytes(b"")
            (run_dir / "run.json").write_text(json.dumps({"status": "finished"}))
        else:
            (run_dir / "test_metrics.json").write_text(json.dumps({"test/pmr": 0.5, "test/acc": 0.6, "test/tau": 0.1}))

    monkeypatch.setattr(le, "_train", fake_train)
    monkeypatch.setattr(le, "check_no_leak", lambda pre, ft: 3)
    monkeypatch.setattr(le, "machine", lambda: "cpu")
    return calls


def test_each_seed_pretrains_its_own_encoder_and_its_y_fine_tunes_from_it(monkeypatch, tmp_path, capsys):
    """A pretraining is a draw of its own: seed S pretrains with seed=S, and Y of seed S loads that encoder."""
    calls = _fake_runs(monkeypatch)
    out = tmp_path / "o"
    assert le.main(["--world", "hard", "--ks", "8", "32", "--seeds", "1", "2", "--out", str(out)]) == 0
    pre = out / "hard" / "pretrain-mlm_sop_smrm"
    assert [(log, run.relative_to(out).as_posix()) for log, run, _ in calls] == [
        ("pretrain.log", "hard/pretrain-mlm_sop_smrm/seed1"), ("N.log", "hard/k8/seed1/N"), ("Y.log", "hard/k8/seed1/Y"),
        ("N.log", "hard/k32/seed1/N"), ("Y.log", "hard/k32/seed1/Y"),
        ("pretrain.log", "hard/pretrain-mlm_sop_smrm/seed2"), ("N.log", "hard/k8/seed2/N"), ("Y.log", "hard/k8/seed2/Y"),
        ("N.log", "hard/k32/seed2/N"), ("Y.log", "hard/k32/seed2/Y")]
    for log, run, overrides in calls:
        seed = run.parts[-2] if log != "pretrain.log" else run.name
        if log == "pretrain.log":
            assert f"seed={seed[4:]}" in overrides
        if log == "Y.log":
            assert overrides[-1] == f"model.encoder.ckpt={pre / seed / 'encoder.pt'}"
    assert "Pretraining (Y), one run per seed S: `experiment=clipvil_pretrain" in capsys.readouterr().out


def test_a_relative_and_an_absolute_out_name_the_same_runs(monkeypatch, tmp_path):
    """Y's encoder path is absolute, so the runs made with ``--out logs/x`` are reused by ``--out /abs/logs/x``
    (the reuse check compares override lists: a relative path there stopped the second command)."""
    calls = _fake_runs(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert le.main(["--world", "hard", "--ks", "8", "--seeds", "1", "--out", "o"]) == 0
    ckpt = [o for log, _, overrides in calls if log == "Y.log" for o in overrides if o.startswith("model.encoder.ckpt=")]
    assert ckpt == [f"model.encoder.ckpt={tmp_path / 'o/hard/pretrain-mlm_sop_smrm/seed1/encoder.pt'}"]
    made = len(calls)
    assert le.main(["--world", "hard", "--ks", "8", "--seeds", "1", "--out", str(tmp_path / "o")]) == 0
    assert len(calls) == made   # every run reused


def test_worlds_use_the_same_budget_for_n_and_y_and_keep_the_test_split_out_of_pretraining():
    for name, world in le.WORLDS.items():
        pre = le.pretrain_overrides(world, world.objectives, 10, 2, [])
        assert "test=false" in pre and not any(o.startswith("data.train_subset") for o in pre), name
        ft = le.finetune_overrides(world, 8, 1, 40, 4, [])
        assert "data.train_subset=8" in ft and "trainer.limit_val_batches=0" in ft and "trainer.max_steps=40" in ft
    assert "seed=S" in le.pretrain_overrides(world, world.objectives, 10, 2, [])          # as a page prints it
    assert "seed=3" in le.pretrain_overrides(world, world.objectives, 10, 2, [], 3)
    roc = le.pretrain_overrides(le.WORLDS["roc"], "[mlm,sop]", 10, 2, [])
    assert "data.train_path=${paths.shared_data_dir}/roc/train_extra.tsv" in roc
    assert not any("dev.tsv" in o for o in roc)


TINY = ["data.source.num_train=16", "data.source.num_val=4", "data.source.num_test=6", "data.source.image_size=64",
        "data.collator.image_size=64", "data.eval_batch_size=8", "data.num_workers=0",
        "model.encoder.config={model_type: bert, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
        "intermediate_size: 64, vocab_size: 30522, max_position_embeddings: 256}",
        "logger=csv", "callbacks.progress_bar.refresh_rate=0"]


RUN_LINE = re.compile(r"^  \S+: \d+ s$", re.M)
"""The script's "<run>: N s" line, printed once for each train.py process it starts."""


@pytest.mark.slow  # a tiny pretraining and four tiny fine-tunings: about 60 s on 2 cores
def test_the_whole_protocol_at_toy_size_then_resumes_without_training(tmp_path, cache_dir):
    out, results = tmp_path / "runs", tmp_path / "results"
    cmd = [sys.executable, str(ROOT / "scripts" / "studies" / "label_efficiency.py"), "--world", "hard", "--ks", "2", "4",
           "--seeds", "1", "--steps", "2", "--batch-size", "2", "--pretrain-steps", "2", "--pretrain-batch-size", "2",
           "--objectives", "[mlm,sop,smrm]", "--out", str(out), "--results", str(results),
           # 96 px: a 3 x 3 grid, so SMRM's < 50% overlap holds over a whole 5-step procedure (2 x 2 holds 4 images)
           "--pretrain-override", "trainer.val_check_interval=2", "--pretrain-override", "data.collator.image_size=96",
           "--", f"paths.cache_dir={cache_dir}", *TINY]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert (out / "hard" / "pretrain-mlm_sop_smrm" / "seed1" / "encoder.pt").is_file()
    assert len(RUN_LINE.findall(first.stdout)) == 5  # the pretraining and 4 fine-tunings ran
    assert "no test procedure of hard is in the pool of pretraining seed 1 (6 checked)" in first.stdout
    line = [x for x in first.stdout.splitlines() if x.startswith(le.MARKER)][-1]
    summary = json.loads(line[len(le.MARKER):])
    assert set(summary["points"]) == {"2/N", "2/Y", "4/N", "4/Y"} and summary["cpu_s"] > 0
    table = (results / "hard.md").read_text()
    assert "| 2 | Y |" in table and "| 4 | N |" in table and "test split 6 procedures" in table
    assert (results / "hard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the fine-tuning runs saw k procedures, the same ones for N and Y
    for k in (2, 4):
        for arm in ("N", "Y"):
            log = (out / "hard" / f"k{k}" / "seed1" / f"{arm}.log").read_text()
            assert f"data.train_subset={k}: {k} of the 16 training procedures (seed 1)" in log
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not RUN_LINE.search(again.stdout)  # no "<run>: N s" line: no train.py process ran
    assert [x for x in again.stdout.splitlines() if x.startswith(le.MARKER)][-1].split('"cpu_s"')[0] == \
        line.split('"cpu_s"')[0]
