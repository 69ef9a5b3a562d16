"""Temporal Execution Order (TEO) with prompted vision-language models.

* :mod:`seqaware.teo.prompts` -- chat prompts (templates in ``configs/prompts/*.yaml``) for TEO
  (5 strategies x 3 modalities), ISO-Bench and COHERENCE;
* :mod:`seqaware.teo.parser` -- free-text answers -> TEO classes / ISO labels / COHERENCE assignments;
* :mod:`seqaware.teo.runner` -- batched, resumable evaluation of any image-text-to-text model.
"""
from seqaware.teo.parser import (
    OTHER,
    parse_coherence_answer,
    parse_iso_answer,
    parse_teo_answer,
    parse_teo_answers,
    question_answers,
    reflection_outcome,
)
from seqaware.teo.prompts import (
    ISO_STRATEGIES,
    MODALITIES,
    QUESTION_STRATEGIES,
    STRATEGIES,
    build_coherence_prompt,
    build_iso_prompt,
    build_teo_finetune_prompt,
    build_teo_prompt,
    prompt_hash,
    teo_answer,
)

__all__ = [
    "ISO_STRATEGIES", "MODALITIES", "OTHER", "QUESTION_STRATEGIES", "STRATEGIES",
    "build_coherence_prompt", "build_iso_prompt", "build_teo_finetune_prompt", "build_teo_prompt", "parse_coherence_answer",
    "parse_iso_answer", "parse_teo_answer", "parse_teo_answers", "prompt_hash", "question_answers",
    "reflection_outcome", "teo_answer",
]
