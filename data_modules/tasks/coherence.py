"""COHERENCE instances: put each image back into its placeholder of an interleaved text (COHERENCE §3.1).

The paper's construction (§3.1.2): every image of the document is replaced by a placeholder
("Placeholder Substitution"), the images are shuffled into a candidate pool ("Candidate Pool
Construction"), and the original alignment is the answer. App. E adds ``n`` extra candidate images
that belong to no placeholder (``num_distractors``; the paper uses 1, 2, 3). The filtering of §3.1.3
(deduplication, MLLM-scored identifiability and difficulty) is not reproduced.

Built from every procedure whose steps all have a non-empty text and at least one image (the
first image of a step is used):

* ``text``: the step texts in authored order, each followed by its placeholder, one step per
  line: ``"<text of step 1> <image_1>\\n<text of step 2> <image_2>\\n..."``. Placeholder ``i``
  (1-based) *follows* the text of step ``i`` -- the image illustrates the step just described.
* ``candidates``: the ``n`` step images plus ``num_distractors`` images from *other* procedures of
  the input, all shuffled together (so a distractor cannot be spotted by its position).
  Distractors are drawn without replacement from the distinct image paths of the other
  procedures, excluding any path that this procedure also uses.
* ``gold``: ``gold[i]`` is the index in ``candidates`` of the image of placeholder ``i + 1``.
* ``distractors``: the candidate indices that belong to no placeholder (sorted).
* ``difficulty``: ``easy`` / ``medium`` / ``hard`` by the number of images ``n``, from
  ``difficulty_bins`` = three inclusive ``(low, high)`` ranges, ``high=None`` meaning unbounded;
  ``None`` when ``n`` falls in no bin (the paper splits by image count, §3.1.2, but gives no bins:
  the default bins are seqaware's);
* ``title``: the procedure title (the ``{title}`` of the App. D.1 prompt);
* ``source``: the domain (Table 1: WikiHow, StoryBird, Cooking, Science): the ``source`` argument,
  else the procedure's ``meta["source"]``; absent when neither is given.

Randomness comes from a generator seeded by ``(seed, procedure id)``: an instance does not change
when other procedures are added, except through the pool its distractors are drawn from.

An instance is a plain JSON-serialisable dict::

    {"instance_id": "proc-7:coherence", "procedure_id": "proc-7", "split": "test", "title": "Fry onions",
     "text": "Chop the onions. <image_1>\\nFry them. <image_2>", "num_images": 2,
     "candidates": ["images/other_3.jpg", "images/proc-7_1.jpg", "images/proc-7_0.jpg"],
     "gold": [2, 1], "distractors": [0], "difficulty": "easy", "source": "WikiHow"}

The prompt (:func:`seqaware.vlm.prompts.build_coherence_prompt`) shows each ``<image_i>`` as the
paper's ``[IMAGE_PLACEHOLDER]``.
"""
from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np

from seqaware.procedure import Procedure

DIFFICULTY_NAMES = ("easy", "medium", "hard")


def placeholder(i: int) -> str:
    """The placeholder of the ``i``-th image (1-based), e.g. ``<image_3>``."""
    return f"<image_{i}>"


def difficulty_of(num_images: int, bins: Sequence[tuple[int, int | None]]) -> str | None:
    """``easy`` / ``medium`` / ``hard`` for the first inclusive ``(low, high)`` bin holding ``num_images``."""
    if len(bins) != len(DIFFICULTY_NAMES):
        raise ValueError(f"difficulty_bins needs {len(DIFFICULTY_NAMES)} (low, high) ranges, got {len(bins)}")
    for name, (low, high) in zip(DIFFICULTY_NAMES, bins):
        if num_images >= low and (high is None or num_images <= high):
            return name
    return None


def _eligible(procedure: Procedure) -> bool:
    return all(step.text and step.text.strip() and step.images for step in procedure.steps)


def coherence_instances(
    procedures: Sequence[Procedure],
    num_distractors: int = 0,
    seed: int = 0,
    difficulty_bins: Sequence[tuple[int, int | None]] = ((2, 3), (4, 5), (6, None)),
    source: str | None = None,
) -> list[dict[str, Any]]:
    """One COHERENCE instance per eligible procedure (see the module docstring).

    Raises ValueError when a procedure has fewer than ``num_distractors`` distinct images available
    from the other procedures.
    """
    if num_distractors < 0:
        raise ValueError(f"num_distractors must be >= 0, got {num_distractors}")
    pool: list[str] = []          # distinct image paths over all procedures
    pool_index: dict[str, int] = {}
    for proc in procedures:
        for step in proc.steps:
            for path in step.images:
                if path not in pool_index:
                    pool_index[path] = len(pool)
                    pool.append(path)

    instances = []
    for proc in procedures:
        if not _eligible(proc):
            continue
        n = proc.num_steps
        rng = np.random.default_rng([seed, zlib.crc32(proc.id.encode())])
        own = [step.images[0] for step in proc.steps]
        distractors: list[str] = []
        if num_distractors:
            available = np.ones(len(pool), dtype=bool)
            available[[pool_index[p] for step in proc.steps for p in step.images]] = False
            choices = np.flatnonzero(available)
            if len(choices) < num_distractors:
                raise ValueError(
                    f"procedure {proc.id}: {num_distractors} distractors requested, but the other "
                    f"procedures only have {len(choices)} distinct images"
                )
            distractors = [pool[i] for i in rng.choice(choices, size=num_distractors, replace=False)]
        images = own + distractors
        order = [int(i) for i in rng.permutation(len(images))]   # candidates[j] = images[order[j]]
        position = {src: j for j, src in enumerate(order)}
        text = "\n".join(f"{step.text.strip()} {placeholder(i + 1)}" for i, step in enumerate(proc.steps))
        inst = {
            "instance_id": f"{proc.id}:coherence",
            "procedure_id": proc.id,
            "split": proc.split,
            "title": proc.title,
            "text": text,
            "num_images": n,
            "candidates": [images[src] for src in order],
            "gold": [position[i] for i in range(n)],
            "distractors": sorted(position[i] for i in range(n, len(images))),
            "difficulty": difficulty_of(n, difficulty_bins),
        }
        domain = source if source is not None else (proc.meta or {}).get("source")
        if domain is not None:
            inst["source"] = str(domain)
        instances.append(inst)
    return instances
