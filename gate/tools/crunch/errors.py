"""The errors ``tokengate crunch`` raises; each carries the exit code the CLI returns."""

from __future__ import annotations


class CrunchError(Exception):
    """A runtime failure (exit 1)."""

    exit_code = 1


class CrunchUnreachable(CrunchError):
    """The server could not be reached (exit 1)."""


class CrunchUsageError(CrunchError):
    """The arguments do not fit the server, e.g. no --ctx value fits its slots (exit 2)."""

    exit_code = 2
