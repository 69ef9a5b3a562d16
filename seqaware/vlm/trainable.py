"""Which parts of an InternVL train, and how: ``model.train_parts`` and ``model.lora``.

An :class:`~transformers.InternVLForConditionalGeneration` has three parts (:data:`PARTS`), every
parameter in exactly one of them:

* ``vision``: the vision tower (``model.vision_tower``, InternViT);
* ``projector``: the pixel-shuffle MLP between them (``model.multi_modal_projector``: LayerNorm + two Linear);
* ``language``: the language model (``model.language_model``) and its output head (``lm_head``).

Each part is ``frozen``, ``lora`` or ``full`` (:data:`MODES`). ``lora`` adds PEFT LoRA adapters to the
part's Linear layers chosen by ``model.lora.layers``: ``attention`` (the attention's query / key / value /
output projections, the MATEO recipe, appendix A.1) or ``all_linear`` (every Linear of the part; the
language part's output head never gets one, as in PEFT's ``all-linear``). The projector has no attention:
``projector: lora`` adapts its two Linear layers whatever ``lora.layers`` says. ``full`` trains every
weight of the part (PEFT ``modules_to_save`` when another part has LoRA, so the adapter folder carries
the part; plain ``requires_grad`` when no part has LoRA, and then there is no adapter: the trained model
is saved whole).

Default (:data:`DEFAULT_TRAIN_PARTS`): the language model's attention under LoRA, vision tower and projector
frozen (MATEO appendix A.1 applies LoRA to "the query, key, value, and output matrices of the attention
layers"; it names no vision or projector training).

The three bundles of ``model.lora.target`` that came before (``language``, ``language_vision``,
``all_linear``) are still read (checkpoints saved with them load, with the same parameter names):
:data:`OLD_TARGETS` maps each one to its parts.
"""
from __future__ import annotations

import re
import types
from typing import Any, Mapping

import torch

PARTS = {
    "vision": ("model.vision_tower",),
    "projector": ("model.multi_modal_projector",),
    "language": ("model.language_model", "lm_head"),
}
"""Each part: the module names (in ``InternVLForConditionalGeneration``) whose parameters it owns."""
MODES = ("frozen", "lora", "full")
LORA_LAYERS = ("attention", "all_linear")
DEFAULT_TRAIN_PARTS = {"vision": "frozen", "projector": "frozen", "language": "lora"}
OLD_TARGETS = {
    "language": ({"vision": "frozen", "projector": "frozen", "language": "lora"}, "attention"),
    "language_vision": ({"vision": "lora", "projector": "frozen", "language": "lora"}, "attention"),
    "all_linear": ({"vision": "lora", "projector": "lora", "language": "lora"}, "all_linear"),
}
"""``model.lora.target`` (before per-part training) -> ``(model.train_parts, model.lora.layers)``."""

# attention projections (query, key, value, output) of the language model, by its model type
ATTENTION_PROJECTIONS = {"bert": r"(query|key|value|attention\.output\.dense)"}
DEFAULT_ATTENTION_PROJECTIONS = r"(q_proj|k_proj|v_proj|o_proj)"  # Qwen2/Qwen3/Llama-style decoders
VISION_ATTENTION = r"vision_tower.*\.(q_proj|k_proj|v_proj|projection_layer)"  # InternViT: projection_layer = output


def resolve_train_parts(train_parts: Mapping[str, str] | None = None,
                        lora: Mapping[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
    """``(parts, lora)``: every part's mode and the LoRA settings (``layers`` filled in, no ``target``).

    ``train_parts`` may name some parts only (the others take :data:`DEFAULT_TRAIN_PARTS`); ``None`` with
    an old ``lora.target`` takes that bundle's parts (:data:`OLD_TARGETS`). ValueError naming the key for an
    unknown part, mode, layer choice or old target, both ``train_parts`` and ``lora.target`` given, or
    nothing to train.
    """
    lora = dict(lora or {})
    target = lora.pop("target", None)
    if target is not None:
        if target not in OLD_TARGETS:
            raise ValueError(f"model.lora.target={target!r} is not one of the old bundles {sorted(OLD_TARGETS)}; "
                             "choose each part with model.train_parts.{vision,projector,language}: frozen|lora|full "
                             "and model.lora.layers: attention|all_linear")
        if train_parts is not None:
            raise ValueError(f"model.lora.target={target!r} (old bundle) and model.train_parts are both set: "
                             "drop model.lora.target and say it with model.train_parts and model.lora.layers")
        parts, layers = OLD_TARGETS[target]
        if lora.setdefault("layers", layers) != layers:
            raise ValueError(f"model.lora.target={target!r} means model.lora.layers={layers}, got {lora['layers']!r}")
        return dict(parts), lora
    given = dict(train_parts or {})
    unknown = sorted(set(given) - set(PARTS))
    if unknown:
        raise ValueError(f"model.train_parts has no part {unknown[0]!r}; the parts are {', '.join(PARTS)}")
    parts = {**DEFAULT_TRAIN_PARTS, **given}
    for part, mode in parts.items():
        if mode not in MODES:
            raise ValueError(f"model.train_parts.{part} must be one of {', '.join(MODES)}, got {mode!r}")
    if all(mode == "frozen" for mode in parts.values()):
        raise ValueError("model.train_parts: every part is frozen, nothing would train; set a part to lora or full")
    lora.setdefault("layers", "attention")
    if lora["layers"] not in LORA_LAYERS:
        raise ValueError(f"model.lora.layers must be one of {', '.join(LORA_LAYERS)}, got {lora['layers']!r}")
    return parts, lora


def part_of(name: str) -> str:
    """The part (:data:`PARTS`) a parameter or module of the base model belongs to (PEFT prefixes allowed)."""
    name = re.sub(r"^base_model\.model\.", "", name)
    for part, prefixes in PARTS.items():
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return part
    raise ValueError(f"{name!r} belongs to none of the InternVL parts {', '.join(PARTS)}")


def _linear_names(base: Any, prefix: str) -> list[str]:
    return [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith(prefix + ".")]


def _all_linear(base: Any, prefix: str) -> str | None:
    """A regex for every Linear layer under ``prefix`` (their last names below it), None if it has none."""
    leaves = sorted({n.rsplit(".", 1)[1] for n in _linear_names(base, prefix)})
    if not leaves:
        return None
    return rf"{re.escape(prefix)}(\..*)?\.({'|'.join(map(re.escape, leaves))})"


def lora_target_modules(base: Any, parts: Mapping[str, str], layers: str) -> str | None:
    """PEFT ``target_modules`` (one regex) for the ``lora`` parts, None when no part is ``lora``.

    Only Linear layers are matched (checked): the LM's output head never, the projector's two Linear
    layers whatever ``layers`` says.
    """
    patterns = []
    if parts["vision"] == "lora":
        patterns.append(VISION_ATTENTION if layers == "attention" else _all_linear(base, "model.vision_tower"))
    if parts["projector"] == "lora":
        patterns.append(_all_linear(base, "model.multi_modal_projector"))
    if parts["language"] == "lora":
        if layers == "attention":
            kind = base.config.text_config.model_type
            patterns.append(rf"language_model.*\.{ATTENTION_PROJECTIONS.get(kind, DEFAULT_ATTENTION_PROJECTIONS)}")
        else:
            patterns.append(_all_linear(base, "model.language_model"))
    patterns = [p for p in patterns if p]
    if not patterns:
        return None
    regex = rf".*({'|'.join(patterns)})" if len(patterns) > 1 else rf".*{patterns[0]}"
    matched = [(n, m) for n, m in base.named_modules() if re.fullmatch(regex, n)]
    wrong = [n for n, m in matched if not isinstance(m, torch.nn.Linear)]
    if wrong:
        raise RuntimeError(f"LoRA target regex {regex!r} also matches non-Linear modules {wrong[:3]}")
    return regex


def apply_train_parts(base: Any, train_parts: Mapping[str, str] | None = None, lora: Mapping[str, Any] | None = None) -> Any:
    """``base`` with exactly the parameters ``train_parts`` / ``lora`` train (see the module docstring).

    ``lora``: ``{r: 16, alpha: 32, dropout: 0.05, layers: attention, bias: none}``. With a ``lora`` part
    the result is a PEFT model: adapters in float32 even on a bfloat16 base (``autocast_adapter_dtype``;
    under autocast they take their input as it comes, :func:`_cast_input_unless_autocast`), ``full``
    parts as ``modules_to_save``. Without one it is ``base`` itself, ``full`` parts trainable, the rest frozen.
    """
    parts, lora = resolve_train_parts(train_parts, lora)
    full = [name.rsplit(".", 1)[-1] for part, mode in parts.items() if mode == "full" for name in PARTS[part]]
    targets = lora_target_modules(base, parts, lora["layers"])
    if targets is None:
        for name, param in base.named_parameters():
            param.requires_grad_(parts[part_of(name)] == "full")
        return base
    from peft import LoraConfig, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    config = LoraConfig(r=int(lora.get("r", 16)), lora_alpha=int(lora.get("alpha", 32)),
                        lora_dropout=float(lora.get("dropout", 0.05)), bias=lora.get("bias", "none"),
                        target_modules=targets, modules_to_save=full or None)
    model = get_peft_model(base, config, autocast_adapter_dtype=True)
    for module in model.modules():
        if isinstance(module, BaseTunerLayer) and hasattr(module, "_cast_input_dtype"):
            module._cast_input_dtype = types.MethodType(_cast_input_unless_autocast, module)
    return model


def apply_lora(base: Any, lora: Mapping[str, Any] | None = None) -> Any:
    """:func:`apply_train_parts` with the default parts (or an old ``lora.target`` bundle's)."""
    return apply_train_parts(base, None, lora)


def _cast_input_unless_autocast(layer: Any, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """PEFT casts a LoRA layer's input to the adapter's dtype: a bfloat16 activation becomes a float32 copy,
    dropout runs on it in float32 and autocast casts it back to bfloat16 for the adapter's matmul. Under
    autocast the round trip is skipped: without dropout (eval, or ``dropout: 0``) the matmul sees exactly the
    same values (bfloat16 -> float32 -> bfloat16 is exact; tests/test_teo_lora.py checks loss and gradients bit
    for bit); with dropout the rescaled values are rounded once instead of twice. On one H200 this removed 864
    of the 3,608 copy kernels of an InternVL3.5-8B LoRA step at batch 8 (137 -> 80 ms of copies), and the
    step got 8% faster (docs/results/performance.md). Without autocast PEFT's cast is kept (the matmul needs matching dtypes)."""
    if torch.is_autocast_enabled(x.device.type):
        return x
    return type(layer)._cast_input_dtype(layer, x, dtype)
