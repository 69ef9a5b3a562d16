"""Per-part training of InternVL (issue #61): model.train_parts.{vision,projector,language} = frozen|lora|full and
model.lora.layers, checked parameter by parameter on the tiny InternVL; the old lora.target bundles still load."""
from __future__ import annotations

import itertools
import re

import pytest
import torch

from seqaware.modules.teo_lora import TeoLoraModule
from seqaware.vlm.models import build_minilm_internvl, build_tiny_internvl
from seqaware.vlm.trainable import apply_train_parts

# written out here, independently of seqaware/vlm/trainable.py
PREFIXES = {"vision": ("model.vision_tower.",), "projector": ("model.multi_modal_projector.",),
            "language": ("model.language_model.", "lm_head.")}
ATTENTION = {"vision": {"q_proj", "k_proj", "v_proj", "projection_layer"}, "language": {"q_proj", "k_proj", "v_proj", "o_proj"}}
COMBOS = [dict(zip(PREFIXES, modes)) for modes in itertools.product(("frozen", "lora", "full"), repeat=3)
          if set(modes) != {"frozen"}]


def _part(name: str) -> str:
    (part,) = [p for p, prefixes in PREFIXES.items() if name.startswith(prefixes)]
    return part


def expected_trainable(base: torch.nn.Module, parts: dict[str, str], layers: str) -> set[str]:
    """Full parts: every parameter; LoRA parts: lora_A / lora_B of the chosen Linear layers (never lm_head)."""
    out = set()
    for name, _ in base.named_parameters():
        if parts[_part(name)] == "full":
            out.add(name)
    for name, module in base.named_modules():
        if not isinstance(module, torch.nn.Linear) or name == "lm_head" or parts[_part(name + ".")] != "lora":
            continue
        part = _part(name + ".")
        if part == "projector" or layers == "all_linear" or name.rsplit(".", 1)[1] in ATTENTION[part]:
            out |= {f"{name}.lora_A", f"{name}.lora_B"}
    return out


def trainable(model: torch.nn.Module) -> set[str]:
    """Trainable parameters named as in the base model (PEFT's prefixes and wrappers taken off)."""
    out = set()
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        name = re.sub(r"^base_model\.model\.", "", name).replace(".modules_to_save.default", "")
        if ".lora_" in name:
            name = re.sub(r"\.lora_(A|B)\..*$", r".lora_\1", name)
        out.add(name)
    return out


@pytest.mark.parametrize("layers", ["attention", "all_linear"])
def test_every_part_choice_trains_exactly_its_parameters(layers):
    reference = build_tiny_internvl(seed=0)[0]
    for parts in COMBOS:
        model = apply_train_parts(build_tiny_internvl(seed=0)[0], parts, {"r": 4, "layers": layers})
        assert trainable(model) == expected_trainable(reference, parts, layers), parts
        assert hasattr(model, "peft_config") == ("lora" in parts.values()), parts


def test_projector_alone_and_frozen_language_model(tmp_path):
    """The two choices the old bundles lacked: the projector alone (no LoRA anywhere: the model is saved whole)
    and a frozen language model under a LoRA vision tower with a fully trained projector (saved in the adapter)."""
    from peft import PeftModel
    from transformers import InternVLForConditionalGeneration

    ids = torch.tensor([[300, 301, 302, 303, 304, 305]])  # ordinary tokens (no image token among them)
    pixels = torch.randn(1, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    ids_img = torch.cat([ids[:, :2], torch.full((1, 4), build_tiny_internvl()[0].config.image_token_id), ids[:, 2:]], 1)
    inputs = {"input_ids": ids_img, "attention_mask": torch.ones_like(ids_img), "pixel_values": pixels}
    for parts, peft in (({"projector": "full", "language": "frozen"}, False),
                        ({"vision": "lora", "projector": "full", "language": "frozen"}, True)):
        module = TeoLoraModule(name_or_path="tiny", train_parts=parts, lora={"dropout": 0.0},
                               optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-2})
        assert module.is_peft == peft
        before = {n: p.detach().clone() for n, p in module.named_parameters()}
        module.model(**inputs, labels=ids_img).loss.backward()
        module.configure_optimizers().step()
        changed = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
        assert changed and {n for n in changed if "language_model" in n or "lm_head" in n} == set()
        assert any("multi_modal_projector" in n for n in changed)
        module.eval()
        folder = module.save_adapter(tmp_path / str(peft))
        base = build_tiny_internvl(seed=0)[0]
        reloaded = (PeftModel.from_pretrained(base, str(folder)) if peft
                    else InternVLForConditionalGeneration.from_pretrained(str(folder))).eval()
        with torch.no_grad():
            assert torch.equal(reloaded(**inputs).logits, module.model(**inputs).logits)
            plain = build_tiny_internvl(seed=0)[0].eval()  # (PeftModel.from_pretrained wrapped `base` in place)
            assert not torch.equal(plain(**inputs).logits, module.model(**inputs).logits)  # training changed it
        checkpoint = {"state_dict": module.state_dict()}
        module.on_save_checkpoint(checkpoint)
        assert set(checkpoint["state_dict"]) == {n for n, p in module.named_parameters() if p.requires_grad}


def test_old_bundles_keep_their_parameters_and_names():
    """lora.target (language | language_vision | all_linear) builds exactly what it built before per-part training
    (PEFT on the old target regexes), so checkpoints saved with it load; and it means train_parts + lora.layers."""
    from peft import LoraConfig, get_peft_model

    language = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj)"
    old = {"language": language,
           "language_vision": r".*(language_model.*\.(q_proj|k_proj|v_proj|o_proj)|vision_tower.*\.(q_proj|k_proj|v_proj|projection_layer))",
           "all_linear": "all-linear"}
    new = {"language": ({}, "attention"), "language_vision": ({"vision": "lora"}, "attention"),
           "all_linear": ({"vision": "lora", "projector": "lora"}, "all_linear")}
    for target, regex in old.items():
        names = {n for n, p in TeoLoraModule(name_or_path="tiny", lora={"target": target}).named_parameters() if p.requires_grad}
        before = get_peft_model(build_tiny_internvl(seed=0)[0], LoraConfig(r=16, target_modules=regex))
        assert names == {"model." + n for n, p in before.named_parameters() if p.requires_grad}, target
        parts, layers = new[target]
        module = TeoLoraModule(name_or_path="tiny", train_parts=parts, lora={"layers": layers})
        assert names == {n for n, p in module.named_parameters() if p.requires_grad}, target
    # the MiniLM decoder (BERT names, a pooler): all_linear as PEFT's all-linear made it
    base = build_minilm_internvl(seed=0)[0]
    got = trainable(apply_train_parts(base, {"vision": "lora", "projector": "lora", "language": "lora"}, {"layers": "all_linear"}))
    peft_all = get_peft_model(build_minilm_internvl(seed=0)[0], LoraConfig(r=16, target_modules="all-linear"))
    assert got == trainable(peft_all) and "model.language_model.pooler.dense.lora_A" in got


def test_bad_values_name_the_key():
    cases = [({"train_parts": {"vision": "partial"}}, r"model.train_parts.vision must be one of frozen, lora, full, got 'partial'"),
             ({"train_parts": {"text": "lora"}}, r"model.train_parts has no part 'text'; the parts are vision, projector, language"),
             ({"train_parts": {"language": "frozen"}}, r"model.train_parts: every part is frozen"),
             ({"lora": {"layers": "mlp"}}, r"model.lora.layers must be one of attention, all_linear, got 'mlp'"),
             ({"lora": {"target": "everything"}}, r"model.lora.target='everything' is not one of the old bundles .*model.train_parts"),
             ({"lora": {"target": "language"}, "train_parts": {"language": "lora"}},
              r"model.lora.target='language' \(old bundle\) and model.train_parts are both set")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            TeoLoraModule(name_or_path="tiny", **kwargs)


def test_configs_state_the_parts(compose_train):
    cfg = compose_train("experiment=teo_lora_internvl", "model=internvl_tiny")
    assert dict(cfg.model.train_parts) == {"vision": "frozen", "projector": "frozen", "language": "lora"}
    assert cfg.model.lora.layers == "attention" and "target" not in cfg.model.lora
    cfg = compose_train("experiment=teo_lora_synthetic")
    assert dict(cfg.model.train_parts) == {"vision": "lora", "projector": "lora", "language": "lora"}
    assert cfg.model.lora.layers == "all_linear"
    cfg = compose_train("experiment=teo_lora_internvl", "model=internvl_tiny", "model.train_parts.projector=full",
                        "model.train_parts.language=frozen")
    assert dict(cfg.model.train_parts) == {"vision": "frozen", "projector": "full", "language": "frozen"}
