"""Cached detector region features end to end: scripts/tools/extract_features.py -> RegionFeatureCache ->
StepCollator (data.collator.region_features) -> the VisualBERT encoder without a visual backbone
(encoder@model.encoder=visualbert_detector) -> train.py (pretraining and BERSON fine-tuning).

The detector is a randomly initialised torchvision Faster R-CNN (``--weights random``): the
plumbing is what is tested, not the detections.  The data is a few procedures of the tiny synthetic
world, rewritten with absolute image paths so ``data=jsonl`` reads them.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from hydra.errors import InstantiationException

import train
from conftest import TINY_BERT
from data_modules.collate import StepCollator
from data_modules.images import ImageLoadError
from data_modules.views import SequencingView
from seqaware.encoders import create_encoder, fusion_input
from seqaware.encoders.fusion import SingleStreamEncoder
from seqaware.encoders.regions import GEOMETRY_DIM, RegionFeatureCache
from seqaware.procedure import read_procedures

# the module fixture runs the Faster R-CNN extractor (~15-25 s on 2 cores): full suite only
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
REGIONS = 4       # --num-boxes and data.collator.max_boxes
DIM = 1024        # the Faster R-CNN box head
SPLIT_SIZES = {"train": 4, "val": 2, "test": 2}


def _extract_features():
    from scripts.tools import extract_features

    return extract_features


@pytest.fixture(scope="module")
def region_data(tmp_path_factory, tiny_synthetic_dir) -> dict:
    """A few synthetic procedures per split (absolute image paths) and their cached region features."""
    root = tmp_path_factory.mktemp("regions")
    paths = {}
    for split, n in SPLIT_SIZES.items():
        lines = (tiny_synthetic_dir / f"{split}.jsonl").read_text().splitlines()[:n]
        records = [json.loads(line) for line in lines]
        for rec in records:
            for step in rec["steps"]:
                step["images"] = [str(tiny_synthetic_dir / img) for img in step["images"]]
        paths[split] = root / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in records))
    cache = root / "cache"
    argv = [str(p) for p in paths.values()] + [
        "--out", str(cache), "--weights", "random", "--box-score-thresh", "0", "--min-size", "64",
        "--max-size", "96", "--num-boxes", str(REGIONS), "--no-progress", "--device", "cpu"]
    torch.manual_seed(0)
    assert _extract_features().main(argv) == 0
    return {"paths": paths, "cache": cache}


def _overrides(region_data: dict, cache: Path | None = None) -> list[str]:
    p = region_data["paths"]
    return ["encoder@model.encoder=visualbert_detector", "data=jsonl", f"data.train_path={p['train']}",
            f"data.val_path={p['val']}", f"data.test_path={p['test']}",
            f"data.collator.region_features={cache or region_data['cache']}", f"data.collator.max_boxes={REGIONS}",
            f"model.encoder.config={TINY_BERT}", "data.collator.image_size=64", "data.batch_size=4",
            "data.eval_batch_size=4",
            "data.allow_outside_images=true"]   # the fixture's procedures point into the synthetic cache


def _copy_cache(region_data: dict, tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(region_data["cache"], copy)
    return copy


def _collator(cache: Path, **kwargs) -> StepCollator:
    from seqaware.pretrained import load_tokenizer

    return StepCollator(load_tokenizer("offline:minilm"), image_size=64, max_boxes=REGIONS,
                        region_features=str(cache), **kwargs)


def _items(path: Path, check_images: bool = True) -> list:
    view = SequencingView(read_procedures(path, check_images=check_images), seed=0)
    return [view[i] for i in range(len(view))]


def test_collator_attaches_the_cached_features_of_every_step_image(region_data):
    cache = RegionFeatureCache(region_data["cache"], max_regions=REGIONS)
    items = _items(region_data["paths"]["train"])
    batch = _collator(region_data["cache"])(items)
    B, S = batch["step_mask"].shape
    assert batch["visual_feats"].shape == (B, S, 1 + REGIONS, DIM + GEOMETRY_DIM)
    assert batch["patch_mask"].shape == (B, S, 1 + REGIONS)
    assert "boxes" not in batch and "box_mask" not in batch   # the recorded boxes are not used
    assert batch["image_mask"].equal(batch["step_mask"])       # every real step has its image
    for b, it in enumerate(items):
        for s, step in enumerate(it.steps):
            rec = cache.load(step.images[0])
            k = min(REGIONS, rec["features"].shape[0])
            feats = batch["visual_feats"][b, s]
            torch.testing.assert_close(feats[0, :DIM], rec["image_feature"], rtol=0, atol=0)
            torch.testing.assert_close(feats[1:1 + k, :DIM], rec["features"][:k], rtol=0, atol=0)
            torch.testing.assert_close(feats[1:1 + k, DIM:DIM + 4], rec["boxes"][:k], rtol=0, atol=0)
            assert feats[0, DIM:].tolist() == [0, 0, 1, 1, 1, 1, 1]           # the whole image's geometry
            assert batch["patch_mask"][b, s].tolist() == [True] * (1 + k) + [False] * (REGIONS - k)
            assert feats[1 + k:].eq(0).all()
        assert batch["visual_feats"][b, len(it.steps):].eq(0).all()          # padding steps: zeros, masked
        assert not batch["patch_mask"][b, len(it.steps):].any()


def test_changing_a_cached_file_changes_the_encoder_output(region_data, tmp_path, compose_train):
    """The module's fusion input is built from the cache: a changed file changes exactly its sample."""
    from hydra.utils import instantiate

    cache = _copy_cache(region_data, tmp_path)
    cfg = compose_train("experiment=visualbert_pretrain", *_overrides(region_data, cache))
    dm = instantiate(cfg.data)
    dm.setup("fit")
    items = [dm.datasets["train"][i] for i in range(len(dm.datasets["train"]))]
    items = [items[0]] + [it for it in items if it.procedure_id != items[0].procedure_id][:2]
    module = instantiate(cfg.model, _recursive_=False).eval()
    assert module.encoder.visual is None and module.encoder.visual_feature_dim == DIM
    with torch.no_grad():
        before = module.encoder(module.fusion(dm.collator(items))).patch_states
    target = RegionFeatureCache(cache).file(items[0].steps[0].images[0])
    record = torch.load(target, weights_only=True)
    record["features"] = record["features"] + 1.0
    torch.save(record, target)
    with torch.no_grad():
        after = module.encoder(module.fusion(dm.collator(items))).patch_states
    assert not torch.allclose(before[0], after[0])                   # the sample with that image
    torch.testing.assert_close(before[1:], after[1:])                # other procedures: untouched


def test_visualbert_pretrain_runs_through_train_py_on_cached_features(region_data, compose_train, monkeypatch):
    seen = []
    forward = SingleStreamEncoder.forward

    def recording_forward(self, fusion):
        seen.append((self.visual, tuple(fusion["visual_feats"].shape), fusion.get("patch_mask")))
        return forward(self, fusion)

    monkeypatch.setattr(SingleStreamEncoder, "forward", recording_forward)
    cfg = compose_train("experiment=visualbert_pretrain", "trainer.fast_dev_run=true", *_overrides(region_data))
    metrics = train.run(cfg)
    assert seen and all(visual is None for visual, _, _ in seen)
    assert all(shape[2:] == (1 + REGIONS, DIM + GEOMETRY_DIM) for _, shape, _ in seen), {s for _, s, _ in seen}
    assert all(mask is not None and mask.shape == shape[:3] for _, shape, mask in seen)
    for name in ("mlm", "isp", "smrm"):
        assert f"test/{name}_loss" in metrics and torch.isfinite(torch.tensor(metrics[f"test/{name}_loss"]))
    assert (Path(cfg.paths.output_dir) / "encoder.pt").is_file()


def test_berson_finetune_runs_on_cached_features(region_data, compose_train, monkeypatch):
    seen = []
    forward = SingleStreamEncoder.forward

    def recording_forward(self, fusion):
        seen.append(tuple(fusion["visual_feats"].shape))
        return forward(self, fusion)

    monkeypatch.setattr(SingleStreamEncoder, "forward", recording_forward)
    cfg = compose_train("experiment=berson_finetune", "trainer.fast_dev_run=true", "model.beam_size=2",
                        *_overrides(region_data))
    metrics = train.run(cfg)
    assert seen and all(shape[1:] == (2, 1 + REGIONS, DIM + GEOMETRY_DIM) for shape in seen)  # step pairs
    assert "test/pmr" in metrics


def test_missing_cache_file_names_the_image_the_file_and_the_command(region_data, tmp_path, compose_train):
    cache = _copy_cache(region_data, tmp_path)
    items = _items(region_data["paths"]["train"])
    image = items[1].steps[2].images[0]
    missing = RegionFeatureCache(cache).file(image)
    missing.unlink()
    with pytest.raises(FileNotFoundError) as err:
        _collator(cache)(items)
    message = str(err.value)
    for part in (f"procedure {items[1].procedure_id}", image, str(missing), "scripts/tools/extract_features.py",
                 f"--out {cache}"):
        assert part in message, (part, message)
    # whole procedures (not the default 2-step sub-sequences), so the step without a cache file is read
    cfg = compose_train("experiment=visualbert_pretrain", "trainer.fast_dev_run=true", *_overrides(region_data, cache),
                        "data.view.max_steps=5", "+data.view.subsequences=false")
    with pytest.raises(FileNotFoundError, match="no cached region features for image"):
        train.run(cfg)


def test_unreadable_or_malformed_cache_file_is_named(region_data, tmp_path):
    cache = _copy_cache(region_data, tmp_path)
    items = _items(region_data["paths"]["val"])
    target = RegionFeatureCache(cache).file(items[0].steps[0].images[0])
    record = torch.load(target, weights_only=True)
    record["boxes"] = record["boxes"][:, :2]
    torch.save(record, target)
    with pytest.raises(ValueError, match=f"{target}.*inconsistent shapes"):
        _collator(cache)(items)
    target.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=f"{target}.*cannot be read"):
        _collator(cache)(items)


def test_missing_step_image_follows_the_missing_image_policy(region_data, tmp_path):
    record = json.loads(region_data["paths"]["val"].read_text().splitlines()[0])
    gone = tmp_path / "gone.png"
    record["steps"][1]["images"] = [str(gone)]
    path = tmp_path / "procs.jsonl"
    path.write_text(json.dumps(record) + "\n")
    items = _items(path, check_images=False)
    with pytest.raises(ImageLoadError, match="gone.png"):
        _collator(region_data["cache"])(items)
    collator = _collator(region_data["cache"], missing_image="blank")
    batch = collator(items)
    s = items[0].step_index.index(1)                      # input position of the step without its image
    assert collator.missing_images == 1 and not batch["image_mask"][0, s]
    assert batch["visual_feats"][0, s].eq(0).all() and not batch["patch_mask"][0, s].any()
    others = [k for k in range(len(items[0].steps)) if k != s]
    assert batch["patch_mask"][0, others, 0].all()


def test_configuration_mistakes_are_clear_errors(region_data, compose_train):
    with pytest.raises(ValueError, match="max_boxes >= 1"):
        StepCollator(None, use_text=False, max_boxes=0, region_features=str(region_data["cache"]))
    assert StepCollator(None, use_text=False, use_images=False, region_features="nowhere").region_cache is None
    batch = _collator(region_data["cache"])(_items(region_data["paths"]["val"]))
    tiny = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 64, "vocab_size": 30522}
    with_backbone = create_encoder("visualbert", config=tiny, tokenizer="offline:minilm",
                                   visual={"name": "efficientnet_lite0", "pretrained": False})
    with pytest.raises(ValueError, match="visualbert_detector"):
        fusion_input(with_backbone, batch)
    wrong_dim = create_encoder("visualbert", config=tiny, tokenizer="offline:minilm", visual=None,
                               visual_feature_dim=2048)
    with pytest.raises(ValueError, match="1031 dims, the encoder expects 2055"):
        wrong_dim(fusion_input(wrong_dim, batch))
    del batch["visual_feats"]
    with pytest.raises(ValueError, match="data.collator.region_features"):
        fusion_input(wrong_dim, batch)
    cfg = compose_train("experiment=visualbert_pretrain", "trainer.fast_dev_run=true",
                        *_overrides(region_data), "data.collator.max_boxes=0")
    with pytest.raises((ValueError, InstantiationException), match="max_boxes >= 1"):
        train.run(cfg)
