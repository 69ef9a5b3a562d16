"""Task builders on procedures: TEO pairs, ISO instances, COHERENCE instances."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from data_modules.tasks import (
    coherence_instances,
    iso_instances,
    stratified_split,
    swap_pair,
    teo_class_counts,
    teo_eval_sets,
    teo_pairs,
    teo_training_pairs,
)
from seqaware.procedure import Procedure, Step


def make_procedure(pid: str, n: int, dag=None, split: str = "test", no_image=(), no_text=()) -> Procedure:
    steps = [
        Step(text=None if i in no_text else f"{pid} step {i}", images=[] if i in no_image else [f"images/{pid}_{i}.jpg"])
        for i in range(n)
    ]
    return Procedure(id=pid, steps=steps, split=split, category=["cat", pid], dag=dag)


# ---------------------------------------------------------------- TEO
# 0 -> 1 -> 2 -> 4 <- 3, plus the redundant edge 0 -> 2; step 5 is isolated.
TEO_DAG = [(0, 1), (1, 2), (0, 2), (2, 4), (3, 4)]
EXPECTED_BEFORE = {(0, 1), (1, 2), (0, 2), (2, 4), (3, 4)}   # every annotated edge (MATEO sec. 5.2)
REDUCTION_BEFORE = {(0, 1), (1, 2), (2, 4), (3, 4)}          # data.teo.pairs=reduction: 0 -> 2 is implied by 0 -> 1 -> 2
EXPECTED_INDEPENDENT = {(0, 3), (0, 5), (1, 3), (1, 5), (2, 3), (2, 5), (3, 5), (4, 5)}
LONGER_PATH_ONLY = {(0, 4), (1, 4)}                          # reachable, no edge of their own: neither class


def test_teo_pairs_exact_sets():
    proc = make_procedure("p", 6, dag=TEO_DAG)
    pairs = teo_pairs(proc)
    by_label = {label: {(p["a"], p["b"]) for p in pairs if p["label"] == label} for label in ("before", "independent")}
    assert by_label["before"] == EXPECTED_BEFORE  # the redundant edge 0 -> 2 is a before pair
    assert by_label["independent"] == EXPECTED_INDEPENDENT
    assert not LONGER_PATH_ONLY & {(p["a"], p["b"]) for p in pairs}
    assert len(pairs) == len(EXPECTED_BEFORE) + len(EXPECTED_INDEPENDENT)
    reduced = teo_pairs(proc, pairs="reduction")
    assert {(p["a"], p["b"]) for p in reduced if p["label"] == "before"} == REDUCTION_BEFORE
    assert {(p["a"], p["b"]) for p in reduced if p["label"] == "independent"} == EXPECTED_INDEPENDENT
    with pytest.raises(ValueError, match="data.teo.pairs must be one of edges, reduction"):
        teo_pairs(proc, pairs="closure")
    pair = next(p for p in pairs if (p["a"], p["b"]) == (2, 4))
    assert pair == {
        "pair_id": "p:2-4", "procedure_id": "p", "split": "test", "num_steps": 6, "a": 2, "b": 4,
        "label": "before", "step_a": {"text": "p step 2", "images": ["images/p_2.jpg"]},
        "step_b": {"text": "p step 4", "images": ["images/p_4.jpg"]}, "category": ["cat", "p"],
    }
    json.dumps(pairs)  # JSON-serialisable
    assert teo_pairs(make_procedure("nodag", 4)) == []


def test_swap_and_eval_sets():
    procs = [make_procedure("p", 6, dag=TEO_DAG), make_procedure("q", 3, dag=[(0, 2)])]
    sets = teo_eval_sets(procs)
    original, swapped = sets["original"], sets["swapped"]
    assert {p["label"] for p in original} == {"before", "independent"}
    assert {p["label"] for p in swapped} == {"after", "independent"}
    assert len(original) == len(swapped) == 13 + 3
    for o, s in zip(original, swapped):
        assert s == swap_pair(o)
        assert (s["a"], s["b"]) == (o["b"], o["a"])
        assert s["step_a"] == o["step_b"] and s["step_b"] == o["step_a"]
        assert s["pair_id"] == o["pair_id"] + ":swapped"
        assert s["label"] == {"before": "after", "independent": "independent"}[o["label"]]
    assert {(p["a"], p["b"]) for p in swapped if p["label"] == "after"} == {(b, a) for a, b in EXPECTED_BEFORE} | {(2, 0)}
    assert teo_class_counts(original) == {"before": 6, "after": 0, "independent": 10}
    assert teo_class_counts(swapped) == {"before": 0, "after": 6, "independent": 10}
    reduced = teo_eval_sets(procs, pairs="reduction")
    assert teo_class_counts(reduced["swapped"]) == {"before": 0, "after": 5, "independent": 10}


def test_training_pairs_balanced_and_seeded():
    procs = [make_procedure("p", 6, dag=TEO_DAG), make_procedure("q", 3, dag=[(0, 2)])]
    train = teo_training_pairs(procs, seed=3)
    assert teo_class_counts(train) == {"before": 6, "after": 6, "independent": 10}
    assert teo_class_counts(teo_training_pairs(procs, seed=3, pairs="reduction")) == {"before": 5, "after": 5, "independent": 10}
    ids = Counter(p["pair_id"] for p in train)
    assert max(ids.values()) == 1
    independent_ids = {p["pair_id"] for p in teo_eval_sets(procs)["original"] if p["label"] == "independent"}
    assert {p["pair_id"] for p in train if p["label"] == "independent"} == independent_ids
    assert train == teo_training_pairs(procs, seed=3)
    assert sorted(ids) == sorted(p["pair_id"] for p in teo_training_pairs(procs, seed=4))


def test_stratified_split_exact_sizes():
    procs = ([make_procedure(f"a{i}", 3) for i in range(10)] + [make_procedure(f"b{i}", 4) for i in range(20)]
             + [make_procedure("c0", 5)] + [make_procedure(f"d{i}", 6) for i in range(2)])
    split = stratified_split(procs, seed=1)
    assert {k: len(v) for k, v in split.items()} == {"train": 23, "val": 3, "test": 7}  # 23.1 / 3.3 / 6.6
    per_size = {name: Counter(p.num_steps for p in members) for name, members in split.items()}
    assert [per_size[s][3] for s in ("train", "val", "test")] == [7, 1, 2]
    assert [per_size[s][4] for s in ("train", "val", "test")] == [14, 2, 4]
    assert all(p.split == name for name, members in split.items() for p in members)
    ids = [p.id for members in split.values() for p in members]
    assert sorted(ids) == sorted(p.id for p in procs)
    again = stratified_split(list(reversed(procs)), seed=1)
    assert {k: [p.id for p in v] for k, v in again.items()} == {k: [p.id for p in v] for k, v in split.items()}
    other = stratified_split(procs, seed=2)
    assert {k: len(v) for k, v in other.items()} == {"train": 23, "val": 3, "test": 7}
    assert [p.id for p in other["test"]] != [p.id for p in split["test"]]


def test_stratified_split_random_groups_properties():
    rng = np.random.default_rng(0)
    sizes = rng.integers(2, 30, size=137)
    procs = [make_procedure(f"r{i}", int(n)) for i, n in enumerate(sizes)]
    fractions = (0.6, 0.15, 0.25)
    split = stratified_split(procs, fractions, seed=0)
    totals = [len(split[s]) for s in ("train", "val", "test")]
    assert sum(totals) == 137
    assert totals == [82, 21, 34]  # 82.2, 20.55, 34.25 by largest remainder
    group = Counter(p.num_steps for p in procs)
    for name, f in zip(("train", "val", "test"), fractions):
        got = Counter(p.num_steps for p in split[name])
        for size, m in group.items():
            assert np.floor(f * m) <= got[size] <= np.floor(f * m) + 1
    with pytest.raises(ValueError):
        stratified_split(procs, (0.5, 0.5, 0.5))


# ---------------------------------------------------------------- ISO
def _summary(instances):
    return {(i["task"], i["k"], i["candidate_step"], i["label"]) for i in instances}


BEFORE_Q = "Does this image show a step that must come before the first step in the plan?"   # ISO-Bench App. H
AFTER_Q = "Does this image show a step that must come after the last step in the plan?"


def test_iso_position_k2():
    proc = make_procedure("p", 6)
    proc.title = "Make bread"
    inst = iso_instances(proc, ks=(2,))
    assert _summary(inst) == {
        ("before", 2, 3, "DEP"), ("before", 2, 2, "DEP"), ("before", 2, 4, "NONDEP"), ("before", 2, 5, "NONDEP"),
        ("after", 2, 2, "DEP"), ("after", 2, 3, "DEP"), ("after", 2, 0, "NONDEP"), ("after", 2, 1, "NONDEP"),
    }
    before = next(i for i in inst if i["task"] == "before")
    assert before["snippet_steps"] == [4, 5] and before["snippet"] == ["p step 4", "p step 5"]
    assert before["question"] == BEFORE_Q
    after = next(i for i in inst if i["task"] == "after")
    assert after["snippet_steps"] == [0, 1]
    assert after["question"] == AFTER_Q
    for i in inst:
        assert i["image"] == f"images/p_{i['candidate_step']}.jpg"
        assert i["procedure_id"] == "p" and i["split"] == "test" and i["goal"] == "Make bread"
    assert len({i["instance_id"] for i in inst}) == len(inst)
    json.dumps(inst)


def test_iso_paper_pools_k3():
    """ISO-Bench App. B with total = 8, k = 3: before -> snippet = last 3 (5, 6, 7), positives at positions
    total-k-3 ... total-k-1 = 2, 3, 4; after -> snippet = first 3 (0, 1, 2), positives k ... k+2 = 3, 4, 5;
    negatives = the snippet's own steps. 3 positives and 3 negatives: all are kept."""
    inst = iso_instances(make_procedure("p", 8), ks=(3,))
    assert _summary(inst) == {("before", 3, s, "DEP") for s in (2, 3, 4)} | {("before", 3, s, "NONDEP") for s in (5, 6, 7)} \
        | {("after", 3, s, "DEP") for s in (3, 4, 5)} | {("after", 3, s, "NONDEP") for s in (0, 1, 2)}
    # 5 steps, k = 4: before has the single positive step 0 (the window is cut at the plan's start)
    five = iso_instances(make_procedure("f", 5), ks=(4,))
    assert {(i["task"], i["candidate_step"]) for i in five if i["label"] == "DEP"} == {("before", 0), ("after", 4)}
    assert Counter(i["label"] for i in five) == {"DEP": 2, "NONDEP": 2}


def test_iso_one_k_per_plan_and_min_steps():
    procs = [make_procedure(f"p{j}", 6 + j % 3) for j in range(60)]
    drawn = {}
    for proc in procs:
        inst = iso_instances(proc, seed=7)
        ks = {i["k"] for i in inst}
        assert len(ks) == 1                                   # App. B: one random k in {2, 3, 4} per plan
        drawn[proc.id] = ks.pop()
    assert set(drawn.values()) == {2, 3, 4}
    assert drawn == {p.id: {i["k"] for i in iso_instances(p, seed=7)}.pop() for p in procs}   # seeded
    assert {i["k"] for i in iso_instances(procs[0], k_per_plan="all")} == {2, 3, 4}
    # App. B: "We filter for videos with at least 5 steps"
    assert iso_instances(make_procedure("s", 4), ks=(2,)) == []
    assert {i["k"] for i in iso_instances(make_procedure("s", 4), ks=(2,), min_steps=4)} == {2}
    with pytest.raises(ValueError, match="k_per_plan"):
        iso_instances(procs[0], k_per_plan="some")
    with pytest.raises(ValueError, match="ks"):
        iso_instances(procs[0], ks=())


def test_iso_balance_images_and_ks():
    proc = make_procedure("p", 6, no_image={3})
    inst = iso_instances(proc, ks=(2,))
    # step 3 has no image: the window is not widened
    assert {(i["task"], i["candidate_step"]) for i in inst if i["label"] == "DEP"} == {
        ("before", 2), ("before", 1), ("after", 2), ("after", 4)}
    one = iso_instances(make_procedure("p", 6), ks=(2,), max_candidates=1, seed=5)
    for task in ("before", "after"):
        labels = Counter(i["label"] for i in one if i["task"] == task)
        assert labels == {"DEP": 1, "NONDEP": 1}
    neg = {i["candidate_step"] for i in one if i["task"] == "before" and i["label"] == "NONDEP"}
    assert neg <= {4, 5}
    assert one == iso_instances(make_procedure("p", 6), ks=(2,), max_candidates=1, seed=5)
    many = iso_instances(make_procedure("p", 6), ks=(2, 3, 4), k_per_plan="all")
    for task, k in {(i["task"], i["k"]) for i in many}:
        labels = Counter(i["label"] for i in many if (i["task"], i["k"]) == (task, k))
        assert labels["DEP"] == labels["NONDEP"]
    assert {i["k"] for i in many} == {2, 3, 4}
    assert iso_instances(make_procedure("s", 3), ks=(3, 4), min_steps=0) == []  # needs n > k


def test_iso_dag_labels():
    proc = make_procedure("p", 6, dag=[(0, 1), (1, 5), (2, 3)])
    inst = iso_instances(proc, ks=(2,), label_by="dag")
    before = {(i["candidate_step"], i["label"]) for i in inst if i["task"] == "before"}
    assert before == {(0, "DEP"), (1, "DEP"), (2, "NONDEP"), (3, "NONDEP")}
    after = [(i["candidate_step"], i["label"]) for i in inst if i["task"] == "after"]
    assert (5, "DEP") in after and len(after) == 2
    assert next(s for s, lab in after if lab == "NONDEP") in {2, 3, 4}
    with pytest.raises(ValueError, match="DAG"):
        iso_instances(make_procedure("q", 6), label_by="dag")
    with pytest.raises(ValueError):
        iso_instances(proc, label_by="bogus")


# ---------------------------------------------------------------- COHERENCE
def _coherence_procs():
    return [make_procedure("A", 2), make_procedure("B", 4), make_procedure("C", 7),
            make_procedure("D", 3, no_image={1}), make_procedure("E", 3, no_text={0})]


def test_coherence_gold_recovers_images():
    procs = _coherence_procs()
    inst = coherence_instances(procs, seed=0)
    assert [i["procedure_id"] for i in inst] == ["A", "B", "C"]  # D lacks an image, E a text
    by_id = {p.id: p for p in procs}
    for i in inst:
        proc = by_id[i["procedure_id"]]
        assert i["num_images"] == proc.num_steps == len(i["gold"]) == len(i["candidates"])
        assert [i["candidates"][g] for g in i["gold"]] == [s.images[0] for s in proc.steps]
        assert i["distractors"] == []
        # placeholder k follows the text of step k
        lines = i["text"].split("\n")
        assert lines == [f"{proc.id} step {k} <image_{k + 1}>" for k in range(proc.num_steps)]
    assert [i["difficulty"] for i in inst] == ["easy", "medium", "hard"]
    assert all(i["title"] == "" and "source" not in i for i in inst)
    assert inst == coherence_instances(procs, seed=0)
    json.dumps(inst)


def test_coherence_title_and_source():
    procs = _coherence_procs()[:2]
    procs[0].title, procs[1].title = "Ginger Tea", "Fold a crane"
    procs[1].meta = {"source": "WikiHow"}
    inst = coherence_instances(procs)
    assert [i["title"] for i in inst] == ["Ginger Tea", "Fold a crane"]
    assert "source" not in inst[0] and inst[1]["source"] == "WikiHow"           # from meta["source"]
    assert [i["source"] for i in coherence_instances(procs, source="Cooking")] == ["Cooking", "Cooking"]


def test_coherence_distractors_and_bins():
    procs = _coherence_procs()
    inst = coherence_instances(procs, num_distractors=3, seed=1)
    for i in inst:
        n = i["num_images"]
        assert len(i["candidates"]) == n + 3
        assert sorted(i["gold"] + i["distractors"]) == list(range(n + 3))
        own_prefix = f"images/{i['procedure_id']}_"
        for d in i["distractors"]:
            assert not i["candidates"][d].startswith(own_prefix)
        assert len(set(i["candidates"])) == len(i["candidates"])
    bins = coherence_instances(procs, difficulty_bins=((2, 2), (3, 4), (5, None)))
    assert [i["difficulty"] for i in bins] == ["easy", "medium", "hard"]
    gaps = coherence_instances(procs, difficulty_bins=((3, 3), (4, 4), (8, None)))
    assert [i["difficulty"] for i in gaps] == [None, "medium", None]
    with pytest.raises(ValueError, match="distractors"):
        coherence_instances(procs[:1], num_distractors=1)


@pytest.mark.parametrize("experiment", ["teo_lora_internvl", "teo_head_synthetic", "teo_plan_head_synthetic"])
def test_teo_data_modules_take_the_pair_rule_from_data_teo_pairs(compose_train, experiment):
    """``data.teo.pairs`` reaches every TEO data module: ``edges`` (MATEO sec. 5.2) by default, ``reduction`` on request."""
    from hydra.utils import instantiate

    assert instantiate(compose_train(f"experiment={experiment}").data).pair_rule == "edges"
    assert instantiate(compose_train(f"experiment={experiment}", "data.teo.pairs=reduction").data).pair_rule == "reduction"
    with pytest.raises(Exception, match="data.teo.pairs must be one of edges, reduction, got 'all'"):  # Hydra wraps it
        instantiate(compose_train(f"experiment={experiment}", "data.teo.pairs=all").data)
