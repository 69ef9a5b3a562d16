#!/usr/bin/env python
"""Cache detector region features for every step image of procedures JSONL files (VisualBERT inputs).

    python scripts/tools/extract_features.py data/prepared/ --out cache/regions --weights frcnn_r50_fpn_coco.pth
    python scripts/tools/extract_features.py train.jsonl val.jsonl --out cache/regions --weights random \\
        --box-score-thresh 0 --min-size 320            # random weights: plumbing checks only

For each image: the top ``--num-boxes`` detections of a torchvision Faster R-CNN (ResNet-50 FPN),
the RoI box-head feature of every kept box (1024-d: ``roi_heads.box_roi_pool`` + ``box_head`` on
the final boxes) and of the whole image (the same head on the full-image box), the boxes
normalised to [0, 1], their scores and the image size.  One ``<sha1 of the image path>.pt`` file
per image under ``--out`` (read back with :class:`seqaware.encoders.regions.RegionFeatureCache`),
written atomically; a rerun skips images already cached, so an interrupted run resumes.
Train on the cache with ``python train.py experiment=visualbert_pretrain encoder@model.encoder=visualbert_detector
data.collator.region_features=OUT data.collator.max_boxes=36`` (README, "Real data and real pretrained weights").

Weights: ``--weights PATH`` (a torchvision ``fasterrcnn_resnet50_fpn`` state dict, e.g. the COCO
``fasterrcnn_resnet50_fpn_coco-258fb6c6.pth``) or ``random`` (random init: set
``--box-score-thresh 0`` or nothing is detected).  Speed on a 2-core CPU: ~5 s per image at the
default ``--min-size 800``, ~1.7 s at 320.  ``--backend detectron2`` uses a detectron2 model
(``--d2-config`` + ``--weights``; e.g. the Visual Genome R101 detector VisualBERT used) when
detectron2 is importable.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data_modules.images import ImageLoadError, open_rgb  # noqa: E402
from seqaware.encoders.regions import RegionFeatureCache  # noqa: E402
from seqaware.io import atomic_open  # noqa: E402
from seqaware.procedure import iter_procedure_files, read_procedures  # noqa: E402

Extractor = Callable[[torch.Tensor], dict]


def step_images(paths: list[str]) -> list[tuple[Path, str]]:
    """Unique ``(image path, "file: procedure id: steps[i].images[k]")`` of every step image."""
    seen: dict[Path, str] = {}
    for file in iter_procedure_files(paths):
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no such procedures file")
        for proc in read_procedures(file, check_images=True):
            for i, step in enumerate(proc.steps):
                for k in range(len(step.images)):
                    path = proc.image_path(i, k)
                    if path is not None and path not in seen:
                        seen[path] = f"{file}: {proc.id}: steps[{i}].images[{k}]"
    return list(seen.items())


def torchvision_extractor(weights: str, num_boxes: int, min_size: int, max_size: int, score_thresh: float,
                          device: torch.device) -> Extractor:
    """Faster R-CNN R50-FPN RoI box-head features (see the module docstring)."""
    from torchvision.models.detection import fasterrcnn_resnet50_fpn

    model = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, min_size=min_size, max_size=max_size,
                                    box_score_thresh=score_thresh, box_detections_per_img=num_boxes)
    if weights != "random":
        if not Path(weights).is_file():
            raise FileNotFoundError(f"--weights {weights}: no such file (a fasterrcnn_resnet50_fpn state dict, or 'random')")
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)
    model.eval().to(device)

    @torch.no_grad()
    def extract(image: torch.Tensor) -> dict:
        images, _ = model.transform([image.to(device)])
        feats = model.backbone(images.tensors)
        proposals, _ = model.rpn(images, feats)
        detections, _ = model.roi_heads(feats, proposals, images.image_sizes)
        h, w = images.image_sizes[0]
        boxes = detections[0]["boxes"][:num_boxes]
        whole = torch.tensor([[0.0, 0.0, float(w), float(h)]], device=boxes.device)
        pooled = model.roi_heads.box_roi_pool(feats, [torch.cat([whole, boxes])], images.image_sizes)
        head = model.roi_heads.box_head(pooled)  # (1 + K, 1024)
        scale = torch.tensor([w, h, w, h], dtype=boxes.dtype, device=boxes.device)
        return {"image_feature": head[0], "features": head[1:], "boxes": (boxes / scale).clamp(0, 1),
                "scores": detections[0]["scores"][:num_boxes]}

    return extract


def detectron2_extractor(config: str | None, weights: str, num_boxes: int, score_thresh: float,
                         device: torch.device) -> Extractor:
    """The same recipe on a detectron2 GeneralizedRCNN (box_pooler + box_head on the final boxes)."""
    try:
        import detectron2.data.transforms as T
        from detectron2.checkpoint import DetectionCheckpointer
        from detectron2.config import get_cfg
        from detectron2.modeling import build_model
        from detectron2.structures import Boxes
    except ImportError as err:
        raise SystemExit("--backend detectron2: detectron2 is not importable here (it is not on PyPI; install it "
                         "from source, see https://detectron2.readthedocs.io), or use --backend torchvision") from err
    if not config or weights == "random":
        raise SystemExit("--backend detectron2 needs --d2-config CONFIG.yaml and --weights MODEL.pth")
    cfg = get_cfg()
    cfg.merge_from_file(config)
    cfg.MODEL.WEIGHTS = weights
    cfg.MODEL.DEVICE = str(device)
    cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST = score_thresh
    cfg.TEST.DETECTIONS_PER_IMAGE = num_boxes
    model = build_model(cfg).eval()
    DetectionCheckpointer(model).load(weights)
    resize = T.ResizeShortestEdge([cfg.INPUT.MIN_SIZE_TEST] * 2, cfg.INPUT.MAX_SIZE_TEST)

    @torch.no_grad()
    def extract(image: torch.Tensor) -> dict:
        rgb = (image.permute(1, 2, 0) * 255).round().byte().numpy()
        bgr = rgb[:, :, ::-1] if cfg.INPUT.FORMAT == "BGR" else rgb
        resized = resize.get_transform(bgr).apply_image(bgr)
        h, w = resized.shape[:2]
        inputs = [{"image": torch.as_tensor(resized.astype("float32").transpose(2, 0, 1)), "height": h, "width": w}]
        images = model.preprocess_image(inputs)
        feats = model.backbone(images.tensor)
        proposals, _ = model.proposal_generator(images, feats, None)
        instances, _ = model.roi_heads(images, feats, proposals, None)
        boxes = instances[0].pred_boxes.tensor[:num_boxes]
        whole = torch.tensor([[0.0, 0.0, float(w), float(h)]], device=boxes.device)
        levels = [feats[f] for f in model.roi_heads.box_in_features]
        head = model.roi_heads.box_head(model.roi_heads.box_pooler(levels, [Boxes(torch.cat([whole, boxes]))]))
        scale = torch.tensor([w, h, w, h], dtype=boxes.dtype, device=boxes.device)
        return {"image_feature": head[0], "features": head[1:], "boxes": (boxes / scale).clamp(0, 1),
                "scores": instances[0].scores[:num_boxes]}

    return extract


def run(images: list[tuple[Path, str]], cache: RegionFeatureCache, extract: Extractor, progress: bool = True
        ) -> tuple[int, int]:
    """Extract and cache every image not cached yet; returns ``(written, skipped)``."""
    from torchvision.transforms.functional import pil_to_tensor
    from tqdm import tqdm

    written = skipped = 0
    for path, where in tqdm(images, desc="region features", unit="img", disable=not progress):
        target = cache.file(path)
        if target.is_file():
            skipped += 1
            continue
        try:
            img = open_rgb(path)
        except ImageLoadError as err:
            raise SystemExit(f"{where}: {err}") from err
        out = extract(pil_to_tensor(img).float() / 255.0)
        record = {k: v.detach().to("cpu", torch.float32) for k, v in out.items()}
        record["path"] = str(path)
        record["image_size"] = torch.tensor(img.size)
        with atomic_open(target, "wb") as handle:
            torch.save(record, handle)
        written += 1
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("procedures", nargs="+", help="procedures JSONL files or folders holding them")
    parser.add_argument("--out", required=True, help="cache folder (one .pt per image)")
    parser.add_argument("--weights", required=True, help="detector state dict, or 'random' (tests / plumbing)")
    parser.add_argument("--backend", choices=("torchvision", "detectron2"), default="torchvision")
    parser.add_argument("--d2-config", default=None, help="detectron2 config file (--backend detectron2)")
    parser.add_argument("--num-boxes", type=int, default=36, help="regions kept per image (top scores)")
    parser.add_argument("--min-size", type=int, default=800, help="shorter image side fed to the detector")
    parser.add_argument("--max-size", type=int, default=1333, help="longer side cap")
    parser.add_argument("--box-score-thresh", type=float, default=0.2, help="min detection score (0 with random weights)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    images = step_images(args.procedures)
    cache = RegionFeatureCache(args.out, max_regions=args.num_boxes)
    if all(cache.file(path).is_file() for path, _ in images):  # resuming a finished run: no model needed
        print(f"{len(images)} image(s): 0 written, {len(images)} already cached -> {args.out}")
        return 0
    device = torch.device(args.device)
    if args.backend == "detectron2":
        extract = detectron2_extractor(args.d2_config, args.weights, args.num_boxes, args.box_score_thresh, device)
    else:
        extract = torchvision_extractor(args.weights, args.num_boxes, args.min_size, args.max_size,
                                        args.box_score_thresh, device)
    written, skipped = run(images, cache, extract, progress=not args.no_progress)
    print(f"{len(images)} image(s): {written} written, {skipped} already cached -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
