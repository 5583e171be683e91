"""Per-API adapters for the admitted APIs that are not OpenAI chat or completions: their
intake and cost model, their stream's events, their error shape.

* :mod:`gate.http.apis.anthropic`: the Anthropic Messages API (``/v1/messages``);
* :mod:`gate.http.apis.responses`: the OpenAI Responses API (``/v1/responses``, ``/responses``);
* :mod:`gate.http.apis.tasks`: infill, embeddings and rerank, and the tasks llama-server splits a
  request into (their bodies are checked through gate/http/intake.py);
* :mod:`gate.http.apis.predict`: Vertex AI's ``/predict`` envelope.

Each module's docstring says what llama-server reads of the body (the generation limit above
all) and how its stream ends; intake.py, proxy.py and the relay call in through the three
functions of :mod:`gate.http.apis.dispatch`, by the route's ``Kind``: :func:`parse_request` (every admitted route's
intake: the adapters' kinds here, the others gate/http/intake.py's), :func:`event_format`,
:func:`error_shape`. The Messages and Responses adapters build on gate/http/intake.py's field checks and it knows
nothing of them; it calls tasks and predict itself (they plan bodies it checks).
"""
