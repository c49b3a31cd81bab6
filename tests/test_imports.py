"""The import contract of rlplay (``import_contract.py``): folders import
from each other only what a folder's ``__init__`` names, no private name
crosses a folder, the layers import one way, no module-level import cycle;
the checker shown to catch planted breaches; every public name of 0.1.0
importable from its 0.1.0 path."""
import ast
import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import import_contract

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlplay"
NAMES = Path(__file__).with_name("public_names_0_1_0.json")


def test_the_tree_keeps_the_contract():
    assert import_contract.violations(PACKAGE) == []


def test_no_module_level_import_cycle():
    assert import_contract.cycles(PACKAGE) == []


def test_same_depends_on_no_supervisor():
    """``same`` runs no process: its imports reach the worker session, not
    the supervisors; ``multi`` and ``cluster`` reach theirs."""
    supervisors = {"rlplay.engine.workers._supervisor",
                   "rlplay.engine.workers._ray",
                   "rlplay.engine.rollout._supervised"}
    assert import_contract.depends(
        PACKAGE, "rlplay.engine.rollout.same") & supervisors == set()
    assert "rlplay.engine.workers._session" in import_contract.depends(
        PACKAGE, "rlplay.engine.rollout.same")
    assert import_contract.depends(
        PACKAGE, "rlplay.engine.rollout.multi") >= {
        "rlplay.engine.workers._supervisor", "rlplay.engine.rollout._supervised"}
    assert "rlplay.engine.workers._ray" in import_contract.depends(
        PACKAGE, "rlplay.engine.rollout.cluster")


def test_the_set_up_depends_on_no_supervisor():
    """The set-up of every generator (``rollout/_base.py``) imports no
    supervisor module, directly or not: ``same`` uses it and runs no
    process."""
    supervisors = {"rlplay.engine.workers._supervisor",
                   "rlplay.engine.workers._ray",
                   "rlplay.engine.rollout._supervised"}
    assert import_contract.depends(
        PACKAGE, "rlplay.engine.rollout._base") & supervisors == set()


def test_every_generator_is_composed_not_inherited():
    """Each public generator class is its own class, one shared base (the
    states, :class:`rlplay.engine.rollout._states.Lifecycle`) and
    ``object``, the generators of a pool with one more between them that
    hands every call to their pool part
    (:class:`rlplay.engine.rollout._gather.Pooled`): their parts are
    attributes, not bases."""
    from rlplay.engine.rollout import Evaluator, multi, same, single
    lifecycle = [("rlplay.engine.rollout._states", "Lifecycle"),
                 ("builtins", "object")]
    pooled = [("rlplay.engine.rollout._gather", "Pooled")] + lifecycle
    # cluster's module imports Ray only when it is used: read its classes
    # from the source, as the contract does
    cluster = ast.parse((PACKAGE / "engine" / "rollout" / "cluster.py")
                        .read_text())
    bases = {node.name: [ast.unparse(base) for base in node.bases]
             for node in cluster.body if isinstance(node, ast.ClassDef)}
    assert bases["Rollout"] == ["Pooled"]
    for cls, mro in [(same.Rollout, lifecycle), (single.Rollout, lifecycle),
                     (Evaluator, lifecycle), (multi.Rollout, pooled)]:
        assert [(c.__module__, c.__name__)
                for c in cls.__mro__[1:]] == mro, cls.__mro__


def test_every_module_has_a_layer():
    assert [name for name in import_contract.modules(PACKAGE)
            if import_contract.layer(name) is None] == []


@pytest.fixture
def tree(tmp_path):
    """A copy of rlplay/ to plant breaches in."""
    copy = tmp_path / "rlplay"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns(
        "__pycache__"))
    return copy


def _plant(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")
    return len(path.read_text().splitlines())


def test_a_private_name_across_folders_is_reported(tree):
    line = _plant(tree / "engine" / "rollout" / "single.py",
                  "from ..policy.local import _check_action")
    assert import_contract.violations(tree) == [
        f"rlplay/engine/rollout/single.py:{line}: from "
        f"rlplay.engine.policy.local import _check_action: the private "
        f"name(s) _check_action across folders"]


def test_a_private_module_across_folders_is_reported(tree):
    line = _plant(tree / "engine" / "rollout" / "same.py",
                  "from ..workers import _session")
    assert import_contract.violations(tree) == [
        f"rlplay/engine/rollout/same.py:{line}: import "
        f"rlplay.engine.workers._session: a private module across folders"]


def test_a_name_the_folder_does_not_export_is_reported(tree):
    line = _plant(tree / "engine" / "rollout" / "same.py",
                  "from ..workers._session import LearnerLink, MAX_WAIT")
    found = import_contract.violations(tree)
    assert f"rlplay/engine/rollout/same.py:{line}: from " \
        f"rlplay.engine.workers._session import LearnerLink, MAX_WAIT: " \
        f"MAX_WAIT not named by rlplay.engine.workers.__init__ (__all__ " \
        f"or __exports__)" in found
    assert any("from a private module across folders" in v for v in found)


def test_an_upward_import_is_reported(tree):
    line = _plant(tree / "engine" / "core" / "layout.py",
                  "from ..workers import Session")
    found = import_contract.violations(tree)
    assert found == [
        f"rlplay/engine/core/layout.py:{line}: from rlplay.engine.workers "
        f"import Session: the layer 'core layout' may not import from the "
        f"layer 'workers'"]
    # and, at module level, it closes a cycle
    assert any("rlplay.engine.core.layout" in cycle
               and "rlplay.engine.workers" in cycle
               for cycle in import_contract.cycles(tree))


def test_a_consumer_importing_a_loop_is_reported(tree):
    line = _plant(tree / "engine" / "consumers" / "lanes.py",
                  "def planted():\n    from ..core import collect")
    assert import_contract.violations(tree) == [
        f"rlplay/engine/consumers/lanes.py:{line}: from "
        f"rlplay.engine.core import collect: the layer 'consumers' may not "
        f"import from the layer 'core loops'"]
    assert import_contract.cycles(tree) == []  # a lazy import is no edge


def test_the_policy_and_devices_cycle_stays_gone(tree):
    # the lazy import that hid it, put back at module level
    _plant(tree / "engine" / "policy" / "local.py",
           "from .choose import as_policy")
    assert [sorted(c) for c in import_contract.cycles(tree)] == [[
        "rlplay.engine.policy.choose", "rlplay.engine.policy.device",
        "rlplay.engine.policy.local"]]


def _packages():
    return [name for name, (_, package) in
            import_contract.modules(PACKAGE).items() if package]


@pytest.mark.parametrize("name", _packages())
def test_what_a_folder_names_it_has(name):
    module = importlib.import_module(name)
    named = list(getattr(module, "__all__", ())) + list(
        getattr(module, "__exports__", ()))
    assert [n for n in named if not hasattr(module, n)] == []


# the rooms, each imported first in a fresh interpreter: no order of
# first imports meets a partly initialised module
FIRST_IMPORTS = ["rlplay.engine.devices", "rlplay.engine.policy",
                 "rlplay.engine.core.layout", "rlplay.engine.workers",
                 "rlplay.engine.rollout.same", "rlplay.engine.consumers",
                 "rlplay.engine.returns", "rlplay.engine.rollout.episodic",
                 "rlplay.engine.rollout.cluster", "rlplay.demo"]


def test_each_room_imports_first_in_a_fresh_interpreter():
    script = ("import importlib, sys\n"
              "importlib.import_module(sys.argv[1])\n")
    failed = {}
    for name in FIRST_IMPORTS:
        done = subprocess.run([sys.executable, "-c", script, name],
                              cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        if done.returncode:
            failed[name] = done.stderr[-2000:]
    assert failed == {}


def _public_names():
    saved = json.loads(NAMES.read_text())
    return [(module, name) for module, names in saved["all"].items()
            for name in names]


def test_the_0_1_0_names_are_recorded():
    saved = json.loads(NAMES.read_text())
    assert len(saved["modules"]) == 52 and len(_public_names()) == 334


def test_every_0_1_0_module_still_imports():
    saved = json.loads(NAMES.read_text())
    missing = []
    for module in saved["modules"]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{module}: {exc}")
    assert missing == []


def test_every_0_1_0_name_still_imports_from_its_path():
    missing = []
    for module, name in _public_names():
        try:
            ok = hasattr(importlib.import_module(module), name)
        except ImportError:
            ok = False
        if not ok:
            missing.append(f"{module}.{name}")
    assert missing == []
