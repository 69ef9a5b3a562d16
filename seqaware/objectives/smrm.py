"""Sequential masked region modelling (SMRM, Wu et al. 2022, sec. 4.2).

``k`` patches of every image (``num_masked``, or ``round(mask_ratio * P)``: 7 of 49 CLIP patches)
are zeroed at the fusion input.  For each masked patch the model must pick, among a vocabulary of
candidate target states, the one of its own position: ``score(q, c) = MLP([q ; c])`` for the masked
output state ``q`` and every candidate ``c``, trained with |C|-way cross-entropy.

Targets are the encoder's states of the masked patches on the *unmasked* input (``target="output"``,
the ``patch_states`` of a no-grad clean pass) or the projected input features (``target="input"``,
its ``projected_visual``); the caller runs the clean pass (``needs_clean_pass``) and passes
``target_states=objective.select_target_states(clean_outputs)`` to ``forward``.

Candidate vocabulary (``vocab_scope``): ``sequence`` = the masked patches of the images of the same
sample, ``batch`` = all masked patches of the mini-batch, ``global`` = all masked patches of the
global batch, gathered across DDP ranks (falls back to ``batch`` when torch.distributed is not
initialised).  Candidates are shuffled per masked position so ties never favour the gold index.

Overlap bound: the masked positions of any two images of one sample share fewer than k/2 positions.
Construction (per sample, fully vectorised): draw a random permutation ``pi`` of the P positions
(argsort of noise) and a random ordering of the sample's n image steps; the image of rank r gets the
cyclic window ``pi[(r*c + j) mod P], j = 0..k-1`` with spacing ``c = P // n``.  Two windows whose
offsets differ by d share ``max(0, k-d) + max(0, k-(P-d))`` positions.  Offsets differ by
``d = c*|r-r'|`` with ``c <= d <= (n-1)c <= P-c``, so ``min(d, P-d) >= c``; with ``2k <= P`` at most
one of the two terms is positive, hence the overlap is ``<= max(0, k - c)``.  Requiring
``c >= k//2 + 1`` gives overlap ``<= ceil(k/2) - 1 < k/2`` for every pair.  The requirement holds
while ``n <= P // (k//2 + 1)`` (12 images for 7 of 49 patches); longer sequences raise a clear
error.  With few images (``c >= k``) the masks are disjoint.  Marginally each image's mask is a
uniformly random k-subset.  With a ``patch_mask`` (regions padded to a common count), the same
construction runs over the ``P_b`` positions that are real in every image of sample b, with
``k_b = max(1, round(mask_ratio * P_b))`` (at most ``P_b // 2``): every image gets its share of masked
regions, as the paper asks ("the same amount of X% patches for each image"), instead of losing the
ones drawn on padding (VisualBERT with 8 box slots lost about 40% of its targets that way, which
shrank the in-batch vocabulary and so the objective's ceiling over chance).  Region slots can be too
few for the overlap bound (3 slots, 5 images under ``hparams=wu2022`` on the synthetic world): such a
sample's windows are spread as evenly as the slots allow (offset ``floor(r P_b / n)``, a warning once)
instead of stopping the run; a patch grid keeps the error (more patches or fewer steps fix it).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from seqaware.objectives.base import EncoderOutput, Objective, Outcomes, shallow_copy, uniform
from seqaware.objectives.registry import register_objective

log = logging.getLogger(__name__)

TARGETS = ("output", "input")
SCOPES = ("sequence", "batch", "global")


_WARNED_OVERLAP = False


def _warn_overlap(images: int, slots: int) -> None:
    global _WARNED_OVERLAP
    if not _WARNED_OVERLAP:
        _WARNED_OVERLAP = True
        log.warning("smrm: samples with up to %d images but as few as %d region slots real in all of them cannot keep "
                    "the masked slots of two images below 50%% overlap (Wu et al. sec. 4.2.3); their masks are spread "
                    "as evenly as the slots allow (logged once)", images, slots)


def spaced_window_masks(visual_mask: torch.Tensor, num_patches: int, num_masked: int,
                        generator: torch.Generator, patch_mask: Optional[torch.Tensor] = None,
                        mask_ratio: Optional[float] = None) -> torch.Tensor:
    """(B, S, P) bool masks of ``num_masked`` patches per image with pairwise overlap < k/2.

    With ``patch_mask`` (B, S, P) (padded region slots), the windows run over the positions that
    are real in every image of the sample (``P_b`` of them) instead of all ``P``, so every image gets
    its k masked patches rather than losing those that fall on padding; ``k_b`` is then
    ``max(1, round(mask_ratio * P_b))`` with ``mask_ratio`` (else ``num_masked``), at most ``P_b // 2``.
    See the module docstring for the construction and the proof of the bound (``P_b`` for ``P``).
    """
    B, S = visual_mask.shape
    P, k = num_patches, num_masked
    device = visual_mask.device
    has_image = visual_mask.bool()
    if k == 0:
        return torch.zeros(B, S, P, dtype=torch.bool, device=device)
    if 2 * k > P:
        raise ValueError(f"smrm: masking {k} of {P} patches (> 50%) cannot keep the overlap of two images "
                         "below 50%; lower smrm mask_ratio / num_masked")
    if patch_mask is None:
        common = torch.ones(B, P, dtype=torch.bool, device=device)
    else:  # positions real in every image of the sample (region slots are padded at the end)
        common = (patch_mask.bool() | ~has_image[..., None]).all(dim=1)
    real = common.sum(1)  # P_b
    per_sample_k = torch.full_like(real, k)
    if patch_mask is not None:
        if mask_ratio is not None:
            per_sample_k = (real.double() * mask_ratio).round().long().clamp(min=1, max=k)
        per_sample_k = torch.minimum(per_sample_k, real // 2)
    width = real.clamp(min=1)
    n_images = has_image.sum(1).clamp(min=1)  # (B,)
    spacing = width // n_images
    min_spacing = per_sample_k // 2 + 1
    too_many = (spacing < min_spacing) & (per_sample_k > 0)
    if bool(too_many.any()) and patch_mask is None:
        b = int(too_many.nonzero()[0, 0])
        raise ValueError(f"smrm: a sample has {int(n_images[b])} images, but masking {int(per_sample_k[b])} of "
                         f"{int(width[b])} patches with < 50% pairwise overlap supports at most "
                         f"{int(width[b]) // int(min_spacing[b])} images per sample; lower the maximum number of "
                         "steps per pretraining sequence or smrm mask_ratio")
    if bool(too_many.any()):
        # Region slots (a whole-image token + a few boxes, e.g. 3 per image on the synthetic world) cannot keep
        # 5 images' masks below 50% overlap (sec. 4.2.3's rule, written for a grid of patches). Rather than stop
        # the run, those samples spread their windows as evenly as the slots allow (offset floor(r P_b / n)).
        _warn_overlap(int(n_images[too_many].max()), int(width[too_many].min()))
    noise = uniform((B, P), generator, device).masked_fill(~common, 2.0)
    pi = noise.argsort(dim=1)  # random order of the sample's real positions, padding last
    step_order = uniform((B, S), generator, device).masked_fill(~has_image, 2.0).argsort(dim=1)
    image_rank = step_order.argsort(dim=1)  # (B, S), 0..n-1 for the image steps
    offsets = torch.where(too_many[:, None], image_rank * width[:, None] // n_images[:, None],
                          image_rank * spacing[:, None])
    j = torch.arange(k, device=device)
    window = (offsets[..., None] + j) % width[:, None, None]  # (B, S, k)
    positions = pi[:, None, :].expand(B, S, P).gather(2, window)
    # window slots past the sample's k_b go to a spare column P, dropped below
    positions = positions.masked_fill(j >= per_sample_k[:, None, None], P)
    masks = torch.zeros(B, S, P + 1, dtype=torch.bool, device=device).scatter(2, positions, True)[..., :P]
    return masks & has_image[..., None]


@register_objective
class SequentialMaskedRegionModeling(Objective):
    """SMRM objective.

    Args:
        hidden_size: encoder width H.
        mask_ratio: fraction of each image's patches to mask (``round(mask_ratio * P)``).
        num_masked: explicit k (overrides ``mask_ratio``).
        target: ``output`` (clean-pass output states) or ``input`` (clean projected features).
        vocab_scope: ``sequence`` | ``batch`` | ``global``.
        score_hidden: hidden width of the scoring MLP (default H).

    Targets: ``smrm_mask (B, S, P)`` bool, the masked patches.
    """

    name = "smrm"
    corrupts = frozenset({"regions"})
    target_layout = {"smrm_mask": ("step", False)}
    modalities = frozenset({"image"})
    needs_clean_pass = True

    def __init__(self, hidden_size: int, mask_ratio: float = 0.15, num_masked: Optional[int] = None,
                 target: str = "output", vocab_scope: str = "batch", score_hidden: Optional[int] = None):
        super().__init__()
        if target not in TARGETS:
            raise ValueError(f"smrm: target must be one of {TARGETS}, got {target!r}")
        if vocab_scope not in SCOPES:
            raise ValueError(f"smrm: vocab_scope must be one of {SCOPES}, got {vocab_scope!r}")
        if not 0.0 <= mask_ratio <= 0.5:
            raise ValueError(f"smrm: mask_ratio must be in [0, 0.5], got {mask_ratio}")
        if num_masked is not None and num_masked < 0:
            raise ValueError(f"smrm: num_masked must be >= 0, got {num_masked}")
        self.mask_ratio = float(mask_ratio)
        self.num_masked = num_masked
        self.target = target
        self.vocab_scope = vocab_scope
        self.hidden_size = int(hidden_size)
        hid = score_hidden or hidden_size
        # scores one (masked output ; candidate) concatenation; evaluated in factorised form below
        self.scorer = nn.Sequential(nn.Linear(2 * hidden_size, hid), nn.GELU(), nn.Linear(hid, 1))

    def masked_per_image(self, num_patches: int) -> int:
        """k, the number of masked patches per image of ``num_patches`` patches."""
        if self.num_masked is not None:
            return min(int(self.num_masked), num_patches)
        return int(round(self.mask_ratio * num_patches))

    def corrupt(self, batch: dict, generator: torch.Generator) -> tuple[dict, dict]:
        feats = batch["visual_feats"]
        P = feats.shape[2]
        patch_mask = batch.get("patch_mask")
        ratio = None if self.num_masked is not None else self.mask_ratio
        mask = spaced_window_masks(batch["visual_mask"], P, self.masked_per_image(P), generator,
                                   patch_mask=patch_mask, mask_ratio=ratio)  # never on a padded slot
        corrupted = shallow_copy(batch)
        corrupted["visual_feats"] = feats.masked_fill(mask[..., None], 0.0)
        return corrupted, {"smrm_mask": mask}

    def select_target_states(self, clean_outputs: EncoderOutput) -> torch.Tensor:
        """The (B, S, P, H) target states from the clean (unmasked) pass, detached."""
        states = clean_outputs.patch_states if self.target == "output" else clean_outputs.projected_visual
        return states.detach()

    def score(self, queries: torch.Tensor, bank: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """``scorer([q_n ; bank[group_n, c]])`` for every query n and candidate c: (N, C).

        The first Linear of the MLP acts on a concatenation, so it splits into a query part and a
        candidate part that are projected once each and broadcast-added: the same numbers as
        running the MLP on the (N, C, 2H) concatenation, without materialising it.
        """
        first = self.scorer[0]
        H = self.hidden_size
        q = F.linear(queries, first.weight[:, :H], first.bias)  # (N, hid)
        c = F.linear(bank, first.weight[:, H:])  # (G, C, hid)
        # one bank (batch / global vocabulary): broadcast it. Otherwise index_select, whose backward
        # is index_add_; the backward of c[group] (index_put_ with accumulate=True and repeated
        # indices) adds in a thread-dependent order on CPU, so two identical runs drifted apart
        c = c if c.shape[0] == 1 else c.index_select(0, group)
        hidden = q[:, None, :] + c  # (N, C, hid)
        return self.scorer[1:](hidden).squeeze(-1)

    def _candidates(self, tgt: torch.Tensor, sample_of: torch.Tensor, num_samples: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Candidate bank (G, C, H), its validity (G, C), each query's group (N,) and gold index (N,)."""
        N = tgt.shape[0]
        device = tgt.device
        local = torch.arange(N, device=device)
        if self.vocab_scope == "sequence":
            counts = torch.bincount(sample_of, minlength=num_samples)
            starts = counts.cumsum(0) - counts
            slot = local - starts[sample_of]  # masked patches are in sample order (row-major mask)
            width = int(counts.max())
            bank = tgt.new_zeros(num_samples, width, tgt.shape[1])
            bank[sample_of, slot] = tgt
            valid = torch.zeros(num_samples, width, dtype=torch.bool, device=device)
            valid[sample_of, slot] = True
            return bank, valid, sample_of, slot
        group = torch.zeros(N, dtype=torch.long, device=device)
        if self.vocab_scope == "global" and dist.is_available() and dist.is_initialized():
            world, rank = dist.get_world_size(), dist.get_rank()
            count = torch.tensor([N], device=device)
            counts = [torch.zeros_like(count) for _ in range(world)]
            dist.all_gather(counts, count)
            width = int(torch.stack(counts).max())
            padded = tgt.new_zeros(width, tgt.shape[1])
            padded[:N] = tgt
            gathered = [torch.zeros_like(padded) for _ in range(world)]
            dist.all_gather(gathered, padded)  # targets are detached: no gradient crosses ranks
            valid = torch.cat([torch.arange(width, device=device) < int(n) for n in counts])
            return torch.cat(gathered)[None], valid[None], group, rank * width + local
        return tgt[None], torch.ones(1, N, dtype=torch.bool, device=device), group, local

    def loss_count(self, targets: dict) -> torch.Tensor:
        return targets["smrm_mask"].sum()

    @torch.no_grad()
    def show(self, outputs: EncoderOutput, targets: dict, rows: int, decode) -> tuple[list[str], list[str]]:
        masked = targets["smrm_mask"][:rows].flatten(1).sum(1).tolist()
        return [f"{m} masked patches" for m in masked], ["" for _ in masked]

    def outcomes(self, outputs: EncoderOutput, targets: dict, target_states: Optional[torch.Tensor] = None,
                 generator: Optional[torch.Generator] = None, **extra) -> Outcomes:
        """Per masked region: the loss over its candidates, whether the gold one scored highest,
        the number of candidates (``smrm_num_candidates`` in the logs) and ``1 / candidates``, a
        uniform guess's accuracy (``smrm_chance``).

        ``target_states`` (B, S, P, H) from :meth:`select_target_states` is required; ``generator``
        (optional) drives the per-position candidate shuffle (ties go to a random candidate).
        """
        if target_states is None:
            raise ValueError("smrm: forward needs target_states=objective.select_target_states(clean_outputs) "
                             "from a no-grad encoder pass over the unmasked input")
        mask = targets["smrm_mask"]
        B = mask.shape[0]
        queries = outputs.patch_states[mask]  # (N, H), row-major: grouped by sample
        sample_of = torch.arange(B, device=mask.device)[:, None, None].expand_as(mask)[mask]
        if queries.shape[0] == 0:  # nothing masked: empty outcomes, still attached to the graph
            empty = queries.sum(-1)
            return Outcomes(loss=empty, correct=empty.bool(), sample=sample_of,
                            extras={"num_candidates": empty.detach(), "chance": empty.detach()})
        tgt = target_states.detach()[mask]
        bank, valid, group, gold = self._candidates(tgt, sample_of, B)

        scores = self.score(queries, bank, group).masked_fill(~valid[group], float("-inf"))
        N, C = scores.shape
        noise = torch.rand((N, C), generator=generator, device=generator.device if generator else None,
                           dtype=torch.float32)
        perm = noise.to(scores.device).argsort(dim=1)  # shuffled column c holds candidate perm[:, c]
        scores = scores.gather(1, perm)
        gold = perm.argsort(dim=1).gather(1, gold[:, None]).squeeze(1)
        candidates = valid[group].sum(1).float()
        return Outcomes(loss=F.cross_entropy(scores.float(), gold, reduction="none"), correct=scores.argmax(-1) == gold,
                        sample=sample_of, extras={"num_candidates": candidates, "chance": 1.0 / candidates})
