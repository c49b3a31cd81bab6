"""A griffe extension for the API reference: rlplay's numpydoc docstrings
use a few reStructuredText constructs (they read well in ``help()``),
which this rewrites into the Markdown that mkdocstrings renders.

- Roles (``:func:`collect```, ``:class:`~rlplay.engine.Fragment```,
  ``:mod:`._states```) become optional cross-references: a link where the
  target is documented, the name in code where it is not (a private
  module, the standard library), never a warning.
- Literal blocks (``Protocol::`` and an indented block) keep the block,
  which Markdown shows as code, and lose the second colon.
- Simple tables (columns under rows of ``=``) become Markdown tables,
  continuation lines joined into their row.
- A namedtuple documented by assignment (``Fragment.__doc__ = "..."``,
  which a static reading does not see) gets that docstring, and a
  module's constant the comment above it (``# seconds between two
  checks`` over ``POLL_INTERVAL = 0.1``; a run of constants under one
  comment shares it).

Only the docstrings are rewritten, and only in memory, when mkdocstrings
loads the package.
"""
import ast
import html
import re

import griffe

ROLE = re.compile(r":(?:py:)?(func|class|mod|meth|data|attr|exc|obj):"
                  r"`([^`]+)`")
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


def literal_blocks(text):
    lines = []
    for line in text.split("\n"):
        if line.strip() == "::":
            line = ""
        elif line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]
        lines.append(line)
    return "\n".join(lines)


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


def rewrite(text, obj):
    return roles(tables(literal_blocks(text)), obj)


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
        for statement in node.body:
            if not (isinstance(statement, ast.Assign)
                    and len(statement.targets) == 1):
                continue
            target, value = statement.targets[0], statement.value
            if (isinstance(target, ast.Attribute) and target.attr == "__doc__"
                    and isinstance(target.value, ast.Name)
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                    and target.value.id in mod.members
                    and not mod.members[target.value.id].is_alias):
                owner = mod.members[target.value.id]
                owner.docstring = griffe.Docstring(
                    ast.get_docstring(ast.Module(body=[ast.Expr(value)],
                                                 type_ignores=[])),
                    lineno=value.lineno, endlineno=value.end_lineno,
                    parent=owner)

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
