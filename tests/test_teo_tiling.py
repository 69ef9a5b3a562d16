"""One image preprocessing for TEO (issue #61): training, its in-training test, the saved adapter, the merged
model and scripts/tools/eval_teo.py build the same inputs from data.image_tiles (seqaware/vlm/inputs.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from data_modules.tasks.teo import teo_eval_sets
from data_modules.teo_pairs import TeoChatCollator, TeoPairsDataModule
from seqaware.modules.teo_lora import TeoLoraModule
from seqaware.procedure import Procedure, Step
from seqaware.vlm.inputs import apply_tiling, read_record, tiling_kwargs
from seqaware.vlm.models import load_processor
from seqaware.vlm.protocols.teo import teo_queries

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["Mix the flour and the water.", "Knead the dough.", "Grate the cheese."]
MAX_NEW_TOKENS = 12


def _load_script():
    spec = importlib.util.spec_from_file_location("eval_teo_script", ROOT / "scripts" / "tools" / "eval_teo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def procedure(tmp_path_factory) -> Procedure:
    """3 steps with 150 x 100 noise pictures (3 x 2 tiles + a thumbnail at 56 px), DAG 0 -> 1."""
    root = tmp_path_factory.mktemp("tiling")
    (root / "images").mkdir()
    g = torch.Generator().manual_seed(0)
    steps = []
    for i, text in enumerate(TEXTS):
        pixels = (torch.rand(100, 150, 3, generator=g) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(root / "images" / f"s{i}.png")
        steps.append(Step(text=text, images=[f"images/s{i}.png"]))
    return Procedure(id="p", steps=steps, split="test", dag=[(0, 1)], root=str(root))


def _datamodule(procedure: Procedure, modality: str, **kwargs) -> TeoPairsDataModule:
    splits = {"train": [procedure], "val": [procedure], "test": [procedure]}
    dm = TeoPairsDataModule(lambda **_: splits, processor=load_processor("tiny"), modality=modality,
                            verify_images=False, **kwargs)
    dm.setup()
    return dm


def test_training_test_adapter_and_merged_model_answer_identically(procedure, tmp_path):
    """Greedy answers of the in-training test path (collator -> TeoLoraModule.generate_answers) equal those of
    eval_teo's path (HFGenerator on the saved adapter folder and on the merged model, settings read from the
    folder), for image-only and image+text pairs, with the LoRA recipe's prompt; the inputs are equal tensors."""
    script = _load_script()
    from seqaware.vlm.runner import load_hf_generator

    module = TeoLoraModule(name_or_path="tiny", tiny={"init_range": 0.1}, merge_adapter=True, lora={"dropout": 0.0},
                           max_new_tokens=MAX_NEW_TOKENS, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-2})
    dm = _datamodule(procedure, "image_text")
    module(dm.collator(train=True)(dm.datasets["train"].items[:2])).loss.backward()
    module.configure_optimizers().step()  # one step: lora_B leaves zero, so the adapter matters
    module.eval()
    adapter = module.save_adapter(tmp_path / "adapter")
    generators = {}
    for folder in (adapter, adapter / "merged"):
        cfg = script.parse_config(["--model", str(folder), "--synthetic"])
        prompt, tiles, strategies = script.model_inputs(cfg)  # from the folder's seqaware_inputs.json
        assert (prompt, tiles, strategies) == ("finetune", 12, ["instructions"])
        generators[folder.name] = load_hf_generator(str(folder), max_new_tokens=MAX_NEW_TOKENS, dtype="float32",
                                                    device="cpu", image_tiles=tiles)
    assert type(generators["adapter"].model).__name__ == "PeftModel"
    sets = teo_eval_sets([procedure])
    for modality in ("image", "image_text"):
        dm = _datamodule(procedure, modality)
        pairs = dm.datasets["test"].items  # originals and their swapped twins
        trained = dm.collator(train=False)(pairs)
        assert trained["pixel_values"].shape[0] == 2 * len(pairs) * 7  # 3 x 2 tiles + thumbnail per picture
        expected = [a.strip() for a in module.generate_answers(trained)]
        one_tile = TeoChatCollator(dm.processor, modality, train=False, image_tiles=1)(pairs)
        assert [a.strip() for a in module.generate_answers(one_tile)] != expected  # the tiling shows in the answers
        for name, generator in generators.items():
            by_key = {(q.set_name, q.item_id): q for q in
                      teo_queries(sets, "instructions", modality, generator.signature, procedure.root, prompt="finetune")}
            messages = [by_key[(p["set"], p["pair_id"])].messages for p in pairs]
            built = generator.inputs(messages)
            assert torch.equal(built["input_ids"], trained["input_ids"]), (name, modality)
            assert torch.equal(built["pixel_values"], trained["pixel_values"]), (name, modality)
            assert generator(messages) == expected, (name, modality)


def test_default_tiling_is_internvls_and_one_value_sets_every_path(procedure, tmp_path):
    processor = load_processor("tiny")
    picture = Image.open(Path(procedure.root) / "images" / "s0.png")

    def tiles(proc, **kwargs) -> int:
        return proc(text=["<IMG_CONTEXT>"], images=[picture], return_tensors="pt", **kwargs)["pixel_values"].shape[0]

    assert tiles(processor) == tiles(processor, images_kwargs=tiling_kwargs(12)) == 7  # InternVL's own default
    assert tiles(processor, images_kwargs=tiling_kwargs(1)) == 1
    assert tiles(processor, images_kwargs=tiling_kwargs(4)) == 5  # a 2 x 2 grid + the thumbnail
    for bad in (0, -3, "12", True, 2.0):
        with pytest.raises(ValueError, match="data.image_tiles must be a whole number of tiles"):
            tiling_kwargs(bad)
    # the collator follows data.image_tiles
    pair = _datamodule(procedure, "image", image_tiles=1).datasets["test"].items[0]
    one = TeoChatCollator(processor, "image", train=False, image_tiles=1)([pair])
    assert one["pixel_values"].shape[0] == 2
    # a processor saved with a tiling tiles that way when called plainly (the merged model's folder)
    for n, expect in ((1, 1), (4, 5)):
        apply_tiling(processor, n).save_pretrained(tmp_path / f"p{n}")
        assert tiles(load_processor(str(tmp_path / f"p{n}"))) == expect


def test_image_tiles_is_one_config_value_the_module_follows(compose_train):
    cfg = compose_train("experiment=teo_lora_internvl", "model=internvl_tiny")
    assert cfg.data.image_tiles == cfg.model.image_tiles == 12
    assert cfg.model.prompt == cfg.data.prompt == "finetune"
    cfg = compose_train("experiment=teo_lora_internvl", "model=internvl_tiny", "data.image_tiles=1")
    assert cfg.model.image_tiles == 1
    module = TeoLoraModule(name_or_path="tiny", image_tiles=12)
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(image_tiles=1, prompt="finetune"))
    with pytest.raises(ValueError, match=r"model.image_tiles=12 but data.image_tiles=1"):
        module.setup("fit")
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(image_tiles=12, prompt="eval"))
    with pytest.raises(ValueError, match=r"model.prompt='finetune' but data.prompt='eval'"):
        module.setup("fit")
    with pytest.raises(ValueError, match="model.image_tiles must be a whole number"):
        TeoLoraModule(name_or_path="tiny", image_tiles=0)


def test_checkpoint_from_before_the_option_records_one_tile():
    module = TeoLoraModule(name_or_path="tiny")
    state = {n: p.detach() for n, p in module.named_parameters() if p.requires_grad}
    module.on_load_checkpoint({"state_dict": state, "hyper_parameters": {"name_or_path": "tiny", "lora": {"target": "language"}}})
    assert module.hparams.image_tiles == 1 and module.inputs_record()["image_tiles"] == 1
    assert module.processor.image_processor.max_patches == 1
    module = TeoLoraModule(name_or_path="tiny")
    module.on_load_checkpoint({"state_dict": state, "hyper_parameters": {"image_tiles": 12}})
    assert module.hparams.image_tiles == 12


def test_eval_teo_reads_the_folder_and_refuses_a_run_folder(tmp_path):
    script = _load_script()
    from seqaware.vlm.inputs import write_record
    from seqaware.vlm.runner import load_hf_generator

    folder = tmp_path / "run" / "adapter"
    write_record(folder, {"image_tiles": 4, "prompt": "finetune", "base_model": "tiny"})
    assert read_record(folder)["image_tiles"] == 4
    base = ["--model", str(folder), "--synthetic"]
    assert script.model_inputs(script.parse_config(base)) == ("finetune", 4, ["instructions"])
    assert script.model_inputs(script.parse_config(base + ["--prompt", "eval", "--image-tiles", "1"])) == (
        "eval", 1, ["baseline", "instructions", "icl", "cot", "self_reflection"])
    assert script.model_inputs(script.parse_config(["--model", "some/hub-model", "--synthetic"])) == (
        "eval", None, ["baseline", "instructions", "icl", "cot", "self_reflection"])
    with pytest.raises(ValueError, match=r"is a run folder: give .*run/adapter .*run/adapter/merged"):
        load_hf_generator(str(tmp_path / "run"), device="cpu")
    write_record(folder, {"image_tiles": 0})
    with pytest.raises(ValueError, match="image_tiles must be a whole number"):
        read_record(folder)
