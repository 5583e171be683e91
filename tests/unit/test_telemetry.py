"""gate.telemetry (parsing, rates, the poller) and gate.kvsize (KV bytes per token).

The payloads below were captured from the pinned llama-server (llama.cpp
0c1e570, ``-c 2048 -np 4 --metrics``, the tiny 640x8 model) and trimmed: the
per-slot ``params`` block is cut, and /metrics keeps its HELP/TYPE lines for the
fields the gate reads.  The poller runs against a fake upstream built on
``httpx.MockTransport`` with a fake clock.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from gate.backend.kvsize import CACHE_TYPES, kv_bytes_per_token, kv_size
from gate.backend.telemetry import (
    BackendTelemetry,
    CounterDelta,
    RateTracker,
    SlotInfo,
    TelemetryPoller,
    parse_metrics,
    parse_slots,
)

# --- recorded payloads -----------------------------------------------------------

# GET /slots on a fresh server.
SLOTS_FRESH = [
    {"id": 0, "n_ctx": 512, "speculative": False, "is_processing": False},
    {"id": 1, "n_ctx": 512, "speculative": False, "is_processing": False},
    {"id": 2, "n_ctx": 512, "speculative": False, "is_processing": False},
    {"id": 3, "n_ctx": 512, "speculative": False, "is_processing": False},
]
# While one /completion (7 prompt tokens, n_predict 60) decodes: in this build
# n_prompt_tokens counts the tokens in the slot's cache, so it grows with n_decoded.
SLOTS_BUSY = SLOTS_FRESH[:3] + [
    {
        "id": 3,
        "n_ctx": 512,
        "speculative": False,
        "is_processing": True,
        "id_task": 2,
        "n_prompt_tokens": 17,
        "n_prompt_tokens_processed": 7,
        "n_prompt_tokens_cache": 0,
        "params": {"n_predict": 60, "stream": False},  # (trimmed)
        "next_token": [{"has_next_token": True, "has_new_line": False, "n_remain": 50, "n_decoded": 10}],
    }
]
# The same slot after a 200-token chat request ended: idle, cache still holds 241 tokens.
SLOTS_AFTER = SLOTS_FRESH[:3] + [
    {
        "id": 3,
        "n_ctx": 512,
        "speculative": False,
        "is_processing": False,
        "id_task": 2,
        "n_prompt_tokens": 241,
        "n_prompt_tokens_processed": 0,
        "n_prompt_tokens_cache": 0,
        "next_token": [{"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}],
    }
]

_METRICS_TEMPLATE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt_tokens}
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 0
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total {prompt_seconds}
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {predicted}
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total {predicted_seconds}
# HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total {predicted}
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 241
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 49.4457
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 11.3691
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {processing}
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred {deferred}
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1
"""


def metrics_text(prompt_tokens=0, prompt_seconds=0, predicted=0, predicted_seconds=0, processing=0, deferred=0):
    return _METRICS_TEMPLATE.format(
        prompt_tokens=prompt_tokens,
        prompt_seconds=prompt_seconds,
        predicted=predicted,
        predicted_seconds=predicted_seconds,
        processing=processing,
        deferred=deferred,
    )


# The counters as recorded: mid-request (prompt done, nothing finished) and after the request ended.
METRICS_BUSY = metrics_text(prompt_tokens=42, prompt_seconds=0.849416, processing=1)
METRICS_AFTER = metrics_text(prompt_tokens=42, prompt_seconds=0.849416, predicted=200, predicted_seconds=17.5036)


# --- parse_slots -------------------------------------------------------------------


def test_fresh_slots_are_four_idle_slots_of_512():
    slots = parse_slots(SLOTS_FRESH)
    assert slots == tuple(SlotInfo(i, 512, False, None, None) for i in range(4))
    assert all(s.context_used is None for s in slots)


def test_busy_slot_reads_prompt_and_decoded_from_the_next_token_list():
    slots = parse_slots(SLOTS_BUSY)
    assert [s.processing for s in slots] == [False, False, False, True]
    assert slots[3] == SlotInfo(3, 512, True, 17, 10)
    assert slots[3].context_used == 17  # n_prompt_tokens already counts the decoded tokens


def test_next_token_as_a_dict_in_other_builds():
    slot = dict(SLOTS_BUSY[3], next_token={"has_next_token": True, "n_remain": 50, "n_decoded": 10})
    assert parse_slots([slot])[0].n_decoded == 10


def test_idle_slot_after_a_request_is_not_processing():
    slot = parse_slots(SLOTS_AFTER)[3]
    assert slot == SlotInfo(3, 512, False, 241, 0)
    assert slot.context_used is None


def test_older_builds_state_field_means_processing():
    slots = parse_slots([{"id": 1, "n_ctx": 8, "state": 1}, {"id": 0, "n_ctx": 8, "state": 0}])
    assert [(s.id, s.processing) for s in slots] == [(0, False), (1, True)]  # sorted by id


def test_empty_next_token_list_gives_no_decoded_count():
    assert parse_slots([dict(SLOTS_BUSY[3], next_token=[])])[0].n_decoded is None


@pytest.mark.parametrize("payload", [{"slots": []}, [1, 2], [{"n_ctx": 512}], [{"id": 0, "n_ctx": "512"}], None])
def test_payload_that_is_not_slots_raises_value_error(payload):
    with pytest.raises(ValueError):
        parse_slots(payload)


# --- parse_metrics ------------------------------------------------------------------


def test_metrics_keys_drop_the_llamacpp_prefix():
    m = parse_metrics(METRICS_AFTER)
    assert m["tokens_predicted_total"] == 200.0
    assert m["tokens_predicted_seconds_total"] == pytest.approx(17.5036)
    assert m["prompt_tokens_total"] == 42.0
    assert m["prompt_seconds_total"] == pytest.approx(0.849416)
    assert m["requests_processing"] == 0.0
    assert m["requests_deferred"] == 0.0
    assert m["predicted_tokens_seconds"] == pytest.approx(11.3691)
    assert not any(k.startswith("llamacpp:") for k in m)


def test_metrics_with_labels_keep_them_in_the_key():
    m = parse_metrics('# TYPE x_total counter\nx_total{b="2",a="1"} 3\nplain 4\n')
    assert m == {'x_total{a="1",b="2"}': 3.0, "plain": 4.0}


def test_garbage_metrics_raise_value_error():
    with pytest.raises(ValueError):
        parse_metrics("<html>not metrics</html>\n")


# --- RateTracker ------------------------------------------------------------------


def test_rate_tracker_first_sample_has_no_rate():
    assert RateTracker().update(0.0, {"a": 5}) is None


def test_rate_tracker_deltas_rates_and_ratios():
    t = RateTracker()
    t.update(10.0, {"tok": 100, "sec": 10.0})
    d = t.update(12.0, {"tok": 300, "sec": 14.0})
    assert d == CounterDelta(2.0, {"tok": 200, "sec": 4.0})
    assert d.per_second("tok") == 100.0
    assert d.ratio("tok", "sec") == 50.0
    assert d.per_second("missing") is None


def test_ratio_is_none_when_the_denominator_did_not_move():
    t = RateTracker()
    t.update(0.0, {"tok": 100, "sec": 10.0})
    assert t.update(1.0, {"tok": 100, "sec": 10.0}).ratio("tok", "sec") is None


def test_counter_reset_gives_no_rate_then_resumes_from_the_new_baseline():
    t = RateTracker()
    t.update(0.0, {"tok": 500})
    assert t.update(1.0, {"tok": 20}) is None  # server restarted
    assert t.rates(2.0, {"tok": 50}) == {"tok": 30.0}


def test_out_of_order_sample_keeps_the_older_baseline():
    t = RateTracker()
    t.update(5.0, {"tok": 10})
    assert t.update(5.0, {"tok": 20}) is None
    assert t.rates(6.0, {"tok": 40}) == {"tok": 30.0}


def test_counters_new_in_a_later_scrape_are_ignored_until_they_have_two_samples():
    t = RateTracker()
    t.update(0.0, {"a": 1})
    assert t.update(1.0, {"a": 2, "b": 7}).deltas == {"a": 1}


# --- the poller against a fake upstream ---------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeUpstream:
    """A llama-server stand-in behind httpx.MockTransport; change its fields between polls.

    ``mode``: "up", "down" (connection refused), "hang" (never answers),
    "loading" (503 like llama-server while it loads), "garbage" (bad JSON).
    """

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.mode = "up"
        self.metrics_enabled = True
        self.slots: list = SLOTS_FRESH
        self.metrics = metrics_text()
        self.hits: list[tuple[str, float | None]] = []  # (path, fake time)
        self.headers: list[httpx.Headers] = []
        self.clock = clock

    async def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.hits.append((path, self.clock() if self.clock else None))
        self.headers.append(request.headers)
        if self.mode == "down":
            raise httpx.ConnectError("All connection attempts failed", request=request)
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode == "loading":
            return httpx.Response(503, json={"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
        if path == "/slots":
            if self.mode == "garbage":
                return httpx.Response(200, text="{not json")
            return httpx.Response(200, json=self.slots)
        if path == "/metrics":
            if not self.metrics_enabled:
                return httpx.Response(
                    501,
                    json={
                        "error": {
                            "code": 501,
                            "message": "This server does not support metrics endpoint. Start it with `--metrics`",
                            "type": "not_supported_error",
                        }
                    },
                )
            return httpx.Response(200, text=self.metrics, headers={"content-type": "text/plain; version=0.0.4"})
        return httpx.Response(404)

    def slot_hits(self) -> list[float | None]:
        return [t for p, t in self.hits if p == "/slots"]


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def upstream(clock):
    return FakeUpstream(clock)


@pytest.fixture
async def client(upstream):
    async with httpx.AsyncClient(transport=httpx.MockTransport(upstream.handler)) as c:
        yield c


def make_poller(client, clock, **kw) -> TelemetryPoller:
    return TelemetryPoller(client, [("llama0", "http://llama0:8080/", {"Authorization": "Bearer k"})], clock=clock, **kw)


async def test_poll_reads_slots_and_metrics(client, upstream, clock):
    upstream.slots, upstream.metrics = SLOTS_BUSY, METRICS_BUSY
    poller = make_poller(client, clock)
    latest = await poller.poll_once()
    t = latest["llama0"]
    assert t == BackendTelemetry(
        backend="llama0",
        ts=100.0,
        slots=parse_slots(SLOTS_BUSY),
        requests_processing=1,
        requests_deferred=0,
        prompt_tps=None,
        decode_tps=None,
        stale=False,
        error=None,
    )
    assert t.busy_slots == 1
    assert poller.latest == latest
    assert sorted(p for p, _ in upstream.hits) == ["/metrics", "/slots"]
    assert all(h["authorization"] == "Bearer k" for h in upstream.headers)


async def test_rates_come_from_counter_deltas_between_scrapes(client, upstream, clock):
    poller = make_poller(client, clock)
    upstream.metrics = METRICS_BUSY
    await poller.poll_once()
    clock.now += 1
    upstream.metrics = METRICS_AFTER  # the request ended in between: 200 tokens in 17.5036 s of decoding
    t = (await poller.poll_once())["llama0"]
    assert t.decode_tps == pytest.approx(200 / 17.5036)  # per-slot rate, not the reset-per-scrape gauge
    assert t.prompt_tps is None  # no prompt was processed between these two scrapes
    clock.now += 1
    upstream.metrics = metrics_text(prompt_tokens=142, prompt_seconds=1.849416, predicted=200, predicted_seconds=17.5036)
    t = (await poller.poll_once())["llama0"]
    assert t.prompt_tps == pytest.approx(100.0)
    assert t.decode_tps == pytest.approx(200 / 17.5036)  # nothing finished: the last measured rate is kept


async def test_counter_reset_keeps_the_last_rate(client, upstream, clock):
    poller = make_poller(client, clock)
    upstream.metrics = metrics_text(predicted=100, predicted_seconds=2)
    await poller.poll_once()
    clock.now += 1
    upstream.metrics = metrics_text(predicted=300, predicted_seconds=6)
    assert (await poller.poll_once())["llama0"].decode_tps == 50.0
    clock.now += 1
    upstream.metrics = metrics_text(predicted=10, predicted_seconds=1)  # restarted
    assert (await poller.poll_once())["llama0"].decode_tps == 50.0
    clock.now += 1
    upstream.metrics = metrics_text(predicted=40, predicted_seconds=2)
    assert (await poller.poll_once())["llama0"].decode_tps == 30.0


async def test_metrics_501_leaves_metric_fields_empty_and_logs_once(client, upstream, clock, caplog):
    upstream.metrics_enabled = False
    poller = make_poller(client, clock)
    with caplog.at_level(logging.INFO, logger="tokengate.telemetry"):
        for _ in range(5):
            t = (await poller.poll_once())["llama0"]
            clock.now += 1
    assert t.error is None and t.stale is False
    assert t.slots == parse_slots(SLOTS_FRESH)
    assert (t.requests_processing, t.requests_deferred, t.prompt_tps, t.decode_tps) == (None, None, None, None)
    assert [r.getMessage() for r in caplog.records] == [
        "backend llama0: /metrics is turned off (start llama-server with --metrics); its fields stay empty"
    ]
    assert [p for p, _ in upstream.hits].count("/metrics") == 1  # not asked again every poll


async def test_metrics_turned_on_later_is_noticed_on_the_re_probe(client, upstream, clock):
    upstream.metrics_enabled = False
    poller = make_poller(client, clock)
    await poller.poll_once()
    upstream.metrics_enabled = True
    upstream.metrics = METRICS_BUSY
    clock.now += 59
    assert (await poller.poll_once())["llama0"].requests_processing is None
    clock.now += 1
    assert (await poller.poll_once())["llama0"].requests_processing == 1


async def test_slots_501_is_not_an_error_either(client, upstream, clock):
    async def handler(request):
        if request.url.path == "/slots":
            return httpx.Response(501, json={"error": {"code": 501, "message": "This server does not support slots endpoint."}})
        return await upstream.handler(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        t = (await make_poller(c, clock).poll_once())["llama0"]
    assert t.slots is None and t.busy_slots is None
    assert t.error is None and t.requests_processing == 0


async def test_down_backend_backs_off_1_2_4_8_then_10_seconds(client, upstream, clock):
    upstream.mode = "down"
    poller = make_poller(client, clock)
    start = clock.now
    while clock.now < start + 40:
        await poller.poll_once()
        clock.now += 0.5
    assert [t - start for t in upstream.slot_hits()] == [0, 1, 3, 7, 15, 25, 35]
    t = poller.latest["llama0"]
    assert t.slots is None and t.stale is True
    assert t.error.startswith("/slots: ConnectError: All connection attempts failed") or t.error.startswith("/metrics: ConnectError")


async def test_last_good_value_is_kept_and_marked_stale_after_three_missed_polls(client, upstream, clock):
    upstream.slots, upstream.metrics = SLOTS_BUSY, METRICS_BUSY
    poller = make_poller(client, clock)
    good = (await poller.poll_once())["llama0"]
    upstream.mode = "down"
    seen = []
    for _ in range(3):
        clock.now += 10  # past any backoff
        seen.append((await poller.poll_once())["llama0"])
    assert [t.stale for t in seen] == [False, False, True]
    for t in seen:
        assert (t.slots, t.requests_processing, t.ts) == (good.slots, 1, good.ts)  # the last good values
        assert "ConnectError" in t.error


async def test_recovery_clears_error_and_stale_and_polls_at_the_interval_again(client, upstream, clock):
    poller = make_poller(client, clock)
    upstream.mode = "down"
    for _ in range(4):
        await poller.poll_once()
        clock.now += 10
    upstream.mode = "up"
    t = (await poller.poll_once())["llama0"]
    assert (t.error, t.stale, t.ts) == (None, False, clock.now)
    n = len(upstream.slot_hits())
    clock.now += 1
    await poller.poll_once()
    assert len(upstream.slot_hits()) == n + 1  # no backoff left over


async def test_loading_backend_reports_the_503_without_backing_off(client, upstream, clock):
    upstream.mode = "loading"
    poller = make_poller(client, clock)
    for _ in range(3):
        t = (await poller.poll_once())["llama0"]
        clock.now += 1
    assert len(upstream.slot_hits()) == 3
    assert t.error in ("/slots: HTTP 503: Loading model", "/metrics: HTTP 503: Loading model")
    assert t.stale is True and t.slots is None


async def test_hanging_backend_times_out_and_backs_off(client, upstream, clock):
    upstream.mode = "hang"
    poller = make_poller(client, clock, timeout_s=0.05)
    t = (await asyncio.wait_for(poller.poll_once(), 2))["llama0"]
    assert t.error == "timed out after 0.05 s"
    clock.now += 0.5
    await poller.poll_once()
    assert len(upstream.slot_hits()) == 1  # backing off


async def test_bad_payload_is_an_error_not_a_crash(client, upstream, clock):
    upstream.mode = "garbage"
    t = (await make_poller(client, clock).poll_once())["llama0"]
    assert t.error.startswith("bad payload: ")
    assert t.slots is None


async def test_backends_are_polled_independently(upstream, clock):
    async def handler(request):
        if request.url.host == "dead":
            raise httpx.ConnectError("refused", request=request)
        return await upstream.handler(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        poller = TelemetryPoller(c, [("a", "http://alive:1", None), ("b", "http://dead:1", None)], clock=clock)
        latest = await poller.poll_once()
    assert latest["a"].error is None and len(latest["a"].slots) == 4
    assert latest["b"].error == "/slots: ConnectError: refused" or latest["b"].error.startswith("/metrics: ConnectError")


async def test_a_keep_alive_connection_closed_under_a_request_is_retried_once(upstream, clock):
    failures = {"/slots": 1, "/metrics": 5}

    async def handler(request):
        path = request.url.path
        if failures.get(path, 0) > 0:
            failures[path] -= 1
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return await upstream.handler(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        poller = make_poller(c, clock)
        failures["/metrics"] = 1
        t = (await poller.poll_once())["llama0"]
        assert t.error is None and len(t.slots) == 4  # one retry each was enough
        failures["/metrics"] = 5
        clock.now += 1
        t = (await poller.poll_once())["llama0"]
        assert t.error == "/metrics: RemoteProtocolError: Server disconnected without sending a response."


async def test_backend_names_must_be_unique(client):
    with pytest.raises(ValueError):
        TelemetryPoller(client, [("a", "http://x", None), ("a", "http://y", None)])


async def test_run_awaits_an_async_callback(client, clock):
    poller = make_poller(client, clock, interval_s=0.01)
    got = asyncio.Event()

    async def on_update(latest):
        got.set()

    task = asyncio.create_task(poller.run(on_update))
    try:
        await asyncio.wait_for(got.wait(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_run_calls_on_update_every_interval_and_survives_a_failing_callback(client, upstream, clock):
    poller = make_poller(client, clock, interval_s=0.01)
    updates: list[dict] = []
    done = asyncio.Event()

    def on_update(latest):
        updates.append(latest)
        if len(updates) == 2:
            raise RuntimeError("console went away")
        if len(updates) >= 4:
            done.set()

    task = asyncio.create_task(poller.run(on_update))
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert all(u["llama0"].slots == parse_slots(SLOTS_FRESH) for u in updates)


# --- kvsize: KV bytes per token from the GGUF header ------------------------------------


def formula(n_layer, n_embd, n_head, n_head_kv, bytes_k=2, bytes_v=2):
    head_dim = n_embd // n_head
    return n_layer * (head_dim * n_head_kv * bytes_k + head_dim * n_head_kv * bytes_v)


def test_kv_bytes_per_token_of_the_fast_test_model():
    from tests.llama.make_model import SIZES, cached_model

    spec = SIZES["fast"]
    expected = formula(spec.n_layer, spec.n_embd, spec.n_head, spec.n_head)
    assert expected == 4 * (64 * 4 * 2 * 2) == 4096
    assert kv_bytes_per_token(cached_model("fast")) == expected


def test_kv_bytes_per_token_with_grouped_query_attention(tmp_path):
    from tests.llama.make_model import write_model

    path = tmp_path / "gqa.gguf"
    write_model(path, n_embd=256, n_layer=3, n_head=8, n_head_kv=2, n_ff=64, n_words=20)
    size = kv_size(path)
    assert size.reason is None
    assert (size.arch, size.n_layer, size.n_head, size.n_head_kv, size.head_dim_k) == ("llama", 3, 8, (2, 2, 2), 32)
    assert size.bytes_per_token == formula(3, 256, 8, 2) == 3 * (32 * 2 * 2 * 2)
    # A quantised cache: q8_0 stores 32 elements in 34 bytes.
    assert kv_bytes_per_token(path, cache_type_k="q8_0", cache_type_v="q8_0") == 3 * 2 * (64 * 34 // 32)
    assert kv_bytes_per_token(path, cache_type_k="f32", cache_type_v="f16") == formula(3, 256, 8, 2, 4, 2)


def test_the_session_model_matches_the_documented_geometry():
    from tests.llama.make_model import cached_model

    # 640 / 10 heads = 64 per head, 10 KV heads, 8 layers: 20 KiB per token, 40 MiB for 2048 tokens.
    assert kv_bytes_per_token(cached_model("default")) == 8 * (64 * 10 * 2 * 2) == 20480


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("http://host/model.gguf", "not a local file: http://host/model.gguf"),
        ("/nonexistent/model.gguf", "no such file: /nonexistent/model.gguf"),
    ],
)
def test_paths_that_cannot_be_read_give_none_with_a_reason(path, reason):
    size = kv_size(path)
    assert size.bytes_per_token is None and size.reason == reason
    assert kv_bytes_per_token(path) is None


def test_a_file_that_is_not_gguf_gives_a_reason(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("definitely not gguf")
    size = kv_size(path)
    assert size.bytes_per_token is None
    assert size.reason.startswith("not a readable GGUF file: ")


def test_unknown_cache_type_gives_a_reason(tmp_path):
    assert kv_size(tmp_path, cache_type_k="q3_k").reason == "unknown cache type 'q3_k'"
    assert set(CACHE_TYPES) >= {"f16", "f32", "q8_0", "q4_0"}


def test_without_the_gguf_package_the_answer_is_none_with_a_reason(tmp_path, monkeypatch):
    import builtins

    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf" or name.startswith("gguf."):
            raise ImportError("No module named 'gguf'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    assert kv_size(path).reason == "gguf package not installed"


def test_header_without_head_count_gives_a_reason(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "partial.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = kv_size(path)
    assert size.bytes_per_token is None
    assert size.reason == "GGUF header lacks llama.attention.head_count"


async def test_a_router_model_at_rest_is_not_logged_as_a_telemetry_failure(upstream, clock, caplog):
    # a router's idle model answers its /metrics 400 "model is not loaded": a trial's start-up
    # logged "telemetry failed" at WARNING for every idle model; a real failure still warns
    async def resting(request):
        if request.url.path == "/metrics":
            return httpx.Response(400, json={"error": {"code": 400, "message": "model is not loaded", "type": "invalid_request_error"}})
        return await upstream.handler(request)

    with caplog.at_level(logging.INFO, logger="tokengate.telemetry"):
        async with httpx.AsyncClient(transport=httpx.MockTransport(resting)) as c:
            await make_poller(c, clock).poll_once()
    assert caplog.records and all(r.levelno == logging.INFO for r in caplog.records), [
        (r.levelname, r.getMessage()) for r in caplog.records
    ]
    assert "waits for its model" in caplog.records[0].getMessage()
    caplog.clear()
    upstream.mode = "down"
    with caplog.at_level(logging.INFO, logger="tokengate.telemetry"):
        async with httpx.AsyncClient(transport=httpx.MockTransport(upstream.handler)) as c:
            await make_poller(c, clock).poll_once()
    assert any(r.levelno == logging.WARNING and "telemetry failed" in r.getMessage() for r in caplog.records)


def test_slots_busy_beyond_the_gate_are_said_only_when_two_reads_in_a_row_show_them() -> None:
    """A trial's console read "+1 bypassing the gate" with nothing else connected: one /slots
    answer written before a stream's end and read after the gate let its slot go. Traffic that
    bypasses the gate holds its slot across reads; one read is no evidence."""
    from types import SimpleNamespace

    from gate.observe.snapshots import BypassWatch

    gate_slots = [1]
    unit = SimpleNamespace(name="b0", state="ready", admission=SimpleNamespace(ledger=SimpleNamespace(slots=0)))

    def read(watch: BypassWatch, ts: float, busy: int) -> int:
        unit.admission.ledger.slots = gate_slots[0]
        slots = tuple(SlotInfo(i, 512, i < busy, None, None) for i in range(4))
        tel = BackendTelemetry("b0", ts, slots, None, None, None, None, False, None)
        watch.read({"b0": tel}, [unit])
        return watch.slots.get("b0", 0)

    watch = BypassWatch()
    assert read(watch, 1.0, 2) == 0  # one slot more than the gate's: a race, maybe
    assert read(watch, 2.0, 1) == 0  # gone at the next read: it was
    assert read(watch, 3.0, 2) == 0
    assert read(watch, 3.0, 2) == 0  # the same read again is not a second one
    assert read(watch, 4.0, 3) == 1  # two reads in a row: at least one slot bypasses the gate
    assert read(watch, 5.0, 3) == 2
    gate_slots[0] = 3
    assert read(watch, 6.0, 3) == 0  # the gate's own
