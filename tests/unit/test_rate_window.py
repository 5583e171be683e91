"""llama-server's throughput gauges over a scraper's window through the gate (gate/backend/rate_window.py).

The model of llama-server here is its own rule (tools/server/server-common.h, server_metrics):
each generation adds (steps, microseconds) to a cumulative bucket and to a "since the last read"
bucket; every read of /metrics reports ``steps / time`` of the latter and resets it, and prints the
cumulative seconds. The gate reads it every second for its telemetry; a client scraping through the
gate must see what llama-server would have told it had nobody else read in between.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gate.backend.rate_window import RateWindows, rewrite

KEY = "http://127.0.0.1:8080"


class LlamaServerBuckets:
    """llama-server's prompt and predict buckets (the two behave alike; one suffices here)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self.bucket_steps = 0.0
        self.bucket_s = 0.0

    def generate(self, steps: int, seconds: float) -> None:
        self.total_s += seconds
        self.bucket_steps += steps
        self.bucket_s += seconds

    def read(self) -> dict[str, float]:
        rate = self.bucket_steps / self.bucket_s if self.bucket_s > 0 else 0.0
        self.bucket_steps = self.bucket_s = 0.0
        return {
            "predicted_tokens_seconds": rate,
            "tokens_predicted_seconds_total": self.total_s,
            "prompt_tokens_seconds": 0.0,
            "prompt_seconds_total": 0.0,
        }


events = st.lists(
    st.one_of(
        st.tuples(st.just("generate"), st.integers(1, 500), st.floats(0.001, 30.0)),
        st.tuples(st.just("gate_reads"), st.just(0), st.just(0.0)),
        st.tuples(st.just("client_scrapes"), st.just(0), st.just(0.0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_a_client_sees_the_rate_since_its_own_previous_scrape_whatever_the_gate_read_between(seq) -> None:
    server, windows = LlamaServerBuckets(), RateWindows()
    alone = LlamaServerBuckets()  # the same server with the client as its only reader
    for kind, steps, seconds in seq:
        if kind == "generate":
            server.generate(steps, seconds)
            alone.generate(steps, seconds)
        elif kind == "gate_reads":
            windows.observe(KEY, server.read(), start="1")
        else:
            got = windows.take(KEY, server.read(), start="1")["predicted_tokens_seconds"]
            want = alone.read()["predicted_tokens_seconds"]
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (got, want)


def test_the_negative_control_the_gauge_as_llama_server_gives_it_is_the_gates_last_second() -> None:
    """What the relay said before: the raw gauge. The gate's read took the window, the client gets 0."""
    server = LlamaServerBuckets()
    server.read()  # the client's previous scrape
    server.generate(8, 0.1)
    server.read()  # the gate's telemetry, a second later
    assert server.read()["predicted_tokens_seconds"] == 0.0  # the client's scrape, raw
    windows, server = RateWindows(), LlamaServerBuckets()
    windows.take(KEY, server.read(), start="1")
    server.generate(8, 0.1)
    windows.observe(KEY, server.read(), start="1")
    assert windows.take(KEY, server.read(), start="1")["predicted_tokens_seconds"] == 80.0


def test_a_bucket_reported_twice_without_time_is_counted_once() -> None:
    """llama-server asleep serves a snapshot, and may report the last bucket again as it wakes:
    a piece whose seconds total did not move adds nothing (test_sleep.py's buckets test)."""
    windows = RateWindows()
    windows.observe(KEY, {"predicted_tokens_seconds": 0.0, "tokens_predicted_seconds_total": 0.0}, "1")
    windows.observe(KEY, {"predicted_tokens_seconds": 70.0, "tokens_predicted_seconds_total": 0.1}, "1")
    assert windows.take(KEY, {"predicted_tokens_seconds": 70.0, "tokens_predicted_seconds_total": 0.1}, "1") == {
        "prompt_tokens_seconds": 0.0,
        "predicted_tokens_seconds": 70.0,
    }
    assert (
        windows.take(KEY, {"predicted_tokens_seconds": 70.0, "tokens_predicted_seconds_total": 0.1}, "1")["predicted_tokens_seconds"] == 0.0
    )


def test_a_restart_starts_the_totals_again() -> None:
    windows = RateWindows()
    windows.observe(KEY, {"predicted_tokens_seconds": 10.0, "tokens_predicted_seconds_total": 100.0}, "1")
    windows.take(KEY, {"predicted_tokens_seconds": 0.0, "tokens_predicted_seconds_total": 100.0}, "1")
    # restarted: its header says so; 2 s of generation at 50 steps/s since
    got = windows.take(KEY, {"predicted_tokens_seconds": 50.0, "tokens_predicted_seconds_total": 2.0}, "2")
    assert got["predicted_tokens_seconds"] == 50.0
    # without the header, a total going down says it
    windows.take(KEY, {"predicted_tokens_seconds": 0.0, "tokens_predicted_seconds_total": 2.0})
    got = windows.take(KEY, {"predicted_tokens_seconds": 40.0, "tokens_predicted_seconds_total": 1.0})
    assert got["predicted_tokens_seconds"] == 40.0


def test_a_read_overtaken_by_a_newer_one_adds_no_time() -> None:
    windows = RateWindows()
    windows.take(KEY, {"predicted_tokens_seconds": 0.0, "tokens_predicted_seconds_total": 10.0}, "1")
    windows.observe(KEY, {"predicted_tokens_seconds": 30.0, "tokens_predicted_seconds_total": 12.0}, "1")
    windows.observe(KEY, {"predicted_tokens_seconds": 90.0, "tokens_predicted_seconds_total": 11.0}, "1")  # older
    assert (
        windows.take(KEY, {"predicted_tokens_seconds": 0.0, "tokens_predicted_seconds_total": 12.0}, "1")["predicted_tokens_seconds"]
        == 30.0
    )


def test_windows_are_per_llama_server() -> None:
    windows = RateWindows()
    windows.observe("a", {"predicted_tokens_seconds": 10.0, "tokens_predicted_seconds_total": 1.0}, "1")
    assert (
        windows.take("b", {"predicted_tokens_seconds": 0.0, "tokens_predicted_seconds_total": 0.0}, "1")["predicted_tokens_seconds"] == 0.0
    )
    assert (
        windows.take("a", {"predicted_tokens_seconds": 0.0, "tokens_predicted_seconds_total": 1.0}, "1")["predicted_tokens_seconds"] == 10.0
    )


def test_rewrite_replaces_the_two_values_and_nothing_else() -> None:
    text = (
        "# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s\n"
        "# TYPE llamacpp:prompt_tokens_seconds gauge\n"
        "llamacpp:prompt_tokens_seconds 0\n"
        "# TYPE llamacpp:predicted_tokens_seconds gauge\n"
        "llamacpp:predicted_tokens_seconds 12.5\n"
        "llamacpp:predicted_tokens_seconds_other 7\n"
        "llamacpp:requests_processing 0\n"
    )
    out = rewrite(text, {"prompt_tokens_seconds": 1234.56789, "predicted_tokens_seconds": 0.0})
    assert out.splitlines() == [
        "# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s",
        "# TYPE llamacpp:prompt_tokens_seconds gauge",
        "llamacpp:prompt_tokens_seconds 1234.57",
        "# TYPE llamacpp:predicted_tokens_seconds gauge",
        "llamacpp:predicted_tokens_seconds 0",
        "llamacpp:predicted_tokens_seconds_other 7",
        "llamacpp:requests_processing 0",
    ]
