"""Vision-language models (VLMs): building them, prompting them and reading their answers.

* :mod:`seqaware.vlm.models` -- where the InternVL model and its processor are built (tiny, MiniLM-based,
  real checkpoints, the 8B architecture), PEFT LoRA and the answer-only loss (TEO fine-tuning);
* :mod:`seqaware.vlm.prompts` -- chat prompts (templates in ``configs/prompts/*.yaml``) for TEO
  (5 strategies x 3 modalities, MATEO's fine-tuning prompt), ISO-Bench and COHERENCE;
* :mod:`seqaware.vlm.parser` -- free-text answers -> TEO classes / ISO labels / COHERENCE assignments;
* :mod:`seqaware.vlm.runner` -- task-agnostic: batched, resumable prompting of any image-text-to-text
  model (queries, output cache, Hugging Face generation, result files);
* :mod:`seqaware.vlm.protocols` -- one module per task protocol (``teo``, ``iso``, ``coherence``):
  prompts -> replies -> parsed answers -> scores, baselines first.

The prompt and parser names are re-exported here; importing this package loads neither torch nor
transformers (:mod:`~seqaware.vlm.models` does).
"""
from seqaware.vlm.parser import (
    OTHER,
    parse_coherence_answer,
    parse_iso_answer,
    parse_teo_answer,
    parse_teo_answers,
    question_answers,
    reflection_outcome,
)
from seqaware.vlm.prompts import (
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
