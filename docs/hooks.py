"""MkDocs hooks of rlplay's documentation (``hooks:`` in mkdocs.yml).

The notebooks live in ``notebooks/``, where the test suite executes them;
this hook shows them to MkDocs as ``tutorials/NAME.ipynb`` (mkdocs-jupyter
renders them as pages, without executing them), with the figures they
show beside them, so that nothing is copied into ``docs/``.
"""
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


# before mkdocs-jupyter's on_files, which turns every .ipynb into a page
@event_priority(100)
def on_files(files, config):
    for path in sorted(NOTEBOOKS.glob("*.ipynb")) + sorted(
            NOTEBOOKS.glob("*.png")):
        files.append(File.generated(config, f"tutorials/{path.name}",
                                    abs_src_path=str(path)))
    return files


def on_nav(nav, config, files):
    # mkdocs-jupyter wraps each notebook in a File of its own, which
    # computes its source path from a source directory: these have none
    # (they live outside docs/), so hand it the wrapped file's path
    for file in files:
        inner = getattr(file, "file", None)
        if inner is not None and file.src_uri.startswith("tutorials/"):
            file.abs_src_path = inner.abs_src_path
    return nav
