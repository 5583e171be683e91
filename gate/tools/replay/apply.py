"""What applying a replayed proposal does to the running gate that the replay did not run.

The review's what-if (console/screens/whatif.py) applies a proposal's ``backend.token_budget``
as a budget set by hand, the controller frozen there, under the gate's own ceiling; the replay
took it as the pool's ceiling. The reservations in force (R0, gate/core/admission.py) are a
share of the ceiling, so the two differ exactly where it matters: a trial's
``backend.token_budget=1024`` replayed on a ceiling of 1,024, where R0 scaled interactive's
1,024 to 512 and batch was admitted; applied under the gate's ceiling of 2,048, interactive's
1,024 stayed in force, batch could reach 0 tokens, and every batch request was refused 429
token_budget_exceeded, with nothing said in the confirmation. Pure: plain values in (the
console's snapshot, the proposal's thresholds), words out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gate.core.admission import reservations_in_force


@dataclass(frozen=True, slots=True)
class ClassShare:
    """A class as the reach is judged: its configured reservation and its default request."""

    name: str
    reserved_tokens: int
    default_max_tokens: int


def short_reach(budget: int, ceiling: int, slot_context: int | None, classes: Sequence[ClassShare], where: str = "") -> list[str]:
    """Each class that cannot start its default request at `budget` held by hand on a backend of
    `ceiling` (`short_of_default`, the gate's own judgement of a held budget), in the
    confirmation's words: "batch can reach 0 tokens at a budget of 1,024 held by hand
    (interactive reserves 1,024): its requests will be refused with token_budget_exceeded until
    the budget is raised". `where`: " on NAME" when the gate has several backends."""
    from gate.backend.pool import short_of_default  # as report.py's capacity warnings: only when asked

    out = []
    for s in short_of_default(budget, ceiling, slot_context, classes):
        held = f" ({', '.join(f'{name} reserves {n:,}' for name, n in s.others)})" if s.others else ""
        out.append(
            f"{s.cls} can reach {max(0, s.reach):,} tokens at a budget of {budget:,} held by hand{where}{held}: its requests "
            "will be refused with token_budget_exceeded until the budget is raised"
        )
    return out


def scaled_apart(replayed_ceiling: int, replayed: Sequence[ClassShare], ceiling: int, live: Sequence[ClassShare], where: str = "") -> str:
    """What the confirmation says when the reservations the replay ran (R0 on its ceiling, the
    proposed ``backend.token_budget``) are not the ones the gate keeps in force (on its own
    ceiling, which the apply does not change); "" when they are the same."""
    ran = {k: v for k, v in reservations_in_force(replayed, replayed_ceiling).items() if v}
    kept = {k: v for k, v in reservations_in_force(live, ceiling).items() if v}
    if ran == kept:
        return ""

    def said(shares: dict[str, int]) -> str:
        return ", ".join(f"{name} {n:,}" for name, n in shares.items()) or "none"

    return (
        f"On the replay's ceiling of {replayed_ceiling:,}, R0 put {said(ran)} in force; the gate keeps {said(kept)} in force "
        f"on its ceiling of {ceiling:,}{where}."
    )
