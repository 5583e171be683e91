"""The route table (gate/data/endpoints.py) against llama-server's own list of routes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.data.endpoints import ENDPOINTS, OTHER_ROUTE, ROUTES, UI_ASSET, known_path, lookup

LISTED = Path(__file__).parent.parent / "data" / "llama_server_routes.txt"


def llama_server_routes() -> set[str]:
    lines = LISTED.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def test_the_table_lists_exactly_llama_servers_routes() -> None:
    table = {r.name for r in ROUTES}
    listed = llama_server_routes()
    assert listed - table == set(), "llama-server routes the gate's table does not say what to do with"
    assert table - listed == set(), "routes in the gate's table that llama-server does not have"


def test_each_route_is_listed_once_and_names_are_bounded_labels() -> None:
    names = [r.name for r in ROUTES]
    assert len(names) == len(set(names))
    assert OTHER_ROUTE not in names and UI_ASSET.name not in names


def test_admitted_routes_are_the_generation_routes_with_a_cost_model() -> None:
    assert ENDPOINTS == {
        "/v1/chat/completions": "chat",
        "/chat/completions": "chat",
        "/v1/completions": "completions",
        "/completions": "completion",  # llama-server's alias of its native /completion
        "/completion": "completion",
        "/v1/messages": "messages",  # Anthropic (gate/http/apis/anthropic.py)
        "/v1/responses": "responses",  # OpenAI Responses (gate/http/apis/responses.py)
        "/responses": "responses",
        "/infill": "infill",
        "/embedding": "embeddings",
        "/embeddings": "embeddings",
        "/v1/embeddings": "embeddings",
        "/rerank": "rerank",
        "/reranking": "rerank",
        "/v1/rerank": "rerank",
        "/v1/reranking": "rerank",
        "/predict": "predict",
    }
    assert all(r.generation for r in ROUTES if r.access == "admitted")


def test_routes_that_change_the_server_are_operator_only() -> None:
    operator = {r.name for r in ROUTES if r.access == "operator"}
    assert operator == {
        "POST /props",
        "POST /lora-adapters",
        "POST /slots/:id_slot",
        "POST /models",
        "DELETE /models",
        "POST /models/load",
        "POST /models/unload",
    }
    assert {r.name for r in ROUTES if r.access == "gate"} == {"GET /health", "GET /metrics"}


@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("POST", "/slots/0", "POST /slots/:id_slot"),
        ("POST", "/slots/12", "POST /slots/:id_slot"),
        ("GET", "/props", "GET /props"),
        ("POST", "/props", "POST /props"),
        ("GET", "/bundle.js", "GET /*"),
        ("GET", "/favicon.ico", "GET /*"),
    ],
)
def test_lookup_names_the_route(method: str, path: str, name: str) -> None:
    route = lookup(method, path)
    assert route is not None and route.name == name


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/slots/"),
        ("POST", "/slots/0/x"),
        ("GET", "/slots/0"),
        ("GET", "/nope"),
        ("GET", "/a/b.js"),
        ("PUT", "/props"),
        ("POST", "/v1/chat/completions/"),
    ],
)
def test_lookup_leaves_unknown_requests_to_the_policy(method: str, path: str) -> None:
    assert lookup(method, path) is None


def test_known_path_covers_every_method_of_a_listed_path() -> None:
    assert known_path("/v1/chat/completions") and known_path("/slots/3") and not known_path("/nope")
