"""RecipeQA, Wu et al. 2022 splits -> procedures (one per recipe).

Input folder ``src`` holding ``{train,val,test}-acl22.json`` (directly or in any sub-folder, e.g.
``new_splits/``) and the RecipeQA images under
``images/images-qa/<original split>/images-qa/<recipe_id>_<step_index>[_<k>].jpg``. The acl22
splits re-divide the original recipes, so images are looked up in every original split folder.

Each JSON file is ``{"data": [{"recipe_id", "context": [{"id", "body", ...}], "multiref_gt"?}]}``:

* one procedure per recipe (repeated recipe ids -- RecipeQA lists a recipe once per question --
  are counted as ``duplicate recipe`` and kept once), id = ``recipe_id``, title = ``title`` if
  present, category ``["recipe"]``;
* step texts = ``body`` in context order; step image = the first image of the step: ``<id>_<step>.jpg``
  if present, else the smallest ``k`` of ``<id>_<step>_<k>.jpg``; a step without image stays
  text-only; an unreadable image follows ``unreadable_image`` (error | skip the recipe);
* ``multiref_gt`` -> ``alternatives``; recipes with fewer than ``min_steps`` steps are dropped.

Problem locations use the record's 1-based position in ``data`` as the line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from data_modules.adapters.common import (
    IMAGE_POLICIES,
    AdapterResult,
    ImageStore,
    ProblemLog,
    check_choice,
    check_procedure,
    iter_json_records,
    normalize_orders,
    store_images,
)
from data_modules.adapters.registry import ADAPTERS
from seqaware.procedure import Procedure, Step

SPLITS = ("train", "val", "test")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif")


def index_images(src: Path) -> dict[str, list[tuple[int, Path]]]:
    """``"<recipe_id>_<step>" -> [(k, path)]`` over every ``images/images-qa/*/images-qa`` folder.

    A file without ``_<k>`` gets ``k = -1`` so it sorts first (it is the step's first image).
    """
    index: dict[str, list[tuple[int, Path]]] = {}
    for folder in sorted(src.glob("images/images-qa/*/images-qa")):
        for path in folder.iterdir():
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            stem = path.stem
            index.setdefault(stem, []).append((-1, path))
            head, _, tail = stem.rpartition("_")
            if head and tail.isdigit():
                index.setdefault(head, []).append((int(tail), path))
    for entries in index.values():
        entries.sort()
    return index


def _first_image(index: dict[str, list[tuple[int, Path]]], recipe_id: str, step_id: Any) -> Path | None:
    entries = index.get(f"{recipe_id}_{step_id}")
    return entries[0][1] if entries else None


@ADAPTERS.register("recipeqa")
def convert(src: Path, out_images: Path | None = None, unreadable_image: str = "error", min_steps: int = 2) -> AdapterResult:
    """Convert the RecipeQA acl22 splits (see the module docstring)."""
    check_choice("unreadable_image", unreadable_image, IMAGE_POLICIES)
    src = Path(src)
    if not src.is_dir():
        raise FileNotFoundError(f"recipeqa: src must be the RecipeQA folder, got {src}")
    files = {split: sorted(src.rglob(f"{split}-acl22.json")) for split in SPLITS}
    if not any(files.values()):
        raise FileNotFoundError(f"recipeqa: no {{train,val,test}}-acl22.json under {src}")
    index = index_images(src)
    log = ProblemLog()
    result = AdapterResult()
    store = ImageStore(out_images)
    seen: set[str] = set()
    for split, paths in files.items():
        for path in paths:
            for pos, record in iter_json_records(path, log):
                result.records_read[split] += 1
                _convert_recipe(record, path, pos, split, index, store, unreadable_image, min_steps, seen, log, result)
    log.raise_if_any()
    return result


def _convert_recipe(record: Any, path: Path, pos: int, split: str, index, store: ImageStore, policy: str,
                    min_steps: int, seen: set[str], log: ProblemLog, result: AdapterResult) -> None:
    if not isinstance(record, dict):
        log.add(path, pos, "?", "record", f"expected a JSON object, got {type(record).__name__}")
        return
    rid = record.get("recipe_id")
    if rid is None or str(rid) == "":
        log.add(path, pos, "?", "recipe_id", "missing field")
        return
    rid = str(rid)
    if rid in seen:
        result.dropped["duplicate recipe"] += 1
        return
    seen.add(rid)
    context = record.get("context")
    if not isinstance(context, list):
        log.add(path, pos, rid, "context", "missing field" if context is None else "must be a list of steps")
        return
    bad = False
    for i, step in enumerate(context):
        for name in ("id", "body"):
            if not isinstance(step, dict) or step.get(name) is None:
                log.add(path, pos, rid, f"context[{i}].{name}", "missing field")
                bad = True
    if bad:
        return
    if len(context) < max(min_steps, 2):
        result.dropped["too few steps"] += 1
        return
    sources = [_first_image(index, rid, step["id"]) for step in context]
    fields = [f"context[{i}].image" for i in range(len(context))]
    images = store_images(store, sources, rid, policy, log, (path, pos), fields, result.dropped)
    if images is None:
        return
    alternatives = None
    if record.get("multiref_gt") is not None:
        try:
            alternatives = normalize_orders(record["multiref_gt"], len(context))
        except ValueError as err:
            log.add(path, pos, rid, "multiref_gt", str(err))
            return
    procedure = Procedure(
        id=rid, steps=[Step(text=str(step["body"]), images=im) for step, im in zip(context, images)], split=split,
        title=str(record.get("title") or ""), category=["recipe"], alternatives=alternatives,
        meta={"source": "recipeqa", "step_ids": [step["id"] for step in context]}, root=store.root,
    )
    if check_procedure(procedure, path, pos, log):
        result.add(procedure)
