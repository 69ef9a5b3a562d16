"""Batching view items: tokenised step texts, step images and masks.

A batch (``B`` instances, up to ``S`` steps, ``L`` tokens) is a dict::

    input_ids, attention_mask   (B, S, L)  long    -- one tokenised text per step ("" for padding)
    step_mask                   (B, S)     bool    -- which step slots are real
    pixel_values                (B, S, 3, H, W)    -- when images are used (padding/missing: blank)
    image_mask                  (B, S)     bool    -- step has a usable image
    boxes, box_mask             (B, S, R, 4), (B, S, R) -- when max_boxes > 0: object boxes scaled to [0, 1]
    visual_feats, patch_mask    (B, S, 1+R, D+7), (B, S, 1+R) -- with region_features: cached detector
                                features (whole image + R regions, box geometry in the last 7 dims;
                                seqaware.encoders.regions), instead of boxes / box_mask
    gold                        (B, S)     long    -- gold[b, k] = input position of the k-th step (-1 pad)
    num_steps                   (B,)       long
    meta                        list of dicts: id, step_index, references, dag, category
    <field>                     each of the view's ``fields`` (``TaskView.fields``): ``ViewItem.meta[field]`` of
                                every item, a tensor (B, ...) when they are numbers or tensors of one shape,
                                else the list of values
"""
from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from data_modules.images import IMAGENET_MEAN, IMAGENET_STD, ImageLoadError, ImageTransform, open_rgb
from data_modules.views import ViewItem
from seqaware.procedure import resolve_path

if TYPE_CHECKING:
    from seqaware.encoders.regions import RegionFeatureCache

log = logging.getLogger(__name__)

#: keys the collator fills itself; a view's ``fields`` may not take them
BATCH_KEYS = frozenset({"step_mask", "gold", "num_steps", "meta", "input_ids", "attention_mask", "pixel_values",
                        "image_mask", "boxes", "box_mask", "visual_feats", "patch_mask"})

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def first_sentences(text: str, max_sentences: int) -> str:
    """The first ``max_sentences`` sentences of ``text`` (split after ., ! or ? and a space)."""
    if max_sentences <= 0:
        return text
    return " ".join(_SENTENCE_END.split(text.strip())[:max_sentences])


def batch_field(values: list[Any]) -> Any:
    """One declared field of a batch's items: a tensor (B,) of numbers (``torch.tensor``: bools stay bool,
    ints long, floats float32), tensors of one shape stacked (B, ...), anything else the list as is."""
    if values and all(isinstance(v, (bool, int, float, np.bool_, np.number)) for v in values):
        return torch.tensor(values)
    if values and all(isinstance(v, torch.Tensor) for v in values) and len({v.shape for v in values}) == 1:
        return torch.stack(values)
    return values


class StepTokens:
    """Step texts -> token ids (special tokens included, truncated), each distinct text tokenised once.

    A dataset's step texts do not change between epochs, so re-running the tokenizer on them every
    batch is wasted loader time (the collators of ``order_baseline`` and ``teo_plan_head_catbench``
    spent a quarter and most of theirs doing so).  :meth:`batch` pads to the longest text on the
    tokenizer's padding side with its pad id: the same tensors as ``tokenizer(texts,
    padding="longest", truncation=True, max_length=max_tokens, return_tensors="pt")``.
    ``max_entries`` caps the cache (texts beyond it are tokenised every time).  Each loader worker
    keeps its own cache, which lasts beyond an epoch only with ``data.persistent_workers=true``.
    """

    def __init__(self, tokenizer: Any, max_entries: int = 500_000):
        self.tokenizer = tokenizer
        self.max_entries = max_entries
        self._ids: dict[tuple[str, int, int], list[int]] = {}

    def ids(self, texts: Sequence[str], max_tokens: int, max_sentences: int = 0) -> list[list[int]]:
        """Token ids of each text's first ``max_sentences`` sentences (:func:`first_sentences`), at most
        ``max_tokens`` of them."""
        keys = [(t, max_tokens, max_sentences) for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._ids))
        if missing:
            new = self.tokenizer([first_sentences(t, max_sentences) for t, _, _ in missing],
                                 truncation=True, max_length=max_tokens)["input_ids"]
            fresh = dict(zip(missing, new))
            if len(self._ids) + len(fresh) <= self.max_entries:
                self._ids.update(fresh)
            return [self._ids[k] if k in self._ids else fresh[k] for k in keys]
        return [self._ids[k] for k in keys]

    def batch(self, texts: Sequence[str], max_tokens: int, max_sentences: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` and ``attention_mask``, (N, L) long, padded to the longest of the N texts."""
        ids = self.ids(texts, max_tokens, max_sentences)
        width = max((len(x) for x in ids), default=0)
        input_ids = np.full((len(ids), width), self.tokenizer.pad_token_id, dtype=np.int64)
        attention_mask = np.zeros((len(ids), width), dtype=np.int64)
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        for row, x in enumerate(ids):
            start = width - len(x) if left else 0
            input_ids[row, start:start + len(x)] = x
            attention_mask[row, start:start + len(x)] = 1
        return torch.from_numpy(input_ids), torch.from_numpy(attention_mask)


class StepCollator:
    """Turns a list of :class:`ViewItem` into tensors.

    Args:
        tokenizer: a Hugging Face tokenizer (``None`` with ``use_text=False``).
        max_steps: steps per instance (views already cap this; kept as a guard).
        max_sentences / max_tokens: per-step text caps (Wu et al.: 5 sentences, 60 tokens).
        image_size, image_mean, image_std: the visual backbone's input size and normalisation.
        use_text / use_images: which modalities to load.
        missing_image: ``error`` raises naming the file; ``blank`` uses a grey image, marks
            ``image_mask`` False and counts it in :attr:`missing_images` (logged).
        max_boxes: object boxes per step to return (0: none); with ``region_features``, R, the
            detector regions kept per image (highest scores first).
        region_features: folder written by ``scripts/tools/extract_features.py --out``: attach every
            usable step image's cached features (:class:`~seqaware.encoders.regions.RegionFeatureCache`)
            as ``visual_feats`` / ``patch_mask`` (for encoders without a visual backbone,
            ``encoder@model.encoder=visualbert_detector``).  Images are still opened, so the
            ``missing_image`` policy applies; a step without a usable image gets zero features and
            an all-False ``patch_mask``; an image without a cache file is an error naming both.
            Ignored without ``use_images``.
        image_cache_mb: memory for decoded, resized step images (uint8), so an image is decoded once
            per process rather than once per epoch (least recently used evicted first; 0: no cache).
            A 128-px image takes 48 KiB, a 224-px one 147 KiB; each loader worker keeps its own, which
            lasts beyond an epoch only with ``data.persistent_workers=true``.
        fields: keys of each item's ``meta`` carried into the batch under the same name (the task view's
            ``fields``, set by the data module; :func:`batch_field`).
    """

    def __init__(self, tokenizer: Any = None, max_steps: int = 5, max_sentences: int = 5, max_tokens: int = 60,
                 image_size: int = 224, image_mean: Sequence[float] = IMAGENET_MEAN, image_std: Sequence[float] = IMAGENET_STD,
                 use_text: bool = True, use_images: bool = True, missing_image: str = "error", max_boxes: int = 0,
                 region_features: str | None = None, image_cache_mb: float = 512, fields: Sequence[str] = ()):
        taken = sorted(set(fields) & BATCH_KEYS)
        if taken:
            raise ValueError(f"the task view's fields {taken} name batch keys the collator fills itself; "
                             f"rename them (the collator's keys: {', '.join(sorted(BATCH_KEYS))})")
        self.fields = tuple(fields)
        if image_cache_mb < 0:
            raise ValueError(f"data.collator.image_cache_mb must be >= 0 (0: no cache), got {image_cache_mb}")
        if missing_image not in ("error", "blank"):
            raise ValueError(f"data.collator.missing_image must be 'error' or 'blank', got {missing_image!r}")
        if use_text and tokenizer is None:
            raise ValueError("data.collator.use_text=true needs a tokenizer (data.tokenizer)")
        self.tokenizer = tokenizer
        self.tokens = StepTokens(tokenizer) if tokenizer is not None else None
        self.max_steps = max_steps
        self.max_sentences = max_sentences
        self.max_tokens = max_tokens
        self.transform = ImageTransform(image_size, image_mean, image_std)
        self._decoded: OrderedDict[str, tuple[np.ndarray, tuple[int, int]]] = OrderedDict()
        self._decoded_budget = int(image_cache_mb * 2 ** 20)
        self._decoded_bytes = 0
        self.use_text = use_text
        self.use_images = use_images
        self.missing_image = missing_image
        self.max_boxes = max_boxes
        self.missing_images = 0
        self.region_cache: RegionFeatureCache | None = None
        if region_features and use_images:
            if max_boxes < 1:
                raise ValueError(f"data.collator.region_features={region_features} needs data.collator.max_boxes >= 1 "
                                 f"(the detector regions kept per image, e.g. 36), got {max_boxes}")
            from seqaware.encoders.regions import RegionFeatureCache  # torchvision: only when used

            self.region_cache = RegionFeatureCache(region_features, max_regions=max_boxes)

    def _decode(self, path: str) -> tuple[np.ndarray, tuple[int, int]]:
        """The image's resized uint8 pixels and its original (width, height), from the cache when there."""
        hit = self._decoded.get(path)
        if hit is not None:
            self._decoded.move_to_end(path)
            return hit
        img = open_rgb(path)
        entry = (self.transform.pixels(img), img.size)
        if self._decoded_budget:
            self._decoded[path] = entry
            self._decoded_bytes += entry[0].nbytes
            while self._decoded_bytes > self._decoded_budget:
                self._decoded_bytes -= self._decoded.popitem(last=False)[1][0].nbytes
        return entry

    def _image(self, item: ViewItem, step, out: np.ndarray) -> tuple[bool, tuple[int, int] | None]:
        """Write the step's first image, normalised, into ``out`` (3, H, W); whether it is usable, its size."""
        if not step.images:
            out[...] = self.transform.blank_array()
            return False, None
        path = self._image_path(item, step)
        try:
            pixels, size = self._decode(str(path))
        except ImageLoadError as err:
            if self.missing_image == "error":
                raise ImageLoadError(f"procedure {item.procedure_id}: {err} (set data.collator.missing_image=blank to use a blank image)") from err
            self.missing_images += 1
            log.warning("procedure %s: %s -> blank image (%d so far)", item.procedure_id, err, self.missing_images)
            out[...] = self.transform.blank_array()
            return False, None
        self.transform.normalize_into(pixels, out)
        return True, size

    @staticmethod
    def _image_path(item: ViewItem, step):
        return resolve_path(step.images[0], item.root)

    def _region_features(self, items: list[ViewItem], image_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached detector features of every usable step image: ``(B, S, 1+R, D+7)``, ``(B, S, 1+R)``."""
        assert self.region_cache is not None
        where = image_mask.nonzero().tolist()
        records = []
        for b, s in where:  # file reads, one per image
            it = items[b]
            try:
                records.append(self.region_cache.load(self._image_path(it, it.steps[s])))
            except (FileNotFoundError, ValueError) as err:
                raise type(err)(f"procedure {it.procedure_id}, step {it.step_index[s]}: {err}") from err
        feats, geometry, mask = self.region_cache.stack(records, dim=self.region_cache.feature_dim())
        B, S = image_mask.shape
        visual = torch.zeros(B, S, feats.shape[1], feats.shape[2] + geometry.shape[2])
        patch_mask = torch.zeros(B, S, feats.shape[1], dtype=torch.bool)
        if where:
            visual[image_mask] = torch.cat([feats, geometry], dim=-1)
            patch_mask[image_mask] = mask
        return visual, patch_mask

    def text_length(self, item: ViewItem) -> int:
        """Tokens of ``item``'s steps packed into one sequence (``[CLS] s_0 [SEP] s_1 [SEP] ...``, each step
        capped as :meth:`__call__` caps it): the length a joint encoder pass pads to, and the length proxy
        of ``data.bucket_by_length``.  Without text: the number of steps."""
        steps = item.steps[: self.max_steps]
        if not self.use_text:
            return len(steps)
        ids = self.tokens.ids([s.text or "" for s in steps], self.max_tokens, self.max_sentences)
        return 1 + sum(max(len(x) - 1, 0) for x in ids)

    def pair_tokens(self, item: ViewItem) -> int:
        """Text tokens of ``item``'s n(n-1) ordered step pairs as BERSON's pairwise encoding passes them: pair
        (i, j) is step i's tokens and step j's without its CLS (``[CLS] s_i [SEP] s_j [SEP]``), plus the second
        separator of a RoBERTa / MPNet pair (``<s> s_i </s></s> s_j </s>``); each step capped as
        :meth:`__call__` caps it.  Without text: the number of pairs."""
        steps = item.steps[: self.max_steps]
        n = len(steps)
        if not self.use_text:
            return n * (n - 1)
        ids = self.tokens.ids([s.text or "" for s in steps], self.max_tokens, self.max_sentences)
        if not hasattr(self, "_pair_extra"):    # the tokenizer's pair format: the tokens a pair adds to a + b[1:]
            single = len(self.tokenizer("a")["input_ids"])
            self._pair_extra = len(self.tokenizer("a", "b")["input_ids"]) - (2 * single - 1)
        return n * (n - 1) * (1 + self._pair_extra) + 2 * (n - 1) * sum(len(x) - 1 for x in ids)

    def __call__(self, items: list[ViewItem]) -> dict[str, Any]:
        batch_size = len(items)
        num_steps = max(len(it.steps) for it in items)
        if num_steps > self.max_steps:
            raise ValueError(f"instance with {num_steps} steps exceeds data.collator.max_steps={self.max_steps}")
        step_mask = torch.zeros(batch_size, num_steps, dtype=torch.bool)
        gold = torch.full((batch_size, num_steps), -1, dtype=torch.long)
        for b, it in enumerate(items):
            step_mask[b, : len(it.steps)] = True
            gold[b, : len(it.gold)] = torch.tensor(it.gold)
        batch: dict[str, Any] = {
            "step_mask": step_mask,
            "gold": gold,
            "num_steps": step_mask.sum(1),
            "meta": [
                {"id": it.procedure_id, "step_index": it.step_index, "references": it.references,
                 "dag": it.dag, "category": it.category}
                for it in items
            ],
        }
        for name in self.fields:
            missing = [it.procedure_id for it in items if name not in it.meta]
            if missing:
                raise ValueError(f"the task view declares the field {name!r}, but the items of procedures {missing} "
                                 "have no such key in their meta")
            batch[name] = batch_field([it.meta[name] for it in items])
        if self.use_text:
            texts = []
            for it in items:
                texts += [s.text or "" for s in it.steps]
                texts += [""] * (num_steps - len(it.steps))
            input_ids, attention_mask = self.tokens.batch(texts, self.max_tokens, self.max_sentences)
            batch["input_ids"] = input_ids.view(batch_size, num_steps, -1)
            batch["attention_mask"] = attention_mask.view(batch_size, num_steps, -1)
        if self.use_images:
            size = self.transform.size
            pixels = np.empty((batch_size, num_steps, 3, size, size), dtype=np.float32)  # NumPy: see ImageTransform
            image_mask = torch.zeros(batch_size, num_steps, dtype=torch.bool)
            object_boxes = bool(self.max_boxes) and self.region_cache is None  # else max_boxes counts detector regions
            if object_boxes:
                boxes = torch.zeros(batch_size, num_steps, self.max_boxes, 4)
                box_mask = torch.zeros(batch_size, num_steps, self.max_boxes, dtype=torch.bool)
            blank = self.transform.blank_array()
            for b, it in enumerate(items):
                for s in range(num_steps):
                    if s >= len(it.steps):
                        pixels[b, s] = blank
                        continue
                    step = it.steps[s]
                    image_mask[b, s], img_size = self._image(it, step, pixels[b, s])
                    if object_boxes and img_size is not None and step.boxes:
                        w, h = img_size
                        kept = torch.tensor(step.boxes[: self.max_boxes], dtype=torch.float32)
                        kept /= torch.tensor([w, h, w, h], dtype=torch.float32)
                        boxes[b, s, : len(kept)] = kept.clamp(0, 1)
                        box_mask[b, s, : len(kept)] = True
            batch["pixel_values"] = torch.from_numpy(pixels)
            batch["image_mask"] = image_mask
            if self.region_cache is not None:
                batch["visual_feats"], batch["patch_mask"] = self._region_features(items, image_mask)
            elif object_boxes:
                batch["boxes"], batch["box_mask"] = boxes, box_mask
        return batch
