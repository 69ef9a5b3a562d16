"""Region features for VisualBERT-style encoders.

Two sources, one output format ``(feats (N, 1+R, D), geometry (N, 1+R, 7), mask (N, 1+R))``: the
first token of every image is a whole-image feature, then up to R regions; ``geometry`` is
``(x1, y1, x2, y2, w, h, area)`` of each box in [0, 1] image coordinates (the whole image is
``(0, 0, 1, 1, 1, 1, 1)``); ``mask`` marks real regions.  Padded regions are all zeros.

(a) :class:`BoxRegionFeatures` pools a CNN grid (EfficientNet / ResNet, see
    :mod:`seqaware.encoders.visual`) inside given boxes with ``torchvision.ops.roi_align``.  The
    synthetic data records the exact object boxes of every image (collator ``max_boxes > 0``
    returns ``boxes``/``box_mask``), so no detector is needed there.
(b) :class:`RegionFeatureCache` reads detector features that ``scripts/tools/extract_features.py``
    wrote (Faster R-CNN RoI box-head features, 1024-d, one file per image keyed by
    :func:`feature_key`) -- for real images, where running a detector in the training loop would
    cost seconds per image.  ``data.collator.region_features=DIR`` makes the collator attach them
    to every batch (``visual_feats`` = features + geometry, ``patch_mask``) for an encoder without a
    visual backbone (``configs/encoder/visualbert_detector.yaml``).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn
from torchvision.ops import roi_align

GEOMETRY_DIM = 7


def box_geometry(boxes: torch.Tensor) -> torch.Tensor:
    """``(..., 4)`` normalised ``x1, y1, x2, y2`` -> ``(..., 7)`` ``x1, y1, x2, y2, w, h, area``."""
    w = (boxes[..., 2] - boxes[..., 0]).clamp(min=0)
    h = (boxes[..., 3] - boxes[..., 1]).clamp(min=0)
    return torch.cat([boxes, w[..., None], h[..., None], (w * h)[..., None]], dim=-1)


def with_whole_image(feats: torch.Tensor, image_feat: torch.Tensor, boxes: torch.Tensor,
                     box_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prepend the whole-image token and zero padded regions: the common output format."""
    N = feats.shape[0]
    mask = torch.cat([torch.ones(N, 1, dtype=torch.bool, device=feats.device), box_mask.bool()], dim=1)
    full_box = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=boxes.dtype, device=boxes.device).expand(N, 1, 4)
    geometry = box_geometry(torch.cat([full_box, boxes], dim=1))
    feats = torch.cat([image_feat[:, None], feats], dim=1)
    keep = mask[..., None].to(feats.dtype)
    return feats * keep, geometry * keep.to(geometry.dtype), mask


class BoxRegionFeatures(nn.Module):
    """RoIAlign pooling of a CNN grid inside normalised boxes, plus a whole-image feature.

    Args:
        output_size: RoIAlign output resolution per box (its cells are averaged to one vector).
        sampling_ratio: sampling points per output cell (-1: adaptive, as torchvision).
        aligned: torchvision's half-pixel-corrected RoIAlign.
        min_cells: boxes are at least this many grid cells wide/high (tiny objects on a 7 x 7
            grid would otherwise pool a single interpolated point).
    """

    def __init__(self, output_size: int = 2, sampling_ratio: int = 2, aligned: bool = True, min_cells: float = 1.0):
        super().__init__()
        self.output_size = int(output_size)
        self.sampling_ratio = int(sampling_ratio)
        self.aligned = bool(aligned)
        self.min_cells = float(min_cells)

    def forward(self, grid: torch.Tensor, boxes: torch.Tensor, box_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``grid (N, C, h, w)``, ``boxes (N, R, 4)`` in [0, 1], ``box_mask (N, R)`` ->
        ``feats (N, 1+R, C)``, ``geometry (N, 1+R, 7)``, ``mask (N, 1+R)``."""
        N, C, h, w = grid.shape
        if boxes.dim() != 3 or boxes.shape[0] != N or boxes.shape[-1] != 4:
            raise ValueError(f"boxes must be (N={N}, R, 4), got {tuple(boxes.shape)}")
        R = boxes.shape[1]
        # boxes and the image index in float32 whatever the grid's dtype (bfloat16 holds integers exactly only
        # up to 256); roi_align in float32, as torchvision's autocast runs it (its CPU kernel has no bfloat16)
        scale = torch.tensor([w, h, w, h], dtype=torch.float32, device=grid.device)
        pix = boxes.float() * scale
        # grow boxes smaller than min_cells around their centre
        centre = (pix[..., :2] + pix[..., 2:]) / 2
        half = ((pix[..., 2:] - pix[..., :2]).clamp(min=self.min_cells)) / 2
        pix = torch.cat([centre - half, centre + half], dim=-1)
        index = torch.arange(N, device=grid.device, dtype=torch.float32).repeat_interleave(R)[:, None]
        rois = torch.cat([index, pix.reshape(N * R, 4)], dim=1)
        pooled = roi_align(grid.float(), rois, output_size=self.output_size, spatial_scale=1.0,
                           sampling_ratio=self.sampling_ratio, aligned=self.aligned).to(grid.dtype)  # (N*R, C, o, o)
        regions = pooled.mean(dim=(2, 3)).view(N, R, C)
        return with_whole_image(regions, grid.mean(dim=(2, 3)), boxes.to(grid.dtype), box_mask)


def feature_key(image_path: str | Path) -> str:
    """Cache key of an image: SHA-1 of its resolved absolute path."""
    return hashlib.sha1(str(Path(image_path).resolve()).encode("utf-8")).hexdigest()


class RegionFeatureCache:
    """Reads the per-image detector features written by ``scripts/tools/extract_features.py``.

    Each file ``<cache_dir>/<feature_key(path)>.pt`` holds ``path``, ``image_feature (D,)``,
    ``features (K, D)``, ``boxes (K, 4)`` normalised, ``scores (K,)`` and ``image_size (w, h)``.

    Args:
        cache_dir: the folder given to ``extract_features.py --out``.
        max_regions: R, regions per image kept (highest score first, as written).
    """

    def __init__(self, cache_dir: str | Path, max_regions: int = 36):
        self.cache_dir = Path(cache_dir)
        self.max_regions = int(max_regions)
        self._dim: Optional[int] = None

    def file(self, image_path: str | Path) -> Path:
        return self.cache_dir / f"{feature_key(image_path)}.pt"

    def feature_dim(self) -> int:
        """D of the cached features, read from any one file of the folder (a batch without images needs it)."""
        if self._dim is None:
            first = None
            if self.cache_dir.is_dir():
                with os.scandir(self.cache_dir) as entries:  # one file suffices: no listing of a large folder
                    first = next((e.path for e in entries if e.name.endswith(".pt")), None)
            if first is None:
                raise FileNotFoundError(f"no cached region features in {self.cache_dir}; run python "
                                        f"scripts/tools/extract_features.py PROCEDURES.jsonl... --out {self.cache_dir} "
                                        f"--weights DETECTOR.pth")
            record = torch.load(first, map_location="cpu", weights_only=True)
            self._dim = int(record["image_feature"].shape[-1])
        return self._dim

    def load(self, image_path: str | Path) -> dict:
        """The cached record of one image; a missing file or a malformed record is an error naming both."""
        f = self.file(image_path)
        if not f.is_file():
            raise FileNotFoundError(f"no cached region features for image {image_path} (expected {f}); run "
                                    f"python scripts/tools/extract_features.py PROCEDURES.jsonl... --out {self.cache_dir} "
                                    f"--weights DETECTOR.pth over the procedures that use this image")
        try:
            record = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as err:  # truncated / foreign file: name it (torch's message does not)
            raise ValueError(f"{f}: cached region features of {image_path} cannot be read ({err}); delete the file "
                             f"and rerun scripts/tools/extract_features.py") from err
        for key in ("image_feature", "features", "boxes"):
            if key not in record:
                raise ValueError(f"{f}: cached region features of {image_path} lack field {key!r}")
        feat, regions, boxes = record["image_feature"], record["features"], record["boxes"]
        if (feat.dim() != 1 or regions.dim() != 2 or regions.shape[1] != feat.shape[0]
                or tuple(boxes.shape) != (regions.shape[0], 4)):
            raise ValueError(f"{f}: cached region features of {image_path} have inconsistent shapes: image_feature "
                             f"{tuple(feat.shape)}, features {tuple(regions.shape)}, boxes {tuple(boxes.shape)} "
                             f"(expected (D,), (K, D), (K, 4))")
        return record

    def stack(self, records: Sequence[dict], dim: Optional[int] = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loaded records in the common format (R = ``max_regions``, D = ``dim`` or the first record's)."""
        N, R = len(records), self.max_regions
        D = int(dim) if dim is not None else (int(records[0]["image_feature"].shape[-1]) if records else 0)
        feats = torch.zeros(N, R, D)
        boxes = torch.zeros(N, R, 4)
        box_mask = torch.zeros(N, R, dtype=torch.bool)
        image_feat = torch.zeros(N, D)
        for i, rec in enumerate(records):  # I/O-bound loop over files, not model code
            if int(rec["image_feature"].shape[-1]) != D:
                raise ValueError(f"cached region features of {rec.get('path', f'record {i}')} are "
                                 f"{int(rec['image_feature'].shape[-1])}-d, the others in {self.cache_dir} {D}-d "
                                 f"(a cache folder must come from one extract_features.py configuration)")
            k = min(R, int(rec["features"].shape[0]))
            feats[i, :k] = rec["features"][:k].float()
            boxes[i, :k] = rec["boxes"][:k].float()
            box_mask[i, :k] = True
            image_feat[i] = rec["image_feature"].float()
        return with_whole_image(feats, image_feat, boxes, box_mask)

    def batch(self, image_paths: Sequence[str | Path]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Features of several images in the common format (R = ``max_regions``)."""
        return self.stack([self.load(p) for p in image_paths])
