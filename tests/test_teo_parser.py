"""Answer parsers: TEO (question and final-answer strategies), ISO yes/no, COHERENCE assignments."""
from __future__ import annotations

import pytest

from seqaware.metrics.coherence import coherence_report
from seqaware.vlm import (parse_coherence_answer, parse_iso_answer, parse_teo_answer, parse_teo_answers, question_answers,
                          reflection_outcome, teo_answer)

QUESTION_CASES = [
    ("Q1: Yes\nQ2: No\nQ3: No", "before"),
    ("Q1: No\nQ2: Yes\nQ3: No", "after"),
    ("Q1: No\nQ2: No\nQ3: Yes", "independent"),
    ("q1: yes\nq2: no\nq3: no", "before"),
    ("Q1: YES\nQ2: NO\nQ3: NO", "before"),
    ("**Q1:** Yes\n**Q2:** No\n**Q3:** No", "before"),
    ("**Q1: No**\n**Q2: Yes**\n**Q3: No**", "after"),
    ("- Q1: No\n- Q2: No\n- Q3: Yes", "independent"),
    ("1. Q1: No\n2. Q2: Yes\n3. Q3: No", "after"),
    ("Q1) Yes.\nQ2) No.\nQ3) No.", "before"),
    ("Q1 - No\nQ2 - No\nQ3 - Yes", "independent"),
    ("Q1: Yes, Q2: No, Q3: No", "before"),
    ("Q1: Yes Q2: No Q3: No", "before"),
    ("Question 1: No\nQuestion 2: Yes\nQuestion 3: No", "after"),
    ("Q1: Yes, because the dough must be mixed first.\nQ2: No\nQ3: No, B needs A.", "before"),
    ("Q1: Must Step A be executed before Step B? No\nQ2: Must Step A be executed after Step B? Yes\n"
     "Q3: Can they run in parallel? No", "after"),
    ("Sure! Here are my answers:\n\nQ1: No\nQ2: No\nQ3: Yes\n\nThe steps do not share ingredients.", "independent"),
    ("### Answers\n* **Q1**: No\n* **Q2**: Yes\n* **Q3**: No", "after"),
    ("Yes\nNo\nNo", "before"),
    ("No, Yes, No", "after"),
    ("1. No\n2. No\n3. Yes", "independent"),
    ("Q3: Yes\nQ1: No\nQ2: No", "independent"),
    ("Q1: No\nQ2: No\nQ3: Yes, since Q1 and Q2 do not apply", "independent"),
    # non-answers -> other
    ("I don't know.", "other"),
    ("Q1: I don't know\nQ2: No\nQ3: No", "other"),
    ("Q1: Yes\nQ2: Yes\nQ3: No", "other"),
    ("Q1: Yes\nQ2: Yes\nQ3: Yes", "other"),
    ("Q1: No\nQ2: No\nQ3: No", "other"),
    ("Q1: Yes\nQ2: No", "other"),
    ("Q1: Yes", "other"),
    ("", "other"),
    (None, "other"),
    ("Q1: Maybe\nQ2: No\nQ3: No", "other"),
    ("Q1: Yes\nQ2: No\nQ3: No\nQ1: No", "other"),
    ("Yes", "other"),
    ("Yes No", "other"),
    ("The answer is: Before", "other"),
    # one Yes and "I don't know": not the one-Yes-two-No pattern (MATEO section 3)
    ("Q1: Yes\nQ2: No\nQ3: I don't know", "other"),
    ("Q1: No\nQ2: I don't know\nQ3: Yes", "other"),
    # unlabelled: exactly three yes/no words, no more
    ("Yes\nNo\nNo\nYes", "other"),
    ("No, No, Yes, No", "other"),
]


# MATEO's answer format (Table 5 answer-format block, Table 6 fine-tuning target, ICL example answers):
# "Q1: The answer is: <Yes/No/I don't know>." -- variants a model may produce, each with its class
MATEO_CASES = [
    # Table 6 examples, as written (image-only: before; text-only: independent; image-text: after)
    ("Q1: The answer is: Yes.\nQ2: The answer is: No.\nQ3: The answer is: No.", "before"),
    ("Q1: The answer is: No.\nQ2: The answer is: No.\nQ3: The answer is: Yes.", "independent"),
    ("Q1: The answer is: No.\nQ2: The answer is: Yes.\nQ3: The answer is: No.", "after"),
    # one line
    ("Q1: The answer is: No. Q2: The answer is: Yes. Q3: The answer is: No.", "after"),
    ("Q1: The answer is: Yes. Q2: The answer is: No. Q3: The answer is: No.", "before"),
    # case, markdown, missing period / colon
    ("q1: the answer is: yes.\nq2: the answer is: no.\nq3: the answer is: no.", "before"),
    ("Q1: THE ANSWER IS: NO.\nQ2: THE ANSWER IS: NO.\nQ3: THE ANSWER IS: YES.", "independent"),
    ("Q1: The answer is: **Yes**.\nQ2: The answer is: **No**.\nQ3: The answer is: **No**.", "before"),
    ("**Q1:** The answer is: No.\n**Q2:** The answer is: Yes.\n**Q3:** The answer is: No.", "after"),
    ("**Q1: The answer is: No.**\n**Q2: The answer is: No.**\n**Q3: The answer is: Yes.**", "independent"),
    ("Q1: The answer is Yes\nQ2: The answer is No\nQ3: The answer is No", "before"),
    ("Q1: Answer: No.\nQ2: Answer: Yes.\nQ3: Answer: No.", "after"),
    # mixed: with and without "The answer is:"
    ("Q1: The answer is: No.\nQ2: No\nQ3: Yes", "independent"),
    # extra text before / after / inside
    ("Here are the answers.\nQ1: The answer is: Yes.\nQ2: The answer is: No.\nQ3: The answer is: No.\n"
     "The zest must be grated before it goes into the sauce.", "before"),
    ("Q1: The answer is: No. Step A does not produce anything Step B needs.\nQ2: The answer is: No.\n"
     "Q3: The answer is: Yes. Both steps add a separate ingredient.", "independent"),
    # the reply echoes the questions (Table 5 layout), then answers them: the answered lines are read
    ("Questions:\nQ1: Must Step A be executed before Step B?\nQ2: Must Step A be executed after Step B?\n"
     "Q3: Can Step A and Step B be executed in parallel?\nQ1: The answer is: No.\nQ2: The answer is: Yes.\n"
     "Q3: The answer is: No.", "after"),
    # the reply echoes the format block, then answers: the <Yes/No/I don't know> template is no answer
    ("Q1: The answer is: <Yes/No/I don't know>.\nQ1: The answer is: Yes.\nQ2: The answer is: No.\n"
     "Q3: The answer is: No.", "before"),
    # three "The answer is:" lines without labels are read in Q1-Q3 order
    ("The answer is: No.\nThe answer is: Yes.\nThe answer is: No.", "after"),
    # "I don't know" (MATEO's third answer) -> other (section 3)
    ("Q1: The answer is: I don't know.\nQ2: The answer is: No.\nQ3: The answer is: No.", "other"),
    ("Q1: The answer is: No.\nQ2: The answer is: No.\nQ3: The answer is: I dont know.", "other"),
    ("Q1: The answer is: I do not know.\nQ2: The answer is: I do not know.\nQ3: The answer is: I do not know.", "other"),
    ("Q1: The answer is: I don't know.\nQ1: The answer is: Yes.\nQ2: The answer is: No.\nQ3: The answer is: No.",
     "other"),  # two different answers to Q1: no occurrence is preferred
    # multiple Yes / all No / missing / unfilled template -> other (section 3)
    ("Q1: The answer is: Yes.\nQ2: The answer is: Yes.\nQ3: The answer is: No.", "other"),
    ("Q1: The answer is: No.\nQ2: The answer is: No.\nQ3: The answer is: No.", "other"),
    ("Q1: The answer is: Yes.\nQ2: The answer is: No.", "other"),
    ("Q1: The answer is: <Yes/No/I don't know>.\nQ2: The answer is: <Yes/No/I don't know>.\n"
     "Q3: The answer is: <Yes/No/I don't know>.", "other"),
    ("Q1: The answer is: Yes.\nQ2: The answer is: No.\nQ3: The answer is: No.\nQ2: The answer is: Yes.", "other"),
    ("The answer is: Yes.", "other"),
    # the echoed <Yes/No/I don't know> template is no answer: it must not contradict the real "No"
    ("Q1: The answer is: <Yes/No/I don't know>.\nQ1: The answer is: No.\nQ2: The answer is: Yes.\n"
     "Q3: The answer is: No.", "after"),
    ("Q1: The answer is: Yes.\nQ2: The answer is: No.\nQ3: The answer is: I don't know.", "other"),
]


@pytest.mark.parametrize("strategy", ["baseline", "instructions", "icl"])
@pytest.mark.parametrize("text,expected", MATEO_CASES)
def test_mateo_answer_format(text, expected, strategy):
    assert parse_teo_answer(text, strategy) == expected
    assert parse_teo_answers(text, strategy) == (expected, expected)


def test_question_answers_reads_each_answer():
    assert question_answers("Q1: The answer is: I don't know.\nQ2: The answer is: No.") == {1: "don't know", 2: "no"}
    # an echoed question without an answer is skipped; the answered occurrence is read
    assert question_answers("Q1: Must Step A be executed before Step B?\nQ1: The answer is: **Yes**.") == {1: "yes"}
    assert question_answers("Q3: The answer is: Yes.\nQ3: The answer is: No.") == {3: None}  # contradiction
    assert question_answers("no labels, no answers") == {}


def test_targets_of_every_format_parse_back():
    for fmt in ("mateo", "short"):
        for label in ("before", "after", "independent"):
            assert parse_teo_answer(teo_answer(label, fmt), "instructions") == label


@pytest.mark.parametrize("strategy", ["baseline", "instructions", "icl"])
@pytest.mark.parametrize("text,expected", QUESTION_CASES)
def test_question_strategies(text, expected, strategy):
    assert parse_teo_answer(text, strategy) == expected
    assert parse_teo_answers(text, strategy) == (expected, expected)


COT_CASES = [
    ("Step A produces dough.\nStep A requires flour.\nStep B produces bread.\nStep B requires dough.\n"
     "The answer is: Before", "before"),
    ("... The answer is: After", "after"),
    ("... The answer is: Parallel", "independent"),
    ("the answer is: parallel.", "independent"),
    ("THE ANSWER IS: AFTER", "after"),
    ("**The answer is: Before**", "before"),
    ("The answer is **Before**.", "before"),
    ("The answer is: \"After\"", "after"),
    ("The answer is - Parallel", "independent"),
    ("The answer is: Independent", "independent"),
    ("At first I thought the answer is: After. But B needs A.\nThe answer is: Before", "before"),
    ("Step A produces nothing B needs.", "other"),
    ("The answer is: I don't know", "other"),
    ("The answer is: Sometimes", "other"),
    ("", "other"),
]


@pytest.mark.parametrize("text,expected", COT_CASES)
def test_cot(text, expected):
    assert parse_teo_answer(text, "cot") == expected
    assert parse_teo_answers(text, "cot") == (expected, expected)


REFLECTION_CASES = [
    ("The answer is: Before\nReflection: B needs the dough of A.\nThe final answer: Before", ("before", "before")),
    ("The answer is: After\nOn reflection, A produces the dough B uses.\nThe final answer: Before", ("after", "before")),
    ("The answer is: Parallel\n...\n**The final answer: After**", ("independent", "after")),
    ("the answer is: before\nthe final answer: parallel", ("before", "independent")),
    ("The answer is: Before\nI am not sure any more.", ("before", "other")),
    ("Reflection only.\nThe final answer: After", ("other", "after")),
    ("The answer is: Before\nThe final answer is: After", ("before", "after")),
    ("Nothing useful", ("other", "other")),
]


@pytest.mark.parametrize("text,expected", REFLECTION_CASES)
def test_self_reflection(text, expected):
    assert parse_teo_answers(text, "self_reflection") == expected
    assert parse_teo_answer(text, "self_reflection") == expected[1]


# MATEO Table 5 CoT / Self-reflection replies: "Step A produces: ... Dependency analysis: ... The answer is: X."
MATEO_COT_CASES = [
    ("Step A produces: Grated lemon zest.\nStep B produces: Lemon zest inside the strawberry sauce.\n"
     "Step A requires: A lemon.\nStep B requires: Lemon zest that has been grated.\nDependency analysis: Step B "
     "explicitly depends on Step A.\nThe answer is: Before.", "before"),
    ("Dependency analysis: Each step adds a separate ingredient.\nThe answer is: Parallel.", "independent"),
    ("Dependency analysis: Step A relies on the outcome of Step B.\nThe answer is: After.", "after"),
    ("Dependency analysis: ...\n**The answer is:** **After**", "after"),
    ("Dependency analysis: ... The answer is: parallel", "independent"),
    # several answers: the last one is read (the reply's conclusion)
    ("The answer is: Before.\nWait, Step A needs the juice measured in Step B.\nThe answer is: After.", "after"),
    ("Dependency analysis: neither depends on the other.", "other"),
]


@pytest.mark.parametrize("text,expected", MATEO_COT_CASES)
def test_mateo_cot(text, expected):
    assert parse_teo_answer(text, "cot") == expected


MATEO_REFLECTION_CASES = [  # Table 5: "... The answer is: X. Reflection: <your_reflection> The final answer: <final_answer>"
    ("Dependency analysis: Step B needs the grated zest.\nThe answer is: Before.\nReflection: the zest must be grated "
     "first; the answer follows.\nThe final answer: Before.", ("before", "before")),
    ("The answer is: Before.\nReflection: Step A needs the juice that Step B measures out, so I was wrong.\n"
     "The final answer: After.", ("before", "after")),
    ("The answer is: Parallel. Reflection: no dependency. The final answer: Parallel.", ("independent", "independent")),
    ("The answer is: After.\nReflection: ...\nThe final answer: **Before**", ("after", "before")),
    # several final answers: the last one is read (first = the first "The answer is:")
    ("The answer is: Before.\nThe final answer: Before.\nReflection: on second thought ...\n"
     "The answer is: After.\nThe final answer: After.", ("before", "after")),
    # no final answer: a failed self-reflection (MATEO section 6) -> other, whatever the first answer
    ("The answer is: After.\nReflection: the answer follows from the dependencies.", ("after", "other")),
    ("The answer is: Before.\nReflection: <your_reflection>\nThe final answer: <final_answer>", ("before", "other")),
    ("The final answer: I don't know.", ("other", "other")),
]


@pytest.mark.parametrize("text,expected", MATEO_REFLECTION_CASES)
def test_mateo_self_reflection(text, expected):
    assert parse_teo_answers(text, "self_reflection") == expected
    assert parse_teo_answer(text, "self_reflection") == expected[1]


def test_unknown_strategy_lists_valid_names():
    with pytest.raises(ValueError, match="self_reflection"):
        parse_teo_answer("Q1: Yes", "zero_shot")


@pytest.mark.parametrize("first,final,gold,outcome", [
    ("before", "before", "before", "kept_correct"), ("after", "after", "before", "kept_wrong"),
    ("after", "before", "before", "corrected"), ("before", "other", "before", "broken"),
    ("after", "independent", "before", "changed_wrong"),
])
def test_reflection_outcome(first, final, gold, outcome):
    assert reflection_outcome(first, final, gold) == outcome


# ISO-Bench App. H: answer-only -> "use the first "YES" or "NO" as the prediction";
# explain-then-answer -> "We evaluate only the final tag" (<answer>YES</answer> / <answer>NO</answer>).
@pytest.mark.parametrize("text,strategy,expected", [
    ("YES", "answer_only", "DEP"), ("NO", "answer_only", "NONDEP"), ("no.", "answer_only", "NONDEP"),
    ("**Yes**, it must.", "answer_only", "DEP"), ("The answer is no", "answer_only", "NONDEP"),
    ("Yes or no, hard to say", "answer_only", "DEP"),          # the first of the two words counts
    ("No. Well, yes.", "answer_only", "NONDEP"),
    ("Nope, not known", "answer_only", "other"),                # whole words only: no YES/NO token
    ("I cannot tell", "answer_only", "other"), ("", "answer_only", "other"), (None, "answer_only", "other"),
    ("<think>The batter is mixed first.</think><answer>YES</answer>", "explain", "DEP"),
    ("<think>yes at first glance</think>\n<answer> no </answer>", "explain", "NONDEP"),
    ("<answer>NO</answer> wait <answer>YES</answer>", "explain", "DEP"),   # the final tag
    ("<think>It needs the dough. Yes.</think>", "explain", "other"),      # no tag: cut off at 120 tokens
    ("<think>...</think><answer>YES", "explain", "other"),                # tag not closed
    ("Answer: Yes", "explain", "other"),
    ("<answer>maybe</answer>", "explain", "other"),
])
def test_iso(text, strategy, expected):
    assert parse_iso_answer(text, strategy) == expected


def test_iso_unknown_strategy():
    with pytest.raises(ValueError, match="answer_only, explain"):
        parse_iso_answer("Yes", "cot")


# COHERENCE App. D.1: "output your final answer on the LAST line as a Python list"; App. F shows
# replies ending "Final Answer: [1, 3, 0, 2, 4]" and "The final answer is [3, 3, 0, 3]."
@pytest.mark.parametrize("text,expected", [
    ("### Step-by-Step Reasoning\n1. Image 1 fits.\n[1, 0, 4, 3, 2, 5]", [1, 0, 4, 3, 2, 5]),
    ("Placeholder 1 -> Image 1 ...\nFinal Answer: [1, 3, 0, 2, 4]", [1, 3, 0, 2, 4]),
    ("The final answer is [3, 3, 0, 3].", [3, 3, 0, 3]),          # returned as written: invalid later
    ("reasoning\n**[2,0,1]**\n", [2, 0, 1]),
    ("```python\n[2, 0]\n```", [2, 0]),                          # a closing fence is not a line
    ("Image 2 then Image 0: [9, 9]\nso [2, 0]", [2, 0]),          # the last list of the last line
    ("[-1, 0]", [-1, 0]),
    ("[9, 9] was my first guess; final: [2, 0]", [2, 0]),       # two lists on the last line: the last one
    ("[2, 0, 1]\nThat is my answer.", None),                      # the list is not on the last line
    ("The answer is 2, 0, 1", None),
    ("[a, b]", None), ("[]", None), ("", None), (None, None),
])
def test_coherence(text, expected):
    assert parse_coherence_answer(text) == expected


def test_coherence_invalid_counts_in_report():
    instances = [{"instance_id": f"i{k}", "candidates": ["a", "b", "c"], "gold": [2, 0], "distractors": [1],
                  "difficulty": "easy"} for k in range(3)]
    preds = {"i0": parse_coherence_answer("...\n[2, 0]"),
             "i1": parse_coherence_answer("no idea"),          # unparsable
             "i2": parse_coherence_answer("[2, 2]")}           # parsed, but Image 2 used twice: invalid
    report = coherence_report(instances, preds)
    assert report["exact_match"] == pytest.approx(1 / 3) and report["reject_accuracy"] == pytest.approx(1 / 3)
    assert report["invalid_rate"] == pytest.approx(2 / 3) and report["unparsable_rate"] == pytest.approx(1 / 3)
