"""Shared machinery of the dataset adapters: results, problem reports, images, JSON reading.

Every adapter turns a raw release into :class:`AdapterResult` (procedures per split, optional task
instances, counts of records read and of items dropped, with the reason). Bad input is collected
as :class:`seqaware.procedure.Problem` (``file:line: record id: field: reason``) and raised as one
:class:`seqaware.procedure.ProcedureFormatError` listing every problem, so a user fixes a file in
one pass instead of one error per run.

For sources that are a single JSON document (not JSON lines), the ``line`` of a problem is the
1-based position of the record in the document's record list.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence
from urllib.parse import urlparse

from PIL import Image

from data_modules.images import ImageLoadError, open_rgb
from seqaware.io import atomic_open
from seqaware.procedure import Problem, Procedure, ProcedureFormatError, decode_json_line, validate_record

IMAGE_POLICIES = ("error", "skip")
COPY_FORMATS = {"JPEG": ".jpg", "PNG": ".png"}
"""Source formats copied byte for byte (single-frame only); anything else is converted to JPEG."""


class AdapterOptionError(ValueError):
    """An adapter option has an invalid value (the message names the option)."""


def check_choice(option: str, value: Any, choices: Sequence[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``; otherwise raise naming the option."""
    if value not in choices:
        raise AdapterOptionError(f"option {option}={value!r}: expected one of {list(choices)}")
    return value


def check_split(split: Any) -> str:
    """Return ``split`` if it is a valid split name (train, val, test, test-<suffix>); else raise."""
    from seqaware.procedure import SPLIT_PATTERN

    if not SPLIT_PATTERN.match(str(split)):
        raise AdapterOptionError(f"option split={split!r}: expected train, val, test or test-<suffix>")
    return str(split)


# ---------------------------------------------------------------- progress
_PROGRESS: ContextVar[Any] = ContextVar("conversion_progress", default=None)


class RecordCounter(Counter):
    """``AdapterResult.records_read``: every adapter counts its input records here, so an increment
    also moves the bar of an enclosing :func:`conversion_progress` (if any)."""

    def __setitem__(self, key: Any, value: int) -> None:
        bar = _PROGRESS.get()
        if bar is not None:
            bar.update(value - self.get(key, 0))
        super().__setitem__(key, value)


@contextmanager
def conversion_progress(desc: str, progress: bool | None = None) -> Iterator[Any]:
    """A tqdm bar counting the input records adapters read inside this block (``progress`` None:
    only on a terminal, and not with ``TQDM_DISABLE=1``)."""
    from tqdm import tqdm

    with tqdm(desc=desc, unit="rec", disable=None if progress is None else not progress) as bar:
        token = _PROGRESS.set(bar)
        try:
            yield bar
        finally:
            _PROGRESS.reset(token)


@dataclass
class AdapterResult:
    """What an adapter produced from a raw release.

    Attributes:
        splits: ``{split: [Procedure]}`` (split names follow ``seqaware.procedure.SPLIT_PATTERN``).
        tasks: optional task instances, ``{task name: [instance dict]}`` (CaT-Bench pairs, ISO or
            COHERENCE instances read from a benchmark export).
        records_read: input records read, per source split (e.g. articles, recipes, lines).
        dropped: ``reason -> count`` of items left out (procedures, steps or edges; the reason says which).
    """

    splits: dict[str, list[Procedure]] = field(default_factory=dict)
    tasks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    records_read: Counter = field(default_factory=RecordCounter)
    dropped: Counter = field(default_factory=Counter)

    def add(self, procedure: Procedure) -> None:
        """Append a procedure to the list of its split."""
        self.splits.setdefault(procedure.split, []).append(procedure)

    @property
    def num_procedures(self) -> int:
        return sum(len(v) for v in self.splits.values())

    def all_procedures(self) -> list[Procedure]:
        return [p for procs in self.splits.values() for p in procs]


class ProblemLog:
    """Collects :class:`Problem` entries while a source is read; :meth:`raise_if_any` reports them all."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, file: str | Path, line: int, record_id: Any, field_name: str, reason: str) -> None:
        self.problems.append(Problem(str(file), int(line), str(record_id), field_name, reason))

    def __len__(self) -> int:
        return len(self.problems)

    def raise_if_any(self) -> None:
        if self.problems:
            raise ProcedureFormatError(self.problems)


def check_procedure(procedure: Procedure, file: str | Path, line: int, log: ProblemLog) -> bool:
    """Validate a built procedure with :func:`seqaware.procedure.validate_record`.

    Images are not checked here (adapters check them while storing them). Problems are added to
    ``log`` with the source location; returns True when the procedure is valid.
    """
    found = validate_record(procedure.to_dict(), root=procedure.root, check_images=False)
    for field_name, reason in found:
        log.add(file, line, procedure.id, field_name, reason)
    return not found


# ---------------------------------------------------------------- reading JSON sources
def iter_json_records(path: Path, log: ProblemLog, list_keys: Sequence[str] = ("data",)) -> Iterator[tuple[int, Any]]:
    """``(line or position, record)`` of a JSON-lines file or a JSON document.

    The file is JSON lines when its first non-blank line is a complete JSON value by itself (and
    neither a list nor an object holding the record list under one of ``list_keys``: a document
    written on one line, as ``json.dump`` writes it, is a document); JSON lines are streamed,
    so large releases are never held in memory whole. A line that is not valid JSON is logged as
    a problem (field ``json``) and skipped, so every bad line is reported at once. Text must be
    UTF-8: undecodable bytes are reported against the field holding them (never replaced).

    Otherwise the file is one JSON document: a list of records, or an object holding the list
    under one of ``list_keys`` (a plain object is one record); the position in the list is used
    as the line.
    """
    first = None
    with open(path, "rb") as handle:
        for raw in handle:
            if raw.strip():
                first = raw.decode("utf-8", errors="replace")
                break
    if first is None:
        return
    try:
        head = json.loads(first)
        lines = not (isinstance(head, list) or (isinstance(head, dict) and any(isinstance(head.get(k), list) for k in list_keys)))
    except json.JSONDecodeError:
        lines = False
    if lines:
        with open(path, "rb") as handle:
            for line_no, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                record, found = decode_json_line(raw)
                for field_name, reason in found:
                    rid = record.get("id", "?") if isinstance(record, dict) else "?"
                    log.add(path, line_no, rid, field_name, reason)
                if record is not None and not found:
                    yield line_no, record
        return
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_no = data.count(b"\n", 0, err.start) + 1
        log.add(path, line_no, "?", "text", f"not valid UTF-8 (byte 0x{data[err.start]:02x}); save the file as UTF-8")
        return
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        log.add(path, err.lineno, "?", "json", f"not valid JSON: {err.msg} (column {err.colno})")
        return
    # doc is a list or an object: a scalar document cannot get here (no JSON scalar spans two lines, so its
    # first line would have parsed and the file been read as JSON lines)
    records = doc
    if isinstance(doc, dict):
        key = next((k for k in list_keys if isinstance(doc.get(k), list)), None)
        records = [doc] if key is None else doc[key]
    yield from enumerate(records, start=1)


def get_path(record: Any, dotted: str) -> Any:
    """``record["a"]["b"]`` for ``"a.b"``; raises KeyError naming the missing part."""
    value = record
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(part)
    return value


def split_from_name(name: str) -> str | None:
    """The split a release file belongs to, from its name (``None`` if it names none).

    ``train`` -> train; ``dev``/``val``/``validation`` -> val; ``test`` -> test, and a test file
    whose name contains ``human`` is the golden set ``test-human``.
    """
    low = name.lower()
    tokens = set(re.split(r"[^a-z0-9]+", low))
    if "test" in tokens or "test" in low:
        return "test-human" if "human" in low else "test"
    if tokens & {"dev", "val", "validation", "valid"}:
        return "val"
    if "train" in tokens or "train" in low:
        return "train"
    return None


def normalize_orders(orders: Any, num_steps: int) -> list[list[int]]:
    """Alternative orders from a ``multiref_gt`` list (0- or 1-based), without the authored order.

    The offset is taken from the smallest index of the first order (as in the Wu et al. code).
    Raises ValueError with a reason when an order is not a permutation of the steps.
    """
    if not isinstance(orders, list) or not orders or not all(isinstance(o, list) for o in orders):
        raise ValueError("must be a non-empty list of orders (lists of step indices)")
    try:
        offset = min(int(v) for v in orders[0])
        out = [[int(v) - offset for v in order] for order in orders]
    except (TypeError, ValueError) as err:
        raise ValueError(f"orders must hold integers ({err})") from None
    alternatives: list[list[int]] = []
    for k, order in enumerate(out):
        if sorted(order) != list(range(num_steps)):
            raise ValueError(f"order {k} {orders[k]} is not a permutation of the {num_steps} steps")
        if order != list(range(num_steps)) and order not in alternatives:
            alternatives.append(order)
    return alternatives


def slug(text: str, max_len: int = 60) -> str:
    """A file-name-safe, unique-enough stem for ``text`` (readable prefix + short hash)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._")[:max_len] or "x"
    return f"{readable}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:8]}"


# ---------------------------------------------------------------- images
@dataclass
class PendingImage:
    """A readable image waiting to be stored: the bytes to copy, or a decoded image to re-encode."""

    data: bytes | None
    image: Image.Image | None
    suffix: str


class ImageStore:
    """Checks step images and copies/converts them into ``out_images``.

    * JPEG/PNG single-frame images are copied byte for byte; GIF/animated images become their
      middle frame (via :func:`data_modules.images.open_rgb`) and, like every other format, are
      written as JPEG.
    * Every image is decoded once, so an unreadable file is found at conversion time.
    * With ``out_images=None`` nothing is copied: procedures keep the absolute source paths.

    Images are *prepared* first (:meth:`prepare`, which may raise :class:`ImageLoadError`) and
    written only when a whole procedure is fine (:meth:`commit`), so a dropped procedure leaves no
    orphan files.
    """

    def __init__(self, out_images: Path | None, jpeg_quality: int = 95):
        self.out_images = None if out_images is None else Path(out_images)
        self.jpeg_quality = int(jpeg_quality)
        if self.out_images is not None:
            self.out_images.mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> str | None:
        """The folder stored image paths are relative to (the parent of ``out_images``)."""
        return None if self.out_images is None else str(self.out_images.parent)

    def prepare(self, source: Path | bytes) -> PendingImage | Path:
        """Decode ``source`` (a file or raw bytes); raises :class:`ImageLoadError` if unreadable."""
        if isinstance(source, (bytes, bytearray)):
            data = bytes(source)
            try:
                with Image.open(io.BytesIO(data)) as probe:
                    fmt, frames = probe.format, getattr(probe, "n_frames", 1)
                img = open_rgb(io.BytesIO(data))
            except (OSError, ValueError, Image.DecompressionBombError) as err:
                raise ImageLoadError(f"cannot read embedded image bytes: {err}") from err
        else:
            path = Path(source)
            img = open_rgb(path)  # raises ImageLoadError naming the file
            with Image.open(path) as probe:
                fmt, frames = probe.format, getattr(probe, "n_frames", 1)
            if self.out_images is None:
                return path.resolve()
            data = path.read_bytes()
        if self.out_images is None:
            raise ImageLoadError("embedded image bytes need an output image folder (out_images)")
        if fmt in COPY_FORMATS and frames == 1:
            return PendingImage(data=data, image=None, suffix=COPY_FORMATS[fmt])
        return PendingImage(data=None, image=img, suffix=".jpg")

    def commit(self, pending: PendingImage | Path, stem: str) -> str:
        """Write a prepared image as ``out_images/<stem><suffix>``; returns the stored path."""
        if isinstance(pending, Path):
            return str(pending)
        assert self.out_images is not None
        target = self.out_images / f"{stem}{pending.suffix}"
        with atomic_open(target, "wb") as handle:
            if pending.data is not None:
                handle.write(pending.data)
            else:
                pending.image.save(handle, format="JPEG", quality=self.jpeg_quality)
        return f"{self.out_images.name}/{target.name}"


def decode_embedded(value: Any) -> bytes | None:
    """Raw bytes of an embedded image value: ``{"bytes": ...}`` as bytes, base64 text or a list of ints."""
    if isinstance(value, dict):
        value = value.get("bytes")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            return None
    return None


def is_url(value: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*://", value, flags=re.IGNORECASE))


def image_source(value: Any, base: Path, url_root: str | Path | None) -> Path | bytes | str | None:
    """Where a step image comes from (the value of an export's image field): a local path (relative to
    ``base``), embedded bytes, None when there is no image, or a ``str`` reason it cannot be used
    (see :func:`store_images`). Accepted: a path, a URL (only through a local mirror ``url_root``:
    downloads are off), ``{"bytes": ...}`` / base64 text / a list of ints, or ``{"path": ...}``."""
    if value is None or value == "" or value == {}:
        return None
    if isinstance(value, dict) and value.get("bytes") is None:
        value = value.get("path")
        if not value:
            return None
    if not isinstance(value, str):
        data = decode_embedded(value)
        return data if data is not None else f"image value is not a path, URL or embedded bytes ({type(value).__name__})"
    if is_url(value):
        if url_root is None:
            return f"image URL {value} has no local copy (downloads are off; set option url_root to a local mirror)"
        local = Path(url_root) / urlparse(value).path.lstrip("/")
        return local if local.is_file() else f"image URL {value} has no local copy at {local}"
    path = Path(value)
    return path if path.is_absolute() else base / path


def resolve_fields(fields: Mapping[str, str] | None, known: tuple[str, ...]) -> dict[str, str]:
    """A field-mapped export's mapping (key -> dotted field) with defaults filled in (each key maps to
    itself); an unknown key raises naming the valid ones."""
    fields = dict(fields or {})
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise AdapterOptionError(f"option fields: unknown key(s) {unknown}; valid keys: {list(known)}")
    return {key: str(fields.get(key, key)) for key in known}


def record_value(record: Any, key: str, fields: dict[str, str]) -> Any:
    """The value of ``key`` in ``record`` through the mapping, or None when the field is absent."""
    try:
        return get_path(record, fields[key])
    except (KeyError, TypeError):
        return None


def mapped_record(record: Any, path: Path, line: int, fields: dict[str, str], known: tuple[str, ...],
                  required: tuple[str, ...], log: "ProblemLog") -> tuple[str, dict[str, Any]] | None:
    """``(id, {key: value})`` of one field-mapped export record (id default ``<file stem>-<line>``);
    None, with the problems logged under the record's file, line, id and mapped field, when it is not
    a JSON object or lacks a required field."""
    if not isinstance(record, dict):
        log.add(path, line, "?", "record", f"expected a JSON object, got {type(record).__name__}")
        return None
    value = {key: record_value(record, key, fields) for key in known}
    iid = str(value["id"]) if value.get("id") is not None else f"{path.stem}-{line}"
    missing = [key for key in required if value[key] is None]
    for key in missing:
        log.add(path, line, iid, fields[key], "missing field")
    return None if missing else (iid, value)


def store_images(
    store: ImageStore,
    sources: Sequence[Path | bytes | str | None],
    proc_id: str,
    policy: str,
    log: ProblemLog,
    where: tuple[Path | str, int],
    fields: Sequence[str],
    dropped: Counter,
) -> list[list[str]] | None:
    """Prepare and store the image of every step (``None`` = the step has no image).

    A ``str`` source is an image known to be unusable, given as the reason (e.g. a URL without a
    local copy); it is treated like an unreadable file.

    Returns the per-step image lists, or ``None`` when the procedure must be left out: with
    ``policy='skip'`` an unreadable image drops the procedure (counted as ``unreadable image``);
    with ``policy='error'`` the problem is logged against ``fields[i]`` of the record.
    """
    pending: list[PendingImage | Path | None] = []
    failed = False
    for i, source in enumerate(sources):
        if source is None:
            pending.append(None)
            continue
        try:
            if isinstance(source, str):
                raise ImageLoadError(source)
            pending.append(store.prepare(source))
        except ImageLoadError as err:
            failed = True
            if policy == "error":
                log.add(where[0], where[1], proc_id, fields[i], str(err))
            pending.append(None)
    if failed:
        if policy == "skip":
            dropped["unreadable image"] += 1
        return None
    stem = slug(proc_id)
    return [[] if p is None else [store.commit(p, f"{stem}_{i}")] for i, p in enumerate(pending)]


def iter_files(src: Path, suffixes: Iterable[str]) -> list[Path]:
    """``src`` itself if it is a file, else its files (recursively) with one of ``suffixes``, sorted."""
    src = Path(src)
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise FileNotFoundError(f"no such file or folder: {src}")
    wanted = tuple(suffixes)
    return sorted(p for p in src.rglob("*") if p.is_file() and p.name.endswith(wanted))


def read_instances(dataset: str, src: Path, build: Callable[[Any, Path, int, "ProblemLog", "AdapterResult"], Any]
                   ) -> AdapterResult:
    """Task-instance adapters (ISO-Bench, COHERENCE): every JSON / JSON-lines record of ``src`` through
    ``build(record, path, line, log, result)`` (None = dropped); problems are collected and raised
    together; the instances land in ``result.tasks[dataset]``."""
    log = ProblemLog()
    result = AdapterResult()
    files = iter_files(src, (".json", ".jsonl"))
    if not files:
        raise FileNotFoundError(f"{dataset}: no .json or .jsonl files in {src}")
    instances = []
    for path in files:
        for line, record in iter_json_records(path, log):
            result.records_read["instances"] += 1
            inst = build(record, path, line, log, result)
            if inst is not None:
                instances.append(inst)
    log.raise_if_any()
    result.tasks[dataset] = instances
    return result
