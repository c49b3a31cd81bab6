"""Every Python block of README.md and of the documentation's pages
(``docs/**/*.md``) runs as written: each is saved as a script of its own
and run in a fresh interpreter, from an empty directory, as a reader would
run it after installing rlplay (and the extra a block names). A
block's id names its file and line.

A block may be preceded by one marker, an HTML comment that the rendered
page does not show:

- ``<!-- args: A B -->``: the script is run with these arguments;
- ``<!-- not run: reason -->``: the block is not run, for the reason given
  (use it sparingly: a block that cannot run as written is a bug of the
  page).

A page that copies a section of README.md (between ``<!-- a copy of
README.md's "name" section -->`` and ``<!-- end of the copy -->``, kept
equal to it by tests/test_docs.py) does not run the copy's blocks: they
run once, as README.md's.

The install commands of the pages (``pip install -e
'path/to/rlplay[extra]'``, the constraints file, ``.venv/bin/python``)
cannot run here as written (they install): what they name is checked
instead, against setup.cfg, the Makefile and the clone.

The scripts import this checkout's rlplay (``PYTHONPATH``), and the
``demo`` extra (tqdm) is hidden from them: the examples need rlplay
alone. A block that uses Ray (or mpe2, TensorBoard's writer, ALE or
MuJoCo) is
skipped where it is missing.
"""
import configparser
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"(?:<!--\s*(not run|args):\s*(.*?)\s*-->\n)?"
                   r"```python\n(.*?)```\n", flags=re.S)
# what a block needs, by what it says: the module that must be importable
NEEDS = {"rollout import cluster": "ray", "import ray": "ray",
         "import simple_spread": "mpe2",
         "import SummaryWriter": "tensorboard",
         "import ale_py": "ale_py", "HalfCheetah": "mujoco",
         "import gymnax": "gymnax", "jax.numpy as jnp": "jax",
         "import Brax": "brax"}
# a bound on one block (bounds.py says why)
from bounds import MARGIN, DOC_BLOCK as BOUND  # noqa: E402
# a module that a plain install lacks: importing it fails as it would there
HIDDEN = "tqdm"


# a page's copy of a README section (its blocks run as README.md's)
COPY = re.compile(r"<!-- a copy of README\.md's .*?<!-- end of the copy -->",
                  flags=re.S)


def _blocks():
    for page in PAGES:
        # the copy blanked out, its lines kept: the ids keep their lines
        text = COPY.sub(lambda match: "\n" * match.group(0).count("\n"),
                        page.read_text())
        name = page.relative_to(ROOT).as_posix()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start(3))
            yield pytest.param(match.group(1), match.group(2),
                               match.group(3), id=f"{name}:{line}")


BLOCKS = list(_blocks())
# the README held 7 blocks before the documentation took most of them
# over; none may go missing
N_BLOCKS = 8


def test_the_pages_have_blocks_and_reasons():
    assert len(BLOCKS) >= N_BLOCKS, (
        f"{N_BLOCKS - len(BLOCKS)} Python blocks went missing: "
        f"{[param.id for param in BLOCKS]}")
    assert any(param.id.startswith("README.md:") for param in BLOCKS)
    for param in BLOCKS:
        kind, said, _ = param.values
        assert kind is None or said, (
            f"{param.id}: the marker needs {kind}: something")


def _plain(tmp_path):
    """A directory that, first on the path, hides :data:`HIDDEN`."""
    hide = tmp_path / "plain"
    hide.mkdir()
    (hide / f"{HIDDEN}.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{HIDDEN}'\", "
        f"name={HIDDEN!r})\n")
    return hide


@pytest.mark.timeout(BOUND + MARGIN)
@pytest.mark.parametrize("kind, said, code", BLOCKS)
def test_block_runs_as_written(kind, said, code, tmp_path):
    if kind == "not run":
        pytest.skip(said)
    for needle, module in NEEDS.items():
        if needle in code:
            pytest.importorskip(module)
    script = tmp_path / "block.py"
    script.write_text(code)
    args = shlex.split(said) if kind == "args" else []
    path = [str(_plain(tmp_path)), str(ROOT), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
    tic = time.monotonic()
    done = subprocess.run([sys.executable, script.name, *args],
                          cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=BOUND)
    print(f"{time.monotonic() - tic:.1f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


# every file a reader sees an install command in
SAID = [*PAGES, *sorted((ROOT / "notebooks").glob("*.ipynb")),
        *sorted((ROOT / "rlplay").rglob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py"))]
# an extra named as rlplay's: ``rlplay[a,b]``, ``path/to/rlplay[a]``,
# ``'.[a]'`` of a command run in the clone
EXTRAS = re.compile(r"(?:rlplay|'\.)\[([\w,-]+)\]")


def _setup_extras():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config["options.extras_require"]


def test_the_install_commands_name_what_the_clone_has():
    """What the pages, notebooks, messages and benchmarks tell a reader to
    install exists: every extra is one of setup.cfg, none is asked for
    from an index (``pip install rlplay[...]``: rlplay installs from its
    clone), and the install paragraph's commands name the clone's
    constraints file and the environment that the Makefile makes."""
    extras = _setup_extras()
    unknown, from_index, named = [], [], set()
    for path in SAID:
        text = path.read_text()
        name = path.relative_to(ROOT).as_posix()
        for match in EXTRAS.finditer(text):
            for extra in match.group(1).split(","):
                named.add(extra)
                if extra not in extras:
                    unknown.append(f"{name}: {extra}")
        if re.search(r"pip install '?rlplay\[", text):
            from_index.append(name)
    assert not unknown, f"extras not in setup.cfg: {unknown}"
    assert not from_index, f"pip install rlplay[...], from an index: " \
        f"{from_index}"
    assert {"pettingzoo", "cluster", "torch-envs", "video"} <= named, named

    readme = (ROOT / "README.md").read_text()
    setup = re.search(r"\[start:setup\](.*?)\[end:setup\]", readme,
                      flags=re.S).group(1)
    commands = re.findall(r"^pip install .*$", setup, flags=re.M)
    assert len(commands) == 2, commands
    for command in commands:
        words = shlex.split(command)
        assert "-e" in words, command
        target = words[words.index("-e") + 1]
        assert target.startswith("path/to/rlplay["), command
    constraints = shlex.split(commands[1])
    constraints = constraints[constraints.index("-c") + 1]
    assert constraints.startswith("path/to/rlplay/")
    assert (ROOT / constraints[len("path/to/rlplay/"):]).is_file(), \
        constraints
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^VENV \?= \.venv$", makefile, flags=re.M)
    assert "source .venv/bin/activate" in setup
    assert ".venv/bin/python" in setup


def test_the_extras_bring_what_the_pages_import():
    """The many-agents guide's MPE envs come with the ``pettingzoo``
    extra, and array-api-compat (which Gymnasium's ``NumpyToTorch``
    converts through) with ``torch-envs``, which ``make test`` installs."""
    extras = _setup_extras()

    def names(extra):
        return {re.split(r"[\s\[<>=!~;]", line.split("#")[0].strip(), 1)[0]
                for line in extras[extra].splitlines()
                if line.split("#")[0].strip()}

    assert "mpe2" in names("pettingzoo")
    assert "array-api-compat" in names("torch-envs")
    makefile = (ROOT / "Makefile").read_text()
    asked = re.search(r"^EXTRAS_test := (.*)$", makefile, flags=re.M)
    assert "torch-envs" in asked.group(1).split(",")


def test_the_loops_take_one_torch_thread():
    """Every example that runs a loop over a feed sets
    ``torch.set_num_threads(1)``: the actors are small MLPs, which one
    thread runs fastest, and torch's default (a thread per core) made the
    logging guide's 20 batches take 10-25 s instead of 1-2 s on a loaded
    two-core machine."""
    loops = [param for param in BLOCKS if param.values[0] != "not run"
             and re.search(r"for \w+(, \w+)? in .*feed", param.values[2])]
    assert len(loops) >= 8, [param.id for param in loops]
    missing = [param.id for param in loops
               if "torch.set_num_threads(1)" not in param.values[2]]
    assert not missing, missing
