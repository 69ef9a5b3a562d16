"""Prompted COHERENCE evaluation (App. D.1 prompt, sec. 4.1 / App. E metrics): placeholder-to-image assignment.

Prompts: :func:`seqaware.vlm.prompts.build_coherence_prompt`; replies parsed with
:func:`seqaware.vlm.parser.parse_coherence_answer`; scores: :mod:`seqaware.metrics.coherence`.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from seqaware.metrics.coherence import COHERENCE_COLUMNS, coherence_rows, coherence_source_table, coherence_table
from seqaware.vlm.parser import parse_coherence_answer
from seqaware.vlm.prompts import build_coherence_prompt
from seqaware.vlm.runner import GenerateFn, OutputCache, make_query, resolve_image, run_queries


def evaluate_coherence(instances: Sequence[Mapping[str, Any]], generate: GenerateFn, cache: OutputCache,
                       model_name: str, signature: str | None = None, image_root: str | os.PathLike | None = None,
                       batch_size: int = 8, seed: int = 0) -> dict[str, Any]:
    """COHERENCE result of one model (App. D.1 prompt, §4.1 / App. E metrics).

    Rows: exact match, partial score, reject accuracy, unparsable and invalid rates (baselines
    first), each with ``by_source`` / ``by_difficulty``; ``table`` adds the per-domain table in the
    layout of COHERENCE Table 1 when the instances carry a ``source``.
    """
    signature = signature or model_name
    queries = []
    for inst in instances:
        images = [resolve_image(c, image_root) for c in inst["candidates"]]
        queries.append(make_query(inst["instance_id"], "coherence", build_coherence_prompt(inst, images=images), signature,
                                  image_root))
    outputs = run_queries(queries, generate, cache, batch_size, extra={"model": model_name, "task": "coherence"})
    preds = {inst["instance_id"]: parse_coherence_answer(text) for inst, text in zip(instances, outputs)}
    rows = coherence_rows(instances, {model_name: preds}, seed=seed)
    table = coherence_table(rows)
    by_source = coherence_source_table(rows)
    if by_source:
        table += "\n\nBy source domain (COHERENCE Table 1 layout):\n\n" + by_source
    return {"task": "coherence", "model": model_name, "strategy": "assign", "modality": "image_text",
            "num_instances": len(instances), "rows": rows, "columns": [list(c) for c in COHERENCE_COLUMNS],
            "table": table, "predictions": preds}
