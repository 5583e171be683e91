"""A llama-server stand-in for ``tokengate console --demo`` and the benchmarks.

NOT used by the integration tests (those run the real llama-server).  It answers
the endpoints the gate uses with llama-server's shapes (llama.cpp 0c1e570, see
notes/llama-server.md) and models what makes overload hurt (the rules: ``model``).

One module per concept; a request flows HTTP -> runtime -> pure model:

``http``
    the HTTP shell (:func:`build_simulator_app`): llama-server's endpoints, job
    parsing, SSE and error shapes; it submits each completion to the runtime.
``runtime``
    :class:`SimulatorRuntime`: drives the model on the event loop's clock and
    routes its events to the requests waiting on them.
``model``
    :class:`Simulator`, the pure scheduling model (slots, FIFO, KV pool, decode
    steps; time is an argument) and its events :class:`Token`, :class:`Done`,
    :class:`Failed`.  The model's rules are in its docstring.
``config``
    :class:`SimulatorConfig`, the simulated server's settings.
``tokenizer``
    the fake tokenizer, the chat template and the pseudo-word vocabulary.
``serve``
    :func:`serve_simulator` (an embedded uvicorn) and :class:`SimulatorHandle`.

Everything is imported from ``gate.simulator``, as before the split.
"""

from __future__ import annotations

from gate.tools.simulator.config import SimulatorConfig
from gate.tools.simulator.http import BUILD_INFO, MODEL_NAME, NONSTREAM_DISCONNECT_POLL_S, build_simulator_app
from gate.tools.simulator.model import CONTEXT_EXCEEDED, Done, Failed, SimEvent, Simulator, Token
from gate.tools.simulator.runtime import SimulatorRuntime
from gate.tools.simulator.serve import SimulatorHandle, serve_simulator
from gate.tools.simulator.tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, apply_template, count_tokens, fake_tokenize

__all__ = [
    "Done",
    "Failed",
    "SimEvent",
    "SimulatorConfig",
    "Simulator",
    "SimulatorHandle",
    "SimulatorRuntime",
    "Token",
    "apply_template",
    "build_simulator_app",
    "count_tokens",
    "fake_tokenize",
    "serve_simulator",
]
