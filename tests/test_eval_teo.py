"""The prompted-VLM evaluation runner: caching/resuming, metrics vs hand computation, the script."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from data_modules.tasks.teo import teo_eval_sets
from seqaware.procedure import Procedure, Step
from seqaware.vlm.prompts import build_coherence_prompt, build_iso_prompt, prompt_images, prompt_text
from seqaware.vlm.protocols.coherence import evaluate_coherence
from seqaware.vlm.protocols.iso import evaluate_iso
from seqaware.vlm.protocols.teo import evaluate_teo, teo_queries
from seqaware.vlm.runner import OutputCache, run_queries, write_result

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["Mix the flour and the water.", "Knead the dough.", "Grate the cheese."]


def _procedure(tmp_path: Path, images: bool = True) -> Procedure:
    """3 steps, DAG 0 -> 1; step 2 independent of both (pairs: before 0-1, independent 0-2, 1-2)."""
    steps = []
    for i, text in enumerate(TEXTS):
        paths = []
        if images:
            (tmp_path / "images").mkdir(exist_ok=True)
            Image.new("RGB", (16, 16), (60 * i, 0, 0)).save(tmp_path / "images" / f"p_{i}.png")
            paths = [f"images/p_{i}.png"]
        steps.append(Step(text=text, images=paths))
    return Procedure(id="p", steps=steps, split="test", dag=[(0, 1)], root=str(tmp_path))


class ScriptedModel:
    """A fake generator: replies from the (Step A text, Step B text) shown; records every call."""

    def __init__(self, replies: dict[tuple[str, str], str], fail_after: int | None = None) -> None:
        self.replies, self.fail_after, self.calls = replies, fail_after, []

    def __call__(self, batch):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt("simulated crash")
        self.calls.append(len(batch))
        out = []
        for messages in batch:
            text = prompt_text(messages)
            a = next(t for t in TEXTS if f"Step A description: {t}" in text)
            b = next(t for t in TEXTS if f"Step B description: {t}" in text)
            out.append(self.replies[(a, b)])
        return out


YES = {"before": "Q1: The answer is: Yes.\nQ2: The answer is: No.\nQ3: The answer is: No.",  # MATEO's format (Table 6)
       "after": "Q1: No\nQ2: Yes\nQ3: No", "independent": "Q1: The answer is: No. Q2: The answer is: No. Q3: The answer is: Yes."}
M, K, G = TEXTS
# original: (0,1) before OK; (0,2) independent OK; (1,2) non-answer. swapped: (1,0) after OK; (2,0) before; (2,1) independent
HAND_REPLIES = {(M, K): YES["before"], (M, G): YES["independent"],
                (K, G): "Q1: The answer is: I don't know.\nQ2: The answer is: No.\nQ3: The answer is: No.",
                (K, M): "**Q1:** No\n**Q2:** Yes\n**Q3:** No", (G, M): YES["before"], (G, K): YES["independent"]}


def test_metrics_equal_hand_computation(tmp_path):
    sets = teo_eval_sets([_procedure(tmp_path, images=False)])
    assert [(p["a"], p["b"], p["label"]) for p in sets["original"]] == [(0, 1, "before"), (0, 2, "independent"), (1, 2, "independent")]
    result = evaluate_teo(sets, ScriptedModel(HAND_REPLIES), OutputCache(tmp_path / "raw.jsonl"), "baseline", "text", "fake")
    row = result["rows"]["fake"]
    # consistency: only the dependent pair is right in both presentations
    assert row["consistency_accuracy"] == pytest.approx(1 / 3)
    assert row["consistency_dependent"] == 1.0 and row["consistency_independent"] == 0.0
    # before on original: tp 1, predicted 1, support 1; after on swapped: tp 1, predicted 1, support 1
    assert row["f1_before"] == 1.0 and row["f1_after"] == 1.0
    # independent over both sets: support 4, predicted 2 (0-2 original, 2-1 swapped), tp 2 -> 2*2/(2+4)
    assert row["f1_independent"] == pytest.approx(2 / 3)
    assert row["macro_f1"] == pytest.approx((1 + 1 + 2 / 3) / 3)
    # MATEO Table 4: independent on the original order only: support 2, predicted 1 (0-2), tp 1 -> 2/3
    assert row["mateo_f1_before"] == row["mateo_f1_after"] == 1.0
    assert row["mateo_f1_independent"] == pytest.approx(2 / 3)
    assert row["other_rate"] == pytest.approx(1 / 6)
    assert row["accuracy_original"] == pytest.approx(2 / 3) and row["accuracy_swapped"] == pytest.approx(2 / 3)
    assert list(result["rows"])[:3] == ["always independent", "majority", "random"]
    assert result["predictions"]["original"] == {"p:0-1": "before", "p:0-2": "independent", "p:1-2": "other"}
    # the markdown row shows the same numbers as percentages
    line = next(l for l in result["table"].splitlines() if l.startswith("| fake |"))
    assert line == "| fake | 33.3 | 100.0 | 0.0 | 100.0 | 100.0 | 66.7 | 66.7 | 88.9 | 16.7 |"

    paths = write_result(result, tmp_path / "out")
    assert json.loads(paths["json"].read_text())["rows"]["fake"]["f1_independent"] == pytest.approx(2 / 3)
    assert "| fake |" in paths["md"].read_text()
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_self_reflection_first_and_final(tmp_path):
    sets = teo_eval_sets([_procedure(tmp_path, images=False)])
    answer = {"before": "Before", "after": "After", "independent": "Parallel"}
    gold = {(M, K): "before", (M, G): "independent", (K, G): "independent",
            (K, M): "after", (G, M): "independent", (G, K): "independent"}
    first = {**gold, (M, K): "after", (G, M): "before"}            # two wrong first answers
    final = {**gold, (G, M): "before", (K, G): "after"}             # one corrected, one kept wrong, one broken
    replies = {k: f"The answer is: {answer[first[k]]}\nReflecting...\nThe final answer: {answer[final[k]]}" for k in gold}
    result = evaluate_teo(sets, ScriptedModel(replies), OutputCache(tmp_path / "raw.jsonl"), "self_reflection", "text", "fake")
    assert result["reflection"] == {"kept_correct": 3, "kept_wrong": 1, "corrected": 1, "broken": 1, "changed_wrong": 0}
    assert result["rows"]["fake"]["accuracy_original"] == pytest.approx(2 / 3)       # final: 0-1 ok, 0-2 ok, 1-2 after
    assert result["rows"]["fake (first answer)"]["accuracy_original"] == pytest.approx(2 / 3)  # first: 0-1 wrong


def test_resume_generates_only_missing_keys(tmp_path):
    sets = teo_eval_sets([_procedure(tmp_path, images=False)])
    cache_path = tmp_path / "raw.jsonl"
    crashing = ScriptedModel(HAND_REPLIES, fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        evaluate_teo(sets, crashing, OutputCache(cache_path), "instructions", "text", "fake", batch_size=2)
    assert crashing.calls == [2, 2]                         # third batch crashed before answering
    assert len(cache_path.read_text().splitlines()) == 4    # the two finished batches are on disk

    resumed = ScriptedModel(HAND_REPLIES)
    first = evaluate_teo(sets, resumed, OutputCache(cache_path), "instructions", "text", "fake", batch_size=2)
    assert resumed.calls == [2]                             # only the 2 missing prompts
    again = ScriptedModel(HAND_REPLIES)
    second = evaluate_teo(sets, again, OutputCache(cache_path), "instructions", "text", "fake", batch_size=2)
    assert again.calls == [] and second["rows"] == first["rows"]
    # another strategy or model has other prompt hashes: nothing is reused by mistake
    other = ScriptedModel(HAND_REPLIES)
    evaluate_teo(sets, other, OutputCache(cache_path), "baseline", "text", "fake", batch_size=8)
    evaluate_teo(sets, other, OutputCache(cache_path), "baseline", "text", "fake-2", batch_size=8)
    assert other.calls == [6, 6]
    records = [json.loads(l) for l in cache_path.read_text().splitlines()]
    assert len({(r["item_id"], r["set"], r["prompt_hash"]) for r in records}) == len(records) == 18


def test_torn_last_line_is_dropped(tmp_path):
    cache_path = tmp_path / "raw.jsonl"
    cache = OutputCache(cache_path)
    cache.append([{"item_id": "a", "set": "original", "prompt_hash": "h", "output": "Q1: Yes"}])
    with open(cache_path, "a") as handle:
        handle.write('{"item_id": "b", "set": "orig')   # a crash in the middle of a write
    reopened = OutputCache(cache_path)
    assert len(reopened) == 1 and reopened.get(("a", "original", "h")) == "Q1: Yes"
    reopened.append([{"item_id": "c", "set": "original", "prompt_hash": "h", "output": "x"}])
    assert len(OutputCache(cache_path)) == 2


def test_malformed_cache_line_names_file_and_line(tmp_path):
    cache_path = tmp_path / "raw.jsonl"
    cache_path.write_text('{"item_id": "a", "set": "s", "prompt_hash": "h", "output": "x"}\n{"item_id": "b"}\n')
    with pytest.raises(ValueError, match=r"raw.jsonl:2: not a raw-output record"):
        OutputCache(cache_path)


def test_generator_must_answer_every_prompt(tmp_path):
    queries = teo_queries(teo_eval_sets([_procedure(tmp_path, images=False)]), "baseline", "text", "sig")
    with pytest.raises(RuntimeError, match="2 replies for a batch of 3"):
        run_queries(queries, lambda batch: ["Q1: Yes"] * 2, OutputCache(tmp_path / "raw.jsonl"), batch_size=3)


def test_image_prompts_use_resolved_paths_and_errors_name_the_pair(tmp_path):
    proc = _procedure(tmp_path)
    sets = teo_eval_sets([proc])
    queries = teo_queries(sets, "cot", "image", "sig", image_root=tmp_path)
    assert prompt_images(queries[0].messages) == [str(tmp_path / "images/p_0.png"), str(tmp_path / "images/p_1.png")]
    assert all(Path(p).is_file() for q in queries for p in prompt_images(q.messages))
    # the cache key does not depend on where the data folder lives
    elsewhere = teo_queries(sets, "cot", "image", "sig", image_root=tmp_path / "other-root")
    assert [q.key for q in elsewhere] == [q.key for q in queries]
    assert [q.key for q in teo_queries(sets, "cot", "image", "sig2", image_root=tmp_path)] != [q.key for q in queries]
    proc.steps[2].images = []
    with pytest.raises(ValueError, match=r"TEO pair 'p:0-2' \(original set\): Step B has no image"):
        teo_queries(teo_eval_sets([proc]), "cot", "image", "sig", image_root=tmp_path)


# ---------------------------------------------------------------- ISO-Bench / COHERENCE protocols
class ReplyByImage:
    """A fake generator answering from the (first) image path in the prompt; records its token limit."""

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies, self.max_new_tokens, self.limits = replies, 512, []

    def __call__(self, batch):
        self.limits.append(self.max_new_tokens)
        return [self.replies[Path(prompt_images(m)[0]).name] for m in batch]


def _iso_instance(step: int, task: str, label: str) -> dict:
    return {"instance_id": f"p:{task}:s{step}", "goal": "Make bread", "task": task, "snippet": ["Mix.", "Bake."],
            "image": f"images/p_{step}.png", "label": label}


def test_evaluate_iso_paper_protocol(tmp_path):
    """120 new tokens, first YES/NO, unparsable replies left out of every score (ISO-Bench App. H)."""
    instances = [_iso_instance(0, "before", "DEP"), _iso_instance(1, "before", "NONDEP"), _iso_instance(2, "after", "DEP"),
                 _iso_instance(3, "after", "NONDEP"), _iso_instance(4, "after", "DEP")]
    replies = {"p_0.png": "YES, it must.", "p_1.png": "Yes.", "p_2.png": "I am not sure.", "p_3.png": "NO",
               "p_4.png": "no, it need not"}
    model = ReplyByImage(replies)
    result = evaluate_iso(instances, model, OutputCache(tmp_path / "raw.jsonl"), "answer_only", "fake", image_root=tmp_path)
    assert model.limits == [120] and model.max_new_tokens == 512       # limit applied for the call only
    assert result["predictions"] == {"p:before:s0": "DEP", "p:before:s1": "DEP", "p:after:s2": "other",
                                     "p:after:s3": "NONDEP", "p:after:s4": "NONDEP"}
    row = result["rows"]["fake"]
    # scored: (DEP,DEP) (NONDEP,DEP) (NONDEP,NONDEP) (DEP,NONDEP): DEP tp 1/2 predicted, 1/2 gold; same for NONDEP
    assert row["n"] == 5 and row["n_scored"] == 4 and row["num_unparsable"] == 1 and row["invalid_rate"] == 0.2
    assert row["accuracy"] == 0.5 and row["f1_DEP"] == row["f1_NONDEP"] == row["macro_f1"] == 0.5
    # before: s0 right, s1 wrong -> DEP P 1/2 R 1; after: s2 dropped, s3 right, s4 wrong
    assert result["by_task"]["before"]["precision_DEP"] == 0.5 and result["by_task"]["before"]["recall_DEP"] == 1.0
    assert result["by_task"]["after"]["n_scored"] == 2 and result["by_task"]["after"]["recall_DEP"] == 0.0
    strict = evaluate_iso(instances, model, OutputCache(tmp_path / "raw.jsonl"), "answer_only", "fake",
                          image_root=tmp_path, unparsable="wrong")
    assert model.limits == [120] and strict["rows"]["fake"]["accuracy"] == pytest.approx(2 / 5)   # all cached
    # every result holds both rules and prints both tables; "rows" follows the call's rule
    for res in (result, strict):
        assert res["rows_by_unparsable"]["exclude"]["fake"]["accuracy"] == 0.5
        assert res["rows_by_unparsable"]["wrong"]["fake"]["accuracy"] == pytest.approx(2 / 5)
        assert "unparsable=exclude (ISO-Bench App. H):" in res["table"] and "unparsable=wrong:" in res["table"]
    assert strict["rows"] == strict["rows_by_unparsable"]["wrong"] and result["rows"] == result["rows_by_unparsable"]["exclude"]
    other_limit = ReplyByImage(replies)
    evaluate_iso(instances, other_limit, OutputCache(tmp_path / "raw.jsonl"), "answer_only", "fake",
                 image_root=tmp_path, max_new_tokens=64)
    assert other_limit.limits == [64]                                 # another limit, another prompt hash


def test_evaluate_coherence_table1_layout(tmp_path):
    inst = [{"instance_id": f"d{k}", "title": "Tea", "text": "A <image_1> B <image_2>", "num_images": 2,
             "candidates": [f"images/d{k}_a.png", f"images/d{k}_b.png", f"images/d{k}_c.png"], "gold": [1, 0],
             "distractors": [2], "source": src} for k, src in enumerate(["WikiHow", "WikiHow", "Science"])]
    replies = {"d0_a.png": "...\nFinal Answer: [1, 0]", "d1_a.png": "[0, 2]", "d2_a.png": "[1, 0]\nDone."}
    result = evaluate_coherence(inst, ReplyByImage(replies), OutputCache(tmp_path / "raw.jsonl"), "fake")
    assert result["predictions"] == {"d0": [1, 0], "d1": [0, 2], "d2": None}
    row = result["rows"]["fake"]
    # d0 exact; d1 [0, 2] vs [1, 0]: discordant -> PM 0, distractor used; d2 unparsable
    assert row["exact_match"] == pytest.approx(1 / 3) and row["partial_score"] == pytest.approx(1 / 3)
    assert row["reject_accuracy"] == pytest.approx(1 / 3) and row["unparsable_rate"] == pytest.approx(1 / 3)
    assert row["invalid_rate"] == pytest.approx(1 / 3)
    assert row["by_source"]["WikiHow"]["exact_match"] == 0.5 and row["by_source"]["Science"]["exact_match"] == 0.0
    assert "| fake | 50.0 | 50.0 | 0.0 | 0.0 | 33.3 | 33.3 |" in result["table"]


def _load_script():
    spec = importlib.util.spec_from_file_location("eval_teo_script", ROOT / "scripts" / "tools" / "eval_teo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class AnyAnswer:
    """Fake model for the script: a parseable answer for whatever it is asked; counts prompts."""

    def __init__(self) -> None:
        self.prompts = 0

    def __call__(self, batch):
        self.prompts += len(batch)
        out = []
        for messages in batch:
            text = prompt_text(messages)
            if "## Task: Interleaved-Image-Text Matching" in text:         # COHERENCE App. D.1
                n = int(re.search(r"with (\d+) image placeholders", text).group(1))
                out.append("Step by step...\n" + str(list(range(n))))      # placeholder i -> Image i
            elif "The final answer: Parallel" in text:
                out.append("The answer is: Before\nThe final answer: Parallel")
            elif "Answer only with YES or NO." in text:                      # ISO-Bench App. H
                out.append("YES")
            elif "<answer>YES</answer>" in text:
                out.append("<think>It must.</think><answer>YES</answer>")
            else:
                out.append(YES["independent"])
        return out


@pytest.mark.slow  # 6-8 s: the script in a subprocess (the in-process tests above cover its parts)
def test_script_end_to_end_with_fake_model(tmp_path, tiny_synthetic_dir):
    script = _load_script()
    argv = ["--model", "fake/model", "--procedures", str(tiny_synthetic_dir / "test.jsonl"), "--tasks", "teo,iso,coherence",
            "--strategies", "baseline,self_reflection", "--modalities", "image,text", "--out-dir", str(tmp_path / "out"),
            "--batch-size", "4", "--set", "iso.ks=[2]", "--set", "iso.min_steps=3"]
    cfg = script.parse_config(argv)
    model = AnyAnswer()
    results = script.run(cfg, generate=model, signature="fake")
    assert [(r["task"], r["strategy"], r["modality"]) for r in results] == [
        ("teo", "baseline", "image"), ("teo", "baseline", "text"), ("teo", "self_reflection", "image"),
        ("teo", "self_reflection", "text"), ("iso", "answer_only", "image_text"), ("iso", "explain", "image_text"),
        ("coherence", "assign", "image_text")]
    out = tmp_path / "out" / "fake__model"
    for r in results:
        stem = f"{r['task']}_{r['strategy']}_{r['modality']}"
        assert all((out / f"{stem}.{ext}").is_file() for ext in ("md", "json", "png"))
    teo = results[0]["rows"]["fake/model"]
    always_indep = results[0]["rows"]["always independent"]
    assert teo == always_indep                             # the fake always answers independent
    for r in results[4:6]:
        assert r["rows"]["fake/model"]["recall_DEP"] == 1.0 and r["rows"]["fake/model"]["invalid_rate"] == 0
        assert r["rows"]["fake/model"]["n_scored"] == r["num_instances"] > 0 and r["max_new_tokens"] == 120
    assert results[2]["reflection"]["kept_correct"] == 0
    coherence = results[6]["rows"]
    assert coherence["fake/model"] == coherence["identity"]   # it answers placeholder i -> candidate i
    first_count = model.prompts
    assert first_count > 0
    again = AnyAnswer()
    script.run(script.parse_config(argv), generate=again, signature="fake")
    assert again.prompts == 0                              # everything came from the cache


def test_script_rejects_unknown_names():
    script = _load_script()
    with pytest.raises(SystemExit, match="unknown strategies"):
        script.parse_config(["--strategies", "baseline,zero_shot", "--synthetic"])


def test_hf_generator_with_tiny_internvl(tmp_path):
    """The real Hugging Face path (chat template, left padding, greedy generate) on H3's tiny InternVL."""
    vlm_path = ROOT / "seqaware" / "vlm" / "models.py"
    if not vlm_path.is_file():
        pytest.skip("seqaware/vlm/models.py (tiny InternVL) is not available")
    from seqaware.vlm import models as vlm

    if not hasattr(vlm, "build_tiny_internvl"):
        pytest.skip("seqaware.vlm.models has no build_tiny_internvl()")
    from seqaware.vlm.runner import HFGenerator

    built = vlm.build_tiny_internvl()
    model, processor = (built.model, built.processor) if hasattr(built, "processor") else built
    generator = HFGenerator(model, processor, max_new_tokens=3)
    sets = teo_eval_sets([_procedure(tmp_path)])
    queries = teo_queries(sets, "baseline", "image_text", generator.signature, image_root=tmp_path)
    outputs = generator([q.messages for q in queries[:3]])
    assert len(outputs) == 3 and all(isinstance(o, str) for o in outputs)
    # greedy decoding with left padding: a prompt's reply does not depend on its batch mates
    assert generator([queries[1].messages]) == [outputs[1]]


def test_script_with_saved_tiny_model(tmp_path, tiny_synthetic_dir):
    """``--model <folder>``: AutoModelForImageTextToText + AutoProcessor through from_pretrained, end to end."""
    if not (ROOT / "seqaware" / "vlm" / "models.py").is_file():
        pytest.skip("seqaware/vlm/models.py (tiny InternVL) is not available")
    from seqaware.vlm import models as vlm

    if not hasattr(vlm, "build_tiny_internvl"):
        pytest.skip("seqaware.vlm.models has no build_tiny_internvl()")
    model, processor = vlm.build_tiny_internvl()
    folder = tmp_path / "tiny-vlm"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    script = _load_script()
    argv = ["--model", str(folder), "--procedures", str(tiny_synthetic_dir / "test.jsonl"), "--limit", "1",
            "--strategies", "baseline", "--modalities", "image_text", "--max-new-tokens", "3", "--batch-size", "4",
            "--out-dir", str(tmp_path / "out"), "--set", "dtype=float32", "--set", "device=cpu"]
    (result,) = script.run(script.parse_config(argv))
    row = result["rows"][str(folder)]
    assert row["num_pairs"] == result["num_pairs"] > 0
    assert 0.0 <= row["other_rate"] <= 1.0       # an untrained model mostly gives non-answers
    cached = OutputCache(tmp_path / "out" / script.slug(str(folder)) / "raw_outputs.jsonl")
    assert len(cached) == 2 * result["num_pairs"]


def test_unavailable_model_fails_fast(monkeypatch):
    import time

    from seqaware.pretrained import PretrainedUnavailableError
    from seqaware.vlm.runner import load_hf_generator

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(PretrainedUnavailableError, match="no-such-org/no-such-vlm"):
        load_hf_generator("no-such-org/no-such-vlm", device="cpu")
    assert time.perf_counter() - start < 30


def test_script_synthetic_source(tmp_path):
    script = _load_script()
    argv = ["--model", "fake", "--synthetic", "--tasks", "teo", "--strategies", "cot", "--modalities", "text",
            "--out-dir", str(tmp_path / "out"), "--set", f"synthetic_cache_dir={tmp_path / 'synth'}",
            "--set", "synthetic_config.num_test=4", "--set", "synthetic_config.image_size=64"]
    model = AnyAnswer()
    (result,) = script.run(script.parse_config(argv), generate=model, signature="fake")
    assert result["num_pairs"] > 0 and model.prompts == 2 * result["num_pairs"]
    assert result["rows"]["fake"]["other_rate"] == 1.0     # "Q1: No ..." is not a CoT answer


class Prompts(AnyAnswer):
    """AnyAnswer that keeps the prompts it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def __call__(self, batch):
        self.texts += [prompt_text(m) for m in batch]
        return super().__call__(batch)


def test_script_prompt_variant_and_pair_rule_options(tmp_path, tiny_synthetic_dir):
    """``--set prompts.teo.variant=printed`` asks Table 5's printed CoT Image-Text row (no sequencing-terms
    paragraph) and is recorded in the result; ``--set teo.pairs=reduction`` reaches the pairs."""
    script = _load_script()
    base = ["--model", "fake", "--procedures", str(tiny_synthetic_dir / "test.jsonl"), "--tasks", "teo",
            "--strategies", "cot", "--modalities", "image_text", "--out-dir", str(tmp_path / "out")]
    sequencing = "Ignore sequencing terms"
    default, printed = Prompts(), Prompts()
    (r_default,) = script.run(script.parse_config(base), generate=default, signature="fake")
    (r_printed,) = script.run(script.parse_config(base + ["--set", "prompts.teo.variant=printed",
                                                          "--set", "teo.pairs=reduction"]), generate=printed, signature="fake")
    assert r_default["prompt_variant"] == "reconstructed" and r_printed["prompt_variant"] == "printed"
    assert all(sequencing in t for t in default.texts) and not any(sequencing in t for t in printed.texts)
    assert printed.prompts == default.prompts  # a new prompt hash: nothing came from the other variant's cache
    assert r_printed["num_pairs"] == r_default["num_pairs"]  # the synthetic DAGs have no redundant edge
    with pytest.raises(ValueError, match="data.teo.pairs must be one of edges, reduction"):
        script.run(script.parse_config(base + ["--set", "teo.pairs=every"]), generate=AnyAnswer(), signature="fake")


def test_iso_and_coherence_prompts_through_tiny_internvl(tmp_path):
    """The paper prompts go through a real chat template: image first (ISO), 3 labelled candidates (COHERENCE),
    and the ISO call generates with the 120-token limit of App. H while the generator keeps its own."""
    from seqaware.vlm import models as vlm
    from seqaware.vlm.runner import HFGenerator

    proc = _procedure(tmp_path)
    model, processor = vlm.build_tiny_internvl()

    class Recording(HFGenerator):
        def __call__(self, batch):
            self.seen = getattr(self, "seen", []) + [self.max_new_tokens]
            return super().__call__(batch)

    generator = Recording(model, processor, max_new_tokens=2)
    isos = [_iso_instance(0, "before", "DEP")]
    result = evaluate_iso(isos, generator, OutputCache(tmp_path / "raw.jsonl"), "answer_only", "tiny",
                          signature=generator.signature, image_root=tmp_path, max_new_tokens=4)
    assert generator.seen == [4] and generator.max_new_tokens == 2 and result["rows"]["tiny"]["n"] == 1
    inputs = processor.apply_chat_template(build_iso_prompt("explain", isos[0], image=Image.new("RGB", (16, 16))),
                                           add_generation_prompt=True, tokenize=True, return_dict=True)
    assert len(inputs["pixel_values"]) == 1
    iso_text = processor.apply_chat_template(build_iso_prompt("explain", isos[0], image=Image.new("RGB", (16, 16))),
                                             add_generation_prompt=True, tokenize=False)
    assert re.search(r"user\n<[A-Z_]+>\nGOAL: Make bread\nPlan:\nMix\.\nBake\.\nQUESTION: ", iso_text)   # image first
    coh = {"instance_id": "c", "title": "Bread", "text": "Mix. <image_1>\nKnead. <image_2>", "num_images": 2,
           "candidates": [f"images/p_{i}.png" for i in range(3)], "gold": [1, 0], "distractors": [2]}
    result = evaluate_coherence([coh], generator, OutputCache(tmp_path / "raw.jsonl"), "tiny",
                                signature=generator.signature, image_root=tmp_path)
    assert generator.seen == [4, 2] and result["rows"]["tiny"]["n"] == 1
    text = processor.apply_chat_template(build_coherence_prompt(coh, images=[Image.new("RGB", (16, 16))] * 3),
                                         add_generation_prompt=True, tokenize=False)
    # each label directly followed by its image (App. F: "Image 0[image] Image 1[image] ..."), then the instructions
    assert re.search(r"\):\nImage 0(<[A-Z_]+>)\nImage 1\1\nImage 2\1\n## Instructions:", text)
