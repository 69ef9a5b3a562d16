"""Reading step images: RGB, the middle frame of animations, resizing and normalisation."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ImageLoadError(RuntimeError):
    """An image file is missing or unreadable."""


def open_rgb(path: str | Path) -> Image.Image:
    """Open an image as RGB; animated images (GIF, APNG, WebP) give their middle frame."""
    try:
        with Image.open(path) as img:
            frames = getattr(img, "n_frames", 1)
            if frames > 1:
                img.seek(frames // 2)
            return img.convert("RGB")
    except (FileNotFoundError, UnidentifiedImageError, OSError, ValueError) as err:
        raise ImageLoadError(f"cannot read image {path}: {err}") from err


class ImageTransform:
    """PIL image -> normalised float tensor (3, size, size), with the backbone's mean and std."""

    def __init__(self, size: int = 224, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD):
        self.size = int(size)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        if img.size != (self.size, self.size):
            img = img.resize((self.size, self.size), Image.BILINEAR)
        array = np.asarray(img, dtype=np.uint8)
        tensor = torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255.0)
        return (tensor - self.mean) / self.std

    def blank(self) -> torch.Tensor:
        """A mid-grey image after normalisation (what a missing image becomes under policy 'blank')."""
        return (torch.full((3, self.size, self.size), 0.5) - self.mean) / self.std
