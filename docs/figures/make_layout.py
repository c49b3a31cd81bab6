"""Draw ``layout.svg`` beside this script: the rows and columns of a
fragment of ``T = 6`` steps of ``B = 3`` envs, where row 0 and row T come
from, where ``fin``, ``final`` and ``acted`` sit when an episode ends and
at a lost call. The facts are those of ``rlplay/engine/core/layout.py``;
tests/test_docs.py checks that the committed figure is this script's.

    python docs/figures/make_layout.py
"""
from pathlib import Path
from xml.sax.saxutils import escape

T = 6
LEFT, TOP, ROW_H, COL_W, GAP = 92, 96, 70, 222, 8
WIDTH = LEFT + 3 * COL_W + 16
GRID_BOTTOM = TOP + (T + 1) * ROW_H
HEIGHT = GRID_BOTTOM + 330
WHITE, GREY, ORANGE, BLUE = "#ffffff", "#e3e3e3", "#ffd9a8", "#dbe6ff"
OK, NO = "\u2713", "\u2717"


def cells():
    """``{(row, column): (fill, [lines])}`` of the drawing."""
    out = {}
    for t in range(T + 1):
        acted = f"acted {NO} (row 0)" if t == 0 else f"acted {OK}"
        fill = GREY if t == 0 else WHITE
        out[t, 0] = (fill, [f"obs x{t}, stepno {5 + t}", acted])
        out[t, 1] = (fill, [f"obs x{t}, stepno {t + 2}", acted])
        out[t, 2] = (fill, [f"obs x{t}, stepno {t + 7}", acted])
    out[3, 1] = (ORANGE, [f"fin {OK}: obs is the next",
                          "episode's reset (stepno 0);",
                          "final: the true last obs;",
                          f"stats.ret, .length; acted {OK}"])
    for t in range(4, T + 1):
        out[t, 1] = (WHITE, [f"obs x{t}, stepno {t - 3}", f"acted {OK}"])
    out[2, 2] = (ORANGE, [f"fin {OK}, truncated {OK};",
                          "obs = final: the true last",
                          "obs (the reset not known yet);",
                          f"stats; acted {OK}"])
    out[3, 2] = (GREY, [f"lost call: acted {NO}, fin {OK};",
                        "obs: the reset obs, rew 0,",
                        "stepno 0; its act (chosen",
                        "at row 2) was never executed"])
    for t in range(4, T + 1):
        out[t, 2] = (WHITE, [f"obs x{t}, stepno {t - 3}", f"acted {OK}"])
    return out


def text(x, y, words, size=13, anchor="start", weight="normal"):
    return (f'<text x="{x}" y="{y}" font-size="{size}" '
            f'text-anchor="{anchor}" font-weight="{weight}">'
            f"{escape(words)}</text>")


def box(x, y, width, height, fill, stroke="#8a8a8a"):
    return (f'<rect x="{x}" y="{y}" width="{width}" height="{height}" '
            f'rx="5" fill="{fill}" stroke="{stroke}"/>')


def svg():
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#333"/></marker></defs>',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        text(12, 24, "A fragment: rows 0..T are time, columns 0..B-1 are "
             "envs (T = 6, B = 3)", 16, weight="bold"),
        text(LEFT + 1.5 * COL_W, 52, "B columns: one per env (n_envs)", 13,
             "middle"),
    ]
    heads = ["env 0: an episode goes on", "env 1: terminates at row 3",
             "env 2: a lost call at row 3"]
    for j, head in enumerate(heads):
        parts.append(text(LEFT + j * COL_W + COL_W / 2, TOP - 14, head, 13,
                          "middle", "bold"))
    for t in range(T + 1):
        y = TOP + t * ROW_H
        label = "row 0" if t == 0 else ("row T" if t == T else f"row {t}")
        if t in (0, T):
            parts.append(box(8, y + GAP / 2, LEFT - 16, ROW_H - GAP, BLUE,
                             "#7b93c9"))
        parts.append(text(LEFT - 14, y + ROW_H / 2 + 5, label, 13, "end",
                          "bold"))
    for (t, j), (fill, lines) in sorted(cells().items()):
        x, y = LEFT + j * COL_W, TOP + t * ROW_H
        parts.append(box(x + GAP / 2, y + GAP / 2, COL_W - GAP,
                         ROW_H - GAP, fill))
        top = y + ROW_H / 2 - 7.5 * (len(lines) - 1) + 4
        for k, line in enumerate(lines):
            parts.append(text(x + 12, top + 15 * k, line, 12))
    # a step, between rows 4 and 5 of env 0
    x = LEFT + COL_W - 30
    y0, y1 = TOP + 4 * ROW_H + ROW_H - 14, TOP + 5 * ROW_H + 14
    parts.append(f'<line x1="{x}" y1="{y0}" x2="{x}" y2="{y1}" '
                 f'stroke="#333" stroke-width="1.5" '
                 f'marker-end="url(#arrow)"/>')
    parts.append(text(x - 6, (y0 + y1) / 2 + 4, "a4: r5, x5", 11, "end"))
    # what a row holds, and the rows that join fragments
    notes = [
        ("Row t holds x_t and what led to it:", "bold"),
        ("act[t] = a_{t-1}, the action that led here; rew[t] = r_t, its "
         "reward;", ""),
        ("fin[t]: that step ended an episode; truncated[t]: by a time "
         "limit;", ""),
        ("final[t]: the observation that step produced (before a reset);",
         ""),
        ("acted[t]: an executed action led here; actor[t]: the actor's "
         "info;", ""),
        ("env[t] (T rows): the info of the step into row t + 1.", ""),
        ("Row 0 = row T of the previous fragment (the first fragment: the",
         ""),
        ("reset, fin true, act the action space's placeholder); row T = "
         "row 0", ""),
        ("of the next fragment, its actor[T] from a virtual lookahead call.",
         ""),
    ]
    y = GRID_BOTTOM + 28
    for k, (line, weight) in enumerate(notes):
        parts.append(text(12, y + 19 * k, line, 13, weight=weight or
                          "normal"))
    y = GRID_BOTTOM + 28 + 19 * len(notes) + 18
    for k, (fill, words) in enumerate([
            (WHITE, "a transition: an executed action led to this row"),
            (ORANGE, "an episode ended in the step into this row (fin)"),
            (GREY, "no transition (acted false): row 0, a lost call, a "
                   "frozen row, an absent agent"),
            (BLUE, "the rows that join consecutive fragments of the same "
                   "envs")]):
        parts.append(box(12, y + 24 * k - 13, 26, 17, fill))
        parts.append(text(50, y + 24 * k, words, 13))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    (Path(__file__).resolve().parent / "layout.svg").write_text(svg())
