"""Through the gate, every answer is the answer llama-server gave (issue 16).

Each row is sent straight to the real llama-server and then through a real gate in
front of it, deterministically (seed 42, temperature 0), and the two answers are
compared field by field. Non-streaming rows exercise the gate's assembly of the
plain answer from llama-server's stream (gate/http/assembly.py), or its plain upstream
call for the options whose stream lacks part of the answer (`stream_loses`);
streaming rows compare the events one by one.

Ignored, because they differ between any two identical requests straight to
llama-server:
* `id`, `created`: a random id and a timestamp per answer;
* `id_slot`: which of the 4 slots served it;
* `timings`: measured times (and `cache_n`, the prompt-cache hit, inside them);
* `usage.prompt_tokens_details.cached_tokens`: the prompt-cache hit again.
Floats are compared to 1e-3 relative: a prompt-cache hit changes the prefill batch,
and llama-server's own logprobs then move in the 5th digit (-5.792834 with no cache
hit, -5.792857 with 3 of 4 prompt tokens cached, same request). Each row is sent
once to warm the cache so both compared answers see the same cache state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gate.http.assembly import stream_loses
from tests.integration.gate_harness import released, running_gate
from tests.llama.server import LlamaServer

pytestmark = pytest.mark.llama

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
COMPLETION = "/completion"
KINDS = {CHAT: "chat", COMPLETIONS: "completions", COMPLETION: "completion"}

IGNORED = frozenset({"id", "created", "id_slot", "timings", "cached_tokens"})
#: of those, the keys that must be where llama-server puts them, whatever their values (a trial:
#: a chat stream through the gate had no `timings`: llama-server moved them into the usage chunk
#: the gate asks for, which the gate then dropped)
PRESENT_IN_BOTH = frozenset({"timings"})
PROMPT = "the quick brown fox"
MESSAGES = [{"role": "user", "content": "tell me about the fox"}]
TOOLS = [
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
]
SAMPLING = {
    "top_k": 5,
    "top_p": 0.5,
    "min_p": 0.1,
    "typical_p": 0.9,
    "repeat_penalty": 1.3,
    "repeat_last_n": 16,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "dry_multiplier": 0.8,
    "xtc_probability": 0.5,
    "samplers": ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
}


@dataclass(frozen=True)
class Case:
    id: str
    path: str
    body: dict[str, Any]

    @property
    def request(self) -> dict[str, Any]:
        return {"seed": 42, "temperature": 0, **self.body}

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def _case(id: str, path: str, base: dict[str, Any], fields: dict[str, Any]) -> Case:
    """A row: `base` with `fields` overriding; None deletes a field."""
    body = {**base, **fields}
    return Case(id, path, {k: v for k, v in body.items() if v is not None})


def completion(id: str, **fields: Any) -> Case:
    return _case(id, COMPLETION, {"prompt": PROMPT, "n_predict": 8}, fields)


def completions(id: str, **fields: Any) -> Case:
    return _case(id, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 8}, fields)


def chat(id: str, **fields: Any) -> Case:
    return _case(id, CHAT, {"messages": MESSAGES, "max_tokens": 8}, fields)


CASES: list[Case] = [
    # --- /completion (llama.cpp's own answer shape) ------------------------------------------
    completion("completion"),
    completion("completion-n-probs", n_probs=3),
    completion("completion-post-sampling-probs", n_probs=2, post_sampling_probs=True),
    completion("completion-logprobs-alias", logprobs=2),
    completion("completion-return-tokens", return_tokens=True),
    completion("completion-stop", stop=["hom"]),
    completion("completion-n-probs-stop", n_probs=2, stop=["hom"]),
    completion("completion-token-ids", prompt=[1, 100, 200, 300]),
    completion("completion-grammar", grammar="root ::= [a-z ]+"),
    completion("completion-json-schema", json_schema={"type": "object", "properties": {"a": {"type": "string"}}}),
    completion("completion-sampling", **SAMPLING),
    completion("completion-mirostat", mirostat=2, mirostat_tau=4.0, mirostat_eta=0.2),
    completion("completion-logit-bias", logit_bias=[[1482, False]]),
    completion("completion-n-indent", n_indent=2),
    completion("completion-t-max-predict", t_max_predict_ms=1),
    completion("completion-no-cache-prompt", cache_prompt=False),
    completion("completion-progress-and-timings", timings_per_token=True, return_progress=True),
    completion("completion-response-fields", response_fields=["content", "generation_settings/n_predict", "stop_type"]),
    completion("completion-ignore-eos", n_predict=16, ignore_eos=True),
    completion("completion-stream", stream=True),
    completion("completion-stream-n-probs", stream=True, n_probs=2),
    # --- /v1/completions ------------------------------------------------------------------------
    completions("completions"),
    completions("completions-logprobs", logprobs=2),
    completions("completions-logprobs-stop", logprobs=2, stop=["some"]),
    completions("completions-stop", stop="some"),
    completions("completions-token-ids", prompt=[100, 200, 300]),
    completions("completions-stream", stream=True),
    completions("completions-stream-usage", stream=True, stream_options={"include_usage": True}),
    # --- /v1/chat/completions -------------------------------------------------------------------
    chat("chat"),
    chat("chat-logprobs", logprobs=True, top_logprobs=3),
    chat("chat-n-probs", n_probs=2),
    chat(
        "chat-multi-turn",
        messages=[*MESSAGES, {"role": "assistant", "content": "the fox is quick"}, {"role": "user", "content": "and the dog"}],
    ),
    chat("chat-system", messages=[{"role": "system", "content": "you are brief"}, *MESSAGES]),
    chat("chat-stop", stop=["ar"]),
    chat("chat-logit-bias", logit_bias={"702": -100}),
    chat("chat-sampling", max_tokens=None, max_completion_tokens=8, **SAMPLING),
    chat("chat-grammar", grammar="root ::= [a-z ]+"),
    chat("chat-json-schema", response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}),
    # This prompt's text does not parse as the format asks: llama-server's stream then
    # carries no content at all, its plain answer the raw text ("```json").
    chat("chat-json-object", messages=[{"role": "user", "content": "hi there"}], max_tokens=6, response_format={"type": "json_object"}),
    chat("chat-tools", tools=TOOLS),
    chat("chat-verbose", verbose=True),
    chat("chat-no-cache-prompt", cache_prompt=False),
    chat("chat-stream", stream=True),
    chat("chat-stream-usage", stream=True, stream_options={"include_usage": True}),
    chat("chat-stream-logprobs", stream=True, stream_options={"include_usage": True}, logprobs=True, top_logprobs=2),
]


def differences(direct: Any, gated: Any, path: str = "") -> Iterator[str]:
    """Where `gated` differs from `direct`, ignoring the IGNORED keys at any depth."""
    if isinstance(direct, dict) and isinstance(gated, dict):
        for key in sorted(set(direct) | set(gated)):
            if key in PRESENT_IN_BOTH and (key in direct) != (key in gated):
                yield f"{path}/{key}: {'missing through the gate' if key in direct else 'only through the gate'}"
            if key in IGNORED:
                continue
            if key not in gated:
                yield f"{path}/{key}: missing through the gate (direct: {json.dumps(direct[key])[:120]})"
            elif key not in direct:
                yield f"{path}/{key}: only through the gate ({json.dumps(gated[key])[:120]})"
            else:
                yield from differences(direct[key], gated[key], f"{path}/{key}")
    elif isinstance(direct, list) and isinstance(gated, list):
        if len(direct) != len(gated):
            yield f"{path}: {len(direct)} items direct, {len(gated)} through the gate"
            return
        for i, (a, b) in enumerate(zip(direct, gated)):
            yield from differences(a, b, f"{path}[{i}]")
    elif isinstance(direct, float) and isinstance(gated, float):
        if not math.isclose(direct, gated, rel_tol=1e-3):
            yield f"{path}: {direct} direct, {gated} through the gate"
    elif direct != gated or type(direct) is not type(gated):
        yield f"{path}: {json.dumps(direct)[:120]} direct, {json.dumps(gated)[:120]} through the gate"


def events(text: str) -> list[Any]:
    """An SSE body as its data events, parsed (`[DONE]` kept as the string)."""
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


async def answer(client: httpx.AsyncClient, base: str, case: Case, request_id: str | None = None) -> Any:
    # llama-server closes the connection after a stream without saying so: never reuse one.
    headers = {"Connection": "close", **({"X-Request-Id": request_id} if request_id else {})}
    response = await client.post(base + case.path, json=case.request, headers=headers)
    assert response.status_code == 200, (case.id, base, response.status_code, response.text)
    if case.stream:
        assert response.headers["content-type"].startswith("text/event-stream")
        return events(response.text)
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def test_table_covers_the_documented_options():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.path for c in CASES} == set(KINDS)
    # Both of the gate's non-streaming paths are exercised: assembly and plain call.
    plain = [c for c in CASES if not c.stream and stream_loses(KINDS[c.path], c.request)]
    assembled = [c for c in CASES if not c.stream and not stream_loses(KINDS[c.path], c.request)]
    assert len(plain) >= 5 and len(assembled) >= 15


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_answer_through_the_gate_is_llama_servers(llama_unified, case: Case):
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=60) as client:
        await answer(client, llama_unified.url, case)  # warm the prompt cache (see the module docstring)
        direct = await answer(client, llama_unified.url, case)
        gated = await answer(client, gate.url, case, request_id=f"t16-{case.id}")
        found = list(differences(direct, gated))
        assert not found, f"{case.id}: " + "; ".join(found)
        record = gate.records.find(f"t16-{case.id}")
        assert record is not None and (record.outcome, record.http_status) == ("admitted", 200), record
        await released(gate)


async def test_a_stream_of_several_tasks_keeps_each_tasks_timings(llama_unified):
    """A client trial: a chat stream with n = 2 through the gate had no `timings` on either
    finish chunk (llama-server moves them into the usage chunk the gate asks for and drops),
    where llama-server's own stream has them on both. The tasks interleave as llama-server runs
    them, so the chunks are compared per finish, not in order."""
    body = {"messages": MESSAGES, "max_tokens": 4, "n": 2, "stream": True}

    def finishes(chunks: list[Any]) -> list[tuple[int, bool]]:
        out = []
        for c in chunks:
            if isinstance(c, dict) and c.get("choices") and c["choices"][0].get("finish_reason"):
                out.append((c["choices"][0]["index"], "timings" in c))
        return sorted(out)

    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=60) as client:
        case = Case("chat-stream-n2", CHAT, body)
        direct = await answer(client, llama_unified.url, case)
        gated = await answer(client, gate.url, case)
        assert finishes(direct) == [(0, True), (1, True)], direct
        assert finishes(gated) == finishes(direct), gated
        assert not any(isinstance(c, dict) and c.get("choices") == [] for c in gated)  # no usage chunk: not asked for
        await released(gate)


#: response headers that are the hop's or the server's own, not llama-server's answer
_HOP = frozenset({"date", "server", "content-length", "transfer-encoding", "connection", "keep-alive"})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"messages": MESSAGES, "max_tokens": 4}),
        (COMPLETION, {"prompt": PROMPT, "n_predict": 4, "return_tokens": True}),
        ("/v1/messages", {"model": "tiny", "messages": MESSAGES, "max_tokens": 4}),
    ],
    ids=["assembled", "plain", "messages-plain"],
)
async def test_a_non_streaming_answers_head_is_llama_servers(llama_unified, path, body):
    """A client trial (2026-12-05): every non-streaming answer came with `Content-Type:
    application/json` where llama-server says `application/json; charset=utf-8`, and one rebuilt
    from the stream also with the stream's `X-Accel-Buffering: no`."""
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=60) as client:
        headers = {"Connection": "close"}
        direct = await client.post(llama_unified.url + path, json=body, headers=headers)
        gated = await client.post(gate.url + path, json=body, headers=headers)
        assert direct.status_code == gated.status_code == 200, gated.text

        def own(response: httpx.Response) -> list[tuple[str, str]]:
            return sorted(
                (k.lower(), v)
                for k, v in response.headers.multi_items()
                if k.lower() not in _HOP and not k.lower().startswith("x-tokengate") and k.lower() != "x-request-id"
            )

        assert own(gated) == own(direct)
        await released(gate)


@pytest.mark.parametrize("fields", [{}, {"return_tokens": True}], ids=["assembled", "plain"])
async def test_llama_servers_own_refusal_comes_through_either_path(llama_unified, fields):
    """Token ids the model does not have pass the gate's checks; llama-server's 400 is relayed as is."""
    case = completion("bad-token-ids", prompt=[1, 450, 4996], **fields)
    async with running_gate(llama_unified.url) as gate, httpx.AsyncClient(timeout=60) as client:
        headers = {"Connection": "close"}
        direct = await client.post(llama_unified.url + COMPLETION, json=case.request, headers=headers)
        gated = await client.post(gate.url + COMPLETION, json=case.request, headers={**headers, "X-Request-Id": "t16-bad"})
        assert direct.status_code == gated.status_code == 400, gated.text
        assert gated.json() == direct.json()
        record = gate.records.find("t16-bad")
        assert record is not None and (record.outcome, record.http_status) == ("refused", 400), record
        await released(gate)


@pytest.fixture(scope="module")
def llama_verbose(llama_bin, tiny_model, tmp_path_factory):
    """llama-server --verbose: its OpenAI answers carry ``__verbose`` (its native answer)."""
    log = tmp_path_factory.mktemp("llama") / "llama-server-verbose.log"
    with LlamaServer(llama_bin, tiny_model, ctx=1024, n_slots=2, extra_args=("--verbose",), log_path=log) as server:
        yield server


VERBOSE_CASES = [
    chat("chat-verbose-server"),
    completions("completions-verbose-server"),
    completions("completions-verbose-probs", logprobs=2),
]


@pytest.mark.parametrize("case", VERBOSE_CASES, ids=lambda c: c.id)
async def test_verbose_servers_debug_object_is_rebuilt_in_an_assembled_answer(llama_verbose, case: Case):
    assert not stream_loses(KINDS[case.path], case.request)  # the gate assembles these from the stream
    async with running_gate(llama_verbose.url) as gate, httpx.AsyncClient(timeout=60) as client:
        await answer(client, llama_verbose.url, case)
        direct = await answer(client, llama_verbose.url, case)
        gated = await answer(client, gate.url, case)
        assert "__verbose" in direct and direct["__verbose"]["prompt"]
        found = list(differences(direct, gated))
        assert not found, f"{case.id}: " + "; ".join(found)
        await released(gate)
