"""BERSON: BERT-enhanced relational sentence ordering network (Cui et al., EMNLP 2020).

This file holds the network *after* the pair encoder, so it is independent of which encoder
(text-only, CLIP-ViL, VisualBERT, image-only) produced the pair states:

1. **Hierarchical attention pooling.**  Every ordered pair (i, j) of steps was encoded jointly
   (``[CLS] step_i [SEP] step_j [SEP]`` + both images' tokens).  Token attention inside each
   segment of the pair gives a pair-specific vector of step i and one of step j; attention over
   the 2(n-1) pair-specific vectors of a step gives its representation.
2. **Paragraph encoder.**  A transformer (2 layers by default) without position embeddings over the
   step representations: the input order carries no information.
3. **Pairwise relations.**  The pair's [CLS] state gives a relation vector ``r_ij`` and the logit of
   "i comes before j" (trained with binary cross-entropy, weight ``lambda_pair``).
4. **Relational pointer decoder.**  An LSTM cell points at the next step; the pointer key of a
   candidate j is its paragraph-encoded state plus projections of ``r(last, j)``, ``r(second to
   last, j)`` and of forward/backward summaries ``mean_k r(j, k)``, ``mean_k r(k, j)`` over the
   still-unpointed steps k.  Training is teacher-forced NLL over the gold order.

Decoding: :meth:`BersonDecoder.greedy`, batched :meth:`BersonDecoder.beam_search` (width 1 gives
the greedy order) and, from the pairwise logits, the decoders of :mod:`decoders` (topological sort,
exact search).  Shapes: ``B`` instances, ``n`` step slots, ``H`` hidden size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

NEG_INF = float("-inf")


class AttentionPool(nn.Module):
    """Additive attention pooling ``sum_t softmax(w^T tanh(W x_t)) x_t`` over the masked positions."""

    def __init__(self, hidden: int):
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.score = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` (..., T, H), ``mask`` (..., T) bool -> (..., H); rows without any position give 0."""
        logits = self.score(torch.tanh(self.proj(x))).squeeze(-1).float()
        logits = logits.masked_fill(~mask, NEG_INF)
        weights = torch.softmax(logits, dim=-1).nan_to_num(0.0).to(x.dtype)
        return torch.einsum("...t,...th->...h", weights, x)


@dataclass
class BersonState:
    """What the decoder keeps per instance after encoding: context states and pairwise relations."""

    context: torch.Tensor      # (B, n, H) paragraph-encoded step states
    paragraph: torch.Tensor    # (B, H) masked mean of ``context``
    relations: torch.Tensor    # (B, n, n, H) relation vector r_ij (0 on the diagonal / padding)
    pair_logits: torch.Tensor  # (B, n, n) logit of "i before j" (0 on invalid pairs)
    step_mask: torch.Tensor    # (B, n) bool


def valid_pairs(step_mask: torch.Tensor) -> torch.Tensor:
    """(B, n, n) bool: ordered pairs (i, j), i != j, of real steps."""
    n = step_mask.shape[1]
    eye = torch.eye(n, dtype=torch.bool, device=step_mask.device)
    return step_mask[:, :, None] & step_mask[:, None, :] & ~eye


def take_steps(x: torch.Tensor, b: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """``x[b, i]`` for ``x`` (B, n, ...) and long indices ``b``, ``i`` (broadcast together), by ``index_select``.

    Same values as advanced indexing, but the backward adds repeated ``(b, i)`` (every step appears in
    2(n-1) pairs; padding is read as step 0) one index at a time: advanced indexing's backward
    accumulates them with parallel atomic adds on a multi-threaded CPU, so two runs of one seed
    drifted apart after a few optimizer steps.
    """
    flat = b * x.shape[1] + i
    return x.flatten(0, 1).index_select(0, flat.reshape(-1)).view(*flat.shape, *x.shape[2:])


def pair_index(step_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat indices ``(b, i, j)`` of all valid ordered pairs, n(n-1) per instance, row-major."""
    b, i, j = valid_pairs(step_mask).nonzero(as_tuple=True)
    return b, i, j


class BersonDecoder(nn.Module):
    """Hierarchical pooling + paragraph encoder + pairwise head + relational pointer decoder.

    Args:
        hidden_size: the pair encoder's hidden size ``H``.
        paragraph_layers / paragraph_heads: the paragraph transformer (BERSON: 2 layers).
        dropout: dropout in the paragraph encoder and before the heads.
        lambda_pair: weight of the pairwise cross-entropy in :meth:`loss` (BERSON: 0.6).
    """

    def __init__(self, hidden_size: int, paragraph_layers: int = 2, paragraph_heads: int = 8,
                 dropout: float = 0.1, lambda_pair: float = 0.6):
        super().__init__()
        H = hidden_size
        if H % paragraph_heads:
            raise ValueError(f"hidden size {H} is not divisible by paragraph_heads={paragraph_heads}")
        self.hidden_size = H
        self.lambda_pair = float(lambda_pair)
        self.token_pool = AttentionPool(H)
        self.pair_pool = AttentionPool(H)
        layer = nn.TransformerEncoderLayer(H, paragraph_heads, dim_feedforward=4 * H, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.paragraph = nn.TransformerEncoder(layer, paragraph_layers, enable_nested_tensor=False)
        self.paragraph_norm = nn.LayerNorm(H)
        self.dropout = nn.Dropout(dropout)
        self.relation = nn.Sequential(nn.Linear(H, H), nn.Tanh())
        self.pair_head = nn.Linear(H, 1)
        # pointer network
        self.start = nn.Parameter(torch.zeros(H))
        self.init_h = nn.Linear(H, H)
        self.cell = nn.LSTMCell(H, H)
        self.key = nn.Linear(H, H)
        self.key_last = nn.Linear(H, H, bias=False)
        self.key_second = nn.Linear(H, H, bias=False)
        self.key_forward = nn.Linear(H, H, bias=False)
        self.key_backward = nn.Linear(H, H, bias=False)
        self.query = nn.Linear(H, H, bias=False)
        self.score = nn.Linear(H, 1, bias=False)

    # ------------------------------------------------------------------ encoding
    def pool_pair_segments(self, states: torch.Tensor, segment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token attention inside each segment of a chunk of pairs.

        ``states`` (N, T, H) output states of N pair sequences; ``segment`` (N, T) long: 0 for the
        tokens (text + image) of the first step, 1 for the second, -1 elsewhere (CLS, SEP, padding).
        Returns the pair-specific vectors of the first and of the second step, each (N, H).
        """
        masks = torch.stack([segment == 0, segment == 1], dim=1)                 # (N, 2, T)
        pooled = self.token_pool(states[:, None].expand(-1, 2, -1, -1), masks)   # (N, 2, H)
        return pooled[:, 0], pooled[:, 1]

    def encode(self, first: torch.Tensor, second: torch.Tensor, cls: torch.Tensor,
               index: tuple[torch.Tensor, torch.Tensor, torch.Tensor], step_mask: torch.Tensor) -> BersonState:
        """Scatter per-pair vectors back to (B, n, n, H) and build the decoder state.

        ``first``/``second``/``cls`` (N, H) belong to the pairs ``index = (b, i, j)`` of
        :func:`pair_index`.
        """
        B, n = step_mask.shape
        H = self.hidden_size
        b, i, j = index
        # float32 grid: under autocast the pooled vectors and [CLS] states may differ in dtype
        grid = first.new_zeros(3, B, n, n, H, dtype=torch.float32)
        grid[0, b, i, j] = first.float()
        grid[1, b, i, j] = second.float()
        grid[2, b, i, j] = cls.float()
        seg_first, seg_second, pair_cls = grid[0], grid[1], grid[2]
        valid = valid_pairs(step_mask)
        # the 2(n-1) pair-specific vectors of step i: i first in (i, j), i second in (j, i)
        per_step = torch.cat([seg_first, seg_second.transpose(1, 2)], dim=2)   # (B, n, 2n, H)
        per_mask = torch.cat([valid, valid.transpose(1, 2)], dim=2)
        steps = self.pair_pool(per_step, per_mask)                              # (B, n, H)
        context = self.paragraph(steps, src_key_padding_mask=~step_mask)
        context = self.paragraph_norm(context) * step_mask[..., None]
        paragraph = context.sum(1) / step_mask.sum(1, keepdim=True).clamp(min=1)
        relations = self.relation(self.dropout(pair_cls)) * valid[..., None]
        pair_logits = self.pair_head(self.dropout(pair_cls)).squeeze(-1) * valid
        return BersonState(context, paragraph, relations, pair_logits, step_mask)

    # ------------------------------------------------------------------ pointer
    def _keys(self, state: BersonState, last: torch.Tensor, second: torch.Tensor,
              unpointed: torch.Tensor) -> torch.Tensor:
        """Pointer keys (B, M, n, H) for M decoder states per instance.

        ``last``/``second`` (B, M): the last and second-to-last pointed steps (-1: none yet);
        ``unpointed`` (B, M, n) bool: real steps not pointed yet.
        """
        R = state.relations
        B, n = state.step_mask.shape
        rows = torch.arange(B, device=R.device)[:, None]
        r_last = take_steps(R, rows, last.clamp(min=0)) * (last >= 0)[..., None, None]       # (B, M, n, H)
        r_second = take_steps(R, rows, second.clamp(min=0)) * (second >= 0)[..., None, None]
        u = unpointed.to(R.dtype)
        count = (u.sum(-1, keepdim=True) - u).clamp(min=1)[..., None]            # others still unpointed
        fwd = torch.einsum("bmk,bjkh->bmjh", u, R) / count                       # mean_k r(j, k)
        bwd = torch.einsum("bmk,bkjh->bmjh", u, R) / count                       # mean_k r(k, j)
        base = self.key(state.context)[:, None]                                   # (B, 1, n, H)
        return (base + self.key_last(r_last) + self.key_second(r_second)
                + self.key_forward(fwd) + self.key_backward(bwd))

    def _scores(self, keys: torch.Tensor, hidden: torch.Tensor, unpointed: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (B, M, n) of pointing at each candidate (pointed/padding: -inf).

        A state with no candidate left (after the last step of a short instance) gets a uniform
        distribution instead of NaNs; callers ignore it.
        """
        logits = self.score(torch.tanh(keys + self.query(hidden)[:, :, None])).squeeze(-1).float()
        empty = ~unpointed.any(-1, keepdim=True)
        logits = logits.masked_fill(~unpointed & ~empty, NEG_INF).masked_fill(empty, 0.0)
        return torch.log_softmax(logits, dim=-1)

    def _initial(self, state: BersonState, M: int) -> tuple[torch.Tensor, torch.Tensor]:
        B, H = state.paragraph.shape
        h = torch.tanh(self.init_h(state.paragraph))[:, None].expand(B, M, H).reshape(B * M, H)
        return h, torch.zeros_like(h)

    def pointer_log_probs(self, state: BersonState, gold: torch.Tensor) -> torch.Tensor:
        """Teacher-forced log-probabilities (B, n, n): step t's distribution given gold[:t].

        ``gold[b, t]`` = input position of the t-th step (-1 padding).
        """
        B, n = state.step_mask.shape
        H = self.hidden_size
        safe = gold.clamp(min=0)
        rows = torch.arange(B, device=gold.device)[:, None]
        prev = take_steps(state.context, rows, safe)                              # (B, n, H)
        inputs = torch.cat([self.start.expand(B, 1, H), prev[:, :-1]], dim=1)
        h, c = self._initial(state, 1)
        hidden = []
        for t in range(n):
            h, c = self.cell(inputs[:, t], (h, c))
            hidden.append(h)
        hidden = torch.stack(hidden, dim=1)                                       # (B, n, H)
        minus1 = torch.full((B, 1), -1, dtype=gold.dtype, device=gold.device)
        last = torch.cat([minus1, gold[:, :-1]], dim=1)
        second = torch.cat([minus1, minus1, gold[:, :-2]], dim=1)[:, :n]
        # rank[b, j] = place of step j in the gold order
        rank = torch.full((B, n + 1), n, dtype=torch.long, device=gold.device)
        rank.scatter_(1, torch.where(gold >= 0, gold, n), torch.arange(n, device=gold.device).expand(B, n))
        rank = rank[:, :n]
        t = torch.arange(n, device=gold.device)
        unpointed = state.step_mask[:, None, :] & (rank[:, None, :] >= t[None, :, None])  # (B, t, j)
        keys = self._keys(state, last, second, unpointed)
        return self._scores(keys, hidden, unpointed)

    def loss_terms(self, state: BersonState, gold: torch.Tensor, pair_targets: torch.Tensor,
                   next_ok: Optional[torch.Tensor] = None, pair_mask: Optional[torch.Tensor] = None
                   ) -> dict[str, torch.Tensor]:
        """Per-instance sums and counts of the loss, each (B,): ``pointer_nll`` over ``steps`` real
        steps, ``pair_bce`` and ``pair_correct`` over ``pairs`` valid pairs.

        ``next_ok`` (B, n, n) bool, optional: the steps the pointer may point at t-th (teacher-forced on
        ``gold``); its NLL is then that of pointing at any of them (log of their summed probability)
        instead of at ``gold[:, t]``.  ``pair_mask`` (B, n, n) bool, optional: the pairs the pairwise
        loss counts (default every valid pair).  Both from
        :func:`seqaware.modules.sequencing.reference_targets` (``model.multi_reference_targets``).

        Means over any set of instances (a batch, the global batch of every rank, a whole split)
        are sums of these divided by sums of the counts.
        """
        logp = self.pointer_log_probs(state, gold)
        real = gold >= 0
        if next_ok is None:
            picked = logp.gather(2, gold.clamp(min=0)[..., None]).squeeze(-1)
        else:  # every row holds its gold step, whose log-probability is finite
            picked = torch.logsumexp(logp.masked_fill(~next_ok, NEG_INF), dim=-1)
        valid = valid_pairs(state.step_mask)
        if pair_mask is not None:
            valid = valid & pair_mask
        logits = state.pair_logits.float()
        bce = F.binary_cross_entropy_with_logits(logits, pair_targets.float(), reduction="none")
        correct = ((logits > 0) == (pair_targets > 0.5)) & valid
        return {"pointer_nll": -torch.where(real, picked, torch.zeros_like(picked)).sum(1), "steps": real.sum(1),
                "pair_bce": torch.where(valid, bce, torch.zeros_like(bce)).sum((1, 2)), "pairs": valid.sum((1, 2)),
                "pair_correct": correct.sum((1, 2))}

    def loss(self, state: BersonState, gold: torch.Tensor, pair_targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Pointer NLL (mean over real steps) + ``lambda_pair`` * pairwise BCE (mean over pairs)."""
        t = self.loss_terms(state, gold, pair_targets)
        pointer = t["pointer_nll"].sum() / t["steps"].sum().clamp(min=1)
        pairs = t["pairs"].sum().clamp(min=1)
        pair = t["pair_bce"].sum() / pairs
        pair_acc = t["pair_correct"].sum().float() / pairs
        return {"loss": pointer + self.lambda_pair * pair, "pointer_loss": pointer.detach(),
                "pair_loss": pair.detach(), "pair_acc": pair_acc.detach()}

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def greedy(self, state: BersonState) -> list[list[int]]:
        """Point at the most probable unpointed step at every step."""
        B, n = state.step_mask.shape
        dev = state.step_mask.device
        h, c = self._initial(state, 1)
        x = self.start.expand(B, -1)
        unpointed = state.step_mask.clone()
        last = torch.full((B,), -1, dtype=torch.long, device=dev)
        second = last.clone()
        rows = torch.arange(B, device=dev)
        picks = []
        for _ in range(n):
            h, c = self.cell(x, (h, c))
            keys = self._keys(state, last[:, None], second[:, None], unpointed[:, None])
            logp = self._scores(keys, h[:, None], unpointed[:, None])[:, 0]
            done = ~unpointed.any(1)
            pick = logp.argmax(-1).masked_fill(done, 0)
            picks.append(torch.where(done, torch.full_like(pick, -1), pick))
            unpointed = unpointed.clone()
            unpointed[rows, pick] &= done  # clears the picked step of unfinished instances
            second, last = last, torch.where(done, last, pick)
            x = state.context[rows, pick]
        picks = torch.stack(picks, 1)
        return [[int(p) for p in row[: int(k)]] for row, k in zip(picks, state.step_mask.sum(1))]

    @torch.no_grad()
    def beam_search(self, state: BersonState, width: int = 16) -> list[list[int]]:
        """Batched beam search over pointer log-probabilities; returns the best complete order.

        Beams are kept per instance as a (B, K) grid; at step t every beam is extended by every
        unpointed step and the best ``K`` of the ``K * n`` extensions are kept.  Instances that
        have pointed all their steps carry their beams forward unchanged.
        """
        B, n = state.step_mask.shape
        K = max(1, int(width))
        dev = state.step_mask.device
        H = self.hidden_size
        h, c = self._initial(state, K)
        x = self.start.expand(B * K, H)
        unpointed = state.step_mask[:, None, :].expand(B, K, n).clone()
        last = torch.full((B, K), -1, dtype=torch.long, device=dev)
        second = last.clone()
        score = torch.full((B, K), NEG_INF, device=dev)
        score[:, 0] = 0.0                                   # one live beam at the start
        seqs = torch.full((B, K, n), -1, dtype=torch.long, device=dev)
        rows = torch.arange(B, device=dev)[:, None]
        lengths = state.step_mask.sum(1)
        for t in range(n):
            h, c = self.cell(x, (h, c))
            keys = self._keys(state, last, second, unpointed)
            logp = self._scores(keys, h.view(B, K, H), unpointed)          # (B, K, n)
            finished = (lengths <= t)[:, None, None]
            stay = torch.full_like(logp, NEG_INF)
            stay[..., 0] = 0.0
            logp = torch.where(finished, stay, logp)
            total = (score[..., None] + logp).view(B, K * n)
            score, flat = total.topk(K, dim=-1)                               # (B, K)
            beam, pick = flat // n, flat % n
            h = h.view(B, K, H)[rows, beam].reshape(B * K, H)
            c = c.view(B, K, H)[rows, beam].reshape(B * K, H)
            unpointed = unpointed[rows, beam].clone()
            last, second = last[rows, beam], second[rows, beam]
            seqs = seqs[rows, beam].clone()
            live = ~finished[:, :, 0].expand(B, K)
            seqs[..., t] = torch.where(live, pick, seqs[..., t])
            unpointed.scatter_(2, pick[..., None], (unpointed.gather(2, pick[..., None]) & ~live[..., None]))
            second, last = torch.where(live, last, second), torch.where(live, pick, last)
            x = state.context[rows, pick].reshape(B * K, H)
        best = score.argmax(-1)
        out = seqs[torch.arange(B, device=dev), best]
        return [[int(p) for p in row[: int(k)]] for row, k in zip(out, lengths)]
