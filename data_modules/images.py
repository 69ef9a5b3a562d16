"""Reading step images: RGB, the middle frame of animations, resizing and normalisation."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

if TYPE_CHECKING:
    from seqaware.procedure import Problem, Procedure

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
            elif img.mode == "RGB":   # already RGB: decoded in place, no converted copy
                img.load()
                return img
            return img.convert("RGB")
    except (FileNotFoundError, UnidentifiedImageError, OSError, ValueError) as err:
        raise ImageLoadError(f"cannot read image {path}: {err}") from err


class ImageTransform:
    """PIL image -> normalised float (3, size, size), with the backbone's mean and std.

    The arithmetic is NumPy's (single-threaded): per image the tensors are small, and torch's intra-op
    thread pool made each call cost ~50 ms instead of ~0.3 ms on a busy 2-core machine (the loader runs
    between training steps in the training process with ``num_workers=0``). :meth:`array` gives the
    NumPy array the collator writes into its batch buffer; calling the transform gives a tensor.
    """

    def __init__(self, size: int = 224, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD):
        self.size = int(size)
        mean_, std_ = np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)
        self.mean = torch.from_numpy(mean_.copy()).view(3, 1, 1)   # what a reader of the transform sees
        self.std = torch.from_numpy(std_.copy()).view(3, 1, 1)
        # (x / 255 - mean) / std as one multiply-add per channel
        self._scale = (1.0 / (255.0 * std_)).astype(np.float32)
        self._shift = (-mean_ / std_).astype(np.float32)
        self._blank = np.ascontiguousarray(np.broadcast_to(((0.5 - mean_) / std_).astype(np.float32)[:, None, None],
                                                           (3, self.size, self.size)))

    def pixels(self, img: Image.Image) -> np.ndarray:
        """(size, size, 3) uint8 pixels of ``img`` resized with bilinear filtering (what a cache keeps)."""
        if img.size != (self.size, self.size):
            img = img.resize((self.size, self.size), Image.BILINEAR)
        return np.asarray(img, dtype=np.uint8)

    def normalize_into(self, pixels: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Write the normalised (3, size, size) float32 image of (size, size, 3) uint8 ``pixels`` into
        ``out`` (a slice of a batch buffer: no intermediate array) and return it."""
        np.multiply(pixels.transpose(2, 0, 1), self._scale[:, None, None], out=out, casting="unsafe")
        out += self._shift[:, None, None]
        return out

    def array(self, img: Image.Image) -> np.ndarray:
        """(3, size, size) float32 NumPy array of ``img`` (resized with bilinear filtering, normalised)."""
        return self.normalize_into(self.pixels(img), np.empty((3, self.size, self.size), dtype=np.float32))

    def __call__(self, img: Image.Image) -> torch.Tensor:
        return torch.from_numpy(self.array(img))

    def blank_array(self) -> np.ndarray:
        """A mid-grey image after normalisation, as a read-only array (see :meth:`blank`)."""
        return self._blank

    def blank(self) -> torch.Tensor:
        """A mid-grey image after normalisation (what a missing image becomes under policy 'blank')."""
        return torch.from_numpy(self._blank.copy())


# ---------------------------------------------------------------- checking every image before training
IMAGE_CHECK_FILE = "decoded_images.json"
"""File in the image-check cache folder: ``{absolute path: [size, mtime_ns]}`` of images that decoded."""


def check_procedure_images(procedures: Sequence["Procedure"], cache_dir: str | Path | None = None,
                           allow_outside: bool = False, decode: bool = True,
                           decode_hint: str = "") -> tuple[list["Problem"], dict[str, int]]:
    """Check every step image of ``procedures`` before training; returns ``(problems, counts)``.

    * an image path resolving outside its procedure's data folder (the JSONL file's folder) is a
      problem unless ``allow_outside`` (``data.allow_outside_images=true``);
    * with ``decode``, every image is decoded completely (:func:`seqaware.procedure.image_decode_problem`).
      Images that decoded are remembered in ``cache_dir/decoded_images.json`` keyed by absolute
      path with file size and modification time, so a second run only ``stat``\\ s them; a changed
      file is decoded again.

    Problems read ``file:line: record id: steps[i].images[k]: reason`` (the procedure's origin).
    ``counts``: ``images``, ``decoded`` (opened now) and ``cached`` (skipped thanks to the cache).
    """
    from seqaware.io import atomic_open
    from seqaware.procedure import OUTSIDE_OPTION, Problem, image_decode_problem, outside_data_folder, resolve_path

    cache_file = Path(cache_dir) / IMAGE_CHECK_FILE if cache_dir else None
    known: dict[str, list[int]] = {}
    if cache_file is not None and cache_file.is_file():
        try:
            known = json.loads(cache_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}  # a damaged cache is only a slower check
    counts = {"images": 0, "decoded": 0, "cached": 0}
    problems: list[Problem] = []
    added = False
    for proc in procedures:
        file, line = proc.origin or (f"procedure {proc.id}", 0)
        for i, step in enumerate(proc.steps):
            for k, image in enumerate(step.images):
                counts["images"] += 1
                where = f"steps[{i}].images[{k}]"
                if not allow_outside and outside_data_folder(image, proc.root):
                    problems.append(Problem(file, max(line, 1), proc.id, where,
                                            f"image path {image!r} resolves outside the data folder {proc.root} "
                                            f"(set {OUTSIDE_OPTION} to allow it)"))
                    continue
                if not decode:
                    continue
                full = os.path.abspath(resolve_path(image, proc.root))
                try:
                    stat = os.stat(full)
                    key = [stat.st_size, stat.st_mtime_ns]
                except OSError:
                    key = None
                if key is not None and known.get(full) == key:
                    counts["cached"] += 1
                    continue
                counts["decoded"] += 1
                reason = image_decode_problem(full)
                if reason:
                    problems.append(Problem(file, max(line, 1), proc.id, where, reason + decode_hint))
                elif key is not None:
                    known[full] = key
                    added = True
    if added and cache_file is not None:
        with atomic_open(cache_file) as handle:
            json.dump(known, handle)
    return problems, counts
