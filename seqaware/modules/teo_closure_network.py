"""The closure head's network (:mod:`seqaware.modules.teo_closure_head` docstring, 2-5): pair and word-overlap
features, the max-product closure, the ensemble of heads computed side by side, and the plans as its tensors."""
from __future__ import annotations

import functools
import math
import re
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from seqaware.modules.teo_plan_head import pair_position_features

HEAD_KEYS = ("step_dim", "pair_hidden", "dropout", "closure", "lexical")
CLOSURES = ("max", "none")
NUM_PAIR_FEATURES = 8
NUM_LEXICAL_FEATURES = 8


def pair_features(num_steps: torch.Tensor, size: int) -> torch.Tensor:
    """(B, S, S, 8) features of the pair (a, b): :func:`pair_position_features` (5) plus b is the
    last step, a is the first step, plan length / 20."""
    base = pair_position_features(num_steps, size)
    idx = torch.arange(size, device=num_steps.device)
    n = num_steps.to(base.device)[:, None, None]
    last = (idx[None, None, :] == n - 1).float().expand(-1, size, -1)
    first = (idx[None, :, None] == 0).float().expand(len(num_steps), -1, size)
    length = (n.float() / 20).expand(-1, size, size)
    return torch.cat([base, last[..., None], first[..., None], length[..., None]], -1)


# function words and the generic verbs and measures of recipe steps: what two steps sharing says nothing
STOPWORDS = frozenset("""
a an the and or but of to in on with for into onto from at by over under until about as is are be been it its them
they this that these those your you some all each any then than so if when while after before once
place put add remove set aside stir mix cook let take make use leave keep bring turn
minute minutes hour hours second seconds heat medium low high large small little well more few
""".split())
ANAPHOR = re.compile(r"\b(it|them|they|mixture|this|these|rest|remaining|back|everything)\b")


def content_words(text: str) -> frozenset[str]:
    """Lower-cased alphabetic words of 3+ letters, not :data:`STOPWORDS`, a plural ``s`` dropped from words of 4+."""
    words = re.findall(r"[a-z]+", text.lower())
    return frozenset(w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words if len(w) > 2 and w not in STOPWORDS)


@functools.lru_cache(maxsize=4096)
def lexical_pair_features(steps: tuple[str, ...]) -> np.ndarray:
    """(n, n, 8) word-overlap features of the pairs ``a < b`` of a plan (``[a, b]``; zero elsewhere),
    ``model.head.lexical``: what a step's product passing into a later step tends to leave in the text.

    0. Jaccard overlap of the two steps' :func:`content_words`;  1. / 2. the shared words' share of
    step a's / step b's words;  3. any word shared;  4. a is the earlier step sharing the most words
    with b (ties: the latest), and shares some;  5. step b refers back (``it``, ``them``, ``mixture``,
    ``the rest``, ...: :data:`ANAPHOR`);  6. a word of a reappears in a step between a and b;
    7. shared words, capped at 5, / 5.  Cached by the step texts (plans are re-scored every step).
    """
    words = [content_words(s) for s in steps]
    n = len(steps)
    out = np.zeros((n, n, NUM_LEXICAL_FEATURES), dtype=np.float32)
    for b in range(1, n):
        overlaps = [len(words[k] & words[b]) for k in range(b)]
        best = max(range(b), key=lambda k: (overlaps[k], k))
        refers = float(bool(ANAPHOR.search(steps[b].lower())))
        between: set[str] = set()
        for a in range(b - 1, -1, -1):  # steps a+1..b-1 are in ``between`` when a is scored
            shared = overlaps[a]
            union = len(words[a] | words[b])
            out[a, b] = (shared / max(union, 1), shared / max(len(words[a]), 1), shared / max(len(words[b]), 1),
                         float(shared > 0), float(a == best and shared > 0), refers,
                         float(bool(words[a] & between)), min(shared, 5) / 5)
            between |= words[a]
    out.flags.writeable = False  # cached and shared: callers copy it
    return out


def max_product_closure(direct: torch.Tensor) -> torch.Tensor:
    """(B, S, S) direct-dependency probabilities (``[a, b]`` for ``a < b``; the rest is ignored) ->
    ``r[a, b]`` = the largest product of ``direct`` along a path ``a < k_1 < ... < b`` (upper
    triangle; zero elsewhere), by repeated squaring in the (max, x) semiring."""
    size = direct.shape[-1]
    reach = torch.triu(direct, diagonal=1)
    for _ in range(max(1, math.ceil(math.log2(max(size - 1, 1))))):
        two = (reach[:, :, :, None] * reach[:, None, :, :]).amax(dim=2)     # best path through one middle step
        reach = torch.maximum(reach, two)
    return reach


class MemberLinear(nn.Module):
    """``members`` independent linear layers side by side: (M, N, fan_in) -> (M, N, fan_out), each
    initialised as :class:`torch.nn.Linear` is (uniform in +-1/sqrt(fan_in))."""

    def __init__(self, members: int, fan_in: int, fan_out: int):
        super().__init__()
        bound = 1 / math.sqrt(fan_in)
        self.weight = nn.Parameter(torch.empty(members, fan_in, fan_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, fan_out).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class ClosureEnsemble(nn.Module):
    """``members`` closure heads (:mod:`seqaware.modules.teo_closure_head` docstring, 2-5), side by side in one pass.

    :meth:`member_probs` gives each member's (M, B, S, S) symmetric dependency probabilities,
    :meth:`forward` their mean, :meth:`loss` the sum of the members' losses (their parameters are
    disjoint, so each member trains exactly as it would alone).
    """

    def __init__(self, input_dim: int, members: int = 3, step_dim: int = 64, pair_hidden: int = 64,
                 dropout: float = 0.3, closure: str = "max", lexical: bool = False):
        super().__init__()
        if members < 1:
            raise ValueError(f"model.members must be at least 1, got {members}")
        if closure not in CLOSURES:
            raise ValueError(f"model.head.closure must be one of {list(CLOSURES)}, got {closure!r}")
        self.members, self.closure, self.dropout, self.lexical = members, closure, dropout, bool(lexical)
        self.proj = MemberLinear(members, input_dim, step_dim)
        extra = NUM_PAIR_FEATURES + (NUM_LEXICAL_FEATURES if self.lexical else 0)
        self.hidden = MemberLinear(members, 4 * step_dim + extra, pair_hidden)
        self.out = MemberLinear(members, pair_hidden, 1)

    def direct(self, steps: torch.Tensor, mask: torch.Tensor, num_steps: torch.Tensor,
               lexical: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(M, B, S, S) direct-dependency probabilities of the pairs ``a < b`` of each plan (0 elsewhere).
        Only those pairs go through the pair MLP (about a sixth of the padded S x S grid for CaT-Bench).
        ``lexical`` (B, S, S, 8): :func:`lexical_pair_features` (:func:`plan_tensors`), read when the
        head was built with ``lexical``."""
        B, S, H = steps.shape
        M = self.members
        x = F.dropout(steps.reshape(1, B * S, H).expand(M, -1, -1), self.dropout, self.training)  # a mask per member
        h = self.proj(x).view(M, B, S, -1)
        plan, a, b = torch.triu(mask[:, :, None] & mask[:, None, :], diagonal=1).nonzero(as_tuple=True)
        ha, hb = h[:, plan, a], h[:, plan, b]
        position = pair_features(num_steps.to(h.device), S)[plan, a, b]
        if self.lexical:
            if lexical is None:
                raise ValueError("this head reads lexical pair features (model.head.lexical=true): pass plan_tensors' 'lexical'")
            position = torch.cat([position, lexical.to(position)[plan, a, b]], -1)
        position = position.expand(M, -1, -1)
        hidden = F.gelu(self.hidden(torch.cat([ha, hb, ha * hb, (ha - hb).abs(), position], -1)))
        logits = self.out(F.dropout(hidden, self.dropout, self.training))[..., 0]
        direct = h.new_zeros(M, B, S, S, dtype=torch.float32)
        direct[:, plan, a, b] = torch.sigmoid(logits.float())
        return direct

    def member_probs(self, steps: torch.Tensor, mask: torch.Tensor, num_steps: torch.Tensor,
                     lexical: Optional[torch.Tensor] = None) -> torch.Tensor:
        direct = self.direct(steps, mask, num_steps, lexical)
        M, B, S, _ = direct.shape
        reach = max_product_closure(direct.view(M * B, S, S)).view(M, B, S, S) if self.closure == "max" else direct
        return reach + reach.transpose(-1, -2)

    def forward(self, steps: torch.Tensor, mask: torch.Tensor, num_steps: torch.Tensor,
                lexical: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.member_probs(steps, mask, num_steps, lexical).mean(0)

    def member_losses(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        """(M,) each member's weighted mean binary cross-entropy at the labelled pairs of ``data`` (:func:`plan_tensors`)."""
        probs = self.member_probs(data["steps"], data["mask"], data["num_steps"], data.get("lexical"))
        probs = probs[:, data["plan"], data["a"], data["b"]]
        bce = F.binary_cross_entropy(probs.clamp(1e-6, 1 - 1e-6), data["target"].expand_as(probs), reduction="none")
        return (bce * data["weight"]).sum(-1) / data["weight"].sum().clamp(min=1e-9)

    def loss(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.member_losses(data).sum()


# ---------------------------------------------------------------- data as tensors
def plan_tensors(embeddings: Sequence[torch.Tensor], plans: Sequence[dict[str, Any]], rfg_weight: float = 1.0,
                 lexical: bool = False) -> dict[str, torch.Tensor]:
    """Padded step embeddings (B, S, H), step mask, ``num_steps`` and the labelled pairs of ``plans``
    (``plan``, ``a``, ``b`` indices, ``target`` 1/0, ``weight``: ``rfg_weight`` for r-FG plans, else 1);
    with ``lexical`` (a head that reads them), also ``lexical`` (B, S, S, 8): :func:`lexical_pair_features`
    of every plan's ``steps`` texts."""
    B, S, H = len(embeddings), max(len(e) for e in embeddings), embeddings[0].shape[-1]
    steps = embeddings[0].new_zeros(B, S, H)
    for k, emb in enumerate(embeddings):
        steps[k, :len(emb)] = emb
    num_steps = torch.tensor([len(e) for e in embeddings], device=steps.device)
    rows = [(k, a, b, 1.0 if y == "yes" else 0.0, rfg_weight if plan.get("source") == "rfg" else 1.0)
            for k, plan in enumerate(plans) for a, b, y in plan.get("labels", ())]
    cols = list(zip(*rows)) if rows else [(), (), (), (), ()]
    long = lambda v: torch.tensor(v, dtype=torch.long, device=steps.device)  # noqa: E731
    extra = {}
    if lexical:
        words = np.zeros((B, S, S, NUM_LEXICAL_FEATURES), dtype=np.float32)
        for k, plan in enumerate(plans):
            n = len(plan.get("steps", ()))
            if n != len(embeddings[k]):
                raise ValueError(f"plan {plan.get('plan_id', k)!r}: {n} step texts but {len(embeddings[k])} step embeddings")
            words[k, :n, :n] = lexical_pair_features(tuple(plan["steps"]))
        extra["lexical"] = torch.from_numpy(words).to(steps.device)
    return {**extra, "steps": steps, "mask": torch.arange(S, device=steps.device)[None] < num_steps[:, None],
            "num_steps": num_steps, "plan": long(cols[0]), "a": long(cols[1]), "b": long(cols[2]),
            "target": torch.tensor(cols[3], dtype=torch.float32, device=steps.device),
            "weight": torch.tensor(cols[4], dtype=torch.float32, device=steps.device)}
