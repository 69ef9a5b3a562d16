"""Evaluate an image-text-to-text model on TEO, ISO and COHERENCE by prompting; batched and resumable.

The pieces, each usable on its own:

* a *generator*: any callable ``generate(messages_batch) -> list[str]`` (one reply per chat).
  :class:`HFGenerator` wraps a Hugging Face ``AutoModelForImageTextToText`` + ``AutoProcessor``
  (chat template, left padding, greedy decoding); tests inject a scripted fake;
* :class:`OutputCache`: raw replies stored as JSON lines keyed by ``(item id, set, prompt hash)``.
  Each batch is appended in one write followed by flush + fsync, so a crash loses at most the
  batch in flight; a torn last line left by a crash is dropped on the next open. Rerunning skips
  every cached key, so an interrupted evaluation resumes where it stopped;
* ``evaluate_teo`` / ``evaluate_iso`` / ``evaluate_coherence``: build prompts
  (:mod:`seqaware.teo.prompts`), collect replies, parse them (:mod:`seqaware.teo.parser`) and
  score them with the existing metrics (:mod:`seqaware.metrics`), baselines first;
* ``write_result``: a result as markdown table + JSON + PNG bar chart, written atomically.

The prompt hash covers the chat messages *and* a generation signature (model name and decoding
settings), so changing the model, a template or ``max_new_tokens`` never reuses stale replies.
This module never imports ``data_modules``: the caller builds pairs/instances (``scripts/eval_teo.py``).
"""
from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from seqaware.io import atomic_open
from seqaware.metrics.coherence import COHERENCE_COLUMNS, coherence_rows, coherence_source_table, coherence_table
from seqaware.metrics.iso import ISO_COLUMNS, iso_report, iso_rows, iso_table
from seqaware.metrics.teo import TEO_COLUMNS, teo_rows, teo_table
from seqaware.teo.parser import parse_coherence_answer, parse_iso_answer, parse_teo_answers, reflection_outcome
from seqaware.teo.prompts import build_coherence_prompt, build_iso_prompt, build_teo_prompt, iso_max_new_tokens, prompt_hash

log = logging.getLogger(__name__)

Messages = list[dict[str, Any]]
GenerateFn = Callable[[list[Messages]], list[str]]


# ---------------------------------------------------------------- cache
@dataclass(frozen=True)
class Query:
    """One prompt to answer: ``item_id`` (pair / instance id), ``set_name`` and its chat messages."""

    item_id: str
    set_name: str
    messages: Messages
    hash: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.item_id, self.set_name, self.hash)


class OutputCache:
    """Raw model replies in a JSON-lines file, keyed by ``(item_id, set, prompt_hash)``.

    Record: ``{"item_id", "set", "prompt_hash", "output", ...extra}``. Opening the cache reads all
    complete lines; a final line without its newline (a crash mid-write) is cut off the file. A
    malformed complete line is an error naming the file and line.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.entries: dict[tuple[str, str, str], str] = {}
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            log.warning("%s: dropping a torn last line (%d bytes) left by an interrupted run", self.path, len(data) - complete)
            with open(self.path, "r+b") as handle:
                handle.truncate(complete)
                handle.flush()
                os.fsync(handle.fileno())
        for line_no, line in enumerate(data[:complete].decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = (str(record["item_id"]), str(record["set"]), str(record["prompt_hash"]))
                output = record["output"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{self.path}:{line_no}: not a raw-output record ({err})") from None
            if not isinstance(output, str):
                raise ValueError(f"{self.path}:{line_no}: record {key[0]!r}: field 'output' must be a string")
            self.entries[key] = output

    def __contains__(self, key: tuple[str, str, str]) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: tuple[str, str, str]) -> str | None:
        return self.entries.get(key)

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append records in one write, then flush and fsync (one batch = one durable unit)."""
        if not records:
            return
        payload = "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in records)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        for r in records:
            self.entries[(str(r["item_id"]), str(r["set"]), str(r["prompt_hash"]))] = r["output"]


def run_queries(queries: Sequence[Query], generate: GenerateFn, cache: OutputCache, batch_size: int = 8,
                extra: Mapping[str, Any] | None = None, progress: bool | None = None) -> list[str]:
    """Replies to ``queries`` (in order): cached ones are reused, the rest generated in batches.

    Each generated batch is appended to ``cache`` before the next one starts. ``extra`` fields
    (model name, strategy, ...) are stored in each new record for humans; they are not part of the key.
    ``progress``: a tqdm bar over the prompts to generate (None: only on a terminal, and not with
    the environment variable ``TQDM_DISABLE=1``).
    """
    from tqdm import tqdm

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    seen: set[tuple[str, str, str]] = set()
    missing = []
    for q in queries:
        if q.key not in cache and q.key not in seen:
            seen.add(q.key)
            missing.append(q)
    if missing:
        log.info("%d of %d prompts not cached: generating in batches of %d", len(missing), len(queries), batch_size)
    bar = tqdm(total=len(missing), desc="generating", unit="prompt", disable=None if progress is None else not progress,
               postfix={"cached": len(queries) - len(missing)})
    for start in range(0, len(missing), batch_size):
        batch = missing[start:start + batch_size]
        outputs = list(generate([q.messages for q in batch]))
        if len(outputs) != len(batch) or not all(isinstance(o, str) for o in outputs):
            raise RuntimeError(f"generate returned {len(outputs)} replies for a batch of {len(batch)} prompts "
                               "(expected one string per prompt)")
        cache.append([{"item_id": q.item_id, "set": q.set_name, "prompt_hash": q.hash, "output": o, **(extra or {})}
                      for q, o in zip(batch, outputs)])
        bar.update(len(batch))
    bar.close()
    return [cache.get(q.key) for q in queries]


def make_query(item_id: str, set_name: str, messages: Messages, signature: str,
               image_root: str | os.PathLike | None = None) -> Query:
    """A query whose hash covers the messages and the generation ``signature``.

    Image paths under ``image_root`` enter the hash relative to it, so moving the data folder
    keeps the cached replies valid.
    """
    portable = messages
    if image_root is not None:
        root = str(Path(image_root))
        portable = [{**m, "content": [
            {**c, "image": os.path.relpath(c["image"], root)}
            if c.get("type") == "image" and isinstance(c.get("image"), str) and c["image"].startswith(root + os.sep) else c
            for c in m["content"]]} for m in messages]
    header = [{"role": "signature", "content": [{"type": "text", "text": signature}]}]
    return Query(item_id, set_name, messages, prompt_hash(header + list(portable)))


# ---------------------------------------------------------------- images
def resolve_image(path: Any, root: str | os.PathLike | None) -> Any:
    """An image path made absolute against ``root`` (a relative path stays relative without a root)."""
    if path is None or not isinstance(path, (str, os.PathLike)):
        return path
    p = Path(path)
    if root is not None and not p.is_absolute():
        p = Path(root) / p
    return str(p)


def _step(step: Mapping[str, Any], root: str | os.PathLike | None) -> dict[str, Any]:
    images = step.get("images") or []
    return {"text": step.get("text"), "image": resolve_image(images[0], root) if images else None}


# ---------------------------------------------------------------- TEO
def teo_queries(eval_sets: Mapping[str, Sequence[Mapping[str, Any]]], strategy: str, modality: str,
                signature: str, image_root: str | os.PathLike | None = None) -> list[Query]:
    """One query per pair of the ``original`` and ``swapped`` sets; errors name the pair."""
    queries = []
    for set_name in ("original", "swapped"):
        for pair in eval_sets[set_name]:
            try:
                messages = build_teo_prompt(strategy, modality, _step(pair["step_a"], image_root), _step(pair["step_b"], image_root))
            except ValueError as err:
                raise ValueError(f"TEO pair {pair['pair_id']!r} ({set_name} set): {err}") from None
            queries.append(make_query(pair["pair_id"], set_name, messages, signature, image_root))
    return queries


def evaluate_teo(eval_sets: Mapping[str, Sequence[Mapping[str, Any]]], generate: GenerateFn, cache: OutputCache,
                 strategy: str, modality: str, model_name: str, signature: str | None = None,
                 image_root: str | os.PathLike | None = None, batch_size: int = 8, seed: int = 0) -> dict[str, Any]:
    """TEO result of one (model, strategy, modality): metrics rows (baselines first), predictions.

    Returns ``{"task": "teo", "model", "strategy", "modality", "rows": {name: report}, "columns",
    "predictions": {set: {pair_id: label}}, "reflection": counts or None}``. For
    ``self_reflection`` the model row scores the final answers and an extra row
    ``<model> (first answer)`` the initial ones; ``reflection`` counts kept/corrected/broken answers.
    """
    signature = signature or model_name
    original, swapped = list(eval_sets["original"]), list(eval_sets["swapped"])
    queries = teo_queries(eval_sets, strategy, modality, signature, image_root)
    outputs = run_queries(queries, generate, cache, batch_size,
                          extra={"model": model_name, "task": "teo", "strategy": strategy, "modality": modality})
    first: dict[str, dict[str, str]] = {"original": {}, "swapped": {}}
    final: dict[str, dict[str, str]] = {"original": {}, "swapped": {}}
    for q, text in zip(queries, outputs):
        first[q.set_name][q.item_id], final[q.set_name][q.item_id] = parse_teo_answers(text, strategy)
    systems = {model_name: (final["original"], final["swapped"])}
    reflection = None
    if strategy == "self_reflection":
        systems[f"{model_name} (first answer)"] = (first["original"], first["swapped"])
        gold = {(s, p["pair_id"]): p["label"] for s, pairs in (("original", original), ("swapped", swapped)) for p in pairs}
        counts = Counter(reflection_outcome(first[s][pid], final[s][pid], label) for (s, pid), label in gold.items())
        reflection = {k: counts.get(k, 0) for k in ("kept_correct", "kept_wrong", "corrected", "broken", "changed_wrong")}
    rows = teo_rows(original, swapped, systems, seed=seed)
    return {"task": "teo", "model": model_name, "strategy": strategy, "modality": modality,
            "num_pairs": len(original), "rows": rows, "columns": [list(c) for c in TEO_COLUMNS],
            "table": teo_table(rows), "predictions": final, "reflection": reflection}


# ---------------------------------------------------------------- ISO
class _TokenLimit:
    """Temporarily set ``generate.max_new_tokens`` (when the generator has one, e.g. :class:`HFGenerator`)."""

    def __init__(self, generate: Any, max_new_tokens: int | None) -> None:
        self.generate, self.limit = generate, max_new_tokens
        self.saved = getattr(generate, "max_new_tokens", None)

    def __enter__(self) -> None:
        if self.limit is not None and self.saved is not None:
            self.generate.max_new_tokens = int(self.limit)

    def __exit__(self, *exc: Any) -> None:
        if self.limit is not None and self.saved is not None:
            self.generate.max_new_tokens = self.saved


def evaluate_iso(instances: Sequence[Mapping[str, Any]], generate: GenerateFn, cache: OutputCache, strategy: str,
                 model_name: str, signature: str | None = None, image_root: str | os.PathLike | None = None,
                 batch_size: int = 8, seed: int = 0, max_new_tokens: int | None = None,
                 unparsable: str = "exclude") -> dict[str, Any]:
    """ISO-Bench result of one (model, strategy): DEP/NONDEP P/R/F1 rows (baselines first), predictions.

    Protocol of ISO-Bench App. H: the prompt of :func:`build_iso_prompt`, generation limited to
    ``max_new_tokens`` (default: ``max_new_tokens`` of ``configs/prompts/iso.yaml``, 120), the first
    YES/NO (``answer_only``) or the final ``<answer>`` tag (``explain``) as the answer, and
    unparsable replies left out of the scores (``unparsable="exclude"``; ``"wrong"`` counts them as
    errors). The limit is applied by setting ``generate.max_new_tokens`` for the duration of the
    call when the generator has that attribute (:class:`HFGenerator`); any other callable must
    honour it itself. The limit is part of every prompt hash. ``by_task`` holds the model's scores
    on the ``before`` and ``after`` questions separately (as in ISO-Bench Figure 3).
    """
    limit = iso_max_new_tokens() if max_new_tokens is None else int(max_new_tokens)
    signature = f"{signature or model_name}|iso_max_new_tokens={limit}"
    queries = []
    for inst in instances:
        messages = build_iso_prompt(strategy, inst, image=resolve_image(inst.get("image"), image_root))
        queries.append(make_query(inst["instance_id"], "iso", messages, signature, image_root))
    with _TokenLimit(generate, limit):
        outputs = run_queries(queries, generate, cache, batch_size,
                              extra={"model": model_name, "task": "iso", "strategy": strategy})
    preds = {q.item_id: parse_iso_answer(text, strategy) for q, text in zip(queries, outputs)}
    gold = {inst["instance_id"]: inst["label"] for inst in instances}
    rows = iso_rows(gold, {model_name: preds}, seed=seed, unparsable=unparsable)
    by_task = {}
    for task in ("before", "after"):
        ids = [inst["instance_id"] for inst in instances if inst.get("task") == task]
        if ids:
            by_task[task] = iso_report({i: gold[i] for i in ids}, {i: preds[i] for i in ids}, unparsable)
    return {"task": "iso", "model": model_name, "strategy": strategy, "modality": "image_text",
            "num_instances": len(instances), "max_new_tokens": limit, "unparsable": unparsable, "rows": rows,
            "columns": [list(c) for c in ISO_COLUMNS], "table": iso_table(rows), "by_task": by_task,
            "predictions": preds}


# ---------------------------------------------------------------- COHERENCE
def evaluate_coherence(instances: Sequence[Mapping[str, Any]], generate: GenerateFn, cache: OutputCache,
                       model_name: str, signature: str | None = None, image_root: str | os.PathLike | None = None,
                       batch_size: int = 8, seed: int = 0) -> dict[str, Any]:
    """COHERENCE result of one model (App. D.1 prompt, §4.1 / App. E metrics).

    Rows: exact match, partial score, reject accuracy, unparsable and invalid rates (baselines
    first), each with ``by_source`` / ``by_difficulty``; ``table`` adds the per-domain table in the
    layout of COHERENCE Table 1 when the instances carry a ``source``.
    """
    signature = signature or model_name
    queries = []
    for inst in instances:
        images = [resolve_image(c, image_root) for c in inst["candidates"]]
        queries.append(make_query(inst["instance_id"], "coherence", build_coherence_prompt(inst, images=images), signature,
                                  image_root))
    outputs = run_queries(queries, generate, cache, batch_size, extra={"model": model_name, "task": "coherence"})
    preds = {inst["instance_id"]: parse_coherence_answer(text) for inst, text in zip(instances, outputs)}
    rows = coherence_rows(instances, {model_name: preds}, seed=seed)
    table = coherence_table(rows)
    by_source = coherence_source_table(rows)
    if by_source:
        table += "\n\nBy source domain (COHERENCE Table 1 layout):\n\n" + by_source
    return {"task": "coherence", "model": model_name, "strategy": "assign", "modality": "image_text",
            "num_instances": len(instances), "rows": rows, "columns": [list(c) for c in COHERENCE_COLUMNS],
            "table": table, "predictions": preds}


# ---------------------------------------------------------------- outputs
def slug(name: str) -> str:
    """A file-name-safe version of a model name or path (``OpenGVLab/InternVL3_5-8B`` -> ``OpenGVLab__InternVL3_5-8B``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name).strip("/").replace("/", "__")) or "model"


def plot_rows(rows: Mapping[str, Mapping[str, Any]], columns: Sequence[Sequence[str]], title: str, path: str | os.PathLike) -> None:
    """Grouped bar chart (one group per metric, one bar per row), percentages; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(rows)
    keys = [c[0] for c in columns]
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(keys) + 2), 4.0))
    x = np.arange(len(keys))
    for i, name in enumerate(names):
        values = [100 * float(rows[name].get(k) or 0.0) for k in keys]
        ax.bar(x + (i - (len(names) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(x, [c[1] for c in columns], rotation=30, ha="right")
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    with atomic_open(path, "wb", encoding=None) as handle:
        fig.savefig(handle, format="png", dpi=100)
    plt.close(fig)


def result_stem(result: Mapping[str, Any]) -> str:
    """``<task>_<strategy>_<modality>``, the file name stem of a result."""
    return f"{result['task']}_{result['strategy']}_{result['modality']}"


def write_result(result: Mapping[str, Any], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``<stem>.md`` (table), ``<stem>.json`` (everything) and ``<stem>.png`` (bars) atomically."""
    out_dir = Path(out_dir)
    stem = result_stem(result)
    title = f"{result['task'].upper()} | {result['model']} | {result['strategy']} | {result['modality']}"
    paths = {"md": out_dir / f"{stem}.md", "json": out_dir / f"{stem}.json", "png": out_dir / f"{stem}.png"}
    with atomic_open(paths["md"]) as handle:
        handle.write(f"# {title}\n\n{result['table']}\n")
        if result.get("reflection"):
            handle.write("\nSelf-reflection: " + ", ".join(f"{k} {v}" for k, v in result["reflection"].items()) + "\n")
    with atomic_open(paths["json"]) as handle:
        json.dump(result, handle, indent=1, ensure_ascii=False, default=str)
    plot_rows(result["rows"], result["columns"], title, paths["png"])
    return paths


# ---------------------------------------------------------------- Hugging Face models
def _load_pil(image: Any) -> Any:
    from PIL import Image

    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as img:
                return img.convert("RGB")
        except OSError as err:
            raise ValueError(f"cannot read image {image}: {err}") from None
    return image


class HFGenerator:
    """``generate(messages_batch) -> replies`` for a Hugging Face image-text-to-text model.

    Applies the processor's chat template to the whole batch (left padding, so every prompt ends
    where generation starts), decodes greedily (``do_sample=False``) up to ``max_new_tokens`` and
    returns only the newly generated text. Image paths in the messages are opened as RGB PIL
    images first (a missing file is a clear error).
    """

    def __init__(self, model: Any, processor: Any, max_new_tokens: int = 256, device: str | None = None) -> None:
        self.model = model.eval()
        self.processor = processor
        self.max_new_tokens = int(max_new_tokens)
        self.device = device or str(next(model.parameters()).device)
        tokenizer = getattr(processor, "tokenizer", processor)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer

    @property
    def signature(self) -> str:
        """Model identity + decoding settings (part of every prompt hash)."""
        name = getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__
        return f"{name}|greedy|max_new_tokens={self.max_new_tokens}"

    def __call__(self, messages_batch: list[Messages]) -> list[str]:
        import torch

        batch = [[{**m, "content": [{**c, "image": _load_pil(c["image"])} if c.get("type") == "image" else c
                                    for c in m["content"]]} for m in messages] for messages in messages_batch]
        inputs = self.processor.apply_chat_template(batch, add_generation_prompt=True, tokenize=True, return_dict=True,
                                                    return_tensors="pt", processor_kwargs={"padding": True})
        inputs = inputs.to(self.device)
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        with torch.inference_mode():
            out = self.model.generate(**inputs, do_sample=False, max_new_tokens=self.max_new_tokens,
                                      pad_token_id=self.tokenizer.pad_token_id)
        new_tokens = out[:, inputs["input_ids"].shape[1]:]
        return [t.strip() for t in self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]


def load_hf_generator(name_or_path: str, max_new_tokens: int = 256, dtype: str = "auto", device: str = "auto",
                      trust_remote_code: bool = False) -> HFGenerator:
    """Load ``AutoModelForImageTextToText`` + ``AutoProcessor`` through :func:`seqaware.pretrained.from_pretrained`.

    Fails fast (``PretrainedUnavailableError``) when the model is neither local nor cached and the
    hub cannot be reached. ``device="auto"`` picks CUDA when available.
    """
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from seqaware.pretrained import from_pretrained

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    processor = from_pretrained(AutoProcessor.from_pretrained, name_or_path, what="processor", config_key="--model",
                                trust_remote_code=trust_remote_code)
    model = from_pretrained(AutoModelForImageTextToText.from_pretrained, name_or_path, what="model", config_key="--model",
                            dtype=torch_dtype, trust_remote_code=trust_remote_code)
    return HFGenerator(model.to(device), processor, max_new_tokens=max_new_tokens, device=device)

