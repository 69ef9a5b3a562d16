"""How TEO images become InternVL inputs (tiling), and the record a trained model carries.

Tiling, ``data.image_tiles`` (the one config value; ``model.image_tiles`` follows it): the most tiles
one image is cut into. ``1``: the whole image resized to one tile. ``N > 1``: InternVL's dynamic tiling,
the grid of at most ``N`` tiles closest to the image's aspect ratio (each tile the vision tower's input
size, 448 px for InternVL3.5, 56 px for the tiny models) plus a thumbnail of the whole image when the
grid has more than one tile. Every image costs ``image_seq_length`` tokens per tile (256 at 448 px).

Default 12: MATEO does not say how images were preprocessed; appendix A.1 says the open models ran in
the Hugging Face framework from the ``OpenGVLab/InternVL3_5-8B-HF`` checkpoint, whose processor tiles by
default, as InternVL documents it (the InternVL3.5 model card: dynamic tiling up to ``max_num=12`` tiles
+ a thumbnail; transformers' ``InternVLProcessor``: ``crop_to_patches=True`` with the GOT-OCR2 image
processor's ``min_patches=1``, ``max_patches=12``). The same value is used for fine-tuning (MATEO
section 5.4 and Table 6 say nothing of it either).

:func:`tiling_kwargs` is the one place that turns the value into processor arguments: the training
collator (:class:`data_modules.teo_pairs.TeoChatCollator`, so also the in-training validation and test)
and the prompting runner (:class:`seqaware.vlm.runner.HFGenerator`, ``scripts/tools/eval_teo.py``) both pass it
on every call. A trained model carries the value: :func:`write_record` puts ``seqaware_inputs.json`` (tiles,
training prompt, base model) beside the saved adapter and the merged model, :func:`apply_tiling` makes the
processor saved with them tile the same way by default, and ``scripts/tools/eval_teo.py`` given such a folder
reads the record (:func:`read_record`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from seqaware.io import atomic_open

DEFAULT_IMAGE_TILES = 12
RECORD_FILE = "seqaware_inputs.json"


def check_image_tiles(image_tiles: Any, key: str = "data.image_tiles") -> int:
    """``image_tiles`` as an int >= 1; ValueError naming ``key`` otherwise."""
    if isinstance(image_tiles, bool) or not isinstance(image_tiles, int) or image_tiles < 1:
        raise ValueError(f"{key} must be a whole number of tiles >= 1 (1: one tile per image; "
                         f"{DEFAULT_IMAGE_TILES}: InternVL's dynamic tiling), got {image_tiles!r}")
    return image_tiles


def tiling_kwargs(image_tiles: int) -> dict[str, Any]:
    """The InternVL processor's ``images_kwargs`` for at most ``image_tiles`` tiles per image.

    Always explicit: ``InternVLProcessor`` tiles by default (``crop_to_patches=True``) whatever its image
    processor's saved setting says, so a call without them would not follow the config.
    """
    tiles = check_image_tiles(image_tiles)
    return {"crop_to_patches": tiles > 1, "min_patches": 1, "max_patches": tiles}


def apply_tiling(processor: Any, image_tiles: int) -> Any:
    """Make ``processor`` tile as ``image_tiles`` says when called without arguments, also once saved
    (``save_pretrained``): its image processor's ``max_patches`` (which the processor's own default
    ``crop_to_patches=True`` reads) and ``crop_to_patches`` / ``min_patches``. Returns ``processor``."""
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is not None:
        for key, value in tiling_kwargs(image_tiles).items():
            setattr(image_processor, key, value)
    return processor


def write_record(folder: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """Write ``record`` (JSON) as ``<folder>/seqaware_inputs.json``; returns the path."""
    path = Path(folder) / RECORD_FILE
    with atomic_open(path) as handle:
        handle.write(json.dumps(dict(record), indent=1, sort_keys=True) + "\n")
    return path


def read_record(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The record saved with a trained model (``<folder>/seqaware_inputs.json``), None when there is none."""
    path = Path(folder) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: expected a JSON object")
    if "image_tiles" in record:
        check_image_tiles(record["image_tiles"], key=f"{path}: image_tiles")
    return record
