"""A FAKE llama-server for overhead benchmarks only: answers at once, no model.

Raw asyncio HTTP/1.1 with keep-alive, so the fake costs as little CPU as
possible and the benchmark measures the gate, not the stand-in. It speaks just
enough of llama-server: /health, /props, /tokenize, /apply-template,
/v1/chat/completions/input_tokens, and /v1/chat/completions (JSON, or an SSE
stream when the body asks for "stream": true: one content chunk per token, as
llama-server sends them, max_tokens of them (capped at 4096), or --chunks when
the body has no max_tokens).

    python bench/fake_upstream.py --port 18080 [--chunks 8] [--slots 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

PROMPT_TOKENS = 20


def _response(status: str, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 "
        + status.encode()
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def build_stream(chunks: int) -> bytes:
    """An SSE answer of `chunks` tokens: content chunks, finish, usage, [DONE]."""

    def sse(obj) -> bytes:
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake"}
    stream = b"".join(
        sse({**base, "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}]}) for i in range(chunks)
    )
    stream += sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    stream += sse(
        {
            **base,
            "choices": [],
            "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": chunks, "total_tokens": PROMPT_TOKENS + chunks},
            "timings": {"prompt_n": PROMPT_TOKENS, "prompt_ms": 1.0, "predicted_n": chunks, "predicted_per_second": 1000.0},
        }
    )
    return _response("200 OK", stream + b"data: [DONE]\n\n", b"text/event-stream")


def build_responses(chunks: int, slots: int, n_ctx: int) -> dict[str, bytes]:
    plain = json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1,
            "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": chunks, "total_tokens": PROMPT_TOKENS + chunks},
        }
    ).encode()
    return {
        "/health": _response("200 OK", b'{"status":"ok"}'),
        "/props": _response("200 OK", json.dumps({"total_slots": slots, "default_generation_settings": {"n_ctx": n_ctx}}).encode()),
        "/tokenize": _response("200 OK", json.dumps({"tokens": list(range(PROMPT_TOKENS))}).encode()),
        "/apply-template": _response("200 OK", b'{"prompt":"fake"}'),
        "/v1/chat/completions/input_tokens": _response("200 OK", json.dumps({"input_tokens": PROMPT_TOKENS}).encode()),
        "stream": build_stream(chunks),
        "plain": _response("200 OK", plain),
        "404": _response("404 Not Found", b'{"error":{"code":404,"message":"not found"}}'),
    }


MAX_TOKENS = re.compile(rb'"max_tokens"\s*:\s*(\d+)')
MAX_CHUNKS = 4096


class FakeLlama(asyncio.Protocol):
    answer_completions = True  # False: hold every completion forever (a queue-filling stub)

    def __init__(self, responses: dict[str, bytes]) -> None:
        self.responses = responses
        self.buf = b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            path = head.split(" ", 2)[1].split("?", 1)[0]
            if path in ("/v1/chat/completions", "/v1/completions", "/completion"):
                if not self.answer_completions:
                    continue
                if b'"stream": true' in body or b'"stream":true' in body:
                    self.transport.write(self._stream(body))
                    continue
                key = "plain"
            else:
                key = path if path in self.responses else "404"
            self.transport.write(self.responses[key])

    def _stream(self, body: bytes) -> bytes:
        m = MAX_TOKENS.search(body)
        if m is None:
            return self.responses["stream"]
        n = min(int(m.group(1)), MAX_CHUNKS)
        key = f"stream:{n}"
        if key not in self.responses:  # the dict is shared by every connection: built once per length
            self.responses[key] = build_stream(n)
        return self.responses[key]


async def serve(port: int, chunks: int, slots: int, n_ctx: int) -> None:
    responses = build_responses(chunks, slots, n_ctx)
    server = await asyncio.get_running_loop().create_server(lambda: FakeLlama(responses), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=1 << 20)
    a = ap.parse_args()
    try:
        import uvloop  # noqa: F401

        uvloop.run(serve(a.port, a.chunks, a.slots, a.n_ctx))
    except ImportError:
        asyncio.run(serve(a.port, a.chunks, a.slots, a.n_ctx))


if __name__ == "__main__":
    main()
