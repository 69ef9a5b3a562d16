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

**Fine-tuning the encoder** (``encoder_lr``, default null: frozen).  With a learning rate the module's own
encoder (the ``encoder`` feature set, the only one its settings may then read) trains with the heads, end to
end: every step re-encodes the training plans' steps with gradients.  Each cross-validation fit starts from
the pretrained weights again (a copy per fit), so no held-out plan is ever seen by the encoder that answers
it; the logistic-regression baseline reads a frozen copy of the pretrained encoder.  A GPU recipe for
base-size encoders (``hparams=catbench_finetune``).

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
logged with the test metrics (``test/cv_*``).  Each fit logs its time and a forecast for the rest
(:class:`~seqaware.modules.teo_closure_selection.CVProgress`); a SIGTERM stops it (``callbacks.preemption``).

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

The parts, one concern each: :mod:`seqaware.modules.teo_closure_network` (features, closure, the ensemble,
plans as tensors), :mod:`seqaware.modules.teo_closure_baseline` (the logistic-regression baseline, the blend),
:mod:`seqaware.modules.teo_closure_selection` (fold scores, their summary); this file is the Lightning module
(embeddings, training, the cross-validation that chooses the setting, checkpoints, the test tables) and
re-exports the parts' names.
"""
from __future__ import annotations

import copy
import json
import logging
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
from seqaware.modules.teo_closure_baseline import baseline_features, baseline_probs, blend_probs, fit_baseline
from seqaware.modules.teo_closure_network import (ANAPHOR, CLOSURES, HEAD_KEYS, NUM_LEXICAL_FEATURES, NUM_PAIR_FEATURES,
                                                  STOPWORDS, ClosureEnsemble, MemberLinear, content_words,
                                                  lexical_pair_features, max_product_closure, pair_features,
                                                  plan_tensors)
from seqaware.modules.teo_closure_selection import CV_METRICS, CVProgress, cpu_threads, fold_scores, summarise
from seqaware.pretrained import load_tokenizer

__all__ = ["ANAPHOR", "CLOSURES", "CV_METRICS", "ENCODER_FEATURES", "HEAD_KEYS", "LR_ROW", "MODEL_ROW",
           "NUM_LEXICAL_FEATURES", "NUM_PAIR_FEATURES", "ROW_KEYS", "SETTING_KEYS", "STOPWORDS", "TABLE_COLUMNS",
           "ClosureEnsemble", "MemberLinear", "TeoClosureHeadModule", "baseline_features", "baseline_probs",
           "blend_probs", "content_words", "cpu_threads", "fit_baseline", "fold_scores", "lexical_pair_features",
           "max_product_closure", "mean_pooled", "pair_features", "plan_tensors", "summarise"]

log = logging.getLogger(__name__)

ROW_KEYS = (("accuracy", "accuracy"), ("precision_yes", "precision"), ("recall_yes", "recall"), ("f1_yes", "f1"),
            ("macro_f1", "macro_f1"), ("twin_consistency", "twin_consistency"))
TABLE_COLUMNS = (("accuracy", "accuracy"), ("precision", "P yes"), ("recall", "R yes"), ("f1", "F1 yes"),
                 ("macro_f1", "macro F1"), ("twin_consistency", "twin consistency"), ("n", "n"))
MODEL_ROW = "closure head"
LR_ROW = "logistic regression"
SETTING_KEYS = ("members", "rfg_weight", "blend", "features")   # grid keys besides HEAD_KEYS
ENCODER_FEATURES = "encoder"   # the feature set of the module's own encoder (backbones.text)


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
        encoder_lr: null (the encoder stays frozen) or the learning rate at which the encoder fine-tunes
            with the heads (module docstring); then every setting must read ``features: encoder``.
        head_threads: CPU threads while the heads train (the cross-validation fits and the fit's steps;
            the previous number is restored after): their tensors are tiny, and on a shared 2-core
            CPU two threads made 50 steps 8x slower than one (docs/results/teo.md); null: leave torch's.

    Frozen parts: the encoder, unless ``encoder_lr`` is set.
    """
    monitor = None  # no validation (settings come from the cross-validation): the weights after the last step are tested

    def __init__(self, encoder: dict, optimizer: dict, head: Optional[dict] = None, members: int = 3,
                 cv_grid: Optional[Sequence[dict]] = None, cv_metric: str = "macro_f1", threshold: Any = "cv",
                 rfg_weight: float = 1.0, logistic_baseline: bool = True, baseline_C: float = 1.0,
                 cv_file: Optional[str] = None, head_threads: Optional[int] = 1, blend: float = 0.0,
                 features: str = ENCODER_FEATURES, extra_features: Optional[dict[str, str]] = None,
                 feature_max_tokens: int = 128, encoder_lr: Optional[float] = None):
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
        if encoder_lr is not None:
            if not float(encoder_lr) > 0:
                raise ValueError(f"model.encoder_lr must be a positive learning rate or null (frozen), got {encoder_lr!r}")
            reads = [("model.features", features)] + [(f"model.cv_grid[{i}].features", s["features"])
                                                       for i, s in enumerate(grid) if "features" in s]
            other = [f"{where}={value!r}" for where, value in reads if str(value) != ENCODER_FEATURES]
            if other:
                raise ValueError(f"model.encoder_lr={encoder_lr} fine-tunes the module's encoder, so the heads read "
                                 f"features '{ENCODER_FEATURES}' alone; got {', '.join(other)}")
        if cv_metric not in CV_METRICS:
            raise ValueError(f"model.cv_metric must be one of {list(CV_METRICS)}, got {cv_metric!r}")
        initial = initial_threshold(threshold, "cv")
        self.save_hyperparameters({"encoder": as_container(encoder), "optimizer": as_container(optimizer),
                                   "head": head, "members": members, "cv_grid": grid, "cv_metric": cv_metric,
                                   "threshold": threshold, "rfg_weight": rfg_weight, "blend": float(blend),
                                   "logistic_baseline": logistic_baseline, "baseline_C": baseline_C, "cv_file": cv_file,
                                   "head_threads": head_threads, "features": str(features),
                                   "extra_features": extra_features, "feature_max_tokens": int(feature_max_tokens),
                                   "encoder_lr": None if encoder_lr is None else float(encoder_lr)})
        self.encoder: SequenceEncoder = instantiate(self.hparams.encoder)
        if self.encoder.modality != "text":
            raise ValueError("the closure head embeds step texts: use a text encoder (model.encoder: text)")
        self.finetune = encoder_lr is not None
        # fine-tuning: the pretrained weights stay, frozen and out of the module tree (not in checkpoints; rebuilt
        # from the config), for the baseline's features and as the start of every cross-validation fit
        self._pretrained: list[SequenceEncoder] = []      # a list: an attribute would register the copy
        if self.finetune:
            self._pretrained.append(copy.deepcopy(self.encoder).eval().requires_grad_(False))
        self.encoder.requires_grad_(self.finetune)
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
        return [] if self.finetune else list(self.encoder.modules())

    def param_groups(self) -> list[dict]:
        groups = [{"params": list(self.ensemble.parameters())}]
        if self.finetune:
            groups.append({"params": list(self.encoder.parameters()), "lr": self.hparams.encoder_lr})
        return groups

    def _frozen_encoder(self) -> SequenceEncoder:
        """What the cached ``encoder`` features come from: the pretrained weights (a frozen copy while the
        module's own encoder fine-tunes)."""
        return self._pretrained[0].to(self.device) if self._pretrained else self.encoder

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
                pooled = mean_pooled(self._frozen_encoder(), batch["input_ids"][rows].to(self.device),
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

    def tuned_embeddings(self, encoder: SequenceEncoder, batch: dict) -> list[torch.Tensor]:
        """(n_k, H) per plan of ``batch``: ``encoder``'s mean-pooled step embeddings, with gradients when they
        are enabled (the fine-tuned encoder's features; no cache, the weights change every step)."""
        device = next(encoder.parameters()).device
        pooled = mean_pooled(encoder, batch["input_ids"].to(device), batch["attention_mask"].to(device))
        return list(pooled.split(batch["num_steps"].tolist()))

    def head_features(self, batch: dict) -> list[torch.Tensor]:
        """The features the heads read: the fine-tuned encoder's, else the cached frozen sets of the setting."""
        return self.tuned_embeddings(self.encoder, batch) if self.finetune else self.embed(batch)

    # ------------------------------------------------------------ training
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        data = plan_tensors(self.head_features(batch), batch["meta"], float(self.setting["rfg_weight"]),
                            self.ensemble.lexical)
        loss = self.ensemble.loss(data)
        self.log("train/loss", loss, prog_bar=True, batch_size=max(int(data["target"].numel()), 1))
        return loss

    def _optimizer(self, groups: list[dict]) -> torch.optim.Optimizer:
        """``model.optimizer`` over ``groups``: what a cross-validation fit trains with, as the fit does."""
        opt_cfg = dict(self.hparams.optimizer)
        return get_class(opt_cfg.pop("_target_"))(groups, **opt_cfg)

    def _fit_heads(self, setting: dict[str, Any], plans: list[dict], embeddings: list[torch.Tensor], steps: int,
                   seed: int, where: str = "a cross-validation fit") -> ClosureEnsemble:
        """Train a fresh ensemble of ``setting`` on ``plans`` as the fit trains the final one: all plans
        in one batch, ``steps`` optimiser steps of ``model.optimizer`` (global RNG left untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            ensemble = self._build(setting).to(self.device)
            optimizer = self._optimizer([{"params": list(ensemble.parameters())}])
            data = plan_tensors(embeddings, plans, float(setting["rfg_weight"]), ensemble.lexical)
            ensemble.train()
            for step in range(steps):
                optimizer.zero_grad()
                loss = ensemble.loss(data)
                if self.finite_fit_loss(loss, where, step):   # a non-finite loss stops the run (or skips the step)
                    loss.backward()
                    optimizer.step()
        return ensemble.eval()

    @torch.no_grad()
    def _predict(self, ensemble: ClosureEnsemble, plans: list[dict], embeddings: list[torch.Tensor]) -> np.ndarray:
        data = plan_tensors(embeddings, plans, lexical=ensemble.lexical)
        probs = ensemble(data["steps"], data["mask"], data["num_steps"], data.get("lexical"))
        return probs[data["plan"], data["a"], data["b"]].cpu().numpy()

    def _fit_tuned(self, setting: dict[str, Any], plans: list[dict], steps: int,
                   seed: int, where: str = "a cross-validation fit") -> tuple[ClosureEnsemble, SequenceEncoder]:
        """:meth:`_fit_heads` with the encoder fine-tuned from the pretrained weights (a fresh copy): all
        ``plans`` in one batch, re-encoded at every step; the heads at ``model.optimizer``'s lr, the encoder at
        ``encoder_lr``.  It runs in ``setup``, before Lightning moves the module to its device, so the copies
        go to the trainer's device themselves, and the forward passes run under the trainer's precision
        (autocast for bf16-mixed).  Returns the heads and the encoder, both in eval mode."""
        device = self.trainer.strategy.root_device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            ensemble = self._build(setting).to(device)
            encoder = copy.deepcopy(self._pretrained[0]).to(device).requires_grad_(True).train()
            optimizer = self._optimizer([{"params": list(ensemble.parameters())},
                                         {"params": list(encoder.parameters()), "lr": self.hparams.encoder_lr}])
            batch = self.trainer.datamodule.collator(plans)
            ensemble.train()
            for step in range(steps):
                optimizer.zero_grad()
                with self.trainer.precision_plugin.forward_context():
                    data = plan_tensors(self.tuned_embeddings(encoder, batch), plans, float(setting["rfg_weight"]),
                                        ensemble.lexical)
                    loss = ensemble.loss(data)
                if self.finite_fit_loss(loss, where, step):
                    loss.backward()
                    optimizer.step()
        return ensemble.eval(), encoder.eval().requires_grad_(False)

    @torch.no_grad()
    def _tuned_features(self, encoder: SequenceEncoder, plans: list[dict]) -> list[torch.Tensor]:
        """A fine-tuned encoder's step features of ``plans`` (batches of 32 plans)."""
        collate = self.trainer.datamodule.collator
        with self.trainer.precision_plugin.forward_context():
            return [e for start in range(0, len(plans), 32)
                    for e in self.tuned_embeddings(encoder, collate(plans[start:start + 32]))]

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
        keys = [repr(sorted((k, v) for k, v in s.items() if k != "blend")) for s in settings]  # blend-only: one fit
        fold_sets = [sorted({p["folds"][r] for p in plans if p["folds"][r] >= 0}) for r in range(repeats)]
        progress = CVProgress(len(settings), [len(f) for f in fold_sets], len(set(keys)), steps)
        for r, folds in enumerate(fold_sets):
            per_fold: dict[str, list[tuple[list[str], np.ndarray]]] = {name: [] for name in names}
            for f, fold in enumerate(folds):
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
                for s, (setting, key) in enumerate(zip(settings, keys)):
                    if key not in heads:
                        progress.start()
                        fit_seed = seed + 1000 * r + 10 * fold + s
                        where = f"the cross-validation fit of setting {names[s]!r} on fold {fold} (repeat {r + 1})"
                        if self.finetune:
                            ensemble, encoder = self._fit_tuned(setting, tr_plans, steps, fit_seed, where)
                            test_emb = self._tuned_features(encoder, held_plans)
                        else:
                            fit_emb, test_emb = own[setting["features"]]
                            ensemble = self._fit_heads(setting, tr_plans, fit_emb, steps, fit_seed, where)
                        heads[key] = self._predict(ensemble, held_plans, test_emb)
                        progress.fitted(s, f, r)
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
        data = plan_tensors(self.head_features(batch), batch["meta"], lexical=self.ensemble.lexical)
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
