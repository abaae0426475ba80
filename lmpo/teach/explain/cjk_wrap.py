"""Line breaks for Chinese prose in the terminal.

rich wraps at spaces only and moves a whole space-delimited "word" to the next line when it does
not fit. In Chinese a "word" is a clause of dozens of characters, so rich broke lines at the one
ASCII space there was, inside `（G 个）` or `（ε 0.2）`, leaving `（G` at a line's end; and a no-break
space does not help (rich's words are split at every Unicode space). So the zh prose is broken
here, to the width rich will print it at: between any two Chinese characters, at spaces, never
inside a Latin word or a short parenthesis, never before closing punctuation.
"""

from __future__ import annotations

import re

from rich.cells import cell_len

GROUP_CELLS = 24
"""A parenthesis `（…）` up to this many columns is kept on one line."""
CLOSING = "，。；：、！？）」』》"
WIDE = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef"
LATIN = rf"[^\s{WIDE}]+"
ATOM = re.compile(rf"（[^（）\n]*）|{LATIN} [=<>≤≥] {LATIN}|[ \t]+|\n|[{WIDE}]|{LATIN}")
"""In order: a full-width parenthesis, `β = 0.1` (kept whole), spaces, a newline, one wide
character, a Latin word."""


def _atoms(text: str) -> list[str]:
    """Unbreakable pieces: a short full-width parenthesis, a run of spaces, a newline, one Chinese
    character (or full-width sign), a Latin word; closing punctuation joins the piece before it, an
    opening parenthesis the piece after it."""
    atoms: list[str] = []
    for match in ATOM.finditer(text):
        piece = match.group(0)
        if piece.startswith("（") and cell_len(piece) > GROUP_CELLS:  # too long to keep whole
            inner = _atoms(piece[1:-1]) or [""]
            atoms += ["（" + inner[0], *inner[1:]]
            piece = "）"
        if atoms and not piece.isspace() and (piece[0] in CLOSING or atoms[-1] == "（"):
            atoms[-1] += piece  # no line ends with an opening parenthesis or starts with a comma
        else:
            atoms.append(piece)
    return atoms


def wrap_cjk(text: str, width: int) -> str:
    """`text` with newlines so that no line is wider than `width` columns (a longer atom alone on
    its line excepted); spaces at a break are dropped."""
    lines: list[str] = []
    line, space = "", ""
    for atom in _atoms(text):
        if atom == "\n":
            lines.append(line)
            line, space = "", ""
        elif atom.isspace():
            space = atom if line else ""
        elif line and cell_len(line) + cell_len(space) + cell_len(atom) > width:
            lines.append(line)
            line, space = atom, ""
        else:
            line, space = line + space + atom, ""
    lines.append(line)
    return "\n".join(lines)
