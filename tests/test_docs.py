"""The documentation site builds (``mkdocs build --strict``: a broken link,
anchor or cross-reference fails it) and holds what it promises: the API
reference rendered from the docstrings, for every public name; the figure
of the batch layout, as its script draws it; a page for every notebook;
the generators' timelines as their modules' docstrings draw them.

Skipped where the documentation's tools are missing (the ``docs``
extra, which ``make docs`` and ``make test`` install).
"""
import ast
import functools
import html
import http.server
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import urllib.request
import zlib
from pathlib import Path

import pytest

from bounds import DOCS_BUILD  # the reason in bounds.py

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python",
         "mkdocs_jupyter")
# the modules whose public names (``__all__``) the API reference documents
MODULES = [
    "rlplay", "rlplay.engine", "rlplay.engine.rollout",
    "rlplay.engine.rollout.same", "rlplay.engine.rollout.single",
    "rlplay.engine.rollout.multi", "rlplay.engine.rollout.cluster",
    "rlplay.engine.rollout.evaluate", "rlplay.engine.rollout.episodic",
    "rlplay.engine.core", "rlplay.engine.policy", "rlplay.engine.devices",
    "rlplay.engine.envs", "rlplay.engine.actor",
    "rlplay.engine.distributions",
    "rlplay.engine.returns", "rlplay.engine.replay", "rlplay.engine.norm",
    "rlplay.engine.lanes", "rlplay.engine.errors", "rlplay.engine.seeds",
    "rlplay.engine.nested", "rlplay.engine.shared", "rlplay.engine.pool",
    "rlplay.engine.video", "rlplay.engine.utils", "rlplay.envs",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for tool in TOOLS:
        pytest.importorskip(tool, reason="needs the docs extra")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=DOCS_BUILD)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return out


def _inventory(path):
    """The names of a Sphinx inventory (``objects.inv``, version 2)."""
    data = path.read_bytes()
    for _ in range(4):  # four header lines, then zlib
        data = data[data.index(b"\n") + 1:]
    lines = zlib.decompress(data).decode().splitlines()
    return {line.split(" ", 1)[0] for line in lines}


def _resolve(path):
    """The object at a dotted path, or a sentinel."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                obj = getattr(obj, part)
        except AttributeError:
            return object()
        return obj
    return object()


def test_the_api_reference_renders_the_docstrings(site):
    core = (site / "api" / "core.html").read_text()
    assert 'id="rlplay.engine.core.Fragment"' in core
    assert "A fragment of" in core  # Fragment's docstring, its class's own
    same = (site / "api" / "same.html").read_text()
    assert 'id="rlplay.engine.rollout.same.rollout"' in same
    assert "Collect fragments in this process" in same
    assert "learner (the only process)" in same  # the protocol's timeline
    # the numpydoc sections, and a cross-reference between pages
    assert "Parameters:" in same or ">Parameters<" in same
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*'
                     r'href="actor\.html#rlplay\.engine\.actor\.', same)
    # reStructuredText roles and tables are rewritten, not shown raw
    layout = (site / "api" / "rollout.html").read_text()
    assert ":class:`" not in layout and ":func:`" not in layout
    assert "<table>" in layout and "=======" not in layout


def test_every_public_name_is_documented(site):
    names = _inventory(site / "objects.inv")
    by_last = {}
    for name in names:
        by_last.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    missing = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        assert module_name in names, module_name
        for name in module.__all__:
            if name.startswith("__"):
                continue
            if f"{module_name}.{name}" in names:
                continue
            obj = getattr(module, name)
            if not any(_resolve(path) is obj
                       for path in by_last.get(name, ())):
                missing.append(f"{module_name}.{name}")
    assert not missing, f"not in the API reference: {missing}"


def test_the_layout_page_has_its_figure(site):
    page = (site / "concepts" / "batch-layout.html").read_text()
    assert re.search(r'<img[^>]+src="\.\./figures/layout\.svg"', page)
    assert (site / "figures" / "layout.svg").is_file()
    assert page.count("<table>") >= 1 and "<td><code>acted</code></td>" in page


def test_the_figure_is_the_scripts():
    namespace = {}
    script = DOCS / "figures" / "make_layout.py"
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    assert namespace["svg"]() == (DOCS / "figures" / "layout.svg").read_text(), (
        "run python docs/figures/make_layout.py")


def test_every_notebook_is_a_tutorial_page(site):
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 12
    index = (site / "tutorials" / "index.html").read_text()
    for notebook in notebooks:
        page = site / "tutorials" / f"{notebook.stem}.html"
        assert page.is_file(), notebook.name
        assert "jp-Notebook" in page.read_text(), notebook.name
        assert f'href="{notebook.stem}.html"' in index, notebook.name
    # the figures that the notebooks show sit beside their pages
    for figure in (ROOT / "notebooks").glob("*.png"):
        assert (site / "tutorials" / figure.name).is_file()


def test_the_home_page_includes_the_readme(site):
    home = (site / "index.html").read_text()
    assert "make demo" in home and "same.rollout" in home
    assert "--8&lt;--" not in home and "--8<--" not in home


def _timelines(module):
    """The literal blocks (``::``) of a module's docstring, dedented."""
    path = ROOT / "rlplay" / "engine" / "rollout" / f"{module}.py"
    lines = ast.get_docstring(ast.parse(path.read_text())).split("\n")
    blocks = []
    for i, line in enumerate(lines):
        if line.rstrip().endswith("::"):
            block = []
            for line in lines[i + 2:]:
                if line.strip() and not line.startswith("    "):
                    break
                block.append(line)
            blocks.append(textwrap.dedent("\n".join(block)).strip())
    return blocks


def test_the_timelines_are_the_docstrings():
    page = (DOCS / "concepts" / "generators.md").read_text()
    shown = [block.strip() for block in
             re.findall(r"```text\n(.*?)```", page, flags=re.S)]
    drawn = [block for module in ("same", "single", "multi", "cluster",
                                  "evaluate") for block in _timelines(module)]
    assert len(shown) >= 7
    for block in shown:
        assert block in drawn, f"not in a module's docstring:\n{block}"


# the callables whose keywords a static reading gets wrong unless told:
# the generators' shared keywords arrive as ``**kwargs: Unpack[...]``, and
# PrioritizedReplay documents six parameters in one entry
SPELLED_OUT = [
    "rlplay.engine.rollout.same.rollout", "rlplay.engine.rollout.same.Rollout",
    "rlplay.engine.rollout.single.rollout",
    "rlplay.engine.rollout.single.Rollout",
    "rlplay.engine.rollout.multi.rollout",
    "rlplay.engine.rollout.multi.Rollout",
    "rlplay.engine.rollout.cluster.rollout",
    "rlplay.engine.rollout.cluster.Rollout",
    "rlplay.engine.rollout.evaluate.Evaluator",
    "rlplay.engine.replay.PrioritizedReplay",
]
# an object's heading, and the kind of object (a namedtuple shows as an
# attribute: its "signature" is the assignment)
HEADING = re.compile(r'<h[1-6] id="([\w.]+)" class="doc doc-heading">\s*'
                     r'<code class="doc-symbol doc-symbol-heading '
                     r'doc-symbol-(\w+)">')


def _text(fragment):
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def _rendered(site):
    """``{identifier: (signature, {parameter: default cell})}`` of every
    object of the API pages that shows a signature, as rendered."""
    shown = {}
    for page in sorted((site / "api").glob("*.html")):
        text = page.read_text()
        heads = list(HEADING.finditer(text))
        for head, after in zip(heads, heads[1:] + [None]):
            part = text[head.end():after.start() if after else len(text)]
            signature = re.search(r'<div class="doc-signature[^"]*">(.*?)'
                                  r"</div>", part, flags=re.S)
            if signature is None or head.group(2) not in (
                    "function", "method", "class"):
                continue
            table = re.search(r"<th>Default</th>.*?</table>", part,
                              flags=re.S)
            rows = {} if table is None else {
                _text(name).strip(): _text(default).strip()
                for name, default in re.findall(
                    r'<tr class="doc-section-item">\s*<td>(.*?)</td>.*?'
                    r"<td>.*?</td>\s*<td>.*?</td>\s*<td>(.*?)</td>\s*</tr>",
                    table.group(0), flags=re.S)}
            shown[head.group(1)] = (_text(signature.group(1)), rows)
    return shown


def test_no_keyword_with_a_default_is_shown_as_required(site):
    """The signatures and parameter tables of the API pages show what
    ``inspect.signature`` (and ``help()``) shows: every parameter that has
    a default is shown with one, never as required, the generators' shared
    keywords (``**kwargs: Unpack[...]`` in the source) among them."""
    shown = _rendered(site)
    assert set(SPELLED_OUT) <= set(shown), sorted(set(SPELLED_OUT) - set(shown))
    wrong = []
    for identifier, (signature, rows) in shown.items():
        obj = _resolve(identifier)
        try:
            parameters = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):
            continue
        if "**kwargs" in signature and not any(
                p.kind is p.VAR_KEYWORD for p in parameters):
            wrong.append(f"{identifier}: shows **kwargs")
        for p in parameters:
            if p.default is p.empty:
                continue
            if not re.search(rf"\b{p.name}=", signature):
                wrong.append(f"{identifier}: {p.name} has no default in "
                             f"the signature")
            if rows.get(p.name) == "required":
                wrong.append(f"{identifier}: {p.name} shown as required")
    assert not wrong, "\n".join(wrong)


# the pages a reader opens first, as files too
FIRST_PAGES = [ROOT / "README.md", DOCS / "index.md",
               DOCS / "getting-started.md"]
# a README section, and a page's copy of one
SECTION = re.compile(r"<!-- --8<-- \[start:(\w+)\] -->\n(.*?)"
                     r"<!-- --8<-- \[end:\1\] -->", flags=re.S)
COPY = re.compile(r"<!-- a copy of README\.md's \"(\w+)\" section[^\n]*-->\n"
                  r"(.*?)\n<!-- end of the copy -->", flags=re.S)
# a relative link or image of Markdown, or an HTML src/href
LINK = re.compile(r'\]\(([^)\s]+)\)|(?:src|href)="([^"]+)"')


def test_the_first_pages_read_as_files():
    """docs/index.md and getting-started.md hold copies of README.md's
    sections (the set-up, the quickstart...), equal to them, instead of
    snippet lines that only the built site expands."""
    readme = dict(SECTION.findall((ROOT / "README.md").read_text()))
    copied = set()
    for page in FIRST_PAGES[1:]:
        text = page.read_text()
        assert not re.search(r"^--8<--", text, flags=re.M), page.name
        for name, copy in COPY.findall(text):
            assert name in readme, f"{page.name}: no README section {name}"
            assert copy == readme[name].strip("\n"), (
                f"{page.name}'s copy of README.md's {name!r} section differs "
                f"from it: copy it again")
            copied.add(name)
    assert {"setup", "what", "quickstart", "peers"} <= copied, copied


def _links(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for match in LINK.finditer(text):
        url = match.group(1) or match.group(2)
        path = url.partition("#")[0]
        if path and not re.match(r"[a-z]+:", path):
            yield url, path


def test_relative_links_resolve_on_disk():
    """Every relative link of README.md and of docs/ resolves from the
    page's own place in the repository (a notebook at
    ``../../notebooks/NAME.ipynb``, which docs/hooks.py points at its page
    in the site), so that the pages read as files too."""
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    broken, seen = [], 0
    for page in pages:
        for url, path in _links(page):
            seen += 1
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {url}")
    assert seen >= 100, seen
    assert not broken, "\n".join(broken)


def test_the_site_serves_its_search_with_the_documented_command(site):
    """The documented way to open the site with its search (browsers run
    Material's search only from a server) is ``python3 -m http.server
    --directory site``, the directory ``make docs`` builds into; served so
    (the same server, in this process), a page has the search box and the
    index holds the pages."""
    command = "python3 -m http.server --directory site"
    for page in FIRST_PAGES:
        said = " ".join(page.read_text().split())
        assert command in said, f"{page.name} does not name {command}"
    assert "--site-dir $(SITE)" in (ROOT / "Makefile").read_text()
    assert "SITE ?= site" in (ROOT / "Makefile").read_text()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(site))
    handler.log_message = lambda *args: None
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            base = f"http://127.0.0.1:{server.server_address[1]}/"
            with urllib.request.urlopen(base, timeout=DOCS_BUILD) as reply:
                home = reply.read().decode()
            with urllib.request.urlopen(base + "search/search_index.json",
                                        timeout=DOCS_BUILD) as reply:
                index = json.load(reply)
        finally:
            server.shutdown()
            thread.join(DOCS_BUILD)
    assert 'data-md-component="search"' in home
    locations = {doc["location"] for doc in index["docs"]}
    assert {"getting-started.html", "how-to/evaluation.html",
            "api/multi.html"} <= locations, sorted(locations)[:20]


# the private modules that help() and the API pages named, for concepts
# that have public homes (restarts, call_envs, resume)
PRIVATE = re.compile(r"\b_(?:supervisor|control|resume)\b")


def _public_docstrings():
    """``{where: docstring}`` of the public modules, their public names
    and those names' public attributes (what ``help()`` shows)."""
    docs = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        docs[module_name] = module.__doc__ or ""
        for name in module.__all__:
            obj = getattr(module, name)
            docs[f"{module_name}.{name}"] = inspect.getdoc(obj) or ""
            if inspect.isclass(obj):
                for attr, member in inspect.getmembers(obj):
                    if not attr.startswith("_") or attr == "__init__":
                        docs[f"{module_name}.{name}.{attr}"] = \
                            inspect.getdoc(member) or ""
    return docs


def test_help_names_no_private_module():
    """help() of the public names (and so the API pages, from the same
    docstrings) points at public homes, not at ``_supervisor``,
    ``_control`` or ``_resume``."""
    named = [where for where, doc in _public_docstrings().items()
             if PRIVATE.search(doc)]
    assert not named, named


def test_the_timelines_are_code_not_titles(site):
    """A timeline's header over dashes (``learner`` over ``-------``) is
    code on the API pages, not the title of an admonition, as numpydoc
    would read it outside a fence."""
    for page in sorted((site / "api").glob("*.html")):
        text = page.read_text()
        assert '<summary><div class="highlight">' not in text, page.name
        assert not re.search(r'<details class="-', text), page.name
    single = (site / "api" / "single.html").read_text()
    assert re.search(r"<code>learner +worker\n-------", single)


def test_the_tutorials_are_titled_by_their_headings(site):
    """The navigation names each notebook by its heading, code spans and
    all (a title taken from the heading by mkdocs-jupyter lost them:
    "...on Breakout with")."""
    home = (site / "index.html").read_text()
    shown = {" ".join(_text(title).split()) for title in re.findall(
        r'<span class="md-ellipsis">(.*?)</span>', home, flags=re.S)}
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        first = json.loads(notebook.read_text())["cells"][0]["source"]
        heading = "".join(first).split("\n")[0]
        assert heading.startswith("# "), notebook.name
        assert heading[2:].replace("`", "") in shown, notebook.name


def test_no_docstring_is_assigned():
    """The API reference reads docstrings from the source: a named tuple is
    a ``NamedTuple`` class with its docstring, never given one by
    assignment (``X.__doc__ = ...``), which a static reading misses."""
    assigned = []
    for path in sorted((ROOT / "rlplay").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Attribute) and t.attr == "__doc__"
                    for t in node.targets):
                assigned.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert assigned == []
