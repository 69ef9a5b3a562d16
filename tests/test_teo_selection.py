"""How the TEO heads and the CaT-Bench scorer decide and select: ``scripts/tools/catbench_eval.py`` (answer
files, r-FG rows, re-weighting, its command line), the plan head's decision rule and reports, and the
closure head's fold scores, blends, cross-validated model selection and test report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY_BERT = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 512}
CAKE = ["Heat the oven.", "Mix flour and eggs.", "Pour into a tin.", "Wash up."]


# ---------------------------------------------------------------- scripts/tools/catbench_eval.py
def catbench_rows(plan_idx, steps, pairs, recipe):
    """CaT-Bench question records: every (first, second, label) of ``pairs`` asked before and after."""
    rows = []
    for k, (first, second, label) in enumerate(pairs):
        for direction in ("before", "after"):
            qtype = ("dependent" if label == "yes" else "nondependent") + f"_real_{direction}"
            rows.append({"plan_idx": plan_idx, "title": "t", "question_idx": k, "question_type": qtype,
                         "direction": direction, "binary_question": "?", "steps": list(steps), "first_step_idx": first,
                         "second_step_idx": second, "label": label, "efg_recipe_id": recipe})
    return rows


def write_lines(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def rfg_folder(tmp_path: Path) -> Path:
    """Two r-FG recipes, one sentence per step: ``Cake`` (0 -> 1 -> 2 and the transitive 0 -> 2; step 3
    joined to nothing) and the two-step ``Short``."""
    folder = tmp_path / "rfg"
    folder.mkdir()
    for name, steps, edges in (("Cake", CAKE, [(1, 2), (2, 3), (1, 3)]), ("Short", CAKE[:2], [(1, 2)])):
        tokens = [f"{i} 1 {k} {word} NN O" for i, text in enumerate(steps, start=1) for k, word in enumerate(text.split())]
        (folder / f"{name}.list").write_text("\n".join(tokens) + "\n")
        (folder / f"{name}.flow").write_text("\n".join(f"{u} 1 0 t {v} 1 0" for u, v in edges) + "\n")
    return folder


def test_rfg_rows_answer_from_the_flow_graph_of_the_question_recipe(tmp_path):
    from data_modules.adapters.catbench import read_catbench
    from scripts.tools.catbench_eval import rfg_answers

    rows = (catbench_rows(6, ["A.", "B."], [(0, 1, "yes")], "Unknown")            # recipe not in the folder
            + catbench_rows(7, CAKE, [(0, 1, "yes")], "Short")                     # the recipe has 2 steps, not 4
            + catbench_rows(8, ["A.", "B."], [(0, 1, "no")], None)                  # no recipe id
            + catbench_rows(5, CAKE, [(0, 1, "yes"), (0, 2, "yes"), (0, 3, "no"), (1, 2, "yes"), (2, 3, "no")], "Cake"))
    questions = read_catbench(write_lines(tmp_path / "q.jsonl", rows))
    got = rfg_answers(questions, rfg_folder(tmp_path))
    assert list(got) == ["r-FG direct", "r-FG path"]
    unanswered = {q["pair_id"]: None for q in questions if q["plan_idx"] != 5}
    # (0, 2) is joined by a path only (0 -> 1 -> 2): the direct row says no, the path row yes
    direct = {"yes": {(0, 1), (1, 2)}, "path": {(0, 1), (0, 2), (1, 2)}}
    for name, key in (("r-FG direct", "yes"), ("r-FG path", "path")):
        expected = dict(unanswered, **{q["pair_id"]: "yes" if (q["first"], q["second"]) in direct[key] else "no"
                                       for q in questions if q["plan_idx"] == 5})
        assert got[name] == expected
        assert all(got[name][i] is None for i in unanswered)


def test_answers_files_are_read_by_id_or_catbench_fields(tmp_path):
    from scripts.tools.catbench_eval import read_answers

    path = write_lines(tmp_path / "a.jsonl", [{"id": "5-x-0", "answer": " YES "}, "", "   ",
                                              {"plan_idx": 5, "question_type": "y", "question_idx": 1, "answer": "No. Because"},
                                              {"id": 7, "answer": "perhaps", "lr_answer": "yes"}])
    assert read_answers(path) == {"5-x-0": "yes", "5-y-1": "no", "7": None}
    with pytest.raises(ValueError, match=r"a.jsonl:1: lr_answer: missing field"):
        read_answers(path, "lr_answer")
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(FileNotFoundError) as err:
        read_answers(missing)
    assert str(err.value) == f"answers file: no such file: {missing}"


def test_every_bad_line_of_an_answers_file_is_named_at_once(tmp_path):
    from scripts.tools.catbench_eval import read_answers

    path = write_lines(tmp_path / "bad.jsonl", ['{"id": "a", "answer": "yes"}', "", "{not json", "[1, 2]", "3",
                                                '{"answer": "yes"}', '{"id": "b"}', '{"id": "c", "answer": "no"}'])
    with pytest.raises(ValueError) as err:
        read_answers(path)
    assert str(err.value) == "\n".join([
        "bad answers file:",
        f"{path}:3: json: Expecting property name enclosed in double quotes",
        f"{path}:4: record: expected a JSON object, got list",
        f"{path}:5: record: expected a JSON object, got int",
        f"{path}:6: id: missing (give 'id' or 'plan_idx', 'question_type', 'question_idx')",
        f"{path}:7: answer: missing field"])


def _cake_questions(tmp_path):
    rows = catbench_rows(5, CAKE, [(0, 1, "yes"), (0, 2, "yes"), (0, 3, "no"), (1, 2, "yes")], "Cake")
    return write_lines(tmp_path / "q.jsonl", rows), rows


def _answers(path, rows, answers, field="answer", extra=()):
    records = [{"id": f"5-{r['question_type']}-{r['question_idx']}", field: a} for r, a in zip(rows, answers)]
    return write_lines(path, records + list(extra))


def test_the_script_writes_its_table_and_rows_and_honours_its_options(tmp_path, capsys):
    from sklearn.metrics import accuracy_score

    from scripts.tools.catbench_eval import main

    questions, rows = _cake_questions(tmp_path)
    gold = [r["label"] for r in rows]
    ours = ["yes", "yes", "no", "no", "no", "no", "yes", "no"]
    lr = ["yes"] * 8
    # an '=' in the path: the name ends at the first one; --answer-field reads another field
    folder = tmp_path / "run=1"
    folder.mkdir()
    answers = _answers(folder / "p.jsonl", rows, lr, field="lr_answer",
                       extra=[{"id": "9-x-0", "lr_answer": "yes"}, {"id": "9-x-1", "lr_answer": "no"}])
    out, rows_json = tmp_path / "table.md", tmp_path / "rows.json"
    assert main(["--questions", str(questions), "--answers", f"lr={answers}", "--answer-field", "lr_answer",
                 "--rfg", str(rfg_folder(tmp_path)), "--out", str(out), "--json", str(rows_json)]) == 0
    captured = capsys.readouterr()
    assert captured.err == (f"lr: 2 answers to questions not in {questions} ignored; "
                            "0 questions without an answer (counted as unparsable)\n")
    table = out.read_text(encoding="utf-8")
    assert captured.out == table and table.endswith(" |\n") and table.count("\n") == 2 + 6
    assert table.splitlines()[0] == ("| system | accuracy | P yes | R yes | dependent F1 | macro F1 | twin consistency "
                                     "| invalid | n |")
    text = rows_json.read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == json.dumps(data, indent=2) + "\n"
    assert list(data) == ["always yes", "always no", "majority (yes)", "lr", "r-FG direct", "r-FG path"]
    assert data["lr"]["accuracy"] == pytest.approx(accuracy_score(gold, lr)) == 0.75
    assert data["r-FG path"]["accuracy"] == 1.0 and data["r-FG direct"]["accuracy"] == 0.75   # (0, 2) is transitive
    # without --rfg and --answer-field: no r-FG rows, the "answer" field
    _answers(tmp_path / "ours.jsonl", rows, ours)
    assert main(["--questions", str(questions), "--answers", f"ours={tmp_path / 'ours.jsonl'}", "--json", str(rows_json)]) == 0
    data = json.loads(rows_json.read_text())
    assert list(data) == ["always yes", "always no", "majority (yes)", "ours"]
    assert data["ours"]["accuracy"] == pytest.approx(accuracy_score(gold, ours)) == 0.625
    assert data["ours"]["twin_consistency"] == 0.75 and capsys.readouterr().err == ""


def test_without_answers_files_the_table_holds_the_baselines(tmp_path):
    from scripts.tools.catbench_eval import main

    questions, _ = _cake_questions(tmp_path)
    assert main(["--questions", str(questions), "--json", str(tmp_path / "rows.json")]) == 0
    data = json.loads((tmp_path / "rows.json").read_text())
    assert list(data) == ["always yes", "always no", "majority (yes)"] and data["always yes"]["accuracy"] == 0.75


def test_twins_are_the_two_questions_about_one_pair_of_one_plan(tmp_path):
    """Plans are told apart by plan_idx and by recipe: pairs with the same step indices in other plans are
    other pairs."""
    from data_modules.adapters.catbench import read_catbench
    from scripts.tools.catbench_eval import score

    rows = catbench_rows(1, CAKE, [(0, 1, "yes")], None) + catbench_rows(2, CAKE, [(0, 1, "yes")], None)
    for k, r in enumerate(catbench_rows(None, CAKE, [(0, 1, "yes")], "X") + catbench_rows(None, CAKE, [(0, 1, "yes")], "Y")):
        rows.append(dict({key: v for key, v in r.items() if key != "plan_idx"}, question_idx=10 + k))
    questions = read_catbench(write_lines(tmp_path / "q.jsonl", rows))
    answers = ["yes", "yes", "yes", "no", "no", "no", "no", "yes"]
    got = score(questions, {"s": {q["pair_id"]: a for q, a in zip(questions, answers)}})
    assert (got["s"]["twin_consistency"], got["s"]["n_twins"]) == (0.5, 4)      # plans 1 and X agree, 2 and Y do not
    assert (got["always no"]["twin_consistency"], got["always no"]["n_twins"]) == (1.0, 4)


def test_re_weighted_rows_make_yes_weigh_the_given_share(tmp_path, capsys):
    from scripts.tools.catbench_eval import main

    questions, rows = _cake_questions(tmp_path)
    _answers(tmp_path / "ours.jsonl", rows, ["yes", "yes", "no", "no", "no", "no", "yes", "no"])
    out = tmp_path / "rows.json"
    assert main(["--questions", str(questions), "--answers", f"ours={tmp_path / 'ours.jsonl'}", "--yes-share", "0.4",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert list(data) == ["rows", "yes_share_0.4"]
    shared = data["yes_share_0.4"]
    assert list(shared) == ["always yes", "always no", "ours"]
    assert shared["always yes"]["accuracy"] == pytest.approx(0.4) and shared["always yes"]["recall"] == 1.0
    assert shared["always no"]["accuracy"] == pytest.approx(0.6)
    # ours: yes questions (weight 0.4 / 0.75 each) right 3 of 6, no questions (0.6 / 0.25 each) right 2 of 2
    assert shared["ours"]["accuracy"] == pytest.approx(0.4 * 3 / 6 + 0.6 * 2 / 2)
    assert data["rows"]["ours"]["accuracy"] == 0.625
    first, second = capsys.readouterr().out.split("\n\nRe-weighted so that 'yes' questions weigh 40.0%:\n\n")
    assert first.splitlines()[0] == ("| system | accuracy | P yes | R yes | dependent F1 | macro F1 | twin consistency "
                                     "| invalid | n |") and first.splitlines()[-1].startswith("| ours | 62.5 |")
    assert second.splitlines()[0] == "| system | accuracy | P yes | R yes | dependent F1 | macro F1 | invalid |"


@pytest.mark.parametrize("spec", ["ours", "=x.jsonl", "ours="])
def test_an_answers_option_without_name_and_path_is_refused(tmp_path, capsys, spec):
    from scripts.tools.catbench_eval import main

    questions, _ = _cake_questions(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["--questions", str(questions), "--answers", spec])
    assert err.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: --answers expects NAME=PATH, got {spec!r}\n")


@pytest.mark.parametrize("content", [None, "", "\n  \n"], ids=["missing", "empty", "blank lines"])
@pytest.mark.parametrize("option", ["--questions", "--answers", "--gpt4"])
def test_a_missing_or_empty_file_is_named_by_its_option(tmp_path, option, content):
    from scripts.tools.catbench_eval import main

    questions, rows = _cake_questions(tmp_path)
    good = _answers(tmp_path / "good.jsonl", rows, ["yes"] * len(rows))
    bad = tmp_path / "bad.jsonl"
    if content is not None:
        bad.write_text(content, encoding="utf-8")
    argv = {"--questions": ["--questions", str(bad), "--answers", f"ours={good}"],
            "--answers": ["--questions", str(questions), "--answers", f"ours={good}", "--answers", f"theirs={bad}"],
            "--gpt4": ["--questions", str(questions), "--answers", f"ours={good}", "--gpt4", str(bad)]}[option]
    named = {"--questions": "--questions", "--answers": "--answers theirs", "--gpt4": "--gpt4"}[option]
    if content is None:
        with pytest.raises(FileNotFoundError) as err:
            main(argv)
        assert str(err.value) == f"{named}: no such file: {bad}"
    else:
        what = "CaT-Bench questions" if option == "--questions" else "answers"
        with pytest.raises(ValueError) as err:
            main(argv)
        assert str(err.value) == f"{named}={bad}: the file holds no {what}"


def test_the_questions_option_is_required(capsys):
    from scripts.tools.catbench_eval import main

    with pytest.raises(SystemExit) as err:
        main(["--answers", "x=y.jsonl"])
    assert err.value.code == 2
    assert "error: the following arguments are required: --questions" in capsys.readouterr().err


def test_help_describes_the_script_and_every_option(capsys, monkeypatch):
    from scripts.tools.catbench_eval import main

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as err:
        main(["--help"])
    assert err.value.code == 0
    raw = capsys.readouterr().out
    # the description is the docstring's first paragraph, as written (not re-wrapped)
    assert raw.startswith("usage: ") and "\n\nScore answer files on CaT-Bench questions (Lal et al., EMNLP 2024): one " \
        "table, same metrics for all.\n\n" in raw
    assert "Rows: always yes" not in raw                  # the first paragraph only
    text = " ".join(raw.split())     # option help lines are wrapped: compare words
    for fragment in ["--questions QUESTIONS", "CaT-Bench questions (JSON lines)",
                     "--answers NAME=PATH", "an answers file (repeatable); NAME labels its row",
                     "--gpt4 GPT4", "published GPT-4 answers (same format): row 'GPT-4'",
                     "--rfg RFG", "r-FG folder: add the 'r-FG direct' / 'r-FG path' diagnostic rows",
                     "--answer-field ANSWER_FIELD", "field holding the yes/no answer (default: answer)",
                     "--out OUT", "also write the markdown table here", "--json JSON", "also write the rows as JSON here",
                     "--yes-share S", "also print every row re-weighted so that 'yes' questions weigh a share S (0 < S < 1)"]:
        assert f" {fragment} " in f" {text} "


# ---------------------------------------------------------------- the plan head: decision rule and reports
def tiny_plan_head(**kwargs):
    import torch

    from seqaware.modules.teo_plan_head import TeoPlanHeadModule

    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text", "config": TINY_BERT,
               "tokenizer": "offline:minilm"}
    torch.manual_seed(0)
    return TeoPlanHeadModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3}, step_dim=16,
                             step_layers=1, step_heads=2, pair_hidden=16, **kwargs)


def capture_logs(model) -> dict:
    """What the module logs (``self.log`` / ``self.log_dict``), name -> value."""
    logged: dict = {}
    model.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    model.log_dict = lambda values, **kw: logged.update({k: float(v) for k, v in values.items()})
    return logged


@pytest.mark.parametrize("probs, a, b, expected", [
    ([0.3, 0.2, 0.5], 0, 1, "before"),          # p(before) + p(after) equal to the threshold: dependent
    ([0.2, 0.3, 0.5], 0, 1, "after"),
    ([0.25, 0.24, 0.51], 0, 1, "independent"),  # 0.49 < 0.5
    ([0.25, 0.25, 0.5], 0, 1, "before"),        # a tie: before when a < b ...
    ([0.25, 0.25, 0.5], 2, 1, "after"),         # ... else after
    ([0.25, 0.25, 0.5], 1, 1, "after"),
    ([0.6, 0.1, 0.3], 3, 1, "before"),          # the larger probability wins whatever the order of a and b
    ([0.1, 0.6, 0.3], 1, 3, "after"),
])
def test_plan_head_decision_rule(probs, a, b, expected):
    import torch

    from seqaware.modules.teo_plan_head import relations

    assert relations(torch.tensor([probs], dtype=torch.float64), [a], [b], threshold=0.5) == [expected]
    # one call decides each row on its own
    rows = torch.tensor([[0.1, 0.1, 0.8], probs, [0.7, 0.2, 0.1]], dtype=torch.float64)
    assert relations(rows, [0, a, 0], [1, b, 1], 0.5) == ["independent", expected, "before"]


def teo_records():
    """Pairs of plan p: (0, 1) and (0, 2) before, (1, 2) and (0, 3) independent, each in both presentations,
    and (1, 3) independent seen in the original presentation only."""
    def rec(kind, pid, a, b, label, probs):
        return {"pair": {"set": kind, "pair_id": f"{kind[0]}{pid}", "procedure_id": "p", "a": a, "b": b, "label": label},
                "probs": probs, "loss": 0.5}
    original = [rec("original", 1, 0, 1, "before", [0.7, 0.1, 0.2]), rec("original", 2, 0, 2, "before", [0.4, 0.3, 0.3]),
                rec("original", 3, 1, 2, "independent", [0.3, 0.3, 0.4]), rec("original", 4, 0, 3, "independent", [0.1, 0.05, 0.85]),
                rec("original", 5, 1, 3, "independent", [0.1, 0.05, 0.85])]
    swapped = [rec("swapped", 1, 1, 0, "after", [0.1, 0.7, 0.2]), rec("swapped", 2, 2, 0, "after", [0.3, 0.4, 0.3]),
               rec("swapped", 3, 2, 1, "independent", [0.3, 0.3, 0.4]), rec("swapped", 4, 3, 0, "independent", [0.5, 0.3, 0.2])]
    return original + swapped


def test_plan_head_chooses_its_threshold_on_validation_pairs_and_scores_teo(caplog):
    from seqaware.metrics.teo import teo_table

    model = tiny_plan_head()
    logged = capture_logs(model)
    with caplog.at_level("INFO", logger="seqaware.modules.teo_plan_head"):
        rows = model._report_teo("val", teo_records())
    assert f"val TEO pairs (threshold 0.61):\n{teo_table(rows)}" in caplog.text
    # yes/no "does b depend on a?" of the originals: p_dep 0.8, 0.7 (yes); 0.6, 0.15, 0.15 (no): every threshold in
    # (0.6, 0.7] separates them, 0.61 is the one closest to 0.5
    assert float(model.decision_threshold) == pytest.approx(0.61)
    assert "val: 4 of 5 pairs were seen in both presentations; TEO scores use those only" in caplog.text
    # at 0.61: originals before, before, independent, independent (and (1, 3) independent); swapped after, after,
    # independent and -- p_dep 0.8 -- before for the independent pair (3, 0)
    assert logged == pytest.approx({
        "val/threshold": 0.61, "val/pair_accuracy": 1.0, "val/pair_f1_yes": 1.0, "val/pair_macro_f1": 1.0,
        "val/teo_consistency_accuracy": 3 / 4, "val/teo_consistency_dependent": 1.0, "val/teo_macro_f1": (1 + 1 + 6 / 7) / 3,
        "val/teo_f1_before": 1.0, "val/teo_f1_after": 1.0, "val/teo_f1_independent": 6 / 7,
        "val/majority_consistency_accuracy": 0.5})   # majority: before for every original, after for every swapped
    assert rows["plan head"]["consistency_accuracy"] == 3 / 4 and rows["plan head"]["num_pairs"] == 4
    assert model.test_predictions == []                                  # only the test stage writes predictions


def test_plan_head_test_report_keeps_the_validation_threshold_and_writes_predictions():
    model = tiny_plan_head()
    model.decision_threshold.fill_(0.55)                                 # chosen on validation
    logged = capture_logs(model)
    model._report_teo("test", teo_records())
    assert float(model.decision_threshold) == pytest.approx(0.55) and logged["test/threshold"] == pytest.approx(0.55)
    # at 0.55 the independent pair (1, 2), p_dep 0.6, is dependent in both presentations (a tie: before, then after)
    assert model.test_predictions == [
        {"id": "o1", "pred": "before", "gold": "before"}, {"id": "o2", "pred": "before", "gold": "before"},
        {"id": "o3", "pred": "before", "gold": "independent"}, {"id": "o4", "pred": "independent", "gold": "independent"},
        {"id": "s1", "pred": "after", "gold": "after"}, {"id": "s2", "pred": "after", "gold": "after"},
        {"id": "s3", "pred": "after", "gold": "independent"}, {"id": "s4", "pred": "before", "gold": "independent"}]
    assert logged["test/pair_accuracy"] == pytest.approx(4 / 5) and logged["test/teo_consistency_accuracy"] == 0.5


@pytest.mark.parametrize("metric, tau", [("macro_f1", 0.61), ("f1", 0.3), ("accuracy", 0.61)])
def test_plan_head_threshold_maximises_the_configured_metric(metric, tau):
    records = [r for r in teo_records() if r["pair"]["pair_id"] in ("o1", "o2", "o3", "s1", "s2", "s3")]
    for r, probs in zip(records, ([0.8, 0.1, 0.1], [0.2, 0.1, 0.7], [0.3, 0.3, 0.4])):
        r["probs"] = probs                  # p_dep 0.9, 0.3 (yes) and 0.6 (no): F1 of yes is best at t <= 0.3
    model = tiny_plan_head(threshold_metric=metric)
    capture_logs(model)
    model._report_teo("val", records)
    assert float(model.decision_threshold) == pytest.approx(tau)


def test_plan_head_with_a_fixed_threshold_never_moves_it(caplog):
    model = tiny_plan_head(threshold=0.45)
    logged = capture_logs(model)
    with caplog.at_level("WARNING", logger="seqaware.modules.teo_plan_head"):
        model._report_teo("val", [r for r in teo_records() if r["pair"]["pair_id"] != "o5"])
    assert "presentations" not in caplog.text                           # every pair complete: no warning
    assert float(model.decision_threshold) == pytest.approx(0.45) and logged["val/threshold"] == pytest.approx(0.45)


def test_plan_head_reports_nothing_without_complete_pairs():
    model = tiny_plan_head()
    logged = capture_logs(model)
    assert model._report_teo("val", [r for r in teo_records() if r["pair"]["set"] == "swapped"]) == {}
    assert logged == {}
    only_original = [r for r in teo_records() if r["pair"]["set"] == "original"]
    assert model._report_teo("test", only_original) == {}
    assert set(logged) == {"test/threshold", "test/pair_accuracy", "test/pair_f1_yes", "test/pair_macro_f1"}
    assert model._relations([]) == []


def catbench_records():
    """Plan p, presented (first, second): (0, 1) yes, (0, 2) no, (1, 2) yes, (0, 3) no, (1, 3) no, asked before and after."""
    table = [((0, 1), "yes", [0.6, 0.1, 0.3], [0.6, 0.1, 0.3]), ((0, 2), "no", [0.2, 0.1, 0.7], [0.2, 0.1, 0.7]),
             ((1, 2), "yes", [0.3, 0.35, 0.35], [0.4, 0.2, 0.4]), ((0, 3), "no", [0.3, 0.3, 0.4], [0.3, 0.3, 0.4]),
             ((1, 3), "no", [0.26, 0.26, 0.48], [0.26, 0.26, 0.48])]
    out = []
    for k, ((first, second), answer, before, after) in enumerate(table):
        for direction, probs in (("before", before), ("after", after)):
            out.append({"pair": {"set": "catbench", "pair_id": f"q{k}{direction[0]}", "direction": direction, "first": first,
                                 "second": second, "a": first, "b": second, "answer": answer, "plan_id": "p"},
                        "probs": probs, "loss": None})
    return out


@pytest.mark.parametrize("stage", ["val", "test"])
def test_plan_head_answers_catbench_yes_for_before(stage, caplog):
    from seqaware.metrics.classification import format_table
    from seqaware.modules.teo_plan_head import CATBENCH_COLUMNS

    model = tiny_plan_head(threshold=0.55)
    logged = capture_logs(model)
    with caplog.at_level("INFO", logger="seqaware.modules.teo_plan_head"):
        rows = model._report_catbench(stage, catbench_records())
    assert f"{stage} CaT-Bench questions (threshold 0.55):\n{format_table(rows, CATBENCH_COLUMNS)}" in caplog.text
    # answers: (0, 1) yes yes; (0, 2) no no; (1, 2) no (after) / yes; (0, 3) yes yes (a tie, p_dep 0.6); (1, 3) no no
    # (p_dep 0.52 < 0.55).  yes: tp 3, fp 2, fn 1; no: tp 4, fp 1, fn 2
    assert logged == pytest.approx({
        f"{stage}/catbench_accuracy": 0.7, f"{stage}/catbench_precision_yes": 3 / 5, f"{stage}/catbench_recall_yes": 3 / 4,
        f"{stage}/catbench_f1_yes": 2 / 3, f"{stage}/catbench_macro_f1": (2 / 3 + 8 / 11) / 2,
        f"{stage}/catbench_twin_consistency": 4 / 5,
        f"{stage}/majority_accuracy": 0.6, f"{stage}/majority_f1_yes": 0.0, f"{stage}/majority_macro_f1": 0.75 / 2,
        f"{stage}/threshold": 0.55})
    assert list(rows) == ["always yes", "always no", "majority (no)", "plan head"]
    assert [rows[name]["twin_consistency"] for name in rows] == [1.0, 1.0, 1.0, 4 / 5]
    assert all(row["n_twins"] == 5 for row in rows.values())
    expected = [] if stage == "val" else [
        {"id": r["pair"]["pair_id"], "direction": r["pair"]["direction"], "first": r["pair"]["first"],
         "second": r["pair"]["second"], "p_dependent": pytest.approx(r["probs"][0] + r["probs"][1]),
         "pred_relation": rel, "answer": ans, "gold": r["pair"]["answer"]}
        for r, rel, ans in zip(catbench_records(), ["before", "before", "independent", "independent", "after", "before",
                                                    "before", "before", "independent", "independent"],
                               ["yes", "yes", "no", "no", "no", "yes", "yes", "yes", "no", "no"])]
    assert model.test_predictions == expected


# ---------------------------------------------------------------- the closure head: scores, blends, selection
def test_fold_scores_choose_each_threshold_on_the_other_folds_for_the_metric():
    import numpy as np

    from seqaware.modules.teo_closure_head import fold_scores

    # fold 0 alone is best answered at t <= 0.3 for F1 of yes (0.8) but at (0.6, 0.9] for macro F1 (2/3)
    folds = [(["yes", "yes", "no"], np.array([0.9, 0.3, 0.6])), (["yes", "no"], np.array([0.5, 0.2]))]
    # fold 0 is answered at fold 1's threshold, (0.2, 0.5] -> 0.5, whatever the metric: yes, no, yes
    first = {"accuracy": 1 / 3, "f1": 0.5, "macro_f1": 0.25, "threshold": 0.5}
    assert fold_scores(folds, "f1") == [pytest.approx(first), pytest.approx({"accuracy": 1.0, "f1": 1.0, "macro_f1": 1.0,
                                                                             "threshold": 0.3})]
    assert fold_scores(folds) == [pytest.approx(first), pytest.approx({"accuracy": 0.5, "f1": 0.0, "macro_f1": 1 / 3,
                                                                        "threshold": 0.61})]
    # one fold: its own probabilities choose its threshold
    assert fold_scores([(["yes", "no", "no"], np.array([0.9, 0.3, 0.2]))], "accuracy") == [
        {"accuracy": 1.0, "f1": 1.0, "macro_f1": 1.0, "threshold": 0.5}]


def test_summarise_gives_mean_and_population_std_per_metric():
    from seqaware.modules.teo_closure_head import summarise

    scores = [{"accuracy": 1.0, "f1": 0.5, "macro_f1": 0.2, "threshold": 0.3},
              {"accuracy": 0.5, "f1": 0.5, "macro_f1": 0.4, "threshold": 0.5},
              {"accuracy": 0.0, "f1": 0.5, "macro_f1": 0.6, "threshold": 0.7}]
    assert summarise(scores) == pytest.approx({
        "f1_mean": 0.5, "f1_std": 0.0, "macro_f1_mean": 0.4, "macro_f1_std": (0.08 / 3) ** 0.5,
        "accuracy_mean": 0.5, "accuracy_std": (0.5 / 3) ** 0.5})


def test_blend_mixes_in_the_baseline_by_its_weight():
    import numpy as np

    from seqaware.modules.teo_closure_head import blend_probs

    head = np.array([0.8, 0.2])
    assert blend_probs(head, None, 0) is head                      # w = 0: the head's own, no baseline needed
    np.testing.assert_allclose(blend_probs(head, np.array([0.4, 0.6]), 0.25), [0.7, 0.3])
    assert blend_probs(0.9, 0.1, 1.0) == pytest.approx(0.1)
    assert blend_probs(0.9, 0.5, 0.5) == pytest.approx(0.7)


def tiny_closure_head(**kwargs):
    import torch

    from seqaware.modules.teo_closure_head import TeoClosureHeadModule

    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text", "config": TINY_BERT,
               "tokenizer": "offline:minilm"}
    torch.manual_seed(0)
    return TeoClosureHeadModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3}, **kwargs)


def test_the_configured_setting_is_the_model_before_cross_validation():
    model = tiny_closure_head(head={"dropout": 0.2, "step_dim": 8}, members=2, rfg_weight=0.5, blend=0.25)
    assert model.setting == {"members": 2, "rfg_weight": 0.5, "blend": 0.25, "features": "encoder", "dropout": 0.2,
                             "step_dim": 8}
    assert model.ensemble.members == 2 and model.ensemble.dropout == 0.2 and model.ensemble.proj.weight.shape == (2, 32, 8)


# plans of the cross-validation: folds of two repetitions; r4 (r-FG) trains but is never held out
CV_PLANS = [
    {"plan_id": "p0", "labels": [(0, 1, "yes"), (0, 2, "no"), (1, 2, "yes")], "folds": [0, 0], "source": "catbench"},
    {"plan_id": "p1", "labels": [(0, 1, "no"), (0, 2, "yes"), (1, 2, "no")], "folds": [0, 1], "source": "catbench"},
    {"plan_id": "p2", "labels": [(0, 1, "yes"), (1, 2, "no")], "folds": [1, 0], "source": "catbench"},
    {"plan_id": "p3", "labels": [(0, 2, "yes"), (1, 2, "no"), (0, 1, "no")], "folds": [1, 1], "source": "catbench"},
    {"plan_id": "r4", "labels": [(0, 1, "yes")], "folds": [0, -1], "source": "rfg"},
]
# the heads' probabilities: a good setting separates yes from no (at (0.65, 0.9]), a bad one inverts them
HEAD_PROBS = {"good": {"yes": 0.9, "no": 0.65}, "bad": {"yes": 0.3, "no": 0.6}}


class CvWorld:
    """A closure head whose heads' fits and predictions, and the baseline, are stand-ins with known
    probabilities (the selection around them is real)."""

    def __init__(self, monkeypatch, tmp_path, **kwargs):
        import numpy as np
        import torch

        from seqaware.modules import teo_closure_head as mod

        kwargs = {"head": {"dropout": 0.1}, "members": 2, "cv_grid": [{"dropout": 0.5}, {}, {"blend": 0.5}],
                  "cv_file": str(tmp_path / "cv" / "deep" / "cv.json"), "baseline_C": 2.0, "head_threads": 3, **kwargs}
        self.model = model = tiny_closure_head(**kwargs)
        self.plans = [dict(p, steps=["a.", "b.", "c."]) for p in CV_PLANS]
        gen = torch.Generator().manual_seed(0)
        self.embeddings = [torch.randn(3, 32, generator=gen) for _ in self.plans]
        self.requested, self.fits, self.baselines, self.predicted = [], [], [], []
        model.trainer = SimpleTrainer(max_epochs=3)

        def all_training_plans(*features):
            self.requested.append(features)
            return self.plans, {f: self.embeddings for f in features}

        def fit_heads(setting, plans, embeddings, steps, seed, where):
            self.fits.append({"setting": dict(setting), "plans": [p["plan_id"] for p in plans], "steps": steps,
                              "seed": seed, "threads": torch.get_num_threads(),
                              "embeddings": [next((k for k, x in enumerate(self.embeddings) if x is e), None)
                                             for e in embeddings]})
            return "bad" if setting["dropout"] == 0.5 else "good"

        def predict(kind, plans, embeddings):
            self.predicted.append([p["plan_id"] for p in plans])
            return np.array([HEAD_PROBS[kind][y] for p in plans for _, _, y in p["labels"]])

        def plan_of(emb):
            return next(k for k, e in enumerate(self.embeddings) if np.array_equal(e.numpy(), emb))

        def fit_baseline(embeddings, plans, C=1.0):
            self.baselines.append(([plan_of(e) for e in embeddings], [p["plan_id"] for p in plans], C))
            return "lr"

        def baseline_probs(model_, emb, pairs):
            plan = self.plans[plan_of(emb)]
            assert [(a, b) for a, b, _ in plan["labels"]] == list(pairs)
            # yes 0.7 (0.5 for p0's (1, 2): the baseline says yes at 0.5), no 0.3
            return np.array([(0.5 if (plan["plan_id"], a) == ("p0", 1) else 0.7) if y == "yes" else 0.3
                             for a, b, y in plan["labels"]])

        monkeypatch.setattr(model, "_all_training_plans", all_training_plans)
        monkeypatch.setattr(model, "_fit_heads", fit_heads)
        monkeypatch.setattr(model, "_predict", predict)
        monkeypatch.setattr(mod, "fit_baseline", fit_baseline)
        monkeypatch.setattr(mod, "baseline_probs", baseline_probs)


class SimpleTrainer:
    def __init__(self, max_epochs=3, ckpt_path=None, batch_size=None):
        from types import SimpleNamespace

        self.max_epochs, self.ckpt_path = max_epochs, ckpt_path
        self.datamodule = SimpleNamespace(batch_size=batch_size)


@pytest.mark.parametrize("threshold", ["cv", 0.375])
def test_cross_validation_picks_the_best_setting_and_its_out_of_fold_threshold(monkeypatch, tmp_path, caplog, threshold):
    import torch

    from seqaware.modules.teo_closure_head import ClosureEnsemble

    world = CvWorld(monkeypatch, tmp_path, threshold=threshold)
    model = world.model
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    with caplog.at_level("INFO", logger="seqaware.modules.teo_closure_head"):
        model.setup("fit")
    assert torch.equal(torch.get_rng_state(), rng)                   # the global random stream is left alone
    assert torch.get_num_threads() == threads                        # the heads' thread limit is lifted after
    assert world.requested == [("encoder",)]
    # the final baseline on every plan, then one per fold on its training plans
    assert world.baselines[0] == ([0, 1, 2, 3, 4], ["p0", "p1", "p2", "p3", "r4"], 2.0)
    assert [b[1:] for b in world.baselines[1:]] == [(["p2", "p3"], 2.0), (["p0", "p1", "r4"], 2.0), (["p1", "p3", "r4"], 2.0),
                                                   (["p0", "p2", "r4"], 2.0)]
    # each fold's held-out CaT-Bench plans are scored (never the r-FG plan)
    assert world.predicted == [["p0", "p1"]] * 2 + [["p2", "p3"]] * 2 + [["p0", "p2"]] * 2 + [["p1", "p3"]] * 2
    # per fold one fit for the bad setting and one shared by "defaults" and "blend=0.5", on the fold's training plans
    assert [(f["setting"]["dropout"], f["plans"]) for f in world.fits] == [
        (0.5, ["p2", "p3"]), (0.1, ["p2", "p3"]), (0.5, ["p0", "p1", "r4"]), (0.1, ["p0", "p1", "r4"]),
        (0.5, ["p1", "p3", "r4"]), (0.1, ["p1", "p3", "r4"]), (0.5, ["p0", "p2", "r4"]), (0.1, ["p0", "p2", "r4"])]
    assert world.fits[0]["embeddings"] == [2, 3] and world.fits[3]["embeddings"] == [0, 1, 4]
    assert all(f["steps"] == 3 and f["threads"] == 3 for f in world.fits)
    assert len({f["seed"] for f in world.fits}) == 8                 # every fit its own seed
    base = {"members": 2, "rfg_weight": 1.0, "blend": 0.0, "features": "encoder", "dropout": 0.1}
    settings = [dict(base, dropout=0.5), base, dict(base, blend=0.5)]
    report = model.cv_report
    rows = report["rows"]
    assert list(rows) == ["dropout=0.5", "defaults", "blend=0.5", "logistic regression"]
    perfect = {"accuracy": 1.0, "f1": 1.0, "macro_f1": 1.0}
    # "defaults": every fold at the other fold's threshold, 0.66 (yes 0.9, no 0.65); "blend=0.5": 0.5 x head + 0.5 x
    # baseline, yes 0.8 or 0.7, no 0.475: threshold 0.5; the baseline answers at 0.5 (p0's 0.5 is a yes)
    assert rows["defaults"]["folds"] == [pytest.approx(dict(perfect, threshold=0.66))] * 4
    assert rows["blend=0.5"]["folds"] == [pytest.approx(dict(perfect, threshold=0.5))] * 4
    assert rows["logistic regression"]["folds"] == [dict(perfect, threshold=0.5)] * 4
    for name in ("defaults", "blend=0.5", "logistic regression"):
        assert {k: v for k, v in rows[name].items() if k != "folds"} == pytest.approx(
            {"f1_mean": 1.0, "f1_std": 0.0, "macro_f1_mean": 1.0, "macro_f1_std": 0.0, "accuracy_mean": 1.0, "accuracy_std": 0.0})
    assert len(rows["dropout=0.5"]["folds"]) == 4 and rows["dropout=0.5"]["macro_f1_mean"] < 1.0
    # "defaults" and "blend=0.5" tie: the earlier setting wins; its out-of-fold probabilities choose 0.66
    assert model.setting == settings[1] and isinstance(model.ensemble, ClosureEnsemble)
    assert model.ensemble.dropout == 0.1 and model.ensemble.members == 2
    tau = 0.66 if threshold == "cv" else 0.375
    assert float(model.decision_threshold) == pytest.approx(tau)
    assert {k: v for k, v in report.items() if k not in ("rows", "threshold", "oof_threshold")} == {
        "settings": settings, "winner": settings[1], "winner_name": "defaults", "metric": "macro_f1", "repeats": 2, "steps": 3}
    assert (report["threshold"], report["oof_threshold"]) == pytest.approx((tau, 0.66))
    text = (tmp_path / "cv" / "deep" / "cv.json").read_text()
    assert json.loads(text) == json.loads(json.dumps(report)) and text == json.dumps(json.loads(text), indent=1)
    assert f"cross-validation over 2 plan folds x 2 repetition(s) (mean ± std over folds):\n{model.cv_table()}\n" \
           f"chosen: defaults, threshold {tau:.2f}" in caplog.text
    assert "| defaults | 100.0 ± 0.0 | 100.0 ± 0.0 | 100.0 ± 0.0 |" in model.cv_table()


def test_cross_validation_chooses_by_the_configured_metric(monkeypatch, tmp_path):
    world = CvWorld(monkeypatch, tmp_path, cv_metric="f1", cv_grid=[{"dropout": 0.5}, {}], cv_file=None)
    world.model.setup("fit")
    assert world.model.cv_report["winner_name"] == "defaults" and world.model.cv_report["metric"] == "f1"
    assert list(world.model.cv_report["rows"]) == ["dropout=0.5", "defaults", "logistic regression"]
    assert not (tmp_path / "cv").exists()


def test_cross_validation_without_the_baseline(monkeypatch, tmp_path):
    world = CvWorld(monkeypatch, tmp_path, logistic_baseline=False, cv_grid=[{}, {"dropout": 0.5}])
    world.model.setup("fit")
    assert world.baselines == [] and world.model.baseline is None
    assert list(world.model.cv_report["rows"]) == ["defaults", "dropout=0.5"]
    assert world.model.cv_report["winner_name"] == "defaults" and world.model.cv_report["repeats"] == 2


@pytest.mark.parametrize("stage, trainer, fits, baselines", [
    ("validate", SimpleTrainer(), 0, 0),                      # only fit sets the model up
    ("fit", SimpleTrainer(ckpt_path="last.ckpt"), 0, 1),      # resumed: keeps the checkpoint's setting
])
def test_setup_selects_only_when_a_fit_starts_afresh(monkeypatch, tmp_path, stage, trainer, fits, baselines):
    world = CvWorld(monkeypatch, tmp_path)
    world.model.trainer = trainer
    world.model.setup(stage)
    assert len(world.fits) == fits and len(world.baselines) == baselines
    assert world.model.cv_report == {} and (world.model.baseline is not None) == bool(baselines)
    assert world.requested == ([("encoder",)] if baselines else [])


def test_setup_without_a_grid_fits_the_baseline_only(monkeypatch, tmp_path):
    world = CvWorld(monkeypatch, tmp_path, cv_grid=[])
    world.model.setup("fit")
    assert world.fits == [] and world.model.baseline == "lr" and world.model.cv_report == {}


@pytest.mark.parametrize("trainer, kwargs, message", [
    (SimpleTrainer(batch_size=4), {}, "model selection by cross-validation trains every plan in one batch, as the fit "
                                      "must: set data.batch_size=null"),
    (SimpleTrainer(max_epochs=0), {}, "model selection by cross-validation trains for the fit's steps: set "
                                      "trainer.max_epochs > 0"),
    (SimpleTrainer(max_epochs=None), {}, "model selection by cross-validation trains for the fit's steps: set "
                                         "trainer.max_epochs > 0"),
    (SimpleTrainer(), {"cv_grid": [{"dropout": 0.5}, {"dropout": 0.5}]},
     "model.cv_grid repeats a setting: ['dropout=0.5', 'dropout=0.5']"),
])
def test_cross_validation_refuses_what_it_cannot_do(monkeypatch, tmp_path, trainer, kwargs, message):
    world = CvWorld(monkeypatch, tmp_path, **kwargs)
    world.model.trainer = trainer
    with pytest.raises(ValueError) as err:
        world.model.setup("fit")
    assert str(err.value) == message
    assert world.fits == []


def closure_test_records():
    """Test questions of two sets (one record repeated, as a padded distributed sampler repeats it)."""
    def rec(qset, qid, first, second, direction, answer, p_head, p_lr):
        return {"question": {"set": qset, "pair_id": qid, "plan_id": "p", "first": first, "second": second,
                             "direction": direction, "answer": answer}, "p_head": p_head, "p_lr": p_lr}
    return [rec("catbench", "q5", 1, 2, "before", "yes", 0.8, 0.45),
            rec("catbench", "q1", 0, 1, "before", "yes", 0.8, 0.6),
            rec("catbench", "q2", 1, 0, "after", "yes", 0.8, 0.6),     # the twin of q1, its steps given the other way
            rec("catbench", "q3", 0, 2, "before", "no", 0.5, 0.5),
            rec("catbench", "q4", 0, 2, "after", "no", 0.9, 0.4),
            rec("all_pairs", "a1", 0, 1, "before", "no", 0.2, 0.9),
            rec("all_pairs", "a2", 0, 1, "after", "no", 0.2, 0.2),
            rec("catbench", "q1", 0, 1, "before", "yes", 0.8, 0.6)]


def test_closure_head_test_report_blends_answers_at_its_threshold():
    model = tiny_closure_head(threshold=0.625, blend=0.5, members=1)
    model.baseline = "lr"
    model.cv_report = {"winner_name": "defaults", "rows": {
        "defaults": {"folds": [{}], "macro_f1_mean": 0.75, "macro_f1_std": 0.25},
        "other": {"folds": [], "macro_f1_mean": 0.5},
        "logistic regression": {"folds": [{}], "accuracy_mean": 0.5}}}
    logged = capture_logs(model)
    model._eval_records = closure_test_records()
    model.on_test_epoch_end()
    assert model._eval_records == []
    # p = (p_head + p_lr) / 2: q1 0.7, q2 0.7, q3 0.5, q4 0.65, q5 0.625 -> yes yes no yes yes at 0.625;
    # the baseline at 0.5: yes yes yes no no.  Gold: yes yes no no yes
    catbench = {"catbench": (4 / 5, 3 / 4, 1.0, 6 / 7, (6 / 7 + 2 / 3) / 2, 1 / 2),
                "lr_baseline": (3 / 5, 2 / 3, 2 / 3, 2 / 3, (2 / 3 + 1 / 2) / 2, 1 / 2),
                "always_yes": (3 / 5, 3 / 5, 1.0, 3 / 4, 3 / 8, 1.0),
                "always_no": (2 / 5, 0.0, 0.0, 0.0, 2 / 7, 1.0)}
    keys = ("accuracy", "precision_yes", "recall_yes", "f1_yes", "macro_f1", "twin_consistency")
    expected = {f"test/{row}_{k}": v for row, values in catbench.items() for k, v in zip(keys, values)}
    # all_pairs, gold no no: a1 0.55 no (baseline 0.9 yes), a2 0.2 no
    all_pairs = {"catbench": (1.0, 0.0, 0.0, 0.0, 0.5, 1.0), "lr_baseline": (0.5, 0.0, 0.0, 0.0, 1 / 3, 0.0),
                 "always_yes": (0.0, 0.0, 0.0, 0.0, 0.0, 1.0), "always_no": (1.0, 0.0, 0.0, 0.0, 0.5, 1.0)}
    expected.update({f"test/all_pairs/{row}_{k}": v for row, values in all_pairs.items() for k, v in zip(keys, values)})
    expected.update({"test/n": 5, "test/all_pairs/n": 2, "test/threshold": 0.625, "test/cv_macro_f1_mean": 0.75,
                     "test/cv_macro_f1_std": 0.25, "test/cv_lr_baseline_accuracy_mean": 0.5})
    assert logged == pytest.approx(expected)
    assert list(model.test_rows) == ["catbench", "all_pairs"]
    assert list(model.test_rows["catbench"]) == ["always yes", "always no", "majority (yes)", "closure head",
                                                 "logistic regression"]
    assert model.test_rows["catbench"]["closure head"]["n_twins"] == 2
    assert [(p["set"], p["id"], p["answer"], p["lr_answer"]) for p in model.test_predictions] == [
        ("catbench", "q1", "yes", "yes"), ("catbench", "q2", "yes", "yes"), ("catbench", "q3", "no", "yes"),
        ("catbench", "q4", "yes", "no"), ("catbench", "q5", "yes", "no"), ("all_pairs", "a1", "no", "yes"),
        ("all_pairs", "a2", "no", "no")]
    assert model.test_predictions[1] == {"set": "catbench", "id": "q2", "first": 1, "second": 0, "direction": "after",
                                         "p_dependent": pytest.approx(0.7), "p_head": 0.8, "p_lr": 0.6, "answer": "yes",
                                         "lr_answer": "yes", "gold": "yes"}


def test_closure_head_test_report_without_the_baseline():
    model = tiny_closure_head(threshold=0.625, members=1, logistic_baseline=False)
    logged = capture_logs(model)
    model._eval_records = [dict(r, p_lr=None) for r in closure_test_records() if r["question"]["set"] == "catbench"]
    model.on_test_epoch_end()
    assert list(model.test_rows["catbench"]) == ["always yes", "always no", "majority (yes)", "closure head"]
    # the head alone: q1 0.8, q2 0.8, q3 0.5, q4 0.9, q5 0.8 -> yes yes no yes yes
    assert [(p["id"], p["answer"], p["p_dependent"], p["lr_answer"]) for p in model.test_predictions] == [
        ("q1", "yes", 0.8, None), ("q2", "yes", 0.8, None), ("q3", "no", 0.5, None), ("q4", "yes", 0.9, None),
        ("q5", "yes", 0.8, None)]
    assert not any("lr_baseline" in k or k.startswith("test/cv_") for k in logged)
    assert logged["test/catbench_accuracy"] == pytest.approx(4 / 5)


def test_closure_head_refuses_a_blend_without_a_baseline():
    model = tiny_closure_head(members=1)
    model.setting = dict(model.setting, blend=0.25)
    model._eval_records = []
    with pytest.raises(RuntimeError, match=r"the head blends in the logistic-regression baseline \(blend=0.25\) but "
                                           r"none was fitted: set model.logistic_baseline=true"):
        model.on_test_epoch_end()
