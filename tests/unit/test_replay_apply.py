"""What applying a replayed proposal does on the running gate (gate/tools/replay/apply.py): each
class's reach at the budget held after it, with the reservations the gate keeps in force."""

from __future__ import annotations

from gate.backend.pool import short_of_default
from gate.core.admission import Admission, Capacity
from gate.tools.replay import ClassShare, scaled_apart, short_reach
from tests.unit.core_helpers import Cls

#: a trial's gate: the example's classes on a 2,048-token pool
LIVE = (ClassShare("interactive", 1024, 256), ClassShare("batch", 0, 512))


def test_the_reach_is_the_budget_less_the_others_reservations_in_force_on_the_ceiling() -> None:
    # the trial (slots of 512): backend.token_budget=1024 replayed as the ceiling, where R0 scaled
    # interactive's 1,024 to 512 (batch reached 512, a whole slot, and was admitted); applied under
    # the gate's 2,048, batch reaches 0 beside interactive's whole 1,024
    assert short_of_default(1024, 1024, 512, LIVE) == []
    (batch,) = short_of_default(1024, 2048, 512, LIVE)
    assert (batch.cls, batch.reach, batch.others, batch.at_ceiling) == ("batch", 0, (("interactive", 1024),), False)
    # as the admission core reaches it (its limit_tokens aside)
    core = Admission([Cls("interactive", 10, reserved_tokens=1024), Cls("batch", 1)], Capacity(4, 2048, 2048), budget=1024)
    assert core.class_reach("batch", 1024) == batch.reach
    # short at the ceiling too (the reservations alone): flagged, for the gate's log to leave to capacity_warnings
    big = (LIVE[0], ClassShare("batch", 0, 1100))
    assert short_of_default(1536, 2048, 2048, big)[0].at_ceiling and not short_of_default(1536, 2048, 2048, LIVE)[0].at_ceiling


def test_a_class_short_of_its_default_request_is_said_plainly() -> None:
    (said,) = short_reach(1024, 2048, 2048, LIVE)
    assert said == (
        "batch can reach 0 tokens at a budget of 1,024 held by hand (interactive reserves 1,024): its requests will be refused "
        "with token_budget_exceeded until the budget is raised"
    )
    assert short_reach(1537, 2048, 2048, LIVE) == []  # 513: 512 and a one-token prompt fit
    assert short_reach(1536, 2048, 2048, LIVE)[0].startswith("batch can reach 512 tokens")
    # a default that fills a slot needs the slot, no more (the gate lowers the injected default)
    assert short_reach(1536, 2048, 512, LIVE) == []
    assert "on gpu1" in short_reach(1024, 2048, 2048, LIVE, " on gpu1")[0]


def test_reservations_the_replay_scaled_and_the_gate_keeps_whole_are_said() -> None:
    said = scaled_apart(1024, LIVE, 2048, LIVE)
    assert (
        said
        == "On the replay's ceiling of 1,024, R0 put interactive 512 in force; the gate keeps interactive 1,024 in force on its ceiling of 2,048."
    )
    assert scaled_apart(4096, LIVE, 2048, LIVE) == ""  # unscaled on both
