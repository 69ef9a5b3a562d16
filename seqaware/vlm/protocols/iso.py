"""Prompted ISO-Bench evaluation (App. H): DEP / NONDEP questions about an image and a plan snippet.

Prompts: :func:`seqaware.vlm.prompts.build_iso_prompt`; replies parsed with
:func:`seqaware.vlm.parser.parse_iso_answer`; scores: :mod:`seqaware.metrics.iso` (baselines first).
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from seqaware.metrics.iso import ISO_COLUMNS, ISO_UNPARSABLE, iso_report, iso_rows, iso_table
from seqaware.vlm.parser import parse_iso_answer
from seqaware.vlm.prompts import build_iso_prompt, iso_max_new_tokens
from seqaware.vlm.runner import GenerateFn, OutputCache, make_query, resolve_image, run_queries


class _TokenLimit:
    """Temporarily set ``generate.max_new_tokens`` (when the generator has one, e.g. :class:`~seqaware.vlm.runner.HFGenerator`)."""

    def __init__(self, generate: Any, max_new_tokens: int | None) -> None:
        self.generate, self.limit = generate, max_new_tokens
        self.saved = getattr(generate, "max_new_tokens", None)

    def __enter__(self) -> None:
        if self.limit is not None and self.saved is not None:
            self.generate.max_new_tokens = int(self.limit)

    def __exit__(self, *exc: Any) -> None:
        if self.limit is not None and self.saved is not None:
            self.generate.max_new_tokens = self.saved


def evaluate_iso(instances: Sequence[Mapping[str, Any]], generate: GenerateFn, cache: OutputCache, strategy: str,
                 model_name: str, signature: str | None = None, image_root: str | os.PathLike | None = None,
                 batch_size: int = 8, seed: int = 0, max_new_tokens: int | None = None,
                 unparsable: str = "exclude") -> dict[str, Any]:
    """ISO-Bench result of one (model, strategy): DEP/NONDEP P/R/F1 rows (baselines first), predictions.

    Protocol of ISO-Bench App. H: the prompt of :func:`build_iso_prompt`, generation limited to
    ``max_new_tokens`` (default: ``max_new_tokens`` of ``configs/prompts/iso.yaml``, 120), the first
    YES/NO (``answer_only``) or the final ``<answer>`` tag (``explain``) as the answer, and
    unparsable replies left out of the scores (``unparsable="exclude"``; ``"wrong"`` counts them as
    errors). ``rows`` and ``by_task`` follow ``unparsable``; ``rows_by_unparsable`` holds the rows under
    both rules and the printed ``table`` shows both (some published Table 1 rows can only come from
    counting unparsable replies wrong: ``scripts/studies/paper_tables.py --iso`` says which). The limit is applied by setting ``generate.max_new_tokens`` for the duration of the
    call when the generator has that attribute (:class:`~seqaware.vlm.runner.HFGenerator`); any other callable must
    honour it itself. The limit is part of every prompt hash. ``by_task`` holds the model's scores
    on the ``before`` and ``after`` questions separately (as in ISO-Bench Figure 3).
    """
    limit = iso_max_new_tokens() if max_new_tokens is None else int(max_new_tokens)
    signature = f"{signature or model_name}|iso_max_new_tokens={limit}"
    queries = []
    for inst in instances:
        messages = build_iso_prompt(strategy, inst, image=resolve_image(inst.get("image"), image_root))
        queries.append(make_query(inst["instance_id"], "iso", messages, signature, image_root))
    with _TokenLimit(generate, limit):
        outputs = run_queries(queries, generate, cache, batch_size,
                              extra={"model": model_name, "task": "iso", "strategy": strategy})
    preds = {q.item_id: parse_iso_answer(text, strategy) for q, text in zip(queries, outputs)}
    gold = {inst["instance_id"]: inst["label"] for inst in instances}
    if unparsable not in ISO_UNPARSABLE:
        raise ValueError(f"unparsable must be one of {', '.join(ISO_UNPARSABLE)}, got {unparsable!r}")
    rows_by = {rule: iso_rows(gold, {model_name: preds}, seed=seed, unparsable=rule) for rule in ISO_UNPARSABLE}
    rows = rows_by[unparsable]
    table = "\n\n".join(f"unparsable={rule}" + (" (ISO-Bench App. H)" if rule == "exclude" else "") + ":\n\n"
                         + iso_table(rule_rows) for rule, rule_rows in rows_by.items())
    by_task = {}
    for task in ("before", "after"):
        ids = [inst["instance_id"] for inst in instances if inst.get("task") == task]
        if ids:
            by_task[task] = iso_report({i: gold[i] for i in ids}, {i: preds[i] for i in ids}, unparsable)
    return {"task": "iso", "model": model_name, "strategy": strategy, "modality": "image_text",
            "num_instances": len(instances), "max_new_tokens": limit, "unparsable": unparsable, "rows": rows,
            "rows_by_unparsable": rows_by, "columns": [list(c) for c in ISO_COLUMNS], "table": table, "by_task": by_task,
            "predictions": preds}
