"""TEO / ISO / COHERENCE prompts: markers, image slots and errors for every strategy x modality."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from PIL import Image

from seqaware.teo import MODALITIES, STRATEGIES, build_coherence_prompt, build_iso_prompt, build_teo_prompt, prompt_hash
from seqaware.teo.prompts import build_teo_finetune_prompt, load_templates, prompt_images, prompt_text, teo_answer

STEP_A = {"text": "First, mix the flour with the water.", "image": "/data/a.jpg"}
STEP_B = {"text": "Finally, knead the dough.", "image": "/data/b.jpg"}
COMBOS = list(itertools.product(STRATEGIES, MODALITIES))
# MATEO Table 1 / Table 5
QUESTIONS = ("Questions:\nQ1: Must Step A be executed before Step B?\nQ2: Must Step A be executed after Step B?\n"
             "Q3: Can Step A and Step B be executed in parallel?")
# MATEO Table 5, Baseline row
FORMAT = ("Using ONLY the information in the Context, answer the following three questions in EXACTLY this format:\n"
          "Q1: The answer is: <Yes/No/I don't know>.\nQ2: The answer is: <Yes/No/I don't know>.\n"
          "Q3: The answer is: <Yes/No/I don't know>.\nDo not add anything else. Do not explain. Do not change the format.")
RULES = ("Your task is to determine the dependency order between two steps in a recipe. Follow these rules:\n"
         "- Before: Step A must be executed before Step B if the outcome of Step A is required to complete Step B "
         "(i.e., Step B depends on Step A).\n"
         "- After: Step A must be executed after Step B if the outcome of Step B is required to complete Step A "
         "(i.e., Step A depends on Step B).\n"
         "- Parallel: Step A and Step B can be executed in parallel if neither step depends on the outcome of the "
         "other; therefore, their order of execution can be arbitrary.")
SEQUENCING = ("Ignore sequencing terms (e.g., 'first', 'then', 'lastly', and other words that may appear in the text "
              "for the natural flow of the recipe) when determining the execution order, and focus only on the action itself.")
ALSO_NOTE = ("Also note that the text description may include partial or full references to steps not shown in the "
             "image; in such cases, rely on the actions depicted in the image.")
CONTEXT = {  # Table 5 Baseline rows, "Context:" block as the reader sees it (<image> = an image slot)
    "image": "Context:\nStep A picture:\n<image>\nStep B picture:\n<image>",
    "text": "Context:\nStep A description: First, mix the flour with the water.\nStep B description: Finally, knead the dough.",
    "image_text": "Context:\nStep A picture:\n<image>\nStep A description: First, mix the flour with the water.\n"
                  "Step B picture:\n<image>\nStep B description: Finally, knead the dough.",
}
INPUT_NOTE = {  # Table 5 ICL / CoT rows, the modality-specific note after "You will be shown three examples ..."
    "image": "However, your actual input will consist of images, and your reasoning should be based on the actions "
             "depicted in those images.",
    "text": None,
    "image_text": "However, your actual input will consist of both images and text descriptions, and your reasoning "
                  "should be based on both actions shown in the images and the accompanying textual descriptions.",
}
EXAMPLE_1_COT = ("Step A description: Grate the lemon zest.\nStep B description: Put the grated lemon zest into the "
                 "strawberry sauce.\nStep A produces: Grated lemon zest.\nStep B produces: Lemon zest inside the "
                 "strawberry sauce.\nStep A requires: A lemon.\nStep B requires: Lemon zest that has been grated.\n"
                 "Dependency analysis: Step B explicitly depends on Step A - lemon zest must already be grated (Step A) "
                 "before it can be put into the strawberry sauce (Step B); therefore, Step A must be executed before "
                 "Step B.\nThe answer is: Before.")


def _user(messages):
    users = [m for m in messages if m["role"] == "user"]
    assert len(users) == 1
    return users[0]["content"]


@pytest.mark.parametrize("strategy,modality", COMBOS)
def test_markers_and_image_slots(strategy, modality):
    messages = build_teo_prompt(strategy, modality, STEP_A, STEP_B)
    assert [m["role"] for m in messages] == ["user"]  # MATEO shows no system message
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
        # the worked examples of icl / cot / self_reflection are text-only: three more descriptions
        extra = 3 if strategy in ("icl", "cot", "self_reflection") else 0
        assert text.count(f"Step {name} description:") == (1 if shows_text else 0) + extra
    assert (STEP_A["text"] in text) == shows_text and (STEP_B["text"] in text) == shows_text
    if shows_image:  # each picture marker directly precedes its image slot
        for k, item in enumerate(content):
            if item["type"] == "image":
                assert content[k - 1]["type"] == "text"
                marker = "Step A picture:" if item["image"] == "/data/a.jpg" else "Step B picture:"
                assert content[k - 1]["text"].rstrip().endswith(marker)
    # Table 5: every strategy but Baseline (steps + questions only) gives the rules and, with text, the
    # sequencing-terms rule (+ "Also note" for image_text)
    assert (SEQUENCING in text) == (shows_text and strategy != "baseline")
    assert (ALSO_NOTE in text) == (modality == "image_text" and strategy != "baseline")
    # Step A is presented before Step B
    marker = "picture:" if shows_image else "description:"
    assert text.rindex(f"Step A {marker}") < text.rindex(f"Step B {marker}")


@pytest.mark.parametrize("modality", MODALITIES)
def test_baseline_is_mateo_table5(modality):
    text = prompt_text(build_teo_prompt("baseline", modality, STEP_A, STEP_B))
    assert text == FORMAT + "\n" + CONTEXT[modality] + "\n" + QUESTIONS


@pytest.mark.parametrize("modality", MODALITIES)
def test_instructions_is_mateo_table5(modality):
    text = prompt_text(build_teo_prompt("instructions", modality, STEP_A, STEP_B))
    rules = {"image": RULES, "text": RULES + "\n" + SEQUENCING, "image_text": RULES + "\n" + SEQUENCING + " " + ALSO_NOTE}
    assert text == rules[modality] + "\n" + FORMAT + "\n" + CONTEXT[modality] + "\n" + QUESTIONS


@pytest.mark.parametrize("modality", MODALITIES)
def test_icl_has_mateo_examples_and_modality_note(modality):
    text = prompt_text(build_teo_prompt("icl", modality, STEP_A, STEP_B))
    intro = "You will be shown three examples demonstrating how to solve the task using text-based step descriptions."
    line = intro + (" " + INPUT_NOTE[modality] if INPUT_NOTE[modality] else "")
    assert "\n" + line + "\nExamples:\nStep A description: Grate the lemon zest.\n" in text
    assert text.endswith(FORMAT + "\n" + CONTEXT[modality] + "\n" + QUESTIONS)
    # example 2 (parallel) as written in Table 5, answers in the Table 6 format, then the explanation
    assert ("Step A description: Add the celery.\nStep B description: Then add carrots.\n" + QUESTIONS +
            "\nQ1: The answer is: No.\nQ2: The answer is: No.\nQ3: The answer is: Yes.\nExplanation: Both actions "
            "are independent; neither step produces something the other one requires.\n") in text
    assert text.count("Explanation: ") == 3 and "Dependency analysis" not in text
    assert text.index("Grate the lemon zest") < text.index("Add the celery") < text.index("Pour it into the cup")


@pytest.mark.parametrize("modality", MODALITIES)
def test_cot_and_self_reflection_are_mateo_table5(modality):
    cot = prompt_text(build_teo_prompt("cot", modality, STEP_A, STEP_B))
    reflection = prompt_text(build_teo_prompt("self_reflection", modality, STEP_A, STEP_B))
    head = ("Your task is to determine the dependency order between two steps in a recipe. You must choose from: "
            "Before, After, or Parallel. Follow these rules:\n- Before: ")
    follow = "You must follow the reasoning steps shown in the examples before answering."
    reflect = ("After you answer the question, review your reasoning and check whether your answer logically follows "
               "from the context and dependencies you identified. After self-reflection, provide your final answer, "
               "confirming or correcting your initial choice.")
    for text in (cot, reflection):
        assert text.startswith(head)
        assert "\nExamples:\n" + EXAMPLE_1_COT in text
        assert "Using ONLY" not in text and "Questions:" not in text and "Context:" not in text
        assert text.endswith(CONTEXT[modality][len("Context:\n"):])  # the steps close the prompt
        for answer in ("Before", "Parallel", "After"):
            assert f"The answer is: {answer}." in text
        if INPUT_NOTE[modality]:
            assert INPUT_NOTE[modality] + " " + follow in text
    assert follow + "\n" in cot and reflect not in cot and "Reflection:" not in cot
    assert follow + " " + reflect + "\nExamples:" in reflection
    assert reflection.count("The answer is: Before.\nReflection: <your_reflection>\nThe final answer: <final_answer>") == 1
    assert reflection.count("Reflection: <your_reflection>\nThe final answer: <final_answer>") == 3


@pytest.mark.parametrize("modality", MODALITIES)
def test_finetune_prompt_is_mateo_table6(modality):
    text = prompt_text(build_teo_finetune_prompt(modality, STEP_A, STEP_B))
    rules = {"image": RULES, "text": RULES + "\n" + SEQUENCING, "image_text": RULES + "\n" + SEQUENCING + " " + ALSO_NOTE}
    assert text == rules[modality] + "\n" + CONTEXT[modality][len("Context:\n"):] + "\n" + QUESTIONS


def test_teo_answer_formats():
    assert teo_answer("before") == "Q1: The answer is: Yes.\nQ2: The answer is: No.\nQ3: The answer is: No."
    assert teo_answer("independent", "short") == "Q1: No\nQ2: No\nQ3: Yes"
    with pytest.raises(ValueError, match="valid target formats: mateo, short"):
        teo_answer("before", "long")
    with pytest.raises(ValueError, match="unknown TEO label 'other'"):
        teo_answer("other")


def test_examples_have_one_of_each_class():
    t = load_templates("teo")
    assert [ex["label"] for ex in t["examples"]] == ["before", "independent", "after"]


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
