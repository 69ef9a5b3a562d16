"""TEO / ISO / COHERENCE prompts: markers, image slots and errors for every strategy x modality."""
from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from seqaware.vlm import MODALITIES, STRATEGIES, build_coherence_prompt, build_iso_prompt, build_teo_prompt, prompt_hash
from seqaware.vlm.prompts import build_teo_finetune_prompt, load_templates, prompt_images, prompt_text, teo_answer

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


# MATEO Table 5, CoT and Self-reflection Image-Text rows as printed, up to their "Examples:" line (the rows'
# "- Before: ... - After: ... - Parallel: ..." are the rules printed in full in the Instructions Image-only row)
PRINTED_HEAD = {
    "cot": ("Your task is to determine the dependency order between two steps in a recipe. You must choose from: "
            "Before, After, or Parallel. Follow these rules:\n" + RULES.split("\n", 1)[1] + "\nYou will be shown three "
            "examples demonstrating how to solve the task using text-based step descriptions. " + INPUT_NOTE["image_text"]
            + " You must follow the reasoning steps shown in the examples before answering.\nExamples:\n"),
}
PRINTED_HEAD["self_reflection"] = PRINTED_HEAD["cot"]  # the printed Image-Text row has no reflection sentence


@pytest.mark.parametrize("strategy,modality", COMBOS)
def test_printed_variant_is_table5_as_printed(strategy, modality):
    """prompts.teo.variant=printed: the 15 rows exactly as Table 5 prints them. 13 equal the default
    (reconstructed) prompts; CoT and Self-reflection Image-Text print neither the "Ignore sequencing terms"
    paragraph nor (Self-reflection) the reflection sentence, which the default adds from the Text-only rows."""
    printed = prompt_text(build_teo_prompt(strategy, modality, STEP_A, STEP_B, variant="printed"))
    default = prompt_text(build_teo_prompt(strategy, modality, STEP_A, STEP_B))
    if (strategy, modality) not in (("cot", "image_text"), ("self_reflection", "image_text")):
        assert printed == default
        return
    assert printed.startswith(PRINTED_HEAD[strategy]) and printed.endswith(CONTEXT["image_text"][len("Context:\n"):])
    assert SEQUENCING not in printed and ALSO_NOTE not in printed and "After you answer the question" not in printed
    examples = default[default.index("\nExamples:\n") + len("\nExamples:\n"):]
    assert printed == PRINTED_HEAD[strategy] + examples  # the worked examples and the steps are the same
    reflect = ("After you answer the question, review your reasoning and check whether your answer logically follows "
               "from the context and dependencies you identified. After self-reflection, provide your final answer, "
               "confirming or correcting your initial choice.")
    added = [line for line in default.splitlines() if line not in printed.splitlines()]
    assert added[0] == SEQUENCING + " " + ALSO_NOTE
    if strategy == "self_reflection":
        assert added[1].endswith("before answering. " + reflect) and len(added) == 2
    else:
        assert len(added) == 1


def test_unknown_prompt_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="valid variants .*reconstructed, printed"):
        build_teo_prompt("cot", "text", STEP_A, STEP_B, variant="paper")


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


# ---------------------------------------------------------------- ISO-Bench (App. H)
ISO_INST = {"instance_id": "p:before-k2:s0", "goal": "Make chicken parmesan", "task": "before",
            "snippet": ["Fry the cutlets.", "Bake with cheese."], "image": "img/p_0.png"}


@pytest.mark.parametrize("task,strategy", itertools.product(("before", "after"), ("answer_only", "explain")))
def test_iso_prompt_is_the_paper_text(task, strategy):
    """Every ISO variant equals ISO-Bench App. H's template filled in, image first, no system message."""
    inst = dict(ISO_INST, task=task)
    messages = build_iso_prompt(strategy, inst)
    assert [m["role"] for m in messages] == ["user"]                       # App. H: no system prompt
    content = messages[0]["content"]
    assert [item["type"] for item in content] == ["image", "text"]         # the image, then the prompt
    assert content[0]["image"] == "img/p_0.png"
    # App. H: "GOAL: {Goal Name}" / "Plan:" / "{step_1}" "{step_2}" ... / "QUESTION: {Does this image show a
    # step that must come <before|after> the <first|last> step in the plan?}"
    anchor = {"before": "first", "after": "last"}[task]
    question = f"QUESTION: Does this image show a step that must come {task} the {anchor} step in the plan?"
    # App. H mode 1: 'We append "Answer only with YES or NO."'; mode 2: "a short chain-of-thought enclosed by
    # <think>...</think>, then a final answer enclosed by <answer>YES</answer> or <answer>NO</answer>"
    instruction = {"answer_only": "Answer only with YES or NO.",
                   "explain": "Give a short chain-of-thought enclosed by <think>...</think>, then a final answer "
                              "enclosed by <answer>YES</answer> or <answer>NO</answer>."}[strategy]
    expected = "\n".join(["GOAL: Make chicken parmesan", "Plan:", "Fry the cutlets.", "Bake with cheese.",
                          question, instruction])
    assert content[1]["text"] == expected
    assert prompt_images(messages) == ["img/p_0.png"]


def test_iso_prompt_errors_and_overrides():
    assert prompt_images(build_iso_prompt("answer_only", ISO_INST, image="/abs/x.png")) == ["/abs/x.png"]
    with pytest.raises(ValueError, match="answer_only, explain"):
        build_iso_prompt("cot", ISO_INST)
    with pytest.raises(ValueError, match=r"'p:before-k2:s0'.*'goal'"):
        build_iso_prompt("answer_only", dict(ISO_INST, goal=""))
    with pytest.raises(ValueError, match=r"'task' is None"):
        build_iso_prompt("answer_only", dict(ISO_INST, task=None))
    with pytest.raises(ValueError, match="'snippet'"):
        build_iso_prompt("answer_only", dict(ISO_INST, snippet=["ok", " "]))
    with pytest.raises(ValueError, match="'image'"):
        build_iso_prompt("answer_only", dict(ISO_INST, image=None))


PAPERS = Path(__file__).resolve().parents[2] / "shared" / "papers"


def _paper(name: str) -> str:
    path = PAPERS / name
    if not path.is_file():
        pytest.skip(f"paper text not available: {path}")
    return " ".join(path.read_text(encoding="utf-8").split())


@pytest.mark.shared_data
def test_iso_pieces_appear_in_the_paper():
    """The fixed pieces of iso.yaml, whitespace-normalised, are in the stored copy of ISO-Bench App. H."""
    paper = _paper("iso_bench.txt")
    t = load_templates("iso")
    assert f"We append \u201c{t['strategies']['answer_only']}\u201d and use the first \u201cYES\u201d or \u201cNO\u201d" in paper
    generic = t["question"]["before"].replace("before the first", "<before|after> the <first|last>")
    assert generic == t["question"]["after"].replace("after the last", "<before|after> the <first|last>")
    assert t["question_line"].format(question="{" + generic + "}") in paper
    for piece in ("<think>...</think>", "<answer>YES</answer>", "<answer>NO</answer>"):
        assert piece in t["strategies"]["explain"] and piece in paper
    assert "We limit generation to 120 tokens" in paper and t["max_new_tokens"] == 120


# ---------------------------------------------------------------- COHERENCE (App. D.1)
COH_INST = {"instance_id": "p:coherence", "title": "Ginger Tea", "text": "Peel the ginger. <image_1>\nBoil the milk. <image_2>",
            "num_images": 2, "candidates": ["c0.png", "c1.png", "c2.png"], "gold": [2, 0], "distractors": [1]}


def _d1_prompt(title, n, m, content):
    """COHERENCE App. D.1, word for word, with its slots filled in (line breaks at headings, items, bullets)."""
    return (
        "## Task: Interleaved-Image-Text Matching\n\n"
        f'You are given an article about "{title}" with {n} image placeholders marked as [IMAGE_PLACEHOLDER]. '
        f"You are also given {m} candidate images (Image 0, Image 1, \u2026, Image {m - 1}) shown below.\n\n"
        "Your task is to determine which image should be placed at each placeholder position based on the "
        "surrounding text context.\n\n"
        f"## Article Text (with placeholders):\n{content}\n\n"
        f"## Candidate Images (Image 0 to Image {m - 1}):\n"
        + "".join(f"Image {k}\n<image>\n" for k in range(m))
        + "## Instructions:\n"
        "1. **Read the text carefully**: Each [IMAGE_PLACEHOLDER] appears within a specific context. The surrounding "
        "text describes what should be shown in that image.\n"
        "2. **Analyze each placeholder**: For each placeholder (in order from first to last), identify what the "
        "nearby text is describing - this tells you what the image should show.\n"
        f"3. **Match images to placeholders**: Look at the {m} candidate images provided and determine which image "
        "best matches the context around each placeholder.\n"
        "4. **Important**: The same image index can only be used once. Each placeholder needs a different image.\n\n"
        "## Output Format:\n"
        "First reason step by step, then output your final answer on the LAST line as a Python list:\n"
        f"- Format: [{', '.join('index' + str(i) for i in range(n))}]\n"
        "- The list position corresponds to the placeholder order (first placeholder is index 0).\n"
        "- Each value is the image index to place at that placeholder.\n"
        "- Example: [2, 0, 1, 3, 4] means placeholder 1 uses Image 2, placeholder 2 uses Image 0, etc.\n"
        "- Do NOT output the inverse mapping (i.e., image -> placeholder).\n"
        f"- The list must have exactly {n} integers, each between 0 and {m - 1}.\n\n"
        "Now analyze the text and images, then provide your answer."
    )


@pytest.mark.parametrize("candidates", [["c0.png", "c1.png", "c2.png"], ["c0.png", "c1.png"]])
def test_coherence_prompt_is_the_paper_text(candidates):
    """With and without a distractor (App. E uses the same prompt): D.1 verbatim, images 0-based after their labels."""
    inst = dict(COH_INST, candidates=candidates)
    messages = build_coherence_prompt(inst)
    assert [m["role"] for m in messages] == ["user"]
    content = messages[0]["content"]
    content_text = "Peel the ginger. [IMAGE_PLACEHOLDER]\nBoil the milk. [IMAGE_PLACEHOLDER]"
    assert prompt_text(messages) == _d1_prompt("Ginger Tea", 2, len(candidates), content_text)
    assert prompt_images(messages) == candidates
    for k, path in enumerate(candidates):       # "Image k" directly precedes candidate k (App. F: "Image 0[image]")
        i = next(j for j, item in enumerate(content) if item.get("image") == path)
        assert content[i - 1]["type"] == "text" and content[i - 1]["text"].endswith(f"Image {k}")
    assert content[0]["text"].endswith(f"## Candidate Images (Image 0 to Image {len(candidates) - 1}):\nImage 0")
    assert content[-1]["text"].startswith("## Instructions:")


def test_coherence_prompt_errors():
    assert prompt_images(build_coherence_prompt(COH_INST, images=["/a", "/b", "/c"])) == ["/a", "/b", "/c"]
    with pytest.raises(ValueError, match="2 images for 3 candidates"):
        build_coherence_prompt(COH_INST, images=["/a", "/b"])
    with pytest.raises(ValueError, match=r"'p:coherence'.*'title'"):
        build_coherence_prompt(dict(COH_INST, title=" "))
    with pytest.raises(ValueError, match=r"placeholders \[2, 1\]"):
        build_coherence_prompt(dict(COH_INST, text="A <image_2> B <image_1>"))
    with pytest.raises(ValueError, match="1 candidates for 2 placeholders"):
        build_coherence_prompt(dict(COH_INST, candidates=["c0.png"]))


@pytest.mark.shared_data
def test_coherence_template_is_verbatim_d1():
    """coherence.yaml with the paper's own slot names, whitespace-normalised, is the stored App. D.1 text."""
    paper = _paper("coherence.txt")
    d1 = paper[paper.index("Evaluation Prompt ## Task") + len("Evaluation Prompt "):paper.index(" D.2 Error Analysis")]
    t = load_templates("coherence")
    slots = {"title": "{title}", "num_placeholders": "{num_placeholders}", "num_candidates": "{len(image_sequence)}",
             "last_index": "{len(image_sequence) - 1}", "content": "{content}",
             "format_list": '{", ".join(["index" + str(i) for i in range(num_placeholders)])}'}
    ours = " ".join([t["header"].format(**slots), "{Image list}", t["footer"].format(**slots)])
    assert " ".join(ours.split()) == d1
    assert t["placeholder"] == "[IMAGE_PLACEHOLDER]" and "Image 0[Uncaptioned image] Image 1" in paper


def test_step_texts_are_shown_stripped():
    """A description with surrounding whitespace / a trailing newline (as read from data) is shown trimmed,
    so the prompt (and its cache hash) does not depend on it."""
    clean = build_teo_prompt("baseline", "text", {"text": "Mix the flour."}, {"text": "Knead the dough."})
    padded = build_teo_prompt("baseline", "text", {"text": "  Mix the flour.\n"}, {"text": "\tKnead the dough.  "})
    assert prompt_text(padded) == prompt_text(clean)
    assert "Step A description: Mix the flour.\nStep B description: Knead the dough." in prompt_text(padded)
    assert prompt_hash(padded) == prompt_hash(clean)


def test_coherence_prompt_without_text_names_the_field():
    with pytest.raises(ValueError, match=r"'p:coherence': field 'text' is empty or missing"):
        build_coherence_prompt(dict(COH_INST, text="  "))
    with pytest.raises(ValueError, match=r"placeholders \[1\], expected <image_1> .. <image_2>"):
        build_coherence_prompt(dict(COH_INST, text="only <image_1> here"))


def _prompt_files(tmp_path, name: str, edit) -> str:
    """A prompts folder holding ``name``.yaml, the shipped file changed by ``edit(dict)``."""
    import copy

    import yaml

    data = copy.deepcopy(load_templates(name))  # the cached shipped templates stay as they are
    edit(data)
    folder = tmp_path / "prompts"
    folder.mkdir(parents=True)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return str(folder)


def test_prompt_files_are_checked_naming_the_file_and_key(tmp_path):
    """The rules on the template files themselves: a missing file, a file that is not a mapping, a layout
    naming a piece the file lacks, a strategy without a layout, an unknown ISO image position."""
    with pytest.raises(FileNotFoundError, match=r"prompt templates not found: .*nowhere/teo\.yaml"):
        load_templates("teo", str(tmp_path / "nowhere"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "teo.yaml").write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match=r"bad/teo\.yaml: expected a mapping at the top level, got list"):
        load_templates("teo", str(tmp_path / "bad"))
    step_a, step_b = {"text": "Mix."}, {"text": "Bake."}
    folder = _prompt_files(tmp_path / "piece", "teo", lambda d: d["layouts"].update(baseline=[["no_such_piece"]]))
    with pytest.raises(ValueError, match="names the piece 'no_such_piece'"):
        build_teo_prompt("baseline", "text", step_a, step_b, prompts_dir=folder)
    folder = _prompt_files(tmp_path / "layout", "teo", lambda d: d["layouts"].pop("cot"))
    with pytest.raises(ValueError, match="has no layout 'cot'"):
        build_teo_prompt("cot", "text", step_a, step_b, prompts_dir=folder)
    folder = _prompt_files(tmp_path / "iso", "iso", lambda d: d.update(image_position="middle"))
    with pytest.raises(ValueError, match="image_position must be 'first' or 'last', got 'middle'"):
        build_iso_prompt("answer_only", ISO_INST, prompts_dir=folder)
    folder = _prompt_files(tmp_path / "iso_last", "iso", lambda d: d.update(image_position="last"))
    content = build_iso_prompt("answer_only", ISO_INST, prompts_dir=folder)[-1]["content"]
    assert [item["type"] for item in content] == ["text", "image"]
