"""Errors the CLI and TUI turn into one clear line and an exit code.

Exit codes (the CLI contract): 0 done, 1 the operation failed, 2 bad input or usage,
3 a check found nothing feasible (``rtui check``).
"""

from __future__ import annotations


class RtuiError(Exception):
    """Base: a failure we understand. ``str(err)`` is the one line shown to the user."""

    exit_code = 1

    def __init__(self, message: str, *, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def __str__(self) -> str:
        if self.remedy:
            return f"{self.message} — {self.remedy}"
        return self.message


class UserError(RtuiError):
    """Bad input or usage: the user must change what they asked for (exit 2)."""

    exit_code = 2


class OperationError(RtuiError):
    """The operation itself failed: a process, a cloud call, a job (exit 1)."""

    exit_code = 1


class ApiUnreachable(OperationError):
    """A cluster's API gave no answer at all (refused, unresolved, or silent past the deadline): not a "no".

    A layer below that holds the cluster (``Layer.holds_above``) lets teardown go on without it: deleting
    the cluster deletes what the layers above made inside it."""


class TransientError(OperationError):
    """A failure worth retrying (throttling, a port race, a server still starting)."""


class NoCapacity(OperationError):
    """The provider had no capacity for the machines asked for in one zone (``az``); a target whose
    ``fail_over`` can move them elsewhere catches it by this type (AWS: InsufficientInstanceCapacity)."""

    def __init__(self, message: str, *, az: str, code: str = "no capacity", remedy: str | None = None) -> None:
        super().__init__(message, remedy=remedy)
        self.az = az
        self.code = code  # the provider's own name for it, shown in what moved
