"""English Recipe Flow Graph corpus (Yamakata et al., LREC 2020) -> procedures with a step DAG.

Input: a folder of ``NAME.list`` + ``NAME.flow`` pairs (or one ``.list`` file with its ``.flow``
beside it). Formats (see ``../shared/data/README.md``):

* ``.list``: one token per line, ``STEP SENT CHAR_OFFSET TOKEN POS NER_TAG``; sentence numbers
  restart in every step, so a sentence is the pair ``(STEP, SENT)``;
* ``.flow``: one token-level edge per line, ``SRC_STEP SRC_SENT SRC_OFF LABEL TGT_STEP TGT_SENT TGT_OFF``
  (the target uses the source's outcome).

Lines starting with ``#`` are annotator comments (some not valid UTF-8) and are skipped; files are
read as bytes and decoded as UTF-8 with replacement.

Conversion:

* one procedure per recipe, id = file stem, category ``["recipe"]``, title from the stem;
* ``unit: sentence`` (default): one step per sentence; ``unit: step``: one step per corpus STEP
  (its sentences joined); step text = the unit's tokens joined by single spaces;
* the step-level DAG keeps one edge ``u -> v`` per pair of different units joined by a flow edge
  whose source is in ``u`` and target in ``v`` (duplicates merged). An edge whose target unit
  comes *before* its source unit in the text is a *backward edge*: it is dropped, counted in
  ``dropped["backward edge"]`` (distinct unit pairs) and kept in ``meta["backward_edges"]``.
  Every kept edge points forward, so the DAG is acyclic (asserted);
* ``split: test`` (default; r-100 is an evaluation set, as in CaT-Bench) puts every recipe in
  one split named by the option; ``split: random`` assigns train/val/test with
  :func:`data_modules.tasks.teo.stratified_split` (``fractions``, ``seed``; stratified by steps).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from data_modules.adapters.common import (
    AdapterOptionError,
    AdapterResult,
    ProblemLog,
    check_choice,
    check_procedure,
    iter_files,
)
from data_modules.adapters.registry import ADAPTERS
from data_modules.tasks.teo import stratified_split
from seqaware import dag as dag_utils
from seqaware.procedure import SPLIT_PATTERN, Procedure, Step

UNITS = ("sentence", "step")


def _lines(path: Path) -> list[tuple[int, list[str]]]:
    """Non-comment, non-blank lines of ``path`` as ``(line number, fields)``; bytes decoded leniently."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    out = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        out.append((line_no, stripped.split()))
    return out


def _title(stem: str) -> str:
    return re.sub(r"_recipe__.*$", "", stem).replace("_", " ").strip()


def read_recipe(list_path: Path, unit: str, log: ProblemLog) -> tuple[Procedure, int] | None:
    """One recipe as a procedure plus its number of distinct backward unit edges (None on problems)."""
    rid = list_path.stem
    flow_path = list_path.with_suffix(".flow")
    problems_before = len(log)
    units: dict[tuple[int, ...], int] = {}      # unit key -> step index, in text order
    tokens: list[list[str]] = []
    sentences: set[tuple[int, int]] = set()
    for line_no, fields in _lines(list_path):
        if len(fields) < 4:
            log.add(list_path, line_no, rid, "list", f"expected 'STEP SENT CHAR_OFFSET TOKEN POS NER_TAG', got {len(fields)} field(s)")
            continue
        try:
            step, sent = int(fields[0]), int(fields[1])
            int(fields[2])
        except ValueError:
            log.add(list_path, line_no, rid, "list", f"STEP, SENT and CHAR_OFFSET must be integers, got {fields[:3]}")
            continue
        key = (step, sent) if unit == "sentence" else (step,)
        sentences.add((step, sent))
        if key not in units:
            units[key] = len(units)
            tokens.append([])
        elif units[key] != len(units) - 1:
            log.add(list_path, line_no, rid, "list", f"tokens of {unit} {key} are not contiguous")
            continue
        tokens[units[key]].append(fields[3])
    if not flow_path.is_file():
        log.add(list_path, 0, rid, "flow", f"missing flow file {flow_path}")
        return None
    edges: set[tuple[int, int]] = set()
    backward: set[tuple[int, int]] = set()
    num_flow = 0
    for line_no, fields in _lines(flow_path):
        if len(fields) != 7:
            log.add(flow_path, line_no, rid, "flow", f"expected 'SRC_STEP SRC_SENT SRC_OFF LABEL TGT_STEP TGT_SENT TGT_OFF', got {len(fields)} field(s)")
            continue
        try:
            src = (int(fields[0]), int(fields[1]))
            tgt = (int(fields[4]), int(fields[5]))
        except ValueError:
            log.add(flow_path, line_no, rid, "flow", f"step and sentence numbers must be integers, got {fields}")
            continue
        unknown = [f"{s}/{t}" for s, t in (src, tgt) if (s, t) not in sentences]
        if unknown:
            log.add(flow_path, line_no, rid, "flow", f"edge refers to sentence(s) {unknown} (STEP/SENT) not in {list_path.name}")
            continue
        num_flow += 1
        u = units[src if unit == "sentence" else src[:1]]
        v = units[tgt if unit == "sentence" else tgt[:1]]
        if u == v:
            continue
        (edges if u < v else backward).add((u, v))
    if len(log) > problems_before:
        return None
    dag = sorted(edges)
    assert dag_utils.is_acyclic(len(units), dag), f"{rid}: forward-only edges cannot form a cycle"
    procedure = Procedure(
        id=rid,
        steps=[Step(text=" ".join(t)) for t in tokens],
        split="test",
        title=_title(rid),
        category=["recipe"],
        dag=dag,
        meta={"source": "rfg", "unit": unit, "num_flow_edges": num_flow,
              "backward_edges": [list(e) for e in sorted(backward)]},
    )
    return procedure, len(backward)


@ADAPTERS.register("rfg")
def convert(src: Path, out_images: Path | None = None, unit: str = "sentence", split: str = "test",
            fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0) -> AdapterResult:
    """Convert a folder of r-FG ``.list``/``.flow`` pairs (see the module docstring).

    ``out_images`` is accepted for a uniform adapter signature; the corpus has no images.
    """
    check_choice("unit", unit, UNITS)
    if split != "random" and not SPLIT_PATTERN.match(str(split)):
        raise AdapterOptionError(f"option split={split!r}: expected 'random' or a split name (train, val, test, test-<suffix>)")
    log = ProblemLog()
    result = AdapterResult()
    procedures: list[Procedure] = []
    files = iter_files(Path(src), (".list",))
    if not files:
        raise FileNotFoundError(f"rfg: no .list files in {src}")
    for list_path in files:
        result.records_read["recipes"] += 1
        read = read_recipe(list_path, unit, log)
        if read is None:
            continue
        procedure, num_backward = read
        result.dropped["backward edge"] += num_backward
        if len(procedure.steps) < 2:
            result.dropped["too few steps"] += 1
            continue
        if check_procedure(procedure, list_path, 1, log):
            procedures.append(procedure)
    log.raise_if_any()
    if split == "random":
        for name, procs in stratified_split(procedures, fractions=fractions, seed=seed).items():
            result.splits[name] = procs
    else:
        for procedure in procedures:
            procedure.split = split
            result.add(procedure)
    return result

