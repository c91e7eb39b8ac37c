"""User-facing errors. The CLI turns each into one line and an exit code, never a traceback."""

from __future__ import annotations


class OptimizeError(Exception):
    """A problem with what the user gave us: bad path, corrupt model, wrong data, bad recipe.

    The message names the problem and the fix in one line. Exit code 2.
    """

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} {fix}".strip() if fix else problem)


class ModelError(OptimizeError):
    """The model file cannot be read, or is the wrong kind for the requested technique."""


class DataError(OptimizeError):
    """Data is missing, unreadable, or does not fit the model's input signature."""


class RecipeError(OptimizeError):
    """A recipe or its parameters are invalid (unknown key, value out of range, unknown technique)."""


class StudyError(OptimizeError):
    """A study file is unreadable, from another version, or inconsistent."""


class GoalsNotMet(OptimizeError):
    """The run worked, but no candidate meets the goals. Exit code 1, so CI can gate on it."""

    exit_code = 1


class TechniqueFailed(Exception):
    """A technique could not produce a candidate for this model; recorded as the candidate's error.

    The message is one line; `detail` keeps the full text (converter logs, ...) for the record.
    """

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") else word


def _model_at(model, loc) -> object:
    """The pydantic model class that owns the field at `loc` (for listing its allowed keys)."""
    import typing

    def models_in(annotation):
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            yield annotation
        for arg in typing.get_args(annotation):
            yield from models_in(arg)

    for seg in loc:
        if isinstance(seg, int) or model is None:
            continue
        field = getattr(model, "model_fields", {}).get(seg)
        model = next(models_in(field.annotation), None) if field is not None else None
    return model


def _label(root: str, loc) -> str:
    """`steps.0.technique` -> `step 1.technique`: lists are counted from 1, as a user counts them."""
    parts = [root] if root else []
    for seg in loc:
        if isinstance(seg, int) and parts:
            parts[-1] = f"{_singular(parts[-1])} {seg + 1}"
        else:
            parts.append(str(seg))
    return ".".join(parts)


def _public_fields(model) -> list[str]:
    """The keys a user may write: a model's fields, less those set internally (`exclude=True`)."""
    return [k for k, f in getattr(model, "model_fields", {}).items() if not f.exclude]


def from_validation(
    e, model, *, where: str = "", root: str = "", kind: type[OptimizeError] = OptimizeError, fix: str | None = None
) -> OptimizeError:
    """The one translation of a pydantic ValidationError into a one-line OptimizeError.

    `model` is the class that was validated (its fields name the allowed keys), `where` prefixes the
    line (a file name), `root` names what was validated (a technique), `fix` is the default advice.
    Nested locations read as `step 2: prune.target_sparsity`; unknown keys list the allowed ones.
    """
    err = e.errors()[0]
    loc = tuple(err.get("loc", ()))
    kind_ = err.get("type", "")
    if kind_ == "extra_forbidden" and loc:
        owner = _model_at(model, loc[:-1])
        label = _label(root, loc[:-1])
        allowed = ", ".join(_public_fields(owner))
        head = f"{label}: unknown key {loc[-1]!r}." if label else f"unknown key {loc[-1]!r}."
        return kind(f"{where}{head}", f"Allowed keys: {allowed}." if allowed else fix)
    label = _label(root, loc)
    at = f"{label}: " if label else ""
    if kind_ == "value_error":
        msg = str(err.get("ctx", {}).get("error") or err.get("msg", "")).removeprefix("Value error, ")
        return kind(f"{where}{at}{msg}".rstrip(), None if msg.rstrip().endswith(".") and fix is None else fix)
    if kind_ in ("enum", "literal_error"):
        expected = str(err.get("ctx", {}).get("expected", "")).replace("'", "")
        return kind(f"{where}{at}{err.get('input')!r} is not allowed.", f"Allowed: {expected}." if expected else fix)
    if kind_ == "missing":
        return kind(f"{where}{at}missing.", fix)
    got = err.get("input")
    shown = repr(got) if not isinstance(got, dict | list) else type(got).__name__
    return kind(f"{where}{at}{err.get('msg', 'invalid')} (got {shown[:80]}).", fix)


class NothingWorked(OptimizeError):
    """The run finished, but every candidate failed. Exit code 1, with the causes."""

    exit_code = 1


#: The line a framework wraps a model's own exception in (Keras: "Exception encountered when calling
#: Lambda.call()."): what went wrong is the line after it.
_WRAPPED = ("Exception encountered when calling",)


def reason(e: BaseException, limit: int = 300) -> str:
    """An exception's own message in one line: its first line, or, under a framework's wrapper line, the first
    line of what it wraps; and, where that says less than the first exception in the chain (Keras reports
    "could not infer the shape" for a lambda that raised NameError), that exception too."""
    import re

    def first(exc: BaseException) -> str:
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in str(exc).splitlines()]
        lines = [ln for ln in lines if ln]
        if lines and lines[0].startswith(_WRAPPED) and len(lines) > 1:
            return lines[1]
        return lines[0] if lines else type(exc).__name__

    said = first(e)
    root = e
    while (root.__cause__ or root.__context__) is not None and root is not (root.__cause__ or root.__context__):
        root = root.__cause__ or root.__context__
    if root is not e and first(root) not in said:
        said += f" (raised by {type(root).__name__}: {first(root)})"
    return said[:limit]
