"""Encoders: registry, single-stream fusion, visual backbones, regions, checkpoints, configs."""
from __future__ import annotations

import importlib.util
import logging
import re
import socket
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from seqaware.encoders import ENCODERS, create_encoder, fusion_input, list_encoders, load_encoder_checkpoint
from seqaware.encoders.regions import BoxRegionFeatures, RegionFeatureCache, box_geometry
from seqaware.encoders.visual import VISUAL_BACKBONES, create_visual_backbone, lukemelas_to_timm_lite
from seqaware.pretrained import PretrainedUnavailableError

ROOT = Path(__file__).resolve().parents[1]

TINY_BERT = dict(model_type="bert", vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
TINY_VIT = dict(name="clip_vit_b32", vision_cfg=dict(width=64, layers=1, head_width=32, image_size=64, patch_size=16))
TINY_CNN = dict(name="efficientnet_lite0", pretrained=False)
# per registered encoder: the tiny config used by the parametrised tests
TINY_ENCODERS = {
    "text": dict(config=TINY_BERT, tokenizer="offline:minilm"),
    "clipvil": dict(config=TINY_BERT, tokenizer="offline:minilm", visual=TINY_VIT),
    "visualbert": dict(config=TINY_BERT, tokenizer="offline:minilm", visual=TINY_CNN),
    "image": dict(config=TINY_BERT, tokenizer="offline:minilm", visual=TINY_VIT),
}
IMAGE = 64


def fake_batch(B: int = 2, S: int = 3, L: int = 7, R: int = 4, seed: int = 0) -> dict:
    """A collated batch as data_modules.collate produces it (BERT ids, boxes, masks)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (B, S, L), generator=g)
    ids[:, :, 0] = 101
    attn = torch.ones(B, S, L, dtype=torch.long)
    attn[0, 1, 4:] = 0                       # a shorter step
    ids[0, 1, 3] = 102
    ids[:, :, -1] = 102
    ids = ids * attn
    lo = torch.rand(B, S, R, 2, generator=g) * 0.5
    hi = lo + 0.2 + torch.rand(B, S, R, 2, generator=g) * 0.3
    return {
        "input_ids": ids, "attention_mask": attn,
        "step_mask": torch.tensor([[True, True, True], [True, True, False]])[:B, :S],
        "pixel_values": torch.randn(B, S, 3, IMAGE, IMAGE, generator=g),
        "image_mask": torch.tensor([[True, False, True], [True, True, True]])[:B, :S],
        "boxes": torch.cat([lo, hi], dim=-1).clamp(0, 1)[..., [0, 1, 2, 3]],
        "box_mask": torch.tensor([True, True, False, True]).expand(B, S, R).clone(),
    }


@pytest.fixture(scope="module")
def tiny_encoders() -> dict:
    torch.manual_seed(0)
    return {name: create_encoder(name, **cfg).eval() for name, cfg in TINY_ENCODERS.items()}


def test_registry_has_every_encoder_and_rejects_unknown_names():
    assert {"text", "clipvil", "visualbert", "image"} <= set(list_encoders())
    assert {"clip_vit_b32", "resnet50", "efficientnet_lite0"} <= set(VISUAL_BACKBONES)
    with pytest.raises(ValueError) as err:
        create_encoder("clip")
    assert str(err.value) == f"unknown encoder 'clip' (model.encoder.name); registered: {', '.join(list_encoders())}"
    with pytest.raises(ValueError) as err:
        create_visual_backbone("vit")
    assert str(err.value) == ("unknown visual backbone 'vit' (backbones.visual.name); registered: "
                              + ", ".join(sorted(VISUAL_BACKBONES)))


def test_the_encoders_docstring_lists_registered_encoders_only():
    import seqaware.encoders

    listed = re.findall(r"^``(\w+)``\s{2,}", seqaware.encoders.__doc__, flags=re.M)
    assert {"text", "clipvil", "visualbert", "image"} <= set(listed) <= set(ENCODERS)


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_forward_backward_shapes_and_masks(name, tiny_encoders):
    enc = tiny_encoders[name]
    batch = fake_batch()
    fi = fusion_input(enc, batch)
    out = enc(fi)
    B, S = batch["step_mask"].shape
    H = enc.hidden_size
    assert out.cls.shape == (B, H)
    assert enc.backbone.config._attn_implementation == "sdpa"
    if enc.uses_text:
        assert out.text_states.shape == (B, fi["input_ids"].shape[1], H)
        assert enc.vocab_size == 30522 and enc.mask_token_id == 103 and enc.cls_token_id == 101
        assert enc.word_embeddings.weight.shape == (30522, H)
    else:
        assert out.text_states is None and "input_ids" not in fi
    if enc.uses_images:
        P = fi["visual_feats"].shape[2]
        expected_p = {"clipvil": 1 + (IMAGE // 16) ** 2, "image": 1 + (IMAGE // 16) ** 2, "visualbert": 1 + 4}[name]
        assert P == expected_p
        assert out.patch_states.shape == out.projected_visual.shape == (B, S, P, H)
    else:
        assert out.patch_states is None and out.projected_visual is None
    assert torch.isfinite(out.cls).all()

    # masked tokens (padding text, steps without an image, padded regions) change nothing
    fi2 = {k: v.clone() for k, v in fi.items()}
    if enc.uses_images:
        hidden = ~fi["visual_mask"]
        if "patch_mask" in fi:
            hidden = hidden[:, :, None] | ~fi["patch_mask"]
            fi2["visual_feats"][hidden] = torch.randn_like(fi2["visual_feats"][hidden]) * 5
        else:
            fi2["visual_feats"][hidden] = torch.randn_like(fi2["visual_feats"][hidden]) * 5
    if enc.uses_text:
        pad = fi["attention_mask"] == 0
        fi2["input_ids"][pad] = 2000
    out2 = enc(fi2)
    torch.testing.assert_close(out2.cls, out.cls)
    if enc.uses_text:
        real = fi["attention_mask"].bool()
        torch.testing.assert_close(out2.text_states[real], out.text_states[real])

    # gradients reach the transformer and (when trainable) the visual side
    enc.train()
    loss = enc(fusion_input(enc, batch)).cls.pow(2).sum()
    loss.backward()
    enc.eval()
    # every trainable parameter takes part (DDP without find_unused_parameters)
    unused = [n for n, p in enc.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, unused
    assert enc.word_embeddings.weight.grad is not None or not enc.uses_text
    if enc.uses_images:
        assert enc.visual_proj.weight.grad.abs().sum() > 0
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.visual.parameters())
    enc.zero_grad(set_to_none=True)


def test_step_embedding_flag_and_token_types(tiny_encoders):
    torch.manual_seed(0)
    on = create_encoder("clipvil", step_embedding=True, **TINY_ENCODERS["clipvil"]).eval()
    off = create_encoder("clipvil", step_embedding=False, **TINY_ENCODERS["clipvil"]).eval()
    assert on.step_embedding is not None and off.step_embedding is None
    with pytest.raises(ValueError, match="no step embedding"):
        create_encoder("text", step_embedding=True, **TINY_ENCODERS["text"])
    off.load_state_dict({k: v for k, v in on.state_dict().items() if not k.startswith("step_embedding")})
    fi = fusion_input(on, fake_batch())
    with torch.no_grad():
        on.step_embedding.weight.zero_()
    torch.testing.assert_close(on(fi).cls, off(fi).cls)     # zero step vectors == no step embedding
    with torch.no_grad():
        on.step_embedding.weight.normal_()
    assert not torch.allclose(on(fi).cls, off(fi).cls)
    # the image tokens use token type 1: changing its row changes the output, text-only encoders ignore it
    enc = tiny_encoders["clipvil"]
    before = enc(fi).cls
    tt = enc.backbone.embeddings.token_type_embeddings.weight
    saved = tt.detach().clone()
    with torch.no_grad():
        tt[1] += torch.randn(tt.shape[1])  # a constant shift would vanish in the LayerNorm
    assert not torch.allclose(enc(fi).cls, before)
    with torch.no_grad():
        tt.copy_(saved)


def test_without_step_embedding_sequence_positions_order_the_images():
    """wu2022 (no step embedding): with per-image positions two swapped images give the same CLS (ISP
    would be impossible); with positions running over the images they do not."""
    torch.manual_seed(0)
    kwargs = dict(TINY_ENCODERS["clipvil"], step_embedding=False)
    per_image = create_encoder("clipvil", visual_positions="image", **kwargs).eval()
    sequence = create_encoder("clipvil", visual_positions="sequence", **kwargs).eval()
    sequence.load_state_dict(per_image.state_dict())
    batch = fake_batch(B=1)
    batch["input_ids"][:] = 0  # no text: only the images' order can tell the two inputs apart
    batch["attention_mask"][:] = 0
    batch["image_mask"][:] = True
    swapped = dict(batch, pixel_values=batch["pixel_values"][:, [2, 1, 0]])
    with torch.no_grad():
        same = [per_image(fusion_input(per_image, b)).cls for b in (batch, swapped)]
        diff = [sequence(fusion_input(sequence, b)).cls for b in (batch, swapped)]
    torch.testing.assert_close(same[0], same[1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(diff[0], diff[1], atol=1e-4)
    with pytest.raises(ValueError, match="visual_positions"):
        create_encoder("clipvil", visual_positions="steps", **kwargs)


def test_visual_tokens_start_at_the_scale_of_the_word_embeddings():
    """visual_scale=text: a projected visual token has the mean norm of a word embedding (a plain
    LayerNorm gives sqrt(H), which drowns the position / token-type / step embeddings added to it)."""
    torch.manual_seed(0)
    feats = torch.randn(2, 3, 5, 64) * 3
    enc = create_encoder("clipvil", **TINY_ENCODERS["clipvil"])
    words = enc.word_embeddings.weight.detach().norm(dim=1).mean()
    torch.testing.assert_close(enc.project_visual(feats).detach().norm(dim=-1), words.expand(2, 3, 5), rtol=1e-4, atol=0)
    assert words < 0.2 * enc.hidden_size ** 0.5  # the rescaling is not a no-op for a BERT-initialised model
    plain = create_encoder("clipvil", visual_scale=1.0, **TINY_ENCODERS["clipvil"])
    torch.testing.assert_close(plain.project_visual(feats).detach().norm(dim=-1),
                               torch.full((2, 3, 5), enc.hidden_size ** 0.5), rtol=1e-4, atol=0)
    for bad in ("word", 0.0, -1.0):
        with pytest.raises(ValueError, match="visual_scale"):
            create_encoder("clipvil", visual_scale=bad, **TINY_ENCODERS["clipvil"])


def test_step_embedding_init_std(compose_train):
    """step_init_std sets the step embedding's initial spread (default: the text model's
    initializer_range); every encoder config with visual tokens exposes the key."""
    torch.manual_seed(0)
    default = create_encoder("clipvil", **TINY_ENCODERS["clipvil"])
    wide = create_encoder("clipvil", step_init_std=0.1, **TINY_ENCODERS["clipvil"])
    init_range = default.backbone.config.initializer_range
    assert abs(float(default.step_embedding.weight.detach().std()) - init_range) < 0.15 * init_range
    assert abs(float(wide.step_embedding.weight.detach().std()) - 0.1) < 0.015
    for bad in (0.0, -0.1):
        with pytest.raises(ValueError, match="step_init_std"):
            create_encoder("clipvil", step_init_std=bad, **TINY_ENCODERS["clipvil"])
    for name in ("clipvil", "image", "visualbert", "visualbert_detector"):
        cfg = compose_train("experiment=berson_finetune", f"encoder@model.encoder={name}").model.encoder
        assert cfg.name == ("image" if name == "image" else name.split("_")[0]), name
        assert "step_init_std" in cfg and cfg.step_init_std is None, name


def test_image_only_encoder_starts_with_cls_from_the_text_model(tiny_encoders):
    enc = tiny_encoders["image"]
    torch.testing.assert_close(enc.cls_embedding.detach(), enc.word_embeddings.weight[enc.cls_token_id].detach())
    batch = fake_batch()
    batch.pop("input_ids")
    out = enc(fusion_input(enc, batch))
    assert out.cls.shape == (2, enc.hidden_size)


def test_roberta_gets_two_token_types_and_offset_positions(tmp_path):
    cfg = dict(model_type="roberta", vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1)
    enc = create_encoder("clipvil", config=cfg, tokenizer="offline:minilm", visual=TINY_VIT).eval()
    tt = enc.backbone.embeddings.token_type_embeddings
    assert tt.num_embeddings == 2 and enc.backbone.config.type_vocab_size == 2
    torch.testing.assert_close(tt.weight[0], tt.weight[1])
    assert enc.position_offset == 2
    out = enc(fusion_input(enc, fake_batch()))
    assert torch.isfinite(out.cls).all()
    # too many text tokens for the position table: a clear error
    long = fake_batch(B=1, L=100)                       # 1 + 3 steps x ~99 tokens > 130 positions
    with pytest.raises(ValueError, match="exceed the text model's 130 positions"):
        enc(fusion_input(enc, long))


TINY_MPNET_CFG = dict(model_type="mpnet", vocab_size=30527, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=514, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)


def test_mpnet_text_encoder_takes_no_token_types_and_falls_back_to_eager_attention(caplog):
    """MPNet has no token-type embeddings and no SDPA kernel in transformers 5.23: the default sdpa config
    builds it with eager attention (said in the log), and token types the data carries are not passed on."""
    from seqaware.encoders.text import TextEncoder

    with caplog.at_level(logging.INFO, logger="seqaware.encoders.text"):
        enc = TextEncoder(config=TINY_MPNET_CFG, tokenizer="offline:minilm").eval()
    assert "using eager attention" in caplog.text and enc.backbone.config._attn_implementation == "eager"
    assert enc.type_vocab_size == 0
    ids = torch.tensor([[101, 2000, 2001, 102, 2003, 102]])
    fusion = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    plain = enc(fusion).text_states
    typed = enc({**fusion, "token_type_ids": torch.tensor([[0, 0, 0, 0, 1, 1]])}).text_states
    torch.testing.assert_close(plain, typed)
    torch.testing.assert_close(plain, enc.backbone(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state)


def test_mpnet_single_stream_encoder_marks_image_tokens_with_its_own_type_table():
    """Without token types in the model, the single-stream encoder adds a 2-row table to the input embeddings:
    the text row is zero (text tokens enter as the pretrained model embeds them), the image row is learned."""
    enc = create_encoder("clipvil", config=TINY_MPNET_CFG, tokenizer="offline:minilm", visual=TINY_VIT).eval()
    assert enc.type_embedding is not None and enc.position_offset == 2       # MPNet's padding index is 1
    assert torch.count_nonzero(enc.type_embedding.weight[0]) == 0 and torch.count_nonzero(enc.type_embedding.weight[1]) > 0
    assert any(p is enc.type_embedding.weight for p in enc.new_parameters())
    batch = fake_batch()
    out = enc(fusion_input(enc, batch))
    assert torch.isfinite(out.cls).all() and out.patch_states is not None
    with torch.no_grad():  # the image row reaches exactly the visual tokens
        enc.type_embedding.weight[1].add_(1.0)
    moved = enc(fusion_input(enc, batch))
    assert not torch.allclose(moved.patch_states, out.patch_states)
    # the text-only ablation: the same text states as the model's own embedding of the packed ids
    text = create_encoder("text", config=TINY_MPNET_CFG, tokenizer="offline:minilm").eval()
    ablation = create_encoder("clipvil", modality="text", step_embedding=False, config=TINY_MPNET_CFG,
                              tokenizer="offline:minilm", visual=None).eval()
    ablation.backbone.load_state_dict(text.backbone.state_dict())
    fusion = fusion_input(text, batch)
    torch.testing.assert_close(ablation(fusion).text_states, text(fusion).text_states, atol=1e-5, rtol=1e-5)


def test_region_pooling_counts_regions_matches_cell_means_and_respects_box_mask():
    torch.manual_seed(0)
    grid = torch.randn(2, 5, 4, 4)
    boxes = torch.tensor([[[0.0, 0.0, 0.5, 0.5], [0.5, 0.25, 1.0, 0.75], [0.25, 0.25, 0.75, 1.0]]]).expand(2, 3, 4)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    pool = BoxRegionFeatures(output_size=2, sampling_ratio=1, aligned=True)
    feats, geom, m = pool(grid, boxes, mask)
    assert feats.shape == (2, 4, 5) and geom.shape == (2, 4, 7) and m.shape == (2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, False, False]]
    torch.testing.assert_close(feats[:, 0], grid.mean(dim=(2, 3)))                     # whole image
    torch.testing.assert_close(feats[:, 1], grid[:, :, 0:2, 0:2].mean(dim=(2, 3)))     # cells x0-1, y0-1
    torch.testing.assert_close(feats[0, 2], grid[0, :, 1:3, 2:4].mean(dim=(1, 2)))      # cells x2-3, y1-2
    assert (feats[~m] == 0).all() and (geom[~m] == 0).all()
    torch.testing.assert_close(geom[0, 0], torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    torch.testing.assert_close(geom[0, 2], torch.tensor([0.5, 0.25, 1.0, 0.75, 0.5, 0.5, 0.25]))
    torch.testing.assert_close(box_geometry(boxes)[..., 6], (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1]))


def test_visualbert_needs_boxes_and_ignores_masked_boxes(tiny_encoders):
    enc = tiny_encoders["visualbert"]
    batch = fake_batch()
    no_boxes = {k: v for k, v in batch.items() if k not in ("boxes", "box_mask")}
    with pytest.raises(ValueError, match="max_boxes"):
        fusion_input(enc, no_boxes)
    out = enc(fusion_input(enc, batch))
    moved = {k: v.clone() for k, v in batch.items()}
    moved["boxes"][:, :, 2] = torch.tensor([0.1, 0.1, 0.9, 0.9])   # box 2 is masked out everywhere
    torch.testing.assert_close(enc(fusion_input(enc, moved)).cls, out.cls)
    moved["boxes"][:, :, 0] = torch.tensor([0.1, 0.1, 0.9, 0.9])   # box 0 is real
    assert not torch.allclose(enc(fusion_input(enc, moved)).cls, out.cls)


def test_encoder_checkpoint_round_trip_and_visual_only_loading(tmp_path, tiny_encoders):
    src = tiny_encoders["clipvil"]
    ckpt = tmp_path / "pretrain.ckpt"
    torch.save({"epoch": 1, "state_dict": {f"encoder.{k}": v for k, v in src.state_dict().items()}
                | {"objectives.isp.head.weight": torch.zeros(2, 32)}}, ckpt)
    torch.manual_seed(123)
    dst = create_encoder("clipvil", ckpt=str(ckpt), **TINY_ENCODERS["clipvil"]).eval()
    for k, v in src.state_dict().items():
        torch.testing.assert_close(dst.state_dict()[k], v)
    fi = fusion_input(src, fake_batch())
    torch.testing.assert_close(dst(fi).cls, src(fi).cls)
    # encoder.pt (bare state dict) works too; a wrong architecture fails loudly
    bare = tmp_path / "encoder.pt"
    torch.save(src.state_dict(), bare)
    load_encoder_checkpoint(dst, bare)
    with pytest.raises(ValueError, match="does not match"):
        create_encoder("text", ckpt=str(bare), **TINY_ENCODERS["text"])
    # visual_ckpt: only the visual backbone comes from an image-only run
    image_ckpt = tmp_path / "image.ckpt"
    img = tiny_encoders["image"]
    torch.save({"state_dict": {f"encoder.{k}": v for k, v in img.state_dict().items()}}, image_ckpt)
    mm = create_encoder("clipvil", visual_ckpt=str(image_ckpt), **TINY_ENCODERS["clipvil"])
    for k, v in img.visual.state_dict().items():
        torch.testing.assert_close(mm.visual.state_dict()[k], v)
    assert not torch.equal(mm.visual_proj.weight, img.visual_proj.weight)


def test_frozen_backbone_and_frozen_batchnorm():
    cnn = create_visual_backbone("efficientnet_lite0", pretrained=False, freeze_bn=True, image_size=IMAGE)
    cnn.train()
    bns = [m for m in cnn.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(not m.training for m in bns) and cnn.training
    stats = bns[0].running_mean.clone()
    cnn(torch.randn(2, 3, IMAGE, IMAGE) * 3 + 1).sum().backward()
    torch.testing.assert_close(bns[0].running_mean, stats)          # eval-mode BN: statistics fixed
    assert cnn.model.conv_stem.weight.grad is not None
    frozen = create_visual_backbone("resnet50", trainable=False)
    frozen.train()
    out = frozen(torch.randn(1, 3, 224, 224, requires_grad=True))
    assert out.shape == (1, 49, 2048) and not out.requires_grad
    assert all(not p.requires_grad for p in frozen.parameters()) and not frozen.training
    assert (frozen.mean, frozen.std) == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _chelsea(size: int = 224) -> torch.Tensor:
    skimage_data = pytest.importorskip("skimage.data")
    x = torch.tensor(skimage_data.chelsea()).permute(2, 0, 1).float()[None] / 255
    return F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)


def test_efficientnet_lite0_real_weights_classify_chelsea_as_a_cat():
    net = create_visual_backbone("efficientnet_lite0", pretrained=True, keep_classifier=True).eval()
    assert net.mean == net.std == (0.5, 0.5, 0.5)
    x = (_chelsea() - torch.tensor(net.mean)[:, None, None]) / torch.tensor(net.std)[:, None, None]
    with torch.no_grad():
        top = int(net.classify(x).argmax())
        grid = net.grid(x)
    assert 281 <= top <= 285, top
    assert grid.shape == (1, 1280, 7, 7) and net.num_tokens() == 49


def test_lite_name_map_is_checked_not_trusted():
    import timm
    from seqaware.encoders.visual import _lite0_package_file

    model = timm.create_model("efficientnet_lite0", pretrained=False)
    state = torch.load(_lite0_package_file(), map_location="cpu", weights_only=True)
    mapped = lukemelas_to_timm_lite(state, model)
    assert mapped["blocks.1.0.conv_pwl.weight"] is state["_blocks.1._project_conv.weight"]
    assert mapped["blocks.0.0.conv_pw.weight"] is state["_blocks.0._project_conv.weight"]
    assert mapped["bn2.running_var"] is state["_bn1.running_var"]
    broken = dict(state)
    broken["_blocks.3._expand_conv.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"_blocks.3._expand_conv.weight .* shape/name mismatch"):
        lukemelas_to_timm_lite(broken, model)
    missing = {k: v for k, v in state.items() if not k.startswith("_fc.")}
    with pytest.raises(ValueError, match="unset"):
        lukemelas_to_timm_lite(missing, model)


def test_clip_openai_without_ckpt_fails_fast_offline(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    with pytest.raises(PretrainedUnavailableError, match=r"backbones\.visual\.ckpt"):
        create_visual_backbone("clip_vit_b32", pretrained="openai", ckpt=None,
                               vision_cfg=TINY_VIT["vision_cfg"])
    assert time.monotonic() - start < 10
    with pytest.raises(PretrainedUnavailableError, match=r"backbones\.visual\.ckpt"):
        create_visual_backbone("resnet50", pretrained=True)


def test_clip_full_size_random_init_gives_cls_plus_49_patches_of_768():
    net = create_visual_backbone("clip_vit_b32", trainable=False).eval()
    assert net.out_dim == 768 and net.num_tokens() == 50
    assert net.mean[0] == pytest.approx(0.48145466)


def _tiny_roberta_folder(path: Path) -> Path:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["Put the red block on the left.", "Stir the soup and serve it hot."], vocab_size=400,
                            min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    raw = path / "bpe"
    raw.mkdir(parents=True)
    bpe.save_model(str(raw))
    tok = RobertaTokenizerFast(vocab=str(raw / "vocab.json"), merges=str(raw / "merges.txt"))
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=514, type_vocab_size=1, pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    folder = path / "tiny-roberta"
    RobertaModel(cfg, add_pooling_layer=False).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _backbones_override(option: str) -> str:
    """``backbones=<option>`` once train.yaml lists the group, ``+backbones=<option>`` before that."""
    listed = "backbones:" in (ROOT / "configs" / "train.yaml").read_text()
    return f"backbones={option}" if listed else f"+backbones={option}"


def test_paper_preset_loads_local_roberta_and_clip_state_dict_without_the_hub(tmp_path, compose_train, monkeypatch):
    from hydra.utils import instantiate
    from open_clip.model import CLIPVisionCfg, _build_vision_tower

    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket, "create_connection", refuse)
    roberta = _tiny_roberta_folder(tmp_path)
    vision_cfg = dict(width=64, layers=1, head_width=32, image_size=64, patch_size=16)
    torch.manual_seed(7)
    tower = _build_vision_tower(512, CLIPVisionCfg(**vision_cfg), quick_gelu=True)
    clip_file = tmp_path / "ViT-B-32-tiny.pt"
    # the layout of a full open_clip / OpenAI CLIP state dict: visual.* next to the text tower
    torch.save({f"visual.{k}": v for k, v in tower.state_dict().items()} | {"logit_scale": torch.tensor(4.6)}, clip_file)

    cfg = compose_train(_backbones_override("paper"), "+encoder@model.encoder=clipvil",
                        f"backbones.text={roberta}", f"backbones.visual.ckpt={clip_file}",
                        f"+backbones.visual.vision_cfg={{width:64,layers:1,head_width:32,image_size:64,patch_size:16}}")
    assert cfg.backbones.visual.pretrained == "openai" and cfg.model.encoder.tokenizer == str(roberta)
    enc = instantiate(cfg.model.encoder).eval()
    assert type(enc.backbone).__name__ == "RobertaModel" and enc.cls_token_id == 0 and enc.pad_token_id == 1
    loaded = enc.visual.tower.state_dict()
    assert set(loaded) == set(tower.state_dict()) - {"proj"}         # CLIP's pooled projection is unused
    for k, v in loaded.items():
        torch.testing.assert_close(v, tower.state_dict()[k])
    assert type(enc.visual.tower.transformer.resblocks[0].mlp.gelu).__name__ == "QuickGELU"  # OpenAI activation
    assert enc.visual.mean == tuple(cfg.backbones.image_mean)
    batch = fake_batch()
    batch["input_ids"] = torch.randint(5, 300, batch["input_ids"].shape)
    batch["input_ids"][:, :, 0] = 0
    out = enc(fusion_input(enc, batch))
    assert out.patch_states.shape == (2, 3, 17, 32)


@pytest.mark.slow  # 3.6 s; fast loop budget: the full suite (CI) runs it
def test_offline_preset_composes_every_encoder(compose_train):
    from hydra.utils import instantiate

    for name in ("text", "clipvil", "visualbert", "image"):
        cfg = compose_train(_backbones_override("offline"), f"+encoder@model.encoder={name}",
                            "backbones.visual.pretrained=false", f"model.encoder.config={TINY_CFG_OVERRIDE}")
        assert cfg.model.encoder.name == name
        assert cfg.backbones.visual.name == "efficientnet_lite0" and cfg.backbones.text == "offline:minilm"
        enc = instantiate(cfg.model.encoder)
        assert type(enc).__name__ == ("TextEncoder" if name == "text" else "SingleStreamEncoder")
        if name != "text":
            assert enc.visual.mean == (0.5, 0.5, 0.5)


TINY_CFG_OVERRIDE = "{model_type:bert,vocab_size:30522,hidden_size:32,num_hidden_layers:1,num_attention_heads:2,intermediate_size:64}"


def _two_image_procedures(tmp_path: Path) -> Path:
    import json

    from PIL import Image

    (tmp_path / "images").mkdir()
    for i, colour in enumerate(["red", "blue"]):
        img = Image.new("RGB", (80, 60), colour)
        img.paste("white", (10 + 20 * i, 10, 40 + 20 * i, 40))
        img.save(tmp_path / "images" / f"s{i}.png")
    record = {"id": "p1", "split": "train", "title": "paint",
              "steps": [{"text": "Paint it red.", "images": ["images/s0.png"]},
                        {"text": "Paint it blue.", "images": ["images/s1.png"]},
                        {"text": "Reuse the first image.", "images": ["images/s0.png"]}]}
    path = tmp_path / "procs.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def test_extract_features_caches_every_image_once_and_resumes(tmp_path, capsys):
    from scripts.tools import extract_features

    procs = _two_image_procedures(tmp_path)
    out = tmp_path / "regions"
    argv = [str(procs), "--out", str(out), "--weights", "random", "--box-score-thresh", "0", "--min-size", "64",
            "--max-size", "96", "--num-boxes", "5", "--no-progress", "--device", "cpu"]
    torch.manual_seed(0)
    assert extract_features.main(argv) == 0
    assert "2 image(s): 2 written, 0 already cached" in capsys.readouterr().out
    files = sorted(out.glob("*.pt"))
    assert len(files) == 2 and not list(out.glob(".*.tmp"))
    cache = RegionFeatureCache(out, max_regions=5)
    assert cache.file(tmp_path / "images" / "s1.png") in files
    record = cache.load(tmp_path / "images" / "s0.png")
    assert record["image_feature"].shape == (1024,) and record["features"].shape[1] == 1024
    assert 1 <= record["features"].shape[0] <= 5 and record["boxes"].shape == (record["features"].shape[0], 4)
    assert (record["boxes"] >= 0).all() and (record["boxes"] <= 1).all() and record["image_size"].tolist() == [80, 60]
    feats, geom, mask = cache.batch([tmp_path / "images" / "s0.png", tmp_path / "images" / "s1.png"])
    assert feats.shape == (2, 6, 1024) and geom.shape == (2, 6, 7) and mask[:, 0].all()
    stamps = [f.stat().st_mtime_ns for f in files]
    assert extract_features.main(argv) == 0
    assert "2 image(s): 0 written, 2 already cached" in capsys.readouterr().out
    assert [f.stat().st_mtime_ns for f in files] == stamps
    # cached features feed a region encoder without a visual backbone (visual: null)
    enc = create_encoder("visualbert", config=TINY_BERT, tokenizer="offline:minilm", visual=None,
                         visual_feature_dim=1024).eval()
    batch = fake_batch(B=1, S=2)
    fi = fusion_input(create_encoder("text", **TINY_ENCODERS["text"]), batch)
    fi.update(visual_feats=torch.cat([feats, geom], -1)[None], visual_mask=torch.ones(1, 2, dtype=torch.bool),
              patch_mask=mask[None])
    assert enc(fi).patch_states.shape == (1, 2, 6, 32)
    with pytest.raises(FileNotFoundError, match="extract_features.py"):
        cache.load(tmp_path / "images" / "missing.png")
    if importlib.util.find_spec("detectron2") is None:
        (out / files[0].name).unlink()                # one image left to do, so the backend is built
        with pytest.raises(SystemExit, match="detectron2 is not importable"):
            extract_features.main(argv + ["--backend", "detectron2"])


@pytest.mark.slow
def test_synthetic_batches_with_object_boxes_train_the_region_encoder(compose_train):
    """The real data path: synthetic procedures -> collator (boxes, backbone normalisation) ->
    fusion_input -> VisualBERT; a few Adam steps fit a fixed target (the loss goes down)."""
    from hydra.utils import instantiate

    cfg = compose_train(_backbones_override("offline"), "+encoder@model.encoder=visualbert",
                        "backbones.visual.pretrained=false", "backbones.visual.trainable=false",
                        f"model.encoder.config={TINY_CFG_OVERRIDE}", "data.collator.max_boxes=3", "data.collator.image_size=64", "data.batch_size=4",
                        "data.collator.image_mean=${backbones.image_mean}", "data.collator.image_std=${backbones.image_std}")
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["boxes"].shape[-2:] == (3, 4) and batch["box_mask"].any()
    assert dm.collator.transform.mean.flatten().tolist() == [0.5, 0.5, 0.5]
    torch.manual_seed(0)
    enc = instantiate(cfg.model.encoder).eval()   # no dropout: a deterministic fit
    fi = fusion_input(enc, batch)
    B, S = batch["step_mask"].shape
    assert fi["visual_feats"].shape[:3] == (B, S, 4) and fi["patch_mask"].shape == (B, S, 4)
    torch.testing.assert_close(fi["patch_mask"][..., 1:], batch["box_mask"])
    head = torch.nn.Linear(enc.hidden_size, 2)
    target = torch.arange(B) % 2
    opt = torch.optim.Adam(list(enc.parameters()) + list(head.parameters()), lr=3e-3)
    losses = []
    for _ in range(20):                      # frozen CNN: its features are computed once
        loss = F.cross_entropy(head(enc(fi).cls), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert enc.visual.model.conv_stem.weight.grad is None


def test_clip_ckpt_accepts_openai_torchscript_archives_and_rejects_other_sizes(tmp_path):
    """OpenAI distributes ViT-B-32.pt as a TorchScript archive with ``visual.*`` weights."""
    import warnings

    from open_clip.model import CLIPVisionCfg, _build_vision_tower

    vision_cfg = TINY_VIT["vision_cfg"]
    tower = _build_vision_tower(512, CLIPVisionCfg(**vision_cfg), quick_gelu=True).eval()

    class Clip(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.visual = tower
            self.register_buffer("input_resolution", torch.tensor(64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.visual(x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        archive = tmp_path / "ViT-B-32.pt"
        torch.jit.trace(Clip(), torch.randn(1, 3, 64, 64), check_trace=False).save(str(archive))
    net = create_visual_backbone("clip_vit_b32", pretrained="openai", ckpt=str(archive), vision_cfg=vision_cfg)
    torch.testing.assert_close(net.tower.conv1.weight, tower.conv1.weight)
    with pytest.raises(ValueError, match=r"does not match ViT-B-32.*backbones\.visual\.ckpt"):
        create_visual_backbone("clip_vit_b32", ckpt=str(archive), vision_cfg=dict(vision_cfg, width=96))


def test_paper_preset_without_local_weights_fails_fast_naming_what_to_set(compose_train, monkeypatch, tmp_path):
    from hydra.utils import instantiate

    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    import huggingface_hub.constants

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))            # an empty Hugging Face cache
    # as HF_HUB_OFFLINE=1 would: transformers 5.23 otherwise retries a HEAD request for
    # adapter_config.json ~25 s even with local_files_only=True (see seqaware/pretrained.py)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = compose_train(_backbones_override("paper"), "+encoder@model.encoder=clipvil")
    start = time.monotonic()
    with pytest.raises(Exception, match=r"roberta-large.*backbones\.text=/path/to/folder") as err:
        instantiate(cfg.model.encoder)                   # hydra wraps the error in InstantiationException
    assert time.monotonic() - start < 15
    assert PretrainedUnavailableError in {type(err.value), type(err.value.__cause__)}


@pytest.mark.parametrize("name", ["clipvil", "visualbert"])
def test_frozen_backbone_features_are_computed_once_per_image(name):
    """With a frozen backbone each distinct image runs through it once; the cached features equal a
    fresh computation, a trainable backbone is never cached, and loading weights empties the cache."""
    torch.manual_seed(0)
    frozen = create_encoder(name, **dict(TINY_ENCODERS[name], visual=dict(TINY_ENCODERS[name]["visual"], trainable=False)))
    batch = fake_batch()
    calls = []
    tower = frozen.visual.grid if name == "visualbert" else frozen.visual.tokens
    entry = "grid" if name == "visualbert" else "tokens"
    setattr(frozen.visual, entry, lambda pixels: calls.append(len(pixels)) or tower(pixels))
    first = fusion_input(frozen, batch)["visual_feats"]
    again = fusion_input(frozen, batch)["visual_feats"]
    assert calls == [6] and len(frozen.feature_cache) == 6  # 2 x 3 distinct images, once
    assert torch.equal(first, again)
    frozen.feature_cache.clear()
    assert torch.allclose(fusion_input(frozen, batch)["visual_feats"], first, atol=1e-6)
    # a repeated image in one batch is computed once too
    twice = dict(batch, pixel_values=batch["pixel_values"][:, :1].expand_as(batch["pixel_values"]).clone())
    frozen.feature_cache.clear()
    calls.clear()
    fusion_input(frozen, twice)
    assert calls == [2]
    # new weights for the tower: the cache is emptied
    frozen.visual.load_state_dict(frozen.visual.state_dict())
    assert len(frozen.feature_cache) == 0

    trainable = create_encoder(name, **TINY_ENCODERS[name])
    fusion_input(trainable, batch)
    assert len(trainable.feature_cache) == 0
    off = create_encoder(name, feature_cache_mb=0, **dict(TINY_ENCODERS[name], visual=dict(TINY_ENCODERS[name]["visual"], trainable=False)))
    assert off.feature_cache is None


def test_frozen_feature_cache_stops_growing_at_its_size():
    from seqaware.encoders.visual import FrozenFeatureCache

    cache = FrozenFeatureCache(max_mb=3 * 4 * 10 / 2 ** 20)  # room for 3 images of 10 float32 values
    fn = lambda pixels: pixels.flatten(1)[:, :10] * 2  # noqa: E731
    pixels = torch.randn(5, 1, 4, 4)
    out = cache(fn, pixels, "t")
    assert torch.equal(out, fn(pixels)) and len(cache) == 3
    assert torch.equal(cache(fn, pixels, "t"), fn(pixels)) and cache.hits == 3 and cache.misses == 7
