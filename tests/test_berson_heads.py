"""scripts/studies/berson_heads.py: rows, the shared budget, reuse of finished runs and the table (train.py faked)."""
from __future__ import annotations

import json

import pytest
import yaml

from scripts.studies import berson_heads
from seqaware.io import write_test_metrics


@pytest.fixture
def fake_train(monkeypatch):
    """Replace train.py: record each command and write the run's overrides and test metrics (PMR from the seed)."""
    calls = []

    def train(overrides, run_dir, log_name):
        calls.append(list(overrides))
        (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
        (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
        seed = int(next(o for o in overrides if o.startswith("seed="))[5:])
        paper = "model.decoder.variant=paper" in overrides
        write_test_metrics(run_dir, {"test/pmr": 0.1 * seed + (0.05 if paper else 0.0), "test/acc": 0.5, "test/tau": 0.6})
        (run_dir / "csv").mkdir(exist_ok=True)                                  # StepWork's figures, two steps
        (run_dir / "csv" / "metrics.csv").write_text(f"perf/tokens_per_s,step,val/pmr\n{1000 * seed},9,\n"
                                                     f"{3000 * seed},19,\n,19,0.3\n")

    monkeypatch.setattr(berson_heads, "_train", train)
    return calls


def test_rows_and_the_ablation_set_one_switch_back_to_ours():
    rows = berson_heads.rows()
    assert rows["paper/joint"][0] == ("hparams=roc_joint", "model.decoder.variant=paper", "model.pair_encoding=joint")
    assert rows["paper-relation/joint"][0][-1] == "model.decoder.relation=tanh"
    assert rows["paper-loss_norm/joint"][0][-1] == "model.decoder.loss_norm=pooled"
    assert rows["recipe/paper"] == (("hparams=berson_roc_paper",), 4)
    ablation = berson_heads.select(["ablation"])
    assert ablation == [f"paper-{s}/joint" for s in berson_heads.ABLATED]
    with pytest.raises(SystemExit) as err:
        berson_heads.select(["paper/jiont"])
    assert str(err.value).startswith("--rows: unknown row 'paper/jiont'; known: ablation, ours/joint, ")


def test_one_budget_of_stories_for_every_row():
    assert berson_heads.budget(150, 16, 16, 400) == [
        "trainer.max_steps=150", "trainer.max_epochs=-1", "trainer.val_check_interval=75",
        "trainer.check_val_every_n_epoch=null", "trainer.limit_val_batches=25", "data.eval_batch_size=16"]
    assert berson_heads.budget(150, 16, 4, 400)[0] == "trainer.max_steps=600"   # batches of 4: the same 2,400 stories
    assert berson_heads.budget(0, 16, 4, 400) == []                              # the recipe's own budget


def test_a_budget_in_epochs_gives_every_row_the_same_share_of_its_data():
    val = ["trainer.limit_val_batches=25", "data.eval_batch_size=16"]
    share = ["trainer.max_steps=-1", "trainer.max_epochs=1", "trainer.limit_train_batches=0.55",
             "trainer.val_check_interval=0.5", "trainer.check_val_every_n_epoch=1", *val]
    assert berson_heads.budget(150, 16, 16, 400, epochs=0.55) == share           # --steps is not used
    assert berson_heads.budget(0, 16, None, 400, epochs=0.55) == share           # a token-budget row alike
    assert berson_heads.budget(0, 16, 16, 400, epochs=1)[2] == "trainer.limit_train_batches=1.0"   # not 1 batch
    assert berson_heads.budget(0, 16, 4, 400, epochs=2) == [
        "trainer.max_steps=-1", "trainer.max_epochs=2", "trainer.limit_train_batches=1.0",
        "trainer.val_check_interval=1.0", "trainer.check_val_every_n_epoch=1", *val]
    for bad in (0, -1, 1.5):
        with pytest.raises(SystemExit, match="--epochs must be"):
            berson_heads.budget(0, 16, 16, 400, epochs=bad)
    assert berson_heads.rows()["recipe/roc_joint_large"] == (("hparams=roc_joint_large",), None)
    with pytest.raises(SystemExit, match="row 'recipe/roc_joint_large' trains in batches of a token budget"):
        berson_heads.budget(150, 16, None, 400, name="recipe/roc_joint_large")
    assert berson_heads.budget(0, 16, None, 400) == []                           # its own recipe


def test_runs_are_reused_and_the_table_is_written(tmp_path, fake_train, capsys):
    out, table = tmp_path / "runs", tmp_path / "t.md"
    args = ["--seeds", "1", "2", "--out", str(out), "--table", str(table), "--", "trainer.accelerator=cpu"]
    assert berson_heads.main(args) == 0
    assert len(fake_train) == 4 and fake_train[0][:2] == ["experiment=berson_roc", "hparams=roc_joint"]
    assert fake_train[0][-1] == "trainer.accelerator=cpu" and "seed=1" in fake_train[0]
    text = table.read_text()
    assert "| `ours/joint` | 1 2 | 0.150 ± 0.071 | 0.500 ± 0.000 | 0.600 ± 0.000 | 0.100 / 0.200 |" in text
    assert "| `paper/joint` | 1 2 | 0.200 ± 0.071 |" in text
    # the later row against the first, seed by seed (+0.05 on both seeds), and each run's mean logged tokens/s
    assert "| 0.150 / 0.250 | +0.050 [+0.050, +0.050], higher on 2 of 2 | " in text
    assert text.splitlines()[2].endswith(" | - | 0 / 0 | 2,000 / 4,000 |")      # the first row: no gap
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1].split(" ", 1)[1])
    assert stats["paper/joint"]["pmr"]["values"] == pytest.approx([0.15, 0.25])
    assert berson_heads.main(args) == 0 and len(fake_train) == 4                 # nothing trained again
    with pytest.raises(SystemExit) as err:                                      # other overrides in a finished folder
        berson_heads.main(["--seeds", "1", "--out", str(out), "--steps", "10"])
    assert "holds a run made with other overrides" in str(err.value)
