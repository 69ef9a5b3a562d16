"""ROCStories / SIND tsv -> text-only procedures in gold sentence order (BERSON's format).

A file holds one story per line; its sentences are separated by `` <eos> `` and already lower-cased
and tokenised. Line ``k`` of ``NAME.tsv`` becomes procedure ``NAME-k`` whose steps are the
sentences in gold order (no images, no DAG: the reference is the authored order).

A *bad line* has fewer than 2 sentences or an empty sentence. With ``bad_lines='error'`` every bad
line is reported as ``file:line: NAME-k: steps: reason``; with ``bad_lines='skip'`` (default, the
real files have a few oddities) they are left out and their number is logged and returned in
``dropped``. Blank lines are ignored. Bytes that are not UTF-8 are an error whatever ``bad_lines``
says (never replaced): ``file:line: NAME-k: steps[i].text: not valid UTF-8 (byte 0xe9 at column C)``.

Stories are compared by :func:`story_key`, a normalised form of their text (case, spacing,
punctuation, tokenisation and digits do not count), so a copy of a story is found whatever its
surface form.

:func:`roc_source` is the Hydra source of ``configs/data/roc.yaml``; :func:`convert` is the
adapter used by ``scripts/tools/prepare_data.py``.
"""
from __future__ import annotations

import logging
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

from data_modules.adapters.common import (
    AdapterOptionError,
    AdapterResult,
    ProblemLog,
    check_choice,
    iter_files,
    split_from_name,
)
from data_modules.adapters.registry import ADAPTERS
from seqaware.procedure import Problem, Procedure, ProcedureFormatError, Step, check_split_files

log = logging.getLogger(__name__)

SEPARATOR = "<eos>"
BAD_LINE_POLICIES = ("error", "skip")


def read_roc(path: str | Path, split: str, bad_lines: str = "skip", max_stories: int | None = None,
             dropped: Counter | None = None) -> list[Procedure]:
    """Stories of one tsv file as procedures of ``split`` (see the module docstring).

    ``max_stories`` keeps the first stories of the file only; ``dropped`` (if given) receives the
    count of skipped bad lines under ``"bad line"``.
    """
    check_choice("bad_lines", bad_lines, BAD_LINE_POLICIES)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ROC file not found: {path}")
    problems = ProblemLog()
    procedures: list[Procedure] = []
    skipped = 0
    # surrogateescape keeps every undecodable byte as one character (U+DC80..U+DCFF) on its line, so it is
    # reported where it is instead of being replaced; the lines are those of the decoded text, as before
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    for line_no, line in enumerate(text.splitlines(), start=1):
        if max_stories is not None and len(procedures) >= max_stories:
            break
        if not line.strip():
            continue
        rid = f"{path.stem}-{line_no}"
        bad = next((i for i, ch in enumerate(line) if "\udc80" <= ch <= "\udcff"), None)
        if bad is not None:
            problems.add(path, line_no, rid, f"steps[{line[:bad].count(SEPARATOR)}].text",
                         f"not valid UTF-8 (byte 0x{ord(line[bad]) - 0xdc00:02x} at column {bad + 1}); "
                         "save the file as UTF-8")
            continue
        sentences = [s.strip() for s in line.split(SEPARATOR)]
        reason = None
        if len(sentences) < 2:
            reason = f"a story needs at least 2 sentences separated by ' {SEPARATOR} ', got {len(sentences)}"
        elif any(not s for s in sentences):
            reason = f"sentence {next(i for i, s in enumerate(sentences) if not s)} is empty"
        if reason is not None:
            if bad_lines == "error":
                problems.add(path, line_no, rid, "steps", reason)
            skipped += 1
            continue
        procedures.append(Procedure(id=rid, steps=[Step(text=s) for s in sentences], split=split,
                                    meta={"source": "roc", "file": path.name, "line": line_no},
                                    origin=(str(path), line_no)))
    problems.raise_if_any()
    if skipped:
        log.warning("%s: skipped %d bad line(s) (fewer than 2 sentences or an empty sentence)", path, skipped)
        if dropped is not None:
            dropped["bad line"] += skipped
    return procedures


def _held_out(procedures: list[Procedure], fractions: dict[str, float], seed: int) -> dict[str, list[Procedure]]:
    """Cut disjoint seeded random slices (sizes ``round(fraction * N)``) out of ``procedures``.

    The rest stays in ``train``; every procedure is re-labelled with its split, order within a
    split follows the file.
    """
    n = len(procedures)
    order = np.random.default_rng(seed).permutation(n)
    assigned = np.zeros(n, dtype=np.int64)  # 0 = train
    names = ["train"]
    start = 0
    for name, fraction in fractions.items():
        count = int(round(fraction * n))
        names.append(name)
        assigned[order[start:start + count]] = len(names) - 1
        start += count
    out: dict[str, list[Procedure]] = {name: [] for name in names}
    for proc, which in zip(procedures, assigned.tolist()):
        proc.split = names[which]
        out[names[which]].append(proc)
    return out


def roc_source(train_path: str, val_path: str | None = None, test_path: str | None = None,
               val_fraction: float | None = None, test_fraction: float = 0.1, seed: int = 0,
               max_stories: int | None = None, bad_lines: str = "skip",
               extra_train_paths: Sequence[str] | None = None) -> dict[str, list[Procedure]]:
    """Hydra source: ``{train, val, test: [Procedure]}`` from ROC/SIND tsv files.

    When ``val_path`` / ``test_path`` is not given, that split is a seeded random held-out slice of
    the train file (``val_fraction`` / ``test_fraction`` of its stories; the slices are disjoint
    and removed from train), so ``data.train_path=dev.tsv`` alone gives a usable train/val/test
    split. ``val_fraction=None`` is 0.1 while the test split is cut from the train file too, and 0.2
    when ``test_path`` gives the test stories (the train file's 80/20 split for model selection).
    ``max_stories`` keeps the first stories of each file (before slices are cut).

    ``extra_train_paths``: more files whose stories only ever join ``train`` (e.g. ``train_extra.tsv``),
    read after the held-out slices are cut, so validation and test are the same with or without
    them.

    Nothing held out reaches training, stories compared by :func:`story_key` (any surface form):

    * a training story (of the train file or an extra file) that is a validation or test story is
      left out, counted per file in the log;
    * a story read twice for training (within or across files, or the train file passed again as an
      extra file) is kept once, the copies counted in a log line naming both files;
    * refused (:class:`ProcedureFormatError`, every problem at once): one file given for two of
      ``data.train_path`` / ``val_path`` / ``test_path`` (as ``data=jsonl`` refuses it), a given
      validation or test file sharing a story with the train file, a given test file sharing a story
      with the given validation file (model selection must not see a test story), and one id
      (``NAME-LINE``) for two different stories (files of the same name in two folders), each naming
      both lines.
    """
    if not train_path:
        raise AdapterOptionError("data.train_path: the ROC source needs a train file")
    if val_fraction is None:
        val_fraction = 0.1 if test_path is None else 0.2
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0 <= value < 1:
            raise AdapterOptionError(f"option {name}={value}: must be in [0, 1)")
    carve = {name: fraction for name, fraction, path in (("val", val_fraction, val_path), ("test", test_fraction, test_path))
             if path is None}
    if sum(carve.values()) >= 1:
        raise AdapterOptionError(f"held-out fractions {carve} leave no training stories")
    given = {f"data.{name}_path": path for name, path in (("train", train_path), ("val", val_path), ("test", test_path))
             if path is not None}
    same_file = check_split_files(given)
    if same_file:
        raise ProcedureFormatError(same_file)
    train = read_roc(train_path, "train", bad_lines=bad_lines, max_stories=max_stories)
    splits = _held_out(train, carve, seed) if carve else {"train": train}
    for name, path in (("val", val_path), ("test", test_path)):
        if path is not None:
            splits[name] = read_roc(path, name, bad_lines=bad_lines, max_stories=max_stories)
    extras = [(path, read_roc(path, "train", bad_lines=bad_lines, max_stories=max_stories))
              for path in extra_train_paths or ()]

    given_eval = [p for name in ("val", "test") if name not in carve for p in splits[name]]
    every = [*train, *given_eval, *(p for _, procs in extras for p in procs)]
    keys = {id(p): story_key(p) for p in every}   # id(procedure) -> its story key, computed once
    problems: list[Problem] = []
    first_of_id: dict[str, Procedure] = {}
    for procedure in every:
        first = first_of_id.setdefault(procedure.id, procedure)
        if keys[id(first)] != keys[id(procedure)]:
            problems.append(Problem(*procedure.origin, procedure.id, "id",
                                    f"the same id as {_where(first)}, a different story (a ROC id is its file's name "
                                    "and line: rename one of the files)"))
    in_train_file: dict[str, Procedure] = {}
    for procedure in train:   # the whole train file, held-out slices included
        in_train_file.setdefault(keys[id(procedure)], procedure)
    for procedure in given_eval:
        other = in_train_file.get(keys[id(procedure)])
        if other is not None:
            problems.append(Problem(*procedure.origin, procedure.id, "steps",
                                    f"the same story as {_where(other)} (data.train_path): "
                                    "train and evaluation data must not share stories"))
    if val_path is not None and test_path is not None:   # a slice cut from the train file is checked above
        in_val_file: dict[str, Procedure] = {}
        for procedure in splits["val"]:
            in_val_file.setdefault(keys[id(procedure)], procedure)
        for procedure in splits["test"]:
            other = in_val_file.get(keys[id(procedure)])
            if other is not None:
                problems.append(Problem(*procedure.origin, procedure.id, "steps",
                                        f"the same story as {_where(other)} (data.val_path): "
                                        "validation and test data must not share stories"))
    if problems:
        raise ProcedureFormatError(problems)

    held_out = {keys[id(p)] for name in ("val", "test") for p in splits.get(name, [])}
    kept: list[Procedure] = []
    first_file: dict[str, str] = {}     # story key -> the file its kept copy came from
    left_out: Counter = Counter()        # file -> held-out stories left out of training
    copies: Counter = Counter()          # (file, file of the kept copy) -> copies dropped
    files = [(f"data.train_path={train_path}", splits["train"]),
             *((f"data.extra_train_paths[{i}]={path}", procs) for i, (path, procs) in enumerate(extras))]
    for where, procedures in files:     # a file given twice is two entries: its second reading is all copies
        for procedure in procedures:
            key = keys[id(procedure)]
            if key in held_out:
                left_out[where] += 1
            elif key in first_file:
                copies[where, first_file[key]] += 1
            else:
                first_file[key] = where
                kept.append(procedure)
    splits["train"] = kept
    for where, count in left_out.items():
        log.warning("%s: left out %d training stories that are validation or test stories", where, count)
    for (where, first), count in copies.items():
        log.warning("%s: dropped %d duplicate stories (already read from %s)", where, count, first)
    log.info("ROC splits: %s", {k: len(v) for k, v in splits.items()})
    return splits


def _where(procedure: Procedure) -> str:
    return "{}:{}".format(*procedure.origin)


_NOT_WORD = re.compile(r"[\W_]+")
_DIGIT = re.compile(r"\d")


def story_key(procedure: Procedure) -> str:
    """A story's text in a normalised form: equal keys are the same story, whatever its surface form.

    Unicode-normalised (NFKC) and case-folded, with everything but letters and digits removed (spacing,
    punctuation, apostrophes, sentence breaks) and every digit written 0 (``train_extra.tsv`` writes
    digits as 0): ``Don't stop.`` and ``do n't stop .`` give the same key, ``do stop`` another.
    """
    text = unicodedata.normalize("NFKC", " ".join(step.text for step in procedure.steps)).casefold()
    return _DIGIT.sub("0", _NOT_WORD.sub("", text))


@ADAPTERS.register("roc")
def convert(src: Path, out_images: Path | None = None, split: str | None = None, bad_lines: str = "skip",
            max_stories: int | None = None) -> AdapterResult:
    """Adapter: every ``.tsv`` in ``src`` (or the file ``src``); the split comes from the file name
    (train / dev|val / test) unless ``split`` is given. ``out_images`` is unused (text only)."""
    result = AdapterResult()
    files = iter_files(src, (".tsv",))
    if not files:
        raise FileNotFoundError(f"roc: no .tsv files in {src}")
    problems: list[Problem] = []   # with bad_lines=error: every bad line of every file, reported together
    for path in files:
        name = split or split_from_name(path.stem)
        if name is None:
            raise AdapterOptionError(f"roc: cannot tell the split of {path} from its name; set option split=...")
        skipped_before = result.dropped["bad line"]
        try:
            procedures = read_roc(path, name, bad_lines=bad_lines, max_stories=max_stories, dropped=result.dropped)
        except ProcedureFormatError as err:
            problems += err.problems
            continue
        result.records_read[path.name] += len(procedures) + result.dropped["bad line"] - skipped_before
        for procedure in procedures:
            result.add(procedure)
    if problems:
        raise ProcedureFormatError(problems)
    return result
