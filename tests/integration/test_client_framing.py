"""What real clients send that hand-written tests do not: HTTP/1.0, compressed request bodies.

Real gate (open mode) in front of the real llama-server, over raw sockets where httpx
cannot speak the protocol asked for.

* HTTP/1.0 (ApacheBench, `curl --http1.0`, health checkers, proxies speaking 1.0 upstream):
  such a client cannot read chunked framing (RFC 9112 6.1: a server must not send it).
  llama-server answers a whole JSON body with Content-Length; the gate, which writes its
  whole answers (assembled, relayed plain, or its own errors) after the journal commit,
  sent them chunked without a length: the client read `2d9\\r\\n{...}\\r\\n0\\r\\n\\r\\n`.
* `Content-Encoding` on a request body: llama-server reads none (415). The gate ignored the
  header: a gzip body was a misleading 400 "not valid UTF-8", and a plain body labelled
  `br` was admitted, reserved and forwarded with its label, to be answered 415 by
  llama-server ("backend answered 415", journaled as upstream_error).
"""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import pytest

from tests.integration.gate_harness import ledger_total, released, running_gate
from tests.integration.hardening import CHAT, chat, record_of, still_serves

pytestmark = pytest.mark.llama


async def http10(url: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[str, dict[str, str], bytes]:
    """One HTTP/1.0 POST over a raw socket: the status line, the headers (lower-case names), the body
    as read up to the close (HTTP/1.0 has no other end unless Content-Length gives one)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = [f"POST {path} HTTP/1.0", f"Host: {host}", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    raw = await asyncio.wait_for(reader.read(), 30)  # to EOF
    writer.close()
    top, _, rest = raw.partition(b"\r\n\r\n")
    status, *lines = top.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, fields, rest


def assert_unchunked(fields: dict[str, str], body: bytes) -> None:
    assert "chunked" not in fields.get("transfer-encoding", ""), fields
    assert fields.get("content-length") == str(len(body)), (fields, body[:80])


ROWS = [
    pytest.param(chat(4), 200, id="assembled-answer"),
    pytest.param(chat(4, logprobs=True, top_logprobs=2), 200, id="plain-relayed-answer"),
    pytest.param(chat(4000), 400, id="gate-refusal-never-fits"),
    pytest.param({"model": "tiny", "messages": "hi"}, 400, id="gate-refusal-invalid"),
]


@pytest.mark.parametrize(("payload", "status"), ROWS)
async def test_http10_client_gets_a_length_not_chunks(llama_split, payload, status):
    async with running_gate(llama_split.url, kv="split") as gate:
        line, fields, body = await http10(gate.url, CHAT, json.dumps(payload).encode(), {"X-Request-Id": "old-client"})
        assert line.split()[1] == str(status), (line, body[:200])
        assert_unchunked(fields, body)
        answer = json.loads(body)  # the JSON itself, no chunk-size lines around it
        assert ("choices" in answer) if status == 200 else ("error" in answer), answer
        record = await record_of(gate, "old-client")
        assert record.http_status == status
        await released(gate)


async def test_http10_through_the_gate_reads_as_straight_to_llama_server(llama_split):
    """The same request straight to llama-server: it frames its answer with a length too."""
    async with running_gate(llama_split.url, kv="split") as gate:
        straight = await http10(llama_split.url, CHAT, json.dumps(chat(4)).encode())
        through = await http10(gate.url, CHAT, json.dumps(chat(4)).encode())
        for _, fields, body in (straight, through):
            assert_unchunked(fields, body)
            assert json.loads(body)["object"] == "chat.completion"
        await released(gate)


ENCODED = [
    pytest.param(gzip.compress(json.dumps(chat(4)).encode()), "gzip", id="gzip-body"),
    pytest.param(json.dumps(chat(4)).encode(), "br", id="plain-body-labelled-br"),
    pytest.param(json.dumps(chat(4)).encode(), "gzip, identity", id="list-of-codings"),
]


@pytest.mark.parametrize(("content", "coding"), ENCODED)
async def test_encoded_request_body_is_415_before_admission(llama_split, content, coding):
    async with running_gate(llama_split.url, kv="split") as gate, httpx.AsyncClient(timeout=30) as client:
        headers = {"Content-Type": "application/json", "Content-Encoding": coding, "X-Request-Id": "squeezed"}
        r = await client.post(gate.url + CHAT, content=content, headers=headers)
        assert r.status_code == 415, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("invalid_request", "content-encoding"), err
        assert "Content-Encoding" in err["message"] and "127.0.0.1" not in r.text, err
        record = await record_of(gate, "squeezed")
        # the client's fault, refused before admission: never forwarded, never "failed"
        assert (record.outcome, record.reason, record.http_status, record.reserved_tokens) == ("refused", "invalid_request", 415, 0)
        assert ledger_total(gate) == 0
        await still_serves(gate, client, headers={})


async def test_identity_content_encoding_is_forwarded(llama_split):
    async with running_gate(llama_split.url, kv="split") as gate, httpx.AsyncClient(timeout=30) as client:
        r = await client.post(gate.url + CHAT, json=chat(4), headers={"Content-Encoding": "Identity"})
        assert r.status_code == 200, r.text
        await released(gate)


NOT_STARTED_FOR = [
    pytest.param("/v1/embeddings", {"model": "tiny", "input": ["a", "b"]}, id="embeddings"),
    pytest.param("/v1/rerank", {"model": "tiny", "query": "a", "documents": ["b"]}, id="rerank"),
]


@pytest.mark.parametrize(("path", "payload"), NOT_STARTED_FOR)
async def test_llama_servers_own_error_answer_keeps_its_content_type(llama_split, path, payload):
    """llama-server's refusal of an admitted request (501: a route it was not started for) is
    relayed as it sent it: status, body and `Content-Type: application/json; charset=utf-8`
    (the gate wrote its own `application/json` over it)."""
    async with running_gate(llama_split.url, kv="split") as gate, httpx.AsyncClient(timeout=30) as client:
        straight = await client.post(llama_split.url + path, json=payload)
        through = await client.post(gate.url + path, json=payload)
        assert straight.status_code == through.status_code == 501, (straight.text, through.text)
        assert through.headers.get_list("content-type") == straight.headers.get_list("content-type"), through.headers
        assert through.json() == straight.json()
        assert through.headers["content-length"] == str(len(through.content))
        await released(gate)
