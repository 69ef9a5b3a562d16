"""Lightning module for pairwise sequencing models (``experiment=order_baseline``)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from decoders.exact import check_exact_steps
from decoders.pairwise import decode_pairwise
from decoders.registry import fitting_decoder
from seqaware.modules.base import OrderingEvalMixin, SeqawareModule, as_container, global_mean


def pairwise_targets(gold: torch.Tensor, step_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets ``t[b, i, j] = 1`` if input step i comes before input step j, and the valid-pair mask.

    ``gold[b, k]`` is the input position of the k-th step (-1 padding).
    """
    b, s = step_mask.shape
    positions = torch.arange(s, device=gold.device).expand(b, s)
    # rank[b, i] = place of input step i in the gold order; padding entries go to a spare column s
    rank = torch.full((b, s + 1), -1, dtype=torch.long, device=gold.device)
    rank.scatter_(1, torch.where(gold >= 0, gold, s), positions)
    rank = rank[:, :s]
    eye = torch.eye(s, dtype=torch.bool, device=gold.device)
    mask = step_mask[:, :, None] & step_mask[:, None, :] & ~eye
    return (rank[:, :, None] < rank[:, None, :]).float(), mask


def reference_targets(gold: torch.Tensor, step_mask: torch.Tensor, meta: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets that accept every reference order of an instance, not only the authored one.

    Returns ``next_ok`` (B, S, S) bool: ``next_ok[b, t, j]`` -- input step j may be the t-th step after the
    authored prefix ``gold[b, :t]`` in some reference order (the authored next step always may; padding
    rows hold it alone), and ``fixed`` (B, S, S) bool: every reference puts input steps i and j in the same
    order, so the pair has one right answer.  ``meta[b]["references"]`` are orders of original step indices
    and ``meta[b]["step_index"]`` maps input positions to them (:class:`data_modules.views.ViewItem`); the
    first reference must be ``gold``.
    """
    B, S = step_mask.shape
    next_ok = torch.zeros(B, S, S, dtype=torch.bool)
    fixed = torch.ones(B, S, S, dtype=torch.bool)
    gold_cpu = gold.detach().cpu()
    for b, m in enumerate(meta):
        position = {orig: p for p, orig in enumerate(m["step_index"])}
        n = int(step_mask[b].sum())
        try:
            refs = torch.tensor([[position[i] for i in ref] for ref in m["references"]], dtype=torch.long)
        except KeyError as err:
            raise ValueError(f"instance {m.get('id')!r}: a reference names step {err.args[0]}, which is not one of "
                             f"its input steps {m['step_index']}") from None
        if refs.shape[1] != n or not torch.equal(refs[0], gold_cpu[b, :n]):
            raise ValueError(f"instance {m.get('id')!r}: its first reference {m['references'][0]} is not its gold "
                             f"order (input positions {gold_cpu[b, :n].tolist()})")
        for t in range(n):
            follows = (refs[:, :t] == refs[0, :t]).all(1)
            next_ok[b, t, refs[follows, t]] = True
        before = pairwise_targets(refs, torch.ones_like(refs, dtype=torch.bool))[0].bool()  # (R, n, n) per reference
        fixed[b, :n, :n] = before.all(0) | (~before).all(0)
    next_ok.scatter_(2, gold_cpu.clamp(min=0)[..., None], True)
    return next_ok.to(gold.device), fixed.to(gold.device)


class PairwiseSequencingModule(OrderingEvalMixin, SeqawareModule):
    """Wires a pairwise order network, its BCE loss, a decoder and the ordering metrics.

    The network is given as a config (``_target_`` + arguments) and built here, so checkpoints hold
    everything needed by ``PairwiseSequencingModule.load_from_checkpoint(path)``.  ``decoder``
    (``model.decoder``) is any registered pairwise decoder (:data:`decoders.PAIRWISE_DECODERS`).

    Frozen parts: none (the small CNN and text encoder of the baseline train with their Dropout on).
    """

    def __init__(self, net: dict, optimizer: dict, scheduler: dict | None = None, decoder: str = "pairwise_greedy",
                 reference_selection: str = "joint"):
        super().__init__()
        fitting_decoder(decoder, ("pair_logits",), "model.decoder")  # the pairwise decoders fit this module
        self.save_hyperparameters({"net": as_container(net), "optimizer": as_container(optimizer),
                                   "scheduler": as_container(scheduler), "decoder": decoder,
                                   "reference_selection": reference_selection})
        self.net = instantiate(self.hparams.net)
        self.decoder = decoder
        self._init_eval(reference_selection)  # joint | wu2022: see seqaware.metrics.ordering.select_reference

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if self.decoder == "exact" and hasattr(dm, "view_kwargs"):
            check_exact_steps(dm.view_kwargs.get("max_steps", 5), "model.decoder")
        vocab = getattr(dm, "vocab_size", None)
        text = getattr(self.net, "text", None)
        if vocab is not None and text is not None and vocab > text.embed.num_embeddings:
            raise ValueError(f"the tokenizer has {vocab} tokens but model.net.vocab_size="
                             f"{text.embed.num_embeddings}: set model.net.vocab_size={vocab}")

    def _loss_terms(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits and the per-instance BCE sums (B,) over the valid pairs, and their counts (B,)."""
        logits = self.net(batch)
        targets, mask = pairwise_targets(batch["gold"], batch["step_mask"])
        bce = F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="none")
        return logits, torch.where(mask, bce, torch.zeros_like(bce)).sum((1, 2)), mask.sum((1, 2))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        _, sums, counts = self._loss_terms(batch)
        # the mean over the pairs of the global batch (ranks hold different numbers of pairs)
        loss = global_mean(sums.sum(), counts.sum())
        # synced: the logged value is the global-batch loss
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["meta"]), sync_dist=True)
        return loss

    def _eval_step(self, stage: str, batch: dict) -> None:
        logits, sums, counts = self._loss_terms(batch)
        # val/loss: the BCE summed over every pair of the split / the number of pairs
        self._record_orders(stage, batch, decode_pairwise(self.decoder, logits.float(), batch["step_mask"]),
                            losses={"loss": (sums, counts)})

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def predict_step(self, batch: dict, batch_idx: int) -> list[list[int]]:
        logits = self.net(batch)
        orders = decode_pairwise(self.decoder, logits.float(), batch["step_mask"])
        return [[meta["step_index"][p] for p in order] for meta, order in zip(batch["meta"], orders)]
