"""Session fixtures for tests that need the real llama-server (``@pytest.mark.llama``).

Nothing here runs unless a test asks for one of these fixtures, so unit tests
stay fast.  These fixtures never skip: a binary that cannot be built or a server
that does not come up is a test ERROR, in CI and locally alike.

* ``llama_bin``: path of llama-server (``$LLAMA_SERVER_BIN`` or the cached build;
  a cold build takes ~9 minutes on 2 cores).
* ``tiny_model``: path of the cached random-weight GGUF (n_embd 640, 8 layers).
* ``llama_split``: llama-server with ``-c 2048 -np 4`` (4 slots x 512 tokens).
* ``llama_unified``: llama-server with ``-c 2048 -np 4 -kvu`` (4 slots sharing 2048).
* ``redis_server``: a fresh real redis-server per test (``tests/redis/server.py``).

The servers are :class:`tests.llama.server.LlamaServer` objects: ``.url``,
``.port``, ``.n_ctx`` (per slot), ``.ctx`` (total), ``.mode``, ``.log_path``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # `tests.llama` is imported by path, not installed
    sys.path.insert(0, str(_REPO))

from tests.llama.server import LlamaServer, find_llama_server  # noqa: E402

LLAMA_CTX = 2048
LLAMA_SLOTS = 4


@pytest.fixture(scope="session")
def llama_bin() -> Path:
    return find_llama_server()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from tests.llama.make_model import cached_model  # imports numpy + gguf: only when asked

    return cached_model("default")


def _serve(llama_bin: Path, tiny_model: Path, tmp_path_factory, mode: str):
    log = tmp_path_factory.mktemp("llama") / f"llama-server-{mode}.log"
    server = LlamaServer(llama_bin, tiny_model, mode=mode, ctx=LLAMA_CTX, n_slots=LLAMA_SLOTS, log_path=log)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llama_split(llama_bin, tiny_model, tmp_path_factory):
    yield from _serve(llama_bin, tiny_model, tmp_path_factory, "split")


@pytest.fixture(scope="session")
def llama_unified(llama_bin, tiny_model, tmp_path_factory):
    yield from _serve(llama_bin, tiny_model, tmp_path_factory, "unified")


@pytest.fixture
def redis_server(tmp_path_factory):
    """A fresh real redis-server on a free loopback port (``.url``, ``.pause()``, ``.stop()``,
    ``.start()`` again on the same port); never skipped: a missing binary is an ERROR."""
    from tests.redis.server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def router_models(tmp_path_factory) -> Path:
    """A --models-dir with two tiny GGUFs, ``tiny`` and ``tiny2`` (other weights: another seed)."""
    from tests.llama.make_model import cached_model

    directory = tmp_path_factory.mktemp("router-models")
    (directory / "tiny.gguf").symlink_to(cached_model("default"))
    (directory / "tiny2.gguf").symlink_to(cached_model("default", seed=4321))
    return directory


@pytest.fixture
def llama_router(llama_bin, router_models, tmp_path):
    """Start llama-server routers for one test: ``llama_router(models_max=1)``,
    ``llama_router(preset=path)``; each is stopped (with its children) when the test ends."""
    from tests.llama.server import LlamaRouter

    started: list[LlamaRouter] = []

    def start(*, models_max: int | None = None, preset: Path | None = None, **kwargs) -> LlamaRouter:
        server = LlamaRouter(
            llama_bin,
            models_dir=None if preset else router_models,
            preset=preset,
            models_max=models_max,
            log_path=tmp_path / f"router-{len(started)}.log",
            **kwargs,
        )
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()
