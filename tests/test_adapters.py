"""Dataset adapters: hand-made fixtures in each documented format, bad input, the cached Hydra source."""
from __future__ import annotations

import base64
import hashlib
import inspect
import io
import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_modules.adapters import ADAPTERS, AdapterOptionError, adapter_options, get_adapter, run_adapter
from data_modules.adapters.common import normalize_orders, split_from_name
from data_modules.adapters.roc import read_roc, roc_source
from data_modules.sources import adapter_source
from seqaware import dag as dag_utils
from seqaware.metrics.coherence import coherence_report
from seqaware.metrics.iso import iso_report
from seqaware.procedure import ProcedureFormatError, read_procedures, write_procedures
from adapter_helpers import jsonl, mean_color

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


# ---------------------------------------------------------------- helpers
def png(path: Path, color=RED, size=(8, 6)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, format="PNG")
    return path


def jpg(path: Path, color=RED) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), color).save(path, format="JPEG")
    return path


def gif3(path: Path) -> Path:
    """An animated GIF whose frames are red, green, blue: the middle frame is green."""
    frames = [Image.new("RGB", (8, 8), c).convert("P") for c in (RED, GREEN, BLUE)]
    frames[0].save(path, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    return path


def png_bytes(color=BLUE) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(buf, format="PNG")
    return buf.getvalue()


def errors_of(excinfo) -> str:
    return str(excinfo.value)


# ---------------------------------------------------------------- registry and helpers
def test_registry_names_and_unknown_adapter():
    assert {"wikihow", "recipeqa", "mateo", "rfg", "catbench", "roc", "iso", "coherence"} <= set(ADAPTERS)
    with pytest.raises(KeyError) as err:
        get_adapter("howto100m")
    assert str(err.value) == f"unknown dataset adapter 'howto100m'; registered: {', '.join(sorted(ADAPTERS))}"
    assert ADAPTERS.where("roc") == "data_modules.adapters.roc:convert"


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_every_registered_adapter_keeps_the_adapter_contract(tmp_path, name):
    """Every adapter, the built-ins and any added: options with defaults after (src, out_images), an unknown
    option refused naming the valid ones, a missing source refused naming the adapter and the path."""
    options = adapter_options(name)
    assert all(default is not inspect.Parameter.empty for default in options.values()), options  # every option has a default
    with pytest.raises(AdapterOptionError) as err:
        run_adapter(name, tmp_path, None, no_such_option=1)
    assert str(err.value) == f"{name}: unknown option(s) ['no_such_option']; valid options: {sorted(options)}"
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as err:
        run_adapter(name, missing, None)
    assert str(err.value) == f"{name}: no such file or folder: {missing}"


def test_unknown_option_lists_valid_ones(tmp_path):
    jsonl(tmp_path / "q.jsonl", [])
    with pytest.raises(AdapterOptionError, match=r"unknown option\(s\) \['langauge'\]; valid options: \['split'\]"):
        run_adapter("catbench", tmp_path / "q.jsonl", None, langauge="en")


def test_split_from_name_and_orders():
    assert split_from_name("wikihow-acl22-train") == "train"
    assert split_from_name("wikihow-acl22-dev") == "val"
    assert split_from_name("validation-00000-of-00001") == "val"
    assert split_from_name("wikihow-acl22-test") == "test"
    assert split_from_name("wikihow-acl22-human-test") == "test-human"
    assert split_from_name("stories") is None
    # 1-based orders, the authored order itself is not an alternative, duplicates merged
    assert normalize_orders([[1, 2, 3], [2, 1, 3], [2, 1, 3]], 3) == [[1, 0, 2]]
    with pytest.raises(ValueError, match="not a permutation of the 3 steps"):
        normalize_orders([[0, 1, 2], [0, 0, 2]], 3)


def test_iter_json_records_reads_lines_lists_and_wrapped_documents(tmp_path):
    from data_modules.adapters.common import ProblemLog, iter_json_records

    records = [{"id": 1}, {"id": 2}]
    (tmp_path / "pretty.json").write_text(json.dumps({"data": records}, indent=2))
    (tmp_path / "list.json").write_text(json.dumps(records, indent=1))
    (tmp_path / "lines.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    (tmp_path / "broken.json").write_text('{"data": [\n  {"id": 1},\n  {"id": \n')
    log = ProblemLog()
    assert list(iter_json_records(tmp_path / "pretty.json", log)) == [(1, records[0]), (2, records[1])]
    assert list(iter_json_records(tmp_path / "list.json", log)) == [(1, records[0]), (2, records[1])]
    assert list(iter_json_records(tmp_path / "lines.jsonl", log)) == [(1, records[0]), (2, records[1])]
    assert not log.problems
    assert list(iter_json_records(tmp_path / "broken.json", log)) == []
    assert str(log.problems[0]).startswith(f"{tmp_path / 'broken.json'}:4: ?: json: not valid JSON")


def test_iter_json_records_reports_non_utf8_instead_of_replacing(tmp_path):
    from data_modules.adapters.common import ProblemLog, iter_json_records

    # a JSON document (RecipeQA style): the problem names the line of the bad byte
    doc = json.dumps({"data": [{"id": "r1", "body": "ok"}, {"id": "r2", "body": "BAD"}]}, indent=1).encode()
    (tmp_path / "doc.json").write_bytes(doc.replace(b"BAD", b"cr\xe8me"))
    bad_line = doc[: doc.index(b"BAD")].count(b"\n") + 1
    log = ProblemLog()
    assert list(iter_json_records(tmp_path / "doc.json", log)) == []
    assert [str(p) for p in log.problems] == [
        f"{tmp_path / 'doc.json'}:{bad_line}: ?: text: not valid UTF-8 (byte 0xe8); save the file as UTF-8"]
    # JSON lines: the bad line is reported against its field and skipped, the good ones are read
    lines = [json.dumps({"id": "a", "title": "fine"}).encode(), json.dumps({"id": "b", "title": "BAD"}).encode()]
    (tmp_path / "lines.jsonl").write_bytes(lines[0] + b"\n" + lines[1].replace(b"BAD", b"\xff") + b"\n")
    log = ProblemLog()
    assert list(iter_json_records(tmp_path / "lines.jsonl", log)) == [(1, {"id": "a", "title": "fine"})]
    offset = lines[1].index(b"BAD") + 1
    assert [str(p) for p in log.problems] == [
        f"{tmp_path / 'lines.jsonl'}:2: b: title: not valid UTF-8 (byte 0xff at byte {offset} of the line); save the file as UTF-8"]


# ---------------------------------------------------------------- WikiHow
def wikihow_step(headline, text, bullets=(), image=None, key="image-large"):
    return {"step_headline": headline, "step_text": {"text": text, "bullet_points": list(bullets)},
            "step_assets": {} if image is None else {key: image}}


def wikihow_article(url, steps_per_section, category=("Food", "Cooking", "Baking", "Cakes"), images=None, **extra):
    sections = []
    for s, count in enumerate(steps_per_section):
        sections.append({"steps": [wikihow_step(f"H{s}{i}.", f"T{s}{i}.", [f"B{s}{i}."],
                                                 None if images is None else images[s][i]) for i in range(count)]})
    return {"url": url, "title": f"How to {url}", "summary": "", "category path": list(category),
            "sections": sections, **extra}


@pytest.fixture
def wikihow_dir(tmp_path):
    src = tmp_path / "wikihow"
    png(src / "images" / "a0.png", RED)
    jpg(src / "images" / "a1.jpg", GREEN)
    gif3(src / "images" / "a2.gif")
    jsonl(src / "wikihow-acl22-train.json", [
        wikihow_article("u1", [3, 1], images=[["images/a0.png", "images/a1.jpg", "images/a2.gif"], [None]]),
    ])
    jsonl(src / "wikihow-acl22-dev.json", [wikihow_article("u2", [2])])
    jsonl(src / "wikihow-acl22-test-human.json", [wikihow_article("u3", [3], multiref_gt=[[1, 2, 3], [2, 1, 3]])])
    return src


def test_wikihow_converts_sections_images_splits_and_alternatives(wikihow_dir, tmp_path):
    out = tmp_path / "out"
    result = run_adapter("wikihow", wikihow_dir, out / "images")
    assert sorted(result.splits) == ["test-human", "train", "val"]
    assert result.records_read == Counter({"train": 1, "val": 1, "test-human": 1})
    assert result.dropped == Counter({"too few steps": 1})   # the 1-step section of u1
    (proc,) = result.splits["train"]
    assert proc.id == "u1#0" and proc.title == "How to u1"
    assert proc.category == ["Food", "Cooking", "Baking", "Cakes"]
    assert [s.text for s in proc.steps] == ["H00. T00. B00.", "H01. T01. B01.", "H02. T02. B02."]
    suffixes = [Path(s.images[0]).suffix for s in proc.steps]
    assert suffixes == [".png", ".jpg", ".jpg"]          # PNG/JPEG copied, GIF converted to JPEG
    assert all(s.images[0].startswith("images/") for s in proc.steps)
    colors = [mean_color(out / s.images[0]) for s in proc.steps]
    assert colors[0] == RED
    assert np.abs(np.subtract(colors[2], GREEN)).max() < 12   # the middle frame of the animation
    # byte-for-byte copy of the PNG
    assert (out / proc.steps[0].images[0]).read_bytes() == (wikihow_dir / "images" / "a0.png").read_bytes()
    (golden,) = result.splits["test-human"]
    assert golden.alternatives == [[1, 0, 2]]
    assert golden.steps[0].images == []                   # no image asset: text-only step
    # written procedures validate (image files exist relative to the output folder)
    write_procedures(out / "train.jsonl", result.splits["train"])
    assert [p.id for p in read_procedures(out / "train.jsonl")] == ["u1#0"]


def test_wikihow_image_src_field_and_absolute_paths(tmp_path):
    image = png(tmp_path / "abs" / "x.png", BLUE)
    art = wikihow_article("u9", [2])
    for step in art["sections"][0]["steps"]:
        step["step_assets"] = {"image-src-1": str(image)}
    jsonl(tmp_path / "src" / "wikihow-acl22-train.json", [art])
    result = run_adapter("wikihow", tmp_path / "src", None)   # no out_images: absolute source paths kept
    assert [s.images for s in result.splits["train"][0].steps] == [[str(image.resolve())]] * 2


def test_wikihow_missing_image_error_names_file_record_field(wikihow_dir, tmp_path):
    bad = wikihow_article("u4", [2], images=[["images/a0.png", "images/nope.jpg"]])
    path = jsonl(wikihow_dir / "wikihow-acl22-train.json", [bad])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("wikihow", wikihow_dir, tmp_path / "out" / "images")
    assert f"{path}:1: u4#0: sections[0].steps[1].step_assets: cannot read image" in errors_of(excinfo)
    assert "nope.jpg" in errors_of(excinfo)


def test_wikihow_unreadable_image_skip_drops_procedure_without_orphans(wikihow_dir, tmp_path):
    (wikihow_dir / "images" / "broken.jpg").write_bytes(b"not an image")
    bad = wikihow_article("u5", [2], images=[["images/a0.png", "images/broken.jpg"]])
    jsonl(wikihow_dir / "wikihow-acl22-train.json", [bad])
    out = tmp_path / "out"
    result = run_adapter("wikihow", wikihow_dir, out / "images", unreadable_image="skip")
    assert result.dropped["unreadable image"] == 1
    assert "train" not in result.splits
    assert not any("u5" in p.name for p in (out / "images").iterdir())


def test_wikihow_bad_lines_are_all_reported(tmp_path):
    path = jsonl(tmp_path / "wikihow-acl22-train.json", [
        {"url": "u6", "title": "t"},                         # no sections
        "{not json",
        wikihow_article("u7", [3], multiref_gt=[[0, 1, 1]]),
    ])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("wikihow", path, None)
    message = errors_of(excinfo)
    assert f"{path}:1: u6: sections: missing field" in message
    assert f"{path}:2: ?: json: not valid JSON" in message
    assert f"{path}:3: u7#0: multiref_gt: order 0 [0, 1, 1] is not a permutation" in message
    assert "3 problem(s)" in message


def test_wikihow_resplit_by_category_keeps_categories_apart(tmp_path):
    articles = []
    for i in range(40):
        cat = ("Food", f"Group{i % 2}", f"Topic{i % 10}", f"Leaf{i}")
        articles.append(wikihow_article(f"u{i}", [2], category=cat))
    jsonl(tmp_path / "wikihow-acl22-train.json", articles[:30])
    jsonl(tmp_path / "wikihow-acl22-test.json", articles[30:])
    result = run_adapter("wikihow", tmp_path, None, resplit_by_category=True,
                         resplit_fractions=[0.6, 0.2, 0.2], seed=3)
    cats = {split: {tuple(p.category[:3]) for p in procs} for split, procs in result.splits.items()}
    assert set(cats) == {"train", "val", "test"}
    assert not cats["train"] & cats["test"] and not cats["train"] & cats["val"] and not cats["val"] & cats["test"]
    assert sum(len(v) for v in result.splits.values()) == 40
    assert all(len(result.splits[s]) >= 8 for s in ("val", "test"))   # each got at least its 20 %
    again = run_adapter("wikihow", tmp_path, None, resplit_by_category=True, resplit_fractions=[0.6, 0.2, 0.2], seed=3)
    assert {s: [p.id for p in v] for s, v in again.splits.items()} == {s: [p.id for p in v] for s, v in result.splits.items()}


# ---------------------------------------------------------------- RecipeQA
@pytest.fixture
def recipeqa_dir(tmp_path):
    src = tmp_path / "recipeqa"
    qa = src / "images" / "images-qa"
    png(qa / "train" / "images-qa" / "r1_0.png", RED)
    jpg(qa / "train" / "images-qa" / "r1_1_1.jpg", BLUE)
    jpg(qa / "train" / "images-qa" / "r1_1_0.jpg", GREEN)     # smallest k wins
    jpg(qa / "val" / "images-qa" / "r2_0.jpg", RED)            # acl22 train recipe with images in the original val folder
    data = {"data": [
        {"recipe_id": "r1", "title": "Cake", "context": [{"id": "0", "body": "Mix."}, {"id": "1", "body": "Bake."},
                                                          {"id": "2", "body": "Eat."}],
         "multiref_gt": [[0, 1, 2], [0, 2, 1]]},
        {"recipe_id": "r1", "context": [{"id": "0", "body": "Mix."}]},          # a repeated recipe
        {"recipe_id": "r2", "context": [{"id": "0", "body": "Boil."}, {"id": "1", "body": "Serve."}]},
    ]}
    (src / "new_splits").mkdir(parents=True)
    (src / "new_splits" / "train-acl22.json").write_text(json.dumps(data))
    (src / "new_splits" / "test-acl22.json").write_text(json.dumps({"data": [
        {"recipe_id": "r3", "context": [{"id": 0, "body": "A."}, {"id": 1, "body": "B."}]}]}))
    return src


def test_recipeqa_first_image_per_step_and_duplicates(recipeqa_dir, tmp_path):
    out = tmp_path / "out"
    result = run_adapter("recipeqa", recipeqa_dir, out / "images")
    assert result.records_read == Counter({"train": 3, "test": 1})
    assert result.dropped == Counter({"duplicate recipe": 1})
    r1, r2 = result.splits["train"]
    assert (r1.id, r1.title, [s.text for s in r1.steps]) == ("r1", "Cake", ["Mix.", "Bake.", "Eat."])
    assert mean_color(out / r1.steps[0].images[0]) == RED
    assert np.abs(np.subtract(mean_color(out / r1.steps[1].images[0]), GREEN)).max() < 12
    assert r1.steps[2].images == []
    assert r1.alternatives == [[0, 2, 1]]
    assert len(r2.steps[0].images) == 1 and r2.steps[1].images == []
    assert [p.id for p in result.splits["test"]] == ["r3"]


def test_recipeqa_missing_field_names_position(recipeqa_dir):
    path = recipeqa_dir / "new_splits" / "test-acl22.json"
    path.write_text(json.dumps({"data": [{"recipe_id": "r3", "context": [{"id": 0}, {"id": 1, "body": "B."}]},
                                         {"context": []}]}))
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("recipeqa", recipeqa_dir, None)
    assert f"{path}:1: r3: context[0].body: missing field" in errors_of(excinfo)
    assert f"{path}:2: ?: recipe_id: missing field" in errors_of(excinfo)


# ---------------------------------------------------------------- MATEO
def mateo_row(rid, images, graph=None, out_nodes=None, split=None):
    steps = [{"id": i + 1, "image": img, "out_nodes": (out_nodes or {}).get(i + 1, []),
              "text_eng": f"step {i + 1}", "text_it": f"passo {i + 1}"} for i, img in enumerate(images)]
    row = {"id": rid, "title_eng": f"Recipe {rid}", "title_it": f"Ricetta {rid}", "steps": steps}
    if graph is not None:
        row["graph"] = graph
    if split is not None:
        row["split"] = split
    return row


def test_mateo_paths_embedded_bytes_dag_and_language(tmp_path):
    src = tmp_path / "mateo"
    png(src / "img" / "s1.png", RED)
    embedded = {"bytes": base64.b64encode(png_bytes(BLUE)).decode(), "path": None}
    jsonl(src / "train.jsonl", [mateo_row("m1", ["img/s1.png", embedded, None], graph={"1": [3], "2": ["3"], "3": []})])
    jsonl(src / "validation.jsonl", [mateo_row("m2", [None, None], out_nodes={1: [2]})])
    out = tmp_path / "out"
    result = run_adapter("mateo", src, out / "images", language="it")
    (m1,) = result.splits["train"]
    (m2,) = result.splits["val"]
    assert m1.dag == [(0, 2), (1, 2)] and m2.dag == [(0, 1)]
    assert m1.title == "Ricetta m1" and [s.text for s in m1.steps] == ["passo 1", "passo 2", "passo 3"]
    assert mean_color(out / m1.steps[0].images[0]) == RED
    assert mean_color(out / m1.steps[1].images[0]) == BLUE           # embedded bytes written out
    assert m1.steps[2].images == []
    assert run_adapter("mateo", src, out / "images").splits["train"][0].steps[0].text == "step 1"


def test_mateo_url_images_need_a_local_copy(tmp_path):
    src = tmp_path / "mateo"
    jsonl(src / "test.jsonl", [mateo_row("m3", ["https://example.org/imgs/a.png", None])])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("mateo", src, tmp_path / "out" / "images")
    assert f"{src / 'test.jsonl'}:1: m3: steps[0].image: image URL https://example.org/imgs/a.png has no local copy" in errors_of(excinfo)
    skipped = run_adapter("mateo", src, tmp_path / "out" / "images", unreadable_image="skip")
    assert skipped.dropped == Counter({"unreadable image": 1}) and skipped.num_procedures == 0
    png(tmp_path / "mirror" / "imgs" / "a.png", GREEN)
    mirrored = run_adapter("mateo", src, tmp_path / "out" / "images", url_root=str(tmp_path / "mirror"))
    assert mean_color(tmp_path / "out" / mirrored.splits["test"][0].steps[0].images[0]) == GREEN


def test_mateo_cycle_unknown_node_and_missing_id(tmp_path):
    path = jsonl(tmp_path / "test.jsonl", [
        mateo_row("c1", [None, None], graph={"1": [2], "2": [1]}),
        mateo_row("c2", [None, None], graph={"1": [7]}),
        {"title_eng": "no id", "steps": []},
    ])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("mateo", path, None)
    message = errors_of(excinfo)
    assert f"{path}:1: c1: graph: the step graph has a cycle: 1 -> 2 -> 1 (step ids)" in message
    assert f"{path}:2: c2: graph['1']: out-node 7 is not a step id of this recipe" in message
    assert f"{path}:3: ?: id: missing field" in message


def test_mateo_parquet_needs_pyarrow(tmp_path):
    try:
        import pyarrow  # noqa: F401
        pytest.skip("pyarrow is installed: the missing-dependency message cannot be triggered")
    except ImportError:
        pass
    (tmp_path / "train-00000.parquet").write_bytes(b"PAR1")
    with pytest.raises(ImportError, match="needs pyarrow"):
        run_adapter("mateo", tmp_path, None)


# ---------------------------------------------------------------- r-FG
def write_rfg(folder: Path, name: str, tokens: list[tuple[int, int, int, str]], edges: list[tuple], comment: bool = False):
    folder.mkdir(parents=True, exist_ok=True)
    head = b"# \x82\xa0 annotator note in Shift-JIS\n" if comment else b""
    lines = "".join(f"{st} {se} {off} {tok} NN1 O\n" for st, se, off, tok in tokens)
    (folder / f"{name}.list").write_bytes(head + lines.encode())
    flow = "".join(" ".join(str(v) for v in e) + "\n" for e in edges)
    (folder / f"{name}.flow").write_bytes(head + flow.encode())


RFG_TOKENS = [(1, 1, 1, "Heat"), (1, 1, 6, "oven"), (1, 1, 10, "."),
              (1, 2, 1, "Mix"), (1, 2, 5, "flour"), (1, 2, 11, "."),
              (2, 1, 1, "Add"), (2, 1, 5, "eggs"),
              (3, 1, 1, "Bake"), (3, 1, 6, ".")]
RFG_EDGES = [(1, 1, 6, "t", 1, 1, 1),          # inside sentence 0: ignored
             (1, 2, 5, "o", 2, 1, 1),          # sentence 1 -> 2
             (1, 2, 1, "t", 2, 1, 5),          # duplicate 1 -> 2
             (1, 1, 1, "t-comp", 3, 1, 1),     # 0 -> 3
             (2, 1, 1, "f-eq", 1, 2, 5)]       # 2 -> 1: backward, dropped


def test_rfg_sentence_and_step_units(tmp_path):
    write_rfg(tmp_path / "rfg", "Cake_recipe__All_recipes_UK", RFG_TOKENS, RFG_EDGES, comment=True)
    result = run_adapter("rfg", tmp_path / "rfg")
    (proc,) = result.splits["test"]
    assert proc.id == "Cake_recipe__All_recipes_UK" and proc.title == "Cake" and proc.category == ["recipe"]
    assert [s.text for s in proc.steps] == ["Heat oven .", "Mix flour .", "Add eggs", "Bake ."]
    assert proc.dag == [(0, 3), (1, 2)]
    assert result.dropped == Counter({"backward edge": 1})
    assert proc.meta["backward_edges"] == [[2, 1]]
    by_step = run_adapter("rfg", tmp_path / "rfg", unit="step").splits["test"][0]
    assert [s.text for s in by_step.steps] == ["Heat oven . Mix flour .", "Add eggs", "Bake ."]
    # steps: 0 = sentences (1,1)+(1,2), 1 = (2,1), 2 = (3,1); the backward edge becomes 1 -> 0 and is dropped
    assert by_step.dag == [(0, 1), (0, 2)]
    assert dag_utils.is_acyclic(3, by_step.dag)


def test_rfg_random_split_and_option_errors(tmp_path):
    for i in range(10):
        write_rfg(tmp_path / "rfg", f"R{i}", RFG_TOKENS, RFG_EDGES)
    result = run_adapter("rfg", tmp_path / "rfg", split="random", fractions=[0.6, 0.2, 0.2], seed=1)
    assert {k: len(v) for k, v in result.splits.items()} == {"train": 6, "val": 2, "test": 2}
    with pytest.raises(AdapterOptionError, match="option unit='word'"):
        run_adapter("rfg", tmp_path / "rfg", unit="word")
    with pytest.raises(AdapterOptionError, match="option split='dev'"):
        run_adapter("rfg", tmp_path / "rfg", split="dev")


def test_rfg_bad_files_are_reported(tmp_path):
    write_rfg(tmp_path / "rfg", "A", RFG_TOKENS, RFG_EDGES + [(1, 1, 1, "t", 9, 1, 1), (1, 1, "x")])
    write_rfg(tmp_path / "rfg", "B", RFG_TOKENS, [])
    (tmp_path / "rfg" / "B.flow").unlink()
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("rfg", tmp_path / "rfg")
    message = errors_of(excinfo)
    flow = tmp_path / "rfg" / "A.flow"
    assert f"{flow}:6: A: flow: edge refers to sentence(s) ['9/1'] (STEP/SENT) not in A.list" in message
    assert f"{flow}:7: A: flow: expected 'SRC_STEP SRC_SENT SRC_OFF LABEL TGT_STEP TGT_SENT TGT_OFF', got 3 field(s)" in message
    assert f"B: flow: missing flow file {tmp_path / 'rfg' / 'B.flow'}" in message


# ---------------------------------------------------------------- CaT-Bench
def catbench_q(plan, q, first, second, label, steps=("S1.", "S2.", "S3."), qtype="dependent_real_before"):
    return {"plan_idx": plan, "title": f"plan {plan}", "question_idx": q, "question_type": qtype,
            "direction": "before" if qtype.endswith("before") else "after",
            "binary_question": f"Must Step {first + 1} happen before Step {second + 1}?", "steps": list(steps),
            "first_step_idx": first, "second_step_idx": second, "label": label, "efg_recipe_id": f"R{plan}"}


def test_catbench_plans_and_pairs_keep_gold_labels(tmp_path):
    path = jsonl(tmp_path / "q.jsonl", [catbench_q(0, 0, 0, 2, "yes"), catbench_q(0, 1, 1, 2, "no", qtype="nondependent_real_after"),
                                        catbench_q(1, 0, 0, 1, "no", steps=("A.", "B."))])
    result = run_adapter("catbench", path)
    assert [p.id for p in result.splits["test"]] == ["catbench-0", "catbench-1"]
    assert result.splits["test"][0].dag is None and result.splits["test"][0].meta["efg_recipe_id"] == "R0"
    pairs = result.tasks["catbench"]
    assert [(p["a"], p["b"], p["label"], p["direction"]) for p in pairs] == [(0, 2, "yes", "before"), (1, 2, "no", "after"), (0, 1, "no", "before")]
    assert pairs[0]["step_a"]["text"] == "S1." and pairs[0]["step_b"]["text"] == "S3."
    assert pairs[2]["pair_id"] == "catbench-1-dependent_real_before-0" and result.records_read["questions"] == 3


def test_catbench_questions_sharing_a_number_are_distinct_and_true_repeats_are_errors(tmp_path):
    """CaT-Bench gives one question_idx to the four questions about a step pair; the type tells them apart."""
    four = [catbench_q(0, 0, 0, 2, "yes"), catbench_q(0, 0, 0, 2, "yes", qtype="dependent_real_after"),
            catbench_q(0, 0, 0, 1, "no", qtype="nondependent_real_before"),
            catbench_q(0, 0, 0, 1, "no", qtype="nondependent_real_after")]
    pairs = run_adapter("catbench", jsonl(tmp_path / "q.jsonl", four)).tasks["catbench"]
    assert len({p["pair_id"] for p in pairs}) == 4
    path = jsonl(tmp_path / "dup.jsonl", [four[0], four[1], four[0]])
    with pytest.raises(ValueError) as excinfo:
        run_adapter("catbench", path)
    assert (f"{path}:3: plan 0 question 0: question_idx: question 0-dependent_real_before-0 (plan, type, number) "
            f"repeats {path}:1") in errors_of(excinfo)


def test_catbench_bad_questions(tmp_path):
    missing = catbench_q(0, 1, 0, 1, "yes")
    del missing["label"]
    path = jsonl(tmp_path / "q.jsonl", [catbench_q(0, 0, 0, 2, "yes"), missing, catbench_q(0, 2, 0, 5, "maybe"),
                                        catbench_q(0, 3, 0, 1, "no", steps=("X.", "Y."))])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("catbench", path)
    message = errors_of(excinfo)
    assert f"{path}:2: plan 0 question 1: label: missing field" in message
    assert f"{path}:3: plan 0 question 2: second_step_idx: 5 is not a step index of the 3 steps" in message
    assert f"{path}:3: plan 0 question 2: label: 'maybe' is not one of ['yes', 'no']" in message
    assert f"{path}:4: plan 0 question 3: steps: differ from the steps of plan 0 first seen at {path}:1" in message


# ---------------------------------------------------------------- ROC
def test_read_roc_bad_lines_skip_and_error(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("a b . <eos> c d . <eos> e f .\nonly one sentence .\n\nx . <eos>  <eos> z .\ng . <eos> h .\n")
    procs = read_roc(path, "train")
    assert [p.id for p in procs] == ["train-1", "train-5"]
    assert [s.text for s in procs[0].steps] == ["a b .", "c d .", "e f ."]
    assert procs[0].dag is None and procs[0].steps[0].images == []
    dropped = Counter()
    read_roc(path, "train", dropped=dropped)
    assert dropped == Counter({"bad line": 2})
    with pytest.raises(ProcedureFormatError) as excinfo:
        read_roc(path, "train", bad_lines="error")
    assert f"{path}:2: train-2: steps: a story needs at least 2 sentences" in errors_of(excinfo)
    assert f"{path}:4: train-4: steps: sentence 1 is empty" in errors_of(excinfo)
    assert [p.id for p in read_roc(path, "train", max_stories=1)] == ["train-1"]


def tag(i: int) -> str:
    """``i`` in letters (12 -> "bc"): ROC stories are compared with their digits written 0, so fixtures told apart
    by a number alone would be one story."""
    return str(i).translate(str.maketrans("0123456789", "abcdefghij"))


def test_roc_source_held_out_slices_are_disjoint_and_seeded(tmp_path):
    path = tmp_path / "stories.tsv"
    path.write_text("".join(f"s{tag(i)} a . <eos> s{tag(i)} b .\n" for i in range(100)))
    splits = roc_source(str(path), val_fraction=0.1, test_fraction=0.2, seed=0)
    sizes = {k: len(v) for k, v in splits.items()}
    assert sizes == {"train": 70, "val": 10, "test": 20}
    ids = [{p.id for p in v} for v in splits.values()]
    assert set.union(*ids) == {f"stories-{i}" for i in range(1, 101)} and sum(map(len, ids)) == 100
    assert all(p.split == name for name, procs in splits.items() for p in procs)
    again = roc_source(str(path), val_fraction=0.1, test_fraction=0.2, seed=0)
    assert [p.id for p in again["test"]] == [p.id for p in splits["test"]]
    assert [p.id for p in roc_source(str(path), seed=1)["test"]] != [p.id for p in splits["test"]]
    val = tmp_path / "val.tsv"
    val.write_text("v a . <eos> v b .\n")
    given = roc_source(str(path), val_path=str(val), test_fraction=0.1, max_stories=50)
    assert {k: len(v) for k, v in given.items()} == {"train": 45, "test": 5, "val": 1}
    # a test file given: the train file is split 80/20 for model selection (unless val_fraction says otherwise)
    tested = roc_source(str(path), test_path=str(val))
    assert {k: len(v) for k, v in tested.items()} == {"train": 80, "val": 20, "test": 1}
    assert {k: len(v) for k, v in roc_source(str(path), test_path=str(val), val_fraction=0.1).items()} == {"train": 90, "val": 10, "test": 1}
    assert {k: len(v) for k, v in roc_source(str(path)).items()} == {"train": 80, "val": 10, "test": 10}


def test_roc_extra_training_files_feed_only_the_training_split(tmp_path):
    """data.extra_train_paths: validation and test are the same slices with or without the extra stories, no
    extra story reaches them, and an extra story equal to a held-out one (in another surface form) is left out."""
    path = tmp_path / "dev.tsv"
    path.write_text("".join(f"s{tag(i)} a . <eos> s{tag(i)} b .\n" for i in range(100)))
    plain = roc_source(str(path), test_fraction=0.2, seed=0)
    held = plain["test"][0].steps
    extra = tmp_path / "train_extra.tsv"
    extra.write_text("".join(f"e{tag(i)} a . <eos> e{tag(i)} b .\n" for i in range(30))
                     + f"{held[0].text.upper().replace(' .', '.')} <eos>  {held[1].text}\n")   # a test story, re-cased, re-spaced
    more = roc_source(str(path), test_fraction=0.2, seed=0, extra_train_paths=[str(extra)])
    for name in ("val", "test"):
        assert [p.id for p in more[name]] == [p.id for p in plain[name]]
        assert not any(p.meta["file"] == "train_extra.tsv" for p in more[name])
    assert [p.id for p in more["train"]] == [p.id for p in plain["train"]] + [f"train_extra-{i}" for i in range(1, 31)]
    assert all(p.split == "train" for p in more["train"])


def test_extra_training_files_for_a_source_without_them_name_the_key(tmp_path):
    import functools

    from data_modules.datamodule import ProcedureDataModule
    from data_modules.sources import jsonl_source

    with pytest.raises(ValueError, match="data.extra_train_paths: the data source .* takes no extra training files"):
        ProcedureDataModule(source=functools.partial(jsonl_source), extra_train_paths=[str(tmp_path / "x.jsonl")])


@pytest.mark.shared_data
def test_roc_train_extra_reads_every_story_with_its_rare_words(shared_data, caplog):
    stories = read_roc(shared_data / "roc" / "train_extra.tsv", "train")
    assert len(stories) == 30731 and len({p.id for p in stories}) == 30731
    assert not any("_UNK" in step.text for p in stories for step in p.steps)
    with caplog.at_level(logging.WARNING, logger="data_modules.adapters.roc"):
        split = roc_source(str(shared_data / "roc" / "dev.tsv"), test_fraction=0.2,
                           extra_train_paths=[str(shared_data / "roc" / "train_extra.tsv")])
    assert {k: len(v) for k, v in split.items()} == {"train": 6871 + 30731, "val": 982, "test": 1963}
    # the normalised comparison (story_key) leaves no extra story out and finds no copy
    assert caplog.messages == []
    # the held-out slices are the same stories as ever (sha256 of the ids joined by ",", pinned before issue 53)
    digest = {k: hashlib.sha256(",".join(p.id for p in v).encode()).hexdigest()[:16] for k, v in split.items()}
    assert digest == {"train": "c920aff2835dbbba", "val": "3279c79c8744638c", "test": "cace08e0a3a6aab4"}


# ---------------------------------------------------------------- ISO-Bench / COHERENCE exports
def test_iso_export_through_field_mapping(tmp_path):
    png(tmp_path / "iso" / "i0.png", RED)
    embedded = {"bytes": list(png_bytes(GREEN))}
    path = jsonl(tmp_path / "iso" / "iso.jsonl", [
        {"uid": "q0", "plan": {"text": ["Mix.", "Bake."]}, "img": "i0.png", "ans": "yes", "goal": " Bake bread ",
         "q": "Must the step shown happen before the steps described?"},
        {"uid": "q1", "plan": {"text": "Serve."}, "img": embedded, "ans": "no", "q": "Must it happen after them?"},
    ])
    fields = {"id": "uid", "snippet": "plan.text", "image": "img", "label": "ans", "question": "q"}
    out = tmp_path / "out"
    result = run_adapter("iso", path, out / "images", fields=fields)
    a, b = result.tasks["iso"]
    assert (a["instance_id"], a["label"], a["task"], a["k"], a["snippet"]) == ("q0", "DEP", "before", 2, ["Mix.", "Bake."])
    assert (b["label"], b["task"], b["snippet"]) == ("NONDEP", "after", ["Serve."])
    assert (a["goal"], b["goal"]) == ("Bake bread", None)
    assert mean_color(out / a["image"]) == RED and mean_color(out / b["image"]) == GREEN
    report = iso_report({i["instance_id"]: i["label"] for i in result.tasks["iso"]}, {"q0": "DEP", "q1": "DEP"})
    assert report["accuracy"] == pytest.approx(0.5)


def test_iso_export_errors_name_mapped_fields(tmp_path):
    path = jsonl(tmp_path / "iso.jsonl", [{"uid": "q0", "plan": ["A."], "ans": "yes"},
                                          {"uid": "q1", "plan": ["A."], "img": "missing.png", "ans": "perhaps"},
                                          {"uid": "q2", "plan": ["A."], "img": "m.png", "ans": "yes", "rel": "during",
                                           "goal": " "}])
    fields = {"id": "uid", "snippet": "plan", "image": "img", "label": "ans", "task": "rel"}
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("iso", path, tmp_path / "out" / "images", fields=fields)
    assert f"{path}:1: q0: img: missing field" in errors_of(excinfo)
    assert f"{path}:2: q1: ans: label 'perhaps' is not mapped to DEP/NONDEP" in errors_of(excinfo)
    assert f"{path}:3: q2: rel: task 'during' is not 'before' or 'after'" in errors_of(excinfo)
    assert f"{path}:3: q2: goal: must be a non-empty string" in errors_of(excinfo)
    with pytest.raises(AdapterOptionError, match=r"unknown key\(s\) \['answer'\]"):
        run_adapter("iso", path, None, fields={"answer": "ans"})


def test_coherence_export_placeholders_gold_and_scoring(tmp_path):
    src = tmp_path / "coh"
    for name, color in (("a", RED), ("b", GREEN), ("c", BLUE)):
        png(src / f"{name}.png", color)
    path = jsonl(src / "coh.jsonl", [
        {"doc": "d0", "body": "Cut. [IMG] Fry. [IMG]", "imgs": ["a.png", "b.png", "c.png"], "answer": [2, 1]},
        {"doc": "d1", "body": "Wash. [IMG] Dry. [IMG] Fold. [IMG]", "imgs": ["a.png", "b.png", "c.png"]},
    ])
    fields = {"id": "doc", "text": "body", "candidates": "imgs", "gold": "answer"}
    out = tmp_path / "out"
    result = run_adapter("coherence", path, out / "images", fields=fields, placeholder_pattern=r"\[IMG\]", gold_base=1)
    d0, d1 = result.tasks["coherence"]
    assert d0["text"] == "Cut. <image_1> Fry. <image_2>"
    assert d0["gold"] == [1, 0] and d0["distractors"] == [2] and d0["difficulty"] == "easy"
    assert mean_color(out / d0["candidates"][d0["gold"][0]]) == GREEN
    # without gold: candidates were in placeholder order and are shuffled; gold follows them
    assert [mean_color(out / d1["candidates"][g]) for g in d1["gold"]] == [RED, GREEN, BLUE]
    assert d1["distractors"] == [] and d1["num_images"] == 3
    assert d0["title"] is None
    report = coherence_report(result.tasks["coherence"], {i["instance_id"]: i["gold"] for i in result.tasks["coherence"]})
    assert report["exact_match"] == 1.0


def test_coherence_export_paper_placeholders_title_and_source(tmp_path):
    """The default pattern reads the paper's [IMAGE_PLACEHOLDER] (App. D.1); gold is 0-based as in the paper."""
    src = tmp_path / "coh"
    for name, color in (("a", RED), ("b", GREEN)):
        png(src / f"{name}.png", color)
    path = jsonl(src / "coh.jsonl", [
        {"id": "w0", "title": "Ginger Tea", "source": "Cooking", "gold": [1, 0],
         "text": "Peel. [IMAGE_PLACEHOLDER] Boil. [IMAGE_PLACEHOLDER]", "candidates": ["a.png", "b.png"]},
        {"id": "w1", "title": "", "text": "Cut. [IMAGE_PLACEHOLDER] Fry. [IMAGE_PLACEHOLDER]", "candidates": ["a.png", "b.png"]},
    ])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("coherence", path, tmp_path / "out" / "images")
    assert errors_of(excinfo).endswith(f"1 problem(s) in procedures:\n{path}:2: w1: title: must be a non-empty string")
    path.write_text(path.read_text().splitlines()[0] + "\n")
    (w0,) = run_adapter("coherence", path, tmp_path / "out" / "images").tasks["coherence"]
    assert w0["text"] == "Peel. <image_1> Boil. <image_2>" and w0["gold"] == [1, 0]
    assert (w0["title"], w0["source"]) == ("Ginger Tea", "Cooking")
    assert mean_color(tmp_path / "out" / w0["candidates"][w0["gold"][0]]) == GREEN


def test_coherence_export_bad_gold(tmp_path):
    path = jsonl(tmp_path / "coh.jsonl", [{"id": "d0", "text": "A <image_1> B <image_2>", "candidates": ["x.png", "y.png"],
                                           "gold": [0, 0]}])
    with pytest.raises(ProcedureFormatError) as excinfo:
        run_adapter("coherence", path, None)
    assert f"{path}:1: d0: gold: [0, 0] must give 2 distinct candidate indices" in errors_of(excinfo)


# ---------------------------------------------------------------- cached Hydra source
def test_adapter_source_converts_once_and_reads_back(tmp_path):
    write_rfg(tmp_path / "rfg", "R0", RFG_TOKENS, RFG_EDGES)
    write_rfg(tmp_path / "rfg", "R1", RFG_TOKENS, RFG_EDGES)
    cache = tmp_path / "cache"
    splits = adapter_source("rfg", str(tmp_path / "rfg"), str(cache), split="test")
    assert [p.id for p in splits["test"]] == ["R0", "R1"] and splits["test"][0].dag == [(0, 3), (1, 2)]
    (folder,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert (folder / "DONE").is_file() and json.loads((folder / "conversion.json").read_text())["dropped"] == {"backward edge": 2}
    stamp = (folder / "test.jsonl").stat().st_mtime_ns
    adapter_source("rfg", str(tmp_path / "rfg"), str(cache), split="test")
    assert (folder / "test.jsonl").stat().st_mtime_ns == stamp       # cached: not converted again
    adapter_source("rfg", str(tmp_path / "rfg"), str(cache), split="val")
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 2   # other options, other folder
    with pytest.raises(FileNotFoundError, match="data.source.src"):
        adapter_source("rfg", str(tmp_path / "nowhere"), str(cache))


def test_data_configs_compose_and_instantiate(compose_train, tmp_path):
    from hydra.utils import instantiate

    write_rfg(tmp_path / "rfg", "R0", RFG_TOKENS, RFG_EDGES)
    write_rfg(tmp_path / "rfg", "R1", RFG_TOKENS, RFG_EDGES)
    cfg = compose_train("data=rfg", f"data.source.src={tmp_path / 'rfg'}", f"paths.cache_dir={tmp_path / 'cache'}",
                        "data.source.fractions=[0.5,0.5,0.0]", tiny=False)
    splits = instantiate(cfg.data.source)()
    assert {k: len(v) for k, v in splits.items()} == {"train": 1, "val": 1, "test": 0}
    assert all(p.split == name for name, procs in splits.items() for p in procs)
    for name in ("wikihow", "recipeqa", "mateo"):
        cfg = compose_train(f"data={name}", "data.source.src=/x", tiny=False)
        assert cfg.data.source.dataset == name
        options = {k: v for k, v in cfg.data.source.items() if k not in ("_target_", "_partial_", "dataset", "src", "cache_dir")}
        assert set(options) <= set(adapter_options(name)), name
