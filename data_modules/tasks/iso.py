"""ISO-Bench style instances: is an image step a dependency of a text snippet?

An instance shows a *snippet* (the texts of the first or last ``k`` steps of a procedure) and the
image of one other step, and asks whether that step must happen before (task ``before``) or after
(task ``after``) the snippet. Labels are ``DEP`` (yes) and ``NONDEP`` (no).

Construction for each ``k`` in ``ks`` with ``num_steps > k`` (the ISO-Bench default, by position):

* task ``before``: snippet = the last ``k`` steps. Positives = the steps in the window of
  ``max_candidates`` steps just before the snippet; negatives = steps inside the snippet.
* task ``after``: snippet = the first ``k`` steps. Positives = the steps in the window of
  ``max_candidates`` steps just after the snippet; negatives = steps inside the snippet.

With ``label_by="dag"`` (procedures with a DAG only) the labels come from reachability instead;
the candidates are every step outside the snippet:

* task ``before``: a candidate is ``DEP`` iff some snippet step is reachable from it (it must
  happen before the snippet), else ``NONDEP``;
* task ``after``: a candidate is ``DEP`` iff it is reachable from some snippet step (it must
  happen after the snippet), else ``NONDEP``.

In both modes:

* only steps with an image can be candidates (their first image is shown); the position window is
  not widened to replace image-less steps;
* positives are capped at ``max_candidates`` (``None``: no cap), keeping the ones closest to the
  snippet;
* classes are balanced: ``m = min(#positives, #negatives)``; the ``m`` positives closest to the
  snippet are kept and ``m`` negatives are sampled without replacement by a generator seeded by
  ``(seed, procedure id, task, k)``, so the result does not depend on the other procedures. A
  task/``k`` with no positive or no negative gives no instances.

An instance is a plain JSON-serialisable dict::

    {"instance_id": "proc-7:before-k2:s3", "procedure_id": "proc-7", "split": "test",
     "task": "before", "k": 2, "snippet_steps": [4, 5], "snippet": ["...", "..."],
     "candidate_step": 3, "image": "images/proc-7_3.jpg", "label": "DEP",
     "question": "Must the step shown in the image happen before the steps described?"}
"""
from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np

from seqaware import dag as dag_utils
from seqaware.procedure import Procedure

ISO_LABELS = ("DEP", "NONDEP")
ISO_QUESTIONS = {
    "before": "Must the step shown in the image happen before the steps described?",
    "after": "Must the step shown in the image happen after the steps described?",
}


def _candidate_sets(
    procedure: Procedure, task: str, snippet: list[int], max_candidates: int | None, label_by: str, reach
) -> tuple[list[int], list[int]]:
    """Positive and negative candidate steps (image steps only); positives closest first."""
    n = procedure.num_steps
    has_image = [bool(step.images) for step in procedure.steps]
    inside = set(snippet)
    if label_by == "position":
        window = max_candidates if max_candidates is not None else n
        if task == "before":
            start = snippet[0]
            positives = [i for i in range(start - 1, max(start - window, 0) - 1, -1)]
        else:
            end = snippet[-1]
            positives = [i for i in range(end + 1, min(end + window, n - 1) + 1)]
        negatives = list(snippet)
    else:
        outside = [i for i in range(n) if i not in inside]
        if task == "before":
            dep = {i for i in outside if reach[i, snippet].any()}
        else:
            dep = {i for i in outside if reach[snippet, i].any()}
        anchor = snippet[0] if task == "before" else snippet[-1]
        positives = sorted(dep, key=lambda i: (abs(i - anchor), i))
        negatives = [i for i in outside if i not in dep]
    positives = [i for i in positives if has_image[i]]
    if max_candidates is not None:
        positives = positives[:max_candidates]
    negatives = [i for i in negatives if has_image[i]]
    return positives, negatives


def iso_instances(
    procedure: Procedure,
    ks: Sequence[int] = (2, 3, 4),
    max_candidates: int | None = 3,
    label_by: str = "position",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """ISO instances of one procedure (see the module docstring for the exact construction).

    Instances are ordered by ``k``, then task (before, after), then label (DEP first), then
    candidate step.
    """
    if label_by not in ("position", "dag"):
        raise ValueError(f"label_by must be 'position' or 'dag', got {label_by!r}")
    n = procedure.num_steps
    reach = None
    if label_by == "dag":
        if procedure.dag is None:
            raise ValueError(f"procedure {procedure.id}: label_by='dag' needs a DAG, but the procedure has none")
        reach = np.asarray(dag_utils.transitive_closure(n, [tuple(e) for e in procedure.dag]), dtype=bool)
    instances: list[dict[str, Any]] = []
    for k in ks:
        if not 0 < k < n:
            continue
        for task in ("before", "after"):
            snippet = list(range(n - k, n)) if task == "before" else list(range(k))
            positives, negatives = _candidate_sets(procedure, task, snippet, max_candidates, label_by, reach)
            m = min(len(positives), len(negatives))
            if m == 0:
                continue
            key = zlib.crc32(f"{procedure.id}|{task}|{k}".encode())
            rng = np.random.default_rng([seed, key])
            picked = sorted(negatives[i] for i in rng.choice(len(negatives), size=m, replace=False))
            for label, steps in (("DEP", sorted(positives[:m])), ("NONDEP", picked)):
                for step in steps:
                    instances.append({
                        "instance_id": f"{procedure.id}:{task}-k{k}:s{step}",
                        "procedure_id": procedure.id,
                        "split": procedure.split,
                        "task": task,
                        "k": k,
                        "snippet_steps": list(snippet),
                        "snippet": [procedure.steps[i].text or "" for i in snippet],
                        "candidate_step": step,
                        "image": procedure.steps[step].images[0],
                        "label": label,
                        "question": ISO_QUESTIONS[task],
                    })
    return instances
