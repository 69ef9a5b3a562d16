"""TEO / ISO / COHERENCE prompts: markers, image slots and errors for every strategy x modality."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from PIL import Image

from seqaware.teo import MODALITIES, STRATEGIES, build_coherence_prompt, build_iso_prompt, build_teo_prompt, prompt_hash
from seqaware.teo.prompts import load_templates, prompt_images, prompt_text

STEP_A = {"text": "First, mix the flour with the water.", "image": "/data/a.jpg"}
STEP_B = {"text": "Finally, knead the dough.", "image": "/data/b.jpg"}
COMBOS = list(itertools.product(STRATEGIES, MODALITIES))
QUESTIONS = ("Q1: Must Step A be executed before Step B?", "Q2: Must Step A be executed after Step B?",
             "Q3: Can Step A and Step B be executed in parallel")


def _user(messages):
    users = [m for m in messages if m["role"] == "user"]
    assert len(users) == 1
    return users[0]["content"]


@pytest.mark.parametrize("strategy,modality", COMBOS)
def test_markers_and_image_slots(strategy, modality):
    messages = build_teo_prompt(strategy, modality, STEP_A, STEP_B)
    assert [m["role"] for m in messages] == ["system", "user"]
    for m in messages:
        assert all(item["type"] in ("text", "image") for item in m["content"])
        assert all(item["text"] for item in m["content"] if item["type"] == "text")
    content = _user(messages)
    text = prompt_text(messages)
    images = [item["image"] for item in content if item["type"] == "image"]
    shows_image, shows_text = modality != "text", modality != "image"

    assert images == (["/data/a.jpg", "/data/b.jpg"] if shows_image else [])
    assert prompt_images(messages) == images
    for name in "AB":
        assert text.count(f"Step {name} picture:") == (1 if shows_image else 0)
        # icl examples are text-only: they carry their own descriptions
        extra = 3 if strategy == "icl" else 0
        assert text.count(f"Step {name} description:") == (1 if shows_text else 0) + extra
    assert (STEP_A["text"] in text) == shows_text and (STEP_B["text"] in text) == shows_text
    if shows_image:  # each picture marker directly precedes its image slot
        for k, item in enumerate(content):
            if item["type"] == "image":
                assert content[k - 1]["type"] == "text"
                marker = "Step A picture:" if item["image"] == "/data/a.jpg" else "Step B picture:"
                assert content[k - 1]["text"].rstrip().endswith(marker)
    for q in QUESTIONS:
        assert q in text
    assert ("Ignore sequencing words" in text) == shows_text
    assert ("first, then" in text) == shows_text
    assert ("may also mention actions of other steps" in text) == (modality == "image_text")
    # Step A is presented before Step B
    marker = "picture:" if shows_image else "description:"
    assert text.rindex(f"Step A {marker}") < text.rindex(f"Step B {marker}")


@pytest.mark.parametrize("modality", MODALITIES)
def test_strategy_specific_instructions(modality):
    text = {s: prompt_text(build_teo_prompt(s, modality, STEP_A, STEP_B)) for s in STRATEGIES}
    for s in ("baseline", "instructions", "icl"):
        assert "Q1: Yes or No" in text[s] and "The answer is:" not in text[s]
    assert text["icl"].count("Example ") == 3 and "Example " not in text["instructions"]
    assert "Step A produces" in text["cot"] and "Step A requires" in text["cot"]
    for cls in ("Before", "After", "Parallel"):
        assert f"The answer is: {cls}" in text["cot"]
        assert f"The answer is: {cls}" in text["self_reflection"]
        assert f"The final answer: {cls}" in text["self_reflection"]
    assert "The final answer" not in text["cot"]
    assert "reflect" in text["self_reflection"]


def test_icl_examples_have_one_of_each_class():
    t = load_templates("teo")
    assert sorted(ex["answer"] for ex in t["icl_examples"]) == ["after", "before", "independent"]


def test_accepts_objects_pil_images_and_pairs_steps():
    img = Image.new("RGB", (8, 8), "red")
    a = SimpleNamespace(text="Chop.", image=img)
    b = SimpleNamespace(text="Fry.", image=img)
    assert prompt_images(build_teo_prompt("baseline", "image", a, b)) == [img, img]
    pair_step = {"text": "Chop.", "images": ["images/x_0.png", "images/x_1.png"]}  # TEO pair format
    assert prompt_images(build_teo_prompt("cot", "image_text", pair_step, pair_step)) == ["images/x_0.png"] * 2


def test_text_modality_needs_no_image():
    a, b = {"text": "Chop.", "image": None}, {"text": "Fry."}
    assert prompt_images(build_teo_prompt("instructions", "text", a, b)) == []


@pytest.mark.parametrize("modality", ["image", "image_text"])
def test_missing_image_is_a_clear_error(modality):
    with pytest.raises(ValueError, match="Step B has no image"):
        build_teo_prompt("baseline", modality, STEP_A, {"text": "Fry.", "image": None})


def test_missing_text_is_a_clear_error():
    with pytest.raises(ValueError, match="Step A has no text"):
        build_teo_prompt("baseline", "text", {"text": "  ", "image": "a.jpg"}, STEP_B)


def test_unknown_names_list_valid_ones():
    with pytest.raises(ValueError, match="valid strategies: baseline, instructions, icl, cot, self_reflection"):
        build_teo_prompt("zero_shot", "image", STEP_A, STEP_B)
    with pytest.raises(ValueError, match="valid modalities: image, text, image_text"):
        build_teo_prompt("baseline", "video", STEP_A, STEP_B)


def test_prompt_hash_is_stable_and_sensitive():
    h = prompt_hash(build_teo_prompt("baseline", "image", STEP_A, STEP_B))
    assert h == prompt_hash(build_teo_prompt("baseline", "image", dict(STEP_A), dict(STEP_B)))
    assert h != prompt_hash(build_teo_prompt("baseline", "image", STEP_B, STEP_A))
    assert h != prompt_hash(build_teo_prompt("instructions", "image", STEP_A, STEP_B))


def test_iso_prompt():
    inst = {"instance_id": "p:before-k2:s0", "task": "before", "snippet": ["Mix.", "Knead."], "image": "img/p_0.png"}
    for strategy in ("answer_only", "explain"):
        messages = build_iso_prompt(strategy, inst)
        assert prompt_images(messages) == ["img/p_0.png"]
        text = prompt_text(messages)
        assert "1. Mix.\n2. Knead." in text and "happen before the steps described?" in text
    assert "Answer: Yes" in prompt_text(build_iso_prompt("explain", inst))
    assert "Yes or No only" in prompt_text(build_iso_prompt("answer_only", inst))
    with pytest.raises(ValueError, match="answer_only, explain"):
        build_iso_prompt("cot", inst)


def test_coherence_prompt():
    inst = {"instance_id": "p:coherence", "text": "Mix. <image_1>\nKnead. <image_2>", "num_images": 2,
            "candidates": ["c0.png", "c1.png", "c2.png"], "gold": [2, 0], "distractors": [1]}
    messages = build_coherence_prompt(inst)
    content = _user(messages)
    assert prompt_images(messages) == ["c0.png", "c1.png", "c2.png"]
    for k in (1, 2, 3):
        i = next(j for j, item in enumerate(content) if item["type"] == "image" and item["image"] == f"c{k - 1}.png")
        assert content[i - 1]["text"].endswith(f"Image {k}:")
    text = prompt_text(messages)
    assert "<image_1>: Image k\n<image_2>: Image k" in text and "belong to no placeholder" in text
    no_distractor = dict(inst, candidates=["c0.png", "c1.png"], gold=[1, 0], distractors=[])
    assert "belong to no placeholder" not in prompt_text(build_coherence_prompt(no_distractor))
