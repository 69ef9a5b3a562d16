"""The vocabulary of scripts/studies/paper_tables.py: what a table is made of (:class:`Label`, :class:`Metric`,
:class:`TableSpec`), the papers' column sets and names, and the cell values (a number, n/a or a dash)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from seqaware.vlm.prompts import STRATEGIES

NA = "n/a"      # a value not known
DASH = "-"      # a cell the paper prints as a dash or leaves empty: no value exists
REPAIRED_MARK = "°"
ROW_EXTRAS = ("repaired", "flags", "note")


@dataclass(frozen=True)
class Label:
    """A field naming a row. ``kind``: str (``allowed`` or any non-empty string), bool, objectives
    (a non-empty list of distinct ``allowed`` names), fraction (a number in (0, 1])."""
    key: str
    header: str = ""                      # column header; "" = not a column of its own
    allowed: tuple | None = None
    kind: str = "str"
    default: Any = None                   # value of an absent field; None = the field is required
    show: Mapping[str, str] = field(default_factory=dict)   # printed text of a value


@dataclass(frozen=True)
class Metric:
    key: str
    header: str
    low: float
    high: float
    decimals: int = 2
    percent: bool = False                 # the paper prints a percentage; ours (a fraction) x 100
    optional: bool = False
    own_line: bool = False                # printed on a line of its own below the row (Wu's "% benefit")


@dataclass(frozen=True)
class TableSpec:
    paper: str
    name: str
    title: str
    kind: str | None                      # the result flag that adds our rows (None: none does)
    labels: tuple[Label, ...]
    metrics: tuple[Metric, ...]
    groups: tuple[tuple[str, str], ...] = ()   # (key, header) column groups; () = metrics on the row itself
    heading: Callable[[Mapping[str, Any]], str] | None = None   # row-group heading of a row
    dagger: str | None = None             # label printed with a dagger on human rows
    plus_minus: bool = False              # groups hold {value, std}, printed "value ± std"
    summary: Callable[[Sequence[Mapping[str, Any]]], list[str]] | None = None   # extra notes from the published rows

    def cell_paths(self) -> list[str]:
        if not self.groups:
            return [m.key for m in self.metrics]
        return [f"{g}.{m.key}" for g, _ in self.groups for m in self.metrics]


PAPER_NAMES = {"wu2022": "Wu et al. 2022", "mateo": "MATEO", "iso_bench": "ISO-Bench", "coherence": "COHERENCE",
               "catbench": "CaT-Bench"}
SEQ_DATASETS = (("wikihow", "WikiHow"), ("recipeqa", "RecipeQA"))
SEQ_MODALITIES = {"image": "Image-Only", "text": "Text-Only", "multimodal": "Multimodal"}
OBJECTIVES = ("MLM", "ISP", "PISP", "SMRM")
TEO_MODALITY_SHOW = {"image": "Image-only", "text": "Text-only", "image_text": "Image+Text"}
TEO_STRATEGY_HEADERS = {"baseline": "Baseline", "instructions": "Instructions", "icl": "ICL", "cot": "CoT",
                        "self_reflection": "Self-Reflect."}
TEO_CLASSES = ("before", "independent", "after")
ISO_SETTINGS = {"answer_only": "A", "explain": "E->A"}
COHERENCE_GROUPS = {"open": "Open-Source Models", "closed": "Closed-Source Models", "ours": "Ours"}

_ORDER = (Metric("acc", "Acc↑", 0, 100, percent=True), Metric("pmr", "PMR↑", 0, 100, percent=True),
          Metric("lq", "Lq↑", 0, 5), Metric("lr", "Lr↑", 0, 5), Metric("tau", "τ↑", -1, 1), Metric("dist", "Dist↓", 0, 12))
_MULTI_REF = (Metric("acc_single", "Acc↑ single", 0, 100, percent=True), Metric("acc_multi", "Acc↑ multi", 0, 100, percent=True),
              Metric("pmr_single", "PMR↑ single", 0, 100, percent=True), Metric("pmr_multi", "PMR↑ multi", 0, 100, percent=True),
              Metric("lr_single", "Lr↑ single", 0, 5), Metric("lr_multi", "Lr↑ multi", 0, 5),
              Metric("benefit", "% of instances benefit w. multi-reference", 0, 100, decimals=1, percent=True,
                     optional=True, own_line=True))
_SUBSET = Label("subset", "Subset", ("single", "multi", "all"), show={"single": "Single", "multi": "Multi.", "all": "All"})
_HUMAN = Label("human", kind="bool", default=False)
_TEST_FRACTION = Label("test_fraction", kind="fraction", default=1.0)
_TEO_COLUMNS = tuple(Metric(s, TEO_STRATEGY_HEADERS[s], 0, 1) for s in STRATEGIES)
CATBENCH_SETTINGS = ("A", "A+E", DASH)        # DASH: not prompted (a trained model, a trivial row)
_CATBENCH_COLUMNS = (Metric("p", "P", 0, 1), Metric("r", "R", 0, 1), Metric("f1", "F1", 0, 1),
                     Metric("acc", "Acc", 0, 1), Metric("macro_f1", "macro F1", 0, 1))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number
