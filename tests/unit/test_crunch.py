"""gate.crunch: the pure parts (grid, percentile, breach, recommendation, formats) and the
runner against a scripted llama-server (httpx.MockTransport, a fake clock)."""

from __future__ import annotations

import dataclasses
import io
import json
import re

import httpx
import pytest

from gate.cli import main
from gate.config import parse_config
from gate.tools.crunch import (
    Cell,
    CrunchReport,
    CrunchSettings,
    CrunchUnreachable,
    CrunchUsageError,
    RequestResult,
    ServerInfo,
    Slo,
    build_grid,
    cell_line,
    concurrency_levels,
    config_snippet,
    ctx_label,
    ctx_levels,
    evaluate_cell,
    format_report,
    max_tokens_for,
    normalize_url,
    parse_ctx_list,
    parse_int_list,
    percentile,
    prefill_advice,
    prompt_target,
    recommend,
    report_to_json,
    requests_for,
    rotated_text,
    run_crunch,
    word_sequence,
)

# --- grid -------------------------------------------------------------------------------


def test_concurrency_doubles_up_to_twice_the_slots() -> None:
    assert concurrency_levels(4) == [1, 2, 4, 8]
    assert concurrency_levels(1) == [1, 2]
    assert concurrency_levels(3) == [1, 2, 3, 4, 6]
    assert concurrency_levels(16) == [1, 2, 4, 8, 16, 32]


def test_ctx_levels_keep_only_what_fits_one_slot() -> None:
    assert ctx_levels(8192) == [512, 1024, 2048, 4096]
    assert ctx_levels(2048) == [512, 1024, 2048]
    assert ctx_levels(512) == [512]
    assert ctx_levels(1000) == [512]
    # A slot smaller than every default: the slot's own context is the only column.
    assert ctx_levels(256) == [256]
    # Explicit values are filtered, never replaced.
    assert ctx_levels(512, [256, 512, 1024]) == [256, 512]
    assert ctx_levels(512, [1024, 4096]) == []


def test_grid_is_ctx_then_concurrency() -> None:
    grid = build_grid(4, 2048)
    assert grid == [Cell(ctx=x, concurrency=c) for x in (512, 1024, 2048) for c in (1, 2, 4, 8)]
    assert max(c.concurrency for c in grid) == 8  # 2 x slots
    assert all(c.ctx <= 2048 for c in grid)
    assert build_grid(4, 512, ctx=[256], concurrency=[4, 1, 4]) == [Cell(256, 1), Cell(256, 4)]


def test_request_shape_per_cell() -> None:
    assert prompt_target(4096) == 2048
    assert max_tokens_for(4096) == 128  # ctx/4 capped by the default 128
    assert max_tokens_for(256) == 64
    assert max_tokens_for(256, 16) == 16
    assert max_tokens_for(4096, 2048) == 1024
    assert requests_for(1) == 4
    assert requests_for(8) == 16
    assert requests_for(4, 2) == 4  # at least one full round
    assert requests_for(1, 2) == 2


# --- percentile --------------------------------------------------------------------------


def test_percentile_nearest_rank() -> None:
    assert percentile([]) is None
    assert percentile([7.0]) == 7.0
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 95) == 19.0
    assert percentile(values, 50) == 10.0
    assert percentile(reversed(values), 95) == 19.0
    assert percentile([1, 2, 3, 100], 95) == 100


# --- cells, breach, recommendation -------------------------------------------------------


def ok(ttft: float, tpot: float = 10.0, tokens: int = 16, prompt: int | None = None) -> RequestResult:
    return RequestResult(ok=True, ttft_ms=ttft, tpot_ms=tpot, tokens=tokens, prompt_tokens=prompt)


def fail(msg: str = "HTTP 500: Context size has been exceeded.") -> RequestResult:
    return RequestResult(ok=False, error=msg)


def cell(ctx: int, conc: int, ttft: float, *, failures: int = 0, tpot: float = 10.0, slo: Slo = Slo()):
    prompt, mx = ctx // 2, max_tokens_for(ctx)
    results = [ok(ttft, tpot) for _ in range(max(conc * 2 - failures, 0))] + [fail() for _ in range(failures)]
    return evaluate_cell(Cell(ctx, conc), prompt, mx, results, slo)


def test_evaluate_cell_numbers() -> None:
    results = [ok(t, tpot=t / 10) for t in (100, 200, 300, 400)]
    c = evaluate_cell(Cell(1024, 2), 512, 128, results, Slo())
    assert (c.requests, c.ok, c.failed) == (4, 4, 0)
    assert c.ttft_p95_ms == 400 and c.ttft_p50_ms == 200
    assert c.tpot_p95_ms == 40
    assert c.in_flight_tokens == 2 * (512 + 128)
    assert not c.breach and c.breach_reasons == ()


def test_server_reported_prompt_size_wins_when_larger() -> None:
    c = evaluate_cell(Cell(512, 1), 256, 128, [ok(10, prompt=260), ok(10, prompt=255)], Slo())
    assert c.prompt_tokens == 260
    assert c.in_flight_tokens == 260 + 128


def test_breach_on_ttft_and_on_tpot() -> None:
    slo = Slo(ttft_ms=1000, tpot_ms=50)
    assert cell(512, 1, 999, slo=slo).breach is False
    assert cell(512, 1, 1001, slo=slo).breach_reasons == ("TTFT p95 > 1,000 ms",)
    assert cell(512, 1, 10, tpot=51, slo=slo).breach_reasons == ("latency p95 > 50 ms/token",)
    # TPOT not checked unless asked for.
    assert cell(512, 1, 10, tpot=5000).breach is False


def test_a_failed_request_breaches_its_cell() -> None:
    c = cell(512, 4, 10, failures=1)
    assert c.breach
    assert c.failed == 1 and c.requests == 8
    assert c.breach_reasons == ("1 of 8 requests overfilled the KV cache (llama-server: context size exceeded)",)
    other = evaluate_cell(Cell(512, 4), 256, 128, [ok(10)] * 7 + [fail("HTTP 503: busy")], Slo())
    assert other.breach_reasons == ("1 of 8 requests failed",)
    assert c.errors == (("HTTP 500: Context size has been exceeded.", 1),)
    everything_failed = evaluate_cell(Cell(512, 2), 256, 128, [fail(), fail("HTTP 503: busy"), fail()], Slo())
    assert everything_failed.breach and everything_failed.ttft_p95_ms is None
    assert everything_failed.errors == (("HTTP 500: Context size has been exceeded.", 2), ("HTTP 503: busy", 1))


def test_recommendation_is_75_percent_of_the_largest_non_breaching() -> None:
    cells = [
        cell(512, 1, 100),  # 384 in flight
        cell(512, 2, 2500),  # 768: breaches with less in flight than the pick
        cell(512, 4, 500),  # 1,536
        cell(512, 8, 3000),  # 3,072: breaches TTFT
        cell(1024, 4, 900),  # 4 x (512 + 128) = 2,560: the largest that passes
        cell(1024, 8, 10, failures=1),  # 5,120: a failure breaches however fast it was
    ]
    rec = recommend(cells)
    assert rec is not None
    assert rec.from_cell.cell == Cell(1024, 4)
    assert rec.from_cell.in_flight_tokens == 2560
    assert rec.token_budget == 1920 == 2560 * 3 // 4
    assert 1 <= rec.min_tokens <= rec.token_budget
    assert rec.min_tokens >= max(c.request_tokens for c in cells)  # one largest request fits
    assert [c.cell for c in rec.breached_below] == [Cell(512, 2)]
    assert rec.too_large == ()


def test_requests_beyond_the_slots_hold_no_kv() -> None:
    # 4 slots: at concurrency 8 only 4 requests run; the other 4 wait in llama-server's queue.
    results = [ok(100)] * 16
    over = evaluate_cell(Cell(512, 8), 256, 128, results, Slo(), slots=4)
    assert over.in_flight_tokens == 8 * 384
    assert over.held_tokens == 4 * 384
    within = evaluate_cell(Cell(512, 4), 256, 128, results, Slo(), slots=4)
    assert within.held_tokens == within.in_flight_tokens == 4 * 384
    assert evaluate_cell(Cell(512, 8), 256, 128, results, Slo()).held_tokens == 8 * 384  # slots unknown
    rec = recommend([within, over])
    assert rec is not None
    assert rec.from_cell is within  # equal held tokens: the first in sweep order
    assert rec.token_budget == 1152  # 75% of 1,536, never of the 3,072 the clients had outstanding
    assert cell_line(over).endswith("in-flight: 3,072 tokens (4 slots hold 1,536)")
    # Breaching only by queueing inside llama-server is not a breach "below" the pick.
    slow_queue = evaluate_cell(Cell(512, 8), 256, 128, [ok(5000)] * 16, Slo(), slots=4)
    rec = recommend([within, slow_queue])
    assert rec is not None and rec.from_cell is within and rec.breached_below == ()
    assert "(above 4 concurrent requests the rest wait in llama-server's queue" in format_report(make_report([within, over]))
    assert cell_line(within).endswith("in-flight: 1,536 tokens")


def test_no_recommendation_when_everything_breaches() -> None:
    assert recommend([cell(512, 1, 5000), cell(512, 2, 10, failures=2)]) is None
    assert recommend([]) is None


def test_budget_is_never_below_the_largest_measured_request() -> None:
    # 75% of the 640 in flight would be 480, less than one request of 640: merged into a
    # config, that budget refuses the very requests it was measured with (#22).
    cells = [cell(1024, 1, 100), cell(1024, 2, 10, failures=1)]
    rec = recommend(cells)
    assert rec is not None and rec.token_budget == 640
    assert rec.too_large == ()
    assert rec.min_tokens == rec.token_budget


# --- formats -----------------------------------------------------------------------------


def test_ctx_labels() -> None:
    assert [ctx_label(x) for x in (256, 512, 1024, 1536, 2048, 4096, 32768, 1000)] == [
        "256",
        "512",
        "1K",
        "1.5K",
        "2K",
        "4K",
        "32K",
        "1000",
    ]


def test_cell_line_format() -> None:
    c = evaluate_cell(Cell(4096, 4), 2048, 512, [ok(950.2, 180.4)] * 8, Slo())
    assert cell_line(c) == ("Concurrency: 4 | ctx: 4K | TTFT p95: 950 ms | latency p95: 180 ms/token | in-flight: 10,240 tokens")
    small = evaluate_cell(Cell(256, 1), 128, 16, [ok(7.25, 4.94)], Slo())
    assert "TTFT p95: 7.2 ms | latency p95: 4.9 ms/token | in-flight: 144 tokens" in cell_line(small)
    broken = cell(512, 2, 10, failures=4)
    assert cell_line(broken) == (
        "Concurrency: 2 | ctx: 512 | TTFT p95: - | latency p95: - | in-flight: 768 tokens  "
        "BREACH (4 of 4 requests overfilled the KV cache (llama-server: context size exceeded))"
    )
    slow = cell(512, 2, 2500)
    assert cell_line(slow).endswith("  BREACH (TTFT p95 > 2,000 ms)")


def make_report(cells, slo: Slo = Slo()) -> CrunchReport:
    return CrunchReport(
        server=ServerInfo("http://127.0.0.1:8080", 4, 4096, model="m.gguf"),
        endpoint="chat",
        slo=slo,
        max_tokens_cap=128,
        cells=tuple(cells),
        recommendation=recommend(cells),
        measured_at="2025-01-01 00:00 UTC",
    )


def test_text_report_lines_and_snippet() -> None:
    cells = [cell(512, 1, 100), cell(512, 4, 500), cell(512, 8, 3000), cell(1024, 8, 10, failures=2)]
    text = format_report(make_report(cells))
    lines = text.splitlines()
    table = [l for l in lines if l.startswith("Concurrency: ")]
    assert len(table) == 4
    assert sum("BREACH" in l for l in table) == 2
    assert "    failed 2/16: HTTP 500: Context size has been exceeded. (x2)" in lines
    assert "Recommended token budget: 1,152 tokens (75% of 1,536 in flight at concurrency 4, ctx 512" in text
    assert "[budget]" in lines and "[[backends]]" in lines and "token_budget = 1152" in lines
    assert any(l.startswith("# Measured by `tokengate crunch`") for l in lines)


def test_snippet_is_a_valid_config() -> None:
    cells = [cell(512, 1, 100), cell(512, 4, 500)]
    for slo in (Slo(), Slo(ttft_ms=1500, tpot_ms=80), Slo(ttft_ms=750.5)):
        report = make_report(cells, slo)
        config = parse_config(config_snippet(report, report.recommendation), "snippet")
        assert config.backends[0].token_budget == 1152
        assert config.backends[0].url == "http://127.0.0.1:8080"
        assert config.budget.mode == "adaptive"
        assert config.budget.min_tokens == report.recommendation.min_tokens
        assert config.budget.slo_ttft_p95_ms == slo.ttft_ms
        assert config.budget.slo_tpot_p95_ms == slo.tpot_ms


def test_report_without_recommendation() -> None:
    text = format_report(make_report([cell(512, 1, 5000)]))
    assert "No cell met the objective" in text
    assert "token_budget" not in text
    assert report_to_json(make_report([cell(512, 1, 5000)]))["recommendation"] is None


def test_json_shape() -> None:
    cells = [cell(512, 1, 100), cell(512, 4, 500), cell(512, 8, 10, failures=1)]
    data = json.loads(json.dumps(report_to_json(make_report(cells, Slo(ttft_ms=2000, tpot_ms=50)))))
    assert data["server"] == {
        "url": "http://127.0.0.1:8080",
        "total_slots": 4,
        "slot_ctx": 4096,
        "model": "m.gguf",
        "build": None,
        "kv": None,
        "pool": None,
        "capacity_tokens": None,
        "layout": "4 slots x 4,096 tokens per slot (unified or split: not known; a unified pool is shared, not multiplied)",
    }
    assert data["endpoint"] == "/v1/chat/completions"
    assert data["slo"] == {"ttft_p95_ms": 2000, "tpot_p95_ms": 50}
    assert [(c["concurrency"], c["ctx"]) for c in data["cells"]] == [(1, 512), (4, 512), (8, 512)]
    first = data["cells"][0]
    assert set(first) == {
        "concurrency",
        "ctx",
        "prompt_tokens",
        "max_tokens",
        "in_flight_tokens",
        "held_tokens",
        "requests",
        "ok",
        "failed",
        "ttft_p50_ms",
        "ttft_p95_ms",
        "tpot_p50_ms",
        "tpot_p95_ms",
        "tokens_per_s",
        "breach",
        "breach_reasons",
        "errors",
    }
    assert first["in_flight_tokens"] == 384 and first["breach"] is False
    bad = data["cells"][2]
    assert bad["breach"] is True and bad["failed"] == 1
    assert bad["errors"] == [{"error": "HTTP 500: Context size has been exceeded.", "count": 1}]
    rec = data["recommendation"]
    assert rec["token_budget"] == 1152 and rec["in_flight_tokens"] == rec["held_tokens"] == 1536
    assert (rec["concurrency"], rec["ctx"], rec["fraction"]) == (4, 512, 0.75)
    assert "token_budget = 1152" in rec["config"]


def test_a_long_prefill_over_half_the_objective_gets_batch_size_advice() -> None:
    # ctx 4K alone: a 2,048-token prompt took 1,600 ms (1,280 tok/s) against a 2,000 ms objective.
    cells = [cell(512, 1, 150), cell(4096, 1, 1600), cell(4096, 4, 1900)]
    advice = prefill_advice(cells, Slo(ttft_ms=2000))
    assert advice is not None and advice.prompt_tokens == 2048
    assert advice.ubatch == 512  # 1,280 tok/s x 0.5 s = 640 -> the power of two below
    text = format_report(make_report(cells))
    assert "-b 512 -ub 512" in text
    assert report_to_json(make_report(cells))["prefill_advice"]["llama_server_flags"] == "-b 512 -ub 512"


def test_no_batch_size_advice_when_prefills_are_short_or_unmeasured() -> None:
    assert prefill_advice([cell(512, 1, 150), cell(4096, 1, 900)], Slo(ttft_ms=2000)) is None
    assert prefill_advice([cell(4096, 2, 1900)], Slo(ttft_ms=2000)) is None  # no concurrency-1 cell
    assert prefill_advice([cell(4096, 1, 1900)], Slo(ttft_ms=None)) is None
    assert report_to_json(make_report([cell(512, 1, 100)]))["prefill_advice"] is None


# --- arguments and prompts ---------------------------------------------------------------


def test_list_parsing() -> None:
    assert parse_ctx_list("512,1k, 2K,4096,512") == (512, 1024, 2048, 4096)
    assert parse_ctx_list("1.5k") == (1536,)
    assert parse_int_list("8,1,4") == (1, 4, 8)
    for bad in ("", "x", "0", "-1"):
        with pytest.raises(ValueError):
            parse_int_list(bad)
    for bad in ("", "abc", "2"):
        with pytest.raises(ValueError):
            parse_ctx_list(bad)


def test_normalize_url() -> None:
    assert normalize_url("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
    assert normalize_url("localhost:8080") == "http://localhost:8080"
    assert normalize_url("https://llm.internal") == "https://llm.internal"
    for bad in ("ftp://x", "http://h:8080/v1", "http://", "http://h:99999"):
        with pytest.raises(ValueError):
            normalize_url(bad)


def test_prompts_are_plain_words_rotated_per_request() -> None:
    words = word_sequence(50)
    assert words == word_sequence(50) and all(w.isalpha() for w in words)
    a, b = rotated_text(words, 1), rotated_text(words, 2)
    assert a != b and sorted(a.split()) == sorted(b.split()) == sorted(words)


# --- CLI usage errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["crunch", "--ctx", "abc"],
        ["crunch", "--concurrency", "0"],
        ["crunch", "--requests", "-1"],
        ["crunch", "--slo-ttft-ms", "0"],
        ["crunch", "--endpoint", "nope"],
        ["crunch", "http://127.0.0.1:8080/v1"],
        ["crunch", "--api-key-env", "TOKENGATE_TEST_SURELY_UNSET"],
    ],
)
def test_usage_errors_exit_2(argv, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err


def test_unreachable_server_exits_1(capsys) -> None:
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    assert main(["crunch", "http://127.0.0.1:1", "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "cannot reach llama-server at http://127.0.0.1:1" in err


# --- the runner against a scripted server ------------------------------------------------


class FakeClock:
    """Every reading is 10 ms after the previous one: timings become deterministic."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.010
        return self.t


def scripted_server(*, slots=2, n_ctx=512, fail_above: int | None = None, gate=False, kv_unified: bool | None = None):
    """A llama-server stand-in: /props, /apply-template, /tokenize (one token per word) and a
    streaming chat that answers 500 "Context size has been exceeded" once more than
    ``fail_above`` requests are running at the same time (it never is: MockTransport runs one at
    a time, so ``fail_above=0`` fails every request)."""
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/props":
            props = {"total_slots": slots, "default_generation_settings": {"n_ctx": n_ctx}, "model_path": "/models/tiny.gguf"}
            if kv_unified is not None:
                props["kv_unified"] = kv_unified
            return httpx.Response(200, json=props)
        body = json.loads(request.content)
        if path == "/apply-template":
            return httpx.Response(200, json={"prompt": "<u> " + body["messages"][0]["content"] + " <a>"})
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": list(range(len(body["content"].split()) + 1))})
        if path == "/v1/chat/completions":
            seen.append({**body, "_connection": request.headers.get("connection")})
            if fail_above == 0:
                return httpx.Response(
                    500, json={"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}
                )
            n = body["max_tokens"]
            chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}]
            chunks += [{"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]} for i in range(n)]
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            prompt = len(body["messages"][0]["content"].split()) + 3
            chunks.append({"choices": [], "usage": {"completion_tokens": n, "prompt_tokens": prompt}})
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            headers = {"content-type": "text/event-stream"}
            if gate:
                headers["x-tokengate-class"] = "interactive"
            return httpx.Response(200, content=text.encode(), headers=headers)
        return httpx.Response(404)

    return httpx.MockTransport(handler), seen


async def test_runner_measures_every_cell() -> None:
    transport, seen = scripted_server(slots=2, n_ctx=512)
    settings = CrunchSettings(url="http://llama", ctx=(256, 512, 1024), requests=None, max_tokens=16)
    err = io.StringIO()
    report = await run_crunch(settings, err=err, clock=FakeClock(), transport=transport)
    assert report.skipped_ctx == (1024,)
    assert [(c.ctx, c.concurrency) for c in report.cells] == [(x, c) for x in (256, 512) for c in (1, 2, 4)]
    for c in report.cells:
        assert c.requests == c.ok == max(2 * c.concurrency, 4)
        assert c.max_tokens == 16
        # /tokenize counts words + 1 after the template adds 2: the prompt fits ctx/2 ...
        assert c.prompt_tokens <= c.ctx // 2 + 1
        assert c.prompt_tokens >= c.ctx // 2 - 2
        assert c.in_flight_tokens == c.concurrency * (c.prompt_tokens + 16)
        # The fake clock: the first chunk (role) one tick after the start, then one tick per
        # chunk: 16 tokens and the finish chunk, over the 15 gaps after the first token.
        assert c.ttft_p95_ms == pytest.approx(10.0)
        assert c.tpot_p95_ms == pytest.approx(10.0 * 17 / 15)
    bodies = [b for b in seen if b["max_tokens"] == 16]
    assert all(b["stream"] and b["ignore_eos"] and b["cache_prompt"] is False for b in bodies)
    # llama-server drops a kept-alive connection after a stream: streams never reuse one.
    assert all(b["_connection"] == "close" for b in seen)
    prompts = [b["messages"][0]["content"] for b in bodies]
    assert len(set(prompts)) == len(prompts)  # no two requests share a prompt
    rec = report.recommendation
    assert rec is not None
    assert rec.from_cell.cell == Cell(512, 2)
    # 75% of the pick is below one slot's 512: the budget is the slot, the 75% is the floor.
    assert rec.latency_tokens == rec.min_tokens == rec.from_cell.held_tokens * 3 // 4 < 512
    assert rec.token_budget == 512
    # 2 slots: concurrency 4 holds no more than concurrency 2, so the first of them is the pick.
    assert report.cells[-1].held_tokens == report.cells[-2].held_tokens
    assert "Concurrency: 4 | ctx: 512" in err.getvalue()  # per-cell progress when not a terminal


async def test_runner_failures_breach() -> None:
    transport, _ = scripted_server(fail_above=0)
    settings = CrunchSettings(url="http://llama", ctx=(256,), concurrency=(1, 2), requests=2, max_tokens=8)
    report = await run_crunch(settings, err=None, clock=FakeClock(), transport=transport)
    assert all(c.breach and c.failed == c.requests for c in report.cells)
    assert report.cells[0].errors == (("HTTP 500: Context size has been exceeded.", 2),)
    assert report.recommendation is None


async def test_runner_refuses_the_gate() -> None:
    transport, _ = scripted_server(gate=True)
    settings = CrunchSettings(url="http://gate", ctx=(256,), concurrency=(1,), requests=1, max_tokens=4)
    with pytest.raises(CrunchUsageError, match="tokengate gate"):
        await run_crunch(settings, clock=FakeClock(), transport=transport)


async def test_runner_ctx_that_fits_nothing_is_a_usage_error() -> None:
    transport, _ = scripted_server(n_ctx=512)
    settings = CrunchSettings(url="http://llama", ctx=(1024, 2048))
    with pytest.raises(CrunchUsageError, match="512"):
        await run_crunch(settings, transport=transport)


async def test_runner_not_llama_server() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(CrunchUnreachable, match="cannot reach"):
        await run_crunch(CrunchSettings(url="http://llama"), transport=httpx.MockTransport(handler))


def test_progress_bar_on_a_terminal() -> None:
    from gate.tools.crunch import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    p = Progress(stream, 4, width=8)
    p.cell_started("concurrency 1, ctx 256")
    p.advance()
    p.advance()
    p.cell_finished(evaluate_cell(Cell(256, 1), 128, 16, [ok(50), ok(60)], Slo()))
    p.close()
    text = stream.getvalue()
    assert "\rcrunch [####----] 2/4 requests  concurrency 1, ctx 256" in text
    # The finished cell's line replaces the bar (cleared first), the bar is redrawn after it.
    assert "\r\x1b[K[2/4] Concurrency: 1 | ctx: 256 | TTFT p95: 60 ms" in text
    assert re.search(r"\r\x1b\[K$", text)


def test_the_recommendation_merges_into_the_example_config_and_admits_its_largest_request() -> None:
    # The numbers: 382-token requests, 75% of 382 would have been 286.
    from gate.config import EXAMPLE_CONFIG
    from gate.config.edit import set_keys
    from gate.core.admission import reservations_in_force
    from gate.tools.crunch.report import config_edits, edit_command, fit_classes

    cells = [cell(512, 1, 100), cell(512, 2, 10, failures=1)]
    largest = max(c.request_tokens for c in cells)
    report = CrunchReport(
        server=ServerInfo("http://127.0.0.1:8080", 4, 512, kv="split"),
        endpoint="chat",
        slo=Slo(ttft_ms=2000.0),
        max_tokens_cap=512,
        cells=tuple(cells),
        recommendation=recommend(cells, slot_ctx=512),
    )
    assert report.recommendation is not None
    rec = fit_classes(report, report.recommendation)
    assert rec.token_budget >= largest
    edits = config_edits(report, rec)
    merged = parse_config(set_keys(EXAMPLE_CONFIG, edits), "merged")  # validates: no second [budget]
    assert merged.backends[0].token_budget == rec.token_budget and merged.budget.min_tokens == dict(edits)["budget.min_tokens"]
    in_force = reservations_in_force(merged.classes, rec.token_budget)
    for c in merged.classes:  # every class can reach a whole slot and a default request
        others = sum(n for name, n in in_force.items() if name != c.name)
        assert rec.token_budget - others >= 512 >= largest
        assert c.default_max_tokens + 64 <= rec.token_budget - others
    text = format_report(report)
    assert "Paste into tokengate.toml" not in text
    assert edit_command(edits) in text and "'backends[0].token_budget=" in text
    # by hand: each line says which table the key goes in, never a dotted key that is not TOML
    by_hand = text.split("or by hand:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert f"  in [budget]: min_tokens = {dict(edits)['budget.min_tokens']}" in by_hand
    assert f"  in the [[backends]] table number 1: token_budget = {rec.token_budget}" in by_hand
    assert not any("[0]" in line or "budget.min" in line for line in by_hand)


def test_progress_moves_inside_a_cell_with_its_tokens() -> None:
    from gate.tools.crunch.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    p = Progress(out, 4)
    p.cell_started("concurrency 4, ctx 4K", expected_tokens=400)
    for _ in range(100):
        p.token()
        p._drawn_at = 0.0  # as if 0.2 s went by between tokens
    assert "25% of its 400 tokens" in out.getvalue().rsplit("\r", 1)[-1]
    assert p.done == 0  # no request finished: the bar still moved


def test_a_budget_below_one_slot_says_it_refuses_what_llama_server_serves() -> None:
    """A trial's crunch (4 slots x 1,024) recommended token_budget = 544; merged, the gate
    answered a 640-token request (340 prompt + 300 max_tokens) with 400
    context_length_exceeded, "can never hold more than 544", which llama-server served alone.
    Nothing in the report said so: the budget is a cap on one request's size too."""
    cells = [cell(512, 1, 100), cell(512, 4, 500), cell(512, 8, 3000)]
    report = make_report(cells)  # 4 slots x 4,096 tokens
    rec = report.recommendation
    assert rec is not None and rec.token_budget == 1152 < report.server.slot_ctx
    text = format_report(report)
    assert (
        "note: this budget is also the largest request the gate admits: it refuses (400 context_length_exceeded) "
        "every request over 1,152 tokens (prompt + max_tokens), which llama-server serves up to 4,096 in one slot"
    ) in " ".join(text.split())
    snippet = config_snippet(report, rec)
    assert "# the largest request it admits: over 1,152 tokens is a 400 (one slot holds 4,096)" in snippet
    wide = dataclasses.replace(report, server=ServerInfo("http://127.0.0.1:8080", 4, 1152, model="m.gguf"))
    assert "largest request the gate admits" not in format_report(wide)  # a slot holds no more than the budget


# --- the budget is never below one slot; reservations never silently changed (a user's trial) ---


def trial_report(server: ServerInfo) -> CrunchReport:
    """The trial: --ctx 512 --concurrency 1,4 --max-tokens 16: 256 prompt + 16 = 272 per request;
    concurrency 1 met the objective, concurrency 4 did not."""
    cells = [cell(512, 1, 100), cell(512, 4, 5000)]
    cells = [dataclasses.replace(c, max_tokens=16) for c in cells]
    return CrunchReport(
        server=server,
        endpoint="chat",
        slo=Slo(),
        max_tokens_cap=16,
        cells=tuple(cells),
        recommendation=recommend(cells, slot_ctx=server.slot_ctx),
    )


def _merged(report: CrunchReport):
    from gate.config import EXAMPLE_CONFIG
    from gate.config.edit import set_keys
    from gate.tools.crunch.report import config_plan, fit_classes

    assert report.recommendation is not None
    rec = fit_classes(report, report.recommendation)
    edits, notes = config_plan(report, rec)
    return rec, dict(edits), notes, parse_config(set_keys(EXAMPLE_CONFIG, edits), "merged")


@pytest.mark.parametrize(
    "server",
    [
        ServerInfo("http://127.0.0.1:8080", 4, 512, kv="split"),  # llama-server -np 4 -c 2048
        ServerInfo("http://127.0.0.1:8080", 4, 2048, kv="unified"),  # -np 4 -c 2048 -kvu
        ServerInfo("http://127.0.0.1:8080", 4, 512),  # layout not known
    ],
)
def test_the_budget_is_never_below_one_slot_and_says_why(server: ServerInfo) -> None:
    """The trial recommended 272 (split) and 432 (unified): pasted, the gate refused (400)
    every request between 273 tokens and the slot's context, which llama-server serves."""
    from gate.core.admission import reservations_in_force

    report = trial_report(server)
    rec = report.recommendation
    assert rec is not None
    assert rec.latency_tokens == 272 and rec.min_tokens == 272  # what the objective gave: the floor
    assert rec.token_budget == server.slot_ctx and rec.raised_to_slot
    final, edits, _, merged = _merged(report)
    assert edits["backends[0].token_budget"] == final.token_budget >= server.slot_ctx
    if server.kv is not None:
        assert final.token_budget <= (server.capacity or 0)  # never more than the server holds
    text = " ".join(format_report(report).split())
    assert (
        "note: the latency objective was met only up to 272 tokens in flight (concurrency 1, ctx 512), which suggests "
        "a budget of 272 (the largest request measured; 75% of it would not hold one); "
        f"a budget below one slot's {server.slot_ctx:,} would refuse (400) requests llama-server can serve"
    ) in text
    assert "budget.mode = adaptive" in text
    assert f"Recommended token budget: {final.token_budget:,} tokens (one slot's context" in text
    assert "is also the largest request the gate admits" not in text
    if server.kv == "split":
        # room beside interactive's reservation: every class reaches a whole slot (4 x 512 = 2,048 held)
        in_force = reservations_in_force(merged.classes, final.token_budget)
        for c in merged.classes:
            assert final.token_budget - sum(n for name, n in in_force.items() if name != c.name) >= 512
        assert "raised from 512 to 1,024 so that every class reaches one slot's 512 tokens" in text
    if server.kv == "unified":
        # one pool of 2,048: interactive's 1,024 leaves batch 1,024, and the report says so
        assert final.token_budget == 2048
        assert (
            "note: class batch reaches at most 1,024 tokens of the budget (reserved for other classes: interactive 1,024): "
            "the gate refuses (400) its requests over 1,024 tokens, which one slot (2,048) holds"
        ) in text


@pytest.mark.parametrize(
    "server, slot",
    [
        (ServerInfo("http://127.0.0.1:8080", 4, 512, kv="split"), 512),
        (ServerInfo("http://127.0.0.1:8080", 4, 2048, kv="unified"), 2048),
        (ServerInfo("http://127.0.0.1:8080", 4, 512), None),  # a Recommendation without the slot: the old path
    ],
)
def test_reservations_are_never_zeroed_nor_changed_silently(server: ServerInfo, slot: int | None) -> None:
    """The trial's edits set classes.interactive.reserved_tokens=0 (144 in another run) to fit a
    small budget, without a word: interactive lost its protection."""
    report = trial_report(server)
    if slot is None:
        report = dataclasses.replace(report, recommendation=recommend(report.cells))
    _, edits, notes, merged = _merged(report)
    text = format_report(report)
    interactive = next(c for c in merged.classes if c.name == "interactive")
    assert interactive.reserved_tokens >= 1
    for key, value in edits.items():
        if key.endswith(".reserved_tokens"):
            assert value >= 1
            # said, with the old and new value and why, in the report
            assert any(n.startswith(f"{key} 1,024 -> {value:,}: ") and "not removed" in n for n in notes)
            assert f"note: {key} 1,024 -> {value:,}: " in text
    if "classes.interactive.reserved_tokens" not in edits:
        assert interactive.reserved_tokens == 1024
    if edits["budget.min_tokens"] != report.recommendation.min_tokens:  # raised to hold the reservations
        assert any(n.startswith(f"budget.min_tokens {edits['budget.min_tokens']:,} rather than ") for n in notes)
        # and the complete file below the edits, whose classes reserve nothing, says why its floor
        # is lower (a trial read 512 in the edits and 272 in the file as a contradiction)
        complete = text.split("complete tokengate.toml", 1)[1]
        assert f"with your file's reservations it is {edits['budget.min_tokens']:,}" in complete, complete
    if server.kv == "unified":
        assert "classes.interactive.reserved_tokens" not in edits  # 1,024 fits half the 2,048 pool: kept
        assert edits["budget.min_tokens"] == 1024


def test_unified_header_says_the_slots_share_one_pool() -> None:
    """The trial's header, "4 slots x 2,048 tokens per slot", read as 8,192 tokens on -kvu."""
    unified = trial_report(ServerInfo("http://127.0.0.1:8080", 4, 2048, model="m.gguf", kv="unified"))
    text = format_report(unified)
    assert text.splitlines()[0] == "tokengate crunch: http://127.0.0.1:8080: 4 slots sharing a 2,048-token pool, model m.gguf"
    assert "tokens per slot" not in text and "4 slots x 2,048" not in text
    assert "against 4 slots sharing a 2,048-token pool" in text  # the snippet's comment too
    capped = ServerInfo("http://x", 4, 4096, kv="unified", pool=8192)
    assert capped.layout == "4 slots sharing a 8,192-token pool (at most 4,096 per slot)" and capped.capacity == 8192
    split = format_report(trial_report(ServerInfo("http://127.0.0.1:8080", 4, 512, kv="split")))
    assert split.splitlines()[0] == "tokengate crunch: http://127.0.0.1:8080: 4 slots x 512 tokens per slot"
    data = report_to_json(unified)
    assert data["server"]["kv"] == "unified" and data["server"]["capacity_tokens"] == 2048


def test_a_pool_overflow_is_reported_as_such() -> None:
    """crunch's concurrency-4 sweep at ctx 2K overfilled a unified 2,048 pool: llama-server
    answered 500 "Context size has been exceeded", which read as a generic failure."""
    overflow = evaluate_cell(Cell(2048, 4), 1024, 16, [ok(10)] * 4 + [fail()] * 4, Slo())
    assert overflow.breach_reasons == ("4 of 8 requests overfilled the KV cache (llama-server: context size exceeded)",)
    mixed = evaluate_cell(Cell(2048, 4), 1024, 16, [ok(10)] * 6 + [fail(), fail("timed out after 60 s")], Slo())
    assert mixed.breach_reasons == (
        "1 of 8 requests overfilled the KV cache (llama-server: context size exceeded)",
        "1 of 8 requests failed",
    )


async def test_runner_learns_a_unified_pool_from_props() -> None:
    transport, _ = scripted_server(slots=4, n_ctx=2048, kv_unified=True)
    settings = CrunchSettings(url="http://llama", ctx=(512,), concurrency=(1,), requests=1, max_tokens=8)
    err = io.StringIO()
    report = await run_crunch(settings, err=err, clock=FakeClock(), transport=transport)
    assert report.server.kv == "unified" and report.server.capacity == 2048
    assert "crunch: http://llama: 4 slots sharing a 2,048-token pool;" in err.getvalue()
    rec = report.recommendation
    assert rec is not None and rec.token_budget == 2048 and rec.slot_ctx == 2048


def test_a_budget_raised_for_the_classes_says_so_and_not_that_a_request_did_not_fit() -> None:
    """The trial's split server met the objective at concurrency 4 (1,088 in flight: 816 at 75%,
    above the slot's 512); the budget was raised to 1,024 for interactive's reservation and the
    headline blamed "the largest request measured", which was 272."""
    cells = [cell(512, 1, 100), cell(512, 4, 500)]
    cells = [dataclasses.replace(c, max_tokens=16) for c in cells]
    server = ServerInfo("http://127.0.0.1:8080", 4, 512, kv="split")
    report = CrunchReport(server, "chat", Slo(), 16, tuple(cells), recommend(cells, slot_ctx=512))
    text = " ".join(format_report(report).split())
    assert "Recommended token budget: 1,024 tokens (75% of 1,088 in flight at concurrency 4, ctx 512" in text
    assert "gave 816; raised for the classes, see below)" in text
    assert "note: token_budget raised from 816 to 1,024 so that every class reaches one slot's 512 tokens" in text
    assert "the largest request measured" not in text and "would not hold one" not in text


@pytest.mark.parametrize("json_out", [False, True])
def test_no_cell_meeting_the_objective_exits_1(json_out, capsys, monkeypatch) -> None:
    """A first-day trial's `crunch URL --slo-ttft-ms 10` printed "No cell met the objective, so no
    budget is recommended" and exited 0: a script went on as if it had a budget. Exit 1, as
    the help's exit codes say; a recommendation is still 0."""
    import gate.tools.crunch as crunch

    reports = {"none": make_report([cell(512, 1, 5000)]), "met": make_report([cell(512, 1, 100), cell(512, 2, 200)])}
    for name, code in (("none", 1), ("met", 0)):

        async def fake_run(settings, err=None, report=reports[name]):
            return report

        monkeypatch.setattr(crunch, "run_crunch", fake_run)
        assert main(["crunch", "http://127.0.0.1:8080", "--slo-ttft-ms", "10", *(["--json"] if json_out else [])]) == code, name
        out, err = capsys.readouterr()
        assert ("no budget recommended" in err) == (name == "none"), err
        if name == "none" and not json_out:
            assert "No cell met the objective" in out
    main(["crunch", "--help"])
    assert "no cell met the objective, so no\n     budget is recommended" in capsys.readouterr().out
