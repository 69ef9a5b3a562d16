"""A step-dependency head for CaT-Bench trained on CaT-Bench's own labels, its settings chosen by
plan-level cross-validation (``experiment=teo_plan_head_catbench``).

CaT-Bench (Lal et al., EMNLP 2024) asks of two steps ``first < second`` of a plan "must step *second*
happen after step *first*?" (and the same pair the other way round, "... before ..."): whether the
later step depends on the earlier one, directly or through other steps.  The labelled pairs of its
validation split are transitively consistent (wherever two "yes" pairs imply a third pair and it is
asked, it is "yes"; docs/results/teo.md), so the model predicts *direct* dependencies and closes them:

1. **Step embeddings.**  Each step is encoded on its own by the frozen sentence encoder (MiniLM by
   default) and mean-pooled over its tokens, ``[CLS]`` and ``[SEP]`` included (the pooling
   all-MiniLM-L6-v2 and all-mpnet-base-v2 were trained with), then L2-normalised.  The encoder never
   trains, so every plan is encoded once per run (cached by its step texts).  **Feature sets**: the
   model's ``encoder`` (``backbones.text``) gives the set named ``encoder``; ``extra_features`` adds
   named frozen text models (``{mpnet: offline:mpnet}``), each tokenising the step texts itself.  A
   setting's ``features`` names one set or several joined by ``+`` (``encoder+mpnet``: the normalised
   embeddings side by side), so the cross-validation can choose the features like any other setting.
2. **Direct dependencies.**  ``h = Linear(Dropout(e))`` per step, then for every pair ``a < b``
   ``d(a, b) = sigmoid(MLP([h_a, h_b, h_a * h_b, |h_a - h_b|, position features]))``; position
   features: those of the plan-aware head (:func:`seqaware.modules.teo_plan_head.pair_position_features`)
   plus "b is the last step", "a is the first step" and the plan length / 20; with ``lexical: true`` also
   eight word-overlap features of the two steps (:func:`lexical_pair_features`).
3. **Closure** (``closure: max``).  ``r(a, b) = max over step paths a = k_0 < k_1 < ... < k_m = b of
   prod_i d(k_i, k_i+1)``: the most probable chain of direct dependencies, by repeated squaring in the
   (max, x) semiring (``ceil(log2 S)`` products; :func:`max_product_closure`).  ``closure: none``
   answers from ``d`` alone.
4. **Answer.**  The matrix is symmetric (``r(b, a) = r(a, b)``), so both questions about a pair,
   "before" and "after", get the same answer: twin consistency 1 by construction.  Yes when
   ``r >= threshold``.
5. **Ensemble.**  ``members`` heads from different initialisations trained side by side (disjoint
   parameters, summed losses: each trains exactly as it would alone), their ``r`` averaged.
6. **Blend** (``blend: w``, default 0).  The answer's probability is ``(1 - w) r + w p_lr``, with
   ``p_lr`` the logistic-regression baseline's (below; the mean over both presentations of the pair,
   so twins still agree).  A grid setting may set it; settings that differ only in ``blend`` share
   their trained heads in the cross-validation.

Training: binary cross-entropy of ``r`` at every labelled pair, all training plans in one batch
(``data.batch_size: null``), ``trainer.max_epochs`` steps of the optimiser (AdamW); pairs of r-FG
plans (``source: rfg``, optional extra supervision) weigh ``rfg_weight``.

**Model selection** (in ``setup("fit")``, before the optimiser is built): every setting of
``cv_grid`` (overrides of the head settings above) is trained on the training plans of each
cross-validation fold (the data module's plan-level folds; a plan is never split) exactly as the
final model is trained, and scored on the fold's held-out plans.  Each fold is answered at the
threshold chosen (macro F1, :func:`~seqaware.metrics.classification.choose_threshold`) on the
out-of-fold probabilities of the *other* folds, so no plan picks its own threshold.  The setting with
the best mean ``cv_metric`` over folds wins; ``threshold: cv`` then takes the threshold chosen on all
its out-of-fold probabilities (a number fixes it).  The module is rebuilt with that setting and the
fit trains it on all training plans.  The table (mean and spread over folds of every setting, the
logistic-regression baseline included) is logged and written to ``cv_file``, and the winner's row is
logged with the test metrics (``test/cv_*``).

**Logistic-regression baseline** (``logistic_baseline: true``): scikit-learn's
``LogisticRegression`` on the same frozen embeddings of the *presented* pair ``(u, v)``: ``e_u, e_v,
e_u * e_v, |e_u - e_v|``, relative positions ``u / (n - 1)``, ``v / (n - 1)``, gap ``|v - u| / n``,
"v is the last step", plan length ``n / 20`` and the direction ``sign(v - u)``; trained on both
presentations of every labelled pair of the CaT-Bench training plans; a question is answered from
the mean probability of its pair's two presentations (so its twins agree too), yes at 0.5.  It is
cross-validated on the same folds and reported as a row of every table.

Test: per question file (``set``), accuracy, precision / recall / F1 of "yes", macro F1 and twin
consistency of the head, the baseline and the always-yes / always-no rows
(:func:`~seqaware.metrics.classification.binary_rows`); logged as ``test/catbench_*``,
``test/lr_baseline_*``, ``test/always_yes_*``, ``test/always_no_*`` for ``data.eval_path`` and
with a ``<set>/`` prefix for the other files.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from hydra.utils import get_class, instantiate
from torch import nn

from seqaware.encoders.base import SequenceEncoder
from seqaware.encoders.text import TextEncoder
from seqaware.io import atomic_open
from seqaware.metrics.classification import (binary_report, binary_rows, choose_threshold, format_table,
                                             initial_threshold, twin_consistency)
from seqaware.modules.base import SeqawareModule, as_container, gather_unique
from seqaware.modules.teo_plan_head import pair_position_features
from seqaware.pretrained import load_tokenizer

log = logging.getLogger(__name__)

HEAD_KEYS = ("step_dim", "pair_hidden", "dropout", "closure", "lexical")
CLOSURES = ("max", "none")
NUM_PAIR_FEATURES = 8
NUM_LEXICAL_FEATURES = 8
ROW_KEYS = (("accuracy", "accuracy"), ("precision_yes", "precision"), ("recall_yes", "recall"), ("f1_yes", "f1"),
            ("macro_f1", "macro_f1"), ("twin_consistency", "twin_consistency"))
TABLE_COLUMNS = (("accuracy", "accuracy"), ("precision", "P yes"), ("recall", "R yes"), ("f1", "F1 yes"),
                 ("macro_f1", "macro F1"), ("twin_consistency", "twin consistency"), ("n", "n"))
CV_METRICS = ("f1", "macro_f1", "accuracy")
MODEL_ROW = "closure head"
LR_ROW = "logistic regression"
SETTING_KEYS = ("members", "rfg_weight", "blend", "features")   # grid keys besides HEAD_KEYS
ENCODER_FEATURES = "encoder"   # the feature set of the module's own encoder (backbones.text)


# ---------------------------------------------------------------- the head
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
    """``members`` closure heads (module docstring, 2-5), computed side by side in one pass.

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


# ---------------------------------------------------------------- the logistic-regression baseline
def baseline_features(emb: np.ndarray, u: int, v: int) -> np.ndarray:
    """Features of the presented pair (u, v) of a plan with L2-normalised step embeddings ``emb`` (n, H)."""
    n = len(emb)
    eu, ev = emb[u], emb[v]
    position = [u / max(n - 1, 1), v / max(n - 1, 1), abs(v - u) / n, float(v == n - 1), n / 20, float(np.sign(v - u))]
    return np.concatenate([eu, ev, eu * ev, np.abs(eu - ev), position])


def fit_baseline(embeddings: Sequence[np.ndarray], plans: Sequence[dict[str, Any]], C: float = 1.0) -> Any:
    """scikit-learn ``LogisticRegression`` on both presentations of every labelled pair of the CaT-Bench plans."""
    from sklearn.linear_model import LogisticRegression

    X, y = [], []
    for emb, plan in zip(embeddings, plans):
        if plan.get("source") == "rfg":
            continue
        for a, b, label in plan["labels"]:
            for u, v in ((a, b), (b, a)):
                X.append(baseline_features(emb, u, v))
                y.append(int(label == "yes"))
    return LogisticRegression(C=C, max_iter=5000).fit(np.stack(X), np.array(y))


def baseline_probs(model: Any, emb: np.ndarray, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
    """Mean probability of "yes" over the two presentations of each pair."""
    if not pairs:
        return np.zeros(0)
    X = np.stack([baseline_features(emb, u, v) for a, b in pairs for u, v in ((a, b), (b, a))])
    return model.predict_proba(X)[:, 1].reshape(-1, 2).mean(1)


def blend_probs(head: Any, baseline: Any, w: float) -> Any:
    """The answer's probability (module docstring, 6): ``(1 - w) head + w baseline`` (``head`` itself at w = 0)."""
    return head if w == 0 else (1 - w) * head + w * baseline


# ---------------------------------------------------------------- scoring
def fold_scores(folds: Sequence[tuple[list[str], np.ndarray]], metric: str = "macro_f1") -> list[dict[str, float]]:
    """Score each fold's ``(gold, probabilities)`` at the threshold chosen on the other folds' pooled
    probabilities (:func:`choose_threshold`, ``metric``); returns per fold the :data:`CV_METRICS` and the threshold."""
    out = []
    for i, (gold, probs) in enumerate(folds):
        other_gold = [g for j, (gs, _) in enumerate(folds) if j != i for g in gs]
        other = np.concatenate([p for j, (_, p) in enumerate(folds) if j != i]) if len(folds) > 1 else probs
        tau = choose_threshold(other_gold or gold, list(other), metric=metric)[0]
        report = binary_report(gold, ["yes" if p >= tau else "no" for p in probs])
        out.append({**{k: float(report[k]) for k in CV_METRICS}, "threshold": tau})
    return out


def summarise(scores: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean and (population) standard deviation over folds of each of :data:`CV_METRICS`."""
    out = {}
    for key in CV_METRICS:
        values = np.array([s[key] for s in scores])
        out[f"{key}_mean"], out[f"{key}_std"] = float(values.mean()), float(values.std())
    return out


@contextlib.contextmanager
def cpu_threads(threads: Optional[int]):
    """``torch.set_num_threads(threads)`` inside the block (nothing when None), the old number restored after."""
    if threads is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ---------------------------------------------------------------- the Lightning module
def mean_pooled(encoder: SequenceEncoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(N, H) L2-normalised mean of a text encoder's token states over each row's real tokens."""
    states = encoder({"input_ids": input_ids, "attention_mask": attention_mask}).text_states.float()
    mask = attention_mask[..., None].to(states.dtype)
    return F.normalize((states * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)


class TeoClosureHeadModule(SeqawareModule):
    """Frozen step encoder + :class:`ClosureEnsemble`, settings chosen by plan-level cross-validation.

    Args:
        encoder: sequence-encoder config (``configs/encoder/*``); always frozen.
        optimizer: optimiser config of the heads (the same for the cross-validation fits).
        head: :class:`ClosureEnsemble` settings (``step_dim``, ``pair_hidden``, ``dropout``, ``closure``);
            members: heads in the ensemble.
        cv_grid: settings to compare, each a dict overriding ``head`` (and/or ``members``,
            ``rfg_weight``, ``blend``); ``[]`` or null: no cross-validation, ``head`` as given.
        cv_metric: what the settings are chosen by (``macro_f1``, ``f1`` or ``accuracy``; mean over folds).
        threshold: ``cv`` (chosen on the winner's out-of-fold probabilities; 0.5 without cross-validation)
            or a number in (0, 1).
        rfg_weight: weight of the pairs of r-FG plans (``data.rfg_path``) in the loss.
        blend: weight in [0, 1] of the logistic-regression baseline's probability in the answer
            (module docstring, 6; needs ``logistic_baseline``).
        features: the step features the heads read (module docstring, 1): ``encoder``, a name of
            ``extra_features``, or several joined by ``+``; a grid key too.  The logistic-regression
            baseline reads this configured value.
        extra_features: more frozen text models, name -> weights (``offline:mpnet``, a folder, a hub id);
            built when the module is, not saved in checkpoints (rebuilt from this value).
        feature_max_tokens: word pieces per step for the ``extra_features`` models.
        logistic_baseline, baseline_C: the logistic-regression row (and its inverse regularisation).
        cv_file: where the cross-validation table is written as JSON (null: not written).
        head_threads: CPU threads while the heads train (the cross-validation fits and the fit's steps;
            the previous number is restored after): their tensors are tiny, and on a shared 2-core
            CPU two threads made 50 steps 8x slower than one (docs/results/teo.md); null: leave torch's.

    Frozen parts: the encoder.
    """

    def __init__(self, encoder: dict, optimizer: dict, head: Optional[dict] = None, members: int = 3,
                 cv_grid: Optional[Sequence[dict]] = None, cv_metric: str = "macro_f1", threshold: Any = "cv",
                 rfg_weight: float = 1.0, logistic_baseline: bool = True, baseline_C: float = 1.0,
                 cv_file: Optional[str] = None, head_threads: Optional[int] = 1, blend: float = 0.0,
                 features: str = ENCODER_FEATURES, extra_features: Optional[dict[str, str]] = None,
                 feature_max_tokens: int = 128):
        super().__init__()
        head = dict(head or {})
        unknown = sorted(set(head) - set(HEAD_KEYS))
        if unknown:
            raise ValueError(f"model.head: unknown setting(s) {unknown}; known: {list(HEAD_KEYS)}")
        grid = [dict(s) for s in (cv_grid or [])]
        for i, setting in enumerate(grid):
            bad = sorted(set(setting) - set(HEAD_KEYS) - set(SETTING_KEYS))
            if bad:
                raise ValueError(f"model.cv_grid[{i}]: unknown setting(s) {bad}; known: {list(HEAD_KEYS) + list(SETTING_KEYS)}")
        for where, value in [("model.blend", blend)] + [(f"model.cv_grid[{i}].blend", s["blend"]) for i, s in enumerate(grid) if "blend" in s]:
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{where} must be in [0, 1], got {value!r}")
            if float(value) > 0 and not logistic_baseline:
                raise ValueError(f"{where}={value} blends in the logistic-regression baseline: set model.logistic_baseline=true")
        extra_features = {str(k): str(v) for k, v in (extra_features or {}).items()}
        if ENCODER_FEATURES in extra_features or any("+" in k for k in extra_features):
            raise ValueError(f"model.extra_features: names must not be {ENCODER_FEATURES!r} or contain '+', "
                             f"got {sorted(extra_features)}")
        known = [ENCODER_FEATURES, *extra_features]
        for where, value in [("model.features", features)] + [(f"model.cv_grid[{i}].features", s["features"])
                                                                 for i, s in enumerate(grid) if "features" in s]:
            bad = [name for name in str(value).split("+") if name not in known]
            if bad or not str(value):
                raise ValueError(f"{where}={value!r}: unknown feature set(s) {bad}; known: {known} "
                                 "(model.extra_features adds more), joined with '+'")
        if cv_metric not in CV_METRICS:
            raise ValueError(f"model.cv_metric must be one of {list(CV_METRICS)}, got {cv_metric!r}")
        initial = initial_threshold(threshold, "cv")
        self.save_hyperparameters({"encoder": as_container(encoder), "optimizer": as_container(optimizer),
                                   "head": head, "members": members, "cv_grid": grid, "cv_metric": cv_metric,
                                   "threshold": threshold, "rfg_weight": rfg_weight, "blend": float(blend),
                                   "logistic_baseline": logistic_baseline, "baseline_C": baseline_C, "cv_file": cv_file,
                                   "head_threads": head_threads, "features": str(features),
                                   "extra_features": extra_features, "feature_max_tokens": int(feature_max_tokens)})
        self.encoder: SequenceEncoder = instantiate(self.hparams.encoder)
        if self.encoder.modality != "text":
            raise ValueError("the closure head embeds step texts: use a text encoder (model.encoder: text)")
        for p in self.encoder.parameters():
            p.requires_grad_(False)
        # frozen and rebuilt from the config: kept out of the module tree, so checkpoints do not hold them
        self._extra: dict[str, tuple[TextEncoder, Any]] = {}
        for name, weights in extra_features.items():
            extra = TextEncoder(name_or_path=weights).eval().requires_grad_(False)
            self._extra[name] = (extra, load_tokenizer(weights, config_key=f"model.extra_features.{name}"))
        self.setting: dict[str, Any] = self._configured_setting()
        self.ensemble = self._build(self.setting)
        self.register_buffer("decision_threshold", torch.tensor(initial))
        self._cache: dict[tuple[str, ...], torch.Tensor] = {}
        self._threads = torch.get_num_threads()
        self.baseline: Any = None
        self.cv_report: dict[str, Any] = {}
        self._eval_records: list[dict[str, Any]] = []
        self.test_predictions: list[dict] = []
        self.test_rows: dict[str, dict[str, dict[str, Any]]] = {}

    def _configured_setting(self) -> dict[str, Any]:
        """The setting the config gives (``members``, ``rfg_weight``, ``blend`` and ``head``): the model's
        before cross-validation, and the base every ``cv_grid`` entry overrides."""
        hp = self.hparams
        return {"members": hp.members, "rfg_weight": hp.rfg_weight, "blend": hp.blend, "features": hp.features,
                **hp.head}

    def feature_dim(self, features: str) -> int:
        """Width of the step features ``features`` (sets joined by ``+`` lie side by side)."""
        return sum(self.encoder.hidden_size if name == ENCODER_FEATURES else self._extra[name][0].hidden_size
                   for name in features.split("+"))

    def _build(self, setting: dict[str, Any]) -> ClosureEnsemble:
        return ClosureEnsemble(self.feature_dim(setting["features"]), members=int(setting["members"]),
                               **{k: v for k, v in setting.items() if k in HEAD_KEYS})

    def frozen_modules(self) -> list[nn.Module]:
        return list(self.encoder.modules())

    def param_groups(self) -> list[dict]:
        return [{"params": list(self.ensemble.parameters())}]

    # ------------------------------------------------------------ step embeddings
    @torch.no_grad()
    def embed(self, batch: dict, features: Optional[str] = None) -> list[torch.Tensor]:
        """Step features ``features`` (default: the current setting's), (n_k, H) per plan of the batch: each
        set's L2-normalised mean-pooled embeddings, sets side by side (cached by set and step texts)."""
        features = features or self.setting["features"]
        keys = [tuple(item["steps"]) for item in batch["meta"]]
        for name in features.split("+"):
            missing = [k for k, key in enumerate(keys) if (name, key) not in self._cache]
            if not missing:
                continue
            if name == ENCODER_FEATURES:  # the data module's tokens
                offsets = [0, *torch.cumsum(batch["num_steps"], 0).tolist()]
                rows = torch.cat([torch.arange(offsets[k], offsets[k + 1]) for k in missing])
                pooled = mean_pooled(self.encoder, batch["input_ids"][rows].to(self.device),
                                     batch["attention_mask"][rows].to(self.device))
            else:
                encoder, tokenizer = self._extra[name]
                encoder.to(self.device)
                texts = [text for k in missing for text in keys[k]]
                pooled = torch.cat([mean_pooled(encoder, **{key: value.to(self.device) for key, value in tokenizer(
                    texts[i:i + 64], padding=True, truncation=True, max_length=self.hparams.feature_max_tokens,
                    return_tensors="pt", return_token_type_ids=False).items()}) for i in range(0, len(texts), 64)])
            start = 0
            for k in missing:
                n = len(keys[k])
                self._cache[(name, keys[k])] = pooled[start:start + n]
                start += n
        return [torch.cat([self._cache[(name, key)] for name in features.split("+")], -1).to(self.device)
                for key in keys]

    def _all_training_plans(self, *features: str) -> tuple[list[dict[str, Any]], dict[str, list[torch.Tensor]]]:
        """The data module's training plans and, for each of ``features``, their step features (the plans
        collated once, each feature set encoded once)."""
        dm = self.trainer.datamodule
        items = dm.items["train"]
        embeddings: dict[str, list[torch.Tensor]] = {f: [] for f in features}
        for start in range(0, len(items), 32):
            batch = dm.collator(items[start:start + 32])
            for f in embeddings:
                embeddings[f] += self.embed(batch, f)
        return items, embeddings

    # ------------------------------------------------------------ training
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        data = plan_tensors(self.embed(batch), batch["meta"], float(self.setting["rfg_weight"]), self.ensemble.lexical)
        loss = self.ensemble.loss(data)
        self.log("train/loss", loss, prog_bar=True, batch_size=max(int(data["target"].numel()), 1))
        return loss

    def _fit_heads(self, setting: dict[str, Any], plans: list[dict], embeddings: list[torch.Tensor], steps: int,
                   seed: int) -> ClosureEnsemble:
        """Train a fresh ensemble of ``setting`` on ``plans`` as the fit trains the final one: all plans
        in one batch, ``steps`` optimiser steps of ``model.optimizer`` (global RNG left untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            ensemble = self._build(setting).to(self.device)
            opt_cfg = dict(self.hparams.optimizer)
            optimizer = get_class(opt_cfg.pop("_target_"))(ensemble.parameters(), **opt_cfg)
            data = plan_tensors(embeddings, plans, float(setting["rfg_weight"]), ensemble.lexical)
            ensemble.train()
            for _ in range(steps):
                optimizer.zero_grad()
                ensemble.loss(data).backward()
                optimizer.step()
        return ensemble.eval()

    @torch.no_grad()
    def _predict(self, ensemble: ClosureEnsemble, plans: list[dict], embeddings: list[torch.Tensor]) -> np.ndarray:
        data = plan_tensors(embeddings, plans, lexical=ensemble.lexical)
        probs = ensemble(data["steps"], data["mask"], data["num_steps"], data.get("lexical"))
        return probs[data["plan"], data["a"], data["b"]].cpu().numpy()

    def setup(self, stage: str) -> None:
        """Before ``fit`` builds the optimiser: the baseline, and the cross-validation that sets the heads
        (a fit resumed from a checkpoint keeps the setting that checkpoint chose)."""
        if stage != "fit" or self.trainer is None:
            return
        # the baseline's features and every grid setting's, encoded before the heads' thread limit applies
        cross_validate = bool(self.hparams.cv_grid) and not self.trainer.ckpt_path
        grid = [s.get("features", self.hparams.features) for s in self.hparams.cv_grid] if cross_validate else []
        plans, features = self._all_training_plans(*dict.fromkeys([self.hparams.features, *grid]))
        embeddings = features[self.hparams.features]
        if self.hparams.logistic_baseline:
            self.baseline = fit_baseline([e.cpu().numpy() for e in embeddings], plans, self.hparams.baseline_C)
        if cross_validate:
            with cpu_threads(self.hparams.head_threads):
                self._cross_validate(plans, embeddings, features)

    def on_train_start(self) -> None:
        self._threads = torch.get_num_threads()
        if self.hparams.head_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(int(self.hparams.head_threads))

    def on_train_end(self) -> None:
        torch.set_num_threads(self._threads)

    def _cross_validate(self, plans: list[dict], embeddings: list[torch.Tensor],
                        features: dict[str, list[torch.Tensor]]) -> None:
        """``embeddings``: the plans' configured features (``model.features``), which the baseline reads;
        ``features``: each grid setting's ``features`` by name, which its heads read."""
        if getattr(self.trainer.datamodule, "batch_size", None) is not None:
            raise ValueError("model selection by cross-validation trains every plan in one batch, as the fit must: "
                             "set data.batch_size=null")
        steps = int(self.trainer.max_epochs or 0)
        if steps <= 0:
            raise ValueError("model selection by cross-validation trains for the fit's steps: set trainer.max_epochs > 0")
        base = self._configured_setting()
        settings = [dict(base, **s) for s in self.hparams.cv_grid]
        repeats = len(plans[0]["folds"])
        rows: dict[str, dict[str, Any]] = {}
        oof: dict[str, list[tuple[list[str], np.ndarray]]] = {}
        seed = int(torch.initial_seed()) % (2 ** 31)
        names = [", ".join(f"{k}={v}" for k, v in s.items()) or "defaults" for s in self.hparams.cv_grid]
        if len(set(names)) < len(names):
            raise ValueError(f"model.cv_grid repeats a setting: {names}")
        names += [LR_ROW] if self.hparams.logistic_baseline else []
        for name in names:
            oof[name] = []
        for r in range(repeats):
            folds = sorted({p["folds"][r] for p in plans if p["folds"][r] >= 0})
            per_fold: dict[str, list[tuple[list[str], np.ndarray]]] = {name: [] for name in names}
            for fold in folds:
                train = [i for i, p in enumerate(plans) if p["folds"][r] != fold]
                held = [i for i, p in enumerate(plans) if p["folds"][r] == fold and p.get("source") != "rfg"]
                gold = [y for i in held for _, _, y in plans[i]["labels"]]
                tr_plans, tr_emb = [plans[i] for i in train], [embeddings[i] for i in train]
                held_plans, held_emb = [plans[i] for i in held], [embeddings[i] for i in held]
                own = {f: ([e[i] for i in train], [e[i] for i in held]) for f, e in features.items()}
                lr_probs = None
                if self.hparams.logistic_baseline:
                    model = fit_baseline([e.cpu().numpy() for e in tr_emb], tr_plans, self.hparams.baseline_C)
                    lr_probs = np.concatenate([baseline_probs(model, e.cpu().numpy(), [(a, b) for a, b, _ in p["labels"]])
                                               for p, e in zip(held_plans, held_emb)])
                    per_fold[LR_ROW].append((gold, lr_probs))
                heads: dict[str, np.ndarray] = {}  # settings that differ only in blend share their heads
                for s, setting in enumerate(settings):
                    key = repr(sorted((k, v) for k, v in setting.items() if k != "blend"))
                    if key not in heads:
                        fit_emb, test_emb = own[setting["features"]]
                        ensemble = self._fit_heads(setting, tr_plans, fit_emb, steps, seed + 1000 * r + 10 * fold + s)
                        heads[key] = self._predict(ensemble, held_plans, test_emb)
                    per_fold[names[s]].append((gold, blend_probs(heads[key], lr_probs, float(setting.get("blend", 0.0)))))
            for name in names:
                if name == LR_ROW:  # the baseline answers at 0.5, as it does on the test questions
                    scores = [dict({k: float(binary_report(g, ["yes" if p >= 0.5 else "no" for p in pr])[k]) for k in CV_METRICS},
                                   threshold=0.5) for g, pr in per_fold[name]]
                else:
                    scores = fold_scores(per_fold[name], self.hparams.cv_metric)
                rows.setdefault(name, {"folds": []})["folds"] += scores
                oof[name] += per_fold[name]
        for name, row in rows.items():
            row.update(summarise(row["folds"]))
        metric = f"{self.hparams.cv_metric}_mean"
        best = max(range(len(settings)), key=lambda s: (rows[names[s]][metric], -s))
        winner = names[best]
        gold = [g for gs, _ in oof[winner] for g in gs]
        probs = np.concatenate([p for _, p in oof[winner]])
        tau = choose_threshold(gold, list(probs), metric=self.hparams.cv_metric)[0]
        if self.hparams.threshold == "cv":
            self.decision_threshold.fill_(tau)
        self.setting = settings[best]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.ensemble = self._build(self.setting).to(self.device)
        self.cv_report = {"settings": settings, "rows": rows, "winner": self.setting, "winner_name": winner,
                          "threshold": float(self.decision_threshold),
                          "oof_threshold": tau, "metric": self.hparams.cv_metric, "repeats": repeats, "steps": steps}
        log.info("cross-validation over %d plan folds x %d repetition(s) (mean ± std over folds):\n%s\nchosen: %s, "
                 "threshold %.2f", len({p["folds"][0] for p in plans} - {-1}), repeats, self.cv_table(), winner, float(self.decision_threshold))
        if self.hparams.cv_file:
            path = Path(self.hparams.cv_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(path) as handle:
                json.dump(self.cv_report, handle, indent=1)

    def cv_table(self) -> str:
        """Markdown table of the cross-validation rows (mean ± std over folds)."""
        lines = ["| setting | F1 yes | macro F1 | accuracy |", "|---|---:|---:|---:|"]
        for name, row in self.cv_report.get("rows", {}).items():
            cells = [f"{100 * row[f'{k}_mean']:.1f} ± {100 * row[f'{k}_std']:.1f}" for k in CV_METRICS]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    # ------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["closure_head"] = {"setting": dict(self.setting), "cv_report": json.dumps(self.cv_report)}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get("closure_head")
        if saved:  # the checkpoint holds the cross-validation winner's heads: rebuild them before the weights load
            setting = {"features": ENCODER_FEATURES, **saved["setting"]}   # checkpoints before feature sets
            if setting != self.setting:
                self.setting = setting
                self.ensemble = self._build(self.setting).to(self.device)
            self.cv_report = json.loads(saved["cv_report"])

    # ------------------------------------------------------------ testing
    def on_test_epoch_start(self) -> None:
        self._eval_records = []
        if self.hparams.logistic_baseline and self.baseline is None:  # tested from a checkpoint: refit (deterministic)
            plans, features = self._all_training_plans(self.hparams.features)
            embeddings = features[self.hparams.features]
            self.baseline = fit_baseline([e.cpu().numpy() for e in embeddings], plans, self.hparams.baseline_C)

    @torch.no_grad()
    def test_step(self, batch: dict, batch_idx: int) -> None:
        data = plan_tensors(self.embed(batch), batch["meta"], lexical=self.ensemble.lexical)
        probs = self.ensemble(data["steps"], data["mask"], data["num_steps"], data.get("lexical"))
        lr_features = self.embed(batch, self.hparams.features) if self.baseline is not None else None
        for k, item in enumerate(batch["meta"]):
            pairs = [(min(q["first"], q["second"]), max(q["first"], q["second"])) for q in item["pairs"]]
            lr = baseline_probs(self.baseline, lr_features[k].cpu().numpy(), pairs) if self.baseline is not None else [None] * len(pairs)
            for q, (a, b), p_lr in zip(item["pairs"], pairs, lr):
                self._eval_records.append({"question": q, "p_head": float(probs[k, a, b]),
                                           "p_lr": None if p_lr is None else float(p_lr)})

    def on_test_epoch_end(self) -> None:
        records = gather_unique(self._eval_records, key=lambda r: (r["question"]["set"], r["question"]["pair_id"]))
        self._eval_records = []
        tau = float(self.decision_threshold)
        w = float(self.setting.get("blend", 0.0))
        if w > 0 and self.baseline is None:
            raise RuntimeError(f"the head blends in the logistic-regression baseline (blend={w}) but none was fitted: "
                               "set model.logistic_baseline=true")
        for r in records:
            r["p"] = blend_probs(r["p_head"], r["p_lr"], w)
        self.test_rows, self.test_predictions = {}, []
        for name in sorted({r["question"]["set"] for r in records}, key=lambda s: (s != "catbench", s)):
            subset = [r for r in records if r["question"]["set"] == name]
            gold = [r["question"]["answer"] for r in subset]
            systems = {MODEL_ROW: ["yes" if r["p"] >= tau else "no" for r in subset]}
            if self.baseline is not None:
                systems[LR_ROW] = ["yes" if r["p_lr"] >= 0.5 else "no" for r in subset]
            rows = binary_rows(gold, systems)
            twins = [(r["question"]["plan_id"], min(r["question"]["first"], r["question"]["second"]),
                      max(r["question"]["first"], r["question"]["second"])) for r in subset]
            for row_name, row in rows.items():
                row.update(twin_consistency(twins, systems.get(row_name) or [row_name.split()[-1].strip("()")] * len(subset)))
            prefix = "test/" if name == "catbench" else f"test/{name}/"
            for row_name, key in ((MODEL_ROW, "catbench"), (LR_ROW, "lr_baseline"), ("always yes", "always_yes"),
                                  ("always no", "always_no")):
                if row_name in rows:
                    self.log_dict({f"{prefix}{key}_{k}": float(rows[row_name][m]) for k, m in ROW_KEYS}, sync_dist=False)
            self.log(f"{prefix}n", float(len(subset)), sync_dist=False)
            self.test_rows[name] = rows
            log.info("CaT-Bench questions %r (threshold %.2f):\n%s", name, tau, format_table(rows, TABLE_COLUMNS))
            for r, answer in zip(subset, systems[MODEL_ROW]):
                q = r["question"]
                self.test_predictions.append({"set": name, "id": q["pair_id"], "first": q["first"], "second": q["second"],
                                              "direction": q["direction"], "p_dependent": r["p"], "p_head": r["p_head"],
                                              "p_lr": r["p_lr"], "answer": answer,
                                              "lr_answer": None if r["p_lr"] is None else ("yes" if r["p_lr"] >= 0.5 else "no"),
                                              "gold": q["answer"]})
        self.log("test/threshold", tau, sync_dist=False)
        winner = self.cv_report.get("rows", {}).get(self.cv_report.get("winner_name"))
        if winner:
            self.log_dict({f"test/cv_{k}": float(winner[k]) for k in winner if k != "folds"}, sync_dist=False)
        baseline = self.cv_report.get("rows", {}).get(LR_ROW)
        if baseline:
            self.log_dict({f"test/cv_lr_baseline_{k}": float(baseline[k]) for k in baseline if k != "folds"}, sync_dist=False)
