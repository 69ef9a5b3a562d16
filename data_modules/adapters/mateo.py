"""MATEO (Hugging Face dataset; JSON / JSONL export or parquet) -> procedures with a step DAG.

One recipe per row::

    {"id": ..., "title_eng": ..., "title_it": ..., "split"?: ...,
     "graph": {"<step id>": [out-node ids]},          # optional if steps carry out_nodes
     "steps": [{"id": 1, "image": ..., "out_nodes": [2, 3], "text_eng": ..., "text_it": ...}]}

* the split comes from a ``split`` field, else from the file name (``train`` / ``validation`` ->
  ``val`` / ``test``); parquet needs ``pyarrow`` (a clear error otherwise);
* ``language: en | it`` picks ``text_eng`` / ``title_eng`` or ``text_it`` / ``title_it``;
* steps keep the listed (authored) order; the DAG edge ``i -> j`` joins the 0-based positions of
  step id ``s`` and each of its out-node ids (from ``graph`` when present, else from the steps'
  ``out_nodes``); an unknown step id or a cycle is reported with the field that holds it;
* ``image`` may be a path (relative to the export file's folder, or absolute), a URL or embedded
  bytes (``{"bytes": ...}`` as raw bytes, base64 text or a list of ints). Embedded bytes are
  written under ``out_images``; a URL is used only if ``url_root/<URL path>`` exists locally
  (no downloads); everything unreadable follows ``unreadable_image`` (error | skip the recipe).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from data_modules.adapters.common import (
    IMAGE_POLICIES,
    AdapterResult,
    ImageStore,
    ProblemLog,
    check_choice,
    check_procedure,
    image_source,
    iter_files,
    iter_json_records,
    split_from_name,
    store_images,
)
from data_modules.adapters.registry import ADAPTERS
from seqaware import dag as dag_utils
from seqaware.procedure import SPLIT_PATTERN, Procedure, Step

LANGUAGES = {"en": "eng", "it": "it"}


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"mateo: reading {path} needs pyarrow (pip install pyarrow), or export the dataset as JSON lines") from None
    return pq.read_table(path).to_pylist()


@ADAPTERS.register("mateo")
def convert(src: Path, out_images: Path | None = None, language: str = "en", unreadable_image: str = "error",
            url_root: str | None = None) -> AdapterResult:
    """Convert a MATEO export (see the module docstring)."""
    check_choice("language", language, tuple(LANGUAGES))
    check_choice("unreadable_image", unreadable_image, IMAGE_POLICIES)
    suffix = LANGUAGES[language]
    log = ProblemLog()
    result = AdapterResult()
    store = ImageStore(out_images)
    files = iter_files(src, (".json", ".jsonl", ".parquet"))
    if not files:
        raise FileNotFoundError(f"mateo: no .json, .jsonl or .parquet files in {src}")
    for path in files:
        if path.suffix == ".parquet":
            rows = list(enumerate(_read_parquet(path), start=1))
        else:
            rows = list(iter_json_records(path, log))
        for line, record in rows:
            _convert_row(record, path, line, suffix, store, unreadable_image,
                         None if url_root is None else Path(url_root), log, result)
    log.raise_if_any()
    return result


def _convert_row(record: Any, path: Path, line: int, suffix: str, store: ImageStore, policy: str,
                 url_root: Path | None, log: ProblemLog, result: AdapterResult) -> None:
    if not isinstance(record, dict):
        log.add(path, line, "?", "record", f"expected a JSON object, got {type(record).__name__}")
        return
    split = record.get("split")
    split = "val" if split == "validation" else split
    if split is None:
        split = split_from_name(path.stem)
    result.records_read[str(split)] += 1
    rid = record.get("id")
    if rid is None:
        log.add(path, line, "?", "id", "missing field")
        return
    rid = str(rid)
    if split is None or not SPLIT_PATTERN.match(split):
        log.add(path, line, rid, "split", f"no split field and no split in the file name {path.name}" if split is None
                else f"unknown split {split!r}")
        return
    steps = record.get("steps")
    if not isinstance(steps, list) or not steps:
        log.add(path, line, rid, "steps", "missing field" if steps is None else "must be a non-empty list of steps")
        return
    position: dict[str, int] = {}
    before = len(log)
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or step.get("id") is None:
            log.add(path, line, rid, f"steps[{i}].id", "missing field")
            continue
        key = str(step["id"])
        if key in position:
            log.add(path, line, rid, f"steps[{i}].id", f"duplicate step id {key}")
        position[key] = i
        text = step.get(f"text_{suffix}")
        if text is not None and not isinstance(text, str):
            log.add(path, line, rid, f"steps[{i}].text_{suffix}", "must be a string")
    if len(log) > before:
        return
    graph = record.get("graph")
    if graph is not None and not isinstance(graph, dict):
        log.add(path, line, rid, "graph", "must map step ids to lists of out-node ids")
        return
    out_nodes = graph if graph is not None else {str(s["id"]): s.get("out_nodes") or [] for s in steps}
    where = "graph" if graph is not None else "steps[].out_nodes"
    edges: set[tuple[int, int]] = set()
    for node, outs in out_nodes.items():
        if str(node) not in position:
            log.add(path, line, rid, f"{where}[{node!r}]", f"unknown step id {node!r}")
            continue
        if outs is not None and not isinstance(outs, list):
            log.add(path, line, rid, f"{where}[{node!r}]", "must be a list of out-node ids")
            continue
        for out in outs or []:
            if str(out) not in position:
                log.add(path, line, rid, f"{where}[{node!r}]", f"out-node {out!r} is not a step id of this recipe")
                continue
            edges.add((position[str(node)], position[str(out)]))
    if len(log) > before:
        return
    cycle = dag_utils.find_cycle(len(steps), sorted(edges))
    if cycle is not None:
        ids = [str(steps[i]["id"]) for i in cycle + cycle[:1]]
        log.add(path, line, rid, where, f"the step graph has a cycle: {' -> '.join(ids)} (step ids)")
        return
    base = path.parent
    sources = [image_source(step.get("image"), base, url_root) for step in steps]
    fields = [f"steps[{i}].image" for i in range(len(steps))]
    images = store_images(store, sources, rid, policy, log, (path, line), fields, result.dropped)
    if images is None:
        return
    procedure = Procedure(
        id=rid, steps=[Step(text=step.get(f"text_{suffix}"), images=im) for step, im in zip(steps, images)],
        split=split, title=str(record.get(f"title_{suffix}") or ""), category=["recipe"], dag=sorted(edges),
        meta={"source": "mateo", "step_ids": [step["id"] for step in steps]}, root=store.root,
    )
    if check_procedure(procedure, path, line, log):
        result.add(procedure)
