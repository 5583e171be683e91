"""GateMetrics: parse render() output and check series, labels and values."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gate import __version__
from gate.core.reasons import Reason
from gate.observe.metrics import GateMetrics

# Every series name of DESIGN.md "Metrics (Prometheus)", as exposed (samples).
DESIGN_SERIES = {
    "admission_control_denials_total",
    "tokengate_decisions_total",
    "tokengate_tokens_in_flight",
    "tokengate_token_budget",
    "tokengate_queue_depth",
    "tokengate_queue_wait_seconds_bucket",
    "tokengate_upstream_ttft_seconds_bucket",
    "tokengate_request_duration_seconds_bucket",
    "tokengate_queue_drain_seconds",
    "tokengate_backend_up",
    "tokengate_backend_slots",
    "tokengate_gpu_memory_bytes",
    "tokengate_journal_dropped_total",
    "tokengate_reaped_total",
    "tokengate_token_count_total",
    "tokengate_forward_beside_count_total",
    "tokengate_info",
}


def samples(m: GateMetrics) -> list[tuple[str, dict[str, str], float]]:
    body, _ = m.render()
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(body.decode()) for s in fam.samples]


def value(m: GateMetrics, name: str, **labels: str) -> float | None:
    for n, lab, v in samples(m):
        if n == name and lab == labels:
            return v
    return None


def exercise(m: GateMetrics) -> None:
    m.register_classes(["interactive", "batch"])
    m.decision(cls="batch", outcome="refused", reason=Reason.QUEUE_FULL, model="llama")
    m.queue_wait("interactive", 0.02)
    m.ttft("interactive", 0.3)
    m.ttft_total("interactive", 0.32, "admitted")
    m.tpot("interactive", 0.04, "admitted")
    m.ttft_total("strange", 9.0, "mystery")  # neither a class nor an outcome: both "other"
    m.duration("interactive", 2.0)
    m.token_count("exact")
    m.set_class_state("interactive", in_flight=512, queued=3)
    m.set_budget(8192)
    m.set_drain_seconds(4.5)
    m.set_backend("b0", up=True, busy=3, total=4)
    m.set_gpu("0", used=10, total=80)
    m.journal_dropped()
    m.reaped(2)


def test_every_design_series_present() -> None:
    m = GateMetrics()
    exercise(m)
    names = {n for n, _, _ in samples(m)}
    assert DESIGN_SERIES <= names


def test_render_content_type() -> None:
    body, ctype = GateMetrics().render()
    assert isinstance(body, bytes)
    assert ctype.startswith("text/plain")


def test_register_classes_creates_zero_series() -> None:
    m = GateMetrics()
    m.register_classes(["interactive", "batch"])
    for cls in ("interactive", "batch"):
        assert value(m, "tokengate_tokens_in_flight", **{"class": cls}) == 0
        assert value(m, "tokengate_queue_depth", **{"class": cls}) == 0
        assert value(m, "tokengate_queue_wait_seconds_count", **{"class": cls, "outcome": "admitted"}) == 0
        assert value(m, "tokengate_ttft_seconds_count", **{"class": cls, "outcome": "admitted"}) == 0
        assert value(m, "tokengate_tpot_seconds_count", **{"class": cls, "outcome": "admitted"}) == 0
        assert value(m, "tokengate_upstream_ttft_seconds_count", **{"class": cls}) == 0
        assert value(m, "tokengate_request_duration_seconds_count", **{"class": cls}) == 0
        labels = {"class": cls, "outcome": "admitted", "reason": "ok"}
        assert value(m, "tokengate_decisions_total", **labels) == 0
    assert value(m, "tokengate_token_count_total", source="exact") == 0
    assert value(m, "tokengate_token_count_total", source="estimate") == 0
    assert value(m, "tokengate_journal_dropped_total") == 0
    assert value(m, "tokengate_reaped_total") == 0
    for result in ("settled", "over_bound", "taken_back"):
        assert value(m, "tokengate_forward_beside_count_total", result=result) == 0


def test_refused_counts_denial_admitted_does_not() -> None:
    m = GateMetrics()
    m.register_classes(["interactive", "batch"])
    m.register_models(["llama"])
    m.decision(cls="interactive", outcome="admitted", reason="", model="llama")
    ok = {"class": "interactive", "outcome": "admitted", "reason": "ok"}
    assert value(m, "tokengate_decisions_total", **ok) == 1
    assert not [s for s in samples(m) if s[0] == "admission_control_denials_total"]

    m.decision(cls="batch", outcome="refused", reason=Reason.TOKEN_BUDGET_EXCEEDED, model="llama")
    m.decision(cls="batch", outcome="refused", reason="token_budget_exceeded", model="llama")
    denials = [s for s in samples(m) if s[0] == "admission_control_denials_total"]
    assert denials == [
        (
            "admission_control_denials_total",
            {"model": "llama", "reason": "token_budget_exceeded", "priority_class": "batch"},
            2.0,
        )
    ]
    labels = {"class": "batch", "outcome": "refused", "reason": "token_budget_exceeded"}
    assert value(m, "tokengate_decisions_total", **labels) == 2


def test_other_outcomes_are_not_denials_and_empty_model() -> None:
    m = GateMetrics()
    m.register_classes(["batch"])
    m.decision(cls="batch", outcome="shed", reason=Reason.SHED_OVERRUN, model="x")
    m.decision(cls="batch", outcome="failed", reason=Reason.UPSTREAM_ERROR, model="x")
    assert not [s for s in samples(m) if s[0] == "admission_control_denials_total"]
    m.decision(cls="batch", outcome="refused", reason=Reason.NO_BACKEND, model="")
    assert value(m, "admission_control_denials_total", model="", reason="no_backend", priority_class="batch") == 1


def test_unknown_outcome_rejected() -> None:
    with pytest.raises(ValueError):
        GateMetrics().decision(cls="a", outcome="maybe", reason="", model="")
    with pytest.raises(ValueError):
        GateMetrics().token_count("guess")


def test_histograms_and_gauges() -> None:
    m = GateMetrics()
    exercise(m)
    cls = {"class": "interactive"}
    ok = {"class": "interactive", "outcome": "admitted"}
    assert value(m, "tokengate_queue_wait_seconds_count", **ok) == 1
    assert value(m, "tokengate_queue_wait_seconds_sum", **ok) == pytest.approx(0.02)
    assert value(m, "tokengate_queue_wait_seconds_bucket", le="0.001", **ok) == 0
    assert value(m, "tokengate_queue_wait_seconds_bucket", le="0.025", **ok) == 1
    assert value(m, "tokengate_queue_wait_seconds_bucket", le="120.0", **ok) == 1
    assert value(m, "tokengate_upstream_ttft_seconds_bucket", le="60.0", **cls) == 1
    # vLLM's buckets: attainment of a 250 ms objective is bucket{le="0.25"} over the count.
    assert value(m, "tokengate_ttft_seconds_bucket", le="0.25", **ok) == 0
    assert value(m, "tokengate_ttft_seconds_bucket", le="0.5", **ok) == 1
    assert value(m, "tokengate_tpot_seconds_bucket", le="0.05", **ok) == 1
    assert value(m, "tokengate_tpot_seconds_bucket", le="0.025", **ok) == 0
    assert value(m, "tokengate_ttft_seconds_count", **{"class": "other", "outcome": "other"}) == 1
    assert value(m, "tokengate_request_duration_seconds_bucket", le="600.0", **cls) == 1
    assert value(m, "tokengate_tokens_in_flight", **cls) == 512
    assert value(m, "tokengate_queue_depth", **cls) == 3
    assert value(m, "tokengate_token_budget") == 8192
    assert value(m, "tokengate_token_budget_effective") == 8192  # no stretch: the same
    assert value(m, "tokengate_queue_drain_seconds") == 4.5
    assert value(m, "tokengate_backend_up", backend="b0") == 1
    assert value(m, "tokengate_backend_slots", backend="b0", state="busy") == 3
    assert value(m, "tokengate_backend_slots", backend="b0", state="idle") == 1
    assert value(m, "tokengate_gpu_memory_bytes", gpu="0", kind="used") == 10
    assert value(m, "tokengate_gpu_memory_bytes", gpu="0", kind="total") == 80
    assert value(m, "tokengate_journal_dropped_total") == 1
    assert value(m, "tokengate_reaped_total") == 2
    assert value(m, "tokengate_token_count_total", source="exact") == 1
    assert value(m, "tokengate_info", version=__version__) == 1

    m.set_backend("b0", up=False, busy=0, total=4)
    assert value(m, "tokengate_backend_up", backend="b0") == 0
    assert value(m, "tokengate_backend_slots", backend="b0", state="idle") == 4
    m.clear_gpu()
    assert not [s for s in samples(m) if s[0] == "tokengate_gpu_memory_bytes"]


def test_instances_are_independent() -> None:
    a, b = GateMetrics(), GateMetrics(version="9.9")
    a.decision(cls="batch", outcome="refused", reason=Reason.QUEUE_FULL, model="m")
    a.set_budget(100)
    b.set_budget(200)
    a.reaped()
    assert value(a, "tokengate_token_budget") == 100
    assert value(b, "tokengate_token_budget") == 200
    assert value(a, "tokengate_reaped_total") == 1
    assert value(b, "tokengate_reaped_total") == 0
    assert not [s for s in samples(b) if s[0] == "admission_control_denials_total"]
    assert value(b, "tokengate_info", version="9.9") == 1
    assert a.registry is not b.registry


def test_nothing_on_default_registry() -> None:
    from prometheus_client import REGISTRY

    GateMetrics()
    assert "tokengate_token_budget" not in {s.name for fam in REGISTRY.collect() for s in fam.samples}


def test_labels_come_only_from_configured_names_anything_else_is_other() -> None:
    m = GateMetrics()
    m.register_classes(["batch"])
    m.register_models(["tiny"])
    m.decision(cls="batch", outcome="refused", reason=Reason.MODEL_NOT_FOUND, model="x")
    m.decision(cls="c", outcome="refused", reason="r", model="tiny")
    one_each = len(m.render()[0])
    for i in range(300):
        m.decision(cls="batch", outcome="refused", reason=Reason.MODEL_NOT_FOUND, model=f"x{i}" * 1000)
        m.decision(cls=f"c{i}", outcome="refused", reason=f"r{i}", model="tiny")
    denials = {tuple(sorted(lab.items())): v for n, lab, v in samples(m) if n == "admission_control_denials_total"}
    assert denials == {
        (("model", "other"), ("priority_class", "batch"), ("reason", "model_not_found")): 301.0,
        (("model", "tiny"), ("priority_class", "other"), ("reason", "other")): 301.0,
    }
    body, _ = m.render()
    assert len(body) - one_each < 100  # 600 unknown names add no series (only longer counts)


async def test_queue_wait_observes_what_went_through_a_queue_not_a_refusal_at_once():
    """A trial: `tokengate_queue_wait_seconds_count{outcome="refused"}` was one more than the
    queue's timeouts: a never-fits 400, refused at once, was observed as a 0 s wait. A refusal
    at once (here a paused class's 503) never queued; an admitted request is observed (0 s when
    admitted at once), whatever its end."""
    import httpx

    from tests.fakes import GATE_CONFIG, gate_on_fake_llama

    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with gate_on_fake_llama(GATE_CONFIG) as g:
        g.backends.backends[0].gatekeeper.pause("batch")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=g.app), base_url="http://gate") as c:
            paused = await c.post("/v1/chat/completions", json=chat, headers={"X-Tokengate-Class": "batch", "X-Request-Id": "p"})
            admitted = await c.post("/v1/chat/completions", json=chat, headers={"X-Tokengate-Class": "interactive", "X-Request-Id": "a"})
        assert paused.status_code == 503 and paused.json()["error"]["code"] == "class_paused"
        assert g.records.find("p").queue_ms == 0  # the journal still says it waited 0 s
        assert g.records.find("a").reserved_tokens > 0, admitted.text  # it held a reservation: admitted
        m = g.metrics
        assert value(m, "tokengate_queue_wait_seconds_count", **{"class": "batch", "outcome": "refused"}) in (None, 0)
        waits = [v for n, lab, v in samples(m) if n == "tokengate_queue_wait_seconds_count" and lab["class"] == "interactive"]
        assert sum(waits) == 1, waits


def test_the_default_objective_has_a_bucket_of_its_own() -> None:
    """The share within the default 2 s objective is `le="2.0"` over the count: vLLM's buckets
    alone had 1.0 and 2.5, so the README's recipe could not read it (a trial)."""
    m = GateMetrics()
    m.register_classes(["interactive"])
    for s in (0.4, 1.9, 2.2, 3.0):
        m.ttft_total("interactive", s, "admitted")
    within = value(m, "tokengate_ttft_seconds_bucket", **{"class": "interactive", "outcome": "admitted", "le": "2.0"})
    assert within == 2 and value(m, "tokengate_ttft_seconds_count", **{"class": "interactive", "outcome": "admitted"}) == 4
