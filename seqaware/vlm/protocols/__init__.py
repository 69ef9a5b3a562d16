"""One module per prompted-evaluation protocol: :mod:`.teo` (MATEO), :mod:`.iso` (ISO-Bench),
:mod:`.coherence` (COHERENCE). Each builds the task's prompts, runs them through
:mod:`seqaware.vlm.runner`, parses the replies and scores them, baselines first."""
from seqaware.vlm.protocols.coherence import evaluate_coherence
from seqaware.vlm.protocols.iso import evaluate_iso
from seqaware.vlm.protocols.teo import evaluate_teo, teo_queries

__all__ = ["evaluate_coherence", "evaluate_iso", "evaluate_teo", "teo_queries"]
