"""A griffe extension for the API reference: rlplay's numpydoc docstrings
use a few reStructuredText constructs (they read well in ``help()``),
which this rewrites into the Markdown that mkdocstrings renders.

- Roles (``:func:`collect```, ``:class:`~rlplay.engine.Fragment```,
  ``:mod:`._states```) become optional cross-references: a link where the
  target is documented, the name in code where it is not (a private
  module, the standard library), never a warning.
- Literal blocks (``Protocol::`` and an indented block) become fenced
  code blocks, and the paragraph loses its second colon.
- Simple tables (columns under rows of ``=``) become Markdown tables,
  continuation lines joined into their row.
- Numpydoc entries that document several parameters at once
  (``capacity, device, pinned : ...``) become one entry per name, so that
  each shows its own default (griffe looks up the first name's alone, and
  showed the others as required).
- A module's constant gets the comment above it (``# seconds between
  two checks`` over ``POLL_INTERVAL = 0.1``; a run of constants under one
  comment shares it).

The namedtuples of rlplay are ``NamedTuple`` classes with docstrings of
their own, which a static reading sees.

Only the docstrings are rewritten, and only in memory, when mkdocstrings
loads the package.

A second extension, :class:`SpelledOut`, does for the rendered signatures
what ``rlplay.engine.rollout._base.spell_out`` does at run time for
``inspect.signature`` and ``help()``: a generator annotates its shared
keywords as ``**kwargs: Unpack[...]`` (one ``TypedDict``), which a static
reading shows as such, with the keywords of its Parameters section listed
as required; the module's ``spell_out(function, defined_by)`` call names
where they are defined, with their defaults, and the signature shows them
as keyword-only parameters there.
"""
import ast
import html
import re

import griffe

ROLE = re.compile(r":(?:py:)?(func|class|mod|meth|data|attr|exc|obj):"
                  r"`([^`]+)`")
# a numpydoc entry of several names, with or without a type
NAMES = re.compile(r"^(\w+(?:, \w+)+)((?: : .*)?)$")
HEADER = re.compile(r"^-{3,}$")
PARAMETER_SECTIONS = ("Parameters", "Other Parameters")
BORDER = re.compile(r"^ *=+( +=+)+ *$")
CONSTANT = re.compile(r"^[A-Z_][A-Z0-9_]* = ")


def _target(written, obj):
    """The identifier of a role's target, as written in ``obj``'s
    docstring (``~`` dropped, a leading dot resolved as a relative
    import, a bare name looked up in the module of ``obj``)."""
    name = written.lstrip("~")
    if name.startswith("."):
        module = obj if obj.is_module else obj.module
        package = module.path if module.is_package else module.path.rpartition(".")[0]
        dots = len(name) - len(name.lstrip("."))
        base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
        return f"{base}.{name.lstrip('.')}"
    if name.startswith("rlplay.") or name == "rlplay":
        return name
    scope = obj if (obj.is_module or obj.is_class) else obj.parent
    while scope is not None:
        head = name.split(".")[0]
        if head in scope.members or scope.is_module:
            return f"{scope.path}.{name}"
        scope = scope.parent
    return name


def _shown(written):
    name = written.lstrip(".")
    if written.startswith("~"):
        name = name.lstrip("~").rsplit(".", 1)[-1]
    return name


def roles(text, obj):
    def link(match):
        written = match.group(2)
        if "<" in written:  # :func:`title <target>`
            shown, _, written = written.partition("<")
            shown, written = shown.strip(), written.rstrip(">").strip()
        else:
            shown = _shown(written)
        identifier = html.escape(_target(written, obj), quote=True)
        return (f'<autoref identifier="{identifier}" optional>'
                f"<code>{html.escape(shown)}</code></autoref>")
    return ROLE.sub(link, text)


def _indent(line):
    return len(line) - len(line.lstrip(" "))


def literal_blocks(text):
    """``Protocol::`` and its indented block become ``Protocol:`` and a
    fenced block, dedented to the paragraph's indentation: fenced, a
    timeline's header over dashes (``learner`` over ``-------``) is not
    read as a numpydoc section (griffe reads none inside a fence)."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.rstrip().endswith("::"):
            out.append(line)
            continue
        out.append("" if line.strip() == "::" else line.rstrip()[:-1])
        base = _indent(line)
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j == len(lines) or _indent(lines[j]) <= base:
            continue  # no block follows
        end = j
        while end < len(lines) and (not lines[end].strip()
                                    or _indent(lines[end]) > base):
            end += 1
        while not lines[end - 1].strip():
            end -= 1
        block = lines[j:end]
        cut = min(_indent(b) for b in block if b.strip())
        fence = " " * base + "```"
        out.extend(["", fence + "text"]
                   + [" " * base + b[cut:] if b.strip() else "" for b in block]
                   + [fence])
        i = end
    return "\n".join(out)


def _cells(line, starts):
    bounds = list(starts[1:]) + [None]
    return [line[start:end].strip() for start, end in zip(starts, bounds)]


def _row(cells):
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def tables(text):
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if not BORDER.match(line):
            out.append(line)
            i += 1
            continue
        starts = [m.start() for m in re.finditer(r"=+", line)]
        rows, borders, j = [], 1, i + 1
        while j < len(lines) and borders < 3:
            if BORDER.match(lines[j]):
                borders += 1
                if borders == 2:
                    header = rows
                    rows = []
            elif lines[j].strip():
                cells = _cells(lines[j], starts)
                if rows and not cells[0]:
                    rows[-1] = [f"{a} {b}".strip()
                                for a, b in zip(rows[-1], cells)]
                else:
                    rows.append(cells)
            j += 1
        if borders < 3 or not header:  # not a table after all
            out.append(line)
            i += 1
            continue
        indent = " " * starts[0]
        out.append("")
        out.append(indent + _row(header[0]))
        out.append(indent + "|" + "---|" * len(starts))
        out.extend(indent + _row(cells) for cells in rows)
        out.append("")
        i = j
    return "\n".join(out)


def split_names(text):
    """One entry per name in the Parameters sections: ``a, b : int`` and
    its description become ``a : int`` and ``b : int``, each with the
    description."""
    lines, out, i, inside = text.split("\n"), [], 0, False
    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and HEADER.match(lines[i + 1]) and line.strip():
            inside = line.strip() in PARAMETER_SECTIONS
            out.extend(lines[i:i + 2])
            i += 2
            continue
        match = NAMES.match(line) if inside else None
        if match is None:
            out.append(line)
            i += 1
            continue
        j = i + 1
        while j < len(lines) and (not lines[j].strip()
                                  or lines[j].startswith(" ")):
            j += 1
        while j > i + 1 and not lines[j - 1].strip():
            j -= 1  # blank lines after the entry stay after it
        for name in match.group(1).split(", "):
            out.append(name + match.group(2))
            out.extend(lines[i + 1:j])
        i = j
    return "\n".join(out)


def rewrite(text, obj):
    return roles(tables(literal_blocks(split_names(text))), obj)


def _comment_above(lines, lineno):
    """The comment over line ``lineno`` (1-based) of a module, passing
    over the constants of a run, or ``None``."""
    i = lineno - 2
    while i >= 0 and CONSTANT.match(lines[i]):
        i -= 1
    comment = []
    while i >= 0 and lines[i].startswith("#"):
        comment.insert(0, lines[i].lstrip("#").strip())
        i -= 1
    return " ".join(comment) or None


class RstToMarkdown(griffe.Extension):
    """Rewrite each docstring once, when its object is loaded."""

    def on_module_members(self, *, node, mod, **kwargs):
        if not isinstance(node, ast.Module):
            return
        lines = mod.lines
        for statement in node.body:
            if (isinstance(statement, ast.Assign)
                    and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name)):
                name = statement.targets[0].id
                member = mod.members.get(name)
                if (member is not None and not member.is_alias
                        and member.docstring is None and name.isupper()):
                    comment = _comment_above(lines, statement.lineno)
                    if comment:
                        member.docstring = griffe.Docstring(
                            comment, lineno=statement.lineno - 1,
                            parent=member)

    def on_package(self, *, pkg, **kwargs):
        seen = set()

        def visit(obj):
            if id(obj) in seen or obj.is_alias:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj)
            for member in obj.members.values():
                if not member.is_alias:
                    visit(member)

        visit(pkg)


def _dotted(node):
    """``a.b.c`` of a Name/Attribute expression, or ``None``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _member(mod, dotted):
    """The object that ``dotted`` names in module ``mod`` (aliases
    followed)."""
    obj = mod
    for part in dotted.split("."):
        obj = obj.members[part]
        if obj.is_alias:
            obj = obj.final_target
    return obj


class SpelledOut(griffe.Extension):
    """Show a function's ``**kwargs`` as the keyword-only parameters of
    the callable that a module-level ``spell_out(function, defined_by)``
    names, with their defaults (as ``help()`` shows them)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def on_module_members(self, *, node, mod, **kwargs):
        if not isinstance(node, ast.Module):
            return
        for statement in node.body:
            call = getattr(statement, "value", None)
            if (isinstance(statement, ast.Expr) and isinstance(call, ast.Call)
                    and _dotted(call.func) == "spell_out"
                    and len(call.args) == 2):
                names = [_dotted(arg) for arg in call.args]
                if None not in names:
                    self.calls.append((mod, *names))

    def on_package(self, *, pkg, **kwargs):
        calls, self.calls = self.calls, []
        for mod, function, defined_by in calls:
            function = _member(mod, function)
            defined_by = _member(mod, defined_by)
            own = [p for p in function.parameters
                   if p.kind is not griffe.ParameterKind.var_keyword]
            names = {p.name for p in own}
            shared = [griffe.Parameter(p.name, annotation=p.annotation,
                                       kind=p.kind, default=p.default)
                      for p in defined_by.parameters
                      if p.kind is griffe.ParameterKind.keyword_only
                      and p.name not in names]
            function.parameters = griffe.Parameters(*own, *shared)
