"""The gradient noise scale (McCandlish et al. 2018; seqaware/noise_scale.py) and the study that measures a run's."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, TINY_BERT, TINY_SYNTHETIC, tiny_overrides
from seqaware.noise_scale import epoch_factor, run_epoch_factor, simple_noise_scale, unbiased_terms


def test_the_expected_squared_norms_give_back_the_true_gradient_and_trace_exactly():
    """E|G_B|^2 = |G|^2 + tr(Sigma) / B (their appendix A.1): from the expectations the estimates are exact."""
    g2, trace = 2.5, 40.0
    assert unbiased_terms(g2 + trace / 16, g2 + trace / 128, 16, 128) == pytest.approx((g2, trace), rel=1e-12)
    assert simple_noise_scale([(g2, trace)] * 4).b_simple == pytest.approx(16.0)
    with pytest.raises(ValueError, match="b_small < b_big"):
        unbiased_terms(1.0, 1.0, 16, 16)
    with pytest.raises(ValueError, match="at least 2"):
        simple_noise_scale([(g2, trace)])


def test_sampled_gradients_recover_a_known_noise_scale_inside_the_bootstrap_interval():
    """Per-instance gradients G + z, z ~ N(0, diag(s^2)): B_simple = sum(s^2) / |G|^2 = 64, recovered from small
    and big batches' squared norms as the study computes them (the big gradient the mean of the small ones)."""
    gen = torch.Generator().manual_seed(0)
    dim, small, per_big = 400, 16, 8
    true = torch.full((dim,), 0.05)                       # |G|^2 = 1.0
    sigma = torch.full((dim,), math.sqrt(64.0 / dim))     # tr(Sigma) = 64
    terms = []
    for _ in range(200):
        grads = [(true + sigma * torch.randn(small, dim, generator=gen)).mean(0) for _ in range(per_big)]
        small_sq = float(torch.stack([g.square().sum() for g in grads]).mean())
        big_sq = float(torch.stack(grads).mean(0).square().sum())
        terms.append(unbiased_terms(small_sq, big_sq, small, small * per_big))
    scale = simple_noise_scale(terms)
    assert scale.b_simple == pytest.approx(64.0, rel=0.12)
    assert scale.g2 == pytest.approx(1.0, rel=0.12) and scale.trace == pytest.approx(64.0, rel=0.05)
    assert scale.low < 64.0 < scale.high and scale.low < scale.b_simple < scale.high and scale.batches == 200


def test_the_epoch_factor_is_their_section_2_3_tradeoff():
    """E(B) = E_min (1 + B / B_noise): a batch 9x the noise scale needs 10/2 = 5x the epochs of one at it, a batch
    far under it none more, and the same batch exactly its own."""
    assert epoch_factor(144, 16, 16) == pytest.approx(5.0)
    assert epoch_factor(141, 16, 1e9) == pytest.approx(1.0, abs=1e-6)
    assert epoch_factor(16, 16, 37.0) == 1.0
    with pytest.raises(ValueError, match="positive"):
        epoch_factor(16, 16, 0.0)


def test_a_run_s_epoch_factor_weights_each_stretch_by_its_share_of_the_data():
    """The trapezoid rule over evenly spaced points: a constant noise scale gives its own factor, and a run whose
    noise scale is 16 for its first quarter, huge from its middle on, pays 5x on the first quarter, 3x on average
    on the second (the trapezoid between 5 and 1) and 1x on the second half: 2.5x in all."""
    assert run_epoch_factor(144, 16, [16.0, 16.0, 16.0]) == pytest.approx(5.0)
    assert run_epoch_factor(144, 16, [16.0, 16.0, 1e12, 1e12, 1e12]) == pytest.approx((5 + 3 + 1 + 1) / 4)
    assert run_epoch_factor(144, 16, [16.0, 1e12]) == pytest.approx(3.0)
    assert run_epoch_factor(144, 16, [16.0, 16.0, 1e12], steps=[0, 25, 100]) == pytest.approx((5 + 3 * 3) / 4)
    with pytest.raises(ValueError, match="2 or more"):
        run_epoch_factor(144, 16, [16.0])
    with pytest.raises(ValueError, match="must rise"):
        run_epoch_factor(144, 16, [16.0, 20.0], steps=[5, 5])


@pytest.mark.slow  # a 2-step tiny BERSON fit, then the study at init and at its last checkpoint: about 20 s
def test_the_study_measures_a_run_folder_at_init_and_at_its_last_checkpoint(compose_train, tmp_path, cache_dir):
    import train

    run = tmp_path / "run"
    overrides = [*tiny_overrides(run, cache_dir), *(f"data.source.{k}={v}" for k, v in TINY_SYNTHETIC.items()),
                 "experiment=berson_finetune", "modality=text", "model.pair_encoding=joint",
                 f"model.encoder.config={TINY_BERT}", "model.beam_size=2", "data.batch_size=2",
                 "trainer.max_steps=2", "trainer.max_epochs=1", "trainer.limit_val_batches=1",
                 "trainer.val_check_interval=null", "trainer.check_val_every_n_epoch=1"]
    train.run(compose_train(*overrides))
    (run / ".hydra").mkdir(exist_ok=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- '{o}'\n" for o in overrides))
    done = subprocess.run([sys.executable, str(ROOT / "scripts/studies/noise_scale.py"), "--run", str(run),
                           "--at", "init", "last", "--small", "2", "--big", "4", "--batches", "4",
                           "--compare", "8"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads((run / "noise_scale.json").read_text())
    records = written["records"]
    assert [(r["at"], r["step"]) for r in records] == [("init", 0), ("last", 2)]
    for record in records:
        assert record["big_batches"] == 4 and (record["small"], record["big"]) == (2, 4)
        assert math.isfinite(record["g2"]) and record["trace"] > 0
        if record["b_simple"] > 0:
            assert record["epoch_factor"]["8.0"] == pytest.approx(epoch_factor(8, 2, record["b_simple"]))
    if all(r["b_simple"] > 0 for r in records):        # the whole run's factor, stretch by stretch
        assert written["run_epoch_factor"]["8.0"] == pytest.approx(
            run_epoch_factor(8, 2, [r["b_simple"] for r in records], [0, 2]))
    assert records[0]["g2"] != records[1]["g2"]          # the checkpoint's weights, not the initial ones
    assert "init (step 0): B_simple" in done.stdout and "batch 8.0: x" in done.stdout
    missing = subprocess.run([sys.executable, str(ROOT / "scripts/studies/noise_scale.py"), "--run", str(tmp_path)],
                             capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode != 0 and "no .hydra/overrides.yaml" in missing.stderr
