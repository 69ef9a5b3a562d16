"""Progress a user can see: the training bar that redraws by wall time, the VLM generation bar of
run_queries and the release-conversion bar of prepare_dataset."""
from __future__ import annotations

import re
import time

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from seqaware.profiling import machine
from seqaware.progress import TimedProgressBar


# ---------------------------------------------------------------- training bar
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr("seqaware.progress.time.monotonic", fake)
    return fake


def test_redraws_by_batches_or_by_wall_time(clock):
    bar = TimedProgressBar(refresh_rate=10, refresh_seconds=5.0)
    assert bar._should_update(10, 100)          # every refresh_rate batches, as Lightning's bar
    clock.now += 4.9
    assert not bar._should_update(11, 100)      # neither 10 batches nor 5 s since the last redraw
    clock.now += 0.2
    assert bar._should_update(12, 100)          # 5.1 s: redraw although only 2 batches passed
    assert not bar._should_update(13, 100)      # the clock restarts at each redraw
    assert bar._should_update(100, 100)         # the last batch always
    slow_only = TimedProgressBar(refresh_rate=10, refresh_seconds=None)
    clock.now += 1000
    assert not slow_only._should_update(3, 100)
    off = TimedProgressBar(refresh_rate=0, refresh_seconds=0)
    assert not off._should_update(10, 100)
    with pytest.raises(ValueError, match="refresh_seconds"):
        TimedProgressBar(refresh_seconds=-1)


class TinyModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class BarProbe(pl.Callback):
    """Records the count the training bar shows after each batch (runs after the bar)."""

    def __init__(self, bar: TimedProgressBar) -> None:
        self.bar, self.shown = bar, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.shown.append(self.bar.train_progress_bar.n)


@pytest.mark.parametrize("refresh_seconds, expected", [(0.0, [1, 2, 3, 4, 5, 6]), (3600.0, [0, 0, 0, 0, 0, 6])])
def test_training_bar_moves_on_slow_steps(tmp_path, refresh_seconds, expected):
    """refresh_rate 100 (never reached in 6 batches): the bar moves at every batch only by time."""
    bar = TimedProgressBar(refresh_rate=100, refresh_seconds=refresh_seconds)
    probe = BarProbe(bar)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_model_summary=False, callbacks=[bar, probe], default_root_dir=tmp_path)
    trainer.fit(TinyModule(), DataLoader(TensorDataset(torch.randn(12, 2)), batch_size=2))
    assert probe.shown == expected


def test_callbacks_config_uses_the_timed_bar(compose_train):
    from hydra.utils import instantiate

    cfg = compose_train("callbacks.progress_bar.refresh_rate=10")
    bar = instantiate(cfg.callbacks.progress_bar)
    assert isinstance(bar, TimedProgressBar) and bar.refresh_seconds == 5.0 and bar.refresh_rate == 10


# ---------------------------------------------------------------- VLM generation bar
def test_run_queries_bar_counts_generated_prompts(tmp_path, capsys):
    from seqaware.vlm.runner import OutputCache, make_query, run_queries

    queries = [make_query(f"p{i}", "original", [{"role": "user", "content": [{"type": "text", "text": f"q{i}"}]}], "sig")
               for i in range(6)]
    cache = OutputCache(tmp_path / "raw.jsonl")
    cache.append([{"item_id": "p0", "set": "original", "prompt_hash": queries[0].hash, "output": "A"}])
    def slow_generate(batch):  # tqdm draws at most every 0.1 s
        time.sleep(0.15)
        return ["B"] * len(batch)

    replies = run_queries(queries, slow_generate, cache, batch_size=2, progress=True)
    assert replies == ["A"] + ["B"] * 5
    err = capsys.readouterr().err
    shown = [int(m) for m in re.findall(r"generating:.*?\| (\d)/5 ", err)]
    assert shown[-1] == 5 and {2, 4}.issubset(shown), err  # one step per generated batch of 2
    assert "cached=1" in err
    run_queries(queries, lambda batch: ["C"] * len(batch), cache, batch_size=2, progress=False)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- release conversion bar
def test_prepare_dataset_bar_counts_input_records(tmp_path, capsys):
    from test_adapters import RFG_EDGES, RFG_TOKENS, write_rfg

    from data_modules.adapters.prepare import prepare_dataset

    for i in range(3):
        write_rfg(tmp_path / "rfg", f"R{i}", RFG_TOKENS, RFG_EDGES)
    result, _ = prepare_dataset("rfg", tmp_path / "rfg", tmp_path / "out", tasks=["teo"], progress=True)
    err = capsys.readouterr().err
    assert sum(result.records_read.values()) == 3
    assert [int(m) for m in re.findall(r"rfg: reading rfg: (\d+)rec", err)][-1] == 3, err
    assert "building tasks: 100%" in err
    prepare_dataset("rfg", tmp_path / "rfg", tmp_path / "out2", progress=False)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- the CPU run-time forecast
class _TenSecondSteps(pl.LightningModule):
    """Each training step advances the fake clock by 10 s and stops the fit after 6 batches."""

    def __init__(self, clock):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.now += 10.0
        if batch_idx >= 5:
            self.trainer.should_stop = True
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("limit_hours, warned", [(1.0, True), (3.0, False)])
def test_runtime_forecast_warns_once_when_a_cpu_fit_would_take_over_the_limit(monkeypatch, limit_hours, warned, caplog):
    from seqaware.callbacks import RuntimeForecast

    fake = FakeClock()
    monkeypatch.setattr("seqaware.callbacks.time.monotonic", fake)
    forecast = RuntimeForecast(limit_hours=limit_hours, warmup_steps=2, measure_steps=3)
    trainer = pl.Trainer(accelerator="cpu", max_steps=1000, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[forecast])
    loader = DataLoader(TensorDataset(torch.zeros(2000, 2)), batch_size=1)
    with caplog.at_level("WARNING", logger="seqaware.callbacks"):
        trainer.fit(_TenSecondSteps(fake), loader)
    # 3 timed batches of 10 s, 995 batches left after the 5th: 2.76 h
    assert forecast.forecast_hours == pytest.approx(995 * 10 / 3600)
    messages = [r.getMessage() for r in caplog.records if "on course to take" in r.getMessage()]
    assert len(messages) == int(warned)
    if warned:
        assert messages[0] == (
            f"this fit is on course to take 2.8 h on this CPU, {machine()} (995 more training batches at 10.00 s each until "
            "trainer.max_steps ends it, validation not counted; a 3e-06M-parameter model). To shorten it, lower "
            "trainer.max_steps / max_epochs / max_time (or trainer.limit_train_batches), or train on a GPU (trainer=gpu).")
    with pytest.raises(ValueError, match="limit_hours > 0"):
        RuntimeForecast(limit_hours=0)


def _forecast_fit(monkeypatch, module_cls=None, **trainer_kwargs):
    """A CPU fit of 10-s batches (fake clock, Lightning's max_time Timer on the same clock) -> the callback."""
    from seqaware.callbacks import RuntimeForecast

    fake = FakeClock()
    monkeypatch.setattr("seqaware.callbacks.time.monotonic", fake)
    monkeypatch.setattr("pytorch_lightning.callbacks.timer.time.monotonic", fake)
    forecast = RuntimeForecast(limit_hours=1.0, warmup_steps=2, measure_steps=3)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[forecast], **trainer_kwargs)
    loader = DataLoader(TensorDataset(torch.zeros(200, 2)), batch_size=1)
    trainer.fit((module_cls or _TenSecondSteps)(fake), loader)
    return forecast


@pytest.mark.parametrize("trainer_kwargs, hours, stopped_by, batches", [
    ({"max_steps": 1000, "max_time": {"hours": 2}}, (7200 - 50) / 3600, "trainer.max_time", 715),  # max_time first
    ({"max_steps": 1000, "max_time": {"hours": 5}}, 995 * 10 / 3600, "trainer.max_steps", 995),   # max_steps first
    ({"max_epochs": 3, "max_time": {"hours": 5}}, 595 * 10 / 3600, "trainer.max_epochs", 595),    # 3 x 200 batches
    ({"max_epochs": -1, "max_time": {"hours": 2}}, (7200 - 50) / 3600, "trainer.max_time", 715),  # only max_time
], ids=["max_time", "max_steps", "max_epochs", "max_time_alone"])
def test_runtime_forecast_projects_the_run_the_first_bound_ends(monkeypatch, caplog, trainer_kwargs, hours, stopped_by,
                                                                 batches):
    """The projection is the run that will happen: the earliest of max_steps, max_epochs x batches and max_time
    (whose Timer has run 50 s when the forecast is made, after the 5th batch)."""
    with caplog.at_level("WARNING", logger="seqaware.callbacks"):
        forecast = _forecast_fit(monkeypatch, **trainer_kwargs)
    assert forecast.forecast_hours == pytest.approx(hours) and forecast.stopped_by == stopped_by
    [message] = [r.getMessage() for r in caplog.records if "on course to take" in r.getMessage()]
    assert f"({batches:,} more training batches at 10.00 s each until {stopped_by} ends it" in message


@pytest.mark.parametrize("trainer_kwargs, warned", [
    ({"max_steps": 1000, "max_time": {"hours": 2}}, True),   # max_time ends it at batch 5 + 715
    ({"max_steps": 1000, "max_time": {"hours": 5}}, False),  # max_steps is reached
    ({"max_epochs": -1, "max_time": {"hours": 2}}, False),   # no max_steps to miss
], ids=["max_time_first", "max_steps_first", "no_max_steps"])
def test_runtime_forecast_says_when_max_time_ends_the_fit_before_max_steps(monkeypatch, caplog, trainer_kwargs, warned):
    with caplog.at_level("WARNING", logger="seqaware.callbacks"):
        _forecast_fit(monkeypatch, **trainer_kwargs)
    messages = [r.getMessage() for r in caplog.records if "will not be reached" in r.getMessage()]
    assert messages == ([f"trainer.max_steps=1000 will not be reached: at 10.00 s a training batch on {machine()}, "
                         "trainer.max_time ends "
                         "the fit in about 2.0 h, near step 720; raise trainer.max_time or lower trainer.max_steps"]
                        if warned else [])


def test_runtime_forecast_is_silent_for_a_fit_without_any_bound(monkeypatch, caplog):
    with caplog.at_level("WARNING", logger="seqaware.callbacks"):
        forecast = _forecast_fit(monkeypatch, max_epochs=-1)
    assert forecast.forecast_hours is None and forecast.stopped_by is None
    assert not [r for r in caplog.records if "on course to take" in r.getMessage()]


def _with_text_model(hidden: int):
    from transformers import BertConfig, BertModel

    class WithTextModel(_TenSecondSteps):
        def __init__(self, clock):
            super().__init__(clock)
            self.text = BertModel(BertConfig(vocab_size=8, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=8, max_position_embeddings=4))
    return WithTextModel


@pytest.mark.parametrize("hidden, base", [(768, True), (1024, True), (32, False)])
def test_runtime_forecast_names_base_size_encoders_only_when_the_model_has_one(monkeypatch, caplog, hidden, base):
    from seqaware.callbacks import text_model_width

    with caplog.at_level("WARNING", logger="seqaware.callbacks"):
        _forecast_fit(monkeypatch, _with_text_model(hidden), max_steps=1000)
    [message] = [r.getMessage() for r in caplog.records if "on course to take" in r.getMessage()]
    assert ("backbones=base" in message) is base and ("base-size" in message) is base
    if base:
        assert message.endswith(f"Its text model is base-size (hidden size {hidden}); recipes with a base-size encoder "
                                "(backbones=base) are sized for a GPU (trainer=gpu); on the CPU, lower trainer.max_steps / "
                                "max_epochs / max_time or use backbones=offline.")
    else:
        assert message.endswith("or train on a GPU (trainer=gpu).")
    assert text_model_width(_with_text_model(hidden)(FakeClock())) == hidden
    assert text_model_width(_TenSecondSteps(FakeClock())) is None


# ---------------------------------------------------------------- the benchmarks' step clock
def test_step_clock_times_the_steps_after_the_warm_up_and_writes_its_figures(monkeypatch, tmp_path, caplog):
    """StepClock (scripts/maintenance/gpu_roc.py time-steps): 10-s steps on a fake clock, 2 warm-up steps, then 3 timed; a fit
    that ends before the clock stops writes nothing."""
    import json

    from seqaware.callbacks import StepClock

    fake = FakeClock()
    monkeypatch.setattr("seqaware.callbacks.time.perf_counter", fake)

    def fit(clock: StepClock) -> None:       # _TenSecondSteps stops after 6 batches
        trainer = pl.Trainer(accelerator="cpu", max_steps=1000, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
        trainer.fit(_TenSecondSteps(fake), DataLoader(TensorDataset(torch.zeros(20, 2)), batch_size=1))

    clock = StepClock(str(tmp_path / "clock.json"), warmup_steps=2, steps=3)
    with caplog.at_level("INFO", logger="seqaware.callbacks"):
        fit(clock)
    figures = {"warmup_steps": 2, "warmup_s": 20.0, "steps": 3, "seconds": 30.0, "s_per_step": 10.0}
    assert clock.figures == figures and json.loads((tmp_path / "clock.json").read_text()) == figures
    assert "step clock: 3 steps after 2 warm-up steps (20.0 s): 10.0000 s a step" in caplog.text
    short = StepClock(str(tmp_path / "short.json"), warmup_steps=4, steps=3)
    fit(short)
    assert short.figures is None and not (tmp_path / "short.json").exists()
    with pytest.raises(ValueError, match=r"^StepClock needs warmup_steps >= 0 and steps >= 1, got 2 and 0$"):
        StepClock(str(tmp_path / "x.json"), warmup_steps=2, steps=0)


class _TimedValidation(_TenSecondSteps):
    """_TenSecondSteps with a validation whose batches take 3 s each on the fake clock."""

    def validation_step(self, batch, batch_idx):
        self.clock.now += 3.0


def test_step_clock_times_the_first_validation_after_the_timed_steps(monkeypatch, tmp_path):
    """The validation after step 5 (2 warm-up + 3 timed steps; val_check_interval 5): 4 batches of 3 s, in the figures
    and the file (scripts/studies/roc_table.py forecasts evaluations at this pace); the sanity check is not timed."""
    import json

    from seqaware.callbacks import StepClock

    fake = FakeClock()
    monkeypatch.setattr("seqaware.callbacks.time.perf_counter", fake)
    clock = StepClock(str(tmp_path / "clock.json"), warmup_steps=2, steps=3)
    trainer = pl.Trainer(accelerator="cpu", max_steps=1000, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[clock],
                         val_check_interval=5, limit_val_batches=4, num_sanity_val_steps=2)
    data = DataLoader(TensorDataset(torch.zeros(20, 2)), batch_size=1)
    trainer.fit(_TimedValidation(fake), data, DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=1))
    figures = {"warmup_steps": 2, "warmup_s": 20.0, "steps": 3, "seconds": 30.0, "s_per_step": 10.0,
               "val_batches": 4, "val_s": 12.0}
    assert clock.figures == figures and json.loads((tmp_path / "clock.json").read_text()) == figures
