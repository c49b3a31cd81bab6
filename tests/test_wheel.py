"""The release: ``python -m build`` makes an sdist and a wheel that hold the
package (and no tests), ``twine check`` accepts both, and the wheel,
installed in a fresh virtual environment, imports the engine and every
generator, and collects a batch, without any extra.

Kept to seconds, within the suite's budget:

- the build runs in a copy of the tree (nothing is left in the checkout)
  without an isolated environment (``--no-isolation``, with this
  environment's setuptools, which ``build`` checks against pyproject.toml's
  requirement); ``make dist`` builds as an index does, in an isolated one;
- the fresh environment has no pip and gets the wheel alone (``pip
  --python VENV install --no-deps``), and reaches rlplay's dependencies
  through a ``.pth`` file that lists this environment's site-packages:
  installing them from the wheels at hand (torch, numpy, gymnasium,
  cloudpickle) took over 30 s. What that leaves out is checked apart: the
  wheel's ``Requires-Dist`` is setup.cfg's, and the versions the fresh
  interpreter imports satisfy it;
- the extras are installed here, so the fresh interpreter refuses to import
  any of them (an import finder that raises ``ModuleNotFoundError``, as for
  a module not installed) and records who tried.
"""
import configparser
import importlib.util
import json
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

from bounds import PACKAGING, SCRIPT  # the reasons in bounds.py

ROOT = Path(__file__).resolve().parent.parent

# the modules of each extra of setup.cfg (the test below checks that every
# extra is listed)
EXTRA_MODULES = {
    "test": ("pytest", "pytest_timeout", "xdist"),
    "notebooks": ("nbclient", "nbformat", "ipykernel", "matplotlib", "tqdm",
                  "jupyterlab"),
    "demo": ("tqdm",),
    "tensorboard": ("tensorboard",),
    "release": ("build", "twine"),
    "cluster": ("ray",),
    "envpool": ("envpool",),
    "atari": ("ale_py", "cv2"),
    "mujoco": ("mujoco",),
    "pettingzoo": ("pettingzoo", "mpe2"),
    "torch-envs": ("array_api_compat",),
    "jax": ("jax", "gymnax"),
    "minari": ("minari",),
    "video": ("PIL", "pygame"),
    "bench": ("torchrl", "tensordict", "stable_baselines3", "supersuit",
              "mpe2", "pymunk"),
    "docs": ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter"),
}

# what the fresh interpreter runs (``-I``: no PYTHONPATH, no user site, no
# current directory on the path); argv[1] is the JSON list of the extras'
# modules to refuse, argv[2] that of rlplay's dependencies
SCRIPT_TEXT = r'''
import importlib.abc, importlib.metadata, json, os, sys, traceback

BLOCKED = set(json.loads(sys.argv[1]))
DEPENDENCIES = json.loads(sys.argv[2])
tried = []


class NotInstalled(importlib.abc.MetaPathFinder):
    """Refuses the extras' modules, and records the importer's file."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in BLOCKED:
            return None
        frames = [frame.filename for frame in traceback.extract_stack()]
        importer = next((f for f in reversed(frames[:-1])
                         if "importlib" not in f and f != "<string>"),
                        "<string>")
        tried.append([name, importer])
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NotInstalled())

import functools
import gymnasium, torch
import rlplay, rlplay.engine, rlplay.envs
from rlplay.engine import PolicyActor, log_stats
from rlplay.engine.rollout import (Evaluator, cluster, episodic, evaluate,
                                   multi, same, single)

# a batch, collected by the installed package
actor = PolicyActor(torch.nn.Linear(4, 2))
factory = functools.partial(gymnasium.make, "CartPole-v1")
with same.rollout(factory, actor, 8, 2, entropy=0) as feed:
    batch = next(feed)
try:
    cluster.rollout(factory, actor, 8, 1, 2, 1, 1)
except ImportError as exc:
    without_ray = str(exc)

package = os.path.dirname(rlplay.__file__)
print(json.dumps({
    "files": sorted(getattr(module, "__file__", None) or ""
                    for name, module in list(sys.modules.items())
                    if name.partition(".")[0] == "rlplay"),
    "package": package,
    "tried": [[name, os.path.relpath(importer, os.path.dirname(package))
               if importer.startswith(package) else importer]
              for name, importer in tried],
    "loaded": sorted(name for name in sys.modules
                     if name.partition(".")[0] in BLOCKED),
    "version": rlplay.__version__,
    "metadata_version": importlib.metadata.version("rlplay"),
    "shape": list(batch.state.obs.shape),
    "without_ray": without_ray,
    "requires": {name: importlib.metadata.version(name)
                 for name in DEPENDENCIES},
}))
'''


def _pip_version():
    try:
        import pip
    except ImportError:
        return ()
    return tuple(int(part) for part in pip.__version__.split(".")[:2]
                 if part.isdigit())


pytestmark = [
    pytest.mark.skipif(
        any(importlib.util.find_spec(name) is None
            for name in ("build", "twine", "packaging", "venv")),
        reason="needs build, twine (rlplay[release]) and venv"),
    # pip installs into another environment with --python since 22.3
    pytest.mark.skipif(_pip_version() < (22, 3),
                       reason="needs pip 22.3 or later (pip --python)"),
]


def _run(args, timeout=PACKAGING, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True,
                          timeout=timeout, **kwargs)
    assert done.returncode == 0, (args, done.stdout[-3000:],
                                  done.stderr[-3000:])
    return done


def _package_files(root):
    """The package's Python files under ``root``, relative to it."""
    return {path.relative_to(root).as_posix()
            for path in (root / "rlplay").rglob("*.py")
            if "__pycache__" not in path.parts}


def _setup_cfg_requirements():
    """``{extra or "": set of requirement strings}`` of setup.cfg."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")

    def lines(text):
        return {line.split("#")[0].strip() for line in text.splitlines()
                if line.split("#")[0].strip()}
    wanted = {"": lines(config["options"]["install_requires"])}
    for extra, text in config["options.extras_require"].items():
        wanted[extra] = lines(text)
    return wanted


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """``(sdist, wheel)`` built from a copy of the tree: the sdist first,
    then the wheel from the unpacked sdist (what ``python -m build``
    does), so that a file the sdist misses fails the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, out = tmp / "src", tmp / "dist"
    ignore = shutil.ignore_patterns("__pycache__", "*.py[cod]")
    for name in ("rlplay", "tests"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for path in ROOT.iterdir():
        if path.is_file() and (path.suffix in (".cfg", ".toml", ".md", ".in")
                               or path.name.startswith("LICEN")):
            shutil.copy2(path, src / path.name)
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
          str(out), str(src)], cwd=tmp)
    sdists, wheels = list(out.glob("*.tar.gz")), list(out.glob("*.whl"))
    assert len(sdists) == len(wheels) == 1, list(out.iterdir())
    return sdists[0], wheels[0]


@pytest.fixture(scope="module")
def fresh(dist, tmp_path_factory):
    """The Python of a fresh virtual environment with the wheel installed
    alone, and this environment's site-packages after its own."""
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install",
          "--no-deps", "--no-index", "--quiet", str(dist[1])])
    # written after the install, so that pip saw an environment of its own
    purelib = Path(sysconfig.get_path(
        "purelib", vars={"base": str(venv), "platbase": str(venv)}))
    assert (purelib / "rlplay").is_dir(), sorted(purelib.iterdir())
    (purelib / "dependencies.pth").write_text(
        "".join(f"{path}\n" for path in site.getsitepackages()))
    return python


def test_every_extra_of_setup_cfg_names_its_modules():
    assert set(EXTRA_MODULES) == set(_setup_cfg_requirements()) - {""}


def test_the_sdist_and_the_wheel_hold_the_package_and_no_tests(dist):
    sdist, wheel = dist
    package = _package_files(ROOT)
    assert "rlplay/engine/rollout/cluster.py" in package

    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames()
                 if "/" in name}
    top = {name.split("/")[0] for name in names}
    assert top == {"PKG-INFO", "README.md", "CHANGELOG.md", "LICENSE",
                   "MANIFEST.in", "setup.cfg", "pyproject.toml", "rlplay",
                   "rlplay.egg-info"}, top
    assert {name for name in names if name.startswith("rlplay/")
            and name.endswith(".py")} == package

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    info = {name for name in names if not name.startswith("rlplay/")}
    assert {name.split("/")[0] for name in info} == {
        f"rlplay-{_version()}.dist-info"}, info
    assert any(name.endswith("LICENSE") for name in info), info
    assert names - info == package
    assert wheel.name == f"rlplay-{_version()}-py3-none-any.whl"


def test_twine_accepts_the_sdist_and_the_wheel(dist):
    done = _run([sys.executable, "-m", "twine", "check", "--strict",
                 *map(str, dist)])
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_wheel_requires_what_setup_cfg_asks(dist):
    from packaging.requirements import Requirement

    def key(text):
        req = Requirement(text)
        return req.name.lower(), str(req.specifier), tuple(sorted(
            req.extras))
    with zipfile.ZipFile(dist[1]) as zf:
        metadata = HeaderParser().parsestr(zf.read(
            f"rlplay-{_version()}.dist-info/METADATA").decode())
    found = {}
    for text in metadata.get_all("Requires-Dist"):
        req = Requirement(text)
        extra = ""
        if req.marker is not None:
            extra = str(req.marker).split("==")[1].strip().strip("\"'")
        found.setdefault(extra, set()).add(key(text.split(";")[0]))
    wanted = {extra: {key(text) for text in texts}
              for extra, texts in _setup_cfg_requirements().items()}
    assert found == wanted
    assert metadata["Version"] == _version()
    assert metadata["Description-Content-Type"] == "text/markdown"


def test_the_installed_wheel_runs_without_any_extra(fresh):
    from packaging.requirements import Requirement
    blocked = sorted({module for modules in EXTRA_MODULES.values()
                      for module in modules})
    requires = [Requirement(text) for text in _setup_cfg_requirements()[""]]
    done = _run([str(fresh), "-I", "-c", SCRIPT_TEXT, json.dumps(blocked),
                 json.dumps([req.name for req in requires])],
                timeout=SCRIPT, cwd=fresh.parent)
    report = json.loads(done.stdout.splitlines()[-1])

    # every module of rlplay came from the wheel, none from this checkout
    package = report["package"]
    assert package.startswith(str(fresh.parent.parent)), package
    assert all(path.startswith(package) for path in report["files"]), \
        [path for path in report["files"] if not path.startswith(package)]
    assert report["version"] == report["metadata_version"] == _version()
    assert report["shape"] == [9, 2, 4]

    # no extra was imported; the one rlplay tries is Ray, optional in
    # cluster.py, whose rollout then names the extra to install
    assert report["loaded"] == []
    by_rlplay = [[name, importer] for name, importer in report["tried"]
                 if importer.startswith("rlplay")]
    assert by_rlplay == [["ray", "rlplay/engine/rollout/cluster.py"]], \
        report["tried"]
    assert "pip install -e 'path/to/rlplay[cluster]'" in \
        report["without_ray"]

    # the dependencies imported satisfy the wheel's requirements
    for req in requires:
        version = report["requires"][req.name]
        assert req.specifier.contains(version, prereleases=True), \
            (str(req), version)


def _version():
    """rlplay's version, read from the source as setup.cfg reads it."""
    for line in (ROOT / "rlplay" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=")[1].strip().strip("\"'")
    raise AssertionError("rlplay/__init__.py sets no __version__")
