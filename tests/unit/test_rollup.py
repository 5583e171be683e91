"""Per-second rollups: windows, denials by reason and class, p95 TTFT."""

from gate.core.rollup import Rollup


def test_denials_are_counted_per_reason_and_class_over_1_5_15_minutes():
    r = Rollup()
    r.add(0.0, "batch", "refused", "queue_full")
    r.add(400.0, "batch", "refused", "queue_full")
    r.add(850.0, "interactive", "refused", "rate_limited")
    r.add(899.0, "batch", "refused", "queue_full")
    r.add(899.5, "batch", "admitted", "ok")
    assert r.denials(899.9) == {("queue_full", "batch"): (1, 1, 3), ("rate_limited", "interactive"): (1, 1, 1)}


def test_old_buckets_fall_out_of_the_horizon():
    r = Rollup(horizon_s=60)
    r.add(0.0, "batch", "refused", "queue_full")
    r.add(100.0, "batch", "admitted", "ok")
    assert r.denials(100.0) == {}
    assert r.counts(100.0, 60) == {("batch", "admitted", "ok"): 1}


def test_p95_ttft_is_nearest_rank_over_the_window_per_class():
    r = Rollup()
    for i in range(1, 101):
        r.add(10.0, "interactive", "admitted", "ok", ttft_ms=float(i))
    r.add(10.0, "batch", "admitted", "ok", ttft_ms=5000.0)
    assert r.p95_ttft_ms(10.5, "interactive") == 95.0
    assert r.p95_ttft_ms(10.5, "batch") == 5000.0
    assert r.p95_ttft_ms(200.0, "interactive") is None


def test_p95_ttft_from_arrival_is_kept_apart_from_dispatch():
    # the classes table shows what clients saw (queue wait included); the controller's kind of
    # signal is from dispatch: a trial's table read 117 ms where clients saw 1.9 s
    r = Rollup()
    for _ in range(20):
        r.add(10.0, "interactive", "admitted", "ok", ttft_ms=117.0, queue_ms=1783.0, ttft_arrival_ms=1900.0)
    r.add(10.0, "interactive", "refused", "queue_timeout", queue_ms=5000.0)  # no first token: in neither
    assert r.p95_ttft_ms(10.5, "interactive") == 117.0
    assert r.p95_ttft_arrival_ms(10.5, "interactive") == 1900.0
    assert r.p95_ttft_arrival_ms(10.5, "batch") is None


def test_met_share_counts_refusals_as_misses_and_leaves_client_errors_and_cancels_out():
    from gate.core.rollup import Rollup

    r = Rollup()
    r.add(100.0, "interactive", "admitted", "ok", met=True)
    r.add(100.0, "interactive", "admitted", "ok", met=False)
    r.add(100.5, "interactive", "refused", "queue_timeout", queue_ms=10_000.0, met=False)
    r.add(100.5, "interactive", "refused", "invalid_request", met=None)
    assert r.met_share(101.0, "interactive") == (1, 3)
    assert r.p95_queue_ms(101.0, "interactive") == 10_000.0
    assert r.met_share(101.0, "batch") == (0, 0)


def test_an_admitted_request_without_a_first_token_time_is_not_judged_a_miss():
    """Embeddings, rerank and plain Messages / Responses answers have no first-token time: five
    plain /v1/messages answered in 70-110 ms read "met 0%" in a user's trial (2026-12-05)."""
    from gate.observe.recorder import judge
    from tests.unit.test_journal import decision

    admitted = decision(0, outcome="admitted", http_status=200)
    assert judge(admitted, None, 2000.0) is None
    assert judge(admitted, 0.5, 2000.0) is True
    assert judge(admitted, 2.5, 2000.0) is False
    assert judge(decision(0, outcome="refused", reason="queue_timeout", http_status=429), None, 2000.0) is False
    assert judge(decision(0, outcome="refused", reason="invalid_request", http_status=400), None, 2000.0) is None


def test_median_ttft_is_per_class_over_the_window_with_its_count():
    r = Rollup()
    r.add(1000.0, "interactive", "admitted", "ok", ttft_ms=9000.0)  # over 5 minutes before: out
    for i, ttft in enumerate((1500.0, 4600.0, 2300.0, 3000.0)):
        r.add(1301.0 + i, "interactive", "admitted", "ok", ttft_ms=ttft)
    r.add(1302.0, "batch", "admitted", "ok", ttft_ms=50.0)
    r.add(1302.0, "interactive", "refused", "queue_full")  # no first token: not a sample
    assert r.median_ttft_ms(1305.0, "interactive", 300) == (3000.0, 4)  # [1500, 2300, 3000, 4600]
    assert r.median_ttft_ms(1305.0, "batch", 300) == (50.0, 1)
    assert r.median_ttft_ms(1305.0, "other", 300) == (None, 0)
