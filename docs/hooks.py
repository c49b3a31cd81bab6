"""MkDocs hooks of rlplay's documentation (``hooks:`` in mkdocs.yml).

The notebooks live in ``notebooks/``, where the test suite executes them;
this hook shows them to MkDocs as ``tutorials/NAME.ipynb`` (mkdocs-jupyter
renders them as pages, without executing them), with the figures they
show beside them, so that nothing is copied into ``docs/``.

The pages link to a notebook or its figure where it lives
(``../../notebooks/NAME.ipynb`` from ``docs/how-to/``), so that they read
as files too (tests/test_docs.py checks that every relative link resolves
on the disk); this hook points such links at ``tutorials/NAME`` in the
site.
"""
import os
import posixpath
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# a Markdown link or image target, or an HTML src/href
LINK = re.compile(r'(\]\(|(?:src|href)=")([^)"\s]+)')


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


def on_page_markdown(markdown, page, config, files):
    # a link that resolves, from the page's source, to a file of
    # notebooks/ becomes a link to its copy in tutorials/ (on_files)
    here = posixpath.dirname(page.file.src_uri)
    source = Path(config["docs_dir"]) / here

    def site_link(match):
        start, url = match.groups()
        path, hash_, anchor = url.partition("#")
        if not path or ":" in path or path.startswith("/"):
            return match.group(0)
        target = Path(os.path.normpath(source / path))
        if target.parent != NOTEBOOKS:
            return match.group(0)
        link = posixpath.relpath(f"tutorials/{target.name}", here or ".")
        return start + link + hash_ + anchor

    return LINK.sub(site_link, markdown)
