"""The registry class (registry/) where mutation testing found behaviour no test pinned (docs/mutation.md):
where an entry without a module or qualified name of its own is, a definition registered again under its own name,
item assignment, the names an unknown-name error lists, and what a registry and a view show."""
from __future__ import annotations

import collections
import functools

import pytest

from registry import DuplicateNameError, Registry, UnknownNameError, place


def test_an_entry_without_a_module_or_name_of_its_own_is_placed_by_its_type():
    entry = functools.partial(int, base=2)   # an instance: a __module__ but no __qualname__ of its own
    assert place(entry) == "functools:partial"
    assert place(collections.deque()) == "collections:deque"   # neither of its own
    reg = Registry("widget")
    reg.add("binary", entry)
    assert reg.where("binary") == "functools:partial"


def _definition():
    def widget():
        return "widget"

    return widget


def test_the_same_definition_loaded_again_replaces_itself_and_another_one_is_refused():
    first, reloaded = _definition(), _definition()   # one module:qualname, two function objects (a module reloaded)
    assert first is not reloaded and place(first) == place(reloaded)
    reg = Registry("widget")
    reg.add("w", first)
    reg.add("w", reloaded, size=2)
    assert reg["w"] is reloaded and reg.tags("w") == {"size": 2}
    with pytest.raises(DuplicateNameError):
        reg.add("w", len)


def test_item_assignment_registers_without_tags():
    reg = Registry("widget")
    reg["len"] = len
    assert reg["len"] is len and reg.tags("len") == {} and list(reg) == ["len"]
    with pytest.raises(TypeError, match="non-empty name"):
        reg[""] = len


def test_an_unknown_name_error_lists_the_names_it_is_given():
    reg = Registry("widget")
    reg.add("a", len)
    reg.add("b", str)
    assert str(reg.unknown("c", "model.widget", names=["b"])) == "unknown widget 'c' (model.widget); registered: b"
    assert str(reg.unknown("c")) == "unknown widget 'c'; registered: a, b"
    assert str(UnknownNameError()) == ""


def test_a_registry_and_a_view_show_their_kind_and_names():
    reg = Registry("widget")
    reg.add("b", len, shape="circle")
    reg.add("a", str, shape="circle")
    reg.add("c", repr, shape="box")
    assert repr(reg) == "Registry('widget': a, b, c)"
    assert repr(reg.view("round widget", shape="circle")) == "RegistryView('round widget': a, b)"
