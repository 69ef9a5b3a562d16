"""Prompted TEO evaluation (MATEO): a model answers every pair of the original and swapped sets.

Prompts: :func:`seqaware.vlm.prompts.build_teo_prompt` (MATEO Table 5), or with ``prompt="finetune"``
:func:`~seqaware.vlm.prompts.build_teo_finetune_prompt` (Table 6, the prompt the LoRA recipe trains on; its
answers are read as the ``instructions`` strategy's); replies parsed with
:func:`seqaware.vlm.parser.parse_teo_answers`; scores: :mod:`seqaware.metrics.teo` (baselines first).
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Any, Mapping, Sequence

from seqaware.metrics.teo import TEO_COLUMNS, teo_rows, teo_table
from seqaware.vlm.parser import parse_teo_answers, reflection_outcome
from seqaware.vlm.prompts import build_teo_finetune_prompt, build_teo_prompt
from seqaware.vlm.runner import GenerateFn, OutputCache, Query, make_query, resolve_image, run_queries


def _step(step: Mapping[str, Any], root: str | os.PathLike | None) -> dict[str, Any]:
    images = step.get("images") or []
    return {"text": step.get("text"), "image": resolve_image(images[0], root) if images else None}


PROMPTS = ("eval", "finetune")


def check_prompt(prompt: str, strategy: str) -> None:
    """ValueError unless ``prompt`` is one of :data:`PROMPTS` and, for ``finetune``, ``strategy`` is ``instructions``."""
    if prompt not in PROMPTS:
        raise ValueError(f"prompt must be one of {', '.join(PROMPTS)}, got {prompt!r}")
    if prompt == "finetune" and strategy != "instructions":
        raise ValueError(f"prompt=finetune is MATEO's fine-tuning prompt (Table 6, the Instructions task): its answers "
                         f"are read as strategy instructions, got {strategy!r}")


def teo_queries(eval_sets: Mapping[str, Sequence[Mapping[str, Any]]], strategy: str, modality: str,
                signature: str, image_root: str | os.PathLike | None = None, variant: str = "reconstructed",
                prompt: str = "eval") -> list[Query]:
    """One query per pair of the ``original`` and ``swapped`` sets (``variant``: of the Table 5 prompts,
    :data:`seqaware.vlm.prompts.TEO_VARIANTS`; ``prompt="finetune"``: Table 6's prompt instead); errors name the pair."""
    check_prompt(prompt, strategy)
    queries = []
    for set_name in ("original", "swapped"):
        for pair in eval_sets[set_name]:
            try:
                a, b = _step(pair["step_a"], image_root), _step(pair["step_b"], image_root)
                messages = (build_teo_finetune_prompt(modality, a, b) if prompt == "finetune"
                            else build_teo_prompt(strategy, modality, a, b, variant=variant))
            except ValueError as err:
                raise ValueError(f"TEO pair {pair['pair_id']!r} ({set_name} set): {err}") from None
            queries.append(make_query(pair["pair_id"], set_name, messages, signature, image_root))
    return queries


def evaluate_teo(eval_sets: Mapping[str, Sequence[Mapping[str, Any]]], generate: GenerateFn, cache: OutputCache,
                 strategy: str, modality: str, model_name: str, signature: str | None = None,
                 image_root: str | os.PathLike | None = None, batch_size: int = 8, seed: int = 0,
                 variant: str = "reconstructed", prompt: str = "eval") -> dict[str, Any]:
    """TEO result of one (model, strategy, modality): metrics rows (baselines first), predictions.
    ``variant``: which Table 5 prompts (``reconstructed`` | ``printed``), recorded in the result;
    ``prompt``: ``eval`` (Table 5) or ``finetune`` (Table 6, strategy ``instructions``), recorded too.

    Returns ``{"task": "teo", "model", "strategy", "modality", "rows": {name: report}, "columns",
    "predictions": {set: {pair_id: label}}, "reflection": counts or None}``. For
    ``self_reflection`` the model row scores the final answers and an extra row
    ``<model> (first answer)`` the initial ones; ``reflection`` counts kept/corrected/broken answers.
    """
    signature = signature or model_name
    original, swapped = list(eval_sets["original"]), list(eval_sets["swapped"])
    queries = teo_queries(eval_sets, strategy, modality, signature, image_root, variant, prompt)
    outputs = run_queries(queries, generate, cache, batch_size,
                          extra={"model": model_name, "task": "teo", "strategy": strategy, "modality": modality})
    first: dict[str, dict[str, str]] = {"original": {}, "swapped": {}}
    final: dict[str, dict[str, str]] = {"original": {}, "swapped": {}}
    for q, text in zip(queries, outputs):
        first[q.set_name][q.item_id], final[q.set_name][q.item_id] = parse_teo_answers(text, strategy)
    systems = {model_name: (final["original"], final["swapped"])}
    reflection = None
    if strategy == "self_reflection":
        systems[f"{model_name} (first answer)"] = (first["original"], first["swapped"])
        gold = {(s, p["pair_id"]): p["label"] for s, pairs in (("original", original), ("swapped", swapped)) for p in pairs}
        counts = Counter(reflection_outcome(first[s][pid], final[s][pid], label) for (s, pid), label in gold.items())
        reflection = {k: counts.get(k, 0) for k in ("kept_correct", "kept_wrong", "corrected", "broken", "changed_wrong")}
    rows = teo_rows(original, swapped, systems, seed=seed)
    return {"task": "teo", "model": model_name, "strategy": strategy, "modality": modality,
            "prompt_variant": variant, "prompt": prompt, "num_pairs": len(original), "rows": rows, "columns": [list(c) for c in TEO_COLUMNS],
            "table": teo_table(rows), "predictions": final, "reflection": reflection}
