"""llama-server's ``llamacpp:*`` series through the gate's ``GET /metrics``, against the real
llama-server: one backend relayed as it sends them, several labelled by backend, a backend
without ``--metrics`` said by ``tokengate_backend_metrics_up`` 0 and never failing the gate's
own series; promtool reports only llama-server's own naming, never a syntax error."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import httpx
import pytest

from tests.integration.gate_harness import running_gate, wait_until
from tests.llama.server import LlamaServer

pytestmark = pytest.mark.llama

# llama-server's own names, which promtool's lint flags; anything else is the gate's doing
LLAMA_LINT = re.compile(r"^llamacpp:\S+ (metric names should not contain ':'|counter metrics should have \"_total\" suffix)$")


def promtool_problems(text: str) -> list[str]:
    """promtool check metrics: a syntax error fails; lint lines are returned."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run `bash deploy/prometheus/ensure_promtool.sh`")
    proc = subprocess.run([path, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert proc.returncode in (0, 3), f"promtool rejected the text (rc {proc.returncode}): {proc.stderr}{proc.stdout}"
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def samples(text: str, name: str) -> dict[str, float]:
    """labels text ("" when none) -> value, for one sample name."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


class NoMetricsServer(LlamaServer):
    """The real llama-server started without --metrics (its /metrics answers 501)."""

    def command(self) -> list[str]:
        return [a for a in super().command() if a != "--metrics"]


async def test_one_backend_series_are_relayed_as_llama_server_sends_them(llama_split) -> None:
    async with running_gate(llama_split.url, kv="split") as gate, httpx.AsyncClient(timeout=30) as client:
        before = (await client.get(gate.url + "/metrics")).text
        r = await client.post(gate.url + "/completion", json={"prompt": "the cat sat on", "n_predict": 4, "cache_prompt": False})
        assert r.status_code == 200
        resp = await client.get(gate.url + "/metrics")
        direct = await client.get(llama_split.url + "/metrics")
    assert resp.status_code == 200
    text = resp.text
    assert "tokengate_decisions_total" in text  # the gate's own first
    assert text.index("tokengate_decisions_total") < text.index("llamacpp:")
    # unlabelled, as llama-server has them, with its HELP and TYPE once
    predicted = samples(text, "llamacpp:tokens_predicted_total")
    assert set(predicted) == {""}
    assert predicted[""] >= samples(before, "llamacpp:tokens_predicted_total")[""] + 4  # read at scrape time
    assert text.count("# TYPE llamacpp:tokens_predicted_total counter") == 1
    assert set(samples(text, "llamacpp:requests_processing")) == {""}
    assert samples(text, "tokengate_backend_metrics_up") == {'{backend="b0"}': 1.0}
    assert resp.headers["Process-Start-Time-Unix"] == direct.headers["Process-Start-Time-Unix"]
    problems = promtool_problems(text)
    assert all(LLAMA_LINT.match(p) for p in problems), problems


async def test_several_backends_are_labelled_by_backend_with_each_family_once(llama_split, llama_unified) -> None:
    async with running_gate([llama_split.url, llama_unified.url], kv="auto") as gate, httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(gate.url + "/metrics")).text
    predicted = samples(text, "llamacpp:tokens_predicted_total")
    assert set(predicted) == {'{backend="b0"}', '{backend="b1"}'}
    assert text.count("# TYPE llamacpp:tokens_predicted_total counter") == 1
    assert text.count("# HELP llamacpp:requests_processing ") == 1
    assert samples(text, "tokengate_backend_metrics_up") == {'{backend="b0"}': 1.0, '{backend="b1"}': 1.0}
    problems = promtool_problems(text)
    assert all(LLAMA_LINT.match(p) for p in problems), problems


async def test_a_backend_without_metrics_is_said_and_the_gates_own_series_stay(llama_bin, tiny_model, llama_split, tmp_path) -> None:
    with NoMetricsServer(llama_bin, tiny_model, mode="split", ctx=1024, n_slots=2, log_path=tmp_path / "llama.log") as bare:
        assert httpx.get(bare.url + "/metrics").status_code == 501
        async with running_gate(bare.url, kv="split") as gate, httpx.AsyncClient(timeout=30) as client:
            alone = await client.get(gate.url + "/metrics")
        async with running_gate([bare.url, llama_split.url], kv="split") as gate, httpx.AsyncClient(timeout=30) as client:
            mixed = (await client.get(gate.url + "/metrics")).text
    assert alone.status_code == 200
    assert "tokengate_decisions_total" in alone.text and "\nllamacpp:" not in alone.text
    assert samples(alone.text, "tokengate_backend_metrics_up") == {'{backend="b0"}': 0.0}
    assert alone.headers["Process-Start-Time-Unix"].isdigit()  # the gate's own start
    assert promtool_problems(alone.text) == []  # the gate's own series lint clean
    assert samples(mixed, "tokengate_backend_metrics_up") == {'{backend="b0"}': 0.0, '{backend="b1"}': 1.0}
    assert set(samples(mixed, "llamacpp:tokens_predicted_total")) == {'{backend="b1"}'}


async def test_the_throughput_gauges_cover_the_scrapers_window_not_the_gates_last_read(llama_split) -> None:
    """llama-server resets its throughput gauges at each read of /metrics, and the gate's telemetry
    reads it every second: the relayed gauges are recomposed over the scraper's own window
    (gate/backend/rate_window.py; llama.cpp's test_sleep.py::test_server_sleep_metrics_buckets)."""
    async with running_gate(llama_split.url, kv="split") as gate, httpx.AsyncClient(timeout=30) as client:
        await client.get(gate.url + "/metrics")  # the scraper's previous scrape
        r = await client.post(gate.url + "/completion", json={"prompt": "the cat sat on", "n_predict": 8, "cache_prompt": False})
        assert r.status_code == 200
        done = time.monotonic()
        # the gate's own telemetry reads llama-server's /metrics after the generation (and so
        # resets llama-server's window) before the scraper comes back
        await wait_until(lambda: "b0" in gate.telemetry_poller.latest and gate.telemetry_poller.latest["b0"].ts > done)
        first = (await client.get(gate.url + "/metrics")).text
        second = (await client.get(gate.url + "/metrics")).text
    assert samples(first, "llamacpp:predicted_tokens_seconds")[""] > 0
    assert samples(first, "llamacpp:prompt_tokens_seconds")[""] > 0
    assert samples(second, "llamacpp:predicted_tokens_seconds")[""] == 0  # nothing ran since
