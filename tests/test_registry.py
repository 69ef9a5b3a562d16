"""The one registration pattern (registry/): a decorator in a new file is the only Python change.

The registry class itself (names, tags, duplicates naming both places, discovery of a package's modules), the
project's registries refusing a second entry under a built-in's name, and a walk-through: an objective, a
decoder, a dataset adapter, a task view and a text model by name each added as one new module of its package plus
(at most) one config file.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import tiny_pretrain
from data_modules.adapters import ADAPTERS
from data_modules.views import VIEWS
from decoders import DECODERS, PAIRWISE_DECODERS, decode_pairwise, fitting_decoder
from registry import DuplicateNameError, Registry, UnknownNameError
from seqaware.encoders import ENCODERS
from seqaware.encoders.visual import VISUAL_BACKBONES
from seqaware.objectives import OBJECTIVES, Objective, register_objective
from seqaware.text_models import TEXT_MODELS

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ the class

def test_register_lookup_tags_and_views():
    reg = Registry("widget")

    @reg.register("round", shape="circle")
    def round_widget():
        return "round"

    @reg.register
    def square():
        return "square"

    reg.add("oval", round_widget, shape="circle")
    assert list(reg) == ["round", "square", "oval"] and len(reg) == 3 and "square" in reg
    assert reg["square"] is square and reg.lookup("round") is round_widget
    assert reg.names() == ["oval", "round", "square"]
    assert reg.names(shape="circle") == ["oval", "round"] and reg.names(shape={"circle", "box"}) == ["oval", "round"]
    assert reg.tags("round") == {"shape": "circle"} and reg.tags("square") == {}
    assert reg.where("round") == f"{__name__}:test_register_lookup_tags_and_views.<locals>.round_widget"
    circles = reg.view("round widget", shape="circle")
    assert dict(circles) == {"oval": round_widget, "round": round_widget}
    with pytest.raises(UnknownNameError) as err:
        circles["square"]
    assert str(err.value) == "unknown round widget 'square'; registered: oval, round"
    del reg["oval"]
    assert list(circles) == ["round"] and reg.pop("oval", None) is None


def test_an_unknown_name_is_a_key_error_and_a_value_error_listing_the_names():
    reg = Registry("widget")
    reg.add("b", len)
    reg.add("a", str)
    for kind in (KeyError, ValueError):
        with pytest.raises(kind) as err:
            reg["c"]
        assert str(err.value) == "unknown widget 'c'; registered: a, b"
    with pytest.raises(ValueError) as err:
        reg.lookup("c", "model.widget")
    assert str(err.value) == "unknown widget 'c' (model.widget); registered: a, b"
    assert reg.get("c") is None


def test_a_duplicate_name_is_an_error_naming_both_places():
    reg = Registry("widget")

    @reg.register("w")
    def first():
        pass

    def second():
        pass

    with pytest.raises(DuplicateNameError) as err:
        reg.register("w")(second)
    here = f"{__name__}:test_a_duplicate_name_is_an_error_naming_both_places.<locals>"
    assert str(err.value) == f"widget 'w' is registered twice: by {here}.first and by {here}.second"
    assert reg["w"] is first
    reg.register("w")(first)  # the same definition again (a module imported twice, reloaded) is not a duplicate
    assert reg["w"] is first


def test_the_check_refuses_entries_before_they_are_registered():
    def needs_a_size(name, obj, tags):
        if "size" not in tags:
            raise TypeError(f"widget {name!r} has no size")

    reg = Registry("widget", check=needs_a_size)
    with pytest.raises(TypeError, match="widget 'w' has no size"):
        reg.add("w", len)
    with pytest.raises(TypeError) as err:
        reg.add("", len, size=1)
    assert str(err.value) == "a widget is registered under a non-empty name, got '' for builtins:len"
    assert list(reg) == []


@pytest.fixture
def widget_package(tmp_path, monkeypatch, request):
    """A package ``widgets_<test>`` in a temporary folder on sys.path with a registry over its own modules
    (``write(name, source)`` adds a module file); its modules are removed from sys.modules after the test."""
    name = f"widgets_{request.node.name}".replace("[", "_").replace("]", "")
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text(f"from registry import Registry\nWIDGETS = Registry('widget', package={name!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: [sys.modules.pop(m) for m in list(sys.modules) if m.split(".")[0] == name])

    def write(module: str, source: str) -> None:
        (folder / f"{module}.py").write_text(textwrap.dedent(source).format(package=name))
        importlib.invalidate_caches()

    return name, write


def test_discovery_imports_every_module_of_the_package_at_the_first_read(widget_package):
    name, write = widget_package
    write("gears", """
        from {package} import WIDGETS

        @WIDGETS.register("gear")
        def gear():
            return "gear"
    """)
    write("helpers", "VALUE = 1\n")  # a module registering nothing is imported, nothing more
    widgets = importlib.import_module(name).WIDGETS
    assert f"{name}.gears" not in sys.modules  # nothing imported before the registry is read
    assert list(widgets) == ["gear"] and widgets.where("gear") == f"{name}.gears:gear"
    write("springs", """
        from {package} import WIDGETS

        @WIDGETS.register("spring")
        def spring():
            return "spring"
    """)
    assert "spring" not in widgets  # discovery runs once, at the first read
    widgets.discover(again=True)  # a module added later: read the package again
    assert widgets.names() == ["gear", "spring"] and widgets["spring"]() == "spring"


def test_discovery_of_a_module_taking_a_registered_name_names_both_files(widget_package):
    name, write = widget_package
    for module in ("a_gears", "b_gears"):
        write(module, """
            from {package} import WIDGETS

            @WIDGETS.register("gear")
            def gear():
                return "gear"
        """)
    widgets = importlib.import_module(name).WIDGETS
    with pytest.raises(DuplicateNameError) as err:
        list(widgets)
    assert str(err.value) == f"widget 'gear' is registered twice: by {name}.a_gears:gear and by {name}.b_gears:gear"


def test_a_module_that_fails_to_import_fails_the_read_and_is_tried_again(widget_package):
    name, write = widget_package
    write("broken", "raise RuntimeError('broken widget module')\n")
    widgets = importlib.import_module(name).WIDGETS
    with pytest.raises(RuntimeError, match="broken widget module"):
        list(widgets)
    write("broken", """
        from {package} import WIDGETS

        @WIDGETS.register("fixed")
        def fixed():
            return "fixed"
    """)
    sys.modules.pop(f"{name}.broken", None)
    # the failed read left the package undiscovered: this read imports the repaired module
    assert list(widgets) == ["fixed"] and widgets["fixed"]() == "fixed"


# ------------------------------------------------------------------------------ the project's registries

def test_the_project_registries_hold_their_built_ins():
    assert {"mlm", "isp", "pisp", "smrm"} <= set(OBJECTIVES)
    assert {"beam", "greedy"} <= set(DECODERS.names(needs="pointer"))
    assert {"pairwise_greedy", "borda", "topological", "exact"} <= set(PAIRWISE_DECODERS)
    assert {"wikihow", "recipeqa", "mateo", "rfg", "catbench", "roc", "iso", "coherence"} <= set(ADAPTERS)
    assert {"sequencing", "pretraining"} <= set(VIEWS)
    assert {"offline:minilm", "offline:mpnet"} <= set(TEXT_MODELS)
    assert {"text", "clipvil", "visualbert", "image"} <= set(ENCODERS)
    assert {"clip_vit_b32", "resnet50", "efficientnet_lite0"} <= set(VISUAL_BACKBONES)


def test_a_second_objective_under_a_built_in_name_names_both_classes():
    class Again(Objective):
        name = "mlm"

    with pytest.raises(DuplicateNameError) as err:
        register_objective(Again)
    assert str(err.value) == ("objective 'mlm' is registered twice: by seqaware.objectives.mlm:MaskedLanguageModeling "
                              f"and by {__name__}:{Again.__qualname__}")
    assert OBJECTIVES.where("mlm") == "seqaware.objectives.mlm:MaskedLanguageModeling"


def test_a_second_decoder_or_adapter_under_a_built_in_name_names_both_functions():
    def greedy(pair_logits, step_mask):
        return []

    def convert(src, out_images):
        return None

    with pytest.raises(DuplicateNameError) as err:
        DECODERS.register("greedy", needs="pair_logits")(greedy)
    assert str(err.value) == (f"decoder 'greedy' is registered twice: by decoders.berson:pointer_greedy "
                              f"and by {__name__}:{greedy.__qualname__}")
    with pytest.raises(DuplicateNameError) as err:
        ADAPTERS.register("roc")(convert)
    assert str(err.value) == (f"dataset adapter 'roc' is registered twice: by data_modules.adapters.roc:convert "
                              f"and by {__name__}:{convert.__qualname__}")
    assert DECODERS.where("greedy") == "decoders.berson:pointer_greedy"


def test_decoders_and_adapters_must_declare_their_interface():
    def reverse(pair_logits, step_mask):
        return []

    with pytest.raises(TypeError) as err:
        DECODERS.register("toy_reverse")(reverse)
    assert str(err.value) == (f"decoder 'toy_reverse' ({reverse!r}) must say what it needs: needs= one of "
                              "['pair_logits', 'pointer'], got None")
    with pytest.raises(TypeError) as err:
        ADAPTERS.register("toy")(reverse)
    assert str(err.value) == (f"dataset adapter 'toy' ({__name__}:{reverse.__qualname__}) must be "
                              "convert(src, out_images, **options), got the parameters ['pair_logits', 'step_mask']")
    assert "toy_reverse" not in DECODERS and "toy" not in ADAPTERS


def _texts() -> dict[str, str]:
    """The project's own text that names choices: the README, docs/, configs/ and the scripts' docstrings."""
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "configs").rglob("*.yaml")]
    texts = {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in files}
    for path in (ROOT / "scripts").rglob("*.py"):
        texts[str(path.relative_to(ROOT))] = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return texts


def _mentions(*patterns: str) -> dict[str, set[str]]:
    """``name -> files`` of every match of ``patterns`` (group 1: the name, or names joined by ``|``) in
    :func:`_texts`; upper-case names are placeholders (NAME, DATASET) and left out."""
    found: dict[str, set[str]] = {}
    for where, text in _texts().items():
        for pattern in patterns:
            for match in re.finditer(pattern, text, flags=re.M):
                for name in match.group(1).split("|"):
                    if not name.isupper():
                        found.setdefault(name, set()).add(where)
    return found


def test_every_decoder_and_adapter_the_docs_and_configs_name_is_registered_and_fits():
    from seqaware.modules.berson import PROVIDES

    berson = _mentions(r"model\.decoding=(\w+)", r"^\s*decoding: (\w+)")
    pairwise = _mentions(r"model\.decoder=(\w+)", r"^decoder: (\w+)")
    adapters = _mentions(r"prepare_data\.py (\w+) --src")
    assert {"beam", "exact"} <= set(berson) and "pairwise_greedy" in pairwise and "rfg" in adapters
    assert {n: f for n, f in berson.items() if n not in DECODERS.names(needs=set(PROVIDES))} == {}
    assert {n: f for n, f in pairwise.items() if n not in PAIRWISE_DECODERS} == {}
    assert {n: f for n, f in adapters.items() if n not in ADAPTERS} == {}


def test_every_config_option_the_docs_and_configs_list_is_a_file_of_its_group():
    """``data=wikihow|recipeqa``, ``encoder@model.encoder=clipvil|text``: each listed option is a config file."""
    groups = sorted(p.name for p in (ROOT / "configs").iterdir() if p.is_dir())
    checked, missing = 0, {}
    for group in groups:
        for name, where in _mentions(rf"(?<![\w./$+~-]){group}(?:@[\w.]+)?=([A-Za-z_][\w|]*)").items():
            checked += 1
            if not (ROOT / "configs" / group / f"{name}.yaml").is_file():
                missing[f"{group}={name}"] = sorted(where)
    assert checked > 50 and missing == {}


# --------------------------------------------------------------------- walk-through: adding one of each

@pytest.fixture
def drop_in(tmp_path, monkeypatch, request):
    """``drop_in(package, registry, file, source)`` -> the names the new file registered.

    The file goes into a folder added to the package's ``__path__``: to the import system the same as a new
    file beside the package's own (the package's discovery reads it), while the checkout stays untouched (the
    suite runs in parallel processes that read these packages).  Undone after the test: the entries, the
    module, the path."""
    def drop(package_name: str, registry: Registry, filename: str, source: str) -> list[str]:
        package = importlib.import_module(package_name)
        before = set(registry)  # the package's own modules discovered first: the new file is the difference
        folder = tmp_path / "new_files" / package_name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / filename).write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
        module = f"{package_name}.{Path(filename).stem}"

        def undo() -> None:
            for name in set(registry) - before:
                del registry[name]
            sys.modules.pop(module, None)
            if hasattr(package, Path(filename).stem):
                delattr(package, Path(filename).stem)

        request.addfinalizer(undo)
        registry.discover(again=True)
        return sorted(set(registry) - before)

    return drop


def config_file(tmp_path: Path, group: str, name: str, text: str) -> str:
    """One config file in a folder Hydra searches beside configs/; returns the override that adds the folder."""
    path = tmp_path / "new_configs" / group / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return f"hydra.searchpath=[file://{tmp_path / 'new_configs'}]"


def test_adding_an_objective_is_one_new_module_and_one_objective_set(drop_in, compose_train, tmp_path):
    from hydra.utils import instantiate

    assert drop_in("seqaware.objectives", OBJECTIVES, "toy_length.py", '''
        """Toy: predict from [CLS] whether a sequence has more than `threshold` steps (text, no corruption)."""
        import torch
        import torch.nn.functional as F

        from seqaware.objectives.base import Objective, Outcomes, shallow_copy
        from seqaware.objectives.registry import register_objective


        @register_objective
        class ToyLength(Objective):
            name = "toy_length"
            modalities = frozenset({"text"})
            corrupts = frozenset()  # reads the input, changes nothing
            target_layout = {"toy_length_labels": ("sample", None)}

            def __init__(self, hidden_size: int, threshold: int = 3):
                super().__init__()
                self.threshold = threshold
                self.head = torch.nn.Linear(hidden_size, 2)

            def corrupt(self, batch, generator):
                steps = batch["text_step"].amax(1) + 1
                return shallow_copy(batch), {"toy_length_labels": (steps > self.threshold).long()}

            def loss_count(self, targets):
                return torch.tensor(targets["toy_length_labels"].shape[0])

            def outcomes(self, outputs, targets, **extra):
                labels = targets["toy_length_labels"]
                logits = self.head(outputs.cls)
                return Outcomes(F.cross_entropy(logits, labels, reduction="none"), logits.argmax(-1) == labels,
                                torch.arange(len(labels)))
    ''') == ["toy_length"]
    search = config_file(tmp_path, "objectives", "mlm_toy_length", """
        # @package model.objectives
        defaults:
          - base
          - _self_
        enabled: [mlm, toy_length]
        toy_length:
          threshold: 4
    """)
    cfg = compose_train("experiment=roberta_pretrain", "objectives=mlm_toy_length", search, *tiny_pretrain())
    module = instantiate(cfg.model)
    assert sorted(module.objectives) == ["mlm", "toy_length"] and module.objectives["toy_length"].threshold == 4


def test_adding_a_decoder_is_one_new_module(drop_in, compose_train):
    from hydra.utils import instantiate

    from seqaware.modules.berson import PROVIDES

    assert drop_in("decoders", DECODERS, "toy_reverse.py", '''
        """Toy: the steps in reverse input order."""
        from decoders.registry import DECODERS


        @DECODERS.register("toy_reverse", needs="pair_logits")
        def reverse_order(pair_logits, step_mask):
            return [list(range(int(row.sum())))[::-1] for row in step_mask]
    ''') == ["toy_reverse"]
    mask = torch.tensor([[True, True, True], [True, True, False]])
    assert decode_pairwise("toy_reverse", torch.zeros(2, 3, 3), mask) == [[2, 1, 0], [1, 0]]
    assert fitting_decoder("toy_reverse", PROVIDES, "model.decoding") == "pair_logits"  # BERSON takes it too
    cfg = compose_train("experiment=order_baseline", "model.decoder=toy_reverse")
    assert instantiate(cfg.model).decoder == "toy_reverse"


def test_adding_an_adapter_is_one_new_module_and_one_data_config(drop_in, compose_train, tmp_path):
    from hydra.utils import instantiate

    assert drop_in("data_modules.adapters", ADAPTERS, "toy_lines.py", '''
        """Toy release: one procedure per line, ``id<TAB>split<TAB>step | step | ...``."""
        from pathlib import Path

        from data_modules.adapters.common import AdapterResult
        from data_modules.adapters.registry import ADAPTERS
        from seqaware.procedure import Procedure, Step


        @ADAPTERS.register("toy_lines")
        def convert(src: Path, out_images: Path | None = None, min_steps: int = 2) -> AdapterResult:
            result = AdapterResult()
            for line in Path(src).read_text().splitlines():
                pid, split, text = line.split("\\t")
                steps = [Step(text=s.strip()) for s in text.split("|")]
                result.records_read[Path(src).name] += 1
                if len(steps) < min_steps:
                    result.dropped["too few steps"] += 1
                    continue
                result.add(Procedure(id=pid, steps=steps, split=split))
            return result
    ''') == ["toy_lines"]
    release = tmp_path / "toy.tsv"
    rows = [("a", "train", "Boil water. | Add pasta. | Drain."), ("b", "train", "Open. | Close."),
            ("c", "val", "Cut. | Fry."), ("d", "test", "Wash. | Dry. | Fold."), ("e", "test", "Only one step.")]
    release.write_text("".join("\t".join(row) + "\n" for row in rows))
    search = config_file(tmp_path, "data", "toy_lines", """
        defaults:
          - base
          - _self_
        source:
          _target_: data_modules.sources.adapter_source
          _partial_: true
          dataset: toy_lines
          src: ???
          cache_dir: ${paths.cache_dir}/toy_lines
    """)
    cfg = compose_train("experiment=order_baseline", "data=toy_lines", f"data.source.src={release}", "modality=text",
                        search)
    splits = instantiate(cfg.data.source)()
    assert {split: [p.id for p in procs] for split, procs in splits.items()} == {
        "train": ["a", "b"], "val": ["c"], "test": ["d"]}
    assert [s.text for s in splits["train"][0].steps] == ["Boil water.", "Add pasta.", "Drain."]
    spec = importlib.util.spec_from_file_location("prepare_data", ROOT / "scripts" / "tools" / "prepare_data.py")
    prepare_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare_data)
    out = tmp_path / "prepared"
    assert prepare_data.main(["toy_lines", "--src", str(release), "--out", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["test.jsonl", "train.jsonl", "val.jsonl"]


def test_adding_a_task_view_is_one_new_module_and_one_data_config_and_its_fields_reach_the_batch(
        drop_in, compose_train, tmp_path):
    from hydra.utils import instantiate

    assert drop_in("data_modules.views", VIEWS, "toy_next_step.py", '''
        """Toy: a procedure's first steps in authored order; the target is the position of the step that comes next."""
        from data_modules.views.base import TaskView, ViewItem
        from data_modules.views.registry import register_view


        @register_view
        class NextStepView(TaskView):
            task = "toy_next_step"
            fields = ("next_step",)  # ViewItem.meta keys the collator carries into the batch

            def __getitem__(self, key):
                idx, _ = self._key(key)
                proc = self.procedures[idx]
                n = min(proc.num_steps, self.max_steps) - 1
                return ViewItem(procedure_id=proc.id, steps=proc.steps[:n], step_index=list(range(n)),
                                gold=list(range(n)), references=[list(range(n))], dag=None, category=proc.category,
                                root=proc.root, meta={"next_step": n})
    ''') == ["toy_next_step"]
    search = config_file(tmp_path, "data", "toy_next_step", """
        defaults:
          - synthetic
          - _self_
        task: toy_next_step
        view:
          max_steps: 4
    """)
    cfg = compose_train("experiment=order_baseline", "data=toy_next_step", "modality=text", search)
    dm = instantiate(cfg.data)
    dm.setup("fit")
    view = dm.datasets["val"]
    assert type(view).__name__ == "NextStepView" and view.name == "val toy_next_step" and view.max_steps == 4
    items = [view[i] for i in range(3)]
    batch = dm.collator(items)
    expected = [min(p.num_steps, 4) - 1 for p in view.procedures[:3]]
    assert batch["next_step"].dtype == torch.long and batch["next_step"].tolist() == expected
    assert batch["step_mask"].sum(1).tolist() == expected and [m["id"] for m in batch["meta"]] == [i.procedure_id for i in items]


def test_adding_a_text_model_by_name_is_one_new_module_and_one_backbones_config(drop_in, compose_train, tmp_path):
    """``offline:toy_bert`` (a tiny BERT saved with MiniLM's tokenizer) registered in a new file of
    seqaware/text_models/, picked by a backbones config: the encoder and the data module's tokenizer load it."""
    from hydra.utils import instantiate
    from transformers import BertConfig, BertModel

    from seqaware.pretrained import load_tokenizer, resolve_name

    folder = tmp_path / "toy_bert"
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).save_pretrained(folder)
    load_tokenizer("offline:minilm").save_pretrained(folder)
    assert drop_in("seqaware.text_models", TEXT_MODELS, "toy_bert.py", f'''
        """Toy: a 1-layer BERT in a folder (a real entry builds or finds its folder, e.g. in a package)."""
        from pathlib import Path

        from seqaware.text_models import register_text_model


        @register_text_model("offline:toy_bert")
        def toy_bert() -> Path:
            return Path({str(folder)!r})
    ''') == ["offline:toy_bert"]
    assert resolve_name("offline:toy_bert") == str(folder)
    search = config_file(tmp_path, "backbones", "toy", """
        defaults:
          - offline
          - _self_
        text: offline:toy_bert
    """)
    cfg = compose_train("experiment=teo_head_synthetic", "backbones=toy", search)
    assert cfg.model.encoder.name_or_path == cfg.data.tokenizer == "offline:toy_bert"
    model = instantiate(cfg.model)
    assert model.encoder.hidden_size == 32 and sum(p.numel() for p in model.encoder.parameters()) < 2e6
    assert len(instantiate(cfg.data).collator.tokenizer) == 30522 and model.encoder.backbone.config._name_or_path == str(folder)


def test_a_text_model_is_registered_as_offline_name_with_a_function_of_no_arguments():
    def folder():
        return Path(".")

    def needs(path):
        return Path(path)

    with pytest.raises(TypeError) as err:
        TEXT_MODELS.register("roberta-large")(folder)
    assert str(err.value) == ("a text model is registered as 'offline:NAME' (never a hub id or a folder), got "
                              f"'roberta-large' for {__name__}:{folder.__qualname__}")
    with pytest.raises(TypeError) as err:
        TEXT_MODELS.register("offline:toy")(needs)
    assert str(err.value) == (f"text model 'offline:toy' ({__name__}:{needs.__qualname__}) must be a function () -> "
                              "the model's folder, got the required parameters ['path']")
    with pytest.raises(DuplicateNameError) as err:
        TEXT_MODELS.register("offline:minilm")(folder)
    assert str(err.value) == ("text model 'offline:minilm' is registered twice: by seqaware.text_models.minilm:minilm "
                              f"and by {__name__}:{folder.__qualname__}")
    assert "offline:toy" not in TEXT_MODELS and "roberta-large" not in TEXT_MODELS
