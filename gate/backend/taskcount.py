"""Token counts of a request's tasks, from the backend's own tokenizer.

One request llama-server runs as several tasks (see :mod:`gate.data.tasks`) is admitted for
all of them: its cost is the sum of every task's prompt plus each task's generation limit, and
its largest task must fit one slot. Each text piece is counted with ``POST /tokenize`` and the
flags the server uses for it (cached per text in the :class:`~gate.backend.tokens.TokenCounter`);
the look-ups of one request run concurrently. A piece the backend cannot count is estimated
(one token per 3 bytes, at least 1), and the whole count is then marked ``estimate``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gate.backend.tokens import TokenCount, TokenCounter
from gate.data.tasks import Piece, TaskPlan

__all__ = ["TaskCounts", "count_tasks", "estimate_piece"]


@dataclass(frozen=True, slots=True)
class TaskCounts:
    """Prompt tokens per task (before ``copies``), and where they came from."""

    per_task: tuple[int, ...]
    source: TokenCount

    @property
    def total(self) -> int:
        return sum(self.per_task)


def estimate_piece(piece: Piece) -> int:
    """The stand-in for a piece the backend did not count (as gate.backend.tokens estimates)."""
    return max(1, math.ceil(len(piece.text.encode("utf-8", "surrogatepass")) / 3))


async def count_tasks(
    counter: TokenCounter,
    base_url: str,
    plans: Sequence[TaskPlan],
    headers: Mapping[str, str] | None = None,
    *,
    model: str | None = None,
    ask: bool = True,
) -> TaskCounts:
    """Count every task of ``plans``; never raises for backend trouble.

    ``ask`` False (a router's model that is not loaded: asking would load it): all estimated.
    """
    unique = list(dict.fromkeys(p for plan in plans for p in plan.pieces))
    if ask:
        answers = await asyncio.gather(
            *(
                counter.count_text(base_url, p.text, add_special=p.add_special, parse_special=p.parse_special, headers=headers, model=model)
                for p in unique
            )
        )
    else:
        answers = [None] * len(unique)
    counts = {p: (n if n is not None else estimate_piece(p)) for p, n in zip(unique, answers)}
    exact = all(n is not None for n in answers) and not any(plan.estimate for plan in plans)
    per_task = tuple(plan.literal + sum(counts[p] for p in plan.pieces) for plan in plans)
    return TaskCounts(per_task, TokenCount(sum(per_task), "exact" if exact else "estimate", False))
