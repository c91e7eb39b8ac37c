"""Parsing what a user (or a stranger) hands us, within bounds: JSON and TOML nesting, zip members.

Python's parsers recurse: 200,000 nested brackets in a Keras config.json or a recipe raise
RecursionError deep inside them, and 20,000 dotted keys take tomllib half a minute. A zip member can
claim any size and expand a megabyte into gigabytes. Each check here runs before the parser or the
decompressor, on the raw bytes, in time linear in their length; each refusal is one OptimizeError line.
"""

from __future__ import annotations

import json
import re
import tomllib
import zipfile

from optimize.core.errors import OptimizeError

MAX_JSON_DEPTH = 128  # a Keras functional model nested in another is ~20 deep; json recurses at ~1000
MAX_TOML_DEPTH = 32  # a recipe is 3 deep
MAX_TOML_KEY_DOTS = 64
MAX_ZIP_RATIO = 200  # deflate tops out near 1032:1; real weights and configs compress 1.1-20:1
RATIO_FLOOR = 16 * 2**20  # members smaller than this may compress as much as they like

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_TOML_NOISE = re.compile(
    r'"""[\s\S]*?"""|' r"'''[\s\S]*?'''|" r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|' r"'[^'\n]*'|" r"#[^\n]*"
)
_TOML_NUMBER = re.compile(r"\d[\d_]*\.\d")


def nesting(text: bytes, opens: bytes = b"[{", closes: bytes = b"]}") -> int:
    """The deepest bracket nesting in `text` (strings already removed)."""
    import numpy as np  # lazily: the pure core (choose, advice) stays numpy-free

    a = np.frombuffer(text, np.uint8)
    if not a.size:
        return 0
    step = np.zeros(a.size, np.int64)
    for c in opens:
        step[a == c] = 1
    for c in closes:
        step[a == c] = -1
    return int(np.cumsum(step).max(initial=0))


def json_depth(data: bytes) -> int:
    return nesting(_JSON_STRING.sub(b'""', data))


def loads_json(
    data: bytes | str,
    what: str,
    error: type[OptimizeError] = OptimizeError,
    fix: str | None = None,
    noun: str = "valid JSON",
):
    """`json.loads`, refusing nesting deeper than MAX_JSON_DEPTH before parsing, and any parse error,
    as one line: "<what> is not <noun> (<why>)."."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    fix = fix or "Save the file again with the tool that wrote it."
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise error(f"{what} is not {noun} (nested too deeply: more than {MAX_JSON_DEPTH} levels).", fix)
    try:
        return json.loads(raw)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise error(f"{what} is not {noun} (nested too deeply).", fix) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit number
        why = "a number with thousands of digits" if "digits" in str(e) else e.__class__.__name__
        raise error(f"{what} is not {noun} ({why}).", fix) from None


def _toml_shape(text: str) -> tuple[int, int]:
    """(bracket nesting, most dots in one key) of TOML text, strings, comments and numbers left out."""
    bare = _TOML_NOISE.sub("", text)
    depth = nesting(bare.encode("utf-8", "surrogatepass"))
    # Outside strings, comments and numbers (times included), a dot only joins the parts of a key.
    dots = max((_TOML_NUMBER.sub("", line).count(".") for line in bare.splitlines()), default=0)
    return depth, dots


def loads_toml(text: str, what: str, error: type[OptimizeError] = OptimizeError, fix: str | None = None) -> dict:
    """`tomllib.loads`, refusing deep nesting and long dotted keys before parsing."""
    fix = fix or "Fix the syntax; see recipes/README.md."
    depth, dots = _toml_shape(text)
    if depth > MAX_TOML_DEPTH or dots > MAX_TOML_KEY_DOTS:
        limits = f"more than {MAX_TOML_DEPTH} levels or {MAX_TOML_KEY_DOTS} dots in a key"
        raise error(f"{what}: nested too deeply ({limits}).", fix)
    try:
        return tomllib.loads(text)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise error(f"{what}: nested too deeply.", fix) from None
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise error(f"{what}: not valid TOML ({e}).", fix) from None


def check_member(
    info: zipfile.ZipInfo, limit: int, what: str | None = None, error: type[OptimizeError] = OptimizeError
) -> zipfile.ZipInfo:
    """A zip member whose declared size is within `limit` and whose compression ratio is one real
    files have; a bomb or a forged size is refused before a byte is decompressed. `what` (the archive's name)
    begins the error's line; without it the caller names the archive."""
    fix = "The file is corrupt or forged: save it again."
    at = f"{what}: " if what else ""
    if info.file_size > limit:
        raise error(f"{at}{info.filename!r} expands to {info.file_size:,} bytes (limit {limit:,}).", fix)
    if info.file_size > RATIO_FLOOR and info.file_size > MAX_ZIP_RATIO * max(info.compress_size, 1):
        raise error(
            f"{at}{info.filename!r} expands {info.file_size / max(info.compress_size, 1):,.0f}:1 "
            f"({info.file_size:,} bytes): a zip bomb.",
            fix,
        )
    return info


def read_member(
    z: zipfile.ZipFile, name: str, limit: int, what: str | None = None, error: type[OptimizeError] = OptimizeError
) -> bytes:
    """One zip member's bytes, checked (`check_member`) before reading and never more than declared.
    KeyError when there is no such member."""
    info = check_member(z.getinfo(name), limit, what, error)
    with z.open(info) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # pragma: no cover - zipfile stops at the declared size
        raise error(f"{what + ': ' if what else ''}{name!r} is larger than {limit:,} bytes.", "Save it again.")
    return data


def member_json(z: zipfile.ZipFile, name: str, limit: int, what: str, error: type[OptimizeError], fix: str, noun: str):
    """One zip member parsed as JSON: its size and compression ratio checked before it is read
    (`read_member`), its nesting before it is parsed (`loads_json`). KeyError when there is no such member."""
    return loads_json(read_member(z, name, limit, what, error), f"{what}: its {name}", error, fix, noun)
