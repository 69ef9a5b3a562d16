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

Two variants (``model.decoder.variant``), every difference also a switch of its own (:data:`VARIANTS`;
``docs/protocols/berson.md`` lists them against BERSON's release, github.com/hwxcby/BERSON
``modeling_bert.py``, which Wu et al.'s release vendors):

``ours``
    pools without [SEP]; token and step attention ``w^T tanh(W x)``; a pre-norm ReLU paragraph encoder;
    ``r_ij = tanh(W CLS_ij)``; summaries divided by the number of other unpointed steps; the pointer
    reads paragraph-encoded states, starts from ``tanh(W paragraph)`` and a learnt input; the pointer
    NLL averaged over all real steps of the batch; PyTorch's default initialisation.
``paper`` (BERSON as released)
    each segment's pool includes its closing [SEP] (attention dropout on the token weights); the step
    score is one ``Linear(H, 1)``; the paragraph encoder is BertSum's (tanh-GELU, no input LayerNorm
    before the first layer's attention, LayerNorm eps 1e-6); ``r_ij = [CLS_ij ; softmax(pair logits_ij)]``
    (H + 2, a two-way pair head); summaries are means over all n slots (pointed and padded zeroed);
    the pointer's inputs are the step vectors *before* the paragraph encoder (a zero start), its keys
    ``W [s_j ; p_j]``, h0 the mean paragraph state, c0 = 0; the pointer NLL is summed over the steps and
    divided by n - 1 per instance (the last pick is forced), the pairwise loss averaged per instance,
    both then averaged over instances; BERT's initialisation (normal, std 0.02) of every linear layer.

Decoding: :meth:`BersonDecoder.greedy`, batched :meth:`BersonDecoder.beam_search` (width 1 gives
the greedy order), registered as the pointer decoders ``greedy`` and ``beam`` (:func:`pointer_greedy`,
:func:`pointer_beam`), and, from the pairwise logits, every pairwise decoder of :mod:`decoders`.  Shapes: ``B`` instances, ``n`` step slots, ``H`` hidden size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from decoders.registry import DECODERS

NEG_INF = float("-inf")

# model.decoder.variant -> the switches it sets; any switch given explicitly overrides its variant's value
VARIANTS: dict[str, dict[str, object]] = {
    "ours": {"sep_in_pools": False, "pool_dropout": 0.0, "step_score": "mlp", "paragraph": "prenorm_relu",
             "relation": "tanh", "summary_divisor": "unpointed", "pointer_inputs": "context", "loss_norm": "pooled",
             "init": "torch"},
    "paper": {"sep_in_pools": True, "pool_dropout": None, "step_score": "linear", "paragraph": "bertsum",
              "relation": "cls_probs", "summary_divisor": "slots", "pointer_inputs": "sentences",
              "loss_norm": "instance", "init": "bert"},
}
CHOICES = {"step_score": ("mlp", "linear"), "paragraph": ("prenorm_relu", "bertsum"),
           "relation": ("tanh", "cls_probs"), "summary_divisor": ("unpointed", "slots"),
           "pointer_inputs": ("context", "sentences"), "loss_norm": ("pooled", "instance"),
           "init": ("torch", "bert")}


class AttentionPool(nn.Module):
    """Attention pooling ``sum_t softmax(s(x_t)) x_t`` over the masked positions.

    ``score="mlp"``: ``s(x) = w^T tanh(W x)`` (additive attention); ``score="linear"``: ``s(x) = w^T x``
    (BERSON's step-level attention, ``linear_in_2``).  ``dropout`` drops attention weights after the
    softmax in training (BERSON's token-level attention, ``hidden_dropout_prob``).
    """

    def __init__(self, hidden: int, score: str = "mlp", dropout: float = 0.0):
        super().__init__()
        self.proj = nn.Linear(hidden, hidden) if score == "mlp" else None
        self.score = nn.Linear(hidden, 1, bias=False)
        self.dropout = nn.Dropout(dropout) if dropout else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` (..., T, H), ``mask`` (..., T) bool -> (..., H); rows without any position give 0."""
        hidden = x if self.proj is None else torch.tanh(self.proj(x))
        logits = self.score(hidden).squeeze(-1).float()
        logits = logits.masked_fill(~mask, NEG_INF)
        weights = torch.softmax(logits, dim=-1).nan_to_num(0.0).to(x.dtype)
        if self.dropout is not None:
            weights = self.dropout(weights)
        return torch.einsum("...t,...th->...h", weights, x)


class BertSumLayer(nn.Module):
    """One layer of BERSON's paragraph encoder (BertSum's ``TransformerEncoderLayer``, BERSON's
    ``encoder.py``): ``y = x + drop(attn(LN(x)))`` (the first layer attends to ``x`` itself, no input
    LayerNorm), then ``y + drop(W2 drop(gelu(W1 LN(y))))``; tanh-approximated GELU, LayerNorms with
    eps 1e-6, dropout on the attention weights too."""

    def __init__(self, hidden: int, heads: int, ff: int, dropout: float, first: bool):
        super().__init__()
        self.input_norm = nn.Identity() if first else nn.LayerNorm(hidden, eps=1e-6)
        self.attn = nn.MultiheadAttention(hidden, heads, dropout=dropout, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.ff_norm = nn.LayerNorm(hidden, eps=1e-6)
        self.w1 = nn.Linear(hidden, ff)
        self.w2 = nn.Linear(ff, hidden)
        self.ff_drop1 = nn.Dropout(dropout)
        self.ff_drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        q = self.input_norm(x)
        y = x + self.drop(self.attn(q, q, q, key_padding_mask=padding, need_weights=False)[0])
        inner = self.ff_drop1(F.gelu(self.w1(self.ff_norm(y)), approximate="tanh"))
        return y + self.ff_drop2(self.w2(inner))


class BertSumEncoder(nn.Module):
    """BERSON's paragraph encoder (``TransformerInterEncoder`` without position embeddings): the masked
    step vectors through :class:`BertSumLayer` s, then a LayerNorm (eps 1e-6)."""

    def __init__(self, hidden: int, heads: int, ff: int, dropout: float, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(BertSumLayer(hidden, heads, ff, dropout, first=k == 0) for k in range(layers))
        self.norm = nn.LayerNorm(hidden, eps=1e-6)

    def forward(self, x: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
        x = x * step_mask[..., None]
        for layer in self.layers:
            x = layer(x, ~step_mask)
        return self.norm(x)


def bert_init(module: nn.Module, std: float = 0.02) -> None:
    """BERT's ``_init_weights`` (what BERSON's ``BertForOrdering.init_weights`` applies to its head): every
    linear weight ~ N(0, std), biases 0, LayerNorms weight 1 and bias 0; the LSTM keeps PyTorch's."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.MultiheadAttention):
            nn.init.normal_(m.in_proj_weight, std=std)
            nn.init.zeros_(m.in_proj_bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


@dataclass
class BersonState:
    """What the decoder keeps per instance after encoding: context states and pairwise relations."""

    context: torch.Tensor      # (B, n, H) paragraph-encoded step states
    paragraph: torch.Tensor    # (B, H) masked mean of ``context``
    relations: torch.Tensor    # (B, n, n, R) relation vector r_ij (0 on the diagonal / padding); R = H or H + 2
    pair_logits: torch.Tensor  # (B, n, n) logit of "i before j" (0 on invalid pairs)
    step_mask: torch.Tensor    # (B, n) bool
    sentences: torch.Tensor    # (B, n, H) step vectors before the paragraph encoder (0 on padding)


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
        paragraph_layers / paragraph_heads: the paragraph transformer (BERSON: 2 layers, 8 heads).
        paragraph_ff: its feed-forward size (default 4H; BERSON's ROC script: 3072, 4H of BERT-base).
        dropout: dropout in the paragraph encoder and before the heads.
        lambda_pair: weight of the pairwise cross-entropy in :meth:`loss` (BERSON: 0.6).
        variant: ``ours`` | ``paper`` (BERSON as released), the defaults of the switches below
            (:data:`VARIANTS`; module docstring).  Each switch left ``None`` takes its variant's value:
        sep_in_pools: each segment's token attention includes its closing separator (read by the module
            that builds the segments, :meth:`seqaware.modules.berson.BersonModule._encode_chunk`).
        pool_dropout: dropout of the token-attention weights (``None``: ``dropout``).
        step_score: ``mlp`` (``w^T tanh(W x)``) | ``linear`` (``w^T x``) for the step-level attention.
        paragraph: ``prenorm_relu`` (PyTorch's pre-norm layers, ReLU) | ``bertsum`` (:class:`BertSumEncoder`).
        relation: ``tanh`` (``tanh(W CLS_ij)``) | ``cls_probs`` (``[CLS_ij ; softmax(W2 CLS_ij)]``, H + 2).
        summary_divisor: ``unpointed`` (the other unpointed steps) | ``slots`` (all n steps of the instance).
        pointer_inputs: ``context`` (paragraph states; learnt start, h0 = tanh(W paragraph)) | ``sentences``
            (step vectors before the paragraph encoder; zero start, h0 = paragraph, c0 = 0, keys from both).
        loss_norm: ``pooled`` (pointer NLL / real steps, pair BCE / pairs, over the batch) | ``instance``
            (per instance: NLL / (n - 1), BCE / pairs; then the mean over instances).
        init: ``torch`` (PyTorch's defaults) | ``bert`` (:func:`bert_init`).
    """

    def __init__(self, hidden_size: int, paragraph_layers: int = 2, paragraph_heads: int = 8,
                 dropout: float = 0.1, lambda_pair: float = 0.6, variant: str = "ours",
                 paragraph_ff: Optional[int] = None, sep_in_pools: Optional[bool] = None,
                 pool_dropout: Optional[float] = None, step_score: Optional[str] = None,
                 paragraph: Optional[str] = None, relation: Optional[str] = None,
                 summary_divisor: Optional[str] = None, pointer_inputs: Optional[str] = None,
                 loss_norm: Optional[str] = None, init: Optional[str] = None):
        super().__init__()
        H = hidden_size
        if H % paragraph_heads:
            raise ValueError(f"hidden size {H} is not divisible by paragraph_heads={paragraph_heads}")
        if variant not in VARIANTS:
            raise ValueError(f"model.decoder.variant must be one of {list(VARIANTS)}, got {variant!r}")
        given = {"sep_in_pools": sep_in_pools, "pool_dropout": pool_dropout, "step_score": step_score,
                 "paragraph": paragraph, "relation": relation, "summary_divisor": summary_divisor,
                 "pointer_inputs": pointer_inputs, "loss_norm": loss_norm, "init": init}
        opts = {k: VARIANTS[variant][k] if v is None else v for k, v in given.items()}
        for key, allowed in CHOICES.items():
            if opts[key] not in allowed:
                raise ValueError(f"model.decoder.{key} must be one of {list(allowed)}, got {opts[key]!r}")
        if opts["pool_dropout"] is None:
            opts["pool_dropout"] = dropout
        self.variant = variant
        self.options = opts
        self.hidden_size = H
        self.lambda_pair = float(lambda_pair)
        self.sep_in_pools = bool(opts["sep_in_pools"])
        self.summary_divisor = opts["summary_divisor"]
        self.pointer_inputs = opts["pointer_inputs"]
        self.loss_norm = opts["loss_norm"]
        self.relation_kind = opts["relation"]
        self.token_pool = AttentionPool(H, "mlp", float(opts["pool_dropout"]))
        self.pair_pool = AttentionPool(H, opts["step_score"])
        ff = int(paragraph_ff or 4 * H)
        if opts["paragraph"] == "bertsum":
            self.paragraph = BertSumEncoder(H, paragraph_heads, ff, dropout, paragraph_layers)
            self.paragraph_norm = None
        else:
            layer = nn.TransformerEncoderLayer(H, paragraph_heads, dim_feedforward=ff, dropout=dropout,
                                               batch_first=True, norm_first=True)
            self.paragraph = nn.TransformerEncoder(layer, paragraph_layers, enable_nested_tensor=False)
            self.paragraph_norm = nn.LayerNorm(H)
        self.dropout = nn.Dropout(dropout)
        if self.relation_kind == "cls_probs":   # BERSON: one two-way head; class 1 = "i before j"
            self.relation = None
            self.pair_head = nn.Linear(H, 2)
            R = H + 2
        else:
            self.relation = nn.Sequential(nn.Linear(H, H), nn.Tanh())
            self.pair_head = nn.Linear(H, 1)
            R = H
        self.relation_size = R
        # pointer network
        if self.pointer_inputs == "sentences":
            self.register_buffer("start", torch.zeros(H), persistent=False)   # BERSON: a zero first input
            self.init_h = None
            self.key = nn.Linear(2 * H, H)                                      # W [s_j ; p_j]
        else:
            self.start = nn.Parameter(torch.zeros(H))
            self.init_h = nn.Linear(H, H)
            self.key = nn.Linear(H, H)
        self.cell = nn.LSTMCell(H, H)
        self.key_last = nn.Linear(R, H, bias=False)
        self.key_second = nn.Linear(R, H, bias=False)
        self.key_forward = nn.Linear(R, H, bias=False)
        self.key_backward = nn.Linear(R, H, bias=False)
        self.query = nn.Linear(H, H, bias=self.pointer_inputs == "sentences")   # BERSON's query_linear has a bias
        self.score = nn.Linear(H, 1, bias=False)
        if opts["init"] == "bert":
            # BERSON's pw_k is one Linear(4R, H, bias=False) over [r_last; r_second; forward; backward], the sum
            # of the four blocks above; N(0, 0.02) on the whole matrix is N(0, 0.02) on each block
            bert_init(self)

    # ------------------------------------------------------------------ encoding
    def pool_pair_segments(self, states: torch.Tensor, segment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token attention inside each segment of a chunk of pairs.

        ``states`` (N, T, H) output states of N pair sequences; ``segment`` (N, T) long: 0 for the
        tokens (text + image) of the first step, 1 for the second, -1 elsewhere (CLS, padding, and the
        separators unless ``sep_in_pools``).
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
        steps = self.pair_pool(per_step, per_mask) * step_mask[..., None]       # (B, n, H)
        if self.paragraph_norm is None:
            context = self.paragraph(steps, step_mask)
        else:
            context = self.paragraph_norm(self.paragraph(steps, src_key_padding_mask=~step_mask))
        context = context * step_mask[..., None]
        paragraph = context.sum(1) / step_mask.sum(1, keepdim=True).clamp(min=1)
        if self.relation is None:
            two = self.pair_head(pair_cls)                                         # (B, n, n, 2)
            pair_logits = (two[..., 1] - two[..., 0]) * valid
            relations = torch.cat([pair_cls, torch.softmax(two.float(), -1).to(pair_cls.dtype)], -1) * valid[..., None]
        else:
            relations = self.relation(self.dropout(pair_cls)) * valid[..., None]
            pair_logits = self.pair_head(self.dropout(pair_cls)).squeeze(-1) * valid
        return BersonState(context, paragraph, relations, pair_logits, step_mask, steps)

    # ------------------------------------------------------------------ pointer
    def _keys(self, state: BersonState, last: torch.Tensor, second: torch.Tensor,
              unpointed: torch.Tensor) -> torch.Tensor:
        """Pointer keys (B, M, n, H) for M decoder states per instance.

        ``last``/``second`` (B, M): the last and second-to-last pointed steps (-1: none yet);
        ``unpointed`` (B, M, n) bool: real steps not pointed yet.  The forward / backward summaries of a
        candidate j, ``sum_k r(j, k)`` and ``sum_k r(k, j)`` over the other unpointed steps k, are divided
        by their number (``summary_divisor=unpointed``) or by the instance's number of steps (``slots``:
        BERSON's ``mean`` over all n slots with the pointed ones zeroed).
        """
        R = state.relations
        B, n = state.step_mask.shape
        rows = torch.arange(B, device=R.device)[:, None]
        r_last = take_steps(R, rows, last.clamp(min=0)) * (last >= 0)[..., None, None]       # (B, M, n, R)
        r_second = take_steps(R, rows, second.clamp(min=0)) * (second >= 0)[..., None, None]
        u = unpointed.to(R.dtype)
        if self.summary_divisor == "slots":
            count = state.step_mask.sum(1).clamp(min=1).to(R.dtype)[:, None, None, None]
        else:
            count = (u.sum(-1, keepdim=True) - u).clamp(min=1)[..., None]        # others still unpointed
        # r(j, j) = 0 (valid_pairs), so the sums over unpointed k leave j itself out
        fwd = torch.einsum("bmk,bjkh->bmjh", u, R) / count                       # sum_k r(j, k) / count
        bwd = torch.einsum("bmk,bkjh->bmjh", u, R) / count                       # sum_k r(k, j) / count
        if self.pointer_inputs == "sentences":
            base = self.key(torch.cat([state.sentences, state.context], -1))[:, None]
        else:
            base = self.key(state.context)[:, None]                               # (B, 1, n, H)
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
        """The LSTM's (h0, c0), each (B * M, H): ``tanh(W paragraph)`` and 0, or (``pointer_inputs=sentences``,
        BERSON) the mean paragraph state and 0."""
        B, H = state.paragraph.shape
        h = state.paragraph if self.init_h is None else torch.tanh(self.init_h(state.paragraph))
        h = h[:, None].expand(B, M, H).reshape(B * M, H)
        return h, torch.zeros_like(h)

    def _inputs(self, state: BersonState) -> torch.Tensor:
        """(B, n, H): what the pointer reads as the input after pointing at a step."""
        return state.sentences if self.pointer_inputs == "sentences" else state.context

    def pointer_log_probs(self, state: BersonState, gold: torch.Tensor) -> torch.Tensor:
        """Teacher-forced log-probabilities (B, n, n): step t's distribution given gold[:t].

        ``gold[b, t]`` = input position of the t-th step (-1 padding).
        """
        B, n = state.step_mask.shape
        H = self.hidden_size
        safe = gold.clamp(min=0)
        rows = torch.arange(B, device=gold.device)[:, None]
        prev = take_steps(self._inputs(state), rows, safe)                        # (B, n, H)
        inputs = torch.cat([self.start.to(prev.dtype).expand(B, 1, H), prev[:, :-1]], dim=1)
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
        are sums of these divided by sums of the counts.  ``loss_norm=instance`` (BERSON) divides each
        instance's NLL by ``steps - 1`` (the last pick is forced) and its BCE by ``pairs``, and averages
        over instances: :meth:`normalised` turns these terms into that.
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

    def normalised(self, terms: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``pointer_loss`` and ``pair_loss`` as (per-instance sums, counts), each (B,), whose sums' ratio over
        any set of instances is the loss of ``loss_norm``: ``pooled``: (NLL, real steps), (BCE, pairs);
        ``instance``: (NLL / (steps - 1), 1), (BCE / pairs, 1) -- BERSON's per-instance means, averaged."""
        if self.loss_norm == "pooled":
            return {"pointer_loss": (terms["pointer_nll"], terms["steps"]),
                    "pair_loss": (terms["pair_bce"], terms["pairs"])}
        one = torch.ones_like(terms["steps"])
        return {"pointer_loss": (terms["pointer_nll"] / (terms["steps"] - 1).clamp(min=1), one),
                "pair_loss": (terms["pair_bce"] / terms["pairs"].clamp(min=1), one)}

    def loss(self, state: BersonState, gold: torch.Tensor, pair_targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Pointer NLL + ``lambda_pair`` * pairwise BCE, each normalised as ``loss_norm`` says (:meth:`normalised`)."""
        t = self.loss_terms(state, gold, pair_targets)
        norm = self.normalised(t)
        pointer = norm["pointer_loss"][0].sum() / norm["pointer_loss"][1].sum().clamp(min=1)
        pair = norm["pair_loss"][0].sum() / norm["pair_loss"][1].sum().clamp(min=1)
        pairs = t["pairs"].sum().clamp(min=1)
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
        inputs = self._inputs(state)
        x = self.start.to(inputs.dtype).expand(B, -1)
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
            x = inputs[rows, pick]
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
        inputs = self._inputs(state)
        x = self.start.to(inputs.dtype).expand(B * K, H)
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
            x = inputs[rows, pick].reshape(B * K, H)
        best = score.argmax(-1)
        out = seqs[torch.arange(B, device=dev), best]
        return [[int(p) for p in row[: int(k)]] for row, k in zip(out, lengths)]


@DECODERS.register("greedy", needs="pointer")
def pointer_greedy(network: BersonDecoder, state: BersonState, beam_size: int = 1) -> list[list[int]]:
    """BERSON's pointer network, greedy: the most probable unpointed step at every step."""
    return network.greedy(state)


@DECODERS.register("beam", needs="pointer")
def pointer_beam(network: BersonDecoder, state: BersonState, beam_size: int = 16) -> list[list[int]]:
    """BERSON's pointer network, beam search of width ``beam_size`` (``model.beam_size``)."""
    return network.beam_search(state, beam_size)
