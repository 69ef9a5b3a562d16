"""The contract between single-stream encoders and pretraining objectives.

Fusion input (a plain ``dict`` of tensors, the keys an encoder reads)::

    input_ids       (B, T)      long   token ids
    attention_mask  (B, T)      long/bool  1 = real token
    text_step       (B, T)      long   step index of each token, -1 for special tokens / padding
    visual_feats    (B, S, P, D) float P patch / region features of the image of each step
    visual_mask     (B, S)      bool   the step has an image
    patch_mask      (B, S, P)   bool   optional: the patch / region is real (region features)

A text-only batch has no visual keys and an image-only batch no text keys.  The encoder returns an
:class:`EncoderOutput`.

Every objective is an ``nn.Module`` with two methods:

``corrupt(batch, generator) -> (fusion_input, targets)``
    Builds the corrupted fusion input (new tensors, the input batch is never modified) and the
    targets.  All randomness comes from ``generator`` so a caller can seed it per sample / rank /
    step.  Masking is vectorised like MAE (``argsort`` of random noise): no Python loop runs over
    samples or patches.
``forward(outputs, targets, **extra) -> (loss, logs)``
    The loss (0-dim tensor) and a dict of logs named ``<objective>_<metric>``.

An objective whose targets come from a second, no-grad encoder pass over the *clean* input (SMRM)
sets ``needs_clean_pass = True`` and receives ``target_states`` in ``forward``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

TEXT_KEYS = ("input_ids", "attention_mask", "text_step")
VISUAL_KEYS = ("visual_feats", "visual_mask", "patch_mask")
# keys indexed by (sample, step, ...) that move together when whole images are swapped
STEP_KEYS = ("visual_feats", "visual_mask", "patch_mask")


@dataclass
class EncoderOutput:
    """What a single-stream encoder returns.

    ``cls``: (B, H) pooled [CLS] state.  ``text_states``: (B, T, H) (None for image-only encoders).
    ``patch_states``: (B, S, P, H) output states of the visual tokens; ``projected_visual``:
    (B, S, P, H) visual features after the encoder's input projection (Linear + LayerNorm), before
    the transformer (both None for text-only encoders).
    """

    cls: torch.Tensor
    text_states: Optional[torch.Tensor] = None
    patch_states: Optional[torch.Tensor] = None
    projected_visual: Optional[torch.Tensor] = None


def uniform(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """U[0, 1) noise drawn from ``generator`` (on the generator's device) and moved to ``device``."""
    return torch.rand(shape, generator=generator, device=generator.device).to(device)


def randint(low: int, high: int, shape: tuple[int, ...], generator: torch.Generator,
            device: torch.device) -> torch.Tensor:
    """Integers in [low, high) drawn from ``generator`` and moved to ``device``."""
    return torch.randint(low, high, shape, generator=generator, device=generator.device).to(device)


def shallow_copy(batch: dict) -> dict:
    """A new dict with the same entries; objectives replace the entries they corrupt."""
    return dict(batch)


def choose_image_pair(visual_mask: torch.Tensor, delta: float, generator: torch.Generator
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample, decide whether to swap (probability ``delta``) and pick two distinct image steps.

    The pair is the first two entries of a uniformly random ordering of the steps that have an
    image (argsort of noise, steps without an image sorted last), so every unordered pair of image
    steps is equally likely.  Samples with fewer than two images are never swapped.

    Returns ``swap (B,) bool``, ``first (B,) long``, ``second (B,) long`` (first != second whenever
    S >= 2; meaningless where ``swap`` is False).
    """
    B, S = visual_mask.shape
    device = visual_mask.device
    has_image = visual_mask.bool()
    eligible = has_image.sum(1) >= 2
    swap = (uniform((B,), generator, device) < delta) & eligible
    noise = uniform((B, S), generator, device).masked_fill(~has_image, 2.0)
    order = noise.argsort(dim=1)
    first = order[:, 0]
    second = order[:, 1] if S >= 2 else order[:, 0]
    return swap, first, second


class Objective(nn.Module):
    """Base class of pretraining objectives (see the module docstring for the contract).

    ``name`` prefixes the logs; ``modalities`` is the set of input modalities the objective needs
    (``"text"`` and/or ``"image"``); ``needs_clean_pass`` asks the caller for a no-grad encoder pass
    over the uncorrupted input whose states are passed to ``forward`` as ``target_states``.
    """

    name: str = "objective"
    modalities: frozenset[str] = frozenset()
    needs_clean_pass: bool = False

    def corrupt(self, batch: dict, generator: torch.Generator) -> tuple[dict, dict]:
        raise NotImplementedError

    def forward(self, outputs: EncoderOutput, targets: dict, **extra) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError


class SwapClassificationObjective(Objective):
    """Shared head and loss of the swap-detection objectives (ISP, PISP).

    A binary classifier on the [CLS] state: ``Linear(H, 2)`` or, with ``head_hidden`` set, an MLP
    ``Linear(H, head_hidden) -> GELU -> Linear(head_hidden, 2)``.  ``targets[f"{name}_labels"]``
    holds 1 for swapped samples and 0 otherwise.
    """

    modalities = frozenset({"image"})

    def __init__(self, hidden_size: int, delta: float = 0.5, head_hidden: Optional[int] = None):
        super().__init__()
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"{self.name}: delta must be in [0, 1], got {delta}")
        self.delta = float(delta)
        if head_hidden:
            self.head = nn.Sequential(nn.Linear(hidden_size, head_hidden), nn.GELU(), nn.Linear(head_hidden, 2))
        else:
            self.head = nn.Linear(hidden_size, 2)

    def forward(self, outputs: EncoderOutput, targets: dict, **extra) -> tuple[torch.Tensor, dict]:
        labels = targets[f"{self.name}_labels"]
        logits = self.head(outputs.cls)
        loss = F.cross_entropy(logits, labels)
        acc = (logits.argmax(-1) == labels).float().mean()
        return loss, {f"{self.name}_loss": loss.detach(), f"{self.name}_acc": acc.detach()}
