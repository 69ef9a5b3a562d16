"""InternVL LoRA fine-tuning for TEO: data (prompt masking, bucketing), LoRA module, adapter, train.py."""
from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest
import torch

from conftest import TINY_SYNTHETIC
from data_modules.images import ImageLoadError
from data_modules.sources import synthetic_source
from data_modules.sampling import LengthBucketBatchSampler
from data_modules.teo_pairs import IGNORE_INDEX, TeoChatCollator, TeoPairsDataModule
from seqaware import runs
from seqaware.modules.teo_lora import TeoLoraModule
from seqaware.pretrained import PretrainedUnavailableError
from seqaware.vlm.prompts import prompt_text
from seqaware.vlm.models import build_tiny_internvl, internvl_config_8b, load_internvl, load_processor


@pytest.fixture(scope="module")
def teo_dm(tmp_path_factory) -> TeoPairsDataModule:
    cache = tmp_path_factory.mktemp("teo_cache")
    source = partial(synthetic_source, str(cache / "synthetic"), progress=False, **TINY_SYNTHETIC)
    dm = TeoPairsDataModule(source, processor=load_processor("tiny"), modality="image_text", batch_size=4, eval_batch_size=4)
    dm.setup()
    return dm


def _train_batch(dm: TeoPairsDataModule, n: int = 4) -> dict:
    pairs = dm.datasets["train"].items
    picked = [p for p in pairs if p["label"] == "independent"][:2] + [p for p in pairs if p["label"] != "independent"][: n - 2]
    return dm.collator(train=True)(picked)


def _tiny_module(**kwargs) -> TeoLoraModule:
    opt = {"_target_": "torch.optim.AdamW", "lr": 1e-2, "weight_decay": 0.0}
    return TeoLoraModule(name_or_path="tiny", lora={"r": 16, "alpha": 32, "dropout": 0.0, "target": "language"},
                         optimizer=opt, **kwargs)


def test_labels_are_the_answer_tokens_only(teo_dm):
    batch = _train_batch(teo_dm)
    proc = teo_dm.processor
    collator = teo_dm.collator(train=True)
    # MATEO Table 6: the fine-tuning target is three "Qk: The answer is: Yes/No." lines
    answers = {"before": "Q1: The answer is: Yes.\nQ2: The answer is: No.\nQ3: The answer is: No.",
               "after": "Q1: The answer is: No.\nQ2: The answer is: Yes.\nQ3: The answer is: No.",
               "independent": "Q1: The answer is: No.\nQ2: The answer is: No.\nQ3: The answer is: Yes."}
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert batch["pixel_values"].shape[0] == 2 * ids.shape[0]  # 64-px pictures: one 56-px tile each (too small for a grid)
    for row, pair in enumerate(batch["pairs"]):
        # independent check: the prompt alone, tokenised by the processor, is the unlabelled prefix
        prompt_msgs = collator.messages(pair, with_answer=False)
        prompt_text = proc.apply_chat_template(prompt_msgs, tokenize=False, add_generation_prompt=True)
        images = [c["image"] for m in prompt_msgs for c in m["content"] if c["type"] == "image"]
        n_prompt = proc(text=[prompt_text], images=images, return_tensors="pt")["input_ids"].shape[1]
        length = int(mask[row].sum())
        assert torch.equal(ids[row, :n_prompt], proc(text=[prompt_text], images=images, return_tensors="pt")["input_ids"][0])
        assert (labels[row, :n_prompt] == IGNORE_INDEX).all()
        assert (labels[row, length:] == IGNORE_INDEX).all()  # right padding
        assert torch.equal(labels[row, n_prompt:length], ids[row, n_prompt:length])
        target = proc.tokenizer.decode(labels[row, n_prompt:length])
        assert target == answers[pair["label"]] + "<|im_end|>\n"
    # the image context tokens are never labelled
    assert not (labels == proc.image_token_id).any()


def test_training_prompt_is_mateo_table6(teo_dm):
    pair = teo_dm.datasets["train"].items[0]
    msgs = teo_dm.collator(train=True).messages(pair, with_answer=True)
    assert [m["role"] for m in msgs] == ["user", "assistant"]  # Table 6: <User> / <Assistant>, no system turn
    user = prompt_text(msgs[:1])
    # Table 6 Image-Text: rules, sequencing-terms rule + "Also note", steps, Questions; no answer-format block
    assert user.startswith("Your task is to determine the dependency order between two steps in a recipe. "
                           "Follow these rules:\n- Before: Step A must be executed before Step B if")
    assert "Ignore sequencing terms" in user and "Also note that the text description" in user
    assert "Using ONLY" not in user and "Context:" not in user
    assert user.endswith("Questions:\nQ1: Must Step A be executed before Step B?\nQ2: Must Step A be executed "
                         "after Step B?\nQ3: Can Step A and Step B be executed in parallel?")
    assert user.index("Step A picture:") < user.index("Step A description:") < user.index("Step B picture:")


def test_prompt_and_target_options(teo_dm):
    pair = next(p for p in teo_dm.datasets["train"].items if p["label"] == "after")
    short = TeoChatCollator(teo_dm.processor, "text", "baseline", prompt="eval", target_format="short")
    msgs = short.messages(pair, with_answer=True)
    assert msgs[-1]["content"][0]["text"] == "Q1: No\nQ2: Yes\nQ3: No"
    assert prompt_text(msgs[:-1]).startswith("Using ONLY the information in the Context")  # Table 5 Baseline
    with pytest.raises(ValueError, match="data.prompt=finetune .* needs data.strategy=instructions"):
        TeoChatCollator(teo_dm.processor, "text", "baseline")
    with pytest.raises(ValueError, match="data.target_format"):
        TeoChatCollator(teo_dm.processor, "text", target_format="long")
    with pytest.raises(ValueError, match="data.prompt"):
        TeoChatCollator(teo_dm.processor, "text", prompt="table7")
    bad = dict(pair, label="sideways")
    with pytest.raises(ValueError, match=rf"{pair['pair_id']}, field label: unknown TEO label 'sideways'"):
        short.messages(bad, with_answer=True)


def test_eval_batches_are_left_padded_prompts(teo_dm):
    loader = teo_dm.val_dataloader()
    batch = next(iter(loader))
    assert "labels" not in batch
    assert (batch["attention_mask"][:, -1] == 1).all()
    tail = teo_dm.processor.tokenizer.decode(batch["input_ids"][0, -8:])
    assert tail.endswith("<|im_start|>assistant\n")
    # original pairs are interleaved with their swapped twins (prefixes hold complete pairs)
    sets = [p["set"] for p in batch["pairs"]]
    assert sets == ["original", "swapped"] * (len(sets) // 2)
    assert batch["pairs"][1]["pair_id"] == batch["pairs"][0]["pair_id"] + ":swapped"


def test_missing_image_names_pair_and_field(teo_dm):
    pair = dict(teo_dm.datasets["train"].items[0])
    pair["step_b"] = dict(pair["step_b"], images=["/nonexistent/picture.png"])
    with pytest.raises(ImageLoadError, match=rf"{pair['pair_id']}.*step_b\.images\[0\].*picture\.png"):
        teo_dm.collator(train=True)([pair])
    pair["step_b"] = dict(pair["step_b"], images=[])
    with pytest.raises(ValueError, match=rf"{pair['pair_id']}.*step_b\.images"):
        teo_dm.collator(train=True)([pair])
    with pytest.raises(ValueError, match="data.modality"):
        TeoChatCollator(teo_dm.processor, modality="video")


def test_length_bucket_sampler_covers_each_item_once_and_groups_lengths():
    lengths = torch.randint(0, 1000, (103,)).tolist()
    sampler = LengthBucketBatchSampler(lengths, batch_size=8, bucket_factor=4, seed=3)
    sampler.set_epoch(2)
    batches = [[i for i, epoch in b] for b in sampler]
    assert len(batches) == len(sampler)
    assert sorted(i for b in batches for i in b) == list(range(103))
    assert all(e == 2 for b in sampler for _, e in b)
    assert batches == [[i for i, _ in b] for b in sampler]  # a pure function of (seed, epoch)
    sampler.set_epoch(3)
    assert batches != [[i for i, _ in b] for b in sampler]
    # padding per batch is far below that of random batches of the same size
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches)
    rand = torch.randperm(103, generator=torch.Generator().manual_seed(0)).tolist()
    rand_spread = sum(max(lengths[i] for i in rand[k:k + 8]) - min(lengths[i] for i in rand[k:k + 8]) for k in range(0, 103, 8))
    assert spread < rand_spread / 2
    # two ranks: disjoint shards of the same number of batches covering everything
    shards = [LengthBucketBatchSampler(lengths, 8, 4, seed=3, num_replicas=2, rank=r) for r in range(2)]
    ids = [[i for b in s for i, _ in b] for s in shards]
    assert len(list(shards[0])) == len(list(shards[1])) == len(shards[0])
    assert set(ids[0]) | set(ids[1]) == set(range(103))


def test_lora_targets_language_attention_only():
    module = _tiny_module()
    lora_names = [n for n, p in module.named_parameters() if p.requires_grad]
    assert lora_names and all("lora_" in n and ".language_model." in n for n in lora_names)
    assert {n.split(".lora_")[0].rsplit(".", 1)[1] for n in lora_names} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    vision = TeoLoraModule(name_or_path="tiny", lora={"target": "language_vision"})
    assert any("vision_tower" in n and "lora_" in n for n, p in vision.named_parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="model.lora.target"):
        TeoLoraModule(name_or_path="tiny", lora={"target": "everything"})


def test_lora_under_autocast_skips_the_float32_input_copy_and_changes_nothing():
    """A bfloat16 base with float32 adapters: under autocast the adapters take the bfloat16 activation as it
    is (no float32 copy), and the loss and every adapter gradient are bit-identical to PEFT's own cast."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from seqaware.vlm.models import answer_loss, apply_lora

    torch.manual_seed(0)
    model = apply_lora(build_tiny_internvl(seed=0)[0].to(torch.bfloat16), {"r": 4, "alpha": 8, "dropout": 0.1})
    model.eval()  # dropout off: the two paths then see the same numbers
    g = torch.Generator().manual_seed(0)
    cfg = model.config
    ids = torch.randint(0, cfg.text_config.vocab_size, (2, 24), generator=g)
    ids[ids == cfg.image_token_id] = 0
    labels = torch.full_like(ids, -100)
    labels[:, -4:] = ids[:, -4:]
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer) and hasattr(m, "lora_A")]
    assert layers and all("_cast_input_dtype" in m.__dict__ for m in layers)
    seen: list[torch.dtype] = []
    hook = layers[0].lora_A["default"].register_forward_pre_hook(lambda mod, args: seen.append(args[0].dtype))

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = answer_loss(model, inputs, labels)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    loss, grads = loss_and_grads()
    assert seen == [torch.bfloat16]  # the activation as it came, not a float32 copy
    for m in layers:  # PEFT's own behaviour: cast the input to the adapter's float32
        del m.__dict__["_cast_input_dtype"]
    seen.clear()
    ref_loss, ref_grads = loss_and_grads()
    hook.remove()
    assert seen == [torch.float32]
    assert torch.equal(loss, ref_loss)
    assert grads.keys() == ref_grads.keys() and all(torch.equal(grads[n], ref_grads[n]) for n in grads)


def test_lora_without_autocast_still_casts_for_its_float32_adapters():
    from seqaware.vlm.models import answer_loss, apply_lora

    model = apply_lora(build_tiny_internvl(seed=0)[0].to(torch.bfloat16), {"r": 4})
    ids = torch.randint(1, 50, (1, 12), generator=torch.Generator().manual_seed(0))
    ids[ids == model.config.image_token_id] = 1
    labels = torch.full_like(ids, -100)
    labels[:, -2:] = ids[:, -2:]
    loss = answer_loss(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, labels)
    assert torch.isfinite(loss)


def test_one_step_lowers_loss_and_changes_only_lora(teo_dm):
    module = _tiny_module()
    batch = _train_batch(teo_dm)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    optimizer = module.configure_optimizers()
    module.train()
    loss0 = module(batch).loss
    loss0.backward()
    optimizer.step()
    with torch.no_grad():
        loss1 = module(batch).loss
    assert loss1 < loss0
    changed = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert {n for n, p in module.named_parameters() if p.requires_grad} >= changed


def test_saved_adapter_reloads_with_identical_logits(teo_dm, tmp_path):
    from peft import PeftModel

    module = _tiny_module()
    batch = _train_batch(teo_dm)
    optimizer = module.configure_optimizers()
    for _ in range(2):  # lora_B starts at zero: train so that the adapter matters
        module(batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    module.eval()
    path = module.save_adapter(tmp_path / "adapter")
    assert (path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file()
    base, _ = build_tiny_internvl(seed=0)
    reloaded = PeftModel.from_pretrained(base, str(path)).eval()
    inputs = module._inputs(batch)
    with torch.no_grad():
        expected = module.model(**inputs).logits
        got = reloaded(**inputs).logits
        plain = build_tiny_internvl(seed=0)[0].eval()(**inputs).logits
    assert torch.equal(got, expected)
    assert not torch.allclose(plain, expected)  # the trained adapter changes the output


def test_merged_model_matches_adapter(teo_dm, tmp_path):
    from transformers import InternVLForConditionalGeneration

    module = _tiny_module(merge_adapter=True)
    batch = _train_batch(teo_dm)
    optimizer = module.configure_optimizers()
    for _ in range(2):
        module(batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    module.eval()
    path = module.save_adapter(tmp_path / "adapter")
    merged = InternVLForConditionalGeneration.from_pretrained(str(path / "merged")).eval()
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        assert torch.allclose(merged(**module._inputs(batch)).logits, module.model(**module._inputs(batch)).logits, atol=1e-5)
    assert (path / "merged" / "tokenizer.json").is_file()  # the processor travels with the merged model


def test_fsdp_trainer_config_instantiates(compose_train):
    from hydra.utils import instantiate
    from pytorch_lightning.strategies import FSDPStrategy

    cfg = compose_train("experiment=teo_lora_internvl", "trainer=fsdp")
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.kwargs["use_orig_params"] is True


def test_checkpoint_holds_lora_weights_only(teo_dm):
    module = _tiny_module()
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    assert set(checkpoint["state_dict"]) == {n for n, p in module.named_parameters() if p.requires_grad}
    module.on_load_checkpoint(checkpoint)  # consistent: no error
    checkpoint["state_dict"].pop(next(iter(checkpoint["state_dict"])))
    with pytest.raises(ValueError, match="LoRA parameters"):
        module.on_load_checkpoint(checkpoint)


def test_internvl_8b_config_has_the_published_size():
    from transformers import InternVLForConditionalGeneration

    cfg = internvl_config_8b()
    with torch.device("meta"):
        model = InternVLForConditionalGeneration(cfg)
    vision = sum(p.numel() for p in model.model.vision_tower.parameters())
    language = sum(p.numel() for p in model.model.language_model.parameters()) + model.lm_head.weight.numel()
    assert 0.28e9 < vision < 0.32e9            # InternViT-300M
    assert 8.0e9 < language < 8.3e9            # Qwen3-8B (8.2B with the untied head)
    assert cfg.image_seq_length == (448 // 14) ** 2 // 4 == 256


def test_named_checkpoint_fails_fast_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(PretrainedUnavailableError, match="model.name_or_path"):
        load_internvl("OpenGVLab/InternVL3_5-8B-HF")
    assert time.monotonic() - start < 10


def test_teo_lora_experiments_compose_to_the_mateo_recipe(compose_train):
    cfg = compose_train("experiment=teo_lora_internvl", "model=internvl_tiny")
    assert cfg.callbacks.model_checkpoint.monitor == "val/teo_consistency_accuracy"
    assert cfg.model.optimizer.lr == 1e-5 and cfg.trainer.max_epochs == 1  # hparams/mateo
    cfg = compose_train("experiment=teo_lora_synthetic")
    assert cfg.model.name_or_path == cfg.data.processor.name_or_path == "tiny-minilm"
    assert cfg.data.max_length == 512 and cfg.trainer.accelerator == "cpu"


def test_mateo_fast_and_modality_sweep_compose(compose_train):
    cfg = compose_train("experiment=teo_lora_internvl", "model=internvl_tiny", "hparams=mateo_fast")
    assert cfg.data.batch_size == 8 and cfg.data.bucket_by_length
    assert cfg.model.optimizer.lr == pytest.approx(1e-5 * 8 ** 0.5, rel=1e-3)
    sweep = compose_train("experiment=teo_lora_modalities", "model=internvl_tiny")
    assert sweep.data.modality == "image_text"


@pytest.mark.slow
def test_short_run_saves_best_adapter_and_checkpoint_reloads(compose_train, tmp_path):
    """A short real fit: best checkpoint (LoRA weights only) -> adapter/ and load_from_checkpoint agree."""
    import json

    from peft import PeftModel
    from safetensors.torch import load_file

    import train

    cfg = compose_train("experiment=teo_lora_internvl", "model=internvl_tiny", "trainer.precision=32-true",
                        "data.modality=text", "trainer.max_epochs=2", "data.batch_size=8", "data.max_train_pairs=48",
                        "data.eval_batch_size=8", "data.max_eval_pairs=4", "model.optimizer.lr=3e-3",
                        "model.tiny.init_range=0.1", "model.lora.dropout=0.0")
    datamodule, module, trainer = train.build(cfg)
    trainer.fit(module, datamodule=datamodule)
    best = runs.best_checkpoint(trainer)
    assert best is not None
    state = torch.load(best, map_location="cpu", weights_only=False)
    assert "val/teo_consistency_accuracy" in str(state["callbacks"])
    assert set(state["state_dict"]) == {n for n, p in module.named_parameters() if p.requires_grad}
    # adapter/ holds the best checkpoint's LoRA weights in PEFT format
    out = Path(cfg.paths.output_dir)
    adapter = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert len(adapter) == len(state["state_dict"])
    for key, value in state["state_dict"].items():
        peft_key = key[len("model."):].replace(".default.weight", ".weight")
        assert torch.equal(adapter[peft_key], value)
    # the module rebuilds itself from its hyper-parameters: same logits as the adapter on a fresh base
    reloaded = TeoLoraModule.load_from_checkpoint(best).eval()
    base, _ = build_tiny_internvl(seed=0, **cfg.model.tiny)
    peft_model = PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    batch = datamodule.collator(train=True)(datamodule.datasets["train"].items[:2])
    with torch.no_grad():
        assert torch.equal(reloaded(batch).logits, peft_model(**reloaded._inputs(batch)).logits)
    trainer.test(reloaded, datamodule=datamodule)
    records = reloaded.test_predictions
    assert len(records) == 2 * 4 and {r["set"] for r in records} == {"original", "swapped"}
    assert all(r["pred"] in ("before", "after", "independent", "other") for r in records)
    json.dumps(records)  # train.py writes them as JSON lines


# ------------------------------------------------------------- the MiniLM-decoder InternVL (tiny-minilm)
@pytest.fixture(scope="module")
def minilm_module() -> TeoLoraModule:
    return TeoLoraModule(name_or_path="tiny-minilm", lora={"r": 8, "alpha": 16, "dropout": 0.0, "target": "language"},
                         optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-2, "weight_decay": 0.0})


@pytest.fixture(scope="module")
def minilm_dm(tmp_path_factory) -> TeoPairsDataModule:
    cache = tmp_path_factory.mktemp("teo_minilm_cache")
    source = partial(synthetic_source, str(cache / "synthetic"), progress=False, **TINY_SYNTHETIC)
    dm = TeoPairsDataModule(source, processor=load_processor("tiny-minilm"), modality="text", batch_size=4, eval_batch_size=4,
                            max_length=512)
    dm.setup()
    return dm


def test_minilm_internvl_is_the_pretrained_bert_as_a_decoder(minilm_module):
    from transformers import BertModel

    from seqaware.pretrained import resolve_name

    base = minilm_module.model.get_base_model()
    bert = BertModel.from_pretrained(resolve_name("offline:minilm"))
    lm = base.model.language_model
    assert lm.config.is_decoder
    layer = lm.encoder.layer[3]
    assert torch.equal(layer.attention.self.query.base_layer.weight, bert.encoder.layer[3].attention.self.query.weight)
    assert torch.equal(layer.output.dense.weight, bert.encoder.layer[3].output.dense.weight)
    words = bert.embeddings.word_embeddings.weight
    assert torch.equal(lm.embeddings.word_embeddings.weight[: words.shape[0]], words)
    assert torch.allclose(base.lm_head.weight[: words.shape[0]], 4.0 * words)  # head_scale 4
    # the chat markers start as BERT's boundary tokens, so the head can learn to emit <|im_end|>
    tok = minilm_module.processor.tokenizer
    table = lm.embeddings.word_embeddings.weight
    assert torch.equal(table[tok.convert_tokens_to_ids("<|im_end|>")], words[tok.convert_tokens_to_ids("[SEP]")])
    assert torch.equal(table[tok.convert_tokens_to_ids("<|im_start|>")], words[tok.convert_tokens_to_ids("[CLS]")])
    # LoRA sits on the attention projections only (BERT's names for q/k/v/o)
    wrapped = {n.split(".lora_A")[0] for n, _ in minilm_module.named_parameters() if ".lora_A" in n}
    assert {w.split("layer.")[1].split(".", 1)[1] for w in wrapped} == {
        "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"}
    assert len(wrapped) == 4 * 6


def test_minilm_decoder_is_causal_and_left_padding_safe(minilm_module):
    """A decoder must not see later tokens, and generation in a left-padded batch must match generating alone."""
    module = minilm_module.eval()
    tok = module.processor.tokenizer
    ids = tok(["<|im_start|>user\nstep a description : put a red block on the floor .<|im_end|>\n"], return_tensors="pt")["input_ids"]
    lm = module.model.get_base_model().model.language_model
    with torch.no_grad():
        full = lm(input_ids=ids).last_hidden_state
        prefix = lm(input_ids=ids[:, :6]).last_hidden_state
    assert torch.allclose(full[:, :6], prefix, atol=1e-5)
    prompts = ["<|im_start|>user\nq1 : must step a be executed before step b ?<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]
    batch = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    alone = tok(prompts[1:], return_tensors="pt")
    with torch.no_grad():
        together = module.model.generate(**batch, max_new_tokens=6, do_sample=False)[1, batch["input_ids"].shape[1]:]
        single = module.model.generate(**alone, max_new_tokens=6, do_sample=False)[0, alone["input_ids"].shape[1]:]
    assert together.tolist() == single.tolist()


def test_minilm_labels_decode_to_a_parsable_answer(minilm_dm):
    from seqaware.vlm import parse_teo_answer

    batch = minilm_dm.collator(train=True)(minilm_dm.datasets["train"].items[:4])
    tok = minilm_dm.processor.tokenizer
    assert not (batch["input_ids"][:, 0] == tok.convert_tokens_to_ids("[CLS]")).any()  # no BERT [CLS] ... [SEP]
    for row, pair in enumerate(batch["pairs"]):
        answer = tok.decode(batch["labels"][row][batch["labels"][row] != IGNORE_INDEX], skip_special_tokens=True)
        assert parse_teo_answer(answer, "instructions") == pair["label"]


def test_answer_loss_equals_the_full_logits_loss(minilm_module, minilm_dm, teo_dm):
    for module, dm in ((minilm_module, minilm_dm), (_tiny_module(), teo_dm)):
        module.eval()
        batch = dm.collator(train=True)(dm.datasets["train"].items[:4])
        with torch.no_grad():
            assert module.answer_loss(batch).item() == pytest.approx(module(batch).loss.item(), rel=1e-5)


def test_minilm_lora_step_lowers_the_loss(minilm_dm):
    module = TeoLoraModule(name_or_path="tiny-minilm", lora={"r": 8, "alpha": 16, "dropout": 0.0, "target": "language"},
                           optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-2, "weight_decay": 0.0})
    batch = minilm_dm.collator(train=True)(minilm_dm.datasets["train"].items[:4])
    optimizer = module.configure_optimizers()
    module.eval()  # no dropout: compare the same function before and after the step
    loss0 = module.answer_loss(batch)
    loss0.backward()
    optimizer.step()
    with torch.no_grad():
        assert module.answer_loss(batch) < loss0


def test_prompt_longer_than_the_minilm_positions_is_a_clear_error(minilm_dm):
    collator = minilm_dm.collator(train=True)
    pair = dict(minilm_dm.datasets["train"].items[0])
    pair["step_a"] = dict(pair["step_a"], text="stack the blocks " * 200)
    with pytest.raises(ValueError, match="data.max_length=512"):
        collator([pair])
