"""Sequence encoders: a registry and a factory, like timm's ``create_model``.

``ENCODERS`` (a :class:`registry.Registry`) holds an encoder factory under each name
``model.encoder.name`` takes; a factory is registered with ``@register_encoder("NAME")`` here or in
any module of this package (the registry imports them all when first read).  Built in:

``text``        :class:`seqaware.encoders.text.TextEncoder` -- a HF text encoder (RoBERTa / BERT /
                MiniLM) over the packed step texts.
``clipvil``     :class:`~seqaware.encoders.fusion.SingleStreamEncoder` over text + the visual
                backbone's patch / grid tokens (CLIP-ViL: CLS + 49 ViT-B/32 patches).
``visualbert``  the same over text + RoIAlign region features of the object boxes plus a
                whole-image feature, with box geometry (VisualBERT on the synthetic data).
``image``       the same without text: a learned CLS + the images' tokens.

``create_encoder(name, ckpt=None, visual_ckpt=None, **cfg)`` builds one; ``ckpt`` then loads the
whole encoder from an earlier stage (``model.encoder.ckpt=PATH``: a Lightning checkpoint with
``encoder.*`` keys or a bare ``encoder.pt``) and ``visual_ckpt`` only its visual tower
(``model.encoder.visual_ckpt=PATH``), see :func:`seqaware.encoders.checkpoint.load_encoder_checkpoint`.

The built-in factories import their modules when called, so importing this package is cheap.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from torch import nn

from registry import Registry
from seqaware.encoders.base import SequenceEncoder, fusion_input, pack_steps
from seqaware.encoders.checkpoint import load_encoder_checkpoint

__all__ = ["ENCODERS", "register_encoder", "create_encoder", "list_encoders", "load_encoder_checkpoint",
           "SequenceEncoder", "fusion_input", "pack_steps"]

ENCODERS: Registry = Registry("encoder", package="seqaware.encoders")


def register_encoder(name: str) -> Callable[[Callable[..., SequenceEncoder]], Callable[..., SequenceEncoder]]:
    """Decorator registering an encoder factory (a class or function returning a SequenceEncoder)."""
    return ENCODERS.register(name)


def list_encoders() -> list[str]:
    return ENCODERS.names()


def create_encoder(name: str, ckpt: Optional[str] = None, visual_ckpt: Optional[str] = None,
                   ckpt_new_layers: str | list[str] = "keep", **cfg: Any) -> SequenceEncoder:
    """Build the registered encoder ``name`` from its config values, then load its weights.

    This is the one place encoder weights from an earlier stage are loaded (every module builds its
    encoder through it): ``visual_ckpt`` initialises only the visual tower (``visual.*``, e.g.
    CLIP-ViL's from an image-only ``clip_image_pretrain`` run), then ``ckpt`` the whole encoder.
    ``ckpt_new_layers`` (``model.encoder.ckpt_new_layers``) says what ``ckpt`` gives the layers the encoder
    adds to its pretrained text / visual models (:meth:`~seqaware.encoders.base.SequenceEncoder.new_parameters`:
    visual projection and LayerNorm, step embedding, ...): ``keep`` their values from ``ckpt``; ``fresh`` this
    run's own draw of them (so ``ckpt`` gives the towers only, and a run with and one without ``ckpt`` start
    those layers alike); ``order`` this run's draw of the layers that embed the order the steps are presented
    in (:data:`ORDER_LAYERS`: the step embedding, where the encoder has one), the others kept; or a list of
    their names (``[step_embedding]``) drawn fresh, the others kept.

    Why not ``keep``: pretraining presents every sequence in its authored order, so a pretrained step embedding
    has learnt "the k-th step presented is the k-th step done"; an ordering fine-tune presents the steps
    shuffled.  ``berson_finetune`` takes ``fresh`` (every added layer this run's draw): over 5 seeds with one
    pretraining each, level with N on the default world at k = 8 and on the hard world with all labels, where
    ``order`` lost 16.5 and 2.5 PMR points; ``order`` wins on the hard world at k = 8
    (docs/results/label_efficiency.md).
    """
    encoder = ENCODERS.lookup(name, "model.encoder.name")(**cfg)
    if visual_ckpt:
        if not isinstance(getattr(encoder, "visual", None), nn.Module):
            raise ValueError(f"model.encoder.visual_ckpt={visual_ckpt}: the {name} encoder has no visual tower "
                             "'visual' (a text-only encoder, or backbones.visual: null); drop visual_ckpt")
        load_encoder_checkpoint(encoder, visual_ckpt, submodule="visual")
    if ckpt:
        load_encoder_checkpoint(encoder, ckpt, fresh=new_layer_keys(encoder, ckpt_new_layers))
    return encoder


ORDER_LAYERS = ("step_embedding",)
"""The new layers that embed the order the steps are presented in (``model.encoder.ckpt_new_layers=order``)."""


def new_layer_keys(encoder: SequenceEncoder, which: str | list[str]) -> list[str]:
    """The state-dict keys of the new layers ``which`` names (``keep``: none; ``fresh``: all of them; ``order``:
    those of :data:`ORDER_LAYERS` the encoder has; a list: those whose attribute name is listed); an unknown choice
    or name is an error listing the names."""
    ids = {id(p) for p in encoder.new_parameters()}
    keys = [k for k, p in encoder.named_parameters() if id(p) in ids]
    names = sorted({k.split(".")[0] for k in keys})
    if which == "keep":
        return []
    if which == "fresh":
        return keys
    if which == "order":
        return [k for k in keys if k.split(".")[0] in ORDER_LAYERS]
    if isinstance(which, str) or not all(isinstance(n, str) for n in which):
        raise ValueError(f"model.encoder.ckpt_new_layers must be keep, fresh, order or a list of new layers {names}, "
                         f"got {which!r}")
    unknown = sorted(set(which) - set(names))
    if unknown:
        raise ValueError(f"model.encoder.ckpt_new_layers names {unknown}, not layers this encoder adds: {names}")
    return [k for k in keys if k.split(".")[0] in set(which)]


@register_encoder("text")
def text_encoder(step_embedding: bool = False, visual_positions: str = "image", **cfg: Any) -> SequenceEncoder:
    """Text-only HF encoder (arguments of :class:`seqaware.encoders.text.TextEncoder`).

    ``step_embedding`` and ``visual_positions`` are accepted so presets can set them for every
    encoder alike (the wu2022 preset turns the step embedding off); the text-only encoder has no
    step embedding, so ``true`` is an error, and no visual tokens, so ``visual_positions`` is unused.
    """
    from seqaware.encoders.text import TextEncoder

    if step_embedding:
        raise ValueError("the text encoder has no step embedding (model.encoder.step_embedding must be false); "
                         "use the clipvil / visualbert / image encoders for step-index embeddings")
    return TextEncoder(**cfg)


@register_encoder("clipvil")
def clipvil_encoder(**cfg: Any) -> SequenceEncoder:
    """Text + patch / grid tokens of a visual backbone (CLIP-ViL)."""
    from seqaware.encoders.fusion import SingleStreamEncoder

    cfg.setdefault("modality", "multimodal")
    return SingleStreamEncoder(**cfg)


@register_encoder("visualbert")
def visualbert_encoder(**cfg: Any) -> SequenceEncoder:
    """Text + region features (RoIAlign in object boxes, or cached detector features) + geometry."""
    from seqaware.encoders.fusion import SingleStreamEncoder

    cfg.setdefault("modality", "multimodal")
    if cfg.get("visual") is not None and cfg.get("regions") is None:
        cfg["regions"] = {}
    cfg.setdefault("geometry", True)
    return SingleStreamEncoder(**cfg)


@register_encoder("image")
def image_encoder(**cfg: Any) -> SequenceEncoder:
    """Images only: a learned CLS + every image's tokens (no text input)."""
    from seqaware.encoders.fusion import SingleStreamEncoder

    cfg.setdefault("modality", "image")
    return SingleStreamEncoder(**cfg)
