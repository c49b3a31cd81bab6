"""The import contract of ``rlplay/``, read from the source (``ast``): the
checks of ``test_imports.py``, written to run on any copy of the tree (the
tests plant violations in a copy and expect them reported).

The rules:

- **Folders.** A module imports from another folder (package) of rlplay
  only the names that folder's ``__init__`` names: its ``__all__`` and its
  ``__exports__`` (what the other folders may import beyond the public
  names). The modules directly in ``rlplay/engine`` (the foundation) are
  imported by their public names.
- **Private names.** No ``_private`` name, and no ``_private`` module,
  is imported across a folder.
- **Layers.** Imports run one way, down the layers of :data:`LAYERS`;
  the consumers (:data:`CONSUMERS`) import the layout and the foundation
  only, and only the generators and the package's top import them.
- **No cycle.** The graph of the module-level imports between rlplay's
  modules has no cycle (an import inside a function, made when it runs,
  is no edge; the package ``__init__`` that Python imports before a
  submodule is no edge either: it is imported first whatever the order).
"""
import ast
from pathlib import Path

__all__ = ["LAYERS", "CONSUMERS", "layer", "modules", "violations",
           "cycles", "depends"]

# the layers, bottom first: each module is in the layer of its longest
# prefix here
LAYERS = [
    ("foundation", ["rlplay.engine.nested", "rlplay.engine.shared",
                    "rlplay.engine.pool", "rlplay.engine.errors",
                    "rlplay.engine.seeds", "rlplay.engine.signatures",
                    "rlplay.engine.distributions", "rlplay.engine.video",
                    "rlplay.engine.devices", "rlplay.engine.scalars",
                    "rlplay.engine.utils"]),
    ("actor and envs", ["rlplay.engine.actor", "rlplay.engine.envs"]),
    ("core layout", ["rlplay.engine.core.layout", "rlplay.engine.core.checks",
                     "rlplay.engine.core.accounting",
                     "rlplay.engine.core.finals",
                     "rlplay.engine.core.context"]),
    ("policy", ["rlplay.engine.policy"]),
    ("core loops", ["rlplay.engine.core"]),
    ("workers", ["rlplay.engine.workers"]),
    ("rollout", ["rlplay.engine.rollout"]),
    ("top", ["rlplay", "rlplay.engine", "rlplay.envs", "rlplay.demo"]),
]
# the consumers of batches, beside the layers: they import the layout and
# the foundation only; the generators and the top import them (the
# 0.1.0 paths of returns, lanes, norm and replay are consumers too)
CONSUMERS = ["rlplay.engine.consumers", "rlplay.engine.returns",
             "rlplay.engine.lanes", "rlplay.engine.norm",
             "rlplay.engine.replay"]
CONSUMES = {"foundation", "core layout"}
CONSUMED_BY = {"rollout", "top"}
ROOT_FOLDER = "rlplay.engine"


def _prefixed(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


def layer(module):
    """The layer of ``module`` (a dotted name): a name of :data:`LAYERS`,
    or ``"consumers"``."""
    best, found = -1, None
    for name, prefixes in LAYERS + [("consumers", CONSUMERS)]:
        for prefix in prefixes:
            if _prefixed(module, prefix) and len(prefix) > best:
                best, found = len(prefix), name
    return found


RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def allowed(source, target):
    """Whether layer ``source`` may import from layer ``target``."""
    if source == target:
        return True
    if source == "consumers":
        return target in CONSUMES
    if target == "consumers":
        return source in CONSUMED_BY
    return RANK[target] < RANK[source]


def modules(root):
    """``{dotted name: (path, is a package)}`` of every module under
    ``root`` (the directory ``rlplay``)."""
    root = Path(root)
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            found[".".join(parts[:-1])] = (path, True)
        else:
            found[".".join(parts)] = (path, False)
    return found


def _folder(name, mods):
    """The folder (package) that module ``name`` lives in: a package is
    its own folder."""
    if mods[name][1]:
        return name
    return name.rpartition(".")[0]


def _literal_names(tree, variable):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == variable
                for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def _exports(folder, mods, trees):
    tree = trees[folder]
    return _literal_names(tree, "__all__") | _literal_names(tree,
                                                            "__exports__")


def _imports(name, mods, tree):
    """``(line, target module, imported names or None, at top level)`` of
    every import of an rlplay module in ``tree``; a name that is a
    submodule is its own target (with no names)."""
    package = name if mods[name][1] else name.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in tree.body:  # imports under a top-level try/if count too
        if isinstance(node, (ast.Try, ast.If)):
            top |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        at_top = id(node) in top
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _prefixed(alias.name, "rlplay"):
                    yield node.lineno, alias.name, None, at_top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module
                                          else []))
            else:
                target = node.module or ""
            if not _prefixed(target, "rlplay"):
                continue
            names = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in mods:
                    yield node.lineno, sub, None, at_top
                else:
                    names.append(alias.name)
            if names:
                yield node.lineno, target, names, at_top


def _parse(mods):
    return {name: ast.parse(path.read_text(), str(path))
            for name, (path, _) in mods.items()}


def violations(root):
    """Every breach of the folder, private-name and layer rules in the
    tree at ``root`` (the directory ``rlplay``), as readable lines naming
    the file, the line and the import."""
    mods = modules(root)
    trees = _parse(mods)
    found = []
    for name, (path, _) in mods.items():
        source_layer = layer(name)
        source_folder = _folder(name, mods)
        where = f"{path.relative_to(Path(root).parent)}"
        for line, target, names, _ in _imports(name, mods, trees[name]):
            if target not in mods:
                found.append(f"{where}:{line}: imports {target}, which is "
                             f"no module of rlplay")
                continue
            shown = f"from {target} import {', '.join(names)}" \
                if names else f"import {target}"
            target_layer = layer(target)
            if not allowed(source_layer, target_layer):
                found.append(f"{where}:{line}: {shown}: the layer "
                             f"{source_layer!r} may not import from the "
                             f"layer {target_layer!r}")
            target_folder = _folder(target, mods)
            if target_folder == source_folder or _prefixed(
                    target_folder, source_folder) and names is None:
                continue
            if names is None:  # a module itself, across folders
                private = [p for p in target[len(target_folder):].split(".")
                           if p.startswith("_")]
                if private:
                    found.append(f"{where}:{line}: {shown}: a private "
                                 f"module across folders")
                continue
            bad = [n for n in names if n.startswith("_")]
            if bad:
                found.append(f"{where}:{line}: {shown}: the private "
                             f"name(s) {', '.join(bad)} across folders")
            private = [p for p in target[len(target_folder):].split(".")
                       if p.startswith("_")]
            if private:
                found.append(f"{where}:{line}: {shown}: from a private "
                             f"module across folders")
            if target_folder == ROOT_FOLDER or target_folder == "rlplay":
                continue  # the foundation: its public names
            exported = _exports(target_folder, mods, trees)
            missing = [n for n in names if n not in exported
                       and not n.startswith("_")]
            if missing:
                found.append(f"{where}:{line}: {shown}: "
                             f"{', '.join(missing)} not named by "
                             f"{target_folder}.__init__ (__all__ or "
                             f"__exports__)")
    return found


def cycles(root):
    """The cycles of the graph of module-level imports between the
    modules at ``root``: a list of cycles, each a list of module names."""
    mods = modules(root)
    trees = _parse(mods)
    graph = {name: sorted({target for _, target, _, top in _imports(
        name, mods, trees[name]) if top and target in mods and target != name
        and not _prefixed(name, target)}) for name in mods}
    # Tarjan's strongly connected components, iteratively
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _home(package, name, mods, trees, seen=()):
    """The module that defines ``name`` of ``package`` (following the
    package ``__init__``'s own imports), or ``package`` itself."""
    if package in seen or package not in trees:
        return package
    for _, target, names, top in _imports(package, mods, trees[package]):
        if top and names and name in names and target != package:
            if mods.get(target, (None, False))[1]:
                return _home(target, name, mods, trees, seen + (package,))
            return target
    return package


def depends(root, module):
    """The modules that ``module``'s module-level imports depend on,
    directly or not, each imported name followed to the module that
    defines it (so that importing ``Session`` from the ``workers`` package
    depends on ``workers._session``, not on everything the package's
    ``__init__`` imports)."""
    mods = modules(root)
    trees = _parse(mods)
    found, todo = set(), [module]
    while todo:
        name = todo.pop()
        for _, target, names, top in _imports(name, mods, trees[name]):
            if not top or target not in mods:
                continue
            homes = [target] if names is None or not mods[target][1] else \
                [_home(target, n, mods, trees) for n in names]
            for home in homes:
                if home not in found and home != module:
                    found.add(home)
                    todo.append(home)
    return found
