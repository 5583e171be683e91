"""Cost models of the multi-task and no-decode routes (gate/http/apis/tasks.py, gate/backend/taskcount.py).

Pure planning is checked against what llama-server's source does with each body; counting is
checked with a stand-in tokenizer (one token per word, named as such: a unit test only; the real
tokenizer is exercised by tests/integration/test_tasks_llama.py).
"""

from __future__ import annotations

import asyncio

import pytest

from gate.backend.taskcount import count_tasks
from gate.core.errors import GateError
from gate.data.tasks import Piece, TaskPlan
from gate.http.apis.tasks import FIM_SNIPPET, embedding_plans, infill_plan, prompt_plans, rerank_plans
from gate.http.intake import build_intake
from gate.http.tenants import Caller
from tests.unit.test_intake import CONFIG

CALLER = Caller(tenant="t", cls="interactive", tenant_config=None)


class WordCounter:
    """Stand-in for TokenCounter.count_text: one token per word, plus 1 for add_special (BOS);
    None for a text containing "FAIL" (the backend gave no count)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, bool, bool]] = []

    async def count_text(self, base_url, text, *, add_special, parse_special, headers=None, model=None):
        self.asked.append((text, add_special, parse_special))
        if "FAIL" in text:
            return None
        return len(text.split()) + (1 if add_special else 0)


def count(plans):
    counter = WordCounter()
    return asyncio.run(count_tasks(counter, "http://b", plans)), counter  # type: ignore[arg-type]


def test_a_prompt_list_is_one_task_per_prompt_and_ids_or_mixed_lists_are_one():
    assert len(prompt_plans(["a b", "c"])) == 2
    assert prompt_plans([1, 2, 3]) == (TaskPlan((), 3),)
    # llama-server: a list holding any number is ONE prompt; only a leading string gets BOS
    assert prompt_plans(["x", 7, "y"]) == (TaskPlan((Piece("x", True, True), Piece("y", False, True)), 1),)
    # a list of token-id lists: one task each
    assert prompt_plans([[1, 2], [3]]) == (TaskPlan((), 2), TaskPlan((), 1))


def test_the_multimodal_prompt_object_is_one_prompt_whose_media_make_it_an_estimate():
    (plan,) = prompt_plans({"prompt_string": "look <__media__>", "multimodal_data": ["aGk="]})
    assert plan.pieces == (Piece("look <__media__>", True, True),) and plan.estimate
    (plain,) = prompt_plans({"prompt_string": "just text"})
    assert not plain.estimate
    with pytest.raises(GateError, match="multimodal_data"):
        prompt_plans({"prompt_string": "x", "multimodal_data": "aGk="})


def test_prompt_list_counts_are_summed_per_task():
    counted, _ = count(prompt_plans(["one two three", "four"]))
    assert counted.per_task == (4, 2)  # BOS on each
    assert counted.total == 6 and counted.source.source == "exact"


def test_infill_counts_prefix_suffix_prompt_extra_and_the_tokens_the_server_adds():
    plan = infill_plan(
        {
            "input_prefix": "def f(",
            "input_suffix": "return x",
            "prompt": "  a",
            "input_extra": [{"filename": "util.py", "text": "import os"}],
        }
    )
    counted, counter = count((plan,))
    flags = {t: (a, p) for t, a, p in counter.asked}
    # prefix, suffix and extra text are tokenized without special tokens, the prompt with them parsed
    assert flags["def f("] == (False, False) and flags["return x"] == (False, False) and flags["  a"] == (False, True)
    assert flags["util.py\n"] == (False, False) and FIM_SNIPPET in flags
    words = 2 + 2 + 1 + 1 + 1 + 1 + 2 + len(FIM_SNIPPET.split())  # prefix suffix prompt myproject filename util.py text snippet
    assert counted.total == words + 6 + 1  # BOS PRE SUF MID REP SEP, and one SEP per chunk


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input_suffix": "s"}, "input_prefix"),
        ({"input_prefix": "p"}, "input_suffix"),
        ({"input_prefix": "p", "input_suffix": "s", "input_extra": {"text": "x"}}, "input_extra"),
        ({"input_prefix": "p", "input_suffix": "s", "input_extra": [{"filename": "f"}]}, "input_extra[0].text"),
        ({"input_prefix": "p", "input_suffix": "s", "input_extra": [{"text": "t", "filename": 3}]}, "input_extra[0].filename"),
    ],
)
def test_infill_bodies_llama_server_refuses_are_400_naming_the_field(body, param):
    with pytest.raises(GateError) as caught:
        infill_plan(body)
    assert caught.value.status == 400 and caught.value.param == param


def test_what_llama_server_ignores_on_infill_and_rerank_is_not_refused():
    # llama-server runs /infill with a prompt that is not a string as if it had none (its error
    # is not returned), and reads a rerank top_n that is not an integer as absent: both 200
    with_ids = infill_plan({"input_prefix": "p", "input_suffix": "s", "prompt": [1, 2]})
    assert with_ids == infill_plan({"input_prefix": "p", "input_suffix": "s"})
    assert len(rerank_plans({"query": "q", "documents": ["a", "b"], "top_n": "2"})) == 2


def test_infill_intake_injects_n_predict_and_counts_as_one_task():
    it = build_intake("infill", "/infill", {"input_prefix": "a", "input_suffix": "b"}, CALLER, CONFIG)
    assert it.body["n_predict"] == it.max_tokens and it.max_tokens_injected and it.decodes
    assert it.plans is not None and len(it.plans) == 1


def test_embeddings_one_task_per_input_no_decode_nothing_injected():
    it = build_intake("embeddings", "/v1/embeddings", {"input": ["a", "b c", [5, 6]], "model": "m"}, CALLER, CONFIG)
    assert it.max_tokens == 0 and not it.decodes and it.body == {"input": ["a", "b c", [5, 6]], "model": "m"}
    assert it.plans is not None and len(it.plans) == 3
    counted, _ = count(it.plans)
    assert counted.per_task == (2, 3, 2)
    single = build_intake("embeddings", "/embedding", {"content": "hello there"}, CALLER, CONFIG)
    assert single.plans is not None and len(single.plans) == 1
    ids = embedding_plans({"input": [1, 2, 3]})  # token ids: one input
    assert ids == (TaskPlan((), 3),)


@pytest.mark.parametrize(
    ("kind", "path", "body"), [("embeddings", "/v1/embeddings", {"input": "hi"}), ("rerank", "/rerank", {"query": "q", "documents": ["d"]})]
)
def test_no_decode_routes_forward_a_stream_field_they_never_read(kind, path, body):
    """llama-server's embeddings and rerank never read `stream` (they answer 200 with it set to
    "yes"); the gate answered 400 "'stream' must be a boolean" (a client trial, 2026-12-05)."""
    it = build_intake(kind, path, {**body, "stream": "yes"}, CALLER, CONFIG)
    assert not it.stream and it.body["stream"] == "yes"


def test_embeddings_openai_content_parts_count_text_and_estimate_media():
    (plan,) = embedding_plans({"input": [{"content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]}]})
    assert plan.pieces == (Piece("hi", True, True),) and plan.estimate


@pytest.mark.parametrize(
    ("body", "param"), [({}, "input"), ({"input": []}, "input"), ({"input": [3.5]}, "input[0]"), ({"input": [{"x": 1}]}, "input[0]")]
)
def test_embedding_bodies_llama_server_refuses_are_400(body, param):
    with pytest.raises(GateError) as caught:
        embedding_plans(body)
    assert caught.value.status == 400 and caught.value.param == param


def test_rerank_is_one_task_per_document_query_plus_document_plus_four():
    plans = rerank_plans({"query": "what is a fox", "documents": ["a fox", "a dog is here"]})
    counted, counter = count(plans)
    assert counted.per_task == (4 + 2 + 4, 4 + 4 + 4)
    assert all(a is False and p is False for _, a, p in counter.asked)
    assert counter.asked.count(("what is a fox", False, False)) == 1  # the query is asked once
    assert len(rerank_plans({"query": "q", "texts": ["x"]})) == 1  # TEI's spelling


@pytest.mark.parametrize(
    ("body", "param"),
    [({"documents": ["x"]}, "query"), ({"query": 1, "documents": ["x"]}, "query"), ({"query": "q", "documents": []}, "documents")],
)
def test_rerank_bodies_llama_server_refuses_are_400(body, param):
    with pytest.raises(GateError) as caught:
        rerank_plans(body)
    assert caught.value.param == param


def test_a_piece_the_backend_cannot_count_is_estimated_and_the_count_says_so():
    counted, _ = count(prompt_plans(["fine", "FAIL" * 30]))
    assert counted.source.source == "estimate"
    assert counted.per_task[1] == 40  # 120 bytes / 3


def test_n_and_prompt_lists_make_the_intake_plan_every_task():
    it = build_intake("completion", "/completion", {"prompt": ["a", "b"], "n_cmpl": 2}, CALLER, CONFIG)
    assert it.copies == 2 and it.plans is not None and len(it.plans) == 2
    one = build_intake("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 3}, CALLER, CONFIG)
    assert one.copies == 3 and one.plans is None  # one prompt, counted whole, times 3
    both = build_intake("completions", "/v1/completions", {"prompt": "x", "n": 2, "n_cmpl": 4}, CALLER, CONFIG)
    assert both.copies == 4  # llama-server reads n_cmpl first, n is its alias


# -- /predict ------------------------------------------------------------------------------------


def test_gcp_aliases_are_llama_servers():
    from gate.http.apis.predict import gcp_alias

    assert gcp_alias("/v1/chat/completions") == "chatCompletions"
    assert gcp_alias("/apply-template") == "applyTemplate"
    assert gcp_alias("/slots/:id_slot") == "slots"
    assert gcp_alias("/infill") == "infill"


def _predict(instances, caller=CALLER, config=CONFIG):
    return build_intake("predict", "/predict", {"instances": instances}, caller, config)


def test_predict_admits_every_instance_as_its_own_route():
    it = _predict(
        [
            {"@requestFormat": "chatCompletions", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "stream": True},
            {"@requestFormat": "/v1/embeddings", "input": ["a", "b"]},
            {"@requestFormat": "tokenize", "content": "x"},  # costs nothing, goes as sent
            {"@requestFormat": "noSuchRoute"},  # llama-server answers it with its own error
        ]
    )
    assert [p.kind for p in it.parts] == ["chat", "embeddings"]
    assert it.max_tokens == 7 and it.unstreamed
    sent = it.body["instances"]
    assert sent[0]["@requestFormat"] == "chatCompletions" and "stream" not in sent[0]
    assert sent[2] == {"@requestFormat": "tokenize", "content": "x"} and sent[3] == {"@requestFormat": "noSuchRoute"}
    injected = _predict([{"@requestFormat": "completion", "prompt": "p"}])
    assert injected.body["instances"][0]["n_predict"] == injected.max_tokens and injected.max_tokens_injected


def test_predict_instance_errors_name_the_instance():
    with pytest.raises(GateError) as caught:
        _predict([{"@requestFormat": "completion", "prompt": "p"}, {"@requestFormat": "completion"}])
    assert caught.value.param == "instances[1].prompt" and "instances[1]" in caught.value.message
    with pytest.raises(GateError) as caught:
        _predict([{"@requestFormat": "messages", "messages": []}])
    assert caught.value.status == 400 and "POST /v1/messages" in caught.value.message
    with pytest.raises(GateError) as caught:
        _predict([{}] * 129)
    assert caught.value.param == "instances"


def test_predict_cannot_reach_operator_routes_for_tenants_that_are_not_operators():
    from tests.unit.test_intake import TENANT_CONFIG

    tenant = TENANT_CONFIG.tenants[0]
    caller = Caller(tenant=tenant.name, cls="interactive", tenant_config=tenant)
    with pytest.raises(GateError) as caught:
        _predict([{"@requestFormat": "props", "x": 1}], caller, TENANT_CONFIG)
    assert caught.value.status == 403 and "POST /props" in caught.value.message
    assert _predict([{"@requestFormat": "props", "x": 1}]).parts == ()  # open mode: allowed
