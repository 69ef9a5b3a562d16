"""Lightning module for BERSON order decoding fine-tuned end to end (``experiment=berson_*``).

Wiring only: a sequence encoder (:mod:`seqaware.encoders`) gives a state per ordered pair of steps,
the BERSON network (:mod:`decoders.berson`) turns the pair states into an order, and the ordering
metrics score it.  ``model.pair_encoding`` chooses how the pair states are obtained:

``pairwise`` (default, BERSON's paper-exact encoding)
    every ordered pair of steps is encoded jointly by the encoder: n(n-1) passes per procedure.
``joint``
    the whole procedure, in the (shuffled) order the batch presents its steps, is encoded once as
    pretraining encodes a step sequence (``[CLS] s_0 [SEP] s_1 [SEP] ...`` + every step image's
    tokens, :func:`seqaware.encoders.steps.encode_steps`); a step's state is the mean of its text and
    image token states; procedures over ``joint_max_tokens`` (or the encoder's positions / step
    embedding table) are encoded in windows of whole steps, each step taken from the one window that
    owns it.  :class:`seqaware.encoders.steps.PairStates` builds the pair-specific vectors of both
    steps and the pair's [CLS] from the two step states, so the decoder, beam search, the pairwise
    decoders, the losses and ``multi_reference_targets`` run unchanged.  No position leak: the data
    module presents the steps in a permutation drawn independently of the gold order, in training
    (:class:`data_modules.views.SequencingView` with ``reshuffle=True``: a new one per epoch) and in
    evaluation (one fixed per ``(seed, procedure id)``), and the collator keeps that order; so the
    text positions and step-index embeddings of the joint pass say nothing about the gold order.
    ``test_views`` > 1 (``joint`` only; test and predict): the procedure is also encoded under
    ``test_views - 1`` more orders of its steps, and the views vote (:meth:`BersonModule.decode_views`).

Pairs (``pairwise``).  For an instance with n steps the n(n-1) ordered pairs (i, j) are built with
index tensors (no Python loop over pairs) and encoded in chunks of ``pair_chunk`` pairs, so a 20-step procedure
(380 pairs) fits in memory; ``checkpoint_chunks`` recomputes each chunk's activations in backward.
Text: the tokenizer's pair format, ``[CLS] step_i [SEP] step_j [SEP]`` (BERT: token types 0 then 1) or
``<s> step_i </s></s> step_j </s>`` (RoBERTa, MPNet: :attr:`seqaware.encoders.text.TextEncoder.pair_sep_id`).
``model.decoder.sep_in_pools`` (BERSON's release) pools each step's closing separator(s) with its tokens.
Images: the visual backbone runs once per step image and the pair gathers the two steps' visual tokens,
so the segment of step i inside a pair is its text tokens plus its image tokens -- exactly what the
hierarchical attention pools.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Optional

import torch
from hydra.utils import instantiate
from torch.utils.checkpoint import checkpoint

from decoders import DECODERS, PAIRWISE_DECODERS, fitting_decoder
from decoders.exact import check_exact_steps
from decoders.berson import BersonDecoder, BersonState, pair_index, take_steps
from seqaware.encoders.base import SequenceEncoder, pack_steps, pair_segment_ids, step_visual_features
from seqaware.encoders.packing import check_packable
from seqaware.encoders.steps import SEGMENTS, PairStates, encode_steps, position_limit
from seqaware.lr_scaling import check_scaling
from seqaware.modules.base import OrderingEvalMixin, SeqawareModule, as_container, global_share
from seqaware.modules.sequencing import pairwise_targets, reference_targets

PROVIDES = ("pointer", "pair_logits")  # what BERSON gives a decoder (decoders.registry): every registered one fits
PAIR_ENCODINGS = ("pairwise", "joint")


class BersonModule(OrderingEvalMixin, SeqawareModule):
    """BERSON over any sequence encoder.

    Args:
        encoder: encoder config (``configs/encoder/*.yaml``: ``_target_`` + arguments); its ``ckpt``
            loads the weights of a pretraining run (``encoder.pt`` or a Lightning checkpoint).
        decoder: :class:`decoders.berson.BersonDecoder` arguments (``lambda_pair``, paragraph layers, ...).
        decoding: a registered decoder (:mod:`decoders`): a pointer one (``beam``, BERSON's) or a
            pairwise one on the pairwise head; a name that does not fit is an error listing those that do.
        beam_size: beam width (BERSON: 16); 1 gives the greedy order.
        pair_chunk: pairs encoded per encoder call.
        checkpoint_chunks: activation checkpointing per chunk during training.
        head_lr: learning rate of the BERSON network (default: the optimiser's lr, as in BERSON).
        reference_selection: ``joint`` | ``wu2022``: which reference of a multi-reference instance is
            scored (:func:`seqaware.metrics.ordering.select_reference`).
        pair_encoding: ``pairwise`` (BERSON: every pair through the encoder) | ``joint`` (one pass per
            procedure, pair states from step states; see the module docstring).
        joint_max_tokens: ``joint`` only: tokens per encoder pass (text + visual, the window's [CLS]
            included; also capped by the encoder's positions); longer procedures are windowed.
        pair_dropout: ``joint`` only: dropout of the pair module.
        test_views: ``joint`` only: orders of the steps each test (and predict) procedure is encoded in
            (1: the presented order alone).  A joint pass sees the steps in an order, so its scores
            depend on it; more views average that out (:meth:`decode_views`).  Validation uses one.
        joint_segments: ``joint`` only, text encoders: ``none`` (token type 0, as pretraining packs steps)
            or ``alternating`` (BERT4SO's interval segments: even steps type 0, odd steps type 1).
        multi_reference_targets: train (and score the losses) against every reference order of an
            instance: the pointer's NLL at step t is that of pointing at any step some reference puts
            next after the authored prefix, and the pairwise loss counts only the pairs every reference
            orders the same way (:func:`seqaware.modules.sequencing.reference_targets`).  Default False:
            BERSON's loss on the authored order, which for a DAG with independent chains asks for one
            arbitrary interleaving while PMR accepts any.
        new_layers_lr: the learning rate of the layers the encoder adds to its pretrained towers (visual projection
            and LayerNorm, step embedding: :meth:`~seqaware.encoders.base.SequenceEncoder.new_parameters`):
            ``encoder`` (the optimizer's lr, as the towers; the default), ``head`` (``head_lr``) or a number.
            Measured on the default world (docs/results/label_efficiency.md): ``head`` (1e-3) raised the spread
            over seeds of a 40-step fine-tune, so the default keeps them with the encoder.
        compile: ``true`` runs the encoder under ``torch.compile``, a dict passes its keys to it; ``false``
            (default) runs it eagerly (:meth:`~seqaware.modules.base.SeqawareModule.compile_encoder`).  A speed
            switch for GPUs, where a base-size encoder's step over a few short steps is bound by kernel
            launches rather than arithmetic (docs/results/performance.md); the pointer network stays eager.
        packed: ``true`` runs the encoder's transformer on the real tokens only, joint windows and pair chunks
            alike (:mod:`seqaware.encoders.packing`: padding never reaches a linear layer; attention per sequence;
            BERT / MiniLM, RoBERTa, MPNet; ``configs/model/berson.yaml`` sets it); ``false`` (this class's
            default) the padded batch.  The same logits and gradients within float rounding, no parameters of its
            own: checkpoints load either way.
        lr_scaling: ``{rule: sqrt|linear, reference_batch: N}``: every learning rate for the fit's instances per
            optimizer step against the recipe's N (:mod:`seqaware.lr_scaling`: a token-budget batch,
            ``data.batch_tokens``, holds a varying number of stories); None (default): the rates as given.

    Frozen parts (eval mode while the rest trains, see :class:`~seqaware.modules.base.SeqawareModule`):
    the visual backbone's BatchNorm layers (``freeze_bn``, the default) and the whole visual backbone
    with ``trainable: false``; nothing else (every Dropout of the encoder, the pair module and the
    BERSON network trains).
    """

    eval_losses = ("pointer_loss", "pair_loss", "pair_acc", "loss")   # val/<name>: sums over the split / counts

    def __init__(self, encoder: dict, optimizer: dict, decoder: Optional[dict] = None, scheduler: Optional[dict] = None,
                 decoding: str = "beam", beam_size: int = 16, pair_chunk: int = 128, checkpoint_chunks: bool = False,
                 head_lr: Optional[float] = None, reference_selection: str = "joint",
                 multi_reference_targets: bool = False, pair_encoding: str = "pairwise", joint_max_tokens: int = 512,
                 pair_dropout: float = 0.1, test_views: int = 1,
                 joint_segments: str = "none", compile: bool | dict = False, new_layers_lr: str | float = "encoder",
                 packed: bool = False, lr_scaling: Optional[dict] = None):
        super().__init__()
        fitting_decoder(decoding, PROVIDES, "model.decoding")
        lr_scaling = check_scaling(as_container(lr_scaling))
        if pair_encoding not in PAIR_ENCODINGS:
            raise ValueError(f"model.pair_encoding must be one of {list(PAIR_ENCODINGS)}, got {pair_encoding!r}")
        if int(test_views) < 1 or (int(test_views) > 1 and pair_encoding != "joint"):
            raise ValueError(f"model.test_views must be 1, or more with model.pair_encoding=joint (a pairwise "
                             f"encoding does not depend on the order the steps are presented in), got {test_views!r} "
                             f"with pair_encoding={pair_encoding!r}")
        if joint_segments not in SEGMENTS:
            raise ValueError(f"model.joint_segments must be one of {list(SEGMENTS)}, got {joint_segments!r}")
        if new_layers_lr not in ("encoder", "head") and not (isinstance(new_layers_lr, (int, float))
                                                              and not isinstance(new_layers_lr, bool) and new_layers_lr > 0):
            raise ValueError(f"model.new_layers_lr must be encoder, head or a positive learning rate, got {new_layers_lr!r}")
        if int(joint_max_tokens) < 2:
            raise ValueError(f"model.joint_max_tokens must be at least 2 ([CLS] + one token), got {joint_max_tokens!r}")
        self.save_hyperparameters({"encoder": as_container(encoder), "decoder": as_container(decoder or {}),
                                   "optimizer": as_container(optimizer), "scheduler": as_container(scheduler),
                                   "decoding": decoding, "beam_size": beam_size, "pair_chunk": pair_chunk,
                                   "checkpoint_chunks": checkpoint_chunks, "head_lr": head_lr,
                                   "reference_selection": reference_selection,
                                   "multi_reference_targets": multi_reference_targets,
                                   "pair_encoding": pair_encoding, "joint_max_tokens": joint_max_tokens,
                                   "pair_dropout": pair_dropout, "test_views": test_views,
                                   "joint_segments": joint_segments, "compile": as_container(compile),
                                   "new_layers_lr": new_layers_lr, "packed": bool(packed), "lr_scaling": lr_scaling})
        # configs/encoder/*.yaml: create_encoder(name, ckpt=..., ...) also loads a pretraining run's weights
        self.encoder: SequenceEncoder = instantiate(self.hparams.encoder)
        if joint_segments != "none" and (pair_encoding != "joint" or self.encoder.uses_images):
            raise ValueError(f"model.joint_segments={joint_segments} needs model.pair_encoding=joint and a text-only "
                             f"encoder (got pair_encoding={pair_encoding!r}, modality {self.encoder.modality!r}); "
                             "pairwise text pairs already use BERT's sentence-pair segments")
        if joint_segments != "none" and getattr(self.encoder, "type_vocab_size", 1) < 2:
            raise ValueError(f"model.joint_segments={joint_segments} needs a text model with two token types (BERT, "
                             f"MiniLM); backbones.text={self.hparams.encoder.get('name_or_path')!r} has "
                             f"{getattr(self.encoder, 'type_vocab_size', 1)} (MPNet: none, RoBERTa: one): "
                             "set model.joint_segments=none")
        if packed:
            check_packable(self.encoder)
            self.encoder.packed = True
        self.compile_encoder(as_container(compile))
        self.decoder = BersonDecoder(self.encoder.hidden_size, **self.hparams.decoder)
        self.pair_encoding = pair_encoding
        self.joint_max_tokens = int(joint_max_tokens)
        self.joint_segments = joint_segments
        # joint: pair states from step states (no parameters under pairwise, so its checkpoints are unchanged)
        self.pair_states = PairStates(self.encoder.hidden_size, pair_dropout) if pair_encoding == "joint" else None
        self.decoding = decoding
        self.beam_size = int(beam_size)
        self.pair_chunk = int(pair_chunk)
        self.checkpoint_chunks = bool(checkpoint_chunks)
        self.multi_reference_targets = bool(multi_reference_targets)
        self.test_views = int(test_views)
        self._init_eval(reference_selection)

    def setup(self, stage: str) -> None:
        """Before the first step: data whose instances the configured decoder cannot decode is refused."""
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if self.decoding == "exact" and hasattr(dm, "view_kwargs"):
            check_exact_steps(dm.view_kwargs.get("max_steps", 5), "model.decoding")
        if self.pair_encoding == "joint" and hasattr(dm, "datasets"):
            self._check_joint_budget(dm)

    def _check_joint_budget(self, dm) -> None:
        """Every step must fit one joint window (``model.joint_max_tokens``, the encoder's positions): its text
        tokens plus, for an encoder with images, its image's visual tokens, counted as
        :func:`~seqaware.encoders.steps.encode_steps` counts them (:func:`~seqaware.encoders.steps.step_lengths`).
        Checked on the data of every split before the first step, not when the batch that holds the step comes.
        Free when the collator's caps fit (the per-step text cap + one image slot); otherwise every step of every
        split is measured once."""
        from seqaware.encoders.steps import image_tokens, step_lengths, visual_slot_tokens

        enc, collator = self.encoder, dm.collator
        budget = min(self.joint_max_tokens, position_limit(enc)) - 1   # the window's [CLS] takes one
        if enc.uses_text and collator.tokens is None:
            return
        slot = visual_slot_tokens(enc, collator) if enc.uses_images else 0
        if int(step_lengths(enc, torch.tensor([collator.max_tokens]), torch.tensor([slot]), slot)) <= budget:
            return
        for split, view in dm.datasets.items():
            for proc in getattr(view, "procedures", ()):
                steps = proc.steps[: getattr(view, "max_steps", len(proc.steps))]
                text = torch.zeros(len(steps), dtype=torch.long)
                if enc.uses_text:
                    ids = collator.tokens.ids([s.text or "" for s in steps], collator.max_tokens, collator.max_sentences)
                    text = torch.tensor([len(x) for x in ids])
                visual = torch.tensor([image_tokens(enc, collator, s, proc.root, slot, read=False) for s in steps])
                for k in (step_lengths(enc, text, visual, slot) > budget).nonzero().flatten().tolist():
                    if enc.uses_images:   # a cached detector file is read only for a step that its bound breaks
                        visual[k] = image_tokens(enc, collator, steps[k], proc.root, slot)
                    if int(step_lengths(enc, text[k:k + 1], visual[k:k + 1], slot)) > budget:
                        raise ValueError(self._joint_budget_error(collator, budget, slot, split, proc.id, k,
                                                                  int(text[k]), int(visual[k])))

    def _joint_budget_error(self, collator, budget: int, slot: int, split: str, proc_id: str, k: int, text: int,
                            visual: int) -> str:
        """The message of :meth:`_check_joint_budget`: the step, its tokens and the keys that make it fit."""
        from seqaware.encoders.steps import region_tokens, step_lengths

        enc = self.encoder
        total = int(step_lengths(enc, torch.tensor([text]), torch.tensor([visual]), slot))
        packed = max(text - 1, 0) if enc.uses_text else 0
        detail, lower = "", []
        if enc.uses_text:
            lower.append(f"data.collator.max_tokens (now {collator.max_tokens})")
        if enc.uses_images:
            detail = (f"{packed} text + " if enc.uses_text else "") + f"{total - packed} visual tokens of its image; "
            key, now = (("data.collator.max_boxes", collator.max_boxes) if region_tokens(enc)
                        else ("data.collator.image_size", collator.transform.size))
            lower.append(f"{key} (now {now}: {slot} visual tokens per image)")
        return (f"model.joint_max_tokens={self.joint_max_tokens}: step {k} of procedure {proc_id!r} ({split} split) "
                f"packs to {total} tokens and a window holds {budget} after its [CLS] ({detail}the encoder's positions "
                f"allow {position_limit(enc)}): raise model.joint_max_tokens or lower {' or '.join(lower)}")

    def configure_callbacks(self) -> list:
        """Every fit counts its work: ``perf/flops_per_step``, ``perf/tokens_per_s``, ``perf/padding`` (and ``perf/mfu``
        on a GPU), :class:`seqaware.profiling.StepWork`."""
        from seqaware.profiling import StepWork

        return [StepWork()]

    def param_groups(self) -> list[dict]:
        new_lr = self.hparams.get("new_layers_lr", "encoder")
        new_ids = {id(p) for p in self.encoder.new_parameters()} if new_lr != "encoder" else set()
        enc = [p for p in self.encoder.parameters() if p.requires_grad and id(p) not in new_ids]
        new = [p for p in self.encoder.parameters() if p.requires_grad and id(p) in new_ids]
        dec = [p for p in self.decoder.parameters() if p.requires_grad]
        if self.pair_states is not None:
            dec += [p for p in self.pair_states.parameters() if p.requires_grad]
        head = {"params": dec}
        if self.hparams.head_lr is not None:
            head["lr"] = float(self.hparams.head_lr)
        if new_lr == "head":
            head["params"] = new + dec
            new = []
        groups = [{"params": enc}, head]
        if new:
            groups.append({"params": new, "lr": float(new_lr)})
        return groups

    # ------------------------------------------------------------------ pair encoding
    def _encode_chunk(self, input_ids, attention_mask, visual_feats, visual_mask, patch_mask):
        fusion: dict[str, torch.Tensor] = {}
        if input_ids is not None:
            fusion.update(pack_steps(input_ids, attention_mask, None, self.encoder.cls_token_id, self.encoder.pad_token_id,
                                     pair_sep_id=getattr(self.encoder, "pair_sep_id", None)))
            if self.encoder.modality == "text":
                # BERT sentence-pair segments: type 0 for [CLS] step_i [SEP], type 1 for step_j [SEP]
                # (single-stream multimodal encoders use token types for the modality instead)
                fusion["token_type_ids"] = pair_segment_ids(fusion)
        if visual_feats is not None:
            fusion["visual_feats"], fusion["visual_mask"] = visual_feats, visual_mask
            if patch_mask is not None:
                fusion["patch_mask"] = patch_mask
        out = self.encoder(fusion)
        states, segments = [], []
        if out.text_states is not None:
            states.append(out.text_states)
            segments.append(with_separators(fusion) if self.decoder.sep_in_pools else fusion["text_step"])
        if out.patch_states is not None:
            N, S, P, _ = out.patch_states.shape
            real = visual_mask[:, :, None].expand(N, S, P)
            if patch_mask is not None:
                real = real & patch_mask
            seg = torch.arange(S, device=real.device)[None, :, None].expand(N, S, P)
            states.append(out.patch_states.flatten(1, 2))
            segments.append(torch.where(real, seg, torch.full_like(seg, -1)).flatten(1, 2))
        first, second = self.decoder.pool_pair_segments(torch.cat(states, 1), torch.cat(segments, 1))
        return first, second, out.cls

    def encode(self, batch: dict) -> BersonState:
        """Encode every ordered pair of every instance and build the decoder state (``model.pair_encoding``)."""
        if self.pair_encoding == "joint":
            return self.encode_joint(batch)
        step_mask = batch["step_mask"]
        index = pair_index(step_mask)
        b, i, j = index
        feats = vmask = pmask = None
        if self.encoder.uses_images:  # once per step image, gathered per pair below
            feats, pmask, vmask = step_visual_features(self.encoder, batch)
        parts = []
        for start in range(0, len(b), self.pair_chunk):
            sl = slice(start, start + self.pair_chunk)
            cb, ci, cj = b[sl], i[sl], j[sl]
            args = [None] * 5
            if self.encoder.uses_text:
                ids, am = batch["input_ids"], batch["attention_mask"]
                args[0] = torch.stack([ids[cb, ci], ids[cb, cj]], 1)
                args[1] = torch.stack([am[cb, ci], am[cb, cj]], 1)
            if feats is not None:
                # index_select, not feats[cb, ci]: a step's features feed 2(n-1) pairs, and the
                # backward must add their gradients in a fixed order (take_steps)
                args[2] = torch.stack([take_steps(feats, cb, ci), take_steps(feats, cb, cj)], 1)
                args[3] = torch.stack([vmask[cb, ci], vmask[cb, cj]], 1)
                if pmask is not None:
                    args[4] = torch.stack([pmask[cb, ci], pmask[cb, cj]], 1)
            if self.training and self.checkpoint_chunks:
                parts.append(checkpoint(self._encode_chunk, *args, use_reentrant=False))
            else:
                parts.append(self._encode_chunk(*args))
        first, second, cls = (torch.cat(p, 0) for p in zip(*parts))
        return self.decoder.encode(first, second, cls, index, step_mask)

    def encode_joint(self, batch: dict) -> BersonState:
        """``pair_encoding=joint``: one encoder pass per procedure (window), pair states from step states."""
        step_mask = batch["step_mask"]
        steps = encode_steps(self.encoder, batch, self.joint_max_tokens, segments=self.joint_segments)  # (B, n, H)
        index = pair_index(step_mask)
        first, second, cls = self.pair_states(steps, index)
        return self.decoder.encode(first, second, cls, index, step_mask)

    # ------------------------------------------------------------------ steps
    def _loss_terms(self, batch: dict) -> tuple[dict[str, torch.Tensor], BersonState]:
        """Per-instance loss sums and counts (:meth:`decoders.berson.BersonDecoder.loss_terms`) and the state."""
        state = self.encode(batch)
        targets, _ = pairwise_targets(batch["gold"], batch["step_mask"])
        next_ok = pair_mask = None
        if self.multi_reference_targets:
            next_ok, pair_mask = reference_targets(batch["gold"], batch["step_mask"], batch["meta"])
        return self.decoder.loss_terms(state, batch["gold"], targets, next_ok, pair_mask), state

    def _losses(self, batch: dict) -> tuple[dict[str, torch.Tensor], BersonState]:
        """The training loss: pointer NLL + ``lambda_pair`` * pairwise BCE, each the mean over the global
        batch (all ranks; :func:`~seqaware.modules.base.global_share`) of what ``model.decoder.loss_norm``
        counts (real steps and pairs, or BERSON's instances), and this rank's component means for logging."""
        t, state = self._loss_terms(batch)
        norm = self.decoder.normalised(t)
        (p_sum, p_count), (b_sum, b_count) = norm["pointer_loss"], norm["pair_loss"]
        steps, pairs = p_count.sum(), b_count.sum()
        share = global_share(torch.stack([steps, pairs]))
        pointer = p_sum.sum() / steps.clamp(min=1)
        pair = b_sum.sum() / pairs.clamp(min=1)
        loss = share[0] * pointer + self.decoder.lambda_pair * share[1] * pair
        return {"loss": loss, "pointer_loss": pointer.detach(), "pair_loss": pair.detach(),
                "pair_acc": (t["pair_correct"].sum() / pairs.clamp(min=1)).detach()}, state

    @property
    def decoding_needs(self) -> str:
        """What the ``model.decoding`` decoder reads: ``pointer`` (the pointer network) or ``pair_logits``."""
        return DECODERS.tags(self.decoding)["needs"]

    def decode(self, state: BersonState) -> list[list[int]]:
        """Orders by the ``model.decoding`` decoder: the pointer network's, or a pairwise one on the pair logits."""
        if self.decoding_needs == "pointer":
            return DECODERS[self.decoding](self.decoder, state, self.beam_size)
        return PAIRWISE_DECODERS[self.decoding](state.pair_logits.detach().float(), state.step_mask)

    @torch.no_grad()
    def decode_views(self, batch: dict, state: BersonState) -> list[list[int]]:
        """Orders of ``batch`` (input positions) voted by ``test_views`` encodings of each procedure.

        View 0 is the batch as presented (``state``); view k > 0 presents each procedure's steps in a
        permutation drawn from (procedure id, k) (:func:`view_permutations`), so a procedure gets the
        same views in any batch.  A pointer decoder (``beam``, ``greedy``): each view proposes its
        order, and the proposal with the highest log-probability summed over all views' pointer
        networks (teacher-forced, :meth:`decoders.berson.BersonDecoder.pointer_log_probs`) is kept.
        Pairwise decoders: the views' pair logits are averaged, then decoded.
        """
        step_mask = batch["step_mask"]
        perms = view_permutations([m["id"] for m in batch["meta"]], step_mask, self.test_views)
        inverse = torch.argsort(perms, dim=-1)                  # inverse[k, b, p] = view slot of input position p
        states = [state] + [self.encode(permute_steps(batch, perms[k])) for k in range(1, self.test_views)]
        B = step_mask.shape[0]
        rows = torch.arange(B, device=step_mask.device)
        if self.decoding_needs != "pointer":
            logits = torch.stack([st.pair_logits.float()[rows[:, None, None], inv[:, :, None], inv[:, None, :]]
                                  for st, inv in zip(states, inverse)]).mean(0)
            return PAIRWISE_DECODERS[self.decoding](logits, step_mask)
        candidates: list[list[tuple[int, ...]]] = [[] for _ in range(B)]
        for st, perm in zip(states, perms.tolist()):
            for b, order in enumerate(self.decode(st)):
                proposal = tuple(perm[b][p] for p in order)
                if proposal not in candidates[b]:
                    candidates[b].append(proposal)
        flat = [c for b in range(B) for c in candidates[b]]
        owner = torch.tensor([b for b in range(B) for _ in candidates[b]], device=step_mask.device)
        orders = torch.full((len(flat), step_mask.shape[1]), -1, dtype=torch.long)
        for r, c in enumerate(flat):
            orders[r, :len(c)] = torch.tensor(c)
        orders = orders.to(step_mask.device)
        total = torch.zeros(len(owner), device=step_mask.device)
        for st, inv in zip(states, inverse):
            view_orders = torch.where(orders >= 0, inv[owner[:, None], orders.clamp(min=0)], orders)
            logp = self.decoder.pointer_log_probs(state_rows(st, owner), view_orders)
            picked = logp.float().gather(2, view_orders.clamp(min=0)[..., None]).squeeze(-1)
            total += torch.where(view_orders >= 0, picked, torch.zeros_like(picked)).sum(1)
        best, start = [], 0
        for b in range(B):
            k = len(candidates[b])
            best.append(list(flat[start + int(total[start:start + k].argmax())]))
            start += k
        return best

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses, _ = self._losses(batch)
        n = len(batch["meta"])
        # synced: the logged value is the global-batch loss
        self.log("train/loss", losses["loss"], prog_bar=True, batch_size=n, sync_dist=True)
        self.log_dict({f"train/{k}": v for k, v in losses.items() if k != "loss"}, batch_size=n)
        return losses["loss"]

    def _eval_step(self, stage: str, batch: dict) -> None:
        t, state = self._loss_terms(batch)
        orders = self.decode_views(batch, state) if stage == "test" and self.test_views > 1 else self.decode(state)
        # val/pointer_loss, val/pair_loss, val/pair_acc: sums over the split / counts (of the presented
        # order's encoding; model.decoder.loss_norm says what is counted); val/loss from them
        self._record_orders(stage, batch, orders, losses={
            **self.decoder.normalised(t), "pair_acc": (t["pair_correct"], t["pairs"])})

    def _derived_losses(self, means: dict[str, float]) -> dict[str, float]:
        return {"loss": means["pointer_loss"] + self.decoder.lambda_pair * means["pair_loss"]}

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def predict_step(self, batch: dict, batch_idx: int) -> list[list[int]]:
        state = self.encode(batch)
        orders = self.decode_views(batch, state) if self.test_views > 1 else self.decode(state)
        return [[meta["step_index"][p] for p in order] for meta, order in zip(batch["meta"], orders)]


def with_separators(fusion: dict[str, torch.Tensor]) -> torch.Tensor:
    """(N, T) segment ids of packed pairs in which every separator belongs to the step it closes (BERSON's
    release pools ``[CLS] a [SEP] b [SEP]`` as ``a [SEP]`` and ``b [SEP]``; ``<s> a </s></s> b </s>`` as
    ``a </s></s>`` and ``b </s>``): each separator takes the step of the last text token before it; [CLS]
    and padding stay -1."""
    steps = fusion["text_step"]
    filled = torch.cummax(steps, dim=1).values       # steps are packed in order: a running max carries the last one
    return torch.where(fusion["attention_mask"].bool(), filled, torch.full_like(steps, -1))


def view_permutations(ids: list, step_mask: torch.Tensor, views: int) -> torch.Tensor:
    """(views, B, S) long: ``perm[k, b, v]`` = the input position shown at slot v of view k.  View 0 is the
    identity; view k > 0 shuffles procedure b's real steps with a generator seeded by (its id, k), so it
    does not depend on the batch; padding slots stay in place."""
    B, S = step_mask.shape
    perms = torch.arange(S).repeat(views, B, 1)
    lengths = step_mask.sum(1).tolist()
    for b, pid in enumerate(ids):
        for k in range(1, views):
            gen = torch.Generator().manual_seed(zlib.crc32(f"{pid}/view {k}".encode()))
            perms[k, b, :lengths[b]] = torch.randperm(int(lengths[b]), generator=gen)
    return perms.to(step_mask.device)


def permute_steps(batch: dict, perm: torch.Tensor) -> dict:
    """``batch`` with every per-step tensor (first two dims (B, S), ``gold`` excepted) re-ordered so that slot v
    of procedure b holds its input position ``perm[b, v]``."""
    B, S = batch["step_mask"].shape
    rows = torch.arange(B, device=perm.device)[:, None]
    return {k: (v[rows, perm] if torch.is_tensor(v) and v.dim() >= 2 and tuple(v.shape[:2]) == (B, S) and k != "gold"
                else v) for k, v in batch.items()}


def state_rows(state: BersonState, rows: torch.Tensor) -> BersonState:
    """The decoder state of instances ``rows`` (repeats allowed)."""
    return BersonState(**{f.name: getattr(state, f.name)[rows] for f in dataclasses.fields(state)})
