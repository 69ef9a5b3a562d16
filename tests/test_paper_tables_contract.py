"""scripts/studies/paper_tables.py: exact messages, notes and layouts a reader of the tables relies on.

Complements tests/test_paper_tables.py (whose builders it imports): every kind of bad ``published`` YAML
with the exact SystemExit message naming file, paper, table, row and field; the ISO-Bench
unparsable-replies notes; the exact markdown of small synthetic tables; value formatting.
"""
from __future__ import annotations

import json

import pytest
import yaml

from test_paper_tables import _iso_row, _one_table, _write, _wu_row, pt

PAPERS = "catbench, coherence, iso_bench, mateo, wu2022"
ISO = "iso_bench Table 1"
TEO_CELLS = {s: 0.1 for s in pt.STRATEGIES}


def _mateo2_row(**change):
    base = {"statistic": "# Steps", "train": {"value": 10}, "valid": {"value": 2}, "test": {"value": 3}}
    base.update(change)
    return base


def _catbench_row(**change):
    base = {"model": "G", "setting": "A", "p": "n/a", "r": "n/a", "f1": 0.5, "acc": "-", "macro_f1": "-"}
    base.update(change)
    return base


def _wu3_row(**change):
    """A Table 3 row: a Table 2 row with pretraining objectives instead of the pretraining flag."""
    base = {k: v for k, v in _wu_row(modality="image").items() if k != "pretraining"}
    return {**base, "objectives": ["ISP"], **change}


# ---------------------------------------------------------------- the published file: exact messages
# (paper, table, rows, extra table fields) -> message after "{path}: "
ROW_ERRORS = [
    # a row
    ("iso_bench", "Table 1", [["M", "A"]], {}, f"{ISO}: row 0: must be a mapping, got ['M', 'A']"),
    ("iso_bench", "Table 1", [_iso_row(), _iso_row()], {}, f"{ISO}: row 1 repeats row 0 ('M', 'A')"),
    ("mateo", "Table 2", [_mateo2_row(mean=1)], {},
     "mateo Table 2: row 0 (# Steps): unknown field(s) ['mean']; allowed: statistic, test, train, valid, repaired, flags, note"),
    ("iso_bench", "Table 1", [_iso_row(PMR=0.4)], {},  # the labels in the table's column order, every run
     f"{ISO}: row 0 (M): unknown field(s) ['PMR']; allowed: model, setting, dep, macro, nondep, repaired, flags, note"),
    ("mateo", "Table 2", [_mateo2_row(valid=[2])], {},
     "mateo Table 2: row 0 (# Steps): field 'valid' must be a mapping of value, std"),
    ("wu2022", "Table 2", [{k: v for k, v in _wu_row().items() if k != "recipeqa"}], {},
     "wu2022 Table 2: row 0 (M): field 'recipeqa' must be a mapping of acc, pmr, lq, lr, tau, dist"),
    # labels
    ("mateo", "Table 3", [{"model": "M", "modality": "image", "finetuned": "yes", **TEO_CELLS}], {},
     "mateo Table 3: row 0 (M): field 'finetuned' is 'yes', expected true or false"),
    ("mateo", "Table 3", [{"model": "M", "modality": "image", "test_fraction": 0, **TEO_CELLS}], {},
     "mateo Table 3: row 0 (M): field 'test_fraction' is 0, expected a number in (0, 1]"),
    ("mateo", "Table 3", [{"model": "M", "modality": "image", "test_fraction": 1.5, **TEO_CELLS}], {},
     "mateo Table 3: row 0 (M): field 'test_fraction' is 1.5, expected a number in (0, 1]"),
    ("mateo", "Table 3", [{"model": "M", "modality": "image", "test_fraction": True, **TEO_CELLS}], {},
     "mateo Table 3: row 0 (M): field 'test_fraction' is True, expected a number in (0, 1]"),
    ("mateo", "Table 3", [{"model": "M", "modality": "image", "test_fraction": "0.2", **TEO_CELLS}], {},
     "mateo Table 3: row 0 (M): field 'test_fraction' is '0.2', expected a number in (0, 1]"),
    ("wu2022", "Table 3", [_wu3_row(objectives=[])], {},
     "wu2022 Table 3: row 0 (M): field 'objectives' is [], expected a non-empty list of distinct names from MLM, ISP, PISP, SMRM"),
    ("wu2022", "Table 3", [_wu3_row(objectives=["MLM", "MLM"])], {},
     "wu2022 Table 3: row 0 (M): field 'objectives' is ['MLM', 'MLM'], "
     "expected a non-empty list of distinct names from MLM, ISP, PISP, SMRM"),
    ("wu2022", "Table 3", [_wu3_row(objectives={"MLM": 1})], {},
     "wu2022 Table 3: row 0 (M): field 'objectives' is {'MLM': 1}, "
     "expected a non-empty list of distinct names from MLM, ISP, PISP, SMRM"),
    ("iso_bench", "Table 1", [_iso_row(model=3)], {}, f"{ISO}: row 0: field 'model' is 3, expected a non-empty string"),
    ("iso_bench", "Table 1", [_iso_row(setting="E>A")], {},
     f"{ISO}: row 0 (M): field 'setting' is 'E>A', expected one of E->A, A, -"),
    # metric cells
    ("iso_bench", "Table 1", [_iso_row(dep={"p": 0.5, "r": 0.5, "f": 0.5, "acc": 1})], {},
     f"{ISO}: row 0 (M): field 'dep' has unknown metric(s) ['acc']; allowed: p, r, f"),
    ("iso_bench", "Table 1", [_iso_row(dep={"p": 0.5, "r": 0.5})], {},
     f"{ISO}: row 0 (M): field 'dep.f' is missing (give the number, '-' for a dash in the paper or 'n/a')"),
    ("iso_bench", "Table 1", [_iso_row(dep={"p": 0.5, "r": 0.5, "f": 50.0})], {},
     f"{ISO}: row 0 (M): field 'dep.f' is 50.0, expected a number in [0, 1], '-' or 'n/a'"),
    ("iso_bench", "Table 1", [_iso_row(dep={"p": "-", "r": 2.0, "f": 0.5})], {},       # a dash does not end the checks
     f"{ISO}: row 0 (M): field 'dep.r' is 2.0, expected a number in [0, 1], '-' or 'n/a'"),
    ("iso_bench", "Table 1", [_iso_row(dep={"p": "n/a", "r": 0.5, "f": True})], {},
     f"{ISO}: row 0 (M): field 'dep.f' is True, expected a number in [0, 1], '-' or 'n/a'"),
    ("wu2022", "Table 2", [_wu_row(recipeqa={"acc": 101, "pmr": 10.0, "lq": 3.0, "lr": 2.0, "tau": 0.5, "dist": 4.0})], {},
     "wu2022 Table 2: row 0 (M): field 'recipeqa.acc' is 101, expected a number in [0, 100], '-' or 'n/a'"
     " (the paper prints a percentage: 45.2 % is 45.2)"),
    ("catbench", "Table 2", [_catbench_row(f1=5)], {},
     "catbench Table 2: row 0 (G): field 'f1' is 5, expected a number in [0, 1], '-' or 'n/a'"),
    ("catbench", "Table 2", [{k: v for k, v in _catbench_row().items() if k != "acc"}], {},
     "catbench Table 2: row 0 (G): field 'acc' is missing (give the number, '-' for a dash in the paper or 'n/a')"),
    ("mateo", "Table 2", [_mateo2_row(test={"value": -1})], {},
     "mateo Table 2: row 0 (# Steps): field 'test.value' is -1, expected a number in [0, inf], '-' or 'n/a'"),
    # repaired, flags, note
    ("iso_bench", "Table 1", [_iso_row(repaired="dep.f")], {},
     f"{ISO}: row 0 (M): field 'repaired' must map a field or group.metric to what was done"),
    ("iso_bench", "Table 1", [_iso_row(repaired={"dep.x": "why"})], {},
     f"{ISO}: row 0 (M): field 'repaired' names 'dep.x', which is not a field or group.metric of this table"),
    ("iso_bench", "Table 1", [_iso_row(repaired={"setting": " "})], {},
     f"{ISO}: row 0 (M): field 'repaired.setting' must say what was done"),
    ("iso_bench", "Table 1", [_iso_row(flags=[3])], {}, f"{ISO}: row 0 (M): field 'flags' must be a list of non-empty strings"),
    ("iso_bench", "Table 1", [_iso_row(flags=[" "])], {}, f"{ISO}: row 0 (M): field 'flags' must be a list of non-empty strings"),
    ("iso_bench", "Table 1", [_iso_row(note=" ")], {}, f"{ISO}: row 0 (M): field 'note' must be a non-empty string"),
    ("iso_bench", "Table 1", [_iso_row(note=3)], {}, f"{ISO}: row 0 (M): field 'note' must be a non-empty string"),
    # the table around the rows
    ("iso_bench", "Table 1", [_iso_row()], {"notes": "one"}, f"{ISO}: 'notes' must be a list of non-empty strings"),
    ("iso_bench", "Table 1", [_iso_row()], {"notes": [" "]}, f"{ISO}: 'notes' must be a list of non-empty strings"),
    ("iso_bench", "Table 1", [_iso_row()], {"notes": [3]}, f"{ISO}: 'notes' must be a list of non-empty strings"),
    ("iso_bench", "Table 1", [], {}, f"{ISO}: expected a non-empty list 'rows'"),
    ("iso_bench", "Table 1", {"model": "M"}, {}, f"{ISO}: expected a non-empty list 'rows'"),
    ("iso_bench", "Table 1", [_iso_row()], {"caption": "x"}, f"{ISO}: unknown field(s) ['caption']; allowed: name, notes, rows"),
    ("mateo", "Table 9", [_mateo2_row()], {}, "mateo Table 9: no such table in the schema; mateo has: Table 2, Table 3, Table 4"),
]


@pytest.mark.parametrize("paper, name, rows, extra, message", ROW_ERRORS)
def test_row_and_table_errors_exact(tmp_path, paper, name, rows, extra, message):
    path = _one_table(tmp_path, paper, name, rows, **extra)
    with pytest.raises(SystemExit) as err:
        pt.load_published(path)
    assert str(err.value) == f"{path}: {message}"


# whole-file YAML text -> message after "{path}: "
FILE_ERRORS = [
    ("- 1\n- 2\n", f"expected a mapping with the keys {PAPERS}"),
    ("wu2O22:\n  citation: c\n  tables: []\n", f"unknown paper key(s) ['wu2O22']; expected {PAPERS}"),
    ("mateo: [1]\n", "mateo: expected a mapping with a 'citation' and a list 'tables'"),
    ("mateo:\n  citation: c\n  tables: Table 3\n", "mateo: expected a mapping with a 'citation' and a list 'tables'"),
    ("mateo:\n  citation: ''\n  tables: []\n", "mateo: expected a mapping with a 'citation' and a list 'tables'"),
    ("mateo:\n  citation: c\n  year: 2026\n  tables: []\n", "mateo: unknown field(s) ['year']; allowed: citation, tables"),
    ("mateo:\n  citation: c\n  tables: [Table 3]\n", "mateo table 0: no such table in the schema; mateo has: Table 2, Table 3, Table 4"),
    ("mateo:\n  citation: c\n  tables:\n  - {name: Table 2, rows: [{statistic: x, train: {value: 1}, valid: {value: 1},"
     " test: {value: 1}}]}\n  - {name: Table 2, rows: []}\n", "mateo Table 2: listed twice"),
]


@pytest.mark.parametrize("text, message", FILE_ERRORS)
def test_file_errors_exact(tmp_path, text, message):
    path = tmp_path / "published.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit) as err:
        pt.load_published(path)
    assert str(err.value) == f"{path}: {message}"


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(SystemExit) as err:
        pt.load_published(tmp_path / "gone.yaml")
    assert str(err.value) == f"--published: no such file: {tmp_path / 'gone.yaml'}"
    path = tmp_path / "bad.yaml"
    path.write_text("mateo: [1, 2\n", encoding="utf-8")
    with pytest.raises(SystemExit) as err:
        pt.load_published(path)
    assert str(err.value).startswith(f"{path}: not valid YAML (")


def test_an_empty_file_has_no_tables(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    assert pt.load_published(path) == {}


# ---------------------------------------------------------------- ISO-Bench unparsable-replies notes
HEAD = ("Unparsable replies (App. H: excluded from the scores). From each row's DEP P, DEP R and NONDEP P, "
        "excluding them fixes NONDEP R; counting them wrong can only lower it "
        "(seqaware.metrics.iso.unparsable_consistency, within the printed rounding):")


def _pr(model, setting, rn, dp=0.5):
    # DEP P = DEP R = NONDEP P = 0.5 imply NONDEP R 0.5 under exclusion; over the rounding (+-0.005) of the three,
    # 0.495 * 0.495 / 0.505 / (that + 0.505 * 0.505 / 0.495) = 0.485 .. 0.515 (printed 0.49-0.51)
    return _iso_row(model=model, setting=setting, dep={"p": dp, "r": 0.5, "f": 0.5}, nondep={"p": 0.5, "r": rn, "f": 0.5})


def test_iso_unparsable_notes_sort_rows_into_the_rules_they_fit():
    rows = [_pr("Dash", "A", 0.5, dp="-"),                   # no DEP P: not judged, the next rows still are
            _pr("Fits", "A", 0.5), _pr("Low", "E->A", 0.3), _pr("High", "-", 0.9), _pr("Low2", "A", 0.2),
            _pr("Fits2", "E->A", 0.49)]
    assert pt.iso_unparsable_notes(rows) == [
        HEAD,
        "consistent with excluding them (App. H): Fits A, Fits2 E->A",
        "only with counting them wrong (unparsable=wrong): Low E->A (R NONDEP 0.30; excluding them implies 0.49-0.51), "
        "Low2 A (R NONDEP 0.20; excluding them implies 0.49-0.51)",
        "with neither: High - (R NONDEP 0.90; excluding them implies 0.49-0.51)"]


def test_iso_unparsable_notes_say_none_for_an_empty_group():
    assert pt.iso_unparsable_notes([_pr("Fits", "A", 0.5)]) == [
        HEAD, "consistent with excluding them (App. H): Fits A", "only with counting them wrong (unparsable=wrong): none"]
    assert pt.iso_unparsable_notes([_pr("Low", "A", 0.3)]) == [
        HEAD, "consistent with excluding them (App. H): none",
        "only with counting them wrong (unparsable=wrong): Low A (R NONDEP 0.30; excluding them implies 0.49-0.51)"]


def test_iso_published_unparsable_notes_printed_exactly():
    lines = pt.main([]).splitlines()
    i = lines.index(f"- {HEAD}")
    assert lines[i + 1:i + 4] == [
        "- consistent with excluding them (App. H): DeepSeek-VL2 E->A, DeepSeek-VL2 A, Llava-1.5 E->A, Llava-1.5 A, "
        "Qwen2.5-VL A, PaliGemma2 E->A, Llama-3.2 A, 4o-mini E->A, 4o-mini A, 4o E->A, 4o A, Sonnet E->A, o3 E->A, "
        "o4-mini E->A, Human -",
        "- only with counting them wrong (unparsable=wrong): Qwen2.5-VL E->A (R NONDEP 0.26; excluding them implies "
        "0.70-0.72), Llama-3.2 E->A (R NONDEP 0.13; excluding them implies 0.35-0.39), Sonnet A (R NONDEP 0.27; "
        "excluding them implies 0.46-0.49)",
        "- misfit through a figure flagged as misprinted (neither rule counted): PaliGemma2 A (R NONDEP 0.87; "
        "excluding them implies 0.89-0.90; nondep.p flagged)"]
    assert lines[i + 4] == ""                                # no row fits neither rule


# ---------------------------------------------------------------- layouts of small tables, exactly
def test_iso_table_markdown_exactly(tmp_path):
    path = _one_table(tmp_path, "iso_bench", "Table 1",
                      [_pr("Fits", "A", 0.5), _pr("Low", "E->A", 0.3)], notes=["A note."])
    text = pt.main(["--published", str(path)])
    assert text == "\n".join([
        "### ISO-Bench, Table 1: DEP / NONDEP / weighted macro-average P, R, F1 (A: answer; E->A: explain, then answer)",
        "",
        "| Model | Setting | DEP P | DEP R | DEP F | NONDEP P | NONDEP R | NONDEP F | MACRO AVG P | MACRO AVG R | MACRO AVG F |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| Fits | A | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 |",
        "| Low | E->A | 0.50 | 0.50 | 0.50 | 0.50 | 0.30 | 0.50 | 0.50 | 0.50 | 0.50 |",
        "",
        "Source: C, Table 1.",
        "",
        "- A note.",
        f"- {HEAD}",
        "- consistent with excluding them (App. H): Fits A",
        "- only with counting them wrong (unparsable=wrong): Low E->A (R NONDEP 0.30; excluding them implies 0.49-0.51)",
    ]) + "\n"


def test_mateo_table_markdown_with_heading_star_repairs_flags_and_notes(tmp_path):
    rows = [{"model": "M", "modality": "image", **TEO_CELLS, "icl": 0.5, "cot": "-", "self_reflection": "n/a",
             "repaired": {"icl": "printed '05'", "modality": "printed 'Imgae'"}, "flags": ["odd"], "note": "check"},
            {"model": "M", "modality": "text", "test_fraction": 0.25, **TEO_CELLS},
            {"model": "N", "modality": "image_text", "finetuned": True, "test_fraction": 0.2, **TEO_CELLS}]
    path = _one_table(tmp_path, "mateo", "Table 3", rows)
    text = pt.main(["--published", str(path)])
    assert text == "\n".join([
        "### MATEO, Table 3: TEO consistency accuracy per prompt strategy, and fine-tuned",
        "",
        "| Modality | Baseline | Instructions | ICL | CoT | Self-Reflect. |",
        "|---|---:|---:|---:|---:|---:|",
        "| **M** |  |  |  |  |  |",
        "| Image-only° | 0.10 | 0.10 | 0.50° | - | n/a |",
        "| Text-only | 0.10* | 0.10* | 0.10* | 0.10* | 0.10* |",
        "| **N (fine-tuned)** |  |  |  |  |  |",
        "| Image+Text | 0.10* | 0.10* | 0.10* | 0.10* | 0.10* |",
        "",
        "Source: C, Table 3.",
        "",
        "- \\* Results achieved on 20%, 25% of the test set only.",
        "- ° M Image-only, icl: repaired, printed '05'",
        "- ° M Image-only, modality: repaired, printed 'Imgae'",
        "- flag, M Image-only: odd",
        "- M Image-only: check",
    ]) + "\n"


def test_wu_multi_reference_table_markdown(tmp_path):
    cells = {"acc_single": 50.0, "acc_multi": "-", "pmr_single": 10.0, "pmr_multi": "-", "lr_single": 2.0, "lr_multi": "-"}
    rows = [{"modality": "text", "model": "R", "subset": "multi", "human": True,
             "wikihow": dict(cells, benefit=41.18), "recipeqa": dict(cells)},
            {"modality": "text", "model": "R", "subset": "all", "wikihow": dict(cells), "recipeqa": dict(cells, acc_single=47.2)}]
    path = _one_table(tmp_path, "wu2022", "Table 4", rows)
    text = pt.main(["--published", str(path)])
    assert text.splitlines()[4:] == [
        "| **Text-Only** |" + "  |" * 12,
        "| Multi.† | 50.00 | - | 10.00 | - | 2.00 | - | 50.00 | - | 10.00 | - | 2.00 | - |",
        "| (% of instances benefit w. multi-reference) | 41.18% |" + "  |" * 5 + " n/a |" + "  |" * 5,
        "| All | 50.00 | - | 10.00 | - | 2.00 | - | 47.20 | - | 10.00 | - | 2.00 | - |",
        "",
        "Source: C, Table 4.",
    ]


def test_wu_objectives_printed_joined_with_plus():
    lines = pt.main([]).splitlines()
    assert "| MLM + ISP + SMRM | 79.47 | 63.67 | 4.57 | 4.03 | 0.85 | 1.54 | 81.40 | 63.00 | 4.57 | 4.00 | 0.87 | 1.20 |" in lines


def test_mateo_splits_with_and_without_std(tmp_path):
    path = _one_table(tmp_path, "mateo", "Table 2", [_mateo2_row(train={"value": 15.6, "std": 3.9})])
    assert pt.main(["--published", str(path)]).splitlines()[2:5] == [
        "|  | Train | Valid | Test |", "|---|---:|---:|---:|", "| # Steps | 15.6 ± 3.9 | 2 | 3 |"]


@pytest.mark.parametrize("value, metric, ours, text", [
    (0.5, pt.Metric("x", "", 0, 1), False, "0.50"),
    (0.125, pt.Metric("x", "", 0, 1), False, "0.125"),          # a published number keeps its printed digits
    (0.125, pt.Metric("x", "", 0, 1), True, "0.12"),            # ours: the column's decimals
    (47.2, pt.Metric("x", "", 0, 100, decimals=1), False, "47.2"),
    (3, pt.Metric("x", "", 0, 9, decimals=0), False, "3"),
    (1e-05, pt.Metric("x", "", 0, 1), False, "0.00"),           # exponent notation: the column's decimals
    (1e16, pt.Metric("x", "", 0, 1e17, decimals=0), False, "10000000000000000"),
    (None, pt.Metric("x", "", 0, 1), False, "n/a"),
    ("n/a", pt.Metric("x", "", 0, 1), False, "n/a"),
    ("-", pt.Metric("x", "", 0, 1), True, "-"),
])
def test_format_value(value, metric, ours, text):
    assert pt.format_value(value, metric, ours) == text


# ---------------------------------------------------------------- our rows in their row group
def test_our_sequencing_row_follows_its_modality_group(tmp_path):
    run = _write(tmp_path / "m.json", {"single/acc": 0.5})
    lines = pt.main(["--sequencing", f"t@wikihow/text={run}"]).splitlines()
    i = lines.index("| t (ours) |  | 50.00 | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |")
    assert lines[i - 1].startswith("| Human Performance |  | 83.35 ") and lines[i + 1] == "| **Multimodal** |" + "  |" * 13
    # Tables 2 and 4 get our text-only rows (Table 3 has no text-only group, Table 10 is image-only)
    assert lines.count("- Rows marked (ours) are our results, on the paper's scale.") == 2


def test_two_rows_with_neither_rule_are_listed_with_commas():
    rows = [_pr("High", "A", 0.9), _pr("Higher", "E->A", 0.95)]
    assert pt.iso_unparsable_notes(rows)[3] == ("with neither: High A (R NONDEP 0.90; excluding them implies 0.49-0.51), "
                                                "Higher E->A (R NONDEP 0.95; excluding them implies 0.49-0.51)")


def test_iso_notes_judge_only_the_published_rows_and_cite_the_source(tmp_path):
    path = tmp_path / "published.yaml"
    path.write_text(yaml.safe_dump({"iso_bench": {"citation": "Sadana et al. ISO-Bench, vol. X.", "tables": [
        {"name": "Table 1", "rows": [_pr("Fits", "A", 0.5)]}]}}), encoding="utf-8")
    low = {"precision_DEP": 0.5, "recall_DEP": 0.5, "f1_DEP": 0.5, "precision_NONDEP": 0.5, "recall_NONDEP": 0.25,
           "f1_NONDEP": 0.5, "macro_precision": 0.5, "macro_recall": 0.5, "macro_f1": 0.5}
    result = _write(tmp_path / "iso.json", {"task": "iso", "model": "vlm", "strategy": "answer_only",
                                            "modality": "image_text", "rows": {"vlm": low}})
    lines = pt.main(["--published", str(path), "--iso", str(result)]).splitlines()
    assert lines[5:] == [
        "| vlm (ours, unparsable=exclude) | A | 0.50 | 0.50 | 0.50 | 0.50 | 0.25 | 0.50 | 0.50 | 0.50 | 0.50 |",
        "",
        "Source: Sadana et al. ISO-Bench, vol. X, Table 1.",
        "",
        f"- {HEAD}",
        "- consistent with excluding them (App. H): Fits A",
        "- only with counting them wrong (unparsable=wrong): none",
        "- Rows marked (ours) are our results, on the paper's scale."]


# ---------------------------------------------------------------- our rows from run results
def test_sequencing_rows_exact():
    metrics = {"single/acc": 0.5, "single/pmr": 0.25, "single/lcs": 3.0, "single/lcstr": 2.0, "single/tau": 0.5,
               "acc": 0.75, "lcstr": 2.5, "subset_single/acc": 0.25, "subset_single/lcstr": 1.5,
               "subset_multi/acc": 0.875, "n": 4, "n_single": 2, "n_multi": 2}
    out = pt.sequencing_rows([("m", "wikihow", "image", metrics)])
    na6 = {k: "n/a" for k in ("acc", "pmr", "lq", "lr", "tau", "dist")}
    wikihow = {"acc": 50.0, "pmr": 25.0, "lq": 3.0, "lr": 2.0, "tau": 0.5, "dist": "n/a"}
    base = {"modality": "image", "model": "m", "wikihow": wikihow, "recipeqa": na6}
    na_multi = {k: "n/a" for k in ("acc_single", "acc_multi", "pmr_single", "pmr_multi", "lr_single", "lr_multi")}
    # Multi. single = (n * single/<m> - n_single * subset_single/<m>) / n_multi: Acc (4 * 0.5 - 2 * 0.25) / 2 = 0.75,
    # PMR (4 * 0.25 - 2 * 0) / 2 = 0.5 (no subset_single/pmr: that share counts 0), Lr (4 * 2 - 2 * 1.5) / 2 = 2.5
    multi_ref = {"single": {"acc_single": 25.0, "acc_multi": "-", "pmr_single": "n/a", "pmr_multi": "-",
                            "lr_single": 1.5, "lr_multi": "-"},
                 "multi": {"acc_single": 75.0, "acc_multi": 87.5, "pmr_single": 50.0, "pmr_multi": "n/a",
                           "lr_single": 2.5, "lr_multi": "n/a"},
                 "all": {"acc_single": 50.0, "acc_multi": 75.0, "pmr_single": 25.0, "pmr_multi": "n/a",
                         "lr_single": 2.0, "lr_multi": 2.5}}
    shown = {"single": "Single", "multi": "Multi.", "all": "All"}
    assert out == {
        ("wu2022", "Table 2"): [dict(base, pretraining="-", _label={"model": "m (ours)", "pretraining": ""})],
        ("wu2022", "Table 3"): [dict(base, objectives=[], _label={"objectives": "m (ours)"})],
        ("wu2022", "Table 4"): [],
        ("wu2022", "Table 10"): [{"modality": "image", "model": "m", "subset": s, "human": False,
                                  "_label": {"subset": f"{shown[s]} (m, ours)"}, "wikihow": multi_ref[s],
                                  "recipeqa": dict(na_multi)} for s in ("single", "multi", "all")]}


@pytest.mark.parametrize("counts, single_acc", [
    ({"n": 2, "n_single": 0, "n_multi": 2}, 50.0),              # no single-reference instance: no share to remove
    ({"n_single": 0, "n_multi": 2}, "n/a"),                     # no n
    ({"n": 2, "n_single": 2, "n_multi": 0}, "n/a"),             # no multi-reference instance
    ({"n": 2, "n_multi": 2}, "n/a"),                            # no n_single
])
def test_multi_subset_single_reference_mean(counts, single_acc):
    out = pt.sequencing_rows([("t", "recipeqa", "text", {"single/acc": 0.5, **counts})])
    multi = [r for r in out[("wu2022", "Table 4")] if r["subset"] == "multi"][0]
    assert multi["recipeqa"]["acc_single"] == single_acc
    assert multi["recipeqa"]["pmr_single"] == "n/a"             # no single/pmr
    assert out[("wu2022", "Table 3")] == [] and out[("wu2022", "Table 10")] == []


def test_read_metrics_forms(tmp_path):
    nested = _write(tmp_path / "nested.json", '{"metrics": {"test/single/acc": 0.5, "flag": true, "none": null, '
                    '"nan": NaN, "name": "x", "n": 3}}')
    assert pt.read_metrics(nested) == {"single/acc": 0.5, "n": 3.0}
    log = tmp_path / "train.log"
    log.write_bytes(b"progress \xff\xfe bar\nTEST_METRICS_JSON {\"test/acc\": 0.25}\n")
    assert pt.read_metrics(log) == {"acc": 0.25}                # undecodable bytes elsewhere in a log do not matter


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "expected a JSON object of metrics"),
    ("x\nTEST_METRICS_JSON {broken\n", None),
    ("no metrics\n", "neither a JSON metrics dict, a log with a TEST_METRICS_JSON line nor the table of "
                     "scripts/tools/score_predictions.py"),
])
def test_read_metrics_errors(tmp_path, text, message):
    path = _write(tmp_path / "m.log", text)
    with pytest.raises(SystemExit) as err:
        pt.read_metrics(path)
    if message is None:
        assert str(err.value).startswith(f"{path}: malformed TEST_METRICS_JSON line (")
    else:
        assert str(err.value) == f"{path}: {message}"


@pytest.mark.parametrize("result, message", [
    ([1], "not a result of scripts/tools/eval_teo.py (expected a JSON object)"),
    ({"task": "iso", "model": "m", "strategy": "explain", "modality": "image_text", "rows": []},
     "field 'rows' must map a system name to its metrics"),
    ({"task": "iso", "model": "m", "strategy": "cot", "modality": "image_text", "rows": {}},
     "ISO strategy 'cot', expected one of answer_only, explain"),
])
def test_iso_result_errors_name_the_file(tmp_path, result, message):
    path = _write(tmp_path / "iso.json", result)
    with pytest.raises(SystemExit) as err:
        pt.main(["--iso", str(path)])
    assert str(err.value) == f"{path}: {message}"


def test_teo_result_with_an_unknown_column_names_the_file(tmp_path):
    path = _write(tmp_path / "teo.json", {"task": "teo", "model": "m", "strategy": "cot", "modality": "video", "rows": {"m": {}}})
    with pytest.raises(SystemExit) as err:
        pt.main(["--teo", str(path)])
    assert str(err.value) == (f"{path}: strategy 'cot' / modality 'video' is not a MATEO column (strategies "
                              f"{', '.join(pt.STRATEGIES)}; modalities {', '.join(pt.MODALITIES)})")


@pytest.mark.parametrize("spec, parsed", [
    ("m@wikihow/text=runs/lr=0.1/test_metrics.json", ("m", "wikihow", "text", "runs/lr=0.1/test_metrics.json")),
    ("clip@vit@RecipeQA/Multimodal=a.log", ("clip@vit", "recipeqa", "multimodal", "a.log")),
])
def test_parse_sequencing_spec(spec, parsed):
    name, dataset, modality, path = pt.parse_sequencing_spec(spec)
    assert (name, dataset, modality, str(path)) == parsed


SEQ_FORM = "expected NAME@DATASET/MODALITY=PATH"
TEO_FORM = "expected NAME@STRATEGY/MODALITY=PATH"


@pytest.mark.parametrize("flag, spec, message", [
    ("--sequencing", "@wikihow/text=p", SEQ_FORM),
    ("--sequencing", "m@/text=p", SEQ_FORM),
    ("--sequencing", "m@wikihow/=p", SEQ_FORM),
    ("--sequencing", "m@wikihow/text=", SEQ_FORM),
    ("--sequencing", "m@wikihow/text", SEQ_FORM),
    ("--sequencing", "m@wikihow/text/x=p", "modality 'text/x', expected one of image, text, multimodal"),
    ("--sequencing", "m@wikihow/video=p", "modality 'video', expected one of image, text, multimodal"),
    ("--teo", "m@cot=p", TEO_FORM),
    ("--teo", "m@cot/=p", TEO_FORM),
    ("--teo", "m@fewshot/text=p", f"strategy 'fewshot', expected one of {', '.join(pt.STRATEGIES)}"),
    ("--teo", "m@cot/video=p", f"modality 'video', expected one of {', '.join(pt.MODALITIES)}"),
])
def test_run_spec_errors_exact(flag, spec, message):
    with pytest.raises(SystemExit) as err:
        pt.main([flag, spec])
    assert str(err.value) == f"{flag} {spec!r}: {message}"


def _iso_report(p_dep):
    return {"precision_DEP": p_dep, "recall_DEP": 0.5, "f1_DEP": 0.5, "precision_NONDEP": 0.5, "recall_NONDEP": 0.5,
            "f1_NONDEP": 0.5, "macro_precision": 0.5, "macro_recall": 0.5, "macro_f1": 0.5}


def test_iso_rows_rule_of_a_single_rule_result_and_every_baseline_once():
    results = [{"_path": "a.json", "task": "iso", "model": "vlm", "strategy": "explain", "unparsable": "wrong",
                "rows": {"always DEP": _iso_report(0.25), "always NONDEP": _iso_report(0.0), "vlm": _iso_report(0.75)}},
               {"_path": "b.json", "task": "iso", "model": "vlm", "strategy": "answer_only",
                "rows": {"always DEP": _iso_report(0.125), "vlm": _iso_report(0.5)}}]
    rows = pt.iso_rows(results)[("iso_bench", "Table 1")]
    assert [(r["model"], r["setting"], r["dep"]["p"]) for r in rows] == [
        ("vlm (ours, unparsable=wrong)", "E->A", 0.75), ("vlm (ours, unparsable=exclude)", "A", 0.5),
        ("always DEP (ours)", "-", 0.25), ("always NONDEP (ours)", "-", 0.0)]
    assert rows[0]["macro"] == {"p": 0.5, "r": 0.5, "f": 0.5} and rows[0]["nondep"] == {"p": 0.5, "r": 0.5, "f": 0.5}


@pytest.mark.parametrize("spec, parsed", [("closure head=runs/lr=0.1/test_metrics.json", ("closure head", "runs/lr=0.1/test_metrics.json"))])
def test_parse_catbench_spec(spec, parsed):
    name, path = pt.parse_catbench_spec(spec)
    assert (name, str(path)) == parsed


@pytest.mark.parametrize("spec", ["=run.json", "head=", "head"])
def test_parse_catbench_spec_errors(spec):
    with pytest.raises(SystemExit) as err:
        pt.parse_catbench_spec(spec)
    assert str(err.value) == f"--catbench {spec!r}: expected NAME=PATH (PATH: a run's test_metrics.json or log)"


def test_catbench_rows_keep_the_rows_a_run_logged():
    keys = ("precision_yes", "recall_yes", "f1_yes", "accuracy", "macro_f1")
    metrics = {**{f"catbench_{k}": 0.5 for k in keys}, **{f"always_no_{k}": 0.0 for k in keys}, "catbench_accuracy": 0.75}
    del metrics["catbench_recall_yes"]
    assert pt.catbench_rows([("head", metrics), ("head", metrics)]) == {("catbench", "Table 2"): [
        {"model": "head (ours)", "setting": "-", "p": 0.5, "r": "n/a", "f1": 0.5, "acc": 0.75, "macro_f1": 0.5},
        {"model": "always no (ours)", "setting": "-", "p": 0.0, "r": 0.0, "f1": 0.0, "acc": 0.0, "macro_f1": 0.0}]}
    only_baseline = {f"lr_baseline_{k}": 0.25 for k in keys}
    assert [r["model"] for r in pt.catbench_rows([("x", only_baseline)])[("catbench", "Table 2")]] == [
        "logistic regression, frozen MiniLM (ours)"]
    with pytest.raises(SystemExit) as err:
        pt.catbench_rows([("x", {"acc": 0.5})])
    assert str(err.value) == "--catbench x: the metrics hold no CaT-Bench scores (no 'catbench_f1_yes')"


def test_out_json_holds_every_table_with_our_rows(tmp_path, capsys):
    published = dict(_pr("Fits", "A", 0.5), note="printed 'E→A'")
    path = _one_table(tmp_path, "iso_bench", "Table 1", [published])
    result = _write(tmp_path / "iso.json", {"task": "iso", "model": "vlm", "strategy": "explain", "modality": "image_text",
                                            "rows": {"vlm": _iso_report(0.25)}})
    out = tmp_path / "t.md"
    text = pt.main(["--published", str(path), "--iso", str(result), "--out", str(out)])
    assert out.read_text(encoding="utf-8") == text
    assert capsys.readouterr().out == text + "\n"               # printed as well
    raw = out.with_suffix(".json").read_text(encoding="utf-8")
    assert raw.startswith('{\n "tables": [\n  {\n   "paper": "iso_bench",\n   "name": "Table 1",\n')
    assert "printed 'E→A'" in raw                                # readable, not \u escapes
    data = json.loads(raw)
    ours = {"model": "vlm (ours, unparsable=exclude)", "setting": "E->A", "dep": {"p": 0.25, "r": 0.5, "f": 0.5},
            "nondep": {"p": 0.5, "r": 0.5, "f": 0.5}, "macro": {"p": 0.5, "r": 0.5, "f": 0.5}, "_ours": True}
    assert data == {"tables": [{"paper": "iso_bench", "name": "Table 1", "title": pt.SPECS[("iso_bench", "Table 1")].title,
                                "rows": [published, ours]}]}


@pytest.mark.parametrize("flag, make", [
    ("--sequencing", lambda p, i: f"m{i}@wikihow/text={p}"),
    ("--catbench", lambda p, i: f"m{i}={p}"),
    ("--teo", lambda p, i: f"m{i}@cot/text={p}"),
])
def test_repeated_run_flags_accumulate(tmp_path, flag, make):
    run = _write(tmp_path / "m.json", {"single/acc": 0.5, "catbench_f1_yes": 0.5, "teo_consistency_accuracy": 0.5})
    text = pt.main([flag, make(run, 1), flag, make(run, 2)])
    assert "| m1 (ours)" in text or "| **m1 (ours)" in text
    assert "| m2 (ours)" in text or "| **m2 (ours)" in text


@pytest.mark.parametrize("flag, task", [("--iso", "iso"), ("--coherence", "coherence"), ("--teo", "teo")])
def test_repeated_result_flags_accumulate(tmp_path, flag, task):
    strategy = {"iso": "explain", "coherence": "assign", "teo": "cot"}[task]
    files = [_write(tmp_path / f"{m}.json", {"task": task, "model": m, "strategy": strategy, "modality": "text",
                                             "rows": {m: {"consistency_accuracy": 0.5}}}) for m in ("m1", "m2")]
    text = pt.main([flag, str(files[0]), flag, str(files[1])])
    assert "m1 (ours" in text and "m2 (ours" in text


def test_help_lists_every_option(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as err:
        pt.main(["--help"])
    assert err.value.code == 0
    out = capsys.readouterr().out
    assert pt.__doc__.strip() in out                     # the docstring, its layout kept
    assert out.splitlines()[-13:] == [
        "  -h, --help            show this help message and exit",
        "  --teo JSON|NAME@STRATEGY/MODALITY=PATH [JSON|NAME@STRATEGY/MODALITY=PATH ...]",
        "                        eval_teo TEO result JSONs, or a train.py run (fine-tuned row)",
        "  --sequencing NAME@DATASET/MODALITY=PATH [NAME@DATASET/MODALITY=PATH ...]",
        "  --iso JSON [JSON ...]",
        "                        eval_teo ISO result JSONs",
        "  --coherence JSON [JSON ...]",
        "                        eval_teo COHERENCE result JSONs",
        "  --catbench NAME=PATH [NAME=PATH ...]",
        "                        a CaT-Bench run's test metrics (test_metrics.json or its log)",
        "  --published PUBLISHED",
        "                        published results YAML",
        "  --out OUT             write the tables here (markdown) and <out>.json"]
