"""Parse free-text model answers into TEO classes, ISO labels and COHERENCE assignments.

TEO (prompts of :mod:`seqaware.teo.prompts`, MATEO Table 5; answer formats of Table 5 / Table 6):

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

ISO: ``DEP`` for yes, ``NONDEP`` for no, ``other`` otherwise; answer-only replies must use yes or no
but not both, explain-then-answer replies end with ``Answer: Yes|No``.

COHERENCE: one ``<image_i>: Image k`` (1-based candidates) per placeholder, parsed strictly: any
other format, a missing or repeated placeholder, an out-of-range or repeated candidate gives None
(an invalid prediction, counted by :func:`seqaware.metrics.coherence.coherence_report`).
"""
from __future__ import annotations

import re

from seqaware.teo.prompts import QUESTION_STRATEGIES, STRATEGIES

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


# ---------------------------------------------------------------- ISO
_ISO_FINAL = re.compile(r"\banswer\s*(?:is)?\s*[:=\-]?\s*\W{0,3}(yes|no)\b", re.IGNORECASE)
_ISO_LABEL = {"yes": "DEP", "no": "NONDEP"}


def parse_iso_answer(text: str | None, strategy: str = "answer_only") -> str:
    """``DEP`` (yes) / ``NONDEP`` (no) / ``other`` for an ISO reply.

    ``answer_only``: the reply uses yes or no (as words) but not both.
    ``explain``: the last ``Answer: Yes|No``; failing that, a last line that starts with yes/no.
    """
    if strategy not in ("answer_only", "explain"):
        raise ValueError(f"unknown ISO strategy {strategy!r}; valid ISO strategies: answer_only, explain")
    cleaned = _clean(text).strip()
    if strategy == "explain":
        found = _ISO_FINAL.findall(cleaned)
        if found:
            return _ISO_LABEL[found[-1].lower()]
        lines = [line for line in cleaned.split("\n") if line.strip()]
        match = _YES_NO.match(lines[-1]) if lines else None
        return _ISO_LABEL[match.group(1).lower()] if match else OTHER
    words = set(re.findall(r"\b(yes|no)\b", cleaned.lower()))
    return _ISO_LABEL[words.pop()] if len(words) == 1 else OTHER


# ---------------------------------------------------------------- COHERENCE
_ASSIGNMENT = re.compile(r"^\s*(?:[-+•]\s*)?<image_(\d+)>\s*[:=]\s*(?:image\s*)?(\d+)\s*\.?\s*$", re.IGNORECASE)


def parse_coherence_answer(text: str | None, num_placeholders: int, num_candidates: int) -> list[int] | None:
    """Candidate index (0-based) per placeholder, or None when the reply is not a valid assignment.

    Every non-empty line (markdown removed) must be ``<image_i>: Image k`` (``Image`` optional,
    ``=`` accepted for ``:``, a list bullet allowed); each placeholder ``1..num_placeholders``
    exactly once; each ``k`` in ``1..num_candidates`` and used once.
    """
    lines = [line for line in _clean_coherence(text).split("\n") if line.strip()]
    assignment: dict[int, int] = {}
    for line in lines:
        match = _ASSIGNMENT.match(line)
        if not match:
            return None
        slot, candidate = int(match.group(1)), int(match.group(2))
        if slot in assignment or not 1 <= slot <= num_placeholders or not 1 <= candidate <= num_candidates:
            return None
        assignment[slot] = candidate - 1
    if sorted(assignment) != list(range(1, num_placeholders + 1)):
        return None
    pred = [assignment[i] for i in range(1, num_placeholders + 1)]
    return pred if len(set(pred)) == len(pred) else None


def _clean_coherence(text: str | None) -> str:
    """Like :func:`_clean` but keeps ``_`` and ``>`` (they are part of ``<image_1>``)."""
    if not text:
        return ""
    return re.sub(r"[*`#]+", "", str(text)).replace("\r\n", "\n").replace("\r", "\n")
