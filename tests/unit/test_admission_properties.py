"""Property tests of the pure admission core over random operation sequences.

Each property runs at least 500 examples (DESIGN.md section 7; issue 2).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from itertools import count

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.core.admission import (
    RESERVED_SHARE_MAX,
    Admission,
    Admit,
    Capacity,
    Queue,
    Refuse,
    TenantPolicy,
    check_invariants,
    reservations_in_force,
)
from gate.core.ledger import Request
from gate.core.queueing import DEFAULT_QUANTUM, ClassQueue
from tests.unit.core_helpers import Cls

EXAMPLES = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CLASSES = ("hi", "mid", "lo")
TENANTS = ("a", "b", "c")

arrive = st.tuples(
    st.just("arrive"),
    st.sampled_from(CLASSES),
    st.sampled_from(TENANTS),
    st.integers(1, 600),  # prompt tokens
    st.integers(1, 600),  # max_tokens
)
ops = st.one_of(
    arrive,
    arrive,  # arrivals twice as likely, so queues fill
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("release_again"), st.integers(0, 50)),
    st.tuples(st.just("first_token"), st.integers(0, 50)),
    st.tuples(st.just("budget"), st.integers(100, 3000)),
    st.tuples(st.just("pause"), st.sampled_from(CLASSES)),
    st.tuples(st.just("resume"), st.sampled_from(CLASSES)),
    st.tuples(st.just("drain"), st.sampled_from(CLASSES)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("tick"), st.floats(0.0, 8.0)),
    # a request admitted on a bound of its prompt, settled to its count (gate: forward beside
    # the count): smaller keeps it (L7), larger takes it back; or taken back outright
    st.tuples(st.just("settle"), st.integers(0, 50), st.integers(-300, 300)),
    st.tuples(st.just("withdraw"), st.integers(0, 50)),
)


@st.composite
def setups(draw):
    """Random class shares that satisfy config validation (reservations fit the budget)."""
    ceiling = draw(st.integers(1000, 4000))
    reserved = [draw(st.integers(0, ceiling // 4)) for _ in CLASSES]  # past half the ceiling in all at times (R0)
    classes = []
    for (name, prio), res in zip(zip(CLASSES, (30, 20, 10)), reserved):
        limit = draw(st.one_of(st.none(), st.integers(max(res, 1), ceiling)))
        classes.append(
            Cls(
                name,
                prio,
                reserved_tokens=res,
                limit_tokens=limit,
                queue_depth=draw(st.integers(1, 6)),
                queue_timeout_s=draw(st.floats(0.5, 20.0)),
            )
        )
    quotas = {
        t: TenantPolicy(
            weight=draw(st.sampled_from([0.5, 1.0, 3.0])), max_tokens_in_flight=draw(st.one_of(st.none(), st.integers(200, 2000)))
        )
        for t in TENANTS
    }
    capacity = Capacity(
        slots=draw(st.integers(1, 4)),
        slot_context=draw(st.integers(300, ceiling)),
        ceiling=ceiling,
        max_prefill_tokens=draw(st.one_of(st.none(), st.integers(600, 2000))),
    )
    return classes, quotas, capacity


class Run:
    """Drives an Admission through ops and records every request's fate."""

    def __init__(self, classes, quotas, capacity):
        self.adm = Admission(classes, capacity, tenant_policy=lambda t: quotas.get(t, TenantPolicy()))
        self.timeouts = {c.name: c.queue_timeout_s for c in classes}
        self.now = 0.0
        self.ids = count()
        self.fates: Counter[str] = Counter()  # request id -> number of endings
        self.released: Counter[str] = Counter()
        self.admitted: list[str] = []

    def held(self) -> list[str]:
        return [r.request.id for r in self.adm.ledger]

    def waiting(self) -> list[str]:
        return [w.request.id for c in self.adm.class_names for w in self.adm.queue(c)]

    def on_admit(self, admits: list[Admit], from_queue: bool) -> None:
        if admits:
            # Property: in-flight never exceeds the budget at admission time.
            assert self.adm.ledger.in_flight <= self.adm.budget
        for a in admits:
            self.admitted.append(a.request.id)
            if from_queue:
                # Property: nothing is dispatched after its deadline.
                assert a.at < a.request.arrival + self.timeouts[a.request.cls]

    def apply(self, op) -> None:
        kind = op[0]
        adm = self.adm
        if kind == "arrive":
            _, cls, tenant, prompt, max_tokens = op
            r = Request(f"r{next(self.ids)}", cls, tenant, prompt, max_tokens, self.now)
            decision = adm.offer(r, self.now)
            if isinstance(decision, Admit):
                self.on_admit([decision], from_queue=False)
            elif isinstance(decision, Refuse):
                self.fates[r.id] += 1
                if decision.retry_after_s is not None:
                    assert 1.0 <= decision.retry_after_s <= 120.0
            else:
                assert isinstance(decision, Queue)
        elif kind == "release" and self.held():
            rid = self.held()[op[1] % len(self.held())]
            assert adm.release(rid, self.now) is not None
            self.released[rid] += 1
            self.fates[rid] += 1
            self.on_admit(list(adm.advance(self.now).admitted), from_queue=True)
        elif kind == "release_again" and self.released:
            rid = sorted(self.released)[op[1] % len(self.released)]
            assert adm.release(rid, self.now) is None
        elif kind == "first_token" and self.held():
            adm.first_token(self.held()[op[1] % len(self.held())])
        elif kind == "budget":
            adm.set_budget(op[1])
            self.on_admit(list(adm.advance(self.now).admitted), from_queue=True)
        elif kind == "pause":
            adm.pause(op[1])
        elif kind == "resume":
            adm.resume(op[1])
            self.on_admit(list(adm.advance(self.now).admitted), from_queue=True)
        elif kind == "drain":
            for refusal in adm.drain(op[1], self.now):
                self.fates[refusal.request.id] += 1
        elif kind == "cancel" and self.waiting():
            rid = self.waiting()[op[1] % len(self.waiting())]
            assert adm.cancel(rid) is not None
            self.fates[rid] += 1
        elif kind == "settle" and self.held():
            res = list(adm.ledger)[op[1] % len(self.held())]
            old = res.request
            counted = dataclasses.replace(old, prompt_tokens=max(0, old.prompt_tokens + op[2]))
            before = (adm.ledger.in_flight, adm.ledger.slots)
            kept = adm.settle(counted)
            if counted.prompt_tokens <= old.prompt_tokens:
                assert kept  # no larger: always settled
            if kept:
                now_held = adm.ledger.get(old.id)
                assert now_held is not None and now_held.request == counted and now_held.admitted_at == res.admitted_at
                assert adm.ledger.in_flight == before[0] + (counted.cost - old.cost) and adm.ledger.slots == before[1]
                if counted.cost > old.cost:  # grown where it stood: only if it fit there
                    assert adm.ledger.in_flight <= adm.effective_budget and adm.ledger.slots <= adm.capacity.slots
            else:
                assert adm.ledger.get(old.id) == res  # nothing changed: the shell withdraws it
                assert adm.withdraw(old.id) is not None and old.id not in adm.ledger
                self.released[old.id] += 1
                self.fates[old.id] += 1
            self.on_admit(list(adm.advance(self.now).admitted), from_queue=True)
        elif kind == "withdraw" and self.held():
            rid = self.held()[op[1] % len(self.held())]
            assert adm.withdraw(rid) is not None
            self.released[rid] += 1
            self.fates[rid] += 1
            self.on_admit(list(adm.advance(self.now).admitted), from_queue=True)
        elif kind == "tick":
            self.now += op[1]
            step = adm.advance(self.now)
            for refusal in step.expired:
                self.fates[refusal.request.id] += 1
            self.on_admit(list(step.admitted), from_queue=True)
        check_invariants(adm)

    def finish(self) -> None:
        """Release everything, drain everything: every request must end exactly once."""
        for cls in self.adm.class_names:
            self.adm.resume(cls)
            for refusal in self.adm.drain(cls, self.now):
                self.fates[refusal.request.id] += 1
        for rid in self.held():
            self.adm.release(rid, self.now)
            self.released[rid] += 1
            self.fates[rid] += 1
        assert self.adm.ledger.in_flight == 0
        assert self.adm.ledger.prefilling == 0
        assert self.adm.ledger.by_class == {} and self.adm.ledger.by_tenant == {}
        assert all(self.released[rid] == 1 for rid in self.admitted)
        assert set(self.fates.values()) <= {1}
        assert len(self.fates) == next(self.ids)
        check_invariants(self.adm)


@EXAMPLES
@given(setup=setups(), seq=st.lists(ops, max_size=60))
def test_ledger_budget_depth_deadlines_and_exactly_once_release_hold_under_any_sequence(setup, seq):
    run = Run(*setup)
    for op in seq:
        run.apply(op)
    run.finish()


@EXAMPLES
@given(
    setup=setups(),
    start=st.floats(0.0, 1.0),
    seq=st.lists(ops.filter(lambda op: op[0] != "budget") | st.tuples(st.just("grow"), st.integers(0, 500)), max_size=60),
)
def test_class_with_unused_reserved_share_can_always_admit_a_request_that_fits_it(setup, start, seq):
    classes, quotas, capacity = setup
    # Tenant quotas and the prefill limit are separate guarantees; take them out here.
    quotas = {t: TenantPolicy(weight=p.weight) for t, p in quotas.items()}
    capacity = Capacity(capacity.slots, capacity.ceiling, capacity.ceiling, None)
    run = Run(classes, quotas, capacity)
    in_force = {c.name: run.adm.reserved(c.name) for c in classes}  # R0: at most half the ceiling in all
    reserved = sum(in_force.values())
    start_budget = max(1, reserved + int(start * (capacity.ceiling - reserved)))
    run.adm.set_budget(start_budget)
    for op in seq:
        if op[0] == "grow":
            run.adm.set_budget(run.adm.budget + op[1])  # the budget only grows in this property
        else:
            run.apply(op)
        adm = run.adm
        held = {c.name: max(adm.ledger.class_tokens(c.name), in_force[c.name]) for c in classes}
        assert sum(held.values()) <= adm.budget
        if len(adm.ledger) >= capacity.slots:
            continue
        for c in classes:
            unused = in_force[c.name] - adm.ledger.class_tokens(c.name)
            queue = adm.queue(c.name)
            if unused < 2 or queue.paused or len(queue):
                continue
            probe = Request(f"probe-{c.name}", c.name, "a", 1, unused - 1, run.now)
            decision = adm.offer(probe, run.now)
            assert isinstance(decision, Admit), (c, decision)
            adm.ledger.release(probe.id)
    run.finish()


@EXAMPLES
@given(
    depth=st.integers(1, 20),
    pushes=st.lists(st.tuples(st.sampled_from(TENANTS), st.integers(1, 5000)), max_size=60),
)
def test_a_class_queue_never_holds_more_than_its_depth(depth, pushes):
    q = ClassQueue("c", depth=depth, timeout_s=5.0)
    accepted = 0
    for i, (tenant, cost) in enumerate(pushes):
        item = q.push(Request(f"r{i}", "c", tenant, 1, cost, 0.0), 0.0)
        accepted += item is not None
        assert len(q) <= depth
    assert accepted == min(depth, len(pushes))


def _weighted_shares(weights: dict[str, float], costs: dict[str, list[int]], tokens: int) -> dict[str, float]:
    """Serve a permanently backlogged class one request at a time; return each tenant's token share."""
    q = ClassQueue("c", depth=10_000, timeout_s=1e9, weight_of=weights.__getitem__)
    ids = count()
    cursor = {t: 0 for t in weights}

    def refill(tenant: str) -> None:
        cost = costs[tenant][cursor[tenant] % len(costs[tenant])]
        cursor[tenant] += 1
        q.push(Request(f"r{next(ids)}", "c", tenant, 0, cost, 0.0), 0.0)

    for tenant in weights:
        for _ in range(2):
            refill(tenant)
    served: Counter[str] = Counter()
    while sum(served.values()) < tokens:
        item = q.select()
        q.pop(item)
        served[item.request.tenant] += item.request.cost
        refill(item.request.tenant)  # sustained backlog: every tenant always has work
    total = sum(served.values())
    return {t: served[t] / total for t in weights}


@EXAMPLES
@given(
    weights=st.lists(st.sampled_from([1.0, 1.5, 2.0, 3.0, 4.0]), min_size=2, max_size=4),
    costs=st.lists(st.lists(st.integers(100, 3000), min_size=1, max_size=8), min_size=4, max_size=4),
)
def test_tenants_token_shares_converge_to_their_weights_within_10_percent(weights, costs):
    names = [f"t{i}" for i in range(len(weights))]
    w = dict(zip(names, weights))
    # DRR keeps every tenant within (quantum x weight + largest request) tokens of its
    # exact share, so after T tokens the relative error is at most that lag over its
    # share of T: serve ten times the tokens that makes the bound 100%.
    largest = max(max(c) for c in costs)
    lag = DEFAULT_QUANTUM * max(weights) + largest
    tokens = int(10 * lag * sum(weights) / min(weights))
    shares = _weighted_shares(w, dict(zip(names, costs)), tokens)
    # Oracle: under sustained backlog, max-min fairness is the plain weighted split.
    total_w = sum(weights)
    for name in names:
        expected = w[name] / total_w
        assert abs(shares[name] - expected) <= 0.10 * expected, (name, shares, w)


@EXAMPLES
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["push", "pop", "remove", "expire"]), st.sampled_from(["a", "b", "c"]), st.floats(0.0, 3.0)),
        max_size=40,
    )
)
def test_a_class_queue_expires_exactly_the_waiters_past_their_own_deadline(ops):
    """`expire(now)` removes every waiter whose deadline is at or before `now` and no other, and
    `next_deadline` is the earliest deadline of those waiting, also when an id that waited (and was
    dispatched, removed or expired) waits again: its old deadline is not its new one."""
    q = ClassQueue("c", depth=10, timeout_s=5.0)
    now = 0.0
    for op, rid, dt in ops:
        now += dt
        if op == "push" and rid not in q:
            q.push(Request(rid, "c", "t", 1, 1, now), now)
        elif op == "pop" and (item := q.select()) is not None:
            q.pop(item)
        elif op == "remove":
            q.remove(rid)
        elif op == "expire":
            due = {w.request.id for w in q if w.deadline <= now}
            assert {w.request.id for w in q.expire(now)} == due
        assert q.next_deadline() == min((w.deadline for w in q), default=None)


@EXAMPLES
@given(
    wanted=st.lists(st.integers(0, 10_000), min_size=1, max_size=5),
    ceiling=st.integers(1, 20_000),
)
def test_reservations_in_force_leave_half_the_ceiling_and_keep_what_fits(wanted, ceiling):
    # R0: on any pool the classes' reservations leave room for the others and the controller
    policies = [Cls(f"c{i}", i, reserved_tokens=n) for i, n in enumerate(wanted)]
    in_force = reservations_in_force(policies, ceiling)
    most = int(ceiling * RESERVED_SHARE_MAX)
    if sum(wanted) <= most:
        assert in_force == {p.name: p.reserved_tokens for p in policies}
    else:
        assert sum(in_force.values()) <= most
        assert all(0 <= in_force[p.name] <= p.reserved_tokens for p in policies)
        # in proportion: a class reserving more never gets less in force
        for a in policies:
            for b in policies:
                if a.reserved_tokens >= b.reserved_tokens:
                    assert in_force[a.name] >= in_force[b.name]
