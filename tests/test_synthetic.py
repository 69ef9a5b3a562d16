"""The synthetic procedural world: determinism, validity, cumulative images, DAGs, texts and caching."""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_modules import synthetic
from data_modules.synthetic import SyntheticConfig, ensure_synthetic, generate
from seqaware import dag as dag_utils
from seqaware.procedure import Procedure, read_procedures

TINY = SyntheticConfig(num_train=6, num_val=3, num_test=3, image_size=64, seed=0)
SAMPLE = SyntheticConfig(num_train=60, num_val=3, num_test=3, image_size=64, seed=1)


def _read_all(folder: Path) -> dict[str, list[Procedure]]:
    return {split: read_procedures(folder / f"{split}.jsonl") for split in synthetic.SPLITS}


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    generate(TINY, folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> list[Procedure]:
    folder = tmp_path_factory.mktemp("sample")
    generate(SAMPLE, folder, progress=False)
    return [p for procs in _read_all(folder).values() for p in procs]


def test_generation_is_deterministic(tiny_dir, tmp_path):
    generate(TINY, tmp_path / "again", progress=False)
    first, second = _files(tiny_dir), _files(tmp_path / "again")
    assert first.keys() == second.keys()
    assert first == second  # identical JSONL content and image bytes


def test_other_seed_differs(tiny_dir, tmp_path):
    other = SyntheticConfig(**{**TINY.__dict__, "seed": 7})
    generate(other, tmp_path, progress=False)
    assert (tmp_path / "train.jsonl").read_text() != (tiny_dir / "train.jsonl").read_text()


def test_split_sizes_do_not_change_other_procedures(tiny_dir, tmp_path):
    bigger = SyntheticConfig(**{**TINY.__dict__, "num_train": 8, "num_val": 1})
    generate(bigger, tmp_path, progress=False)
    old = (tiny_dir / "test.jsonl").read_text()
    assert (tmp_path / "test.jsonl").read_text() == old
    old_train = (tiny_dir / "train.jsonl").read_text().splitlines()
    assert (tmp_path / "train.jsonl").read_text().splitlines()[: len(old_train)] == old_train


def test_files_read_back_with_split_sizes_and_unique_ids(tiny_dir):
    procs = _read_all(tiny_dir)
    assert {s: len(p) for s, p in procs.items()} == TINY.split_sizes()
    ids = [p.id for ps in procs.values() for p in ps]
    assert len(ids) == len(set(ids))
    for split, ps in procs.items():
        for proc in ps:
            assert proc.split == split
            assert re.fullmatch(rf"synth-{split}-\d{{6}}", proc.id)
            assert proc.alternatives is None
            assert proc.meta["generator"] == synthetic.GENERATOR
            assert proc.title and proc.category[0] in synthetic.CATEGORIES and len(proc.category) == 2
            for k, step in enumerate(proc.steps):
                assert step.images == [f"images/{proc.id}_{k}.png"]


def test_every_procedure_is_consistent(sample):
    cfg = SAMPLE
    for proc in sample:
        n = proc.num_steps
        assert cfg.min_steps <= n <= cfg.max_steps
        assert proc.dag, f"{proc.id}: no edge"
        assert all(a < b for a, b in proc.dag), f"{proc.id}: authored order breaks the DAG"
        # direct dependencies only: no edge is implied by the others
        assert dag_utils.transitive_reduction(n, proc.dag) == sorted(proc.dag), f"{proc.id}: redundant edges"
        # chains partition the chain steps and follow the authored order
        chain_steps = [i for chain in proc.meta["chains"] for i in chain]
        others = [proc.meta[key] for key in ("root", "join") if proc.meta[key] is not None]
        assert sorted(chain_steps + others) == list(range(n))
        assert all(chain == sorted(chain) for chain in proc.meta["chains"])

        previous = None
        for k, step in enumerate(proc.steps):
            assert step.text and step.text[-1] == "."
            assert len(step.boxes) == len(step.box_labels)
            assert 0 <= step.meta["new_object"] < len(step.boxes)
            for x0, y0, x1, y1 in step.boxes:
                assert 0 <= x0 <= x1 < cfg.image_size and 0 <= y0 <= y1 < cfg.image_size
            image = Image.open(proc.image_path(k))
            assert image.size == (cfg.image_size, cfg.image_size)
            pixels = np.asarray(image.convert("RGB"))
            if previous is not None:
                prev_step = proc.steps[k - 1]
                assert len(step.boxes) >= len(prev_step.boxes), "cumulative state lost objects"
                assert step.boxes[: len(prev_step.boxes)] == prev_step.boxes
                assert not np.array_equal(pixels, previous), f"{proc.id}: step {k} image did not change"
            previous = pixels


def test_sample_has_independent_steps_ambiguous_texts_and_all_categories(sample):
    assert {p.category[0] for p in sample} == set(synthetic.CATEGORIES)
    with_independent = 0
    for proc in sample:
        reach = dag_utils.transitive_closure(proc.num_steps, proc.dag)
        if any(not reach[a, b] and not reach[b, a] for a, b in itertools.combinations(range(proc.num_steps), 2)):
            with_independent += 1
    assert with_independent >= 0.9 * len(sample)
    flags = [s.meta["ambiguous"] for p in sample for s in p.steps]
    assert 0.2 < sum(flags) / len(flags) < 0.6  # configured 0.4
    assert any(p.meta["join"] is not None for p in sample)
    assert any(p.meta["root"] is not None for p in sample)


def test_texts_do_not_leak_the_order(sample):
    order_words = re.compile(r"\b(then|next|finally|after|afterwards|before|last|lastly|second|third)\b", re.I)
    for proc in sample:
        for k, step in enumerate(proc.steps):
            assert not order_words.search(step.text), step.text
            if k > 0:
                assert not step.text.lower().startswith("first"), step.text
            assert not re.search(r"\ba [aeiou]", step.text), step.text  # "an orange", not "a orange"


def test_ambiguous_texts_are_shorter_versions(tmp_path):
    never = SyntheticConfig(**{**TINY.__dict__, "ambiguous_text_prob": 0.0})
    always = SyntheticConfig(**{**TINY.__dict__, "ambiguous_text_prob": 1.0})
    for cfg, name in ((never, "never"), (always, "always")):
        generate(cfg, tmp_path / name, progress=False)
    full = [s for p in _read_all(tmp_path / "never")["train"] for s in p.steps]
    short = [s for p in _read_all(tmp_path / "always")["train"] for s in p.steps]
    assert not any(s.meta["ambiguous"] for s in full) and all(s.meta["ambiguous"] for s in short)
    sides = re.compile(r"\b(left|right|middle|on top of|bottom|across|between|from the)\b")
    assert sum(bool(sides.search(s.text)) for s in full) > 0.8 * len(full)
    # images and boxes do not depend on the wording
    assert [s.boxes for s in full] == [s.boxes for s in short]


def test_categories_subset(tmp_path):
    cfg = SyntheticConfig(num_train=6, num_val=0, num_test=0, image_size=64, categories=["garden"])
    generate(cfg, tmp_path, progress=False)
    procs = read_procedures(tmp_path / "train.jsonl")
    assert {p.category[0] for p in procs} == {"garden"}
    assert read_procedures(tmp_path / "val.jsonl") == []


def test_two_step_procedures_still_have_an_edge(tmp_path):
    cfg = SyntheticConfig(num_train=9, num_val=0, num_test=0, min_steps=2, max_steps=2, image_size=64)
    generate(cfg, tmp_path, progress=False)
    for proc in read_procedures(tmp_path / "train.jsonl"):
        assert proc.num_steps == 2 and proc.dag == [(0, 1)]


def test_long_procedures_fit(tmp_path):
    cfg = SyntheticConfig(num_train=6, num_val=0, num_test=0, min_steps=14, max_steps=14, image_size=64)
    generate(cfg, tmp_path, progress=False)
    assert all(p.num_steps == 14 for p in read_procedures(tmp_path / "train.jsonl"))


@pytest.mark.parametrize("bad", [
    {"min_steps": 1}, {"min_steps": 4, "max_steps": 3}, {"max_steps": 99}, {"categories": ("cooking",)},
    {"categories": ()}, {"ambiguous_text_prob": 1.5}, {"image_size": 8}, {"num_train": -1}, {"seed": -1},
])
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        SyntheticConfig(**bad)


def test_config_key_normalizes_types():
    assert synthetic.config_key(SyntheticConfig(categories=["stacking", "filling", "garden"])) == \
        synthetic.config_key(SyntheticConfig())
    assert synthetic.config_key(SyntheticConfig(ambiguous_text_prob=0)) == \
        synthetic.config_key(SyntheticConfig(ambiguous_text_prob=0.0))
    assert synthetic.config_key(SyntheticConfig(seed=1)) != synthetic.config_key(SyntheticConfig())


def test_ensure_synthetic_generates_once(tmp_path, monkeypatch):
    folder = ensure_synthetic(TINY, tmp_path, progress=False)
    assert folder.parent == tmp_path and (folder / synthetic.DONE_MARKER).is_file()
    assert json.loads((folder / "config.json").read_text())["num_train"] == TINY.num_train
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no temporary folder left behind
    stamp = (folder / "train.jsonl").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("generate must not run again")

    monkeypatch.setattr(synthetic, "generate", fail)
    assert ensure_synthetic(SyntheticConfig(**TINY.__dict__), tmp_path, progress=False) == folder
    assert (folder / "train.jsonl").stat().st_mtime_ns == stamp
    assert {s: len(p) for s, p in _read_all(folder).items()} == TINY.split_sizes()


def test_interrupted_generation_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
    real_generate = synthetic.generate

    def interrupted(cfg, out_dir, progress=True):
        (Path(out_dir) / "train.jsonl").write_text("half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic, "generate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_synthetic(TINY, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []

    # a foreign folder under the final name without the DONE marker is replaced, not trusted
    (tmp_path / synthetic.config_key(TINY)).mkdir()
    (tmp_path / synthetic.config_key(TINY) / "train.jsonl").write_text("stale")
    monkeypatch.setattr(synthetic, "generate", real_generate)
    folder = ensure_synthetic(TINY, tmp_path, progress=False)
    assert (folder / synthetic.DONE_MARKER).is_file()
    assert len(read_procedures(folder / "train.jsonl")) == TINY.num_train
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


def test_other_config_gets_its_own_folder(tmp_path):
    a = ensure_synthetic(TINY, tmp_path, progress=False)
    b = ensure_synthetic(SyntheticConfig(**{**TINY.__dict__, "num_test": 2}), tmp_path, progress=False)
    assert a != b and len(read_procedures(b / "test.jsonl")) == 2


# ------------------------------------------------------------------ the hard world (difficulty: hard)

HARD = SyntheticConfig(num_train=40, num_val=2, num_test=2, image_size=64, seed=3, difficulty="hard",
                       categories=["stacking", "filling"], min_steps=3, max_steps=6)
_PALETTE_WORD = re.compile(r"\b(" + "|".join(synthetic.PALETTE) + r")\b")


@pytest.fixture(scope="module")
def hard_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hard")
    generate(HARD, folder, progress=False)
    return folder


def _added_color(step) -> str:
    return step.box_labels[step.meta["new_object"]].split()[0]


def test_hard_world_is_deterministic_and_leaves_the_easy_world_alone(hard_dir, tmp_path):
    generate(HARD, tmp_path / "again", progress=False)
    assert _files(hard_dir) == _files(tmp_path / "again")
    assert synthetic.config_key(SyntheticConfig(difficulty="easy")) == synthetic.config_key(SyntheticConfig())
    assert synthetic.config_key(HARD) != synthetic.config_key(SyntheticConfig(**{**HARD.__dict__, "difficulty": "easy"}))
    assert read_procedures(tmp_path / "again" / "train.jsonl")[0].meta["difficulty"] == "hard"
    easy = read_procedures(generate(TINY, tmp_path / "easy", progress=False)["train"])
    assert all("difficulty" not in p.meta for p in easy)  # easy procedures are as before the option


def test_hard_images_show_one_object_and_no_earlier_step(hard_dir):
    """No single image places its step: it shows the step's own object (one palette color) and
    neutral distractors only, not the scene built by earlier steps."""
    procs = _read_all(hard_dir)["train"]
    palette = {name: np.array(synthetic.COLORS[name]) for name in synthetic.PALETTE}
    for proc in procs[:12]:
        for step in proc.steps:
            labels = step.box_labels
            assert step.meta["new_object"] == len(labels) - 1
            assert set(labels[:-1]) == {"distractor"} and 1 <= len(labels) - 1 <= 2
            pixels = np.asarray(Image.open(hard_dir / step.images[0]).convert("RGB")).reshape(-1, 3)
            shown = {name for name, rgb in palette.items() if (np.abs(pixels - rgb).sum(1) == 0).sum() >= 4}
            assert shown == {_added_color(step)}, (proc.id, step.text, shown)


def test_hard_texts_name_what_a_step_needs_never_what_it_adds(hard_dir):
    for proc in _read_all(hard_dir)["train"]:
        for step in proc.steps:
            assert _added_color(step) not in step.text
            assert not re.search(r"\b(left|right|middle)\b", step.text), step.text
            assert not step.text.lower().startswith("first")


def test_hard_dag_is_recovered_from_texts_and_images_together(hard_dir):
    """Reading each text's colors against the other steps' images rebuilds every procedure's DAG
    exactly: the dependency information is all there, split across the two modalities."""
    procs = _read_all(hard_dir)["train"]
    long_chains = 0
    for proc in procs:
        adds = {_added_color(s): k for k, s in enumerate(proc.steps)}
        assert len(adds) == proc.num_steps  # every color is added by one step only
        edges = sorted((adds[color], k) for k, s in enumerate(proc.steps) for color in _PALETTE_WORD.findall(s.text))
        assert edges == sorted(proc.dag), (proc.id, [s.text for s in proc.steps])
        long_chains += any(len(chain) >= 3 for chain in proc.meta["chains"])
        assert 1 <= len(proc.meta["chains"]) <= 2, proc.meta["chains"]
    assert long_chains >= len(procs) // 3  # orders the texts alone cannot give are common
    single = sum(dag_utils.count_linear_extensions(p.num_steps, p.dag) == 1 for p in procs)
    assert single >= len(procs) // 5  # a single valid order: no credit from the other references


def test_hard_world_rejects_the_garden():
    with pytest.raises(ValueError, match="garden"):
        SyntheticConfig(difficulty="hard")
    with pytest.raises(ValueError, match="difficulty"):
        SyntheticConfig(difficulty="medium")


# ------------------------------------------------------------------ pinned worlds (what a cache folder holds)

def _world_digest(folder: Path) -> str:
    """sha256 over the JSON files' bytes and the images' pixels, in path order (pixels, not PNG bytes, so
    that another zlib build does not count as another world)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".png":
            digest.update(path.name.encode())
            digest.update(np.asarray(Image.open(path)).tobytes())
        elif path.suffix in (".jsonl", ".json"):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("cfg, folder_name, digest, images", [
    (TINY, "85707b9667e8adbf", "e568884fb8a21645f2d96f0dda3fd67ffac487599afdaf23c2f22332adffe1a5", 52),
    (SyntheticConfig(**{**HARD.__dict__, "num_train": 6}), "dc83debf5ae7c7a1",
     "d0af49467d5585f974a4de6872e288ff89c191a39479bf75e7262acb911287af", 51),
], ids=["easy", "hard"])
def test_a_small_world_and_its_cache_folder_are_pinned(tmp_path, cfg, folder_name, digest, images):
    """Cached worlds are found by their folder name alone: a change to the code that changes what a config
    generates must bump GENERATOR / HARD_GENERATOR (so cached copies are redone) and update these values;
    moving the code (issue #54 split the module into a package) changes neither."""
    folder = ensure_synthetic(cfg, tmp_path, progress=False)
    assert folder.name == folder_name
    assert len(list((folder / "images").glob("*.png"))) == images
    assert _world_digest(folder) == digest
    assert synthetic.config_key(SyntheticConfig()) == "ffd07daa80a706ec"   # the default world's folder
