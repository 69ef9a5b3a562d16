"""ISO-Bench instances: is an image step a dependency of a text snippet? (ISO-Bench §3, App. B)

An instance shows the plan's goal, a *snippet* (the texts of the first or last ``k`` steps of a
procedure) and the image of one other step, and asks whether that step must come before the first
(task ``before``) or after the last (task ``after``) step of the snippet. Labels are ``DEP`` (yes)
and ``NONDEP`` (no).

Construction, paper-exact by default (ISO-Bench App. B, "Processing YouCook2"; App. C applies the
same procedure to CrossTask):

* only procedures with at least ``min_steps`` steps (App. B: "We filter for videos with at least 5
  steps");
* one snippet length per procedure: ``k`` drawn uniformly from ``ks`` (App. B: "For each such video
  it randomly picked an integer k between 2 and 4"); ``k_per_plan="all"`` (seqaware extension)
  uses every ``k`` in ``ks`` instead;
* task ``before``: snippet = the last ``k`` steps; positive pool = the ``max_candidates`` (3) steps
  just before it ("recipe positions total-k-3 ... total-k-1"); negative pool = the steps inside
  the snippet;
* task ``after``: snippet = the first ``k`` steps; positive pool = the 3 steps just after it
  ("k ... k+2"); negative pool = the steps inside the snippet.

Both tasks are built for every procedure (the paper does not say whether a video gets one task or
both; its Table 2 has 372 before and 392 after instances from 480 videos).

With ``label_by="dag"`` (seqaware extension, procedures with a DAG only) the labels come from
reachability instead; the candidates are every step outside the snippet:

* task ``before``: a candidate is ``DEP`` iff some snippet step is reachable from it (it must
  happen before the snippet), else ``NONDEP``;
* task ``after``: a candidate is ``DEP`` iff it is reachable from some snippet step (it must
  happen after the snippet), else ``NONDEP``.

In both modes (the paper's pools were then vetted by annotators, App. B; these rules are seqaware's):

* only steps with an image can be candidates (their first image is shown); the position window is
  not widened to replace image-less steps;
* positives are capped at ``max_candidates`` (``None``: no cap), keeping the ones closest to the
  snippet;
* classes are balanced (ISO-Bench is "roughly evenly split between the two types", §3):
  ``m = min(#positives, #negatives)``; the ``m`` positives closest to the snippet are kept and
  ``m`` negatives are sampled without replacement by a generator seeded by ``(seed, procedure id,
  task, k)``, so the result does not depend on the other procedures. A task with no positive or
  no negative gives no instances.

``k`` is drawn by a generator seeded by ``(seed, procedure id)``. An instance is a plain
JSON-serialisable dict::

    {"instance_id": "proc-7:before-k2:s3", "procedure_id": "proc-7", "split": "test",
     "goal": "Make chicken parmesan", "task": "before", "k": 2, "snippet_steps": [4, 5],
     "snippet": ["...", "..."], "candidate_step": 3, "image": "images/proc-7_3.jpg", "label": "DEP",
     "question": "Does this image show a step that must come before the first step in the plan?"}

``question`` is the paper's question for the task (App. H), read from ``configs/prompts/iso.yaml``.
"""
from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np

from seqaware import dag as dag_utils
from seqaware.procedure import Procedure
from seqaware.vlm.prompts import load_templates

ISO_LABELS = ("DEP", "NONDEP")
K_PER_PLAN = ("one", "all")


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
    min_steps: int = 5,
    k_per_plan: str = "one",
) -> list[dict[str, Any]]:
    """ISO instances of one procedure (see the module docstring for the exact construction).

    Defaults follow ISO-Bench App. B: plans of >= 5 steps, one ``k`` in {2, 3, 4} per plan, a
    positive window of 3 steps, labels by position. Instances are ordered by ``k``, then task
    (before, after), then label (DEP first), then candidate step.
    """
    if label_by not in ("position", "dag"):
        raise ValueError(f"label_by must be 'position' or 'dag', got {label_by!r}")
    if k_per_plan not in K_PER_PLAN:
        raise ValueError(f"k_per_plan must be one of {', '.join(K_PER_PLAN)}, got {k_per_plan!r}")
    if not ks or not all(isinstance(k, (int, np.integer)) and k > 0 for k in ks):
        raise ValueError(f"ks must be a non-empty list of positive snippet lengths, got {list(ks)}")
    n = procedure.num_steps
    if n < min_steps:
        return []
    usable = [int(k) for k in ks if k < n]
    if not usable:
        return []
    if k_per_plan == "one":
        draw = np.random.default_rng([seed, zlib.crc32(procedure.id.encode())]).integers(len(usable))
        usable = [usable[int(draw)]]
    reach = None
    if label_by == "dag":
        if procedure.dag is None:
            raise ValueError(f"procedure {procedure.id}: label_by='dag' needs a DAG, but the procedure has none")
        reach = np.asarray(dag_utils.transitive_closure(n, [tuple(e) for e in procedure.dag]), dtype=bool)
    questions = load_templates("iso")["question"]
    instances: list[dict[str, Any]] = []
    for k in usable:
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
                        "goal": procedure.title,
                        "task": task,
                        "k": k,
                        "snippet_steps": list(snippet),
                        "snippet": [procedure.steps[i].text or "" for i in snippet],
                        "candidate_step": step,
                        "image": procedure.steps[step].images[0],
                        "label": label,
                        "question": questions[task],
                    })
    return instances
