"""Nested structures: containers, None, mismatches with paths, deep trees."""
import importlib.util
import os
import subprocess
import sys
import textwrap
from collections import OrderedDict, namedtuple
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import pytest
import torch

from rlplay.engine.nested import (StructureError, check_structure, flatten,
                                  getitem, setitem, suply, tuply)

from bounds import SCRIPT  # the reason in bounds.py

Point = namedtuple("Point", "x y")
State = namedtuple("State", "stepno obs act rew fin")


class Polar(namedtuple("Polar", "r phi")):
    """A namedtuple subclass with a method and no ``__new__`` of its own."""

    def norm(self):
        return abs(self.r)


class Checked(namedtuple("Checked", "a b")):
    """A namedtuple subclass whose ``__new__`` must be called."""

    calls = 0

    def __new__(cls, a, b):
        Checked.calls += 1
        return super().__new__(cls, a, b)


class MyList(list):
    pass


def inc(x):
    return x + 1


# containers

def test_suply_dict_list_tuple():
    tree = {"a": 1, "b": [2, 3], "c": (4, {"d": 5})}
    assert suply(inc, tree) == {"a": 2, "b": [3, 4], "c": (5, {"d": 6})}
    result = suply(inc, tree)
    assert type(result["b"]) is list and type(result["c"]) is tuple


def test_suply_preserves_namedtuple_type():
    result = suply(inc, State(0, {"x": 1}, 2, 3.0, False))
    assert type(result) is State
    assert result == State(1, {"x": 2}, 3, 4.0, 1)
    result = suply(lambda a, b: a + b, Point(1, 2), Point(10, 20))
    assert type(result) is Point and result == Point(11, 22)


def test_suply_preserves_namedtuple_subclass():
    result = suply(inc, Polar(-3, 1))
    assert type(result) is Polar and result.norm() == 2
    result = suply(lambda a, b: a + b, Polar(1, 2), Polar(10, 20))
    assert type(result) is Polar and result == (11, 22)


class Typed(NamedTuple):
    x: int
    y: tuple = ()


def test_suply_preserves_typing_namedtuple():
    result = suply(lambda a, b: a * b, Typed(2, (3,)), Typed(5, (7,)))
    assert type(result) is Typed and result == Typed(10, (21,))
    assert type(getitem(Typed(np.arange(2)), 1)) is Typed


def test_suply_calls_a_custom_namedtuple_new():
    before = Checked.calls
    result = suply(inc, Checked(1, 2))
    assert type(result) is Checked and result == (2, 3)
    assert Checked.calls == before + 2  # the original and the rebuilt one
    getitem(Checked(np.arange(2), np.arange(2)), 0)
    assert Checked.calls == before + 4


def test_suply_list_subclass_type_preserved():
    result = suply(inc, MyList([1, 2]))
    assert type(result) is MyList and result == [2, 3]


def test_mapping_rebuilt_as_dict_in_first_key_order():
    first = MappingProxyType({"b": 1, "a": 2})
    second = OrderedDict([("a", 20), ("b", 10)])
    result = suply(lambda x, y: x + y, first, second)
    assert type(result) is dict
    assert list(result) == ["b", "a"] and result == {"b": 11, "a": 22}
    assert list(suply(inc, second)) == ["a", "b"]
    assert type(suply(inc, second)) is dict


class Frozen(Mapping):
    """A read-only Mapping that is not a dict."""

    def __init__(self, **items):
        self._items = items

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)


def test_any_mapping_is_a_container():
    first, second = Frozen(z=1, a=(2,)), Frozen(a=(20,), z=10)
    result = suply(lambda x, y: x + y, first, second)
    assert type(result) is dict and list(result) == ["z", "a"]
    assert result == {"z": 11, "a": (22,)}
    assert suply(lambda x, y: x + y, {"a": 1}, Frozen(a=2)) == {"a": 3}
    assert flatten(first) == [1, 2] and getitem(
        Frozen(x=np.arange(3)), 2) == {"x": 2}
    with pytest.raises(StructureError, match=r"at <root>: Frozen with keys "
                                             r"\['z', 'a'\] vs dict with "
                                             r"keys \['z'\] \(missing keys "
                                             r"\['a'\]\)"):
        check_structure(first, {"z": 1})
    buf = Frozen(x=np.zeros(2))
    setitem(buf, 1, {"x": 4.0})
    assert buf["x"].tolist() == [0, 4]


def test_dict_key_order_of_the_first_tree():
    result = suply(lambda x, y: (x, y), {"x": 1, "y": 2}, {"y": 20, "x": 10})
    assert list(result) == ["x", "y"] and result == {"x": (1, 10),
                                                     "y": (2, 20)}


def test_list_and_tuple_of_same_length_match():
    assert suply(lambda x, y: x + y, [1, 2], (10, 20)) == [11, 22]
    assert suply(lambda x, y: x + y, (1, 2), [10, 20]) == (11, 22)


def test_suply_many_trees_and_kwargs():
    def fn(a, b, c, *, scale):
        return (a + b + c) * scale

    result = suply(fn, {"x": [1, 2]}, {"x": [10, 20]}, {"x": [100, 200]},
                   scale=2)
    assert result == {"x": [222, 444]}
    assert suply(lambda a, *, k: a * k, [1, (2,)], k=3) == [3, (6,)]


def test_leaves_are_anything_but_containers():
    arr, ten = np.arange(3), torch.arange(3)
    seen = []
    suply(seen.append, {"s": "text", "b": b"raw", "a": arr, "t": ten,
                        "n": 1.5, "o": object})
    assert seen[:2] == ["text", b"raw"]
    assert seen[2] is arr and seen[3] is ten and seen[5] is object


def test_tuply_gets_the_tuple_of_leaves():
    calls = []

    def fn(leaves, *, tag):
        calls.append(leaves)
        return tag

    result = tuply(fn, {"a": [1, 2]}, {"a": [3, 4]}, tag="t")
    assert result == {"a": ["t", "t"]}
    assert calls == [(1, 3), (2, 4)]
    assert tuply(lambda leaves: leaves, [5]) == [(5,)]


def test_empty_containers():
    assert suply(inc, {}) == {} and suply(inc, []) == [] \
        and suply(inc, ()) == ()
    assert suply(inc, {"a": (), "b": []}, {"a": (), "b": []}) == \
        {"a": (), "b": []}
    assert flatten({"a": (), "b": [{}]}) == []


# None is an empty container

def test_none_is_returned_and_never_passed_to_fn():
    def fn(*leaves):
        assert all(leaf is not None for leaf in leaves)
        return sum(leaves)

    tree = {"a": None, "b": (1, None)}
    assert suply(fn, tree) == {"a": None, "b": (1, None)}
    assert suply(fn, tree, {"a": None, "b": (2, None)}) == \
        {"a": None, "b": (3, None)}
    assert suply(fn, None) is None and suply(fn, None, None) is None
    assert getitem({"a": None, "b": np.arange(2)}, 1)["a"] is None
    assert flatten([None, (None,), 1]) == [1]


def test_none_against_something_else_raises():
    with pytest.raises(TypeError, match=r"at \['a'\]: None vs leaf of type "
                                        r"int"):
        suply(lambda a, b: a, {"a": None}, {"a": 1})
    with pytest.raises(TypeError, match=r"at \['a'\]: leaf of type int vs "
                                        r"None"):
        suply(lambda a, b: a, {"a": 1}, {"a": None})
    with pytest.raises(TypeError, match=r"at \[0\]: None vs tuple of "
                                        r"length 0"):
        suply(lambda a, b: a, [None], [()])


# mismatches: the type, the path and both sides

def test_missing_key_names_path_and_both_sides():
    tree = {"obs": {"image": {"rgb": 1, "depth": 2}}}
    other = {"obs": {"image": {"rgb": 1}}}
    with pytest.raises(StructureError) as info:
        suply(lambda a, b: a, tree, other)
    message = str(info.value)
    assert message.startswith("at ['obs']['image']: ")
    assert "dict with keys ['rgb', 'depth']" in message
    assert "dict with keys ['rgb']" in message
    assert "missing keys ['depth']" in message
    assert isinstance(info.value, ValueError)


def test_extra_key():
    with pytest.raises(StructureError, match=r"at \['obs'\]: .*extra keys "
                                             r"\['z'\]"):
        suply(lambda a, b: a, {"obs": {"x": 1}}, {"obs": {"x": 1, "z": 2}})


def test_same_number_of_different_keys():
    with pytest.raises(StructureError,
                       match=r"missing keys \['x'\]; extra keys \['y'\]"):
        check_structure({"x": 1}, {"y": 1})


def test_different_length():
    with pytest.raises(StructureError,
                       match=r"at \['act'\]\[1\]: tuple of length 2 vs "
                             r"list of length 3"):
        suply(lambda a, b: a, {"act": [0, (1, 2)]},
              {"act": [0, [1, 2, 3]]})


def test_container_vs_leaf_both_ways():
    with pytest.raises(TypeError, match=r"at \['obs'\]: dict with keys "
                                        r"\['x'\] vs leaf of type ndarray"):
        suply(lambda a, b: a, {"obs": {"x": 1}}, {"obs": np.zeros(2)})
    with pytest.raises(TypeError, match=r"at \['obs'\]: leaf of type "
                                        r"ndarray vs dict with keys \['x'\]"):
        suply(lambda a, b: a, {"obs": np.zeros(2)}, {"obs": {"x": 1}})
    with pytest.raises(TypeError, match=r"at \[1\]: leaf of type int vs "
                                        r"list of length 1"):
        suply(lambda a, b: a, (0, 1), (0, [1]))
    with pytest.raises(TypeError, match=r"at <root>: tuple of length 1 vs "
                                        r"leaf of type int"):
        suply(lambda a, b: a, (0,), 0)


def test_mapping_vs_sequence():
    with pytest.raises(TypeError, match=r"at \['x'\]: dict with keys "
                                        r"\['a'\] vs tuple of length 1"):
        suply(lambda a, b: a, {"x": {"a": 1}}, {"x": (1,)})
    with pytest.raises(TypeError, match=r"Point of length 2 vs dict"):
        check_structure(Point(1, 2), {"x": 1, "y": 2})


def test_mismatch_in_third_tree_and_tuply():
    with pytest.raises(StructureError, match=r"at \['a'\]: list of length 2 "
                                             r"vs list of length 1"):
        suply(lambda *x: 0, {"a": [1, 2]}, {"a": [1, 2]}, {"a": [1]})
    with pytest.raises(StructureError, match=r"at \[0\]\['k'\]"):
        tuply(len, [{"k": (1,)}], [{"k": (1, 2)}])


def test_mismatch_is_never_trimmed():
    # zip() would silently stop at the shorter one
    with pytest.raises(StructureError):
        suply(lambda a, b: a, [1, 2, 3], [1, 2])
    with pytest.raises(StructureError):
        suply(lambda a, b: a, [1, 2], [1, 2, 3])


def test_errors_raised_by_fn_pass_through():
    def fn(a, b):
        raise KeyError("from fn")

    with pytest.raises(KeyError, match="from fn"):
        suply(fn, {"a": 1}, {"a": 2})


def test_check_structure():
    check_structure({"a": (1, [2])}, {"a": [3, (4,)]}, {"a": (5, [6])})
    with pytest.raises(StructureError):
        check_structure({"a": 1}, {"b": 1})


# getitem, setitem, flatten

def test_getitem_indexes_every_leaf():
    tree = State(np.arange(4), {"x": np.arange(8).reshape(4, 2)},
                 torch.arange(4), None, np.arange(4) * 10)
    row = getitem(tree, 2)
    assert type(row) is State and row.rew is None
    assert row.stepno == 2 and row.obs["x"].tolist() == [4, 5]
    assert int(row.act) == 2 and row.fin == 20
    part = getitem(tree, slice(1, 3))
    assert part.obs["x"].shape == (2, 2)
    assert np.shares_memory(part.obs["x"], tree.obs["x"])  # a view
    assert getitem(np.arange(3), -1) == 2


def test_setitem_in_place():
    buf = State(np.zeros(3, np.int64), {"x": np.zeros((3, 2))},
                torch.zeros(3), None, np.zeros(3, bool))
    obs_x = buf.obs["x"]
    # a list facing an array leaf would be a container vs a leaf
    setitem(buf, 1, State(7, {"x": np.array([1.0, 2.0])}, 3.0, None, True))
    assert buf.obs["x"] is obs_x
    assert buf.stepno.tolist() == [0, 7, 0]
    assert buf.obs["x"].tolist() == [[0, 0], [1, 2], [0, 0]]
    assert buf.act.tolist() == [0, 3, 0] and buf.fin.tolist() == [0, 1, 0]
    arr = np.zeros(3)
    setitem(arr, slice(0, 2), 5.0)
    assert arr.tolist() == [5, 5, 0]


def test_setitem_mismatch():
    buf = {"a": np.zeros(3), "b": (np.zeros(3),)}
    with pytest.raises(StructureError, match=r"at <root>: .*extra keys "
                                             r"\['c'\]"):
        setitem(buf, 0, {"a": 1, "b": (1,), "c": 2})
    with pytest.raises(StructureError, match=r"at <root>: .*missing keys "
                                             r"\['b'\]"):
        setitem(buf, 0, {"a": 1})
    with pytest.raises(StructureError, match=r"at \['b'\]: tuple of length "
                                             r"1 vs tuple of length 2"):
        setitem(buf, 0, {"a": 1, "b": (1, 2)})
    with pytest.raises(TypeError, match=r"at \['b'\]\[0\]: leaf of type "
                                        r"ndarray vs dict"):
        setitem(buf, 0, {"a": 1, "b": ({"z": 1},)})
    with pytest.raises(TypeError, match=r"at <root>: leaf of type ndarray "
                                        r"vs tuple"):
        setitem(np.zeros(3), 0, (1,))
    with pytest.raises(TypeError, match=r"at \['b'\]: tuple of length 1 vs "
                                        r"leaf of type int"):
        setitem(buf, 0, {"a": 1, "b": 1})


def test_flatten_depth_first_in_key_order():
    tree = {"b": (1, [2, {"z": 3, "a": 4}]), "a": Point(5, None)}
    assert flatten(tree) == [1, 2, 3, 4, 5]
    assert flatten(7) == [7] and flatten(None) == []


# deep structures

DEPTH_OK = 200


def nest(depth, leaf=1):
    tree = leaf
    for _ in range(depth):
        tree = [tree]
    return tree


def test_moderately_deep_structures_work():
    tree = nest(DEPTH_OK)
    assert flatten(suply(lambda a, b: a + b, tree, tree)) == [2]
    assert flatten(getitem(nest(DEPTH_OK, np.arange(3)), 1)) == [1]
    buf = nest(DEPTH_OK, np.zeros(2))
    setitem(buf, 0, nest(DEPTH_OK, 5.0))
    assert flatten(buf)[0].tolist() == [5, 0]


def test_too_deep_a_structure_is_a_clean_recursion_error():
    deep = nest(10_000)
    for call in (lambda: suply(inc, deep), lambda: suply(inc, deep, deep),
                 lambda: getitem(deep, 0), lambda: flatten(deep),
                 lambda: setitem(deep, 0, deep), lambda: tuply(len, deep)):
        with pytest.raises(RecursionError):
            call()
    cyclic = []
    cyclic.append(cyclic)
    with pytest.raises(RecursionError):
        flatten(cyclic)
    assert suply(inc, [1]) == [2]  # the interpreter is fine afterwards


def test_deep_structures_do_not_crash_a_fresh_interpreter():
    # run in a child so that a crash would fail this test, not the session;
    # the module is loaded by path to keep the child's start-up short
    path = os.path.join(os.path.dirname(__file__), os.pardir, "rlplay",
                        "engine", "nested.py")
    code = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("n", {path!r})
        n = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(n)
        deep = 1
        for _ in range(100_000):
            deep = {{"k": [deep]}}
        for call in (lambda: n.suply(abs, deep, deep), lambda: n.flatten(deep),
                     lambda: n.check_structure(deep, {{"k": [2]}})):
            try:
                call()
            except RecursionError:
                pass
            except Exception as exc:
                print("mismatch:", type(exc).__name__)
        print("alive")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=SCRIPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mismatch:", "TypeError", "alive"]


def test_mismatch_found_deep_inside_names_the_whole_path():
    tree, other = nest(50, {"k": 1}), nest(50, {"j": 1})
    with pytest.raises(StructureError) as info:
        check_structure(tree, other)
    assert str(info.value).startswith("at " + "[0]" * 50 + ": ")


def test_nested_module_is_standalone():
    # it imports nothing from the package, so it loads on its own
    spec = importlib.util.spec_from_file_location(
        "nested_alone", os.path.join(os.path.dirname(__file__), os.pardir,
                                     "rlplay", "engine", "nested.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.suply(inc, (1,)) == (2,)
