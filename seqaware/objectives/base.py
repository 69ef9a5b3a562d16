"""What every pretraining objective is and knows (Wu et al., ACL 2022, sec. 4.1-4.2).

An objective works on the encoders' fusion input and output (:mod:`seqaware.encoders.contract`):

``corrupt(batch, generator) -> (fusion_input, targets)``
    Builds the corrupted fusion input (new tensors, the input batch is never modified) and the
    targets.  All randomness comes from ``generator`` so a caller can seed it per sample / rank /
    step.  Masking is vectorised like MAE (``argsort`` of random noise): no Python loop runs over
    samples or patches.  ``target_layout`` says how each target is laid out (``text`` (B, T, ...),
    ``step`` (B, S, ...) or ``sample`` (B, ...)) and padded, so a caller can corrupt samples one by
    one and pad them back (:func:`seqaware.objectives.corruption.corrupt_per_sample`).
``outcomes(outputs, targets, **extra) -> Outcomes``
    One entry per prediction target (a masked token, a sequence's swap label, a masked region):
    its loss, whether it was predicted right and the batch row it belongs to.  The base class
    derives both reductions from it:
``forward(outputs, targets, **extra) -> (loss, logs)``
    The mean loss over the batch's targets (0-dim tensor, what training minimises) and logs named
    ``<objective>_<metric>`` (``_loss``, ``_acc`` and any extra per-target value).
``sample_stats(outputs, targets, **extra) -> {stat: (B,)}``
    Per batch row, the sums of the targets' ``loss`` / ``correct`` / extras and their ``count``:
    evaluation adds them up over the split (each sequence once, whatever the batching or the
    number of processes) and divides at the end.

An objective whose targets come from a second, no-grad encoder pass over the *clean* input (SMRM)
sets ``needs_clean_pass = True`` and receives ``target_states`` in ``forward``.

What an objective corrupts (``corrupts``, a subset of :data:`CORRUPTIONS`) fixes when it runs, so
that every objective's targets stay aligned whatever the set.  The module applies the objectives of
a step in the order of :data:`CORRUPTIONS` (:func:`seqaware.objectives.corruption.corruption_order`):
first those that *move* content (``step_order``, then ``images``, then ``patches``), then those that
*mask* it (``tokens``, then ``regions``).  So MLM's labels are the tokens at their positions after
steps moved, a swap label stays true after masking, and a clean pass (``needs_clean_pass``) sees the
input after every move and before any mask.  An objective may change only the fusion entries of
the kinds it declares (checked at every corruption: anything else raises, naming the entries).

It also says how it is built from the encoder (:meth:`Objective.from_encoder`), what its mean loss
averages over (:meth:`Objective.loss_count`, for the exact global-batch loss under DDP) and how its
outcome is shown to a person (:meth:`Objective.show`, the W&B sample table).  The pretraining module
loops over the enabled objectives and never names one; a new objective is one class registered
with :func:`seqaware.objectives.register_objective` and one entry of ``configs/objectives/``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

# the encoder contract, re-exported for objectives written against it
from seqaware.encoders.contract import STEP_KEYS, TEXT_KEYS, VISUAL_KEYS, EncoderOutput  # noqa: F401


CORRUPTIONS: dict[str, tuple[str, ...]] = {
    "step_order": (*TEXT_KEYS, "token_type_ids", *STEP_KEYS),
    "images": STEP_KEYS,
    "patches": ("visual_feats", "patch_mask"),
    "tokens": ("input_ids",),
    "regions": ("visual_feats", "patch_mask"),
}
"""What an objective can corrupt, in the order the module applies them (moves, then masks), each with
the fusion entries it may change: ``step_order`` moves whole steps (their tokens and every per-step
entry), ``images`` whole images between steps (ISP), ``patches`` patches between images (PISP),
``tokens`` masks or replaces token ids (MLM), ``regions`` masks visual features (SMRM)."""

MOVES = ("step_order", "images", "patches")
"""The kinds that move content; a clean pass sees the input after them and before the others."""


def uniform(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """U[0, 1) noise drawn from ``generator`` (on the generator's device) and moved to ``device``."""
    # float32 whatever the default dtype (bf16-true runs the step under bfloat16): the same draws in every precision
    return torch.rand(shape, generator=generator, device=generator.device, dtype=torch.float32).to(device)


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


@dataclass
class Outcomes:
    """Per prediction target (N of them in a batch): ``loss (N,)`` (attached to the graph),
    ``correct (N,)`` bool, ``sample (N,)`` long, the batch row of each target, and ``extras``:
    other per-target values (N,) averaged like the accuracy (e.g. SMRM's number of candidates)."""

    loss: torch.Tensor
    correct: torch.Tensor
    sample: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


class Objective(nn.Module):
    """Base class of pretraining objectives (see the module docstring for the contract).

    ``name`` prefixes the logs; ``modalities`` is the set of input modalities the objective needs
    (``"text"`` and/or ``"image"``); ``needs_clean_pass`` asks the caller for a no-grad encoder pass
    over the uncorrupted input whose states are passed to ``forward`` as ``target_states``.
    """

    name: str = "objective"
    modalities: frozenset[str] = frozenset()
    needs_clean_pass: bool = False
    always_on: ClassVar[bool] = False
    """Runs at every step beside the one drawn objective (MLM in Wu et al.'s turn-taking)."""
    target_layout: ClassVar[dict[str, tuple[str, Any]]] = {}
    """Every target key's layout (``text`` | ``step`` | ``sample``) and padding value."""
    corrupts: ClassVar[Optional[frozenset[str]]] = None
    """What :meth:`corrupt` changes: kinds of :data:`CORRUPTIONS` (an empty set: nothing). Required:
    the module refuses an objective that does not say, since the order of corruptions depends on it."""

    @classmethod
    def from_encoder(cls, encoder: nn.Module, **kwargs) -> "Objective":
        """The objective for ``encoder`` with the config's ``kwargs`` (default: its hidden size)."""
        kwargs.setdefault("hidden_size", encoder.hidden_size)
        return cls(**kwargs)

    def corrupt(self, batch: dict, generator: torch.Generator) -> tuple[dict, dict]:
        raise NotImplementedError

    def loss_count(self, targets: dict) -> torch.Tensor:
        """How many targets the batch's mean loss averages over (0-dim tensor)."""
        raise NotImplementedError(f"objective {self.name!r} defines no loss_count (needed by "
                                  "model.loss_normalization=global; or set it to local)")

    @torch.no_grad()
    def show(self, outputs: EncoderOutput, targets: dict, rows: int,
             decode: Callable[[list[int]], list[str]]) -> tuple[list[str], list[str]]:
        """Target and prediction of the first ``rows`` sequences as short strings (the W&B sample
        table); ``decode`` turns token ids into tokens.  Default: the per-sequence accuracy."""
        stats = self.sample_stats(outputs, targets)
        hits, count = stats["correct"][:rows].tolist(), stats["count"][:rows].tolist()
        return [f"{int(c)} targets" for c in count], [f"{int(h)} right" for h in hits]

    def outcomes(self, outputs: EncoderOutput, targets: dict, **extra) -> Outcomes:
        raise NotImplementedError

    def chance(self, stats: dict[str, float]) -> Optional[float]:
        """The accuracy a model that ignores its input would get on a split, from the split's
        per-target means ``stats`` (``acc``, ``loss`` and the extras of :meth:`outcomes`): the bar
        an objective must clear to have learned anything.  Default: the ``chance`` extra, if any."""
        return stats.get("chance")

    def forward(self, outputs: EncoderOutput, targets: dict, **extra) -> tuple[torch.Tensor, dict]:
        """Mean loss over the batch's targets and the logs; a batch without targets gives a zero
        loss that is still attached to the graph (DDP's reducer expects every head's gradient)."""
        out = self.outcomes(outputs, targets, **extra)
        n = max(out.loss.numel(), 1)
        loss = out.loss.sum() / n
        logs = {f"{self.name}_loss": loss.detach(), f"{self.name}_acc": out.correct.float().sum() / n}
        logs.update({f"{self.name}_{k}": v.detach().float().sum() / n for k, v in out.extras.items()})
        return loss, logs

    @torch.no_grad()
    def sample_stats(self, outputs: EncoderOutput, targets: dict, **extra) -> dict[str, torch.Tensor]:
        """Per batch row (B,) float64: summed ``loss``, ``correct`` and extras, and ``count``."""
        out = self.outcomes(outputs, targets, **extra)
        rows = outputs.cls.shape[0]

        def per_row(values: torch.Tensor) -> torch.Tensor:
            return torch.zeros(rows, dtype=torch.float64, device=values.device).index_add_(
                0, out.sample, values.detach().double())

        stats = {"loss": per_row(out.loss), "correct": per_row(out.correct),
                 "count": per_row(torch.ones_like(out.loss))}
        stats.update({k: per_row(v) for k, v in out.extras.items()})
        return stats


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

    def loss_count(self, targets: dict) -> torch.Tensor:
        labels = targets[f"{self.name}_labels"]
        return torch.tensor(labels.shape[0], device=labels.device)

    def chance(self, stats: dict[str, float]) -> Optional[float]:
        """The better constant answer's accuracy: ``max(p, 1 - p)``, p the split's measured share of swapped
        sequences: ``delta`` times the share of sequences that can be swapped at all (two steps with an image for
        ISP, two text steps for SOP), so below ``delta`` when some cannot."""
        return max(stats["swapped"], 1.0 - stats["swapped"]) if "swapped" in stats else None

    @torch.no_grad()
    def show(self, outputs: EncoderOutput, targets: dict, rows: int,
             decode: Callable[[list[int]], list[str]]) -> tuple[list[str], list[str]]:
        gold = targets[f"{self.name}_labels"][:rows].tolist()
        pred = self.head(outputs.cls[:rows]).argmax(-1).tolist()
        return [str(g) for g in gold], [str(p) for p in pred]

    def outcomes(self, outputs: EncoderOutput, targets: dict, **extra) -> Outcomes:
        labels = targets[f"{self.name}_labels"]  # one target per sequence
        logits = self.head(outputs.cls)
        return Outcomes(loss=F.cross_entropy(logits.float(), labels, reduction="none"),
                        correct=logits.argmax(-1) == labels,
                        sample=torch.arange(labels.shape[0], device=labels.device),
                        extras={"swapped": labels.float()})
