"""`tokengate log --format aiperf` on the journal of a real gate in front of the real llama-server.

A user's trial re-ran a trace with aiperf's --fixed-schedule and every chat prompt went out ~40
tokens larger (+43%; batch's context_length_exceeded 2 -> 12): input_length was llama-server's
prompt count, which holds the chat template, and the server templated aiperf's text of that
length again. The gate measures the template once it learns the capacity; the trace takes it off.
"""

from __future__ import annotations

import io

import httpx
import pytest

from gate.journal.export import export
from tests.integration.gate_harness import running_gate, wait_until, words

pytestmark = pytest.mark.llama

CHAT = "/v1/chat/completions"
PROBE = {"messages": [{"role": "user", "content": "hello"}]}


async def _tokens(http: httpx.AsyncClient, url: str, text: str) -> int:
    answer = await http.post(url + "/tokenize", json={"content": text, "add_special": False, "parse_special": False})
    return len(answer.json()["tokens"])


async def test_the_traces_chat_input_length_is_the_prompts_text_not_its_template(llama_unified, tmp_path) -> None:
    url, journal = llama_unified.url, str(tmp_path / "tokengate.db")
    async with httpx.AsyncClient(timeout=30) as http:
        chat_count = (await http.post(url + "/v1/chat/completions/input_tokens", json=PROBE)).json()["input_tokens"]
        template = chat_count - await _tokens(http, url, "hello")  # 41 - 1 = 40 for the test model's ChatML
        content = words(30)
        async with running_gate(url, journal_path=journal) as gate:
            (backend,) = gate.backends.backends
            assert backend.chat_template_tokens == template > 0
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "ignore_eos": True}
            answer = await http.post(gate.url + CHAT, json=body, headers={"X-Request-Id": "trace-1"})
            assert answer.status_code == 200, answer.text
            prompt = answer.json()["usage"]["prompt_tokens"]
            await wait_until(lambda: gate.records.find("trace-1") is not None)
        text = await _tokens(http, url, content)
    out, notes = io.StringIO(), []
    assert export(journal, out, fmt="aiperf", notes=notes) == 1
    (line,) = out.getvalue().splitlines()
    # the text aiperf will synthesize: as many tokens as the client's own content, which the
    # server templates again into the prompt the client sent
    assert f'"input_length":{prompt - template},' in line and prompt - template == text, (line, prompt, template, text)
    assert len(notes) == 1 and f"its {template} tokens, as the gate measured them" in notes[0], notes
