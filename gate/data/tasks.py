"""The tasks llama-server runs for one request, as text pieces to count (plain data).

Built by :mod:`gate.http.apis.tasks` (which knows each API's body), counted by
:mod:`gate.backend.taskcount` (which asks the backend's ``/tokenize``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Piece:
    """One text the server tokenizes, with its flags (as ``/tokenize`` takes them)."""

    text: str
    add_special: bool
    parse_special: bool


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """One task: pieces to count, plus tokens known without asking (ids, special tokens).

    ``estimate``: part of it cannot be counted (media): the count is a lower bound estimate.
    """

    pieces: tuple[Piece, ...] = ()
    literal: int = 0
    estimate: bool = False
