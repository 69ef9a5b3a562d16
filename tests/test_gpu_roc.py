"""scripts/maintenance/gpu_roc.py: the ROCStories rows with MPNet-base for the first GPU, run here at toy size.

What the GPU session runs is ``gpu_roc.py run`` over weights carried in parts (tests/test_weight_parts.py) and the
ROC files carried gzipped; every piece of it is checked here: the data staging and its checks, the time plan, the
scheduling of seeds under the budget, the overrides each run gets (composed against the real configs), and the
whole path on a tiny random MPNet and a handful of stories, ending with the table written.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

from scripts.maintenance import gpu_roc  # noqa: E402
from scripts.maintenance.gpu_roc import StagingError, max_time, pack_data, plan_train_seconds, schedule, unpack_data  # noqa: E402

NAMES = ["anna", "ben", "carl", "dana", "eli", "fay", "gus", "hana", "ivan", "jill"]
THINGS = ["bike", "cake", "dog", "kite", "lamp", "book", "coat", "drum", "vase", "boat"]


def story(i: int) -> str:
    """A five-sentence ROC line, distinct for i < 100."""
    who, what = NAMES[i % 10], THINGS[i // 10 % 10]
    return " <eos> ".join([f"{who} wanted a new {what} .", f"{who} saved money for the {what} .",
                           f"{who} went to the shop .", f"{who} bought the {what} .", f"{who} was happy with the {what} ."])


def write_roc(folder: Path, dev: int = 30, extra: int = 12) -> Path:
    """dev.tsv (30 stories: 21 train, 3 validation, 6 test) and train_extra.tsv (12 more) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dev.tsv").write_text("".join(story(i) + "\n" for i in range(dev)))
    (folder / "train_extra.tsv").write_text("".join(story(i) + "\n" for i in range(dev, dev + extra)))
    return folder


# ---------------------------------------------------------------- data
def test_the_roc_files_travel_gzipped_and_are_checked_on_arrival(tmp_path):
    src = write_roc(tmp_path / "shared" / "roc")
    sums = pack_data(src, tmp_path / "carry")
    assert sorted(p.name for p in (tmp_path / "carry").iterdir()) == ["SHA256SUMS", "dev.tsv.gz", "train_extra.tsv.gz"]
    assert (tmp_path / "carry" / "SHA256SUMS").read_text() == (f"{sums['dev.tsv']}  dev.tsv\n"
                                                               f"{sums['train_extra.tsv']}  train_extra.tsv\n")
    root = unpack_data(tmp_path / "carry", tmp_path / "work")
    for name in ("dev.tsv", "train_extra.tsv"):
        assert (root / "roc" / name).read_bytes() == (src / name).read_bytes()

    carry = tmp_path / "carry"
    (carry / "dev.tsv.gz").write_bytes(gzip.compress(story(99).encode()))       # another content
    (carry / "train_extra.tsv.gz").unlink()
    with pytest.raises(StagingError) as err:
        unpack_data(carry, tmp_path / "work2")
    import hashlib

    other = hashlib.sha256(story(99).encode()).hexdigest()
    assert str(err.value) == ("the ROC data cannot be used:\n"
                              f"  {carry / 'dev.tsv.gz'}: SHA-256 of its content {other[:16]}... differs from "
                              f"{carry / 'SHA256SUMS'}'s {sums['dev.tsv'][:16]}...\n"
                              f"  {carry / 'train_extra.tsv.gz'}: missing\n")
    (carry / "SHA256SUMS").write_text("junk\n")
    with pytest.raises(StagingError, match=r"SHA256SUMS:1: expected 'SHA256  NAME', got 'junk'$"):
        unpack_data(carry, tmp_path / "work3")
    (carry / "SHA256SUMS").unlink()
    with pytest.raises(StagingError, match=r"SHA256SUMS: missing \(written by gpu_roc.py pack-data beside the data\)$"):
        unpack_data(carry, tmp_path / "work3")
    (src / "train_extra.tsv").unlink()
    with pytest.raises(StagingError, match=r"train_extra.tsv: missing \(the ROC files are read from ../shared/data/roc\)$"):
        pack_data(src, tmp_path / "carry2")


def test_the_packages_the_device_lacks_travel_as_one_zip_and_import_from_it(tmp_path):
    import zipfile

    assert gpu_roc.PACKAGES == ("hydra-core", "omegaconf", "antlr4-python3-runtime", "transformers")
    pinned = gpu_roc.pack_packages(tmp_path / "site.zip", ["hydra-core", "omegaconf", "antlr4-python3-runtime"])
    import importlib.metadata as metadata

    assert pinned == [f"hydra-core=={metadata.version('hydra-core')}", f"omegaconf=={metadata.version('omegaconf')}",
                      f"antlr4-python3-runtime=={metadata.version('antlr4-python3-runtime')}"]
    with zipfile.ZipFile(tmp_path / "site.zip") as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    assert "hydra/__init__.py" in names and not any(n.endswith(".pyc") for n in names)
    probe = ("import hydra, omegaconf, antlr4, importlib.metadata as m; "
             "print(hydra.__file__, omegaconf.__file__, m.version('hydra-core'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}).stdout.split()
    assert out == [str(tmp_path / "site" / "hydra" / "__init__.py"), str(tmp_path / "site" / "omegaconf" / "__init__.py"),
                   metadata.version("hydra-core")]
    with pytest.raises(StagingError, match=r"^no-such-dist: not installed here, so it cannot be packed"):
        gpu_roc.pack_packages(tmp_path / "other.zip", ["no-such-dist"])


def test_train_stories_are_dev_less_its_held_out_slices_plus_train_extra(tmp_path):
    assert gpu_roc.train_stories(write_roc(tmp_path / "toy" / "roc").parent) == 33     # the log's "train: 33"


@pytest.mark.shared_data
def test_train_stories_of_the_shared_roc_files(shared_data):
    assert gpu_roc.train_stories(shared_data) == 37602          # 6,871 of dev.tsv + 30,731 (docs/results/sequencing.md)


# ---------------------------------------------------------------- the time plan
def test_the_budget_is_shared_by_the_rows_and_as_many_seeds_as_leave_each_run_two_minutes():
    # one call: 455 s left after unpacking, 30 s of it slack, two rows, 90 s of overhead a run -> seed 0 only,
    # 122.5 s of training
    assert plan_train_seconds(455, 2, 3, 90) == (122.5, 1)
    assert plan_train_seconds(1000, 2, 3, 90) == (152.5, 2)      # 970/6 - 90 = 71.7 s is under 120: two seeds
    assert plan_train_seconds(2000, 2, 3, 90) == (1970 / 6 - 90, 3)
    assert plan_train_seconds(455, 2, 3, 90, slack=0) == (137.5, 1)
    with pytest.raises(SystemExit, match=r"^--budget: 200 s left \(30 s of them kept as slack\) for 2 run\(s\) of 90 s "
                                         r"overhead each: no time to train; raise --budget or lower --overhead-seconds$"):
        plan_train_seconds(200, 2, 3, 90)
    assert gpu_roc.planned_steps("recipe/roc_base", 16, 137.5, None, 37602) == 1883     # 0.073 s a step
    assert gpu_roc.planned_steps("recipe/paper", 4, 137.5, None, 37602) == 1375         # 0.10 s a step
    assert gpu_roc.planned_steps("recipe/paper", 4, 137.5, 7, 37602) == 7
    # never more than the recipe: 4 epochs of 2,351 batches of 16, 2 of 9,401 of 4
    assert gpu_roc.planned_steps("recipe/roc_base", 16, 10 ** 6, None, 37602) == 9404
    assert gpu_roc.planned_steps("recipe/paper", 4, 137.5, 10 ** 6, 37602) == 18802
    assert [max_time(164.3), max_time(0), max_time(90061)] == ["00:00:02:45", "00:00:00:00", "01:01:01:01"]


def test_max_time_ends_the_fit_in_time_for_the_test_whatever_the_planned_training_time(tmp_path):
    # the H200 on 2026-11-28: --budget 585 --train-seconds 450 gave max_time 540 s, and with the start-up and the
    # sanity check's compile before Lightning's clock started, the call's limit came before the test
    def cap(*args) -> str:
        return next(o for o in gpu_roc.run_overrides("recipe/roc_base", tmp_path, tmp_path, "gpu", *args)
                    if o.startswith("++trainer.max_time="))

    assert cap(450.0, []) == "++trainer.max_time=00:00:09:00"                       # 1.2 x 450 s
    assert cap(450.0, [], 585 - 1 - gpu_roc.RESERVE_S) == "++trainer.max_time=00:00:08:04"   # what the budget leaves
    assert cap(100.0, [], 484.0) == "++trainer.max_time=00:00:02:00"                # 1.2 x 100 s is less


@pytest.mark.parametrize("variant, compile", [("eager", False), ("compile", {"dynamic": True}),
                                              ("cudagraphs", {"mode": "reduce-overhead", "dynamic": True})])
def test_each_timed_variant_composes_to_roc_base_with_its_compile_setting(compose_train, tmp_path, variant, compile):
    overrides = gpu_roc.timing_overrides(tmp_path / "mpnet", tmp_path / "data", "cpu", tmp_path / "clock.json", 40,
                                         150, variant, [])
    cfg = compose_train(*[o for o in overrides if not o.startswith("backbones.")])
    assert cfg.model.compile == compile and cfg.trainer.inference_mode is (not compile)
    assert cfg.model.pair_encoding == "joint" and cfg.data.batch_size == 16 and cfg.trainer.max_steps == 190
    assert cfg.callbacks.step_clock.warmup_steps == 40 and cfg.callbacks.step_clock.steps == 150


def test_a_step_choice_sets_the_pace_of_the_plan_and_only_for_roc_base(tmp_path):
    # time-steps measured 0.04 s a step after 90 s of compiling: 9,404 steps need 376 s + 90 s
    path = tmp_path / "choice.json"
    path.write_text(json.dumps({"variant": "compile", "status": "timed", "warmup_steps": 60, "warmup_s": 90.0,
                                "steps": 200, "seconds": 8.0, "s_per_step": 0.04, "recipe_s": 466.2,
                                "overrides": ["model.compile={dynamic:true}"]}))
    choice = gpu_roc.read_step_choice(path, ["recipe/roc_base"])
    assert choice == {"variant": "compile", "overrides": ["model.compile={dynamic:true}"], "s_per_step": 0.04,
                      "warmup_s": 90.0}
    pace = gpu_roc.STEP_MARGIN * choice["s_per_step"]
    assert gpu_roc.planned_steps("recipe/roc_base", 16, 300 - 90, None, 37602, pace) == 4772      # 210 s / 0.044
    assert gpu_roc.planned_steps("recipe/roc_base", 16, 520 - 90, None, 37602, pace) == 9404      # the whole recipe
    with pytest.raises(SystemExit, match=r"^--step-choice times recipe/roc_base steps: use it with --rows "
                                         r"recipe/roc_base, not \['recipe/roc_base', 'recipe/paper'\]$"):
        gpu_roc.read_step_choice(path, list(gpu_roc.ROWS))
    path.write_text("{}")
    with pytest.raises(SystemExit, match=rf"^--step-choice {path}: not a choice written by gpu_roc.py time-steps "
                                         r"\('variant'\)$"):
        gpu_roc.read_step_choice(path, ["recipe/roc_base"])


def test_the_planned_runs_start_though_the_clock_ran_on_after_the_plan():
    # on the H200 (2026-11-28) a plan that shared out every second planned 359 s of training + 90 s of overhead for
    # the 449 s left: 8 s later its only run was skipped ("441 s left of the budget, a run takes about 449 s")
    clock = [9.0]                                          # the unpacking
    train, planned = plan_train_seconds(450.0 - clock[0], 1, 1, 90)
    assert (train, planned) == (321.0, 1)
    clock[0] += 1.0                                        # the plan, the machine's description

    def run_one(name, seed):
        clock[0] += train + 90
        return {"status": "tested", "wall_s": train + 90}

    records = schedule(["a"], [0], 450.0, train + 90, run_one, clock=lambda: clock[0])
    assert [r["status"] for r in records] == ["tested"]


def test_seeds_run_in_order_while_the_budget_covers_a_run_and_a_failed_run_is_reported():
    clock = [0.0]
    walls = {"a": 150.0, "b": 260.0}

    def run_one(name, seed):
        clock[0] += walls[name]
        if seed == 0 and name == "b":
            raise SystemExit("train.py failed (exit 1) after 260 s: ...")
        return {"status": "tested", "wall_s": walls[name]}

    seen = []
    records = schedule(["a", "b"], [0, 1, 2], 800.0, 200.0, run_one, clock=lambda: clock[0],
                       on_record=lambda r: seen.append(len(r)))
    assert [(r["row"], r["seed"], r["status"]) for r in records] == [
        ("a", 0, "tested"), ("b", 0, "failed"), ("a", 1, "tested"), ("b", 1, "tested"), ("a", 2, "skipped"),
        ("b", 2, "skipped")]
    assert records[1]["error"] == "train.py failed (exit 1) after 260 s: ..."
    # b's seed 1 started with 240 s left on the first guess (200 s): a failed run's wall is not taken as a guide;
    # after it each row's own last wall decides
    assert records[4]["error"] == "-20 s left of the budget, a run takes about 150 s"
    assert records[5]["error"] == "-20 s left of the budget, a run takes about 260 s"
    assert seen == [1, 2, 3, 4, 5, 6]


def test_steps_done_is_the_step_after_which_the_last_validation_ran(tmp_path):
    csv = tmp_path / "csv" / "metrics.csv"
    assert gpu_roc.steps_done(tmp_path) is None
    csv.parent.mkdir()
    # what Lightning wrote for 2 steps validated after each: steps 0 and 1, the test at step 2
    csv.write_text("epoch,step,test/pmr,train/loss,val/pmr\n0,0,,,0.2\n0,1,,,0.0\n1,2,0.0,,\n")
    assert gpu_roc.steps_done(tmp_path) == 2
    csv.write_text("epoch,step,test/pmr,train/loss,val/pmr\n0,9,,1.3,\n")
    assert gpu_roc.steps_done(tmp_path) is None


def test_fit_seconds_run_from_the_data_setup_to_the_test():
    log = ("Seed set to 0\n"
           "[2026-11-28 12:03:17,147][data_modules.adapters.roc][INFO] - ROC splits: {'train': 33}\n"
           "[2026-11-28 12:03:17,164][data_modules.datamodule][INFO] - data: {'train': 33, 'val': 3, 'test': 6}\n"
           "`Trainer.fit` stopped: `max_steps=2` reached.\n"
           "[2026-11-28 12:03:31,483][seqaware.train][INFO] - testing the best checkpoint /x/best_epoch_000.ckpt\n"
           "[2026-11-28 12:03:31,489][data_modules.datamodule][INFO] - data: {'test': 6}\n")
    assert gpu_roc.fit_seconds(log) == pytest.approx(14.319)
    assert gpu_roc.fit_seconds(log.replace("testing the best", "tested the best")) is None


# ---------------------------------------------------------------- the runs' configs
@pytest.mark.parametrize("row, variant, encoding, extra", [
    ("recipe/roc_base", "ours", "joint", "${paths.shared_data_dir}/roc/train_extra.tsv"),
    ("recipe/paper", "paper", "pairwise", "${paths.shared_data_dir}/roc/train_extra.tsv"),
])
def test_each_row_reads_the_unpacked_folder_and_data_and_keeps_its_recipe(compose_train, tmp_path, row, variant,
                                                                           encoding, extra):
    from scripts.studies.berson_heads import budget, rows

    overrides, batch = rows()[row]
    cfg = compose_train("experiment=berson_roc", *overrides, *budget(500, batch, batch, 400), tiny=False,
                        *gpu_roc.run_overrides(row, tmp_path / "mpnet", tmp_path / "data", "gpu", 100.0, []))
    assert cfg.data.batch_size == batch and cfg.trainer.max_epochs == -1     # the steps are the only limit
    assert cfg.model.encoder.name_or_path == cfg.data.tokenizer == str(tmp_path / "mpnet")
    assert list(cfg.data.extra_train_paths) == [extra.replace("${paths.shared_data_dir}", str(tmp_path / "data"))]
    assert cfg.data.train_path == str(tmp_path / "data" / "roc" / "dev.tsv")
    assert (cfg.model.decoder.variant, cfg.model.pair_encoding) == (variant, encoding)
    assert (cfg.trainer.accelerator, cfg.trainer.max_steps, cfg.trainer.min_epochs) == ("gpu", 500, 0)
    assert cfg.trainer.max_time == "00:00:02:00"                     # 1.2 x 100 s
    # the recipes as shipped (RECIPE_EPOCHS mirrors them): 4 epochs of 16 stories, BERSON's 2 epochs of 4
    plain = compose_train("experiment=berson_roc", *overrides, tiny=False)
    assert (plain.trainer.max_epochs, plain.data.batch_size) == (gpu_roc.RECIPE_EPOCHS[row], batch)


# ---------------------------------------------------------------- the whole path
@pytest.mark.slow
def test_the_whole_path_from_parts_to_the_table_on_a_tiny_random_mpnet(tmp_path):
    """Weights packed into parts that arrive in three folders (one per device call), the ROC files packed and
    unpacked, both rows trained and tested on the unpacked folder, the table and the JSON written.  Each run is
    cut by ``trainer.max_time`` after its first step (``--train-seconds 0``): what a GPU slower than the estimate
    gets, a validation at the cut and the test of its checkpoint."""
    from test_weight_parts import tiny_mpnet_folder
    from scripts.maintenance.weight_parts import pack

    manifest = pack(tiny_mpnet_folder(tmp_path / "src"), tmp_path / "parts", max_mib=0.8)
    calls = [tmp_path / f"call{i}" for i in range(3)]
    for call, part in zip(calls, manifest["parts"]):
        call.mkdir()
        (call / part["file"]).write_bytes((tmp_path / "parts" / part["file"]).read_bytes())
    (calls[0] / "manifest.json").write_bytes((tmp_path / "parts" / "manifest.json").read_bytes())
    pack_data(write_roc(tmp_path / "shared" / "roc"), calls[0] / "roc")
    work, report = tmp_path / "work", tmp_path / "report"
    cmd = [sys.executable, "scripts/maintenance/gpu_roc.py", "run", "--parts", *map(str, calls), "--data", str(calls[0] / "roc"),
           "--work", str(work), "--report", str(report), "--trainer", "cpu", "--seeds", "0", "--steps", "2",
           "--train-seconds", "60", "--budget", "900", "--val-stories", "3",
           "--", "data.eval_batch_size=3", "model.beam_size=2", "trainer.num_sanity_val_steps=0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((report / "gpu_roc.json").read_text())
    assert result["plan"]["train_stories"] == 33
    assert result["plan"]["rows"] == {"recipe/roc_base": {"steps": 2, "batch": 16, "recipe_steps": 12},
                                      "recipe/paper": {"steps": 2, "batch": 4, "recipe_steps": 18}}
    assert result["plan"]["max_time"] == "00:00:01:12"
    assert [(r["row"], r["seed"], r["status"], r["steps_done"]) for r in result["runs"]] == [
        ("recipe/roc_base", 0, "tested", 2), ("recipe/paper", 0, "tested", 2)]
    assert all(0 < r["fit_s"] < r["wall_s"] for r in result["runs"])
    for row in ("recipe-roc_base", "recipe-paper"):
        run_dir = work / "runs" / row / "seed0"
        assert not (run_dir / "checkpoints").exists()                     # deleted once tested
        log = (work / "runs" / row / "seed0.log").read_text()
        assert f"'{work / 'mpnet'}' has no SDPA attention" in log          # the unpacked folder, no package
        composed = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
        assert composed["backbones"]["text"] == composed["backbones"]["tokenizer"] == str(work / "mpnet")
        assert composed["paths"]["shared_data_dir"] == str(work / "data")
        assert "ROC splits: {'train': 33, 'val': 3, 'test': 6}" in log      # dev's 21 + train_extra's 12
        assert "testing the best checkpoint" in log
    assert set(result["stats"]) == {"recipe/roc_base", "recipe/paper"}
    table = (report / "gpu_roc.md").read_text()
    assert ("| row | seeds | test PMR | Acc | tau | PMR per seed | PMR - `recipe/roc_base` (seed-matched, 95% CI) "
            "| wall per run (s) | training tokens/s per run |") in table
    assert "| `recipe/roc_base` | 0 | tested | 2 |" in table and "| `recipe/paper` | 0 | tested | 2 |" in table
    assert "==> recipe-paper/seed0.log" in (report / "gpu_roc_logs.txt").read_text()
    assert "GPU_ROC_JSON " in proc.stdout


@pytest.mark.slow
def test_a_run_cut_by_max_time_is_validated_at_the_cut_and_its_checkpoint_tested(compose_train, tmp_path, monkeypatch):
    """A GPU slower than the estimate: ``trainer.max_time`` stops the run inside its first epoch (``min_epochs=0``;
    Lightning's default 1 would train on to the epoch's end), the weights at the cut are validated and that
    checkpoint is tested.  Lightning's Timer reads a clock that advances 1 s per reading: 3 steps in 3 s."""
    import pytorch_lightning.callbacks.timer as timer_module
    from scripts.studies.berson_heads import budget, rows
    from test_weight_parts import tiny_mpnet_folder

    import train

    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(timer_module, "time", type("Clock", (), {"monotonic": staticmethod(lambda: float(next(ticks)))}))
    data = tmp_path / "data"
    write_roc(data / "roc")
    overrides, batch = rows()["recipe/paper"]
    cfg = compose_train("experiment=berson_roc", *overrides, *budget(100, batch, batch, 3),
                        *gpu_roc.run_overrides("recipe/paper", tiny_mpnet_folder(tmp_path / "mpnet"), data, "cpu",
                                               2.5, []),
                        "data.eval_batch_size=3", "model.beam_size=2", "trainer.num_sanity_val_steps=0")
    assert cfg.trainer.max_time == "00:00:00:03"                      # 1.2 x 2.5 s
    metrics = train.run(cfg)
    out = Path(cfg.paths.output_dir)
    assert gpu_roc.steps_done(out) == 3                                # of 2 epochs x 9 batches of 4 stories
    assert json.loads((out / "run.json").read_text())["tested_checkpoint"].endswith(".ckpt")
    assert 0.0 <= metrics["test/pmr"] <= 1.0


@pytest.mark.slow
def test_time_steps_times_a_variant_on_random_weights_from_part_0_and_writes_the_choice(tmp_path):
    """``time-steps`` in the first device call: part 0 and the data only (parts 1 and 2 come later), the
    architecture with random weights, the steps of ``recipe/roc_base`` timed by StepClock, the table, and the
    choice that ``run --step-choice`` reads."""
    from test_weight_parts import tiny_mpnet_folder
    from scripts.maintenance.weight_parts import pack

    manifest = pack(tiny_mpnet_folder(tmp_path / "src"), tmp_path / "parts", max_mib=0.8)
    call = tmp_path / "call0"
    call.mkdir()
    for name in ("manifest.json", manifest["parts"][0]["file"]):
        (call / name).write_bytes((tmp_path / "parts" / name).read_bytes())
    pack_data(write_roc(tmp_path / "shared" / "roc"), call / "roc")
    work, report, choice = tmp_path / "work", tmp_path / "report", tmp_path / "choice.json"
    cmd = [sys.executable, "scripts/maintenance/gpu_roc.py", "time-steps", "--parts", str(call), "--data", str(call / "roc"),
           "--work", str(work), "--report", str(report), "--choice", str(choice), "--trainer", "cpu",
           "--variants", "eager", "--warmup-steps", "1", "--timed-steps", "2", "--", "data.batch_size=4"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((report / "gpu_roc_steps.json").read_text())
    eager = result["variants"]["eager"]
    assert result["choice"] == "eager" and result["recipe_steps"] == 12        # 4 epochs of 33 stories in 16s
    assert eager["status"] == "timed" and eager["steps"] == 2 and eager["warmup_steps"] == 1
    assert eager["s_per_step"] > 0 and eager["recipe_s"] == round(eager["warmup_s"] + 12 * eager["s_per_step"], 1)
    assert json.loads(choice.read_text())["s_per_step"] == eager["s_per_step"]
    composed = yaml.safe_load((work / "steps" / "eager" / ".hydra" / "config.yaml").read_text())
    assert composed["model"]["compile"] is False and composed["data"]["extra_train_paths"] == []
    assert composed["trainer"]["max_steps"] == 3 and composed["test"] is False
    assert (work / "mpnet-random" / "model.safetensors").is_file()              # random weights, part 0's files
    assert "| eager |" in (report / "gpu_roc_steps.md").read_text()
    assert "step clock: 2 steps after 1 warm-up steps" in (report / "gpu_roc_steps_logs.txt").read_text()
