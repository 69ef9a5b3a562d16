"""scripts/studies/encoder_drift.py: how far pretraining moved each part of an encoder."""
from __future__ import annotations

import pytest
import torch

from scripts.studies import encoder_drift as drift


def test_parts_are_named_by_embedding_layer_and_tower():
    assert drift.part_of("backbone.embeddings.word_embeddings.weight") == "embeddings.word_embeddings"
    assert drift.part_of("backbone.embeddings.LayerNorm.bias") == "embeddings.LayerNorm"
    assert drift.part_of("backbone.encoder.layer.3.attention.self.query.weight") == "layer 3"
    assert drift.part_of("visual.backbone.conv_stem.weight") == "visual"
    assert drift.part_of("backbone.pooler.dense.weight") == "other"


def test_relative_change_is_the_norm_of_the_difference_over_the_part():
    raw = {"backbone.encoder.layer.0.a": torch.tensor([3.0, 4.0]), "backbone.encoder.layer.0.b": torch.tensor([0.0]),
           "backbone.embeddings.word_embeddings.weight": torch.ones(2, 2), "ids": torch.tensor([1, 2])}
    trained = {"backbone.encoder.layer.0.a": torch.tensor([3.0, 4.0]), "backbone.encoder.layer.0.b": torch.tensor([1.0]),
               "backbone.embeddings.word_embeddings.weight": 2 * torch.ones(2, 2), "ids": torch.tensor([5, 6])}
    got = drift.relative_drift(raw, trained)
    assert got == {"layer 0": pytest.approx(1 / 5), "embeddings.word_embeddings": pytest.approx(1.0)}


def test_a_folder_without_encoder_pt_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path}: no encoder.pt"):
        drift.main([str(tmp_path)])
