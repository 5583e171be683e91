"""The router-mode planner (gate/core/model_plan.py): which model loads, which one makes room.

Examples for each rule, then properties over random fleets (500 examples each): the plan
keeps I1-I4, its victim is the one a small oracle picks, and a negative control (a plain
LRU that ignores what is in flight, as llama-server's own choice would if a request were
only queued in the gate) is caught by the same check.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.core.model_plan import STATUSES, ModelState, Plan, check_plan, plan, why_not_evictable

EXAMPLES = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def m(name: str, status: str = "unloaded", **kw) -> ModelState:
    return ModelState(name, status, **kw)  # type: ignore[arg-type]


# ---- rules ------------------------------------------------------------------------------


def test_nothing_to_do_without_demand() -> None:
    assert plan([m("a"), m("b", "loaded")], 1) == Plan()


def test_a_waiting_model_loads_in_a_free_place_without_eviction() -> None:
    p = plan([m("a", "loaded", idle_s=100), m("b", waiting=2, oldest_wait_s=0.5)], 2)
    assert (p.load, p.evict, p.why) == ("b", None, "2 waiting")


def test_models_max_zero_means_no_limit() -> None:
    models = [m(f"x{i}", "loaded") for i in range(9)] + [m("b", waiting=1)]
    assert plan(models, 0).load == "b"


def test_one_change_at_a_time() -> None:
    assert plan([m("a", "loading"), m("b", waiting=3)], 4) == Plan()
    assert plan([m("a", "evicting"), m("b", waiting=3)], 4) == Plan()


def test_full_places_evict_the_least_recently_used_idle_model() -> None:
    models = [
        m("a", "loaded", idle_s=30),
        m("b", "loaded", idle_s=90),
        m("c", waiting=1, oldest_wait_s=2),
    ]
    assert plan(models, 2) == Plan(load="c", evict="b", why="1 waiting")


def test_a_model_with_requests_in_flight_or_waiting_is_never_evicted() -> None:
    models = [m("a", "loaded", in_flight=1, idle_s=0), m("b", waiting=1)]
    p = plan(models, 1)
    assert p.load is None and p.evict is None
    assert p.blocked == "models_max 1: a busy (1 in flight)" and p.waiting_for == "b"
    models = [m("a", "loaded", waiting=2, idle_s=50), m("b", waiting=1, oldest_wait_s=9)]
    assert plan(models, 1).blocked == "models_max 1: a has 2 waiting"


def test_a_pinned_model_is_never_evicted_and_is_loaded_without_demand() -> None:
    assert plan([m("a", "loaded", pinned=True, idle_s=1e6), m("b", waiting=1)], 1).blocked == "models_max 1: a pinned"
    assert plan([m("a", pinned=True)], 1) == Plan(load="a", why="pinned")


def test_a_model_idle_for_less_than_its_cold_start_is_kept() -> None:
    models = [m("a", "loaded", idle_s=1.0, cold_start_s=4.0), m("b", waiting=1)]
    assert plan(models, 1).blocked == "models_max 1: a idle 1.0s < cold start 4.0s"
    models = [m("a", "loaded", idle_s=4.0, cold_start_s=4.0), m("b", waiting=1)]
    assert plan(models, 1).evict == "a"


def test_an_operator_load_skips_the_cold_start_rule_but_not_the_busy_one() -> None:
    models = [m("a", "loaded", idle_s=0.5, cold_start_s=4.0), m("b", asked=True)]
    assert plan(models, 1) == Plan(load="b", evict="a", why="operator")
    models = [m("a", "loaded", in_flight=1, idle_s=0), m("b", asked=True)]
    assert plan(models, 1).load is None


def test_order_operator_then_pinned_then_longest_wait() -> None:
    base = [m("w1", waiting=1, oldest_wait_s=5), m("w2", waiting=1, oldest_wait_s=9)]
    assert plan(base, 0).load == "w2"
    assert plan([*base, m("p", pinned=True)], 0).load == "p"
    assert plan([*base, m("p", pinned=True), m("o", asked=True)], 0).load == "o"


def test_above_the_limit_a_model_is_evicted_before_any_load() -> None:
    models = [m("a", "loaded", idle_s=9), m("b", "loaded", idle_s=5), m("c", waiting=1)]
    assert plan(models, 1) == Plan(evict="a", why="1 waiting", waiting_for="c")
    assert plan([m("b", "loaded", idle_s=5), m("c", waiting=1)], 1) == Plan(load="c", evict="b", why="1 waiting")


def test_a_sleeping_model_with_waiters_is_woken_in_place() -> None:
    models = [m("a", "sleeping", waiting=1), m("b", "loaded", in_flight=1)]
    assert plan(models, 2) == Plan(load="a", why="1 waiting", wake=True)
    assert plan([m("a", "sleeping")], 1) == Plan()  # no demand: it sleeps on


def test_failed_or_not_loadable_models_wait_for_may_load() -> None:
    assert plan([m("a", "failed", waiting=1, may_load=False)], 1) == Plan()
    assert plan([m("a", "failed", waiting=1, may_load=True)], 1).load == "a"
    assert plan([m("a", "missing", waiting=1)], 1) == Plan()


@pytest.mark.parametrize("status", ["loading", "unloaded", "failed", "missing", "evicting"])
def test_only_loaded_or_sleeping_models_can_be_victims(status: str) -> None:
    assert why_not_evictable(m("a", status)) == f"a {status}"


# ---- properties -------------------------------------------------------------------------

NAMES = ("a", "b", "c", "d", "e")


@st.composite
def fleets(draw: st.DrawFn) -> list[ModelState]:
    n = draw(st.integers(1, len(NAMES)))
    out = []
    for name in NAMES[:n]:
        out.append(
            ModelState(
                name,
                draw(st.sampled_from(STATUSES)),
                in_flight=draw(st.integers(0, 3)),
                waiting=draw(st.integers(0, 3)),
                oldest_wait_s=draw(st.floats(0, 30)),
                pinned=draw(st.booleans()),
                asked=draw(st.booleans()),
                may_load=draw(st.booleans()),
                idle_s=draw(st.one_of(st.just(math.inf), st.floats(0, 100))),
                cold_start_s=draw(st.floats(0, 10)),
            )
        )
    return out


def oracle_victim(models: list[ModelState], operator: bool) -> str | None:
    """The least recently used model that is loaded or sleeping, unpinned, with nothing in
    flight or waiting, and (unless an operator asked) idle for its cold start."""
    best = None
    for x in models:
        if x.status not in ("loaded", "sleeping") or x.pinned or x.in_flight or x.waiting:
            continue
        if not operator and x.idle_s < x.cold_start_s:
            continue
        if best is None or (x.idle_s, -ord(x.name[0])) > (best.idle_s, -ord(best.name[0])):
            best = x
    return None if best is None else best.name


@EXAMPLES
@given(fleets(), st.integers(0, 4), st.lists(st.sampled_from(["x1", "x2"]), max_size=2, unique=True))
def test_every_plan_keeps_the_invariants_and_picks_the_oracles_victim(models: list[ModelState], max_loaded: int, held: list[str]) -> None:
    p = plan(models, max_loaded, held)
    check_plan(models, max_loaded, p, held)
    if p.evict is not None:
        first = next(x for x in models if x.name == (p.load or p.waiting_for))
        assert p.evict == oracle_victim(models, first.asked)
    if p.load is None and p.evict is None and not p.blocked:
        changing = any(x.status in ("loading", "evicting") for x in models)
        assert changing or not any(x.wanted for x in models)


@EXAMPLES
@given(fleets(), st.integers(1, 4))
def test_a_blind_lru_is_caught_by_the_same_check(models: list[ModelState], max_loaded: int) -> None:
    """Negative control: evicting the LRU loaded model whatever it holds breaks I1 whenever
    that model is busy, waited for or pinned; the check must say so."""
    wanted = [x for x in models if x.wanted and x.status != "sleeping"]
    loaded = [x for x in models if x.status == "loaded"]
    running = sum(1 for x in models if x.running)
    if not wanted or not loaded or running < max_loaded or any(x.status in ("loading", "evicting") for x in models):
        return
    victim = max(loaded, key=lambda x: x.idle_s)
    blind = Plan(load=wanted[0].name, evict=victim.name)
    if victim.in_flight or victim.waiting or victim.pinned:
        with pytest.raises(AssertionError, match="I1"):
            check_plan(models, max_loaded, blind)


def test_models_the_router_runs_for_others_take_places_the_gate_never_plans_past() -> None:
    """A model loaded on the router straight (not in the gate's ``models``) takes a place: a
    trial's gate loaded tiny2 into what it took for a free place, and llama-server evicted the
    pinned tiny to make room (its own LRU choice)."""
    models = [m("tiny", "loaded", pinned=True, idle_s=50), m("tiny2", waiting=1)]
    assert plan(models, 2).load == "tiny2"  # without the held one: a free place
    p = plan(models, 2, held=["tiny3"])
    assert p.load is None and p.blocked == "models_max 2: tiny pinned, tiny3 loaded, not served by the gate"
    with pytest.raises(AssertionError, match="I3"):
        check_plan(models, 2, Plan(load="tiny2", why="1 waiting"), held=["tiny3"])  # negative control
    unpinned = [m("tiny", "loaded", idle_s=50), m("tiny2", waiting=1)]
    assert plan(unpinned, 2, held=["tiny3"]) == Plan(load="tiny2", evict="tiny", why="1 waiting")
