"""`tokengate crunch` against the real llama-server (``llama_split``: 4 slots x 512 tokens).

A small sweep only (ctx 256 or 128, concurrency up to 4, a few requests of 8-16 tokens), so the shared
server is busy for seconds and idle again when each test returns: crunch awaits every request
it started before it prints.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from gate.cli import main

pytestmark = pytest.mark.llama

# Generous: this checks the plumbing, not the speed of a shared 2-core machine.
SMALL = ["--ctx", "256", "--concurrency", "1,4", "--requests", "2", "--max-tokens", "16", "--slo-ttft-ms", "30000"]


def test_crunch_json_against_llama_server(llama_split, capsys) -> None:
    code = main(["crunch", llama_split.url, *SMALL, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)  # stdout is the JSON document alone; progress went to stderr
    assert "Concurrency: 4 | ctx: 256" in err

    assert data["server"]["url"] == llama_split.url
    assert data["server"]["total_slots"] == 4
    assert data["server"]["slot_ctx"] == 512
    assert data["endpoint"] == "/v1/chat/completions"
    cells = data["cells"]
    assert [(c["concurrency"], c["ctx"]) for c in cells] == [(1, 256), (4, 256)]
    for c in cells:
        assert c["requests"] == max(2, c["concurrency"])  # at least one full round
        assert c["ok"] == c["requests"] and c["failed"] == 0, c["errors"]
        assert c["max_tokens"] == 16
        # ~ctx/2 tokens measured with /tokenize (the server's own count may add a token or two).
        assert 100 <= c["prompt_tokens"] <= 132
        assert c["in_flight_tokens"] == c["concurrency"] * (c["prompt_tokens"] + c["max_tokens"])
        assert c["held_tokens"] == c["in_flight_tokens"]  # concurrency within the 4 slots
        for key in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms", "tokens_per_s"):
            assert c[key] > 0, key
        assert c["ttft_p95_ms"] >= c["ttft_p50_ms"]
        assert c["breach"] is False and c["breach_reasons"] == []

    rec = data["recommendation"]
    assert rec is not None
    passing = [c for c in cells if not c["breach"]]
    best = max(passing, key=lambda c: c["held_tokens"])
    assert (rec["concurrency"], rec["ctx"]) == (best["concurrency"], best["ctx"]) == (4, 256)
    assert rec["in_flight_tokens"] == best["in_flight_tokens"]
    largest = max(c["prompt_tokens"] + c["max_tokens"] for c in cells)
    assert rec["latency_tokens"] == max(math.floor(0.75 * best["in_flight_tokens"]), largest)
    # crunch learns the split layout from the local server's command line, as the gate does
    assert data["server"]["kv"] == "split" and data["server"]["layout"] == "4 slots x 512 tokens per slot"
    # never below one slot: 75% of ~576 in flight is below the slot's 512 (a user's trial)
    assert rec["token_budget"] >= 512 and rec["raised_to_slot"] is (rec["latency_tokens"] < 512)
    assert rec["token_budget"] <= 4 * 512
    assert rec["edits"]["backends[0].token_budget"] == rec["token_budget"]
    assert all(v >= 1 for k, v in rec["edits"].items() if k.endswith(".reserved_tokens"))
    assert 1 <= rec["min_tokens"] <= rec["token_budget"]
    assert f"token_budget = {rec['token_budget']}" in rec["config"]
    assert f'url = "{llama_split.url}"' in rec["config"]


def test_crunch_text_against_llama_server(llama_split, capsys) -> None:
    # Smaller still (the JSON test covers the numbers): ctx 128, concurrency 1 and 2.
    tiny = ["--ctx", "128", "--concurrency", "1,2", "--requests", "2", "--max-tokens", "8", "--slo-ttft-ms", "30000"]
    code = main(["crunch", llama_split.url, *tiny, "--endpoint", "completion"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [l for l in out.splitlines() if l.startswith("Concurrency: ")]
    assert len(lines) == 2
    pattern = re.compile(
        r"Concurrency: (\d+) \| ctx: 128 \| TTFT p95: ([\d,.]+) ms \| "
        r"latency p95: ([\d,.]+) ms/token \| in-flight: ([\d,]+) tokens$"
    )
    seen = []
    for line in lines:
        m = pattern.match(line)
        assert m, line
        seen.append(int(m.group(1)))
        assert float(m.group(2).replace(",", "")) > 0
        assert float(m.group(3).replace(",", "")) > 0
    assert seen == [1, 2]
    assert "/completion streaming" in out
    assert "Recommended token budget:" in out
    assert "[budget]" in out and "[[backends]]" in out
    assert re.search(r"^token_budget = \d+$", out, re.M)


def test_crunch_says_the_unified_slots_share_one_pool(llama_unified, capsys) -> None:
    """-kvu: 4 slots share one 2,048-token pool; a user's trial read "4 slots x 2,048 tokens per
    slot" as 8,192 and was recommended less than one slot."""
    tiny = ["--ctx", "256", "--concurrency", "1", "--requests", "1", "--max-tokens", "8", "--slo-ttft-ms", "30000"]
    code = main(["crunch", llama_unified.url, *tiny])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"tokengate crunch: {llama_unified.url}: 4 slots sharing a 2,048-token pool")
    assert "tokens per slot" not in out
    assert "'backends[0].token_budget=2048'" in out  # the pool: one request may fill it
    # ~144 tokens in flight met the objective: said, and kept as the floor rather than the budget
    assert "note: the latency objective was met only up to" in " ".join(out.split())
    assert "a budget below one slot's 2,048 would refuse (400) requests llama-server can serve" in " ".join(out.split())
