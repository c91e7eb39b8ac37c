"""Text from outside shown on a terminal, never obeyed by it.

A model's file name, an .npz key, a candidate name in a study, a signature name or a recipe's description
can hold a newline (a forged `error:` line or `[[steps]]` block), an escape sequence (clear the screen,
recolour, move the cursor, set the window title), a bidirectional override that reorders what is read,
or a lone surrogate from a non-UTF-8 file name that no terminal encoding can print. `escape` shows each
as a visible escape (`\\n`, `\\x1b`, `\\u202e`, `\\xff`) and leaves everything else, tabs and
non-ASCII letters included, as it is. It is applied where text is written to the terminal: the error line
and every rendered table or report line; line breaks the program itself writes are kept.
"""

from __future__ import annotations

import re

#: C0 and C1 controls (tab kept), DEL, bidi embeddings/overrides/isolates, line and paragraph separators,
#: and lone surrogates (a non-UTF-8 byte in a file name, as Python decodes it).
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _show(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the original byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: object) -> str:
    """`text` (str() of anything) with every control character, bidi override and lone surrogate shown."""
    return _UNSAFE.sub(_show, str(text))


#: A name that reads as itself: word characters (any script), dots, colons, slashes, brackets, @ # + -.
_PLAIN_NAME = re.compile(r"[\w.:/@#+\-\[\]]+")


def named(text: object, limit: int = 80) -> str:
    """A name from a file (a data key, a tensor, input, node or op name) as a message shows it: as it is when
    it is a plain name (`serving_default_x:0`, `conv1.weight`), else quoted and escaped like `repr`
    (`'x\\nerror: ...'`), so no name can end a line, forge one, or hide where it ends; cut to `limit`
    characters either way."""
    name = str(text)
    cut = name[:limit] + ("..." if len(name) > limit else "")
    return cut if _PLAIN_NAME.fullmatch(name) else repr(cut)


def escape_lines(text: str) -> str:
    """Each line of program-made text escaped, the line breaks between them kept."""
    return "\n".join(escape(line) for line in str(text).split("\n"))


#: Lines that carry a warning start with this word, so they read without colour too; on a colour
#: terminal (stdout a TTY, NO_COLOR unset) they are also red.
WARNING = "WARNING:"


def warning_style(text: str, color: bool | None = None) -> str:
    """Program-made text with its `WARNING:` lines (and their wrapped continuations, up to a blank line) in
    red when the terminal shows colour (`color`: force it on or off). Apply after `escape_lines` and `wrap`:
    the colour codes are the program's own."""
    import os
    import sys

    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    if not color:
        return text
    out, red = [], False
    for line in text.split("\n"):
        red = line.startswith(WARNING) or (red and bool(line.strip()))  # a wrapped warning: red to its end
        out.append(f"\x1b[31m{line}\x1b[0m" if red else line)
    return "\n".join(out)


#: Where a line that is too long continues: under the text after a list marker (`- `, `1. `), else four
#: columns in from an indented line, else at the start of the line (a paragraph).
_MARKER = re.compile(r"^(\s*)([-*] |\d+\. )?")


def width(default: int = 80) -> int:
    """The terminal's width in columns: $COLUMNS, else the terminal's own, else `default` (a pipe, a log)."""
    import shutil

    return max(40, shutil.get_terminal_size((default, 24)).columns)


def wrap(text: str, columns: int | None = None, hang: int | None = None) -> str:
    """Program-made text with every line longer than `columns` (default: the terminal's width) wrapped
    at spaces, continuing under its list marker or indented (or `hang` columns in). A word longer than a
    line is split, unless it is a file path (kept whole, to be copied: the terminal folds it)."""
    import textwrap

    columns = columns or width()
    out = []
    for line in str(text).split("\n"):
        if len(line) <= columns:
            out.append(line)
            continue
        m = _MARKER.match(line)
        indent, marker = m.group(1), m.group(2) or ""
        under = (indent + " " * len(marker) if marker else (indent + "    " if indent else ""))[: columns // 2]
        under = under if hang is None else " " * min(hang, columns // 2)
        lines = textwrap.wrap(line, columns, subsequent_indent=under, break_on_hyphens=False, break_long_words=False)
        out += [piece for w in lines for piece in _split_long(w, columns, under)] or [""]
    return "\n".join(out)


_PATH = re.compile(r"^[(\"'`]?[\w.~-]*(/[\w.+@%=,-]+)+/?[\"'`]?[.,:;)]*$")


def _split_long(line: str, columns: int, under: str) -> list[str]:
    """A wrapped line still too long holds one long word: split it, unless it is a path."""
    if len(line) <= columns or _PATH.match(line.split()[-1]):
        return [line]
    head, rest = line[:columns], line[columns:]
    room = max(1, columns - len(under))
    return [head] + [under + rest[i : i + room] for i in range(0, len(rest), room)]


def clip(text: str, limit: int, mark: str = " ...") -> str:
    """`text` shortened to at most `limit` characters at a word boundary, `mark` saying more was cut (a word
    longer than the whole limit is cut inside, with the mark)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    room = max(1, limit - len(mark))
    head = text[: room + 1]
    cut = head.rfind(" ")
    head = head[:cut] if cut > room // 2 else text[:room]
    return head.rstrip(" ,;:") + mark
