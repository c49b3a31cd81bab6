"""Every Python block of README.md and of the documentation's pages
(``docs/**/*.md``) runs as written: each is saved as a script of its own
and run in a fresh interpreter, from an empty directory, as a reader would
run it after ``pip install rlplay`` (and the extra a block names). A
block's id names its file and line.

A block may be preceded by one marker, an HTML comment that the rendered
page does not show:

- ``<!-- args: A B -->``: the script is run with these arguments;
- ``<!-- not run: reason -->``: the block is not run, for the reason given
  (use it sparingly: a block that cannot run as written is a bug of the
  page).

A page that includes a section of README.md (``--8<-- "README.md:name"``)
holds no copy of its blocks: they run once, as README.md's.

The scripts import this checkout's rlplay (``PYTHONPATH``), and the
``demo`` extra (tqdm) is hidden from them: the examples need rlplay
alone. A block that uses Ray (or mpe2, or TensorBoard's writer) is
skipped where it is missing.
"""
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
         "import SummaryWriter": "tensorboard", "import gymnax": "gymnax",
         "jax.numpy as jnp": "jax"}
# a bound on one block (bounds.py says why)
from bounds import MARGIN, DOC_BLOCK as BOUND  # noqa: E402
# a module that a plain install lacks: importing it fails as it would there
HIDDEN = "tqdm"


def _blocks():
    for page in PAGES:
        text = page.read_text()
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
