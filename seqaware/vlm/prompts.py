"""Prompts for Temporal Execution Order (TEO), ISO-Bench and COHERENCE, as chat messages.

The wording lives in YAML files under ``configs/prompts/`` (``teo.yaml``, ``iso.yaml``,
``coherence.yaml``), never in code: this module only assembles the pieces into the Hugging Face
multimodal chat format understood by ``processor.apply_chat_template``::

    [{"role": "system", "content": [{"type": "text", "text": "..."}]},
     {"role": "user", "content": [{"type": "text", "text": "...Step A picture:"},
                                  {"type": "image", "image": "/path/a.jpg"},   # or a PIL.Image
                                  {"type": "text", "text": "Step B picture:"}, ...]}]

Adjacent text pieces are merged into one text item, so a text-only prompt is a single text item
per message and an image prompt has exactly one image item per shown picture.

TEO (MATEO): 5 strategies (``baseline``, ``instructions``, ``icl``, ``cot``, ``self_reflection``)
x 3 modalities (``image``, ``text``, ``image_text``) as written in MATEO Table 5, plus the fine-tuning
prompt and answer of Table 6 (:func:`build_teo_finetune_prompt`, :func:`teo_answer`); the order of
each prompt's parts is ``layouts`` in ``configs/prompts/teo.yaml`` (see ``docs/protocols/teo.md``).
Steps are objects or dicts with ``text`` and ``image`` (the image may be None for ``text``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "configs" / "prompts"
"""Where the prompt templates live (the repository's ``configs/prompts``)."""

STRATEGIES = ("baseline", "instructions", "icl", "cot", "self_reflection")
MODALITIES = ("image", "text", "image_text")
QUESTION_STRATEGIES = ("baseline", "instructions", "icl")
"""Strategies answered with Yes/No to the three questions Q1-Q3 (the others end with a class)."""
ISO_STRATEGIES = ("answer_only", "explain")
TEO_VARIANTS = ("reconstructed", "printed")
"""MATEO Table 5 prompts: ``reconstructed`` (default: the two rows the table abbreviates completed as the
other rows of their strategy) or ``printed`` (exactly as printed; ``printed_omits`` in ``configs/prompts/teo.yaml``)."""

Message = dict[str, Any]


@functools.lru_cache(maxsize=None)
def load_templates(name: str, prompts_dir: str | None = None) -> dict[str, Any]:
    """The parsed YAML ``<prompts_dir>/<name>.yaml`` (default folder: :data:`PROMPTS_DIR`).

    Cached: the files are read once per process. Raises FileNotFoundError naming the path.
    """
    path = Path(prompts_dir) if prompts_dir else PROMPTS_DIR
    path = path / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"prompt templates not found: {path}")
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _check_choice(kind: str, plural: str, value: str, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; valid {plural}: {', '.join(valid)}")


def _field(step: Any, name: str) -> Any:
    """``step[name]`` for a mapping, ``step.name`` for an object, None when absent."""
    if isinstance(step, Mapping):
        return step.get(name)
    return getattr(step, name, None)


def step_text(step: Any, which: str) -> str:
    """The step's non-empty text; ValueError naming the step otherwise."""
    text = _field(step, "text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"Step {which} has no text, but the prompt modality shows step descriptions")
    return text.strip()


def step_image(step: Any, which: str) -> Any:
    """The step's image (path string or PIL image); ValueError naming the step when missing.

    A step may also carry ``images`` (a list, as in TEO pairs); its first entry is used.
    """
    image = _field(step, "image")
    if image is None:
        images = _field(step, "images")
        if images:
            image = images[0]
    if image is None or (isinstance(image, str) and not image):
        raise ValueError(f"Step {which} has no image, but the prompt modality shows step pictures")
    if isinstance(image, Path):
        image = str(image)
    return image


def _merge(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge adjacent text items (joined by a newline) and drop empty texts."""
    out: list[dict[str, Any]] = []
    for item in content:
        if item["type"] == "text":
            if not item["text"]:
                continue
            if out and out[-1]["type"] == "text":
                out[-1] = {"type": "text", "text": out[-1]["text"] + "\n" + item["text"]}
                continue
        out.append(item)
    return out


def _messages(system: str | None, content: list[dict[str, Any]]) -> list[Message]:
    messages: list[Message] = []
    if system:
        messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
    messages.append({"role": "user", "content": _merge(content)})
    return messages


TEO_LAYOUTS = STRATEGIES + ("finetune",)
"""Prompt layouts of ``configs/prompts/teo.yaml``: the five strategies (MATEO Table 5) and ``finetune``
(MATEO Table 6, the Instructions prompt the paper fine-tunes with)."""
TEO_TARGET_FORMATS = ("mateo", "short")
"""Answer formats of ``teo_answer``: ``mateo`` (Table 6, ``Q1: The answer is: Yes.``) and ``short``
(seqaware's earlier ``Q1: Yes``)."""


def _teo_examples(t: Mapping[str, Any], kind: str) -> str:
    """The three worked examples (MATEO Table 5) written for ``icl``, ``cot`` or ``reflection``."""
    blocks = []
    for ex in t["examples"]:
        if kind == "icl":
            blocks.append(t["icl_example"].format(
                step_a=ex["step_a"], step_b=ex["step_b"], questions_header=t["questions_header"],
                questions=t["questions"], answer_lines=t["answers"]["mateo"][ex["label"]], explanation=ex["explanation"]))
        else:
            block = t["cot_example"].format(**{k: ex[k] for k in ("step_a", "step_b", "a_produces", "b_produces",
                                                                  "a_requires", "b_requires", "analysis", "answer")})
            if kind == "reflection":
                block += "\n" + t["reflection_example_tail"]
            blocks.append(block)
    return "\n".join(blocks)


_TEO_COMPUTED = {"icl_examples": "icl", "cot_examples": "cot", "reflection_examples": "reflection"}


def _teo_piece(t: Mapping[str, Any], name: str, modality: str) -> str:
    if name in _TEO_COMPUTED:
        return _teo_examples(t, _TEO_COMPUTED[name])
    if name not in t:
        raise ValueError(f"configs/prompts/teo.yaml: a layout names the piece {name!r}, which the file does not define")
    value = t[name]
    if isinstance(value, Mapping):
        value = value[modality]
    return (value or "").strip()


def _teo_messages(layout: str, modality: str, step_a: Any, step_b: Any, prompts_dir: str | None,
                  variant: str = "reconstructed") -> list[Message]:
    t = load_templates("teo", prompts_dir)
    if layout not in t.get("layouts", {}):
        raise ValueError(f"configs/prompts/teo.yaml has no layout {layout!r}")
    _check_choice("prompt variant", "variants (prompts.teo.variant)", variant, TEO_VARIANTS)
    omit = set(((t.get("printed_omits") or {}).get(layout) or {}).get(modality) or ()) if variant == "printed" else set()
    show_image = modality in ("image", "image_text")
    show_text = modality in ("text", "image_text")
    content: list[dict[str, Any]] = []
    for entry in t["layouts"][layout]:
        if entry == "steps":  # section 3: markers precede each image / text; Step A, then Step B
            for name, step in (("A", step_a), ("B", step_b)):
                if show_image:
                    image = step_image(step, name)
                    content.append({"type": "text", "text": t["markers"]["picture"].format(name=name)})
                    content.append({"type": "image", "image": image})
                if show_text:
                    content.append({"type": "text",
                                    "text": t["markers"]["description"].format(name=name, text=step_text(step, name))})
            continue
        line = " ".join(p for p in (_teo_piece(t, name, modality) for name in entry if name not in omit) if p)
        content.append({"type": "text", "text": line})
    return _messages(t.get("system"), content)


def build_teo_prompt(strategy: str, modality: str, step_a: Any, step_b: Any, prompts_dir: str | None = None,
                     variant: str = "reconstructed") -> list[Message]:
    """Chat messages asking how Step A must be executed relative to Step B (MATEO Table 5).

    ``strategy`` in :data:`STRATEGIES`, ``modality`` in :data:`MODALITIES`, ``variant`` in
    :data:`TEO_VARIANTS` (``printed``: the 15 rows exactly as Table 5 prints them; the default completes
    the two abbreviated Image-Text rows); the wording and the order
    of its parts are ``layouts[strategy]`` of ``configs/prompts/teo.yaml``. Images sit right after
    their ``Step A picture:`` / ``Step B picture:`` markers. Raises ValueError for an unknown
    strategy/modality (listing the valid names) and for a step without the image (image modalities)
    or text (text modalities) the prompt needs.
    """
    _check_choice("strategy", "strategies", strategy, STRATEGIES)
    _check_choice("modality", "modalities", modality, MODALITIES)
    return _teo_messages(strategy, modality, step_a, step_b, prompts_dir, variant)


def build_teo_finetune_prompt(modality: str, step_a: Any, step_b: Any, prompts_dir: str | None = None) -> list[Message]:
    """The prompt MATEO fine-tunes with (Table 6; the Instructions task of section 5.4): rules
    (+ the sequencing-terms rule for text modalities), the two steps, the three questions."""
    _check_choice("modality", "modalities", modality, MODALITIES)
    return _teo_messages("finetune", modality, step_a, step_b, prompts_dir)


def teo_answer(label: str, target_format: str = "mateo", prompts_dir: str | None = None) -> str:
    """The assistant answer of a TEO class: ``mateo`` (Table 6: three ``Qk: The answer is: Yes/No.``
    lines) or ``short`` (``Qk: Yes/No``). ValueError for an unknown label or format."""
    _check_choice("TEO target format", "target formats", target_format, TEO_TARGET_FORMATS)
    answers = load_templates("teo", prompts_dir)["answers"][target_format]
    if label not in answers:
        raise ValueError(f"unknown TEO label {label!r}; valid labels: {', '.join(answers)}")
    return answers[label]


def _goal(instance: Mapping[str, Any], task_name: str, field: str) -> str:
    """The instance's non-empty ``field`` (stripped); ValueError naming the instance and field."""
    value = instance.get(field)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{task_name} instance {instance.get('instance_id')!r}: field {field!r} is empty or missing, "
                         f"but the paper's prompt shows it")
    return value.strip()


def iso_max_new_tokens(prompts_dir: str | None = None) -> int:
    """The generation limit of the ISO prompt file (ISO-Bench App. H: 120 tokens)."""
    return int(load_templates("iso", prompts_dir)["max_new_tokens"])


def build_iso_prompt(strategy: str, instance: Mapping[str, Any], image: Any = None, prompts_dir: str | None = None) -> list[Message]:
    """Chat messages for one ISO-Bench instance (see ``data_modules.tasks.iso``), ISO-Bench App. H.

    One user message: the image (``image_position: first`` in ``iso.yaml``), then ``GOAL: <goal>``,
    ``Plan:``, the snippet's step texts one per line, the ``QUESTION: ...`` line of the instance's
    ``task`` (``before``: "... before the first step in the plan?", ``after``: "... after the last
    step in the plan?") and the strategy's instruction: ``answer_only`` ("Answer only with YES or
    NO.") or ``explain`` (``<think>...</think>`` then ``<answer>YES|NO</answer>``). No system message.
    ``image`` overrides ``instance["image"]`` (e.g. a resolved path). Errors name the instance and field.
    """
    _check_choice("ISO strategy", "ISO strategies", strategy, ISO_STRATEGIES)
    t = load_templates("iso", prompts_dir)
    iid = instance.get("instance_id")
    task = instance.get("task")
    if task not in t["question"]:
        raise ValueError(f"ISO instance {iid!r}: field 'task' is {task!r}; the ISO-Bench question needs one of "
                         f"{', '.join(t['question'])}")
    snippet = instance.get("snippet")
    if isinstance(snippet, str):
        snippet = [snippet]
    if not snippet or not all(isinstance(s, str) and s.strip() for s in snippet):
        raise ValueError(f"ISO instance {iid!r}: field 'snippet' must be a non-empty list of non-empty step texts")
    picture = image if image is not None else instance.get("image")
    if not picture:
        raise ValueError(f"ISO instance {iid!r}: field 'image' is empty or missing")
    lines = [t["goal_line"].format(goal=_goal(instance, "ISO", "goal")), t["plan_header"]]
    lines += [t["step_line"].format(text=s.strip()) for s in snippet]
    lines += [t["question_line"].format(question=t["question"][task]), t["strategies"][strategy].strip()]
    text_item = {"type": "text", "text": "\n".join(lines)}
    image_item = {"type": "image", "image": str(picture) if isinstance(picture, Path) else picture}
    position = t.get("image_position", "first")
    if position not in ("first", "last"):
        raise ValueError(f"iso.yaml: image_position must be 'first' or 'last', got {position!r}")
    content = [image_item, text_item] if position == "first" else [text_item, image_item]
    return _messages(t.get("system"), content)


PLACEHOLDER_PATTERN = re.compile(r"<image_(\d+)>")
"""The placeholders of a COHERENCE instance's ``text`` (``<image_1>`` ... in reading order)."""


def coherence_content(instance: Mapping[str, Any], placeholder: str) -> str:
    """The instance text with its ``<image_i>`` placeholders (1..n, in order) replaced by ``placeholder``.

    ValueError naming the instance when the placeholders are not exactly ``<image_1>`` ..
    ``<image_n>`` in reading order, n = ``num_images``.
    """
    text = instance.get("text")
    iid = instance.get("instance_id")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"COHERENCE instance {iid!r}: field 'text' is empty or missing")
    found = [int(m) for m in PLACEHOLDER_PATTERN.findall(text)]
    n = int(instance["num_images"])
    if found != list(range(1, n + 1)):
        raise ValueError(f"COHERENCE instance {iid!r}: field 'text' has placeholders {found}, expected <image_1> .. "
                         f"<image_{n}> in order (num_images={n})")
    return PLACEHOLDER_PATTERN.sub(lambda _: placeholder, text)


def build_coherence_prompt(instance: Mapping[str, Any], images: Sequence[Any] | None = None, prompts_dir: str | None = None) -> list[Message]:
    """Chat messages for one COHERENCE instance (see ``data_modules.tasks.coherence``), COHERENCE App. D.1.

    One user message: the D.1 header (title, number of placeholders and of candidates), the article
    text with every placeholder shown as ``[IMAGE_PLACEHOLDER]``, ``## Candidate Images (Image 0 to
    Image m-1):``, then ``Image 0`` + image, ``Image 1`` + image, ... (0-based, in candidate order,
    distractors included), then the D.1 instructions asking for the 0-based image index of each
    placeholder as a Python list on the last line. No system message. ``images`` overrides the
    candidate paths (same length).
    """
    t = load_templates("coherence", prompts_dir)
    iid = instance.get("instance_id")
    candidates = list(images) if images is not None else list(instance["candidates"])
    if len(candidates) != len(instance["candidates"]):
        raise ValueError(f"COHERENCE instance {iid!r}: {len(candidates)} images for "
                         f"{len(instance['candidates'])} candidates")
    n = int(instance["num_images"])
    m = len(candidates)
    if m < n:
        raise ValueError(f"COHERENCE instance {iid!r}: {m} candidates for {n} placeholders")
    fields = {
        "title": _goal(instance, "COHERENCE", "title"),
        "num_placeholders": n,
        "num_candidates": m,
        "last_index": m - 1,
        "content": coherence_content(instance, t["placeholder"]),
        "format_list": t["format_separator"].join(t["format_item"].format(i=i) for i in range(n)),
    }
    content: list[dict[str, Any]] = [{"type": "text", "text": t["header"].format(**fields)}]
    for k, image in enumerate(candidates):
        content.append({"type": "text", "text": t["image_marker"].format(index=k)})
        content.append({"type": "image", "image": str(image) if isinstance(image, Path) else image})
    content.append({"type": "text", "text": t["footer"].format(**fields)})
    return _messages(t.get("system"), content)


def _jsonable(value: Any) -> Any:
    """Messages with images replaced by a stable description (path, or PIL size/mode/bytes digest)."""
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "tobytes") and hasattr(value, "size"):  # PIL image
        return {"pil": [list(value.size), getattr(value, "mode", ""), hashlib.sha1(value.tobytes()).hexdigest()]}
    return str(value)


def prompt_hash(messages: Sequence[Message]) -> str:
    """A short stable hash of the messages (text and image references): the cache key of a prompt."""
    payload = json.dumps(_jsonable(list(messages)), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def prompt_images(messages: Sequence[Message]) -> list[Any]:
    """The image entries of the messages, in order."""
    return [item["image"] for m in messages for item in m["content"] if item.get("type") == "image"]


def prompt_text(messages: Sequence[Message]) -> str:
    """All text of the messages joined (images shown as ``<image>``): handy for logs and tests."""
    parts = []
    for m in messages:
        for item in m["content"]:
            parts.append(item["text"] if item["type"] == "text" else "<image>")
    return "\n".join(parts)
