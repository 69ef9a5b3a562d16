"""Parse free-text model answers into TEO classes, ISO labels and COHERENCE assignments.

TEO (prompts of :mod:`seqaware.vlm.prompts`, MATEO Table 5; answer formats of Table 5 / Table 6):

* question strategies (``baseline``, ``instructions``, ``icl``) and the fine-tuned model answer
  Q1 (A before B), Q2 (A after B), Q3 (parallel) in MATEO's format ``Q1: The answer is: Yes.``
  (``The answer is:`` optional, so ``Q1: Yes`` reads the same). MATEO section 3: exactly one ``Yes``
  and two ``No`` give that class (Q1 -> ``before``, Q2 -> ``after``, Q3 -> ``independent``); anything
  else -- a missing answer, several Yes, all No, ``I don't know`` -- is ``other``.
  A question that appears several times (the model echoes the questions, then answers them) is read
  from its answered occurrences: an occurrence without a Yes/No/I-don't-know after it (an echoed
  question, the echoed ``<Yes/No/I don't know>`` template) is skipped; answered occurrences that
  disagree make the reply ``other`` (no occurrence is preferred over another).
* ``cot``: the *last* ``The answer is: X``, X in Before/After/Parallel (``parallel`` and
  ``independent`` -> ``independent``); MATEO section 3: CoT predicts the class directly.
* ``self_reflection``: the first answer is the *first* ``The answer is: X``; the final answer (the
  one scored) is the *last* ``The final answer: X`` (Table 5 format ``Reflection: ... The final
  answer: ...``). A reply without a final answer is ``other`` (MATEO section 6 counts these as
  failures to self-reflect), even when it has a first answer.

Matching ignores case, markdown emphasis (``**``, ``__``, backticks, headings), list bullets,
surrounding punctuation and extra text; a reply may hold the three answers on one line or three.

ISO-Bench (App. H): ``answer_only`` -> the first YES/NO word, ``explain`` -> the last
``<answer>YES|NO</answer>`` tag; ``DEP`` for yes, ``NONDEP`` for no, ``other`` when there is none.

COHERENCE (App. D.1): the Python list of 0-based image indices on the reply's last line, as written
(validity is judged by :mod:`seqaware.metrics.coherence`), or None when the last line has no list.
"""
from __future__ import annotations

import re

from seqaware.vlm.prompts import QUESTION_STRATEGIES, STRATEGIES

OTHER = "other"
_QUESTION_CLASS = {1: "before", 2: "after", 3: "independent"}
_ANSWER_CLASS = {"before": "before", "after": "after", "parallel": "independent", "independent": "independent"}

_MARKDOWN = re.compile(r"[*_`#>]+")
# a question label at the start of a line / after a separator, e.g. "Q1:", "- **Q2)**", "Question 3 -"
# inside running text ("Q3: Yes, since Q1 is No") a label only counts when a yes/no follows it directly
_LABEL = re.compile(
    r"(?:(?:^|(?<=[\n,;.]))[ \t]*(?:[-+•]\s*|\d+[.)]\s+)?(?:q|question)\s*([1-3])\b\s*[:).\-]?"
    r"|(?<=\s)(?:q|question)\s*([1-3])\s*[:)]\s*(?=(?:yes|no)\b))",
    re.IGNORECASE,
)
_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_DONT_KNOW = "don't know"
"""The third answer of MATEO's ternary questions (section 3); it makes the reply ``other``."""
_ANSWER_WORD = re.compile(r"^\W*(yes|no|i\s+do\s*n[o']?t\s+know)\b", re.IGNORECASE)
_ANSWER_PREFIX = re.compile(r"^\W*(?:the\s+)?answer\s*(?:is)?\s*[:=\-]?", re.IGNORECASE)
_TEMPLATE_ECHO = re.compile(r"^\W*yes\s*/\s*no", re.IGNORECASE)  # "<Yes/No/I don't know>" copied from the prompt
_CLASS_WORD = r"(before|after|parallel|independent)\b"
_ANSWER_IS = re.compile(r"\bthe\s+answer\s*(?:is)?\s*[:=\-]?\s*\W{0,3}" + _CLASS_WORD, re.IGNORECASE)
_FINAL_ANSWER = re.compile(r"\b(?:the\s+)?final\s+answer\s*(?:is)?\s*[:=\-]?\s*\W{0,3}" + _CLASS_WORD, re.IGNORECASE)


def _clean(text: str | None) -> str:
    """Remove markdown emphasis/heading characters; normalise line ends. None -> ''."""
    if not text:
        return ""
    return _MARKDOWN.sub("", str(text)).replace("\r\n", "\n").replace("\r", "\n")


def _answer_word(text: str) -> str | None:
    """``yes`` / ``no`` / ``don't know`` at the start of ``text`` (after an optional ``The answer is:``)."""
    text = _ANSWER_PREFIX.sub("", text, count=1)
    if _TEMPLATE_ECHO.match(text):
        return None
    match = _ANSWER_WORD.match(text)
    if not match:
        return None
    word = match.group(1).lower()
    return word if word in ("yes", "no") else _DONT_KNOW


def _segment_answer(segment: str) -> str | None:
    """``yes``/``no``/``don't know`` answering one question segment, or None when it holds no answer.

    The answer is the first word after the label (after an optional ``The answer is:``); if the
    model repeated the question (``Q1: Must Step A ...? Yes``), the first word after the first
    ``?`` on the label's line.
    """
    segment = segment.strip()
    answer = _answer_word(segment)
    if answer:
        return answer
    first_line = segment.split("\n", 1)[0]
    if "?" in first_line:
        return _answer_word(first_line.split("?", 1)[1])
    return None


def question_answers(text: str | None) -> dict[int, str | None]:
    """Answers to Q1-Q3 found in ``text``: ``{1: "yes", 2: "no", 3: "don't know", ...}``.

    Only questions that appear get a key. The value is ``yes``, ``no``, ``don't know`` or None (no
    answer, or answered occurrences that disagree); occurrences without an answer (echoed questions)
    are skipped when another occurrence of the question is answered. Without any ``Q1``-style label,
    a reply made of exactly three yes/no words (``Yes\\nNo\\nNo``, ``Yes, No, No``, or three
    ``The answer is: Yes.`` lines) is read in Q1-Q3 order.
    """
    text = _clean(text)
    labels = list(_LABEL.finditer(text))
    found: dict[int, list[str | None]] = {}
    if labels:
        for k, match in enumerate(labels):
            end = labels[k + 1].start() if k + 1 < len(labels) else len(text)
            question = int(match.group(1) or match.group(2))
            found.setdefault(question, []).append(_segment_answer(text[match.end():end]))
        answers: dict[int, str | None] = {}
        for question, values in found.items():
            given = {v for v in values if v is not None}
            answers[question] = given.pop() if len(given) == 1 else None
        return answers
    words = re.findall(r"[a-z']+", re.sub(r"\bthe\s+answer\s+is\b", " ", text.lower()))
    if len(words) == 3 and all(w in ("yes", "no") for w in words):
        return {i + 1: w for i, w in enumerate(words)}
    return {}


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; valid strategies: {', '.join(STRATEGIES)}")


def _parse_questions(text: str | None) -> str:
    answers = question_answers(text)
    if sorted(answers) != [1, 2, 3] or any(a is None for a in answers.values()):
        return OTHER
    yes = [q for q, a in answers.items() if a == "yes"]
    no = [q for q, a in answers.items() if a == "no"]
    return _QUESTION_CLASS[yes[0]] if len(yes) == 1 and len(no) == 2 else OTHER


def _classes(pattern: re.Pattern, text: str | None) -> list[str]:
    return [_ANSWER_CLASS[m.group(1).lower()] for m in pattern.finditer(_clean(text))]


def parse_teo_answers(text: str | None, strategy: str) -> tuple[str, str]:
    """``(first, final)`` answers of a reply, each ``before|after|independent|other``.

    For ``self_reflection`` the first is the initial ``The answer is: X`` and the final the last
    ``The final answer: X`` (to count kept / corrected / broken answers as MATEO does); for every
    other strategy ``first == final``.
    """
    _check_strategy(strategy)
    if strategy in QUESTION_STRATEGIES:
        label = _parse_questions(text)
        return label, label
    if strategy == "cot":
        found = _classes(_ANSWER_IS, text)
        label = found[-1] if found else OTHER
        return label, label
    first = _classes(_ANSWER_IS, text)
    final = _classes(_FINAL_ANSWER, text)
    return (first[0] if first else OTHER), (final[-1] if final else OTHER)


def parse_teo_answer(text: str | None, strategy: str) -> str:
    """The TEO class of a reply (the final answer for ``self_reflection``): see the module docstring."""
    return parse_teo_answers(text, strategy)[1]


def reflection_outcome(first: str, final: str, gold: str) -> str:
    """How self-reflection changed an answer: ``kept_correct``, ``kept_wrong``, ``corrected``,
    ``broken`` (right -> wrong) or ``changed_wrong`` (wrong -> another wrong)."""
    if first == final:
        return "kept_correct" if final == gold else "kept_wrong"
    if final == gold:
        return "corrected"
    return "broken" if first == gold else "changed_wrong"


# ---------------------------------------------------------------- ISO (ISO-Bench, App. H)
_ISO_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
# App. H: "a final answer enclosed by <answer>YES</answer> or <answer>NO</answer>"
_ISO_TAG = re.compile(r"<answer>\s*(yes|no)\s*</answer>", re.IGNORECASE)
_ISO_LABEL = {"yes": "DEP", "no": "NONDEP"}


def parse_iso_answer(text: str | None, strategy: str = "answer_only") -> str:
    """``DEP`` (YES) / ``NONDEP`` (NO) / ``other`` (unparsable) for an ISO-Bench reply (App. H).

    ``answer_only``: the first ``YES`` or ``NO`` of the reply, as a whole word ("use the first "YES"
    or "NO" as the prediction"). ``explain``: the last ``<answer>YES</answer>`` /
    ``<answer>NO</answer>`` tag ("We evaluate only the final tag"); a reply without a complete tag
    (e.g. cut off by the 120-token limit) is ``other``, whatever it says elsewhere. Matching ignores
    case and whitespace inside the tag. ``other`` replies are left out of the metrics, as the paper
    does (App. H footnote: "We discard outputs lacking either token"; see
    :func:`seqaware.metrics.iso.iso_report`).
    """
    if strategy not in ("answer_only", "explain"):
        raise ValueError(f"unknown ISO strategy {strategy!r}; valid ISO strategies: answer_only, explain")
    text = "" if text is None else str(text)
    if strategy == "explain":
        found = _ISO_TAG.findall(text)
        return _ISO_LABEL[found[-1].lower()] if found else OTHER
    match = _ISO_WORD.search(text)
    return _ISO_LABEL[match.group(1).lower()] if match else OTHER


# ---------------------------------------------------------------- COHERENCE (App. D.1)
_INT_LIST = re.compile(r"\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*,?\s*\]")
_DECORATION = re.compile(r"^[\s`*_#>.\-]*$")


def parse_coherence_answer(text: str | None) -> list[int] | None:
    """The Python list of image indices on the reply's last line (COHERENCE App. D.1), or None.

    D.1 asks to "output your final answer on the LAST line as a Python list" of 0-based image
    indices, one per placeholder. The last line that is not empty or pure markdown decoration
    (a code fence, ``**``) is read; its last ``[i, j, ...]`` list of integers is the answer, with
    any text around it ("Final Answer: [1, 3, 0, 2, 4]"). A list is returned as written -- a wrong
    length, a repeated or out-of-range index makes it *invalid*, which the metrics count
    (:func:`seqaware.metrics.coherence.coherence_scores`); None means no list on the last line
    (*unparsable*).
    """
    lines = [line for line in ("" if text is None else str(text)).replace("\r\n", "\n").replace("\r", "\n").split("\n")
             if not _DECORATION.match(line)]
    if not lines:
        return None
    found = _INT_LIST.findall(lines[-1])
    if not found:
        return None
    return [int(v) for v in re.split(r"\s*,\s*", found[-1].strip())]
