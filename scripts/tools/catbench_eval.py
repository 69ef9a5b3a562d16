"""Score answer files on CaT-Bench questions (Lal et al., EMNLP 2024): one table, same metrics for all.

    python scripts/tools/catbench_eval.py --questions ../shared/data/catbench/test_questions_sample.jsonl \\
        --answers "plan head=logs/teo_plan_head_rfg/runs/RUN/predictions_test.jsonl" \\
        --answers "bare head=logs/teo_head_rfg/runs/RUN/predictions_test.jsonl" \\
        [--gpt4 GPT4_ANSWERS.jsonl] [--out table.md] [--json rows.json]

Rows: always yes, always no, the majority class, then one row per answers file.  Columns: accuracy,
precision / recall / F1 of the dependent ("yes") class, macro F1 over yes/no
(:func:`seqaware.metrics.classification.binary_report`, the CaT-Bench Step Order Prediction scores), twin
consistency (:func:`seqaware.metrics.classification.twin_consistency`: both questions asked about a step pair,
"before" and "after", answered alike), the share of questions without a yes/no answer
(``invalid``: missing or unparsable, counted wrong) and ``n``.

Answers file format (JSON lines, one answer per question; the ``predictions_test.jsonl`` that
``train.py experiment=teo_head_rfg|teo_plan_head_rfg|teo_plan_head_catbench`` writes is one;
``teo_plan_head_catbench``'s also holds the logistic-regression baseline's answers: score them with
``--answer-field lr_answer``):

* the question: ``id`` as ``train.py`` writes it (``PLAN-QUESTION_TYPE-QUESTION_IDX``, see
  :func:`data_modules.adapters.catbench.question_id`), or the CaT-Bench fields
  ``plan_idx``, ``question_type`` and ``question_idx``;
* the answer: field ``answer`` (``--answer-field`` to change): ``yes`` / ``no``, case and
  surrounding spaces ignored; a text starting with "yes" or "no" (e.g. a published model reply
  "Yes. Step 3 ...") is read as that answer; anything else is unparsable.

``--gpt4 PATH`` is ``--answers "GPT-4=PATH"`` for a file of published GPT-4 answers in that format.

``--rfg DIR`` (the English Recipe Flow Graph folder, e.g. ``../shared/data/rfg/r-100``) adds two
diagnostic rows that answer each question from the flow graph of its ``efg_recipe_id`` (converted as
``data_modules.adapters.rfg`` does, one step per sentence): "r-FG direct" says yes when the pair is a
direct dependency (an edge of the transitive reduction: what MATEO-style training pairs call
``before``), "r-FG path" when any path joins the steps.  They show how far labels built from r-FG
agree with CaT-Bench's gold; a question whose recipe is not in DIR, or whose step count differs,
gets no answer (counted as unparsable).
``--yes-share S`` adds a second table: every row re-weighted so that "yes" questions weigh a share ``S`` of
the total (:func:`seqaware.metrics.classification.share_weights`), e.g. ``0.459`` for the questions of the
44 published test plans outside the 13 sample plans, to forecast a sample's scores on a set with another
mix of answers (twin consistency is left out: it does not depend on the mix).

Answers to questions that are not in ``--questions`` are ignored (counted on stderr); a question
without an answer counts as unparsable.  A line that is not a JSON object or lacks the id or
answer fields stops the script with ``file:line: field: reason``; a missing file, or one without a
question or answer, stops it naming its option (``--questions: no such file: PATH``,
``--answers NAME=PATH: the file holds no answers``).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from data_modules.adapters.catbench import question_id, read_catbench  # noqa: E402
from seqaware.metrics.classification import binary_report, binary_rows, format_table, share_weights, twin_consistency  # noqa: E402

COLUMNS = (("accuracy", "accuracy"), ("precision", "P yes"), ("recall", "R yes"), ("f1", "dependent F1"),
           ("macro_f1", "macro F1"), ("twin_consistency", "twin consistency"), ("invalid_rate", "invalid"), ("n", "n"))
_ANSWER = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)


def parse_answer(value: Any) -> Optional[str]:
    """``yes`` / ``no`` from an answer value (see the module docstring), else None."""
    if not isinstance(value, str):
        return None
    match = _ANSWER.match(value.strip())
    return match.group(1).lower() if match else None


def read_answers(path: Path, answer_field: str = "answer", option: str = "answers file") -> dict[str, Optional[str]]:
    """``question id -> yes | no | None`` from an answers file; bad lines raise ``file:line: field: reason``.
    ``option`` is the command-line option named when the file is missing or holds no answers
    (``--answers NAME``, ``--gpt4``)."""
    if not path.is_file():
        raise FileNotFoundError(f"{option}: no such file: {path}")
    answers: dict[str, Optional[str]] = {}
    problems = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(f"{path}:{line_no}: json: {err.msg}")
            continue
        if not isinstance(record, dict):
            problems.append(f"{path}:{line_no}: record: expected a JSON object, got {type(record).__name__}")
            continue
        if "id" in record:
            qid = str(record["id"])
        elif all(k in record for k in ("plan_idx", "question_type", "question_idx")):
            qid = question_id(record)
        else:
            problems.append(f"{path}:{line_no}: id: missing (give 'id' or 'plan_idx', 'question_type', 'question_idx')")
            continue
        if answer_field not in record:
            problems.append(f"{path}:{line_no}: {answer_field}: missing field")
            continue
        answers[qid] = parse_answer(record[answer_field])
    if problems:
        raise ValueError("bad answers file:\n" + "\n".join(problems))
    if not answers:
        raise ValueError(f"{option}={path}: the file holds no answers")
    return answers


def rfg_answers(questions: list[dict[str, Any]], rfg_dir: Path) -> dict[str, dict[str, Optional[str]]]:
    """The "r-FG direct" and "r-FG path" answers (see the module docstring), keyed by question id."""
    from data_modules.adapters import rfg
    from seqaware import dag as dag_utils

    procedures = {p.id: p for p in rfg.convert(rfg_dir).all_procedures()}
    direct: dict[str, Optional[str]] = {}
    path: dict[str, Optional[str]] = {}
    graphs: dict[str, tuple[set, Any]] = {}
    for q in questions:
        proc = procedures.get(q.get("plan") or "")
        if proc is None or proc.num_steps != len(q["steps"]) or proc.dag is None:
            direct[q["pair_id"]] = path[q["pair_id"]] = None
            continue
        if proc.id not in graphs:
            edges = [(int(a), int(b)) for a, b in proc.dag]
            graphs[proc.id] = ({tuple(e) for e in dag_utils.transitive_reduction(proc.num_steps, edges)},
                               dag_utils.transitive_closure(proc.num_steps, edges))
        reduction, closure = graphs[proc.id]
        a, b = q["first"], q["second"]
        direct[q["pair_id"]] = "yes" if (a, b) in reduction else "no"
        path[q["pair_id"]] = "yes" if bool(closure[a][b]) else "no"
    return {"r-FG direct": direct, "r-FG path": path}


def score(questions: list[dict[str, Any]], systems: dict[str, dict[str, Optional[str]]]) -> dict[str, dict[str, Any]]:
    """Rows of the table: baselines, then one per system (answers keyed by question id)."""
    gold = [q["answer"] for q in questions]
    ids = [q["pair_id"] for q in questions]
    twins = [(q.get("plan_idx"), q.get("plan"), q["first"], q["second"]) for q in questions]
    predictions = {name: [answers.get(i) for i in ids] for name, answers in systems.items()}
    rows = binary_rows(gold, predictions)
    for name, row in rows.items():
        given = predictions.get(name) or [name.split()[-1].strip("()")] * len(questions)
        row.update(twin_consistency(twins, given))
    return rows


def reweighted(questions: list[dict[str, Any]], systems: dict[str, dict[str, Optional[str]]],
               yes_share: float) -> dict[str, dict[str, Any]]:
    """The rows of :func:`score` (without twin consistency) with "yes" questions weighing ``yes_share``."""
    gold = [q["answer"] for q in questions]
    weights = share_weights(gold, yes_share)
    ids = [q["pair_id"] for q in questions]
    given = {"always yes": ["yes"] * len(gold), "always no": ["no"] * len(gold),
             **{name: [answers.get(i) for i in ids] for name, answers in systems.items()}}
    return {name: binary_report(gold, pred, weights=weights) for name, pred in given.items()}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", required=True, type=Path, help="CaT-Bench questions (JSON lines)")
    parser.add_argument("--answers", action="append", default=[], metavar="NAME=PATH",
                        help="an answers file (repeatable); NAME labels its row")
    parser.add_argument("--gpt4", type=Path, default=None, help="published GPT-4 answers (same format): row 'GPT-4'")
    parser.add_argument("--rfg", type=Path, default=None,
                        help="r-FG folder: add the 'r-FG direct' / 'r-FG path' diagnostic rows")
    parser.add_argument("--answer-field", default="answer", help="field holding the yes/no answer (default: answer)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    parser.add_argument("--yes-share", type=float, default=None, metavar="S",
                        help="also print every row re-weighted so that 'yes' questions weigh a share S (0 < S < 1)")
    args = parser.parse_args(argv)

    specs = []
    for spec in args.answers:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"--answers expects NAME=PATH, got {spec!r}")
        specs.append((name, Path(path), f"--answers {name}"))
    if args.gpt4 is not None:
        specs.append(("GPT-4", args.gpt4, "--gpt4"))
    questions = read_catbench(args.questions, key="--questions")
    known = {q["pair_id"] for q in questions}
    systems = {}
    for name, path, option in specs:
        answers = read_answers(path, args.answer_field, option)
        extra = len(set(answers) - known)
        missing = len(known - set(answers))
        if extra or missing:
            print(f"{name}: {extra} answers to questions not in {args.questions} ignored; "
                  f"{missing} questions without an answer (counted as unparsable)", file=sys.stderr)
        systems[name] = answers
    if args.rfg is not None:
        systems.update(rfg_answers(questions, args.rfg))
    rows = score(questions, systems)
    table = format_table(rows, COLUMNS)
    if args.yes_share is not None:
        share = reweighted(questions, systems, args.yes_share)
        table += (f"\n\nRe-weighted so that 'yes' questions weigh {100 * args.yes_share:.1f}%:\n\n"
                  + format_table(share, [c for c in COLUMNS if c[0] not in ("twin_consistency", "n")]))
        rows = {"rows": rows, f"yes_share_{args.yes_share}": share}
    print(table)
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=float) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
