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
    """A technique could not produce a candidate for this model; recorded as the candidate's error."""
