"""CaT-Bench (Lal et al., EMNLP 2024) questions -> plans as procedures + TEO-style yes/no pairs.

Input: a JSON-lines file (or a folder of them), one question per line with ``plan_idx, title,
question_idx, question_type, direction, binary_question, steps, first_step_idx, second_step_idx,
label, efg_recipe_id`` (see ``../shared/data/README.md``).

Output:

* one procedure per ``plan_idx`` (id ``catbench-<plan_idx>``), steps = ``steps`` (text only, no
  DAG: the gold answers cannot be recomputed from a transitive closure), category ``["recipe"]``,
  ``meta.efg_recipe_id``; every question of a plan must carry the same steps;
* ``tasks["catbench"]``: one pair per question, TEO-style (``a``/``b`` = first/second step index,
  ``step_a``/``step_b`` payloads) with the gold ``label`` (yes/no) kept as is, plus
  ``question_type``, ``direction``, ``question`` and the ids.

All records go to split ``split`` (default ``test``: CaT-Bench is an evaluation set).

:func:`read_catbench` reads the same question files as pair items for the TEO heads' test set and
``scripts/tools/catbench_eval.py``: CaT-Bench is parsed here only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from data_modules.adapters.common import (
    AdapterResult,
    ProblemLog,
    check_procedure,
    check_split,
    iter_files,
    iter_json_records,
)
from data_modules.adapters.registry import ADAPTERS
from seqaware.procedure import Procedure, Step

LABELS = ("yes", "no")
DIRECTIONS = ("before", "after")
REQUIRED = ("plan_idx", "question_idx", "question_type", "direction", "steps", "first_step_idx",
            "second_step_idx", "label")
PAIR_FIELDS = ("steps", "first_step_idx", "second_step_idx", "direction", "label")
"""The fields :func:`read_catbench` needs (a question file without CaT-Bench's ids still reads)."""


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def question_id(record: dict) -> str:
    """A question's id, ``<plan_idx>-<question_type>-<question_idx>``.

    CaT-Bench numbers questions per plan and gives one number to the (up to) four questions about a
    step pair (dependent / non-dependent x before / after: e.g. the 1,404 sample questions carry 478
    distinct ``(plan_idx, question_idx)``), so the number alone is not an id.  Without a
    ``question_type`` the direction and the two step indices stand in for it.
    """
    kind = record.get("question_type") or \
        f"{str(record['direction']).strip().lower()}-{record['first_step_idx']}-{record['second_step_idx']}"
    return f"{record.get('plan_idx', '?')}-{kind}-{record.get('question_idx', '?')}"


def check_unique(record: dict, seen: dict[str, tuple[Path, int]], log: ProblemLog, path: Path, line: int) -> bool:
    """Log a question whose :func:`question_id` was seen before (``seen``: id -> first file and line)."""
    qid = question_id(record)
    if qid in seen:
        first_path, first_line = seen[qid]
        log.add(path, line, f"plan {record.get('plan_idx', '?')} question {record.get('question_idx', '?')}",
                "question_idx", f"question {qid} (plan, type, number) repeats {first_path}:{first_line}")
        return False
    seen[qid] = (path, line)
    return True


def check_question(record: Any, log: ProblemLog, path: Path, line: int, required: tuple[str, ...] = REQUIRED) -> bool:
    """Log every problem of one question record (``file:line: plan P question Q: field: reason``);
    True when it is usable. Shared by :func:`convert` and :func:`read_catbench`."""
    if not isinstance(record, dict):
        log.add(path, line, "?", "record", f"expected a JSON object, got {type(record).__name__}")
        return False
    rid = f"plan {record.get('plan_idx', '?')} question {record.get('question_idx', '?')}"
    before = len(log)
    for name in required:
        if record.get(name) is None:
            log.add(path, line, rid, name, "missing field")
    if len(log) > before:
        return False
    steps = record["steps"]
    if not isinstance(steps, list) or not all(isinstance(s, str) and s.strip() for s in steps):
        got = f"a {type(steps).__name__}" if not isinstance(steps, list) else "a list with a non-string or empty step"
        log.add(path, line, rid, "steps", f"must be a list of non-empty step strings, got {got}")
        return False
    for name in ("first_step_idx", "second_step_idx"):
        value = record[name]
        if not _is_index(value) or not 0 <= value < len(steps):
            log.add(path, line, rid, name, f"{value!r} is not a step index of the {len(steps)} steps (an integer 0..{len(steps) - 1})")
    if record["first_step_idx"] == record["second_step_idx"]:
        log.add(path, line, rid, "second_step_idx", "equals first_step_idx")
    if not isinstance(record["label"], str) or record["label"].strip().lower() not in LABELS:
        log.add(path, line, rid, "label", f"{record['label']!r} is not one of {list(LABELS)}")
    if not isinstance(record["direction"], str) or record["direction"].strip().lower() not in DIRECTIONS:
        log.add(path, line, rid, "direction", f"{record['direction']!r} is not one of {list(DIRECTIONS)}")
    if "plan_idx" in required and not _is_index(record["plan_idx"]):
        log.add(path, line, rid, "plan_idx", f"{record['plan_idx']!r} is not an integer")
    return len(log) == before


@ADAPTERS.register("catbench")
def convert(src: Path, out_images: Path | None = None, split: str = "test") -> AdapterResult:
    """Convert CaT-Bench questions (see the module docstring); ``out_images`` is unused (text only)."""
    check_split(split)
    log = ProblemLog()
    result = AdapterResult()
    plans: dict[int, tuple[Procedure, Path, int]] = {}
    pairs: list[dict[str, Any]] = []
    seen: dict[str, tuple[Path, int]] = {}
    for path in iter_files(src, (".jsonl", ".json")):
        for line, record in iter_json_records(path, log):
            result.records_read["questions"] += 1
            if not check_question(record, log, path, line) or not check_unique(record, seen, log, path, line):
                continue
            plan_idx, steps = record["plan_idx"], record["steps"]
            pid = f"catbench-{plan_idx}"
            rid = f"plan {plan_idx} question {record['question_idx']}"
            if plan_idx not in plans:
                procedure = Procedure(
                    id=pid, steps=[Step(text=s) for s in steps], split=split, title=str(record.get("title") or ""),
                    category=["recipe"],
                    meta={"source": "catbench", "plan_idx": plan_idx, "efg_recipe_id": record.get("efg_recipe_id")},
                )
                if not check_procedure(procedure, path, line, log):
                    continue
                plans[plan_idx] = (procedure, path, line)
            procedure, first_path, first_line = plans[plan_idx]
            if [s.text for s in procedure.steps] != steps:
                log.add(path, line, rid, "steps", f"differ from the steps of plan {plan_idx} first seen at {first_path}:{first_line}")
                continue
            a, b = record["first_step_idx"], record["second_step_idx"]
            pairs.append({
                "pair_id": f"catbench-{question_id(record)}",
                "procedure_id": pid,
                "split": split,
                "num_steps": len(steps),
                "a": a,
                "b": b,
                "label": record["label"].strip().lower(),
                "question_type": record["question_type"],
                "direction": record["direction"].strip().lower(),
                "question": record.get("binary_question"),
                "step_a": {"text": steps[a], "images": []},
                "step_b": {"text": steps[b], "images": []},
                "category": ["recipe"],
                "plan_idx": plan_idx,
                "question_idx": record["question_idx"],
                "efg_recipe_id": record.get("efg_recipe_id"),
            })
    log.raise_if_any()
    for procedure, _, _ in sorted(plans.values(), key=lambda t: t[0].meta["plan_idx"]):
        result.add(procedure)
    result.tasks["catbench"] = pairs
    return result


def read_catbench(path: str | Path, key: str = "data.eval_path") -> list[dict[str, Any]]:
    """CaT-Bench questions as pair items, for the TEO heads (``data.eval_path`` of
    :mod:`data_modules.teo_encoder_pairs` and :mod:`data_modules.teo_plans`) and ``scripts/tools/catbench_eval.py``.

    Each item keeps the presented pair (``text_a`` / ``text_b``: a question about (first, second)
    with direction ``before`` is presented as (first, second), with ``after`` as (second, first)), the gold
    ``answer``, ``direction``, and the whole plan (``steps``, 0-based ``first`` / ``second`` step
    indices, ``plan_idx``, ``title``) for plan-aware models (:mod:`data_modules.teo_plans`).

    Every line is checked as :func:`convert` checks it (:func:`check_question`: a JSON object, UTF-8,
    ``steps`` a list of strings, integer step indices inside it, yes/no label, before/after
    direction; only :data:`PAIR_FIELDS` are required, and a file without ``question_idx`` numbers
    its questions by line); all problems are raised together as ``file:line: plan P question Q:
    field: reason``.  ``key`` is the config key named when the file is missing or holds no questions
    (``data.train_path`` for a training file).  Items keep their ``line``.
    """
    items = []
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{key}: no such file: {path}")
    log = ProblemLog()
    seen: dict[str, tuple[Path, int]] = {}
    for line_no, q in iter_json_records(path, log):
        if not check_question(q, log, path, line_no, required=PAIR_FIELDS):
            continue
        if "question_idx" not in q:  # files without CaT-Bench's numbering: the line stands in for it
            q = dict(q, question_idx=f"L{line_no}")
        if not check_unique(q, seen, log, path, line_no):
            continue
        qid = question_id(q)
        direction, label = q["direction"].strip().lower(), q["label"].strip().lower()
        first, second = q["first_step_idx"], q["second_step_idx"]
        a, b = (first, second) if direction == "before" else (second, first)
        items.append({"pair_id": qid, "text_a": q["steps"][a], "text_b": q["steps"][b], "direction": direction,
                      "answer": label, "plan": q.get("efg_recipe_id"), "question_type": q.get("question_type"),
                      "steps": list(q["steps"]), "first": first, "second": second, "plan_idx": q.get("plan_idx"),
                      "title": q.get("title"), "line": line_no})
    log.raise_if_any()
    if not items:
        raise ValueError(f"{key}={path}: the file holds no CaT-Bench questions")
    return items
