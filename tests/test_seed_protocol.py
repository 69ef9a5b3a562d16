"""Comparing arms over seeds: the 95% interval of the seed-matched gap (a hand case), and N / Y fine-tunings of one
seed starting from the same draw of every layer neither pretrained."""
from __future__ import annotations

import math

import pytest
import torch

import train
from conftest import TINY_BERT
from seqaware.metrics.seeds import interval95, mean_std, seed_matched_gap, std_interval95

TINY_BERT_CFG = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                 "intermediate_size": 64, "vocab_size": 30522, "max_position_embeddings": 128}


def test_the_gap_interval_is_students_t_over_the_matched_seeds():
    # d = 1, 2, 3 (seed 4 has no N): mean 2, sd 1, t(0.975, 2) = 4.302653 -> 2 +- 4.302653 / sqrt(3) = 2 +- 2.484138
    gap = seed_matched_gap({1: 11.0, 2: 12.0, 3: 13.0, 4: 99.0}, {1: 10.0, 2: 10.0, 3: 10.0})
    assert (gap.mean, gap.std, gap.n, gap.wins) == (2.0, 1.0, 3, 3)
    assert gap.low == pytest.approx(2 - 2.484138, abs=1e-6) and gap.high == pytest.approx(2 + 2.484138, abs=1e-6)
    assert gap.text() == "+2.00 ± 1.00 (95% CI [-0.48, +4.48]; Y > N on 3 of 3 seeds)"
    # five seeds, two where Y < N and one tie: t(0.975, 4) = 2.776445
    gap = seed_matched_gap({s: v for s, v in enumerate([5.0, -1.0, 0.0, 4.0, -3.0])}, {s: 0.0 for s in range(5)})
    mean, std = mean_std([5.0, -1.0, 0.0, 4.0, -3.0])
    assert (gap.mean, gap.wins) == (1.0, 2) and std == pytest.approx(math.sqrt(46.0 / 4))
    assert gap.high - gap.mean == pytest.approx(2.776445 * std / math.sqrt(5), abs=1e-6)
    one = seed_matched_gap({1: 3.0}, {1: 1.0})
    assert math.isnan(one.low) and one.text() == "+2.00 ± 0.00 (one seed, no interval; Y > N on 1 of 1 seeds)"
    assert all(math.isnan(v) for v in interval95([1.0]))
    with pytest.raises(ValueError, match=r"no seed in common: Y has \[1\], N has \[2\]"):
        seed_matched_gap({1: 1.0}, {2: 1.0})


def test_the_std_interval_is_chi_square_with_n_minus_1_degrees_of_freedom():
    # 5 values of sample std 1: chi2(0.975, 4) = 11.143287, chi2(0.025, 4) = 0.484419 (tables of the chi-square
    # quantiles) -> [sqrt(4 / 11.143287), sqrt(4 / 0.484419)] = [0.59913, 2.87356]
    values = [-1.0, -0.5, 0.0, 0.5, 1.0]
    scale = 1.0 / mean_std(values)[1]
    low, high = std_interval95([v * scale for v in values])
    assert (low, high) == (pytest.approx(0.59913, abs=1e-5), pytest.approx(2.87356, abs=1e-5))
    # 15 values: chi2(0.975, 14) = 26.118948, chi2(0.025, 14) = 5.628726
    low, high = std_interval95([float(v) for v in range(15)])
    std = mean_std([float(v) for v in range(15)])[1]
    assert low == pytest.approx(std * math.sqrt(14 / 26.118948), rel=1e-5)
    assert high == pytest.approx(std * math.sqrt(14 / 5.628726), rel=1e-5)
    assert all(math.isnan(v) for v in std_interval95([3.0]))


def _build(compose_train, *extra: str):
    cfg = compose_train("experiment=berson_finetune", f"model.encoder.config={TINY_BERT}", "model.pair_encoding=joint",
                        "data.collator.image_size=64", "seed=3", *extra)
    _, model, _ = train.build(cfg)
    return model


@pytest.mark.slow  # three BERSON modules built: about 10 s
def test_n_and_y_of_one_seed_start_from_the_same_draw_of_every_layer_neither_pretrained(compose_train, tmp_path):
    n = _build(compose_train)
    # a "pretrained" encoder: every tensor of N's start moved, new layers included
    pretrained = {k: v + 0.5 if v.dtype.is_floating_point else v for k, v in n.encoder.state_dict().items()}
    torch.save(pretrained, tmp_path / "encoder.pt")
    y = _build(compose_train, f"model.encoder.ckpt={tmp_path / 'encoder.pt'}")
    fresh = [name for name in n.state_dict() if not name.startswith("encoder.")]
    assert any(name.startswith("decoder.") for name in fresh) and any(name.startswith("pair_states.") for name in fresh)
    for name in fresh:   # the BERSON network and the pair module: one draw for both arms
        torch.testing.assert_close(y.state_dict()[name], n.state_dict()[name], rtol=0, atol=0, msg=name)
    # the encoder: its towers from encoder.pt; the layers it adds, which berson_finetune draws itself
    # (model.encoder.ckpt_new_layers=fresh), are N's draw, like the layers neither pretrained
    added = ("step_embedding.", "visual_proj.", "visual_norm.")
    assert any(name.startswith(added) for name in pretrained) and any(not name.startswith(added) for name in pretrained)
    for name, value in y.encoder.state_dict().items():
        expected = n.encoder.state_dict()[name] if name.startswith(added) else pretrained[name]
        torch.testing.assert_close(value, expected, rtol=0, atol=0, msg=name)
    # and another seed draws the fresh layers anew
    other = _build(compose_train, "seed=4")
    drawn = [name for name in fresh if n.state_dict()[name].float().std() > 0]
    assert drawn and not any(torch.equal(other.state_dict()[name], n.state_dict()[name]) for name in drawn)


@pytest.mark.parametrize("which", ["fresh", ["step_embedding"], "order"])
def test_ckpt_new_layers_fresh_keeps_this_runs_draw_of_the_layers_the_encoder_adds(tmp_path, which):
    from seqaware.encoders import create_encoder, new_layer_keys

    def build(**kw):
        torch.manual_seed(0)
        return create_encoder("clipvil", name_or_path="offline:minilm", config=TINY_BERT_CFG, visual=None,
                              visual_feature_dim=8, **kw)
    plain = build()
    pretrained = {k: v + 0.5 if v.dtype.is_floating_point else v for k, v in plain.state_dict().items()}
    torch.save(pretrained, tmp_path / "encoder.pt")
    loaded = build(ckpt=str(tmp_path / "encoder.pt"), ckpt_new_layers=which)
    fresh = set(new_layer_keys(plain, which))
    assert fresh and all(k.startswith(("visual_proj", "visual_norm", "step_embedding")) for k in fresh)
    if which != "fresh":
        assert {k.split(".")[0] for k in fresh} == {"step_embedding"}
    for key, value in loaded.state_dict().items():   # fresh: the draw of a run without ckpt; the rest: ckpt's
        expected = plain.state_dict()[key] if key in fresh else pretrained[key]
        torch.testing.assert_close(value, expected, rtol=0, atol=0, msg=key)
    with pytest.raises(ValueError, match=r"ckpt_new_layers names \['bogus'\], not layers this encoder adds: "
                                         r"\['step_embedding', 'visual_norm', 'visual_proj'\]"):
        build(ckpt=str(tmp_path / "encoder.pt"), ckpt_new_layers=["bogus"])
    with pytest.raises(ValueError, match="must be keep, fresh, order or a list"):
        build(ckpt=str(tmp_path / "encoder.pt"), ckpt_new_layers="all")
