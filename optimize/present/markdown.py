"""Text from a study made inert in Markdown: shown as written in any viewer, never a link, an image or HTML.

A study's strings come from outside (a model's file and tensor names, a converter's message quoting them, a
study someone else wrote): `[click](javascript:...)`, `![x](https://tracker/p.png)`, `<img onerror=...>` or a
bare `www.example.com` in a name would be live in report.md on GitHub, in an IDE's preview or a static-site
generator. Names go in code spans (`code`), where no viewer reads links, autolinks or HTML; free text (`text`:
reasons, notes, errors) has the characters that make links, emphasis, code and tables backslash-escaped and
`<`, `>`, `&` written as entities (Python-Markdown, unlike CommonMark, passes `\\<` through as HTML), and any
word a viewer could turn into a link (a URL scheme, `www.`, an address with `@`) set as code. Control
characters are shown escaped (`core.shown`), and a line break becomes a space: one cell stays one cell.
"""

from __future__ import annotations

import re

from optimize.core.shown import escape

_SPECIAL = re.compile(r"([\\`*_\[\]|])")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
#: A word a viewer may link by itself (GFM's extended autolinks, mistune's url plugin, linkify): a scheme
#: followed by more (`javascript:alert`, `https://`), `www.`, or an address with `@`.
_LINKISH = re.compile(r"(?i)(?<![a-z0-9])[a-z][a-z0-9+.-]*:\S|www\.|@")


def _flat(value: object) -> str:
    return escape(str(value).replace("\r\n", " ").replace("\n", " ").replace("\r", " "))


def code(value: object, cell: bool = True) -> str:
    """`value` as one code span: a delimiter longer than any run of backticks in it, padded when it starts or
    ends with one; `cell`: a pipe escaped for a table (GFM reads `\\|` in a cell's code span as `|`)."""
    body = _flat(value)
    if cell:
        body = body.replace("|", "\\|")
    if not body:
        return ""
    ticks = "`" * (max((len(r) for r in re.findall("`+", body)), default=0) + 1)
    pad = " " if body[0] in "` " or body[-1] in "` " else ""
    return f"{ticks}{pad}{body}{pad}{ticks}"


def _word(word: str) -> str:
    if _LINKISH.search(word):
        return code(word)
    word = _SPECIAL.sub(r"\\\1", word)
    return "".join(_ENTITIES.get(c, c) for c in word)


def text(value: object) -> str:
    """Free text (a reason, a note, an error) for a table cell or a list item: read as written, nothing live."""
    return "".join(_word(w) if not w.isspace() else w for w in re.split(r"(\s+)", _flat(value)))


def fence(body: str) -> str:
    """A fence for a code block holding `body`: longer than any run of backticks in it, so it cannot end early."""
    return "`" * max(3, max((len(r) for r in re.findall("`+", body)), default=0) + 1)
