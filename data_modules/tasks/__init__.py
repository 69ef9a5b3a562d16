"""Task views built from procedures, as plain JSON-serialisable instances.

* :mod:`.teo` -- Temporal Execution Order pairs (before / after / independent), MATEO style;
* :mod:`.iso` -- ISO-Bench style image-vs-snippet dependency questions (DEP / NONDEP);
* :mod:`.coherence` -- COHERENCE style placeholder-to-image assignment.

Image paths in instances are kept as stored in the steps (relative to the procedures folder).
The matching metrics live in :mod:`seqaware.metrics.teo`, :mod:`seqaware.metrics.iso` and
:mod:`seqaware.metrics.coherence`.
"""
from data_modules.tasks.coherence import coherence_instances
from data_modules.tasks.iso import iso_instances
from data_modules.tasks.teo import (
    stratified_split,
    swap_pair,
    teo_class_counts,
    teo_eval_sets,
    teo_pairs,
    teo_training_pairs,
    twin_presentations,
)

__all__ = [
    "coherence_instances",
    "iso_instances",
    "stratified_split",
    "swap_pair",
    "teo_class_counts",
    "teo_eval_sets",
    "teo_pairs",
    "teo_training_pairs",
    "twin_presentations",
]
