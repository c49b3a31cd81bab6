"""What ``make demo``, ``make test`` and ``make docs`` install, read from
dry runs (``make -n``: nothing is installed), and the extras of
setup.cfg."""
import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from bounds import SCRIPT  # the reason in bounds.py

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None,
                                reason="needs make")


def _extras():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = config["options.extras_require"]
    return {name: [line.split("#")[0].strip()
                   for line in extras[name].splitlines()
                   if line.split("#")[0].strip()] for name in extras}


def _name(requirement):
    """The distribution a requirement line names, normalised."""
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def _installs(target, venv):
    """The pip install lines that ``make target`` would run."""
    done = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=SCRIPT)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if "pip install" in line]


def test_make_demo_installs_the_demo_extra_alone(tmp_path):
    installs = _installs("demo", tmp_path / "venv")
    assert len(installs) == 1, installs
    assert "-c constraints.txt" in installs[0]
    assert installs[0].endswith("-e '.[demo]'"), installs[0]


def test_make_test_after_make_demo_installs_the_rest(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed-demo").touch()  # make demo has run
    assert _installs("demo", venv) == []
    installs = _installs("test", venv)
    # every extra, then what goes without its dependencies (below)
    assert len(installs) == 2, installs
    asked = installs[0].rsplit("[", 1)[1].split("]")[0].split(",")
    assert sorted(asked) == sorted(_extras()), asked


def test_make_test_installs_pufferlib_pinned_without_its_dependencies(
        tmp_path):
    """After the extras, ``make test`` installs pufferlib-core (PufferLib's
    vector envs, peer rows of benchmarks/throughput.py) from a wheel
    without its dependencies (its wheel pins another torch than the CPU
    build of constraints.txt), pinned to one version, since what it
    imports is not checked by pip; what its vector envs import beside
    numpy and gymnasium, psutil, is in the bench extra. A Python without
    its wheel goes on without it (its rows say so)."""
    installs = _installs("test", tmp_path / "venv")
    assert len(installs) == 2, installs
    command, _, fallback = installs[1].partition(" || ")
    words = shlex.split(command)
    assert "--no-deps" in words
    assert re.fullmatch(r"pufferlib-core==\d+(\.\d+)+", words[-1]), words
    assert words[words.index("--only-binary") + 1] == ":all:"
    assert fallback.startswith("echo "), installs[1]
    assert "psutil" in {_name(req) for req in _extras()["bench"]}


def test_make_docs_installs_the_docs_extra_and_builds_strictly(tmp_path):
    installs = _installs("docs", tmp_path / "venv")
    assert len(installs) == 1, installs
    assert "-c constraints.txt" in installs[0]
    assert installs[0].endswith("-e '.[docs]'"), installs[0]
    done = subprocess.run(["make", "-n", "docs", f"VENV={tmp_path / 'venv'}"],
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=SCRIPT)
    builds = [line for line in done.stdout.splitlines()
              if "mkdocs build" in line]
    assert len(builds) == 1 and "--strict" in builds[0], done.stdout
    assert "--site-dir site" in builds[0], builds[0]
    assert "mkdocs" in {_name(req) for req in _extras()["docs"]}


def test_the_notebooks_extra_has_a_front_end():
    """The ``notebooks`` extra can open the notebooks
    (``jupyter lab notebooks/``), not only execute them."""
    assert any(req.startswith("jupyterlab") for req in _extras()["notebooks"])


def test_one_distribution_installs_the_pygame_module():
    """pygame and pygame-ce both install the module ``pygame`` (the later
    install overwrites the other's files): the extras ask for pygame-ce,
    which mpe2 (rlplay[bench]) and gymnasium[classic-control] bring too,
    and never for pygame; constraints.txt pins the same one."""
    asked = {name: {_name(req) for req in reqs}
             for name, reqs in _extras().items()}
    assert "pygame-ce" in asked["video"], asked["video"]
    both = [name for name, names in asked.items() if "pygame" in names]
    assert not both, f"extras {both} ask for pygame, not pygame-ce"
    pinned = {_name(line.split("#")[0].strip())
              for line in (ROOT / "constraints.txt").read_text().splitlines()
              if line.split("#")[0].strip()}
    assert "pygame-ce" in pinned and "pygame" not in pinned, sorted(pinned)


def test_make_dist_installs_the_release_extra_alone(tmp_path):
    installs = _installs("dist", tmp_path / "venv")
    assert len(installs) == 1, installs
    assert "-c constraints.txt" in installs[0]
    assert installs[0].endswith("-e '.[release]'"), installs[0]
