"""Prompt any image-text-to-text model, batched and resumable: the task-agnostic half of VLM evaluation.

The pieces, each usable on its own:

* a *generator*: any callable ``generate(messages_batch) -> list[str]`` (one reply per chat).
  :class:`HFGenerator` wraps a Hugging Face ``AutoModelForImageTextToText`` + ``AutoProcessor``
  (chat template, left padding, greedy decoding); tests inject a scripted fake;
* :class:`OutputCache`: raw replies stored as JSON lines keyed by ``(item id, set, prompt hash)``.
  Each batch is appended in one write followed by flush + fsync, so a crash loses at most the
  batch in flight; a torn last line left by a crash is dropped on the next open. Rerunning skips
  every cached key, so an interrupted evaluation resumes where it stopped;
* :func:`run_queries` / :func:`make_query`: the replies to a list of prompts, through the cache;
* ``write_result``: a result as markdown table + JSON + PNG bar chart, written atomically.

The task protocols build on it: :mod:`seqaware.vlm.protocols.teo`, :mod:`~seqaware.vlm.protocols.iso`
and :mod:`~seqaware.vlm.protocols.coherence` build prompts (:mod:`seqaware.vlm.prompts`), collect
replies here, parse them (:mod:`seqaware.vlm.parser`) and score them (:mod:`seqaware.metrics`).

The prompt hash covers the chat messages *and* a generation signature (model name and decoding
settings), so changing the model, a template or ``max_new_tokens`` never reuses stale replies.
This module never imports ``data_modules``: the caller builds pairs/instances (``scripts/tools/eval_teo.py``).
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from seqaware.io import atomic_open
from seqaware.vlm.inputs import check_image_tiles, read_record, tiling_kwargs
from seqaware.vlm.prompts import prompt_hash

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
    """``<task>_<strategy>_<modality>``, the file name stem of a result (``_finetune`` added for the Table 6 prompt)."""
    tail = "_finetune" if result.get("prompt") == "finetune" else ""
    return f"{result['task']}_{result['strategy']}_{result['modality']}{tail}"


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

    ``image_tiles``: at most this many tiles per image, passed to an InternVL processor on every call
    (:func:`seqaware.vlm.inputs.tiling_kwargs`, the same arguments the TEO training collator passes);
    None leaves the processor's own default (any other model). ``name``: the model's name in the
    signature (default: the config's ``_name_or_path``).
    """

    def __init__(self, model: Any, processor: Any, max_new_tokens: int = 256, device: str | None = None,
                 image_tiles: int | None = None, name: str | None = None) -> None:
        self.model = model.eval()
        self.processor = processor
        self.max_new_tokens = int(max_new_tokens)
        self.image_tiles = None if image_tiles is None else check_image_tiles(image_tiles, "image_tiles")
        self.name = name
        self.device = device or str(next(model.parameters()).device)
        tokenizer = getattr(processor, "tokenizer", processor)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer

    @property
    def signature(self) -> str:
        """Model identity + decoding settings + tiling when set (part of every prompt hash)."""
        name = self.name or getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__
        tiles = "" if self.image_tiles is None else f"|image_tiles={self.image_tiles}"
        return f"{name}|greedy|max_new_tokens={self.max_new_tokens}{tiles}"

    def inputs(self, messages_batch: list[Messages]) -> Any:
        """The processor's outputs for a batch of chats (prompt rendered for generation, left-padded)."""
        batch = [[{**m, "content": [{**c, "image": _load_pil(c["image"])} if c.get("type") == "image" else c
                                    for c in m["content"]]} for m in messages] for messages in messages_batch]
        kwargs: dict[str, Any] = {"padding": True}
        if self.image_tiles is not None:
            kwargs["images_kwargs"] = tiling_kwargs(self.image_tiles)
        return self.processor.apply_chat_template(batch, add_generation_prompt=True, tokenize=True, return_dict=True,
                                                  return_tensors="pt", processor_kwargs=kwargs)

    def __call__(self, messages_batch: list[Messages]) -> list[str]:
        import torch

        inputs = self.inputs(messages_batch).to(self.device)
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        with torch.inference_mode():
            out = self.model.generate(**inputs, do_sample=False, max_new_tokens=self.max_new_tokens,
                                      pad_token_id=self.tokenizer.pad_token_id)
        new_tokens = out[:, inputs["input_ids"].shape[1]:]
        return [t.strip() for t in self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]


def load_hf_generator(name_or_path: str, max_new_tokens: int = 256, dtype: str = "auto", device: str = "auto",
                      trust_remote_code: bool = False, image_tiles: int | None = None) -> HFGenerator:
    """Load ``AutoModelForImageTextToText`` + ``AutoProcessor`` through :func:`seqaware.pretrained.from_pretrained`,
    or a PEFT adapter folder on its base (:func:`load_adapter_folder`).

    Fails fast (``PretrainedUnavailableError``) when the model is neither local nor cached and the
    hub cannot be reached. ``device="auto"`` picks CUDA when available. A TEO run folder is refused
    with the folders to give instead.
    """
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from seqaware.pretrained import from_pretrained

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    folder = Path(name_or_path)
    if folder.is_dir() and not (folder / "config.json").is_file() and (folder / "adapter").is_dir():
        raise ValueError(f"--model {folder} is a run folder: give {folder / 'adapter'} (the LoRA adapter on its base) "
                         f"or {folder / 'adapter' / 'merged'} (the merged model, saved with model.merge_adapter=true)")
    if (folder / "adapter_config.json").is_file():
        model, processor = load_adapter_folder(folder, torch_dtype, trust_remote_code)
    else:
        processor = from_pretrained(AutoProcessor.from_pretrained, name_or_path, what="processor", config_key="--model",
                                    trust_remote_code=trust_remote_code)
        model = from_pretrained(AutoModelForImageTextToText.from_pretrained, name_or_path, what="model",
                                config_key="--model", dtype=torch_dtype, trust_remote_code=trust_remote_code)
    return HFGenerator(model.to(device), processor, max_new_tokens=max_new_tokens, device=device,
                       image_tiles=image_tiles, name=str(name_or_path))


def load_adapter_folder(folder: str | os.PathLike, dtype: Any = "auto", trust_remote_code: bool = False) -> tuple[Any, Any]:
    """``(model, processor)`` of a PEFT adapter folder (``TeoLoraModule``'s ``adapter/``): its base model
    (``seqaware_inputs.json``'s ``base_model``, else ``adapter_config.json``'s ``base_model_name_or_path``; a
    built-in tiny model is rebuilt from its seed and sizes) with the adapter on it, unmerged, so it computes
    what the module computed in training; the processor saved in the folder, else the base's."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from seqaware.pretrained import from_pretrained
    from seqaware.vlm.models import BUILT_IN_MODELS

    folder = Path(folder)
    record = read_record(folder) or {}
    config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    base_name = record.get("base_model") or config.get("base_model_name_or_path")
    if not base_name:
        raise ValueError(f"{folder}: neither seqaware_inputs.json nor adapter_config.json names the base model")
    if base_name in BUILT_IN_MODELS:
        base, processor = BUILT_IN_MODELS[base_name][0](int(record.get("init_seed", 0)), **(record.get("tiny") or {}))
        base = base.to(getattr(torch, record.get("dtype", "float32")) if dtype == "auto" else dtype)
    else:
        base = from_pretrained(AutoModelForImageTextToText.from_pretrained, base_name, what="base model of the adapter",
                               config_key="--model", dtype=dtype, trust_remote_code=trust_remote_code)
        processor = None
    if (folder / "processor_config.json").is_file() or (folder / "preprocessor_config.json").is_file():
        processor = AutoProcessor.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    elif processor is None:
        processor = from_pretrained(AutoProcessor.from_pretrained, base_name, what="processor of the adapter's base",
                                    config_key="--model", trust_remote_code=trust_remote_code)
    return PeftModel.from_pretrained(base, str(folder)).eval(), processor

