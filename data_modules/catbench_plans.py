"""CaT-Bench plans with CaT-Bench's own labels (``experiment=teo_plan_head_catbench``).

* **train**: one item per plan of ``train_path`` (by default CaT-Bench's validation split, 28 plans,
  disjoint from every test plan): its steps and its labelled step pairs ``(first, second, yes|no)``
  (``first < second``; the "before" and "after" questions of a pair carry one label, so they give one
  pair; two questions of a pair that disagree are an error naming both lines), and ``folds``: the
  plan's cross-validation fold in each repetition (:func:`plan_folds`: whole plans, never split).
* **test**: the questions of ``eval_path`` (the paper's questions of the 13 sample plans by default)
  and of each ``extra_eval_paths`` entry (name -> file; the all-pairs sample by default), read by
  :func:`~data_modules.adapters.catbench.read_catbench` and grouped by plan; every question keeps
  its set name (``catbench`` for ``eval_path``, else the entry's name).
* **r-FG** (optional, ``rfg_path``): the recipes of the English Recipe Flow Graph folder as extra
  training plans, every step pair labelled by the flow graph's reachability (yes: a path joins the
  steps), marked ``source: rfg`` so that the model can weight them; recipes of the test files are left
  out, and each r-FG recipe names the CaT-Bench plan it duplicates (``efg_recipe_id``), so
  cross-validation leaves it out with that plan's fold.

**No test plan reaches training.**  A plan of a test file that is also a training plan (the same
steps or r-FG recipe id) is an error (:func:`check_disjoint`); the r-FG plans of the test
files are dropped.  There is no validation split: settings are chosen by cross-validation over the
training plans (the model's job), and the test files are never looked at before ``test``.

Steps are tokenised one by one (``[CLS] step [SEP]``, at most ``max_step_tokens`` word pieces), for
models that embed each step on its own (:class:`StepCollator`).
"""
from __future__ import annotations

import logging
import random
import re
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from data_modules.adapters.catbench import read_catbench
from data_modules.collate import StepTokens
from data_modules.sampling import KeyedList, epoch_loader
from seqaware.pretrained import load_tokenizer

log = logging.getLogger(__name__)

TRAIN_SET = "catbench"


def plan_key(steps: Sequence[str]) -> tuple[str, ...]:
    """A plan's identity for the disjointness check: its steps, lower-cased, whitespace and punctuation removed."""
    return tuple(re.sub(r"[\W_]+", "", s.lower()) for s in steps)


def plan_folds(sizes: Mapping[str, int], k: int, seed: int) -> dict[str, int]:
    """Plan id -> fold in ``0..k-1``: whole plans, in a seeded random order, each to the fold holding
    the fewest labelled pairs so far (ties: the lower fold), so folds are about equally large and a
    plan is never split.  Needs at least ``k`` plans."""
    if k < 2:
        raise ValueError(f"data.cv_folds must be at least 2, got {k}")
    if len(sizes) < k:
        raise ValueError(f"data.cv_folds={k} needs at least {k} training plans, got {len(sizes)}")
    order = sorted(sizes)
    random.Random(seed).shuffle(order)
    load = [0] * k
    folds = {}
    for plan in order:
        fold = min(range(k), key=lambda f: (load[f], f))
        folds[plan] = fold
        load[fold] += sizes[plan]
    return folds


def labelled_plans(questions: list[dict[str, Any]], path: Any) -> list[dict[str, Any]]:
    """Questions (:func:`read_catbench` items) -> one item per plan: ``plan_id``, ``steps``, ``title``,
    ``efg_recipe_id`` and ``labels`` = sorted ``(first, second, yes|no)`` pairs (``first < second``).

    A plan is its step list; questions that carry the same ``plan_idx`` must give the same steps, or the
    plan would be split in two (which two cross-validation folds could then hold): that is an error
    naming both questions and their lines."""
    plans: dict[tuple[str, ...], dict[str, Any]] = {}
    seen: dict[tuple, tuple[str, str]] = {}
    by_index: dict[Any, dict[str, Any]] = {}
    for q in questions:
        steps = tuple(q["steps"])
        if q.get("plan_idx") is not None:
            first = by_index.setdefault(q["plan_idx"], q)
            if tuple(first["steps"]) != steps:
                differ = next((i for i, (x, y) in enumerate(zip(first["steps"], steps)) if x != y),
                              min(len(first["steps"]), len(steps)))
                raise ValueError(f"{path}:{q.get('line', '?')}: plan {q['plan_idx']} question {q['pair_id']}: steps: "
                                 f"differ from those of question {first['pair_id']} of the same plan (line "
                                 f"{first.get('line', '?')}) at step {differ} ({len(steps)} steps against "
                                 f"{len(first['steps'])}): one plan, one step list")
        item = plans.setdefault(steps, {"plan_id": f"catbench:{q.get('plan_idx')}:{len(plans)}", "steps": list(steps),
                                        "title": q.get("title") or "", "efg_recipe_id": q.get("plan"), "pairs": {}})
        a, b = sorted((q["first"], q["second"]))
        if (steps, a, b) in seen and seen[(steps, a, b)][1] != q["answer"]:
            raise ValueError(f"{path}: questions {seen[(steps, a, b)][0]} and {q['pair_id']} ask about the same step "
                             f"pair ({a}, {b}) of plan {q.get('plan_idx')} but have different labels")
        seen[(steps, a, b)] = (q["pair_id"], q["answer"])
        item["pairs"][(a, b)] = q["answer"]
    out = []
    for item in plans.values():
        pairs = item.pop("pairs")
        out.append(dict(item, labels=[(a, b, y) for (a, b), y in sorted(pairs.items())]))
    return out


def check_disjoint(train: list[dict[str, Any]], test: list[dict[str, Any]], what: str) -> None:
    """Raise when a test plan is a training plan: the same steps (:func:`plan_key`: case, spaces and
    punctuation ignored) or the same r-FG recipe id.  (Titles are not identities: two recipes may
    share one.)"""
    keys = {plan_key(p["steps"]): p for p in train}
    recipes = {p["efg_recipe_id"]: p for p in train if p.get("efg_recipe_id")}
    for plan in test:
        twin = keys.get(plan_key(plan["steps"])) or recipes.get(plan.get("efg_recipe_id") or object())
        if twin is not None:
            raise ValueError(f"{what}: test plan {plan['plan_id']} ({plan.get('title') or plan.get('efg_recipe_id')!r}) is "
                             f"also the training plan {twin['plan_id']}: a test plan must never reach training")


def rfg_plans(rfg_path: str | Path, leave_out: set[str], catbench: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """r-FG recipes (one step per sentence) as labelled plans: every step pair ``(a < b)`` labelled yes
    when a flow-graph path joins them; recipes named in ``leave_out`` are dropped; ``duplicates``
    names the CaT-Bench training plan of the same recipe (its folds apply)."""
    from data_modules.adapters import rfg
    from seqaware import dag as dag_utils

    by_recipe = {p["efg_recipe_id"]: p["plan_id"] for p in catbench if p.get("efg_recipe_id")}
    out = []
    for proc in rfg.convert(Path(rfg_path)).all_procedures():
        if proc.id in leave_out or proc.dag is None or proc.num_steps < 2:
            continue
        closure = dag_utils.transitive_closure(proc.num_steps, [(int(a), int(b)) for a, b in proc.dag])
        labels = [(a, b, "yes" if closure[a][b] else "no") for a in range(proc.num_steps) for b in range(a + 1, proc.num_steps)]
        out.append({"plan_id": f"rfg:{proc.id}", "steps": [s.text or "" for s in proc.steps], "title": proc.title,
                    "efg_recipe_id": proc.id, "labels": labels, "source": "rfg", "duplicates": by_recipe.get(proc.id)})
    return out


class StepCollator:
    """Plans -> every step tokenised on its own.

    Batch keys: ``input_ids`` / ``attention_mask`` (N, L) for the N steps of the batch's plans in
    order (plan ``k`` owns rows ``offset_k .. offset_k + n_k - 1``), ``num_steps`` (B,) and ``meta``
    (the plan items).
    """

    def __init__(self, tokenizer: Any, max_step_tokens: int = 60, max_sentences: int = 5):
        self.tokenizer = tokenizer
        self.tokens = StepTokens(tokenizer)
        self.max_step_tokens = max_step_tokens
        self.max_sentences = max_sentences

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        input_ids, attention_mask = self.tokens.batch([t for item in items for t in item["steps"]],
                                                      self.max_step_tokens, self.max_sentences)
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "num_steps": torch.tensor([len(item["steps"]) for item in items]), "meta": items}


class CatBenchPlansDataModule(pl.LightningDataModule):
    """CaT-Bench plans labelled with CaT-Bench's own answers for training, question files for testing.

    Args:
        train_path: labelled CaT-Bench questions to train on (the validation split).
        eval_path: the test questions (set ``catbench``); extra_eval_paths: more test files, name -> path.
        cv_folds, cv_repeats: plan-level cross-validation folds (:func:`plan_folds`), repetitions with
            other fold draws (repetition ``r`` draws with ``seed + r``).
        rfg_path: r-FG folder as extra supervision (None: CaT-Bench labels only).
        tokenizer, max_step_tokens, max_sentences: per-step tokenisation.
        batch_size: plans per training batch (None: all plans in one batch); eval_batch_size: test plans per batch.
    """

    def __init__(self, train_path: str, eval_path: str, extra_eval_paths: Optional[Mapping[str, str]] = None,
                 cv_folds: int = 7, cv_repeats: int = 1, rfg_path: Optional[str] = None,
                 tokenizer: str = "offline:minilm", max_step_tokens: int = 60, max_sentences: int = 5,
                 batch_size: Optional[int] = None, eval_batch_size: int = 16, num_workers: int = 0, seed: int = 0):
        super().__init__()
        if cv_repeats < 1:
            raise ValueError(f"data.cv_repeats must be at least 1, got {cv_repeats}")
        self.train_path, self.eval_path = train_path, eval_path
        self.extra_eval_paths = dict(extra_eval_paths or {})
        if TRAIN_SET in self.extra_eval_paths:
            raise ValueError(f"data.extra_eval_paths: the name {TRAIN_SET!r} is data.eval_path's; choose another")
        self.cv_folds, self.cv_repeats = cv_folds, cv_repeats
        self.rfg_path = rfg_path
        self.tokenizer_name, self.max_step_tokens, self.max_sentences = tokenizer, max_step_tokens, max_sentences
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_workers, self.seed = num_workers, seed
        self.items: dict[str, list[dict[str, Any]]] = {}
        self._collator: Optional[StepCollator] = None

    @property
    def collator(self) -> StepCollator:
        if self._collator is None:
            self._collator = StepCollator(load_tokenizer(self.tokenizer_name), self.max_step_tokens, self.max_sentences)
        return self._collator

    def describe_split(self, split: str) -> str:
        return f"the {len(self.items.get(split, []))} {split} plans of {self.train_path if split == 'train' else self.eval_path}"

    def setup(self, stage: Optional[str] = None) -> None:
        if self.items:
            return
        train = [dict(p, source=TRAIN_SET)
                 for p in labelled_plans(read_catbench(self.train_path, "data.train_path"), self.train_path)]
        sizes = {p["plan_id"]: len(p["labels"]) for p in train}
        draws = [plan_folds(sizes, self.cv_folds, self.seed + r) for r in range(self.cv_repeats)]
        for plan in train:
            plan["folds"] = [draw[plan["plan_id"]] for draw in draws]
        test: list[dict[str, Any]] = []
        for name, path in [(TRAIN_SET, self.eval_path), *self.extra_eval_paths.items()]:
            questions = read_catbench(path, "data.eval_path" if name == TRAIN_SET else f"data.extra_eval_paths.{name}")
            for plan in labelled_plans(questions, path):
                check_disjoint(train, [plan], f"data.eval_path / extra_eval_paths ({path})")
                steps = tuple(plan["steps"])
                pairs = [dict(q, set=name, plan_id=f"{name}:{plan['plan_id']}") for q in questions if tuple(q["steps"]) == steps]
                test.append({"plan_id": f"{name}:{plan['plan_id']}", "steps": plan["steps"], "title": plan["title"],
                             "efg_recipe_id": plan["efg_recipe_id"], "pairs": pairs, "set": name})
        if self.rfg_path:
            leave_out = {p["efg_recipe_id"] for p in test if p.get("efg_recipe_id")}
            extra = rfg_plans(self.rfg_path, leave_out, train)
            check_disjoint(extra, test, f"data.rfg_path={self.rfg_path}")
            folds_of = {p["plan_id"]: p["folds"] for p in train}
            for plan in extra:  # an r-FG twin of a CaT-Bench plan is held out with it; other recipes train in every fold
                plan["folds"] = folds_of.get(plan["duplicates"], [-1] * self.cv_repeats)
            train += extra
        self.items = {"train": train, "test": test}
        log.info("catbench plans: %d training plans (%d labelled pairs), %d test plans (%d questions)",
                 len(train), sum(len(p["labels"]) for p in train), len(test), sum(len(p["pairs"]) for p in test))

    def _loader(self, split: str, shuffle: bool, batch_size: Optional[int]) -> DataLoader:
        items = self.items[split]
        return epoch_loader(KeyedList(items, name=f"{split} plans"), batch_size=batch_size or len(items),
                            shuffle=shuffle, seed=self.seed, trainer=self.trainer, collate_fn=self.collator,
                            num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True, self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False, self.eval_batch_size)
