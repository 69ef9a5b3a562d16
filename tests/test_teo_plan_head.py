"""The plan-aware TEO head: plan windows and step positions, mirrored presentations, CaT-Bench
metrics against sklearn and the answers-file scorer (its experiments' runs: tests/test_train.py)."""
from __future__ import annotations

import json

import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support

from data_modules.adapters.catbench import read_catbench
from data_modules.tasks.teo import teo_training_pairs
from data_modules.teo_plans import PlanCollator, catbench_plan_items, plan_item
from seqaware.encoders.steps import step_windows
from seqaware.metrics.classification import binary_report, choose_threshold, twin_consistency
from seqaware.modules.teo_plan_head import SWAP, TeoPlanHeadModule, relations
from seqaware.objectives.base import EncoderOutput
from seqaware.pretrained import load_tokenizer
from seqaware.procedure import Procedure, Step

TINY_BERT = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 512}


def tiny_module(**kwargs) -> TeoPlanHeadModule:
    encoder = {"_target_": "seqaware.encoders.create_encoder", "name": "text", "config": TINY_BERT,
               "tokenizer": "offline:minilm"}
    kwargs = {"step_dim": 16, "step_layers": 1, "step_heads": 2, "pair_hidden": 16, **kwargs}
    torch.manual_seed(0)
    return TeoPlanHeadModule(encoder=encoder, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3}, **kwargs)


def long_plan(n: int = 23) -> list[str]:
    # distinct, differently long steps
    return [f"step {i} " + " ".join(["stir the sauce"] * (1 + i % 4)) + "." for i in range(n)]


# ---------------------------------------------------------------- windows and step positions
@pytest.mark.parametrize("lengths, budget", [([5] * 30, 23), ([3, 17, 2, 9, 11, 1, 20, 4, 6, 8, 13], 25), ([7], 7), ([4, 4], 100)])
def test_windows_own_every_step_once_and_fit(lengths, budget):
    windows = step_windows(lengths, budget)
    owned = [i for _, _, s, e in windows for i in range(s, e)]
    assert owned == list(range(len(lengths)))                       # each step once, in plan order
    for start, end, own_start, own_end in windows:
        assert start <= own_start < own_end <= end
        assert sum(lengths[start:end]) <= budget
    if sum(lengths) <= budget:
        assert windows == [(0, len(lengths), 0, len(lengths))]


def test_window_gives_an_owned_step_context_on_both_sides():
    windows = step_windows([5] * 30, 40)
    middle = next(w for w in windows if w[2] <= 15 < w[3])
    assert middle[0] < middle[2] and middle[3] < middle[1]          # steps before and after the owned core


def test_a_step_longer_than_a_window_is_an_error():
    with pytest.raises(ValueError, match="does not fit a window"):
        step_windows([3, 50], 40)
    with pytest.raises(ValueError, match="max_step_tokens=80 must not exceed data.max_tokens=64"):
        PlanCollator(None, max_tokens=64, max_step_tokens=80)


def test_windowed_collation_marks_the_right_steps():
    tok = load_tokenizer("offline:minilm")
    steps = long_plan()
    batch = PlanCollator(tok, max_tokens=48, max_step_tokens=20)([{"plan_id": "p", "steps": ["Serve."]},
                                                                   {"plan_id": "q", "steps": steps}])
    assert batch["input_ids"].shape[0] > 2                            # the long plan needed several windows
    owners = {}
    for w in range(batch["input_ids"].shape[0]):
        for s in range(batch["input_ids"].shape[1]):
            index = int(batch["window_step"][w, s])
            if index < 0:
                continue
            ids = batch["input_ids"][w, s][batch["attention_mask"][w, s].bool()]
            text = tok.decode(ids, skip_special_tokens=True)
            expected = "Serve." if index == 0 else steps[index - 1]   # batch-wide index: plan q starts at 1
            assert text.replace(" ", "") == expected.lower().replace(" ", "")
            if bool(batch["window_owner"][w, s]):
                owners[index] = owners.get(index, 0) + 1
    assert owners == {i: 1 for i in range(1 + len(steps))}
    assert batch["num_steps"].tolist() == [1, len(steps)]


def test_step_embeddings_do_not_depend_on_windowing():
    """With a context-free encoder (token state = word embedding) a step's embedding is the mean of its
    own word embeddings, whatever window it comes from: the step index survives windowing."""
    tok = load_tokenizer("offline:minilm")
    model = tiny_module().eval()
    emb = model.encoder.word_embeddings
    model.encoder.forward = lambda fusion: EncoderOutput(cls=emb(fusion["input_ids"])[:, 0],  # type: ignore[method-assign]
                                                         text_states=emb(fusion["input_ids"]))
    steps = long_plan()
    items = [{"plan_id": "p", "steps": ["Serve hot."]}, {"plan_id": "q", "steps": steps}]
    whole, mask = model.step_embeddings(PlanCollator(tok, max_tokens=512, max_step_tokens=20)(items))
    windowed, mask2 = model.step_embeddings(PlanCollator(tok, max_tokens=40, max_step_tokens=20)(items))
    assert torch.equal(mask, mask2) and mask.sum().item() == 1 + len(steps)
    torch.testing.assert_close(whole[mask], windowed[mask])
    for i in (0, 11, len(steps) - 1):
        ids = tok(steps[i], truncation=True, max_length=20)["input_ids"][1:-1]   # without [CLS] / [SEP]
        torch.testing.assert_close(windowed[1, i], emb(torch.tensor(ids)).mean(0))


# ---------------------------------------------------------------- mirrored presentations
def test_the_two_presentations_of_a_pair_get_swapped_logits():
    tok = load_tokenizer("offline:minilm")
    model = tiny_module().eval()
    batch = PlanCollator(tok, max_tokens=40, max_step_tokens=20)([{"plan_id": "q", "steps": long_plan(9)},
                                                                   {"plan_id": "p", "steps": ["Cut.", "Cook.", "Serve."]}])
    with torch.no_grad():
        logits = model(batch)
    assert torch.equal(logits.transpose(1, 2), logits[..., SWAP])  # exactly: final(b, a) = P final(a, b)
    probs = logits.softmax(-1)
    a, b = [0, 2, 5, 1], [3, 7, 6, 8]
    there = relations(probs[0, a, b], a, b, threshold=0.3)
    back = relations(probs[0, b, a], b, a, threshold=0.3)
    swapped = {"before": "after", "after": "before", "independent": "independent"}
    assert back == [swapped[y] for y in there]


def test_without_mirror_the_presentations_are_scored_apart():
    tok = load_tokenizer("offline:minilm")
    model = tiny_module(mirror=False).eval()
    batch = PlanCollator(tok)([{"plan_id": "p", "steps": ["Cut.", "Cook.", "Serve."]}])
    with torch.no_grad():
        logits = model(batch)
    assert not torch.allclose(logits.transpose(1, 2), logits[..., SWAP])


def test_relations_decision_rule():
    probs = torch.tensor([[0.5, 0.2, 0.3], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4], [0.1, 0.7, 0.2]])
    assert relations(probs, [0, 0, 3, 0], [1, 1, 1, 1], threshold=0.5) == ["before", "independent", "after", "after"]
    assert relations(probs, [0, 0, 3, 0], [1, 1, 1, 1], threshold=0.39) == ["before", "before", "after", "after"]


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="model.threshold"):
        tiny_module(threshold=1.5)
    with pytest.raises(ValueError, match="model.class_weights"):
        tiny_module(class_weights=[1.0, 2.0])


def test_training_labels_are_mateo_pairs():
    proc = Procedure(id="r", steps=[Step(text=t) for t in ("a.", "b.", "c.", "d.")], split="train",
                     dag=[(0, 1), (1, 2), (0, 2)])
    item = plan_item(proc, "train")
    assert sorted(item["labels"]) == sorted((p["a"], p["b"], p["label"]) for p in teo_training_pairs([proc]))
    # every directed edge (MATEO sec. 5.2) in both presentations, independent pairs once
    assert sorted(item["labels"]) == [(0, 1, "before"), (0, 2, "before"), (0, 3, "independent"), (1, 0, "after"),
                                      (1, 2, "before"), (1, 3, "independent"), (2, 0, "after"), (2, 1, "after"),
                                      (2, 3, "independent")]
    # pairs="reduction": the transitive pair 0 -> 2 is not used
    reduced = plan_item(proc, "train", pairs="reduction")
    assert sorted(reduced["labels"]) == [(0, 1, "before"), (0, 3, "independent"), (1, 0, "after"), (1, 2, "before"),
                                         (1, 3, "independent"), (2, 1, "after"), (2, 3, "independent")]


# ---------------------------------------------------------------- CaT-Bench metrics
GOLD = ["yes", "yes", "no", "no", "no", "yes", "no", "no", "yes", "no"]
PRED = ["yes", "no", "no", "yes", "no", "yes", "no", "yes", "yes", "no"]


def test_catbench_metrics_equal_sklearn_and_hand_values():
    report = binary_report(GOLD, PRED)
    # by hand: TP 3, FP 2, FN 1, TN 4
    assert report["accuracy"] == pytest.approx(0.7)
    assert (report["precision"], report["recall"], report["f1"]) == pytest.approx((3 / 5, 3 / 4, 2 / 3))
    assert report["f1_no"] == pytest.approx(8 / 11)                    # P 4/5, R 4/6
    assert report["macro_f1"] == pytest.approx((2 / 3 + 8 / 11) / 2)
    p, r, f, _ = precision_recall_fscore_support(GOLD, PRED, labels=["yes"], zero_division=0)
    assert (report["precision"], report["recall"], report["f1"]) == pytest.approx((p[0], r[0], f[0]))
    assert report["accuracy"] == pytest.approx(accuracy_score(GOLD, PRED))
    assert report["macro_f1"] == pytest.approx(f1_score(GOLD, PRED, average="macro"))


def test_twin_consistency_by_hand():
    keys = [(0, 1, 2), (0, 1, 2), (0, 1, 3), (0, 1, 3), (1, 0, 1), (1, 0, 1), (2, 0, 4)]
    answers = ["yes", "yes", "yes", "no", "no", "no", "yes"]
    # pairs asked twice: (0,1,2) same, (0,1,3) differ, (1,0,1) same; (2,0,4) asked once is left out
    assert twin_consistency(keys, answers) == {"twin_consistency": pytest.approx(2 / 3), "n_twins": 3}


def test_twin_consistency_two_missing_answers_do_not_agree():
    keys = [("p", 0, 1), ("p", 0, 1), ("p", 1, 2), ("p", 1, 2), ("p", 2, 3), ("p", 2, 3)]
    answers = ["no", "no", None, None, None, "no"]
    assert twin_consistency(keys, answers) == {"twin_consistency": pytest.approx(1 / 3), "n_twins": 3}
    assert twin_consistency([], []) == {"twin_consistency": 0.0, "n_twins": 0}


def test_threshold_boundary_and_ties():
    # a score equal to the threshold answers yes: only t = 0.50 of the grid separates 0.50 from 0.49
    assert choose_threshold(["yes", "no"], [0.5, 0.49]) == (pytest.approx(0.5), pytest.approx(1.0))
    # every t in (0.1, 0.9] is perfect: the one closest to 0.5 is chosen
    assert choose_threshold(["yes", "no"], [0.9, 0.1])[0] == pytest.approx(0.5)
    # equally far from 0.5: the smaller threshold
    assert choose_threshold(["yes", "no"], [0.9, 0.1], grid=[0.6, 0.4])[0] == pytest.approx(0.4)


def test_threshold_is_chosen_for_the_metric():
    gold = ["yes", "yes", "no", "no", "no"]
    scores = [0.9, 0.35, 0.3, 0.1, 0.6]
    tau, value = choose_threshold(gold, scores, metric="accuracy")
    assert value == pytest.approx(0.8) and (0.31 <= tau <= 0.35 or 0.61 <= tau <= 0.9)
    assert tau == pytest.approx(0.61)                                   # of the best, the one closest to 0.5


def _questions(tmp_path):
    steps = ["Heat the oven.", "Mix flour and eggs.", "Pour into a tin.", "Bake 20 minutes."]
    rows = []
    for k, (first, second, label) in enumerate([(0, 3, "yes"), (1, 2, "yes"), (0, 1, "no")]):
        for direction in ("before", "after"):
            qtype = ("dependent" if label == "yes" else "nondependent") + f"_real_{direction}"
            rows.append({"plan_idx": 5, "title": "cake", "question_idx": k, "question_type": qtype, "direction": direction,
                         "binary_question": "?", "steps": steps, "first_step_idx": first, "second_step_idx": second,
                         "label": label, "efg_recipe_id": "Cake"})
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def test_catbench_questions_group_into_plans(tmp_path):
    path, rows = _questions(tmp_path)
    items = catbench_plan_items(read_catbench(path))
    assert len(items) == 1 and items[0]["steps"] == rows[0]["steps"]
    assert [(p["a"], p["b"], p["direction"]) for p in items[0]["pairs"]] == [
        (r["first_step_idx"], r["second_step_idx"], r["direction"]) for r in rows]


def test_catbench_eval_script_scores_answer_files(tmp_path, capsys):
    from scripts.tools.catbench_eval import main

    path, rows = _questions(tmp_path)
    # a train.py predictions file (ids) and a published-answers style file (CaT-Bench fields, raw text)
    ours = [{"id": f"5-{r['question_type']}-{r['question_idx']}", "answer": a}
            for r, a in zip(rows, ["yes", "yes", "yes", "no", "no", "no"])]
    gpt4 = [{"plan_idx": 5, "question_type": r["question_type"], "question_idx": r["question_idx"], "answer": a}
            for r, a in zip(rows, ["Yes.", "yes", "Yes, because", "No", "maybe"])]  # the last question unanswered
    (tmp_path / "ours.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ours))
    (tmp_path / "gpt4.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gpt4))
    out = tmp_path / "rows.json"
    assert main(["--questions", str(path), "--answers", f"ours={tmp_path / 'ours.jsonl'}",
                 "--gpt4", str(tmp_path / "gpt4.jsonl"), "--json", str(out)]) == 0
    table = json.loads(out.read_text())
    gold = [r["label"] for r in rows]
    assert table["ours"]["accuracy"] == pytest.approx(accuracy_score(gold, ["yes", "yes", "yes", "no", "no", "no"]))
    assert table["ours"]["twin_consistency"] == pytest.approx(2 / 3)   # pair (1, 2) answered yes / no
    assert table["GPT-4"]["invalid_rate"] == pytest.approx(2 / 6)      # "maybe" and the missing answer
    assert table["GPT-4"]["twin_consistency"] == pytest.approx(1 / 3)  # (1, 2) yes / no; (0, 1) unanswered
    assert table["always yes"]["f1"] == pytest.approx(f1_score(gold, ["yes"] * 6, pos_label="yes"))
    assert "1 questions without an answer" in capsys.readouterr().err
    # --yes-share: every row again with "yes" questions weighing 0.25 of the total
    assert main(["--questions", str(path), "--answers", f"ours={tmp_path / 'ours.jsonl'}", "--yes-share", "0.25",
                 "--json", str(out)]) == 0
    shared = json.loads(out.read_text())["yes_share_0.25"]
    p_yes = gold.count("yes") / len(gold)
    weights = [0.25 / p_yes if g == "yes" else 0.75 / (1 - p_yes) for g in gold]
    assert shared["ours"]["accuracy"] == pytest.approx(accuracy_score(gold, ["yes", "yes", "yes", "no", "no", "no"],
                                                                      sample_weight=weights))
    assert shared["always no"]["accuracy"] == pytest.approx(0.75)
    assert "Re-weighted so that 'yes' questions weigh 25.0%" in capsys.readouterr().out


def test_catbench_eval_script_names_bad_lines(tmp_path):
    from scripts.tools.catbench_eval import main

    path, _ = _questions(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "5-x-0"}\n{"answer": "yes"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: answer: missing field\n.*bad.jsonl:2: id: missing"):
        main(["--questions", str(path), "--answers", f"x={bad}"])


@pytest.mark.shared_data
def test_rfg_rows_answer_from_the_flow_graph(shared_data):
    """Every CaT-Bench "yes" of the sample is joined by an r-FG path; the rows answer every question."""
    from scripts.tools.catbench_eval import rfg_answers, score

    questions = read_catbench(shared_data / "catbench" / "test_questions_sample.jsonl")
    rows = score(questions, rfg_answers(questions, shared_data / "rfg" / "r-100"))
    assert rows["r-FG path"]["recall"] == 1.0 and rows["r-FG path"]["invalid_rate"] == 0.0
    assert rows["r-FG direct"]["invalid_rate"] == 0.0 and rows["r-FG direct"]["recall"] < rows["r-FG path"]["recall"]


# ---------------------------------------------------------------- the shared step home (seqaware.encoders.steps)
def _reference_logits(model: TeoPlanHeadModule, batch: dict) -> torch.Tensor:
    """The plan head's logits as computed before step pooling and pair features moved to
    :mod:`seqaware.encoders.steps` (kept inline: the refactor must not change a bit)."""
    from seqaware.encoders.base import pack_steps
    from seqaware.modules.teo_plan_head import mirror_logits, pair_position_features, sinusoidal_positions

    slot_used = batch["window_step"] >= 0
    fusion = pack_steps(batch["input_ids"], batch["attention_mask"], slot_used, model.encoder.cls_token_id,
                        model.encoder.pad_token_id)
    tokens = model.encoder(fusion).text_states
    local = fusion["text_step"]
    slot = local.clamp(min=0)
    index = batch["window_step"].gather(1, slot)
    owned = batch["window_owner"].gather(1, slot) & (local >= 0)
    num_steps = batch["num_steps"]
    total = int(num_steps.sum())
    sums = tokens.new_zeros(total, tokens.shape[-1]).index_add_(0, index[owned], tokens[owned])
    counts = tokens.new_zeros(total).index_add_(0, index[owned], tokens.new_ones(int(owned.sum())))
    steps = sums / counts[:, None]
    B, S = len(num_steps), int(num_steps.max())
    plan = torch.repeat_interleave(torch.arange(B), num_steps)
    pos = torch.arange(total) - (torch.cumsum(num_steps, 0) - num_steps)[plan]
    out = tokens.new_zeros(B, S, tokens.shape[-1])
    out[plan, pos] = steps
    mask = torch.arange(S)[None, :] < num_steps[:, None]
    h = model.step_proj(out) + sinusoidal_positions(torch.arange(S), model.hparams.step_dim)
    h = model.step_encoder(h, src_key_padding_mask=~mask)
    ha = h[:, :, None, :].expand(-1, -1, S, -1)
    hb = h[:, None, :, :].expand(-1, S, -1, -1)
    logits = model.pair_mlp(torch.cat([ha, hb, ha * hb, ha - hb, pair_position_features(num_steps, S)], -1))
    return mirror_logits(logits)


@pytest.mark.parametrize("max_tokens", [512, 40])
def test_logits_are_bit_for_bit_those_before_the_shared_step_module(max_tokens):
    tok = load_tokenizer("offline:minilm")
    model = tiny_module().eval()
    batch = PlanCollator(tok, max_tokens=max_tokens, max_step_tokens=20)(
        [{"plan_id": "q", "steps": long_plan(11)}, {"plan_id": "p", "steps": ["Cut.", "Cook.", "Serve."]}])
    with torch.no_grad():
        assert torch.equal(model(batch), _reference_logits(model, batch))
