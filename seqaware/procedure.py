"""The procedure data model: the one format every dataset is converted into.

A *procedure* is an ordered list of steps (the authored, gold order) with optional structure::

    {"id": "synth-000012",                 # unique across all files of a dataset
     "split": "train",                     # train | val | test, optionally with a suffix: test-golden
     "title": "Stack blocks",
     "category": ["stacking", "two towers"],   # a category path, most general first
     "steps": [{"text": "Put a red block on the left.",
                "images": ["images/synth-000012_0.png"],   # relative to the JSONL file's folder
                "boxes": [[12, 140, 60, 180]],             # optional: object boxes of images[0], pixels
                "box_labels": ["red block"]}, ...],
     "dag": [[0, 2], [1, 2]],              # optional: i -> j means "j needs the outcome of i"
     "alternatives": [[1, 0, 2]],          # optional: other valid execution orders (step indices)
     "meta": {...}}                        # optional: anything else, carried through untouched

Every task (sequencing, pretraining, TEO pairs, ISO, COHERENCE) is a *view* built from procedures.

Problems in a file are reported as ``file:line: record id: field: reason`` so a user can jump to them.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from seqaware import dag as dag_utils
from seqaware.io import write_jsonl

SPLIT_PATTERN = re.compile(r"^(train|val|test)([-_][A-Za-z0-9_.]+)?$")
"""Valid split names: ``train``, ``val``, ``test``, optionally with a suffix (``test-golden``)."""


@dataclass
class Step:
    """One step: a text, images, or both."""

    text: str | None = None
    images: list[str] = field(default_factory=list)
    boxes: list[list[float]] | None = None
    box_labels: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "images": list(self.images)}
        if self.boxes is not None:
            out["boxes"] = [list(b) for b in self.boxes]
        if self.box_labels is not None:
            out["box_labels"] = list(self.box_labels)
        if self.meta:
            out["meta"] = self.meta
        return out


@dataclass
class Procedure:
    """An ordered list of steps with optional category, dependency DAG and alternative orders."""

    id: str
    steps: list[Step]
    split: str = "train"
    title: str = ""
    category: list[str] = field(default_factory=list)
    dag: list[tuple[int, int]] | None = None
    alternatives: list[list[int]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    root: str | None = None
    """Folder that relative image paths are resolved against (the JSONL file's folder); not saved."""
    origin: tuple[str, int] | None = None
    """``(file, line)`` the procedure was read from, for ``file:line`` messages; not saved."""

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def image_path(self, step: int, k: int = 0) -> Path | None:
        """Absolute path of image ``k`` of ``step``, or None when the step has no such image."""
        images = self.steps[step].images
        if k >= len(images):
            return None
        return resolve_path(images[k], self.root)

    def gold_order(self) -> list[int]:
        return list(range(self.num_steps))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "split": self.split,
            "title": self.title,
            "category": list(self.category),
            "steps": [s.to_dict() for s in self.steps],
        }
        if self.dag is not None:
            out["dag"] = [list(e) for e in self.dag]
        if self.alternatives is not None:
            out["alternatives"] = [list(a) for a in self.alternatives]
        if self.meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_dict(cls, record: dict[str, Any], root: str | os.PathLike | None = None,
                  origin: tuple[str, int] | None = None) -> "Procedure":
        """Build a procedure from a record that :func:`validate_record` accepted."""
        steps = [
            Step(
                text=s.get("text"),
                images=list(s.get("images") or []),
                boxes=s.get("boxes"),
                box_labels=s.get("box_labels"),
                meta=s.get("meta") or {},
            )
            for s in record["steps"]
        ]
        dag = record.get("dag")
        return cls(
            id=str(record["id"]),
            steps=steps,
            split=record["split"],
            title=record.get("title") or "",
            category=_as_category(record.get("category")),
            dag=None if dag is None else [(int(a), int(b)) for a, b in dag],
            alternatives=record.get("alternatives"),
            meta=record.get("meta") or {},
            root=None if root is None else str(root),
            origin=origin,
        )


def _as_category(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def resolve_path(path: str, root: str | os.PathLike | None) -> Path:
    p = Path(path)
    if p.is_absolute() or root is None:
        return p
    return Path(root) / p


OUTSIDE_OPTION = "data.allow_outside_images=true"
"""The option (Hydra config key) that allows image paths outside the data folder."""


def outside_data_folder(path: str, root: str | os.PathLike | None) -> bool:
    """True when image ``path`` resolves outside ``root`` (``../..`` or an absolute path elsewhere).

    The test is lexical (``os.path.normpath``), so a symbolic link the user put inside the data
    folder is allowed; with no ``root`` only absolute paths can be checked and none is outside.
    """
    if root is None:
        return False
    base = os.path.normpath(os.path.abspath(root))
    full = os.path.normpath(os.path.join(base, path))
    return os.path.commonpath([base, full]) != base


def base_split(split: str) -> str:
    """``train`` / ``val`` / ``test`` of a split name (``test-golden`` -> ``test``)."""
    match = SPLIT_PATTERN.match(split)
    return match.group(1) if match else split


def split_of_file(path: str | os.PathLike) -> str | None:
    """The split a prepared file holds when its name says so (``train.jsonl``, ``test-golden.jsonl``)."""
    stem = Path(path).stem
    return stem if SPLIT_PATTERN.match(stem) else None


@dataclass(frozen=True)
class Problem:
    """One problem found in a procedures file."""

    file: str
    line: int
    record_id: str
    field: str
    reason: str

    def __str__(self) -> str:
        if self.line <= 0:  # a problem of a whole file (missing, empty, given twice): no line
            record = f"{self.record_id}: " if self.record_id else ""
            return f"{self.file}: {record}{self.field}: {self.reason}"
        return f"{self.file}:{self.line}: {self.record_id}: {self.field}: {self.reason}"


class ProcedureFormatError(ValueError):
    """Raised when a procedures file has problems; carries every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        shown = "\n".join(str(p) for p in problems[:50])
        more = f"\n... and {len(problems) - 50} more" if len(problems) > 50 else ""
        super().__init__(f"{len(problems)} problem(s) in procedures:\n{shown}{more}")


def validate_record(
    record: Any, root: str | os.PathLike | None = None, check_images: bool = True,
    allow_outside_images: bool = True, expected_split: str | None = None, split_key: str = "the file",
) -> list[tuple[str, str]]:
    """Check one record; returns ``(field, reason)`` pairs, empty when the record is valid.

    ``allow_outside_images=False`` rejects image paths that resolve outside ``root`` (see
    :func:`outside_data_folder`); ``expected_split`` (``train``, ``val`` or ``test``) rejects a
    record whose ``split`` belongs to another split, ``split_key`` naming where that expectation
    comes from (e.g. ``data.train_path``).
    """
    if not isinstance(record, dict):
        return [("record", f"expected a JSON object, got {type(record).__name__}")]
    problems: list[tuple[str, str]] = []
    for name in ("id", "split", "steps"):
        if name not in record or record[name] is None:
            problems.append((name, "missing field"))
    if "id" in record and not isinstance(record["id"], (str, int)):
        problems.append(("id", "must be a string"))
    split = record.get("split")
    if split is not None and (not isinstance(split, str) or not SPLIT_PATTERN.match(split)):
        problems.append(("split", f"unknown split {split!r} (expected train, val or test, optionally with a -suffix)"))
    elif split is not None and expected_split is not None and base_split(split) != base_split(expected_split):
        problems.append(("split", f"record says split {split!r} but {split_key} holds the {base_split(expected_split)} split"))
    steps = record.get("steps")
    if steps is None:
        return problems
    if not isinstance(steps, list):
        return problems + [("steps", "must be a list")]
    if len(steps) < 2:
        problems.append(("steps", f"a procedure needs at least 2 steps, got {len(steps)}"))
    for i, step in enumerate(steps):
        problems.extend(_validate_step(i, step, root, check_images, allow_outside_images))
    n = len(steps)
    if record.get("dag") is not None:
        problems.extend(_validate_dag(n, record["dag"]))
    if record.get("alternatives") is not None:
        problems.extend(_validate_alternatives(n, record["alternatives"]))
    return problems


def _validate_step(i: int, step: Any, root, check_images: bool, allow_outside_images: bool = True) -> list[tuple[str, str]]:
    where = f"steps[{i}]"
    if not isinstance(step, dict):
        return [(where, "must be an object with text and/or images")]
    problems = []
    text = step.get("text")
    images = step.get("images") or []
    if text is not None and not isinstance(text, str):
        problems.append((f"{where}.text", "must be a string"))
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        return problems + [(f"{where}.images", "must be a list of paths")]
    has_text = isinstance(text, str) and text.strip() != ""
    if not has_text and not images:
        problems.append((where, "step has neither text nor image"))
    for k, path in enumerate(images):
        full = resolve_path(path, root)
        if not allow_outside_images and outside_data_folder(path, root):
            problems.append((f"{where}.images[{k}]", f"image path {path!r} resolves outside the data folder {root} "
                                                     f"(set {OUTSIDE_OPTION} to allow it)"))
        elif check_images and not full.is_file():
            problems.append((f"{where}.images[{k}]", f"image file not found: {full}"))
    boxes = step.get("boxes")
    if boxes is not None:
        ok = isinstance(boxes, list) and all(
            isinstance(b, (list, tuple)) and len(b) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in b) for b in boxes
        )
        if not ok:
            problems.append((f"{where}.boxes", "must be a list of [x0, y0, x1, y1] boxes"))
        labels = step.get("box_labels")
        if ok and labels is not None and len(labels) != len(boxes):
            problems.append((f"{where}.box_labels", f"{len(labels)} labels for {len(boxes)} boxes"))
    return problems


def _validate_dag(n: int, edges: Any) -> list[tuple[str, str]]:
    if not isinstance(edges, list) or not all(isinstance(e, (list, tuple)) and len(e) == 2 for e in edges):
        return [("dag", "must be a list of [from, to] step-index pairs")]
    problems = []
    for k, (a, b) in enumerate(edges):
        if not (isinstance(a, int) and isinstance(b, int)) or isinstance(a, bool) or isinstance(b, bool):
            problems.append((f"dag[{k}]", f"edge {[a, b]} must join two step indices"))
        elif not (0 <= a < n and 0 <= b < n):
            problems.append((f"dag[{k}]", f"edge {[a, b]} points to an unknown step (procedure has {n} steps)"))
        elif a == b:
            problems.append((f"dag[{k}]", f"edge {[a, b]} is a self loop"))
    if problems:
        return problems
    cycle = dag_utils.find_cycle(n, [tuple(e) for e in edges])
    if cycle is not None:
        path = " -> ".join(str(s) for s in cycle + cycle[:1])
        problems.append(("dag", f"cyclic DAG: {path}"))
    return problems


def _validate_alternatives(n: int, alternatives: Any) -> list[tuple[str, str]]:
    if not isinstance(alternatives, list):
        return [("alternatives", "must be a list of orders")]
    problems = []
    for k, order in enumerate(alternatives):
        if not isinstance(order, list) or sorted(order) != list(range(n)):
            problems.append((f"alternatives[{k}]", f"must be a permutation of the {n} step indices"))
    return problems


def _bad_text_fields(value: Any, where: str = "") -> list[str]:
    """Dotted paths of the strings in ``value`` holding undecodable bytes (``surrogateescape``)."""
    if isinstance(value, str):
        return [where or "record"] if any("\udc80" <= ch <= "\udcff" for ch in value) else []
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _bad_text_fields(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list):
        return [f for k, v in enumerate(value) for f in _bad_text_fields(v, f"{where}[{k}]")]
    return []


def decode_json_line(raw: bytes) -> tuple[Any, list[tuple[str, str]]]:
    """Parse one JSON line read as bytes; returns ``(record, problems)``.

    Text must be UTF-8: undecodable bytes are not silently replaced but reported against the
    field that holds them (``steps[1].text: not valid UTF-8 ...``); the record is still parsed
    so the message can name its id. ``record`` is None when the line is not valid JSON.
    """
    # without its line ending: a line cut short is then reported at its end, not at column 1 of a next line
    text = raw.decode("utf-8", errors="surrogateescape").rstrip("\r\n")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        return None, [("json", f"not valid JSON: {err.msg} (column {err.colno})")]
    problems = []
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        fields = _bad_text_fields(record) or ["record"]
        reason = (f"not valid UTF-8 (byte 0x{raw[err.start]:02x} at byte {err.start + 1} of the line); "
                  "save the file as UTF-8")
        problems = [(f, reason) for f in fields]
    return record, problems


def check_procedures_file(
    path: str | os.PathLike, check_images: bool = True, seen_ids: dict[str, str] | None = None,
    expected_split: str | None = None, split_key: str | None = None, allow_outside_images: bool = True,
    decode_images: bool = False,
) -> tuple[list[Procedure], list[Problem]]:
    """Read and validate every line of a JSONL file; returns the valid procedures and all problems.

    ``seen_ids`` maps ids to ``file:line`` already seen (pass one dict across files to catch
    duplicates between the files of a dataset). ``expected_split`` / ``split_key``: the split this
    file holds and the option or file name that says so (records of another split are problems).
    ``allow_outside_images=False`` rejects image paths outside the file's folder;
    ``decode_images=True`` also opens every image (see :func:`image_decode_problem`).
    """
    path = Path(path)
    root = path.parent
    seen = {} if seen_ids is None else seen_ids
    procedures: list[Procedure] = []
    problems: list[Problem] = []
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            record, found = decode_json_line(raw)
            if record is None:
                problems.extend(Problem(str(path), line_no, "?", f, r) for f, r in found)
                continue
            record_id = str(record.get("id", "?")) if isinstance(record, dict) else "?"
            found += validate_record(record, root=root, check_images=check_images or decode_images,
                                     allow_outside_images=allow_outside_images, expected_split=expected_split,
                                     split_key=split_key or f"{path.name}")
            if isinstance(record, dict) and "id" in record:
                where = f"{path}:{line_no}"
                if record_id in seen:
                    found.append(("id", f"duplicate id (first seen at {seen[record_id]})"))
                else:
                    seen[record_id] = where
            if not found and decode_images:
                for i, step in enumerate(record["steps"]):
                    for k, image in enumerate(step.get("images") or []):
                        reason = image_decode_problem(resolve_path(image, root))
                        if reason:
                            found.append((f"steps[{i}].images[{k}]", reason))
            problems.extend(Problem(str(path), line_no, record_id, f, r) for f, r in found)
            if not found:
                procedures.append(Procedure.from_dict(record, root=root, origin=(str(path), line_no)))
    return procedures, problems


def image_decode_problem(path: str | os.PathLike) -> str | None:
    """None when the image at ``path`` decodes completely; otherwise the reason.

    ``Image.open`` only reads the header: ``load()`` decodes the pixels, so a truncated or corrupt
    file is caught here instead of in the middle of an epoch.
    """
    from PIL import Image  # Pillow is a dependency of the data side only

    try:
        with Image.open(path) as img:
            img.load()
    except FileNotFoundError:
        return f"image file not found: {path}"
    except Exception as err:  # noqa: BLE001 - Pillow raises OSError, SyntaxError, ValueError, DecompressionBombError...
        return f"image does not decode: {path}: {type(err).__name__}: {err}"
    return None


def check_split_files(files: dict[str, str | os.PathLike]) -> list[Problem]:
    """Problems between the files of a dataset: one file given for two splits.

    ``files`` maps the option naming each file (``data.train_path``) to its path. Ids shared
    between files are caught by passing one ``seen_ids`` dict to :func:`check_procedures_file`.
    """
    problems = []
    first: dict[str, str] = {}
    for key, path in files.items():
        real = os.path.realpath(path)
        if real in first:
            problems.append(Problem(str(path), 0, "", key,
                                    f"the same file as {first[real]}: train and evaluation data must be distinct files"))
        else:
            first[real] = key
    return problems


def read_procedures(path: str | os.PathLike, check_images: bool = True, **checks: Any) -> list[Procedure]:
    """Read a procedures JSONL file; raises :class:`ProcedureFormatError` listing every problem.

    ``checks``: further keyword arguments of :func:`check_procedures_file` (``seen_ids``,
    ``expected_split``, ``split_key``, ``allow_outside_images``, ``decode_images``).
    """
    procedures, problems = check_procedures_file(path, check_images=check_images, **checks)
    if problems:
        raise ProcedureFormatError(problems)
    return procedures


def iter_procedure_files(paths: Iterable[str | os.PathLike]) -> Iterator[Path]:
    """Expand folders into their ``*.jsonl`` files (sorted); keep files as given."""
    for p in paths:
        p = Path(p)
        if p.is_dir():
            yield from sorted(p.glob("*.jsonl"))
        else:
            yield p


def write_procedures(path: str | os.PathLike, procedures: Iterable[Procedure]) -> int:
    """Write procedures as JSONL, atomically. Image paths are written as stored in the steps."""
    return write_jsonl(path, (p.to_dict() for p in procedures))
